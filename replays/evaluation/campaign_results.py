"""A campaign's results: per model, how often it was as good as history on the user's own
requests, at what cost and in what time against history on the same requests; every two
models head to head; whether the calibration baselines say the judge can be trusted; and
each request's outcomes (docs/campaigns.md).

Kept, not computed per view: `refresh` writes them on the Campaign row when a member
ends or is judged (the coordinator, a judgment's end, the host loop's turn as a safety
net), and `refresh_if_stale` recomputes only when the members' signature changed since.
What counts is the leaderboard's rule (replays.evaluation.leaderboard): a judged run is
a win, tie or loss; a failure on the model's side counts against it; setup problems and
ours (a launch that never happened, a budget exhausted, a review that failed) are shown
apart and never counted."""

from __future__ import annotations

import csv
import io
import math
from collections import Counter, defaultdict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import Count, F, FilteredRelation, Max, Q
from django.utils import timezone

from replays import statistics
from replays.agents.baselines import EMPTY, HISTORICAL
from replays.evaluation.leaderboard import (
    FAILED,
    LOSS,
    NOT_COUNTED_REASONS,
    RUN_OUTCOME,
    SETUP,
    TIE,
    WIN,
)
from replays.formatting import csv_cell
from replays.models import (
    ACTIVE_RUN_STATUSES,
    FINISHED_REPORT_STATUSES,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    FailureCode,
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
)

BASELINES = (HISTORICAL, EMPTY)
COUNTED = frozenset({WIN, TIE, LOSS, FAILED})
NOT_COUNTED_WORDS = {
    **NOT_COUNTED_REASONS,
    FailureCode.BUDGET_EXHAUSTED.value: "budget exhausted",
    SETUP: "setup",
}
# Below any judge's score: a run that failed on the model's side loses head to head.
FAILED_SCORE = -1.0
# The chart's cost axis: cost against history, on a log scale from 1/16 to 16 times.
CHART_MIN_RATIO, CHART_MAX_RATIO = 1 / 16, 16.0


@dataclass(frozen=True)
class Member:
    """One run of the campaign as the results need it."""

    run_id: int
    model: str
    outcome: str  # WIN, TIE, LOSS, FAILED, SETUP or why it is not counted
    score: float | None
    cost: Decimal | None
    seconds: float | None
    request: int  # the CampaignRequest's id


# --- keeping them up to date ------------------------------------------------------------


def signature(campaign: Campaign) -> list[Any]:
    """What the results depend on, in one query: a change of any member's status or a
    judgment written changes it."""
    runs = Run.objects.filter(batch__campaign=campaign)
    figures = runs.aggregate(
        n_runs=Count("pk", distinct=True),
        n_active=Count("pk", distinct=True, filter=Q(status__in=ACTIVE_RUN_STATUSES)),
        last_finished=Max("finished_at"),
        n_reports=Count(
            "reports", distinct=True, filter=Q(reports__status__in=FINISHED_REPORT_STATUSES)
        ),
        last_report=Max("reports__id"),
        n_judging=Count("reports", distinct=True, filter=Q(reports__status=ReportStatus.JUDGING)),
    )
    last = figures["last_finished"]
    return [
        figures["n_runs"], figures["n_active"], last.isoformat() if last else None,
        figures["n_reports"], figures["last_report"], figures["n_judging"],
    ]  # fmt: skip


def refresh_if_stale(campaign: Campaign) -> Campaign:
    """The campaign with its results as of now: recomputed only when its members changed
    since they were written (a few counts otherwise)."""
    if campaign.approved_at is None:
        return campaign
    if (campaign.results or {}).get("signature") != signature(campaign):
        refresh(campaign.pk)
        campaign.refresh_from_db()
    return campaign


def refresh_for_run(run_id: int) -> None:
    """After a member ended or was judged (a no-op for a run of no campaign)."""
    campaign_id = Run.objects.filter(pk=run_id).values_list("batch__campaign_id", flat=True)
    found = campaign_id.first()
    if found is not None:
        refresh(found)


def refresh_running() -> int:
    """The host loop's safety net: every running campaign whose members changed since its
    results were written (a member ended by dispatch or reconcile); how many were."""
    refreshed = 0
    for campaign in Campaign.objects.filter(status=CampaignStatus.RUNNING):
        before = campaign.results_updated_at
        if refresh_if_stale(campaign).results_updated_at != before:
            refreshed += 1
    return refreshed


