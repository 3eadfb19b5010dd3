"""The two calibration baselines: the historical result re-applied, and no change at all.

Both run as real processes, so timeouts, cancel, logs and the start marker work the
same for them as for any agent.
"""

from __future__ import annotations

import shutil
import sys
from decimal import Decimal
from typing import ClassVar

from replays.agents.base import (
    Agent,
    AgentOutcome,
    Invocation,
    RunContext,
    error_from_log,
)

HISTORICAL = "historical"
EMPTY = "empty"

_DO_NOTHING = [sys.executable, "-c", "pass"]


def _free_outcome(context: RunContext, exit_code: int) -> AgentOutcome:
    # Baselines call no model: zero tokens, zero cost (known, not unknown).
    return AgentOutcome(
        cost_usd=Decimal(0),
        model_seconds=0.0,
        error=error_from_log(context.log_path) if exit_code != 0 else "",
    )


class HistoricalAgent(Agent):
    """Re-applies the diff the historical session produced, as approved."""

    kind: ClassVar[str] = HISTORICAL

    def invocation(self, context: RunContext) -> Invocation:
        # Read once by the coordinator and checked against the approved sha256 there.
        diff = context.historical_diff
        diff_file = context.run_dir / "historical.diff"
        diff_file.write_text(diff, encoding="utf-8")
        if not diff:
            return Invocation(argv=list(_DO_NOTHING))
        git = shutil.which("git") or "git"
        return Invocation(argv=[git, "apply", "--binary", "--whitespace=nowarn", str(diff_file)])

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        return _free_outcome(context, exit_code)


class EmptyAgent(Agent):
    """Changes nothing: the floor any model has to beat."""

    kind: ClassVar[str] = EMPTY

    def invocation(self, context: RunContext) -> Invocation:
        return Invocation(argv=list(_DO_NOTHING))

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        return _free_outcome(context, exit_code)
