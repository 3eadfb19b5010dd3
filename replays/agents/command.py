"""A user-configured command line as an agent (aider, a script, anything that edits files).

settings.REPLAYS_AGENTS entry:
    {"kind": "command", "command": ["aider", "--model", "{model}", "--message-file",
     "{request_file}", "--yes"], "models": ["gpt-5"], "env": {"K": "V"}, "label": "Aider"}

Placeholders {model}, {request_file}, {workspace} and {run_dir} are replaced inside
each argv element (and env value); nothing goes through a shell. The command runs in
the workspace. It may report usage as JSON in the file named by $REPLAYS_USAGE_FILE:
{"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_5m_tokens",
"cache_write_1h_tokens", "cost_usd", "model_seconds", "model"}, all optional.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from replays import pricing
from replays.agents.base import (
    AgentOutcome,
    ConfiguredAgent,
    Invocation,
    RunContext,
    error_from_log,
    program_unavailable_reason,
)
from replays.transcripts.base import TokenUsage

USAGE_FILE_NAME = "usage.json"
PLACEHOLDERS = ("model", "request_file", "workspace", "run_dir")
_TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
)
# A usage report is a few hundred bytes; anything far larger is not one.
_MAX_USAGE_FILE_BYTES = 64 * 1024


class CommandAgent(ConfiguredAgent):
    kind: ClassVar[str] = "command"

    def __init__(self, *, name: str, model: str, command: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.model = model
        self.command = command
        self.env = env

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        command = entry.get("command")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(part, str) for part in command)
            or not command[0].strip()
        ):
            raise ValueError("'command' must be a non-empty list of strings")
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(key, str) and key and isinstance(value, str) for key, value in env.items()
        ):
            raise ValueError("'env' must map names to strings")

    @classmethod
    def unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        return program_unavailable_reason(entry["command"][0], entry.get("env", {}))

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> CommandAgent:
        return cls(
            name=name, model=model, command=list(entry["command"]), env=dict(entry.get("env", {}))
        )

    def invocation(self, context: RunContext) -> Invocation:
        values = {
            "model": self.model,
            "request_file": str(context.request_file),
            "workspace": str(context.workspace),
            "run_dir": str(context.run_dir),
        }
        env = {key: substitute(value, values) for key, value in self.env.items()}
        env["REPLAYS_USAGE_FILE"] = str(context.run_dir / USAGE_FILE_NAME)
        return Invocation(argv=[substitute(part, values) for part in self.command], env=env)

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        outcome = read_usage_file(context.run_dir / USAGE_FILE_NAME, model=self.model)
        if exit_code != 0:
            outcome.error = error_from_log(context.log_path)
        return outcome


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace {name} placeholders; other braces stay as they are (this is not str.format)."""
    for name in PLACEHOLDERS:
        text = text.replace("{" + name + "}", values[name])
    return text


def read_usage_file(path: Path, *, model: str) -> AgentOutcome:
    """Usage and cost from the agent's usage report; a malformed report is ignored with a note.

    Without a report the usage is unknown: zero tokens and an unknown cost. Without a
    reported cost it comes from the price table for the reported (or requested) model.
    """
    if not path.exists():
        return AgentOutcome()
    try:
        if path.stat().st_size > _MAX_USAGE_FILE_BYTES:
            raise ValueError(f"larger than {_MAX_USAGE_FILE_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
        usage, reported_cost, model_seconds, reported_model = _parse_usage(data)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return AgentOutcome(notes=[f"The usage file {path.name} was ignored: {exc}"])
    cost = reported_cost
    if cost is None:
        table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
        cost = pricing.cost_usd(reported_model or model, usage, table)
    return AgentOutcome(usage=usage, cost_usd=cost, model_seconds=model_seconds)


def _parse_usage(data: object) -> tuple[TokenUsage, Decimal | None, float | None, str]:
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    tokens = {}
    for key in _TOKEN_KEYS:
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be a whole number of tokens, not {value!r}")
        tokens[key] = value
    cost = data.get("cost_usd")
    if cost is not None:
        cost = pricing.non_negative_decimal("cost_usd", cost)
    seconds = data.get("model_seconds")
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not (math.isfinite(seconds) and seconds >= 0)
        ):
            raise ValueError(f"model_seconds must be a number of seconds, not {seconds!r}")
        seconds = float(seconds)
    model = data.get("model", "")
    if not isinstance(model, str):
        raise ValueError(f"model must be a string, not {model!r}")
    return TokenUsage(**tokens), cost, seconds, model.strip()
