"""The leaderboard: per model, how often its replays were as good as history, at what
cost and in what time, under one evaluator and one prompt version at a time.

A selector (plain reads): the same few queries however many runs there are; the
figures come from replays.statistics. What counts (docs/evaluation.md):

- a run counts by its current report when that is judged: winner `replay` is a win
  for the model, `tie` a tie, `historical` a loss;
- a run that failed on the model's side (agent error, timeout) has no report and counts
  against the model, in the view of its batch's evaluator;
- a run that failed for setup (not logged in, a quota, an unknown model id: the user's
  or the provider's) is not in n: it is shown apart, as "setup";
- a review that failed, a cancelled run, our own infrastructure failing (a launch that
  never happened, a lost coordinator), and a completed run without a report yet are not
  in n: they are shown as "not counted".
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal
from operator import itemgetter
from typing import Any

from django.db import connections
from django.db.models import (
    BigIntegerField,
    Case,
    CharField,
    Count,
    F,
    FilteredRelation,
    IntegerField,
    Q,
    QuerySet,
    Value,
    When,
)
from django.db.models.functions import Cast, Coalesce, Round

from replays import statistics
from replays.agents import BASELINE_AGENT
from replays.agents.baselines import EMPTY, HISTORICAL
from replays.errors import ServiceError
from replays.models import (
    ACTIVE_RUN_STATUSES,
    FAILURE_OWNERS,
    TOKEN_FIELDS,
    FailureCode,
    FailureOwner,
    ReportStatus,
    Run,
    RunStatus,
    Winner,
)

BASELINES = (HISTORICAL, EMPTY)
FILTER_NAMES = ("repository", "agent", "evaluator", "prompt_version", "context", "since", "until")
# The filters that leave some runs out (evaluator and prompt version choose a view of them).
RUN_FILTERS = ("repository", "agent", "context", "since", "until")
# Long enough for a repository path; a longer value is a mistake, not a filter.
MAX_FILTER_LENGTH = 4096

# Failures on the model's side: they count against it. Setup problems and our own
# (infrastructure, a launch that never happened, a lost coordinator) do not.
COUNTED_FAILURES = frozenset(
    code for code, owner in FAILURE_OWNERS.items() if owner == FailureOwner.MODEL
)

WIN, TIE, LOSS, FAILED, NOT_COUNTED = "win", "tie", "loss", "failed", "not_counted"
SETUP = FailureCode.SETUP.value

# Why a run is not in n, as the page words it.
NOT_COUNTED_REASONS = {
    "review_failed": "review failed",
    "cancelled": "cancelled",
    FailureCode.INFRASTRUCTURE.value: "infrastructure failure",
    FailureCode.LAUNCH_FAILED.value: "launch failed",
    FailureCode.COORDINATOR_LOST.value: "coordinator lost",
    "awaiting_report": "no report yet",
}


class InvalidFilter(ServiceError):
    """A filter value that cannot be used, with the field it came from."""

    def __init__(self, field: str, message: str, value: str) -> None:
        super().__init__(message, code="invalid_filter", details={"field": field, "value": value})
        self.field = field
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
    # Failed for setup (not logged in, a quota...): not the model's doing, not in n.
    setup: int
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
    # None when not asked for (the API's rows do without them).
    choices: Choices | None

    @property
    def models(self) -> list[str]:
        return [row.model for row in self.rows]


# --- reading ------------------------------------------------------------------------------------

# What became of a run, worked out in the query: win, tie, loss, failed, or why it is not
# counted (a key of NOT_COUNTED_REASONS).
RUN_OUTCOME = Case(
    When(current__status=ReportStatus.JUDGED, current__winner=Winner.REPLAY, then=Value(WIN)),
    When(current__status=ReportStatus.JUDGED, current__winner=Winner.TIE, then=Value(TIE)),
    When(
        current__status=ReportStatus.JUDGED,
        current__winner=Winner.HISTORICAL,
        then=Value(LOSS),
    ),
    When(current__status=ReportStatus.REVIEW_FAILED, then=Value("review_failed")),
    When(status=RunStatus.FAILED, failure_code__in=COUNTED_FAILURES, then=Value(FAILED)),
    When(status=RunStatus.FAILED, then=F("failure_code")),
    When(status=RunStatus.CANCELLED, then=Value("cancelled")),
    default=Value("awaiting_report"),
    output_field=CharField(),
)
_JUDGED = frozenset({WIN, TIE, LOSS})
_COUNTED = frozenset({WIN, TIE, LOSS, FAILED})
MICRO_USD = statistics.MICRO_USD


def _runs(user: Any, filters: Filters) -> QuerySet[Run]:
    runs = Run.objects.visible_to(user)
    if filters.repository is not None:
        runs = runs.filter(repository=filters.repository)
    if filters.agent == BASELINE_AGENT:
        runs = runs.filter(model__in=BASELINES)
    elif filters.agent is not None:
        runs = runs.filter(model__startswith=f"{filters.agent}:")
    if filters.since is not None:
        runs = runs.filter(created_at__date__gte=filters.since)
    if filters.until is not None:
        runs = runs.filter(created_at__date__lte=filters.until)
    return runs


# One finished run as the figures need it, in this order.
_Entry = tuple[
    str,  # model
    str,  # outcome: WIN, TIE, LOSS, FAILED or a reason it is not counted
    str,  # evaluator: the current report's, else the batch's
    str | None,  # prompt version: None without a report (in the view of any)
    float | None,  # the replay's score
    int | bool | None,  # both orders agreed
    int | None,  # cost in millionths of a dollar; None: unknown price
    float | None,  # wall seconds
    int,  # the request: thread,
    str,  # first message
    str,  # and last message of the range
]
MODEL, OUTCOME, EVALUATOR, VERSION, SCORE, AGREED, COST, SECONDS = range(8)
REQUEST = slice(8, 11)


# With all_runs, three more columns after _Entry's, for the filters' choices.
ACTIVE, REPOSITORY, REPORT_CONTEXT = 11, 12, 13
_CHOICE_COLUMNS = {
    "choice_active": Case(
        When(status__in=ACTIVE_RUN_STATUSES, then=Value(1)),
        default=Value(0),
        output_field=IntegerField(),
    ),
    "choice_repository": F("repository"),
    "choice_context": F("current__context"),
}


def _entries(user: Any, filters: Filters, *, all_runs: bool = False) -> list[_Entry]:
    """Every finished run the filters keep (the context too), with what its current
    report says, by model and in the order the runs were made: one query. With
    `all_runs` (no filter on the runs then), active runs too, and _CHOICE_COLUMNS.

    Only the figures' columns, the outcome and the cost worked out in the query, and the
    rows read as the database driver returns them: at 10,000 runs, making Decimals,
    reading JSON and Django's per-value converters were most of the page's time.
    """
    runs = _runs(user, filters)
    if not all_runs:
        runs = runs.exclude(status__in=ACTIVE_RUN_STATUSES)
    runs = runs.annotate(
        current=FilteredRelation("reports", condition=Q(reports__is_current=True)),
        tokens_used=sum((F(name) for name in TOKEN_FIELDS[1:]), F(TOKEN_FIELDS[0])),
    )
    if filters.context is not None:
        # Without a report, the context the run was given.
        runs = runs.annotate(in_context=Coalesce("current__context", "context")).filter(
            in_context=filters.context
        )
    # In _Entry's order; all annotations, so the query selects them in this order.
    columns = {
        "entry_model": F("model"),
        "entry_outcome": RUN_OUTCOME,
        "entry_evaluator": Coalesce("current__evaluator", "batch__evaluator"),
        "entry_version": F("current__prompt_version"),
        "entry_score": F("current__score_replay"),
        "entry_agreed": F("current__consistent"),
        "entry_cost": Case(
            # A run that did no work (it never started) spent nothing: that is known.
            When(
                Q(cost_usd__isnull=True) & ~Q(status=RunStatus.COMPLETED) & Q(tokens_used=0),
                then=Value(0),
            ),
            default=Cast(Round(F("cost_usd") * MICRO_USD), BigIntegerField()),
            output_field=BigIntegerField(),
        ),
        "entry_seconds": F("wall_seconds"),
        "entry_thread": F("thread_id"),
        "entry_start": F("start_message_uuid"),
        "entry_end": F("end_message_uuid"),
        **(_CHOICE_COLUMNS if all_runs else {}),
    }
    values = runs.annotate(**columns).values_list(*columns).order_by("model", "id")
    return _driver_rows(values)


def _driver_rows(queryset: QuerySet[Any]) -> list[Any]:
    """The rows of a values_list() query as the database driver returns them: the ORM
    writes the query, and no converter runs per value (SQLite's bool and Django's int
    converters were a fifth of the time at 10,000 runs). Booleans may come as 0 and 1."""
    sql, params = queryset.query.get_compiler(using=queryset.db).as_sql()
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


def filter_choices(user: Any) -> Choices:
    """What each filter can be set to, over all the user's runs: one query."""
    judged = Q(current__status=ReportStatus.JUDGED)
    groups = (
        Run.objects.visible_to(user)
        .annotate(current=FilteredRelation("reports", condition=Q(reports__is_current=True)))
        .values(
            "repository",
            "model",
            # The current judged report's, null for a run without one.
            judged_evaluator=Case(When(judged, then=F("current__evaluator"))),
            judged_version=Case(When(judged, then=F("current__prompt_version"))),
            judged_context=Case(When(judged, then=F("current__context"))),
        )
        .annotate(count=Count("id"))
        .order_by()
    )
    judged: Counter[tuple[str, str, str]] = Counter()
    repositories: Counter[str] = Counter()
    models: Counter[str] = Counter()
    for row in groups:
        count = row["count"]
        if row["repository"]:
            repositories[row["repository"]] += count
        models[row["model"]] += count
        if row["judged_evaluator"] is not None:
            judged[row["judged_evaluator"], row["judged_version"], row["judged_context"]] += count
    return _choices(judged, repositories, models)


