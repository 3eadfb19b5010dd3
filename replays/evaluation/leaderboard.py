"""The leaderboard: per model, how often its replays were as good as history, at what
cost and in what time, under one evaluator and one prompt version at a time.

A selector (plain reads): the same few queries however many runs there are; the
figures come from replays.statistics. What counts (docs/evaluation.md):

- a run counts by its current report when that is judged: winner `replay` is a win
  for the model, `tie` a tie, `historical` a loss;
- a run that failed on the model's side (agent error, timeout, launch failure) has no
  report and counts against the model, in the view of its batch's evaluator;
- a review that failed, a cancelled run, our own infrastructure failing, and a
  completed run without a report yet are not in n: they are shown as "not counted".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, FilteredRelation, Q, QuerySet
from django.db.models.fields.json import KT

from replays import statistics
from replays.agents import BASELINE_AGENT
from replays.agents.baselines import EMPTY, HISTORICAL
from replays.evaluation.report import CONTEXT_COLD
from replays.models import (
    ACTIVE_RUN_STATUSES,
    TOKEN_FIELDS,
    FailureCode,
    Report,
    ReportStatus,
    Run,
    RunStatus,
    Winner,
)

BASELINES = (HISTORICAL, EMPTY)
FILTER_NAMES = ("repository", "agent", "evaluator", "prompt_version", "context", "since", "until")
# Long enough for a repository path; a longer value is a mistake, not a filter.
MAX_FILTER_LENGTH = 4096

# Failures on the model's side: they count against it. Our own (infrastructure, a lost
# coordinator) do not.
COUNTED_FAILURES = frozenset(
    {FailureCode.AGENT_ERROR, FailureCode.TIMEOUT, FailureCode.LAUNCH_FAILED}
)

WIN, TIE, LOSS, FAILED, NOT_COUNTED = "win", "tie", "loss", "failed", "not_counted"
_JUDGED_OUTCOMES = {Winner.REPLAY: WIN, Winner.TIE: TIE, Winner.HISTORICAL: LOSS}

# Why a run is not in n, as the page words it.
NOT_COUNTED_REASONS = {
    "review_failed": "review failed",
    "cancelled": "cancelled",
    FailureCode.INFRASTRUCTURE.value: "infrastructure failure",
    FailureCode.COORDINATOR_LOST.value: "coordinator lost",
    "awaiting_report": "no report yet",
}


class InvalidFilter(ValueError):
    """A filter value that cannot be used, with the field it came from."""

    def __init__(self, field: str, message: str, value: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
        self.value = value


@dataclass(frozen=True)
class Filters:
    """What the figures are over; None means "any" (for evaluator and prompt version:
    the most used)."""

    repository: str | None = None
    agent: str | None = None
    evaluator: str | None = None
    prompt_version: str | None = None
    context: str | None = None
    since: date | None = None
    until: date | None = None

    def as_params(self) -> dict[str, str]:
        """The filters that are set, as query parameters."""
        params = {}
        for name in FILTER_NAMES:
            value = getattr(self, name)
            if value is not None:
                params[name] = value.isoformat() if isinstance(value, date) else value
        return params


def _text(params: Mapping[str, str], name: str) -> str | None:
    value = (params.get(name) or "").strip()
    if not value:
        return None
    if len(value) > MAX_FILTER_LENGTH:
        raise InvalidFilter(
            name, f"{name} is longer than {MAX_FILTER_LENGTH} characters.", value[:100]
        )
    if any(ord(character) < 32 for character in value):
        raise InvalidFilter(name, f"{name} contains control characters.", value[:100])
    return value


def _date(params: Mapping[str, str], name: str) -> date | None:
    value = _text(params, name)
    if value is None:
        return None
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidFilter(
            name, f"{name} must be a date written YYYY-MM-DD, not {value!r}.", value
        ) from None


def parse_filters(params: Mapping[str, str]) -> Filters:
    """Filters from query parameters (empty ones mean "any"); InvalidFilter says which
    one is wrong and why."""
    filters = Filters(
        repository=_text(params, "repository"),
        agent=_text(params, "agent"),
        evaluator=_text(params, "evaluator"),
        prompt_version=_text(params, "prompt_version"),
        context=_text(params, "context"),
        since=_date(params, "since"),
        until=_date(params, "until"),
    )
    if filters.since and filters.until and filters.since > filters.until:
        raise InvalidFilter(
            "until",
            f"until ({filters.until.isoformat()}) is before since ({filters.since.isoformat()}).",
            filters.until.isoformat(),
        )
    return filters


def agent_of(model: str) -> str:
    """The agent a model id belongs to: the part before ':', `baseline` for the baselines."""
    if model in BASELINES:
        return BASELINE_AGENT
    return model.partition(":")[0]


@dataclass(frozen=True)
class Choice:
    value: str
    count: int


@dataclass(frozen=True)
class Choices:
    """The values each filter can take among the user's runs (with how many current
    judged reports, or runs, have each)."""

    evaluators: list[Choice] = field(default_factory=list)
    prompt_versions: list[Choice] = field(default_factory=list)
    contexts: list[Choice] = field(default_factory=list)
    repositories: list[Choice] = field(default_factory=list)
    agents: list[Choice] = field(default_factory=list)


@dataclass(frozen=True)
class Row:
    """One model's figures."""

    model: str
    baseline: bool
    wins: int
    ties: int
    losses: int
    failed: int
    not_counted: int
    not_counted_reasons: dict[str, int]
    rate: float | None
    rate_low: float | None
    rate_high: float | None
    mean_score: float | None
    total_cost_usd: Decimal | None
    median_cost_usd: Decimal | None
    median_seconds: float | None
    cost_per_win_usd: Decimal | None
    consistency: float | None

    @property
    def n(self) -> int:
        return self.wins + self.ties + self.losses + self.failed