def refresh(campaign_id: int) -> dict[str, Any]:
    """Compute and write the results; a running campaign whose members all ended (and
    were judged) becomes finished."""
    campaign = Campaign.objects.get(pk=campaign_id)
    mark = signature(campaign)
    results = compute(campaign)
    results["signature"] = mark
    finished = mark[1] == 0 and mark[5] == 0
    with transaction.atomic():
        Campaign.objects.filter(pk=campaign_id).update(
            results=results, results_updated_at=timezone.now()
        )
        if finished:
            Campaign.objects.filter(pk=campaign_id, status=CampaignStatus.RUNNING).update(
                status=CampaignStatus.FINISHED
            )
    return results


# --- the figures ----------------------------------------------------------------------------


def gradability_of(review: Review) -> tuple[bool, str]:
    """Gradable: the tests pass at the historical ending and see the request's own change
    (a test failing at the baseline, the historical test files laid over it, passes at the
    ending: FAIL_TO_PASS is not empty)."""
    sets = (review.tests or {}).get("sets") or {}
    if not sets.get("usable"):
        reason = sets.get("reason") or review.error or "The tests did not run."
        return False, f"Not gradable: {reason}"
    if not sets.get("fail_to_pass"):
        return False, "Not gradable: no test fails at the baseline and passes at the ending."
    return True, f"Gradable: {len(sets['fail_to_pass'])} test(s) fail before and pass after."


def _learn_gradability(campaign: Campaign) -> None:
    """Selected requests whose gradability was not known at prepare learn it from the
    shared review their members' judgments used (its tests ran at the baseline and the
    historical ending): three queries, however many requests."""
    unknown = dict(
        CampaignRequest.objects.filter(
            campaign=campaign, selected=True, gradable__isnull=True, plan__isnull=False
        ).values_list("plan_id", "pk")
    )
    if not unknown:
        return
    review_of: dict[int, int] = {}
    for plan_id, review_id in (
        Report.objects.filter(
            run__batch__plan_id__in=list(unknown),
            review__status__in=[ReviewStatus.READY, ReviewStatus.FAILED],
        )
        .order_by("review_id")
        .values_list("run__batch__plan_id", "review_id")
    ):
        review_of.setdefault(plan_id, review_id)
    reviews = Review.objects.in_bulk(set(review_of.values()))
    for plan_id, review_id in review_of.items():
        gradable, detail = gradability_of(reviews[review_id])
        CampaignRequest.objects.filter(pk=unknown[plan_id], gradable__isnull=True).update(
            gradable=gradable, gradable_detail=detail
        )


def members(campaign: Campaign) -> list[Member]:
    """Every member run, with what became of it: one query."""
    request_of = {
        plan_id: request_id
        for request_id, plan_id in CampaignRequest.objects.filter(
            campaign=campaign, plan__isnull=False
        ).values_list("pk", "plan_id")
    }
    rows = (
        Run.objects.filter(batch__campaign=campaign)
        .annotate(current=FilteredRelation("reports", condition=Q(reports__is_current=True)))
        .annotate(
            member_outcome=RUN_OUTCOME,
            member_score=F("current__score_replay"),
            member_plan=F("batch__plan_id"),
        )
        .values_list(
            "pk",
            "model",
            "member_outcome",
            "member_score",
            "cost_usd",
            "wall_seconds",
            "member_plan",
        )  # fmt: skip
        .order_by("pk")
    )
    return [
        Member(run_id, model, outcome, score, cost, seconds, request_of.get(plan_id, 0))
        for run_id, model, outcome, score, cost, seconds, plan_id in rows
    ]


def compute(campaign: Campaign) -> dict[str, Any]:
    _learn_gradability(campaign)
    requests = {
        request.pk: request
        for request in CampaignRequest.objects.filter(campaign=campaign, selected=True).order_by(
            "position"
        )
    }
    found = members(campaign)
    models = list(campaign.configuration.get("models") or [])
    by_model: dict[str, list[Member]] = defaultdict(list)
    for member in found:
        by_model[member.model].append(member)
    rows = [_model_row(model, by_model.get(model, []), requests) for model in models]
    statuses = Counter(
        Run.objects.filter(batch__campaign=campaign).values_list("status", flat=True)
    )
    return {
        "members": dict(sorted(statuses.items())),
        "models": rows,
        "head_to_head": _head_to_head(models, by_model),
        "calibration": _calibration(models, by_model, requests),
        "requests": _request_rows(requests, found, models),
        "chart": chart_points(rows),
    }


