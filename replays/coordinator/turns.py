"""What a run's turns add up to, and what the run's ending makes of it.

Each turn (one request of the range, one agent process) ends Exited, TimedOut, Cancelled
or OverCap with an outcome (usage, cost, the agent's error); `Turns` keeps each one's own
figures (Run.turns) and their sum; `conclude` turns the last ending and the summed
outcome into the run's status, failure code and message, whose failure it is."""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from replays import pricing, repos
from replays.agents.base import AgentOutcome, absurd_usage
from replays.coordinator.supervisor import Cancelled, Ending, Exited, OverCap, TimedOut
from replays.models import FailureCode, RunStatus
from replays.transcripts.base import TokenUsage


@dataclass
class Result:
    """What the final write records."""

    status: RunStatus
    failure_code: FailureCode = FailureCode.NONE
    failure_message: str = ""
    exit_code: int | None = None
    wall_seconds: float | None = None
    outcome: AgentOutcome = field(default_factory=AgentOutcome)
    diff: str = ""
    diff_cut: bool = False
    files_changed: int = 0
    turns: Turns | None = None

    @property
    def turn_records(self) -> list[dict[str, Any]]:
        return self.turns.records if self.turns is not None else []


class Turns:
    """The turns of one run as they end: each one's own figures, and their sum."""

    def __init__(self, *, count: int) -> None:
        self.count = count  # how many the range has
        self.records: list[dict[str, Any]] = []
        self.outcomes: list[AgentOutcome] = []
        self.last_ending: Ending | None = None

    @property
    def several(self) -> bool:
        return self.count > 1

    @property
    def last_session(self) -> str:
        return str(self.records[-1]["session_id"]) if self.records else ""

    def add(self, outcome: AgentOutcome, *, ending: Ending, seconds: float, session: str) -> None:
        self.outcomes.append(outcome)
        self.last_ending = ending
        self.records.append(
            {
                "turn": len(self.records) + 1,
                "ending": _ENDING_WORDS[type(ending)],
                "exit_code": ending.code if isinstance(ending, Exited) else None,
                "seconds": seconds,
                "model_seconds": outcome.model_seconds,
                "cost_usd": None if outcome.cost_usd is None else str(rounded(outcome.cost_usd)),
                "tokens": outcome.usage.as_dict(),
                "session_id": session,
                "failed": outcome.failed,
            }
        )

    def stops_here(self) -> bool:
        """The range goes no further: the last turn was stopped, exited with an error or
        reported a failure."""
        ending = self.last_ending
        return not isinstance(ending, Exited) or ending.code != 0 or self.outcomes[-1].failed

    def diff_after(self, diff: repos.BoundedDiff, files_changed: int) -> None:
        """The tree's diff once the latest turn ended (several turns only: one turn's is the
        run's own)."""
        self.records[-1]["diff"] = diff.text
        self.records[-1]["diff_cut"] = diff.cut
        self.records[-1]["files_changed"] = files_changed

    def total(self) -> AgentOutcome:
        """The run's outcome: usage, cost and model time summed (a cost unknown for one turn
        is unknown for the run), the last turn's message and error; bounded."""
        if not self.outcomes:
            return AgentOutcome()
        last = self.outcomes[-1]
        costs = [outcome.cost_usd for outcome in self.outcomes]
        seconds = [o.model_seconds for o in self.outcomes if o.model_seconds is not None]
        return bounded(
            AgentOutcome(
                final_message=last.final_message,
                usage=sum((o.usage for o in self.outcomes), TokenUsage()),
                cost_usd=None if None in costs else sum(costs, Decimal(0)),  # type: ignore[arg-type]
                model_seconds=round(sum(seconds), 3) if seconds else None,
                error=last.error,
                failed=last.failed,
                setup=last.setup,
                stopped_at_cap=last.stopped_at_cap,
            )
        )

    def spent(self) -> Decimal | None:
        """What the turns that ended cost together (None: one's cost is unknown)."""
        costs = [outcome.cost_usd for outcome in self.outcomes]
        return None if None in costs else sum(costs, Decimal(0))  # type: ignore[arg-type]

    def where_it_stopped(self) -> str:
        """ " at request 2 of 3" for a range that stopped early; "" otherwise."""
        return f" at request {len(self.records)} of {self.count}" if self.several else ""


