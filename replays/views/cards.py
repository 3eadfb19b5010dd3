"""A run as its card shows it, and a batch's results in brief: shared by the batch page,
its live partial and the run page, so all of them say the same thing."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count

from replays import formatting
from replays.models import (
    ACTIVE_RUN_STATUSES,
    LaunchError,
    Report,
    Run,
    RunQuerySet,
    RunStatus,
    Winner,
)

HISTORICAL = "historical"
REPLAY = "replay"
WINNER_WORDS = {Winner.HISTORICAL: "Historical", Winner.REPLAY: "Replay", Winner.TIE: "Tie"}


@dataclass
class Comparison:
    """One figure of history against the replay, with which side did better."""

    label: str
    historical: Any
    replay: Any
    kind: str  # "score", "usd" or "seconds": how the values are written
    better: str | None  # HISTORICAL, REPLAY, or None when equal or unknown

    def text(self, side: str) -> str:
        value = self.historical if side == HISTORICAL else self.replay
        if self.kind == "score":
            return "—" if value is None else f"{value:.2f}"
        if self.kind == "usd":
            return formatting.usd(value)
        return formatting.duration(value)

    @property
    def historical_text(self) -> str:
        return self.text(HISTORICAL)

    @property
    def replay_text(self) -> str:
        return self.text(REPLAY)

    @property
    def better_words(self) -> str:
        """What the marks mean, for screen readers."""
        if self.better is None:
            return "the same" if self.historical == self.replay else "not comparable"
        return f"{'history' if self.better == HISTORICAL else 'the replay'} did better"


def _better(historical: Any, replay: Any, *, higher_is_better: bool) -> str | None:
    if historical is None or replay is None or historical == replay:
        return None
    replay_wins = replay > historical if higher_is_better else replay < historical
    return REPLAY if replay_wins else HISTORICAL


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


@dataclass
class RunCard:
    """One run as its card shows it."""

    run: Run
    label: str
    launch_error: LaunchError | None
    now: datetime

    @property
    def is_active(self) -> bool:
        return self.run.status in ACTIVE_RUN_STATUSES

    @property
    def elapsed(self) -> float | None:
        """Wall time: final once finished, running so far while it runs."""
        run = self.run
        if run.wall_seconds is not None:
            return run.wall_seconds
        if run.started_at is not None:
            end = run.finished_at or self.now
            return max(0.0, (end - run.started_at).total_seconds())
        return None

    @property
    def failure_message_shown(self) -> bool:
        """The failure, unless the launch error beside it already says the same."""
        run = self.run
        if not run.failure_code:
            return False
        return self.launch_error is None or run.failure_message.strip() not in (
            "",
            self.launch_error.message.strip(),
        )

    @property
    def cost_is_unknown(self) -> bool:
        """An ended run that did work without a price: "unknown price", never $0 or a dash.

        While a run is active its cost is simply not computed yet.
        """
        run = self.run
        return (
            run.cost_usd is None
            and run.is_finished
            and (run.status == RunStatus.COMPLETED or run.total_tokens > 0)
        )

    # --- the judgment ----------------------------------------------------------------------

    @property
    def report(self) -> Report | None:
        return self.run.current_report

    @property
    def judged(self) -> bool:
        return self.report is not None and self.report.winner is not None

    @property
    def winner_words(self) -> str:
        report = self.report
        if report is None or report.winner is None:
            return ""
        return WINNER_WORDS[Winner(report.winner)]

    @property
    def inconsistent(self) -> bool:
        return self.judged and self.report.consistent is False  # type: ignore[union-attr]

    @property
    def comparisons(self) -> list[Comparison]:
        """Score, cost and time of history against the replay (empty before a report)."""
        report = self.report
        if report is None or report.winner is None:
            return []
        data = report.data or {}
        historical = data.get("historical") or {}
        return [
            Comparison(
                "Score",
                report.score_historical,
                report.score_replay,
                "score",
                _better(report.score_historical, report.score_replay, higher_is_better=True),
            ),
            Comparison(
                "Cost",
                _decimal(historical.get("cost_usd")),
                self.run.cost_usd,
                "usd",
                _better(
                    _decimal(historical.get("cost_usd")), self.run.cost_usd, higher_is_better=False
                ),
            ),
            Comparison(
                "Time",
                historical.get("seconds"),
                self.run.wall_seconds,
                "seconds",
                _better(historical.get("seconds"), self.run.wall_seconds, higher_is_better=False),
            ),
        ]

    @property
    def tests(self) -> dict[str, Any] | None:
        """{kept, broken, usable, reason} of the reference tests, None without tests."""
        report = self.report
        if report is None:
            return None
        tests = (report.data or {}).get("tests")
        if not tests:
            return None
        return {
            "usable": tests.get("usable", False),
            "reason": tests.get("reason", ""),
            "kept": len(tests.get("kept") or []),
            "broken": len(tests.get("broken") or []),
        }


def run_cards(runs: list[Run], labels: dict[str, str], now: datetime) -> list[RunCard]:
    return [
        RunCard(
            run=run,
            label=labels.get(run.model, run.model),
            launch_error=next(iter(run.launch_errors.all()), None),
            now=now,
        )
        for run in runs
    ]


@dataclass
class BatchResults:
    """A batch's judgment in brief: the replays' wins, ties and losses against history, the
    cost of the replays against history's cost of the same requests, the evaluator's apart."""

    wins: int
    ties: int
    losses: int
    inconsistent: int
    not_judged: int
    replay_cost: Decimal | None
    historical_cost: Decimal | None
    evaluator_cost: Decimal | None
    judged_runs: int

    @property
    def any(self) -> bool:
        return bool(self.judged_runs or self.not_judged)


def _total(values: list[Decimal | None]) -> Decimal | None:
    """A sum that is unknown when any part is unknown (never a silent $0)."""
    if not values or any(value is None for value in values):
        return None
    return sum((value for value in values if value is not None), Decimal(0))


def batch_results(cards: list[RunCard]) -> BatchResults:
    judged = [card for card in cards if card.judged]
    reports = [card.report for card in judged]
    return BatchResults(
        wins=sum(1 for report in reports if report.winner == Winner.REPLAY),
        ties=sum(1 for report in reports if report.winner == Winner.TIE),
        losses=sum(1 for report in reports if report.winner == Winner.HISTORICAL),
        inconsistent=sum(1 for card in judged if card.inconsistent),
        not_judged=sum(1 for card in cards if card.report is not None and not card.judged),
        replay_cost=_total([card.run.cost_usd for card in judged]),
        historical_cost=_total(
            [
                _decimal((report.data or {}).get("historical", {}).get("cost_usd"))
                for report in reports
            ]
        ),
        evaluator_cost=_evaluator_cost([card.report for card in cards if card.report]),
        judged_runs=len(judged),
    )


def _evaluator_cost(reports: list[Report]) -> Decimal | None:
    """What judging the batch cost: every judgment, and each shared review once."""
    reviews = {
        report.review_id: _decimal(((report.data or {}).get("review") or {}).get("cost_usd"))
        for report in reports
        if report.review_id is not None
    }
    if not reports:
        return None
    return _total([report.evaluator_cost_usd for report in reports] + list(reviews.values()))


def unreported_counts(batch_ids: list[int]) -> dict[int, int]:
    """Completed runs still without a current report, per batch: the one definition behind
    "reviews pending" on the batch list and on the batch page."""
    return dict(
        Run.objects.filter(batch__in=batch_ids, status=RunStatus.COMPLETED)
        .filter(RunQuerySet.waiting_for_results())
        .values("batch")
        .annotate(count=Count("id"))
        .values_list("batch", "count")
    )


def batch_state(*, active: int, unreported: int) -> tuple[str, str]:
    """(badge class, label) of a batch from its counts of active and unreported runs."""
    if active:
        return "running", "In progress"
    if unreported:
        return "finished", "Finished · reviews pending"
    return "results_ready", "Results ready"