def _model_row(
    model: str, members: list[Member], requests: dict[int, CampaignRequest]
) -> dict[str, Any]:
    outcomes = Counter(member.outcome for member in members)
    wins, ties, losses, failed = (outcomes[name] for name in (WIN, TIE, LOSS, FAILED))
    n = wins + ties + losses + failed
    rate = statistics.wilson_interval(wins + ties, n) if n else None
    counted = [member for member in members if member.outcome in COUNTED]
    costs = [member.cost for member in counted]
    total_cost = statistics.total(costs) if counted else None
    history_costs = [_history_cost(requests.get(member.request)) for member in counted]
    history_total = statistics.total(history_costs) if counted else None
    history_seconds = [_history_seconds(requests.get(m.request)) for m in counted]
    seconds = [member.seconds for member in counted]
    successes = wins + ties
    return {
        "model": model,
        "baseline": model in BASELINES,
        "n": n,
        "wins": wins,
        "ties": ties,
        "losses": losses,
        "failed": failed,
        "setup": outcomes[SETUP],
        "not_counted": len(members) - n - outcomes[SETUP],
        "not_counted_reasons": {
            NOT_COUNTED_WORDS.get(reason, reason): count
            for reason, count in sorted(outcomes.items())
            if reason not in COUNTED and reason != SETUP
        },
        "rate": rate.value if rate else None,
        "rate_low": rate.low if rate else None,
        "rate_high": rate.high if rate else None,
        "cost_usd": _usd(total_cost),
        "history_cost_usd": _usd(history_total),
        "cost_ratio_median": _median_ratio(costs, history_costs),
        "seconds": _round(sum(s for s in seconds if s is not None)) if counted else None,
        "history_seconds": _round(sum(s for s in history_seconds if s is not None))
        if counted
        else None,
        "time_ratio_median": _median_ratio(seconds, history_seconds),
        "cost_per_success_usd": _usd(total_cost / successes)
        if successes and total_cost is not None
        else None,
    }


def _history_cost(request: CampaignRequest | None) -> Decimal | None:
    return None if request is None else request.history_cost_usd


def _history_seconds(request: CampaignRequest | None) -> float | None:
    return None if request is None else request.history_seconds


def _median_ratio(
    values: list[Decimal | float | None], history: list[Decimal | float | None]
) -> float | None:
    """The median over requests of this model's figure divided by history's, on the
    requests where both are known and history's is not zero."""
    ratios = [
        float(value) / float(past)
        for value, past in zip(values, history, strict=True)
        if value is not None and past is not None and past > 0
    ]
    found = statistics.median(ratios)
    return None if found is None else round(float(found), 4)


def _head_to_head(models: list[str], by_model: dict[str, list[Member]]) -> list[dict[str, Any]]:
    """Each two models over the requests both ran and both counted: by the judge's score
    of each against history (a failure on the model's side scores below any), with the
    exact sign test's p-value (ties left out)."""
    scores = {
        model: {
            member.request: (FAILED_SCORE if member.outcome == FAILED else member.score or 0.0)
            for member in by_model.get(model, [])
            if member.outcome in COUNTED
        }
        for model in models
    }
    records = statistics.head_to_head(scores)
    pairs = []
    for index, a in enumerate(models):
        for b in models[index + 1 :]:
            record = records.get((a, b))
            if record is None:
                continue
            pairs.append(
                {
                    "a": a, "b": b, "n": record.n, "wins": record.wins, "ties": record.ties,
                    "losses": record.losses,
                    "p_value": _round(statistics.sign_test_p(record.wins, record.losses), 4),
                }
            )  # fmt: skip
    return pairs