@dataclass(frozen=True)
class Leaderboard:
    filters: Filters
    # What the figures are for: given, or the most used; None when nothing was judged.
    evaluator: str | None
    prompt_version: str | None
    rows: list[Row]
    head_to_head: dict[tuple[str, str], statistics.Record]
    choices: Choices

    @property
    def models(self) -> list[str]:
        return [row.model for row in self.rows]


# --- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Entry:
    """One run as the leaderboard sees it."""

    run: int
    model: str
    outcome: str
    reason: str  # why it is not counted
    evaluator: str
    prompt_version: str | None  # None: no report, so in the view of any prompt version
    context: str
    score: float | None
    consistent: bool | None
    cost: Decimal | None  # None: unknown price
    seconds: float | None
    request: tuple[int, str, str]  # thread, first and last message of the range


def _runs(user: Any, filters: Filters) -> QuerySet[Run]:
    runs = Run.objects.visible_to(user)
    if filters.repository is not None:
        # A JSON lookup: SQLite would compare a KT() annotation as JSON, not as text.
        runs = runs.filter(configuration__repository=filters.repository)
    if filters.agent == BASELINE_AGENT:
        runs = runs.filter(model__in=BASELINES)
    elif filters.agent is not None:
        runs = runs.filter(model__startswith=f"{filters.agent}:")
    if filters.since is not None:
        runs = runs.filter(created_at__date__gte=filters.since)
    if filters.until is not None:
        runs = runs.filter(created_at__date__lte=filters.until)
    return runs


def _entries(user: Any, filters: Filters) -> list[_Entry]:
    """Every finished run the run filters keep, with its current report: one query."""
    values = (
        _runs(user, filters)
        .exclude(status__in=ACTIVE_RUN_STATUSES)
        .annotate(
            current=FilteredRelation("reports", condition=Q(reports__is_current=True)),
            start_uuid=KT("configuration__start_message_uuid"),
            end_uuid=KT("configuration__end_message_uuid"),
            run_context=KT("configuration__context"),
            tokens_used=sum((F(name) for name in TOKEN_FIELDS[1:]), F(TOKEN_FIELDS[0])),
        )
        .values_list(*_ENTRY_FIELDS)
        .order_by("id")
    )
    # Tuples, not dicts: at 10,000 runs the page's time goes to building each row.
    return [_entry(*row) for row in values]