_ENDING_WORDS = {
    Exited: "exited", TimedOut: "timeout", Cancelled: "cancelled", OverCap: "cost cap",
}  # fmt: skip


def conclude(
    turns: Turns,
    *,
    wall_seconds: float,
    timeout: str,
    error_words: str,
    cost_cap: Decimal | None = None,
) -> Result:
    """The run's status from how its last turn ended and what its turns add up to; the
    failure's owner by its code (a setup problem is never the model's). `error_words` is
    the log's last lines, for an agent that exited badly without saying why; `cost_cap`
    the most it could spend (a campaign's budget left when it started)."""
    outcome = turns.total()
    ending = turns.last_ending
    base = {"wall_seconds": wall_seconds, "outcome": outcome, "turns": turns}
    if isinstance(ending, Cancelled):
        return Result(RunStatus.CANCELLED, **base)
    if isinstance(ending, OverCap) or (cost_cap is not None and outcome.stopped_at_cap):
        # The campaign's money ran out under it: ours, never counted against the model.
        spent = "an unknown amount" if outcome.cost_usd is None else f"${rounded(outcome.cost_usd)}"
        message = (
            f"Stopped at its cost cap{turns.where_it_stopped()}: it spent {spent}, and the "
            f"campaign's budget had ${rounded(cost_cap)} left for it when it started."
        )
        return Result(RunStatus.FAILED, FailureCode.BUDGET_EXHAUSTED, message, **base)
    if isinstance(ending, TimedOut):
        if outcome.setup is not None:
            # It waited for the network until the deadline: the setup's, not the model's.
            return Result(RunStatus.FAILED, FailureCode.SETUP, outcome.setup.message(), **base)
        message = f"The agent did not finish within {timeout}."
        return Result(RunStatus.FAILED, FailureCode.TIMEOUT, message, **base)
    assert isinstance(ending, Exited)
    result = Result(RunStatus.COMPLETED, exit_code=ending.code, **base)
    stopped = turns.where_it_stopped()
    if ending.code != 0:
        words = outcome.error or error_words
        result.status, result.failure_code = RunStatus.FAILED, FailureCode.AGENT_ERROR
        result.failure_message = f"The agent exited with code {ending.code}{stopped}" + (
            f":\n{words}" if words else "."
        )
    elif outcome.failed:
        result.status, result.failure_code = RunStatus.FAILED, FailureCode.AGENT_ERROR
        result.failure_message = f"{outcome.error or 'The agent reported an error.'}" + (
            f"\n(It stopped{stopped}.)" if stopped else ""
        )
    if result.status == RunStatus.FAILED and outcome.setup is not None:
        # Not the model's doing: not logged in, a quota, an unknown model id...
        result.failure_code = FailureCode.SETUP
        result.failure_message = outcome.setup.message() + (
            f"\n(It stopped{stopped}.)" if stopped else ""
        )
    return result


def bounded(outcome: AgentOutcome) -> AgentOutcome:
    """The outcome, unless its figures are beyond any run's (the adapters say so for what
    they read; this holds for every agent and for the sum of a range's turns): then a
    failure of the agent saying which figure, its usage unknown, so the run fails as the
    agent's error with its diff kept instead of breaking the money and token columns."""
    absurd = absurd_usage(outcome)
    if not absurd:
        return outcome
    message = f"The agent {absurd}: its figures were not kept."
    return AgentOutcome(
        final_message=outcome.final_message,
        failed=True,
        error=message,
        setup=outcome.setup,
        notes=[*outcome.notes, message],
    )


def rounded(cost: Decimal | None) -> Decimal | None:
    return pricing.round_usd(cost) if isinstance(cost, Decimal) else None
