"""Claude Code as an agent (adapter being written; until then the kind is not usable)."""

from __future__ import annotations

from typing import ClassVar

from replays.agents.command import CommandAgent


class ClaudeCodeAgent(CommandAgent):
    kind: ClassVar[str] = "claude_code"