# The columns _entry reads, in its parameters' order.
_ENTRY_FIELDS = (
    "id",
    "model",
    "status",
    "failure_code",
    "cost_usd",
    "wall_seconds",
    "tokens_used",
    "thread_id",
    "start_uuid",
    "end_uuid",
    "run_context",
    "batch__evaluator",
    "current__status",
    "current__winner",
    "current__score_replay",
    "current__consistent",
    "current__evaluator",
    "current__prompt_version",
    "current__context",
)


def _entry(
    run_id: int,
    model: str,
    status: str,
    failure_code: str,
    cost: Decimal | None,
    seconds: float | None,
    tokens_used: int,
    thread_id: int,
    start_uuid: str | None,
    end_uuid: str | None,
    run_context: str | None,
    batch_evaluator: str,
    report_status: str | None,
    winner: str | None,
    score: float | None,
    consistent: bool | None,
    report_evaluator: str | None,
    report_prompt_version: str | None,
    report_context: str | None,
) -> _Entry:
    reason = ""
    if report_status == ReportStatus.JUDGED:
        outcome = _JUDGED_OUTCOMES[winner]
    elif report_status == ReportStatus.REVIEW_FAILED:
        outcome, reason = NOT_COUNTED, "review_failed"
    elif status == RunStatus.FAILED and failure_code in COUNTED_FAILURES:
        outcome = FAILED
    elif status == RunStatus.FAILED:
        outcome, reason = NOT_COUNTED, failure_code
    elif status == RunStatus.CANCELLED:
        outcome, reason = NOT_COUNTED, "cancelled"
    else:
        outcome, reason = NOT_COUNTED, "awaiting_report"
    if report_status is not None:
        evaluator, prompt_version, context = (
            report_evaluator,
            report_prompt_version,
            report_context,
        )
    else:
        # No report: the run is in the view of its batch's evaluator, any prompt version.
        evaluator, prompt_version = batch_evaluator, None
        context = run_context or CONTEXT_COLD
    if cost is None and status != RunStatus.COMPLETED and not tokens_used:
        # A run that did no work (it never started) spent nothing: that is known.
        cost = Decimal(0)
    judged = outcome in (WIN, TIE, LOSS)
    return _Entry(
        run=run_id,
        model=model,
        outcome=outcome,
        reason=reason,
        evaluator=evaluator,
        prompt_version=prompt_version,
        context=context,
        score=score if judged else None,
        consistent=consistent if judged else None,
        cost=cost,
        seconds=seconds,
        request=(thread_id, start_uuid or "", end_uuid or ""),
    )


def filter_choices(user: Any) -> Choices:
    """What each filter can be set to, over all the user's runs: two queries."""
    visible = Run.objects.visible_to(user)
    reports = (
        Report.objects.filter(
            is_current=True, status=ReportStatus.JUDGED, run__in=visible.values("pk")
        )
        .values("evaluator", "prompt_version", "context")
        .annotate(count=Count("id"))
        .order_by()
    )
    evaluators: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    contexts: Counter[str] = Counter()
    for row in reports:
        evaluators[row["evaluator"]] += row["count"]
        versions[row["prompt_version"]] += row["count"]
        contexts[row["context"]] += row["count"]
    runs = (
        visible.annotate(repository_path=KT("configuration__repository"))
        .values("repository_path", "model")
        .annotate(count=Count("id"))
        .order_by()
    )
    repositories: Counter[str] = Counter()
    agents: Counter[str] = Counter()
    for row in runs:
        if row["repository_path"]:
            repositories[row["repository_path"]] += row["count"]
        agents[agent_of(row["model"])] += row["count"]
    return Choices(
        evaluators=_by_use(evaluators),
        prompt_versions=_by_use(versions),
        contexts=_by_use(contexts),
        repositories=sorted(_by_use(repositories), key=lambda choice: choice.value),
        agents=sorted(_by_use(agents), key=lambda choice: choice.value),
    )


def _by_use(counts: Counter[str]) -> list[Choice]:
    """Most used first; equal use by name, so the default never depends on query order."""
    return [
        Choice(value, count)
        for value, count in sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    ]


