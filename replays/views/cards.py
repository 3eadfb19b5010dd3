"""A run as its card shows it, and a batch's results in brief: shared by the batch page,
its live partial and the run page, so all of them say the same thing.

The batch page draws up to a hundred cards, and Django's template language costs a few
microseconds per variable lookup, filter and `{% url %}`: so each card's URLs, dates,
figures and classes are worked out here once, in plain Python, and the card template
only prints them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import cached_property
from typing import Any, NamedTuple

from django.db.models import Count, Exists, OuterRef, Q
from django.urls import reverse
from django.utils.dates import MONTHS_3
from django.utils.safestring import SafeString
from django.utils.timezone import localtime

from replays import formatting
from replays.models import (
    ACTIVE_RUN_STATUSES,
    FailureOwner,
    LaunchError,
    Report,
    ReportStatus,
    Run,
    RunPhase,
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
    # Written once here rather than per cell in the template:
    historical_text: str = field(init=False)
    replay_text: str = field(init=False)
    historical_class: str = field(init=False)  # "better", "worse" or ""
    replay_class: str = field(init=False)
    historical_better: bool = field(init=False)
    replay_better: bool = field(init=False)

    def __post_init__(self) -> None:
        self.historical_text = self.text(HISTORICAL)
        self.replay_text = self.text(REPLAY)
        if self.historical_text == self.replay_text:
            # "<1s vs <1s": what a person reads is the same, so neither side is better.
            self.better = None
        marks = {None: ("", ""), HISTORICAL: ("better", "worse"), REPLAY: ("worse", "better")}
        self.historical_class, self.replay_class = marks[self.better]
        self.historical_better = self.better == HISTORICAL
        self.replay_better = self.better == REPLAY

    def text(self, side: str) -> str:
        value = self.historical if side == HISTORICAL else self.replay
        if self.kind == "score":
            return "—" if value is None else f"{value:.2f}"
        if self.kind == "usd":
            return formatting.usd(value)
        return formatting.duration(value)

    @property
    def better_words(self) -> str:
        """What the marks mean, for screen readers."""
        if self.better is None:
            same = self.historical == self.replay or self.historical_text == self.replay_text
            return "the same" if same else "not comparable"
        return f"{'history' if self.better == HISTORICAL else 'the replay'} did better"


def _better(historical: Any, replay: Any, *, higher_is_better: bool) -> str | None:
    if historical is None or replay is None or historical == replay:
        return None
    replay_wins = replay > historical if higher_is_better else replay < historical
    return REPLAY if replay_wins else HISTORICAL


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _url_of(name: str) -> Callable[[int], str]:
    """The URL `name` for any run's pk, reversed once: three `{% url %}` per card were
    about a tenth of the batch page's time. The pk is the route's only argument
    (`<int:pk>`)."""
    marker = 987654321987654321
    head, found, tail = reverse(name, args=[marker]).partition(str(marker))
    if not found:
        raise ValueError(f"{name}: the run's pk is not in its URL")
    return lambda pk: f"{head}{pk}{tail}"


@dataclass(frozen=True)
class RunUrls:
    """The links of a run's card, made once per page (reverse() is called per request, so
    a script prefix is honoured)."""

    detail: Callable[[int], str]
    compare: Callable[[int], str]
    cancel: Callable[[int], str]

    @classmethod
    def make(cls) -> RunUrls:
        return cls(
            detail=_url_of("replays:run-detail"),
            compare=_url_of("replays:run-compare"),
            cancel=_url_of("replays:run-cancel"),
        )


class EndTimes(NamedTuple):
    """A run's end as the card writes it (named: `{{ end.0 }}` would first be tried as a
    key and an attribute, the slowest lookup in the template language)."""

    iso: str  # datetime="…"
    full: str  # the tooltip, UTC
    short: str  # the text


def end_times(value: datetime) -> EndTimes:
    """What `|date:"c"`, `|date:"Y-m-d H:i:s"` and `|date:"M j, H:i:s"` print, in the
    current time zone, written as django.utils.dateformat writes those letters ("c" is
    isoformat(), "M" the translated month's three letters, title-cased): three `|date`
    per card were about a tenth of the batch page's time."""
    local = localtime(value)
    clock = f"{local.hour:02d}:{local.minute:02d}:{local.second:02d}"
    return EndTimes(
        iso=local.isoformat(),
        full=f"{local.year:04d}-{local.month:02d}-{local.day:02d} {clock}",
        short=f"{MONTHS_3[local.month].title()} {local.day}, {clock}",
    )


@dataclass
class RunCard:
    """One run as its card shows it: the run's figures as the card prints them, each
    worked out once (see the module's docstring)."""

    run: Run
    label: str
    launch_error: LaunchError | None
    now: datetime
    urls: RunUrls = field(default_factory=RunUrls.make)

    # --- what the card prints ------------------------------------------------------------

    @cached_property
    def detail_url(self) -> str:
        return self.urls.detail(self.run.pk)

    @property
    def compare_url(self) -> str:
        """The comparison, once the run completed ("" before)."""
        run = self.run
        return self.urls.compare(run.pk) if run.status == RunStatus.COMPLETED else ""

    @property
    def cancel_url(self) -> str:
        return self.urls.cancel(self.run.pk)

    @property
    def status_label(self) -> str:
        return self.run.get_status_display()

    @property
    def is_queued(self) -> bool:
        return self.run.status == RunStatus.QUEUED

    @property
    def is_live(self) -> bool:
        """Its status badge has the pulsing dot: running or launching."""
        return self.run.status in (RunStatus.RUNNING, RunStatus.LAUNCHING)

    @cached_property
    def end_times(self) -> EndTimes | None:
        """When the run ended, None before it."""
        finished = self.run.finished_at
        return None if finished is None else end_times(finished)

    @property
    def elapsed_text(self) -> str:
        return formatting.duration(self.elapsed)

    @property
    def files_text(self) -> str:
        """The count once there is one to tell (0 after a run that started), else a dash."""
        run = self.run
        if run.is_finished and run.started_at or run.files_changed:
            return str(run.files_changed)
        return formatting.DASH

    @property
    def tokens_title(self) -> str:
        return f"{formatting.tokens(self.run.total_tokens)} tokens"

    @property
    def tokens_text(self) -> str:
        run = self.run
        total = run.total_tokens
        if total or run.is_finished and run.started_at:
            return formatting.tokens_short(total)
        return formatting.DASH

    @property
    def cost_text(self) -> str | SafeString:
        """The cost, "unknown price" (marked up) for an ended run without a price, a dash
        while it is not computed yet."""
        cost = self.run.cost_usd
        if cost is not None or self.cost_is_unknown:
            return formatting.usd_html(cost)
        return formatting.DASH

    @property
    def not_judged_reason(self) -> str:
        """The reason's first line, whole: its cause is often at its end."""
        report = self.report
        return _first_line(report.reason) if report is not None else ""

    @property
    def not_judged_more(self) -> bool:
        report = self.report
        return report is not None and _first_line(report.reason) != report.reason.strip()

    @property
    def judging(self) -> bool:
        """Being judged against history: no report yet, the review under way."""
        return self.run.phase == RunPhase.REVIEWING

    @property
    def launch_error_title(self) -> str:
        error = self.launch_error
        if error is None:
            return ""
        where = f" on {error.host}" if error.host else ""
        return f"Launch failed: {error.get_code_display().lower()}{where}"

    @property
    def launch_error_text(self) -> str:
        error = self.launch_error
        return _first_line(error.message) if error is not None else ""

    @property
    def failure_title(self) -> str:
        return self.run.get_failure_code_display()

    @property
    def failure_owner_note(self) -> str:
        """Whose failure it is, when it is not the model's (the leaderboard leaves it out)."""
        owner = self.run.failure_owner
        if owner is None or owner == FailureOwner.MODEL:
            return ""
        return f"not counted against the model: {owner.label}"

    @property
    def failure_text(self) -> str:
        """The message's first line, whole; the run's page has the rest."""
        return _first_line(self.run.failure_message)

    @property
    def failure_more(self) -> bool:
        return _first_line(self.run.failure_message) != self.run.failure_message.strip()

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

    @cached_property
    def report(self) -> Report | None:
        return self.run.current_report

    @property
    def winner(self) -> str:
        report = self.report
        return "" if report is None or report.winner is None else report.winner

    @property
    def tests_override(self) -> bool:
        """The replay broke a test that passed historically, so it cannot win."""
        report = self.report
        return report is not None and bool((report.data or {}).get("tests_override"))

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

    @cached_property
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

    @cached_property
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
    urls = RunUrls.make()
    return [
        RunCard(
            run=run,
            label=labels.get(run.model, run.model),
            launch_error=next(iter(run.launch_errors.all()), None),
            now=now,
            urls=urls,
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
    # Once per request, however many models replayed it.
    historical_cost: Decimal | None
    evaluator_cost: Decimal | None
    judged_runs: int
    requests: int = 0  # the requests the judged runs replayed

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
        historical_cost=_total(list(_historical_costs(judged).values())),
        evaluator_cost=_evaluator_cost([card.report for card in cards if card.report]),
        judged_runs=len(judged),
        requests=len(_historical_costs(judged)),
    )


def _historical_costs(judged: list[RunCard]) -> dict[tuple[int, str, str], Decimal | None]:
    """What history cost, once per request (thread and range), however many models
    replayed it."""
    return {
        (card.run.thread_id, card.run.start_message_uuid, card.run.end_message_uuid): _decimal(
            (card.report.data or {}).get("historical", {}).get("cost_usd")
        )
        for card in judged
        if card.report is not None
    }


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


class ResultCounts(NamedTuple):
    unreported: int = 0  # completed runs still without a current report
    judged: int = 0  # runs whose current report is judged


def result_counts(batch_ids: list[int]) -> dict[int, ResultCounts]:
    """Per batch, its runs waiting for a report and its judged runs: the one definition
    behind "reviews pending" and "not judged" on the batch list and on the batch page."""
    judged = Exists(
        Report.objects.filter(run=OuterRef("pk"), is_current=True, status=ReportStatus.JUDGED)
    )
    rows = (
        Run.objects.filter(batch__in=batch_ids)
        .values("batch")
        .annotate(
            unreported=Count(
                "id",
                filter=Q(status=RunStatus.COMPLETED) & RunQuerySet.waiting_for_results(),
            ),
            judged=Count("id", filter=Q(judged)),
        )
        .values_list("batch", "unreported", "judged")
    )
    return {batch: ResultCounts(unreported, judged) for batch, unreported, judged in rows}


def batch_state(*, active: int, counts: ResultCounts) -> tuple[str, str]:
    """(badge class, label) of a batch from its counts of active, unreported and judged runs."""
    if active:
        return "running", "In progress"
    if counts.unreported:
        return "finished", "Finished · reviews pending"
    if not counts.judged:
        # Every run ended, and none has a verdict: nothing here answers the question yet.
        return "not_judged", "Finished · not judged"
    return "results_ready", "Results ready"


def _first_line(text: str) -> str:
    """The first non-blank line of a message, whole."""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")