def _choices_of(rows: list[Any]) -> Choices:
    """filter_choices, from _entries(all_runs=True) rather than a query of its own."""
    judged = Counter(
        (row[EVALUATOR], row[VERSION], row[REPORT_CONTEXT])
        for row in rows
        if row[OUTCOME] in _JUDGED
    )
    repositories = Counter(row[REPOSITORY] for row in rows if row[REPOSITORY])
    return _choices(judged, repositories, Counter(row[MODEL] for row in rows))


def _choices(
    judged: Counter[tuple[str, str, str]], repositories: Counter[str], models: Counter[str]
) -> Choices:
    """The choices from the counts of current judged reports by (evaluator, prompt
    version, context) and of runs by repository and by model."""
    evaluators: Counter[str] = Counter()
    versions: Counter[str] = Counter()
    contexts: Counter[str] = Counter()
    for (evaluator, version, context), count in judged.items():
        evaluators[evaluator] += count
        versions[version] += count
        contexts[context] += count
    agents: Counter[str] = Counter()
    for model, count in models.items():
        agents[agent_of(model)] += count
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
    outcomes = Counter(entry[OUTCOME] for entry in entries)
    wins, ties, losses, failed = (outcomes[name] for name in (WIN, TIE, LOSS, FAILED))
    n = wins + ties + losses + failed
    counted = [entry for entry in entries if entry[OUTCOME] in _COUNTED]
    judged = [entry for entry in counted if entry[OUTCOME] in _JUDGED]
    rate = statistics.wilson_interval(wins + ties, n) if n else None
    costs = [entry[COST] for entry in counted]
    total_cost = statistics.total_usd(costs) if counted else None
    scores = [entry[SCORE] for entry in judged if entry[SCORE] is not None]
    consistency = [entry[AGREED] for entry in judged if entry[AGREED] is not None]
    return Row(
        model=model,
        baseline=model in BASELINES,
        wins=wins,
        ties=ties,
        losses=losses,
        failed=failed,
        setup=outcomes[SETUP],
        not_counted=len(entries) - n - outcomes[SETUP],
        not_counted_reasons={
            reason: count
            for reason, count in outcomes.items()
            if reason not in _COUNTED and reason != SETUP
        },
        rate=rate.value if rate else None,
        rate_low=rate.low if rate else None,
        rate_high=rate.high if rate else None,
        mean_score=statistics.mean(scores),
        total_cost_usd=total_cost,
        median_cost_usd=statistics.median_usd(costs),
        median_seconds=statistics.median(
            entry[SECONDS] for entry in counted if entry[SECONDS] is not None
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


def leaderboard(*, user: Any, filters: Filters, with_choices: bool = True) -> Leaderboard:
    """The leaderboard over the runs `user` may see: one query, whatever their number,
    and one more for the filters' choices (`with_choices`) when a filter narrows the runs.

    Without an evaluator (or prompt version) in the filters, the figures are for the most
    used among the current judged reports the other filters keep, so a filter never
    leaves the board empty just because another evaluator was the most used overall.
    """
    choices: Choices | None = None
    if with_choices and not any(getattr(filters, name) is not None for name in RUN_FILTERS):
        # The choices are over all the runs: here, the same rows as the figures.
        rows = _entries(user, filters, all_runs=True)
        choices = _choices_of(rows)
        entries = [row for row in rows if not row[ACTIVE]]
    else:
        choices = filter_choices(user) if with_choices else None
        entries = _entries(user, filters)
    judged = Counter(
        (entry[EVALUATOR], entry[VERSION]) for entry in entries if entry[OUTCOME] in _JUDGED
    )
    evaluators: Counter[str] = Counter()
    for (in_evaluator, _), count in judged.items():
        evaluators[in_evaluator] += count
    # Nothing judged yet: the view of the evaluator most runs were approved with, so
    # failures (and setup problems) still show.
    evaluator = (
        filters.evaluator
        or _most_used(evaluators)
        or _most_used(Counter(entry[EVALUATOR] for entry in entries))
    )
    versions: Counter[str] = Counter()
    for (in_evaluator, version), count in judged.items():
        if in_evaluator == evaluator:
            versions[version or ""] += count
    # Nothing judged by it yet: the version of its other reports (failed reviews), so
    # they still show as not counted.
    prompt_version = (
        filters.prompt_version
        or _most_used(versions)
        or _most_used(
            Counter(
                entry[VERSION]
                for entry in entries
                if entry[EVALUATOR] == evaluator and entry[VERSION]
            )
        )
    )
    in_view = [
        entry
        for entry in entries
        if evaluator is not None
        and entry[EVALUATOR] == evaluator
        and (entry[VERSION] is None or entry[VERSION] == prompt_version)
    ]
    rows = []
    # Head to head: over the requests two models both replayed and both got judged on; a
    # model that replayed a request more than once counts with its latest run (a model's
    # entries come in the order its runs were made). Requests numbered: ints hash faster.
    request_ids: dict[tuple[int, str, str], int] = {}
    scores: dict[str, dict[int, float]] = {}
    for model, group in itertools.groupby(in_view, key=itemgetter(MODEL)):
        found = list(group)
        rows.append(_row(model, found))
        scores[model] = {
            request_ids.setdefault(entry[REQUEST], len(request_ids)): entry[SCORE]
            for entry in found
            if entry[OUTCOME] in _JUDGED and entry[SCORE] is not None
        }
    return Leaderboard(
        filters=filters,
        evaluator=evaluator,
        prompt_version=prompt_version,
        rows=sorted(rows, key=_rank),
        head_to_head=statistics.head_to_head(scores),
        choices=choices,
    )