def _most_used(counts: Counter[str]) -> str | None:
    ranked = _by_use(counts)
    return ranked[0].value if ranked else None


# --- the figures --------------------------------------------------------------------------------


def _row(model: str, entries: list[_Entry]) -> Row:
    outcomes = Counter(entry.outcome for entry in entries)
    counted = [entry for entry in entries if entry.outcome != NOT_COUNTED]
    judged = [entry for entry in counted if entry.outcome != FAILED]
    wins, ties, losses, failed = (outcomes[name] for name in (WIN, TIE, LOSS, FAILED))
    n = wins + ties + losses + failed
    rate = statistics.wilson_interval(wins + ties, n) if n else None
    total_cost = statistics.total(entry.cost for entry in counted) if counted else None
    median_cost = statistics.median(entry.cost for entry in counted)
    consistency = [entry.consistent for entry in judged if entry.consistent is not None]
    return Row(
        model=model,
        baseline=model in BASELINES,
        wins=wins,
        ties=ties,
        losses=losses,
        failed=failed,
        not_counted=outcomes[NOT_COUNTED],
        not_counted_reasons=dict(
            Counter(entry.reason for entry in entries if entry.outcome == NOT_COUNTED)
        ),
        rate=rate.value if rate else None,
        rate_low=rate.low if rate else None,
        rate_high=rate.high if rate else None,
        mean_score=statistics.mean(entry.score for entry in judged if entry.score is not None),
        total_cost_usd=total_cost,
        median_cost_usd=None if median_cost is None else Decimal(median_cost),
        median_seconds=statistics.median(
            entry.seconds for entry in counted if entry.seconds is not None
        ),
        cost_per_win_usd=total_cost / wins if wins and total_cost is not None else None,
        consistency=sum(consistency) / len(consistency) if consistency else None,
    )


def _rank(row: Row) -> tuple[Any, ...]:
    """Best first by the interval's lower bound (3 of 3 does not top 250 of 300); rows
    with nothing counted last."""
    if row.rate_low is None:
        return (1, 0.0, 0.0, 0, row.model)
    return (0, -row.rate_low, -(row.rate or 0.0), -row.n, row.model)


def _head_to_head(entries: list[_Entry]) -> dict[tuple[str, str], statistics.Record]:
    """Over the requests two models both replayed and both got judged on; a model that
    replayed a request more than once counts with its latest run."""
    scores: dict[str, dict[tuple[int, str, str], float]] = {}
    for entry in sorted(entries, key=lambda entry: entry.run):
        if entry.outcome in (WIN, TIE, LOSS) and entry.score is not None:
            scores.setdefault(entry.model, {})[entry.request] = entry.score
    return statistics.head_to_head(scores)


def leaderboard(*, user: Any, filters: Filters) -> Leaderboard:
    """The leaderboard over the runs `user` may see: three queries, whatever their number.

    Without an evaluator (or prompt version) in the filters, the figures are for the most
    used among the current judged reports the other filters keep, so a filter never
    leaves the board empty just because another evaluator was the most used overall.
    """
    choices = filter_choices(user)
    entries = [
        entry
        for entry in _entries(user, filters)
        if filters.context is None or entry.context == filters.context
    ]
    judged = [entry for entry in entries if entry.outcome in (WIN, TIE, LOSS)]
    evaluator = filters.evaluator or _most_used(Counter(entry.evaluator for entry in judged))
    prompt_version = filters.prompt_version or _most_used(
        Counter(entry.prompt_version or "" for entry in judged if entry.evaluator == evaluator)
    )
    in_view = [
        entry
        for entry in entries
        if evaluator is not None
        and entry.evaluator == evaluator
        and (entry.prompt_version is None or entry.prompt_version == prompt_version)
    ]
    by_model: dict[str, list[_Entry]] = {}
    for entry in in_view:
        by_model.setdefault(entry.model, []).append(entry)
    rows = sorted((_row(model, found) for model, found in by_model.items()), key=_rank)
    return Leaderboard(
        filters=filters,
        evaluator=evaluator,
        prompt_version=prompt_version,
        rows=rows,
        head_to_head=_head_to_head(in_view),
        choices=choices,
    )