def _calibration(
    models: list[str], by_model: dict[str, list[Member]], requests: dict[int, CampaignRequest]
) -> dict[str, Any]:
    """On gradable requests, `historical` (history's own change) must not lose and `empty`
    (no change) must lose; when the campaign has them and they do not, its judge is not
    to be trusted. trusted is None when nothing could be checked."""
    checks = []
    problems = []
    for baseline, expected in ((HISTORICAL, "not lose"), (EMPTY, "lose")):
        if baseline not in models:
            continue
        judged = [
            member
            for member in by_model.get(baseline, [])
            if member.outcome in COUNTED and getattr(requests.get(member.request), "gradable", None)
        ]
        wrong = [
            member
            for member in judged
            if (member.outcome in (LOSS, FAILED)) == (expected == "not lose")
        ]
        checks.append(
            {
                "model": baseline,
                "expected": expected,
                "checked": len(judged),
                "wrong": len(wrong),
                "wrong_runs": [member.run_id for member in wrong],
            }  # fmt: skip
        )
        if wrong:
            verb = "lost" if expected == "not lose" else "did not lose"
            problems.append(
                f"{baseline} {verb} on {len(wrong)} of {len(judged)} gradable request(s)."
            )
    checked = sum(check["checked"] for check in checks)
    return {
        "checks": checks,
        "trusted": None if not checked else not problems,
        "problems": problems,
    }


def _request_rows(
    requests: dict[int, CampaignRequest], found: list[Member], models: list[str]
) -> list[dict[str, Any]]:
    outcomes: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
    for member in found:
        outcomes[member.request][member.model] = {
            "run_id": member.run_id, "outcome": member.outcome, "score": member.score,
            "cost_usd": _usd(member.cost),
        }  # fmt: skip
    return [
        {
            "id": request.pk,
            "thread_id": request.thread_id,
            "start_message_uuid": request.message_uuid,
            "request": request.request[:200],
            "repository": request.repository,
            "gradable": request.gradable,
            "history_cost_usd": _usd(request.history_cost_usd),
            "outcomes": {model: outcomes[request.pk].get(model) for model in models},
        }
        for request in requests.values()
    ]


def chart_points(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One point per model with a rate: its as-good-as-history rate and interval against
    its median cost relative to history (the x a log scale, clamped to the chart)."""
    points = []
    for row in rows:
        if row["rate"] is None:
            continue
        ratio = row["cost_ratio_median"]
        points.append(
            {
                "model": row["model"], "rate": row["rate"], "rate_low": row["rate_low"],
                "rate_high": row["rate_high"], "cost_ratio": ratio,
                "x": None if ratio is None else _log_position(ratio),
            }
        )  # fmt: skip
    return points


def _log_position(ratio: float) -> float:
    """0..1 across the chart for a cost ratio (1/16 at the left, 16 at the right)."""
    clamped = min(max(ratio, CHART_MIN_RATIO), CHART_MAX_RATIO)
    low, high = math.log(CHART_MIN_RATIO), math.log(CHART_MAX_RATIO)
    return round((math.log(clamped) - low) / (high - low), 4)


def _usd(value: Decimal | None) -> str | None:
    return None if value is None else str(value.quantize(Decimal("0.000001")))


def _round(value: float | None, places: int = 1) -> float | None:
    return None if value is None else round(value, places)


# --- exports -----------------------------------------------------------------------------

CSV_MODEL_COLUMNS = (
    "model", "n", "wins", "ties", "losses", "failed", "setup", "not_counted", "rate",
    "rate_low", "rate_high", "cost_usd", "history_cost_usd", "cost_ratio_median", "seconds",
    "history_seconds", "time_ratio_median", "cost_per_success_usd",
)  # fmt: skip


def results_csv(results: dict[str, Any]) -> str:
    """The per-model table, then one row per request and model (its outcome and run), as
    CSV: what a spreadsheet needs."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_MODEL_COLUMNS)
    for row in results.get("models") or []:
        writer.writerow([csv_cell(row.get(key)) for key in CSV_MODEL_COLUMNS])
    writer.writerow([])
    writer.writerow(("request_id", "thread_id", "start_message_uuid", "repository", "gradable",
                     "model", "outcome", "score", "cost_usd", "run_id", "request"))  # fmt: skip
    for request in results.get("requests") or []:
        for model, outcome in (request.get("outcomes") or {}).items():
            outcome = outcome or {}
            cells = [
                request["id"], request["thread_id"], request["start_message_uuid"],
                request["repository"], request["gradable"], model,
                outcome.get("outcome", "not run"), outcome.get("score"),
                outcome.get("cost_usd"), outcome.get("run_id"), request["request"],
            ]  # fmt: skip
            writer.writerow([csv_cell(cell) for cell in cells])
    return out.getvalue()
