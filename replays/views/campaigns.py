"""Campaigns: the new-campaign form with its live preview of the counts, a campaign's page
(what prepare found and its one approval; then live progress and the results), the list
of the user's campaigns and the exports. Thin: prepare, preview, approve and cancel are
replays.campaigns; the money is replays.budgets; the results are kept on the campaign by
replays.evaluation.campaign_results and only laid out here.

The campaign page draws up to a few hundred requests times eight models: every URL, text
and class of the per-request table is worked out here once, in plain Python (as the
batch page's cards are, replays/views/cards.py), so the template only prints them."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Substr
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.text import Truncator
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from replays import agents, budgets, campaigns, formatting
from replays.errors import http_status
from replays.evaluation import campaign_results, evaluators
from replays.forms import CampaignForm, first_line
from replays.models import (
    ACTIVE_RUN_STATUSES,
    MAX_MODELS_PER_PLAN,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    ExclusionReason,
    Run,
    RunStatus,
    Thread,
    Turn,
)
from replays.views.common import TokenCookie, model_labels
from replays.views.leaderboard import interval_bar, interval_text
from replays.views.replays import PageError

CAMPAIGNS_PER_PAGE = 25
# How often a running campaign's page asks for its live part again.
POLL_SECONDS = 2
# The page flow hands the prepare token to the browser once, in a signed cookie scoped to
# the campaign's pages, as the plan pages do.
CAMPAIGN_TOKEN = TokenCookie(
    "campaign_token_", "replays.campaign-prepare-token", "replays:campaign-detail"
)
# The preview needs a model to decide with; before one is chosen it scans as if replaying
# history itself (the models only matter for "cannot be replayed with a chosen model").
PREVIEW_STAND_IN_MODEL = "historical"
REQUEST_HEAD_CHARS = 160
WRONG_RUNS_SHOWN = 20
# The most requests one reason's list shows (its fold says how many more).
EXCLUDED_SHOWN = 1000

# What became of one member, as the per-request table says it (keys: the results' outcomes).
OUTCOME_WORDS = {
    "win": "Won",
    "tie": "Tie",
    "loss": "Lost",
    "failed": "Failed",
    "setup": "Setup",
    "budget_exhausted": "Budget exhausted",
    "review_failed": "Review failed",
    "cancelled": "Cancelled",
    "awaiting_report": "Pending",
    "infrastructure": "Infrastructure",
    "launch_failed": "Launch failed",
    "coordinator_lost": "Coordinator lost",
}
# Its colour: counted for the model (good, even, bad), waiting; anything else is apart
# (setup, and what is never counted: budget exhausted, cancelled, our failures).
OUTCOME_TONES = {
    "win": "good",
    "tie": "even",
    "loss": "bad",
    "failed": "bad",
    "awaiting_report": "waiting",
}


def path_maker(name: str) -> Callable[[int], str]:
    """reverse() for many ids at the price of one: a page of 800 outcomes would spend tens
    of milliseconds reversing the same pattern."""
    marker = 987654321
    head, tail = reverse(name, args=[marker]).split(str(marker))
    return lambda pk: f"{head}{pk}{tail}"


def _after_prepare(request: HttpRequest, prepared: campaigns.PreparedCampaign) -> HttpResponse:
    campaign = prepared.campaign
    response = redirect(campaign)
    if prepared.prepare_token is not None:
        CAMPAIGN_TOKEN.give(request, response, campaign.pk, prepared.prepare_token)
    return response


# --- the form and its preview ------------------------------------------------------------


def _campaign_form(data: Any = None, *, initial: dict[str, Any] | None = None) -> CampaignForm:
    return CampaignForm(
        data,
        initial=initial,
        model_infos=agents.discover_models(),
        evaluator_infos=evaluators.discover_evaluators(),
    )


def _form_page(request: HttpRequest, form: CampaignForm, *, status: int = 200) -> HttpResponse:
    return render(
        request,
        "replays/campaign_new.html",
        {"form": form, "max_models": MAX_MODELS_PER_PLAN},
        status=status,
    )


@login_required
@require_http_methods(["GET", "POST"])
def campaign_new(request: HttpRequest) -> HttpResponse:
    """The form (GET; `?from=ID` fills it with one of the user's campaigns, the way back
    from a campaign page) and prepare (POST), which leads to the campaign's page."""
    if request.method != "POST":
        initial = None
        if "from" in request.GET:
            source = get_object_or_404(
                Campaign.objects.filter(owner=request.user), pk=_number(request.GET["from"])
            )
            initial = CampaignForm.initial_from(source.configuration)
        return _form_page(request, _campaign_form(initial=initial))
    form = _campaign_form(request.POST)
    if not form.is_valid():
        return _form_page(request, form, status=400)
    try:
        prepared = campaigns.prepare_campaign(
            owner=request.user, raw_configuration=form.configuration()
        )
    except campaigns.CampaignInputError as exc:
        form.add_service_error(_error_field(exc.details), exc.message)
        return _form_page(request, form, status=http_status(exc))
    return _after_prepare(request, prepared)


def _number(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise Http404("No such campaign.") from None


def _error_field(details: Any) -> str | None:
    return details.get("field") if isinstance(details, dict) else None


@dataclass
class PreviewReason:
    reason: str
    label: str
    count: int


@login_required
@require_GET
def campaign_preview(request: HttpRequest) -> HttpResponse:
    """The counts prepare would show for the form's values, nothing stored: the fragment
    the form asks for as its fields change. Always 200 (htmx swaps only a success): a
    value that cannot be used is said inside the fragment."""
    form = _campaign_form(request.GET)
    context: dict[str, Any] = {"counts": None, "errors": [], "stand_in": False}
    if not form.is_valid():
        context["errors"] = [
            f"{form.fields[name].label}: {error}" if name in form.fields else str(error)
            for name, errors in form.errors.items()
            for error in errors
        ]
        return render(request, "replays/includes/campaign_preview.html", context)
    configuration = form.configuration()
    if not configuration["models"]:
        configuration["models"] = [PREVIEW_STAND_IN_MODEL]
        configuration["context"] = None
        context["stand_in"] = True
    try:
        counts = campaigns.preview(request.user, configuration)
    except campaigns.CampaignInputError as exc:
        context["errors"] = [exc.message]
    else:
        context["counts"] = counts
        context["reasons"] = _reason_counts(counts.get("excluded") or {})
        context["limit"] = configuration["limit"]
    return render(request, "replays/includes/campaign_preview.html", context)


def _reason_counts(excluded: dict[str, int]) -> list[PreviewReason]:
    """Excluded by reason, in the documented order of the reasons."""
    labels = dict(ExclusionReason.choices)
    order = {value: index for index, value in enumerate(ExclusionReason.values)}
    return [
        PreviewReason(reason, labels.get(reason, reason), count)
        for reason, count in sorted(excluded.items(), key=lambda item: order.get(item[0], 99))
        if count
    ]


# --- a campaign's page ----------------------------------------------------------------------


@dataclass
class ScannedRequest:
    """One scanned request as the lists show it (worked out here: a list can be long)."""

    row: CampaignRequest
    number: int | None  # the request's number in its thread (1-based; None: turn gone)
    url: str
    head: str
    title: str
    estimates: list[str | None] = field(default_factory=list)

    @property
    def estimates_html(self) -> SafeString:
        parts = [
            format_html('<td class="num">{}</td>', formatting.usd_html(cost))
            for cost in self.estimates
        ]
        return mark_safe("".join(parts))  # each part escaped by format_html


@dataclass
class TestCommand:
    repository: str
    command: str
    runner: str
    given: bool
    error: str
    origin_url: str
    origin_text: str
    typed: str


@dataclass
class EstimateRow:
    label: str
    model: str
    cost: Any
    seconds: float | None


def _scanned(rows: Any) -> list[ScannedRequest]:
    thread_path = path_maker("replays:thread-detail")
    found = []
    for row in rows:
        # The turn is gone when its thread was imported again since (the row keeps the rest).
        number = row.turn.index + 1 if row.turn is not None else None
        found.append(
            ScannedRequest(
                row=row,
                number=number,
                url=thread_path(row.thread_id) + (f"#turn-{number}" if number else ""),
                head=first_line(row.request_head, 120),
                title=Truncator(row.thread.title or row.thread.session_id).chars(60),
            )
        )
    return found


def _requests(campaign: Campaign) -> Any:
    """The campaign's scanned requests with only what the lists show (a request can be a
    MiB: its first characters are enough)."""
    return (
        CampaignRequest.objects.filter(campaign=campaign)
        .select_related("thread", "turn")
        .only(
            "campaign_id",
            "position",
            "eligible",
            "reason",
            "detail",
            "gradable",
            "gradable_detail",
            "selected",
            "repository",
            "thread__title",
            "thread__session_id",
            "history_cost_usd",
            "turn__index",
        )  # fmt: skip
        .annotate(request_head=Substr("request", 1, REQUEST_HEAD_CHARS))
        .order_by("position")
    )


@login_required
@require_GET
def campaign_excluded(request: HttpRequest, pk: int) -> HttpResponse:
    """The requests one reason excluded, each with its detail: the fragment a reason's fold
    on the campaign page loads when opened (a scan of thousands stays out of the page)."""
    campaign = get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)
    reason = request.GET.get("reason", "")
    if not reason or reason not in ExclusionReason.values:
        raise Http404("No such reason.")
    rows = _requests(campaign).filter(eligible=False, reason=reason)
    shown = _scanned(rows[:EXCLUDED_SHOWN])
    total = int(((campaign.counts or {}).get("excluded") or {}).get(reason, len(shown)))
    return render(
        request,
        "replays/includes/campaign_excluded.html",
        {"requests": shown, "more": max(0, total - len(shown))},
    )


def _selection(campaign: Campaign, models: list[str]) -> list[ScannedRequest]:
    """The selected requests in order, each with its estimate per model (prepare's
    estimate lists them in the same order)."""
    selection = _scanned(_requests(campaign).filter(selected=True))
    per_model = (campaign.estimate or {}).get("models") or {}
    for index, item in enumerate(selection):
        for model in models:
            costs = (per_model.get(model) or {}).get("per_request") or []
            item.estimates.append(costs[index] if index < len(costs) else None)
    return selection


def _test_commands(campaign: Campaign) -> list[TestCommand]:
    found = campaign.test_commands or {}
    thread_ids = {
        (info.get("origin") or {}).get("thread_id")
        for info in found.values()
        if isinstance(info, dict)
    } - {None}
    titles = dict(Thread.objects.filter(pk__in=thread_ids).values_list("pk", "title"))
    commands = []
    for repository, info in sorted(found.items()):
        origin = info.get("origin") or {}
        thread_id = origin.get("thread_id")
        number = origin.get("turn")
        url = origin_text = ""
        if thread_id is not None:
            url = reverse("replays:thread-detail", args=[thread_id])
            if number:
                url += f"#turn-{number}"
            title = Truncator(titles.get(thread_id) or f"Thread {thread_id}").chars(60)
            origin_text = f"{title}, request #{number}" if number else title
        commands.append(
            TestCommand(
                repository=repository,
                command=str(info.get("command") or ""),
                runner=str(info.get("runner") or ""),
                given=bool(origin.get("given")),
                error=str(info.get("error") or ""),
                origin_url=url,
                origin_text=origin_text,
                typed=str(origin.get("typed") or ""),
            )
        )
    return commands


def _estimate_rows(campaign: Campaign, labels: dict[str, str]) -> list[EstimateRow]:
    per_model = (campaign.estimate or {}).get("models") or {}
    return [
        EstimateRow(
            label=labels.get(model, model),
            model=model,
            cost=(per_model.get(model) or {}).get("cost_usd"),
            seconds=(per_model.get(model) or {}).get("seconds"),
        )
        for model in campaign.configuration.get("models") or []
    ]


def _state(campaign: Campaign) -> tuple[str, str]:
    """(badge class, label): an expired campaign says so rather than "ready"."""
    if campaign.status == CampaignStatus.READY_FOR_APPROVAL and campaign.is_expired:
        return "expired", "Expired"
    if campaign.status == CampaignStatus.FINISHED:
        # Every member ended and was judged: the results are final (the batch's colour).
        return "results_ready", campaign.get_status_display()
    return campaign.status, campaign.get_status_display()


def _scan_context(campaign: Campaign, labels: dict[str, str]) -> dict[str, Any]:
    """What prepare found: shown for the approval, and kept below the results after it
    (where the results' table of requests stands for the selection)."""
    configuration = campaign.configuration
    models = list(configuration.get("models") or [])
    counts = campaign.counts or {}
    return {
        "counts": counts,
        "reasons": _reason_counts(counts.get("excluded") or {}),
        "selection": [] if campaign.approved_at else _selection(campaign, models),
        "test_commands": _test_commands(campaign),
        "estimate": campaign.estimate or {},
        "estimate_rows": _estimate_rows(campaign, labels),
        "excluded_total": sum((counts.get("excluded") or {}).values()),
        "filters": configuration.get("filters") or {},
    }


@login_required
def campaign_detail(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)
    return _campaign_page(request, campaign)


def _campaign_page(
    request: HttpRequest,
    campaign: Campaign,
    *,
    error: PageError | None = None,
    status: int = 200,
) -> HttpResponse:
    campaign = campaign_results.refresh_if_stale(campaign)
    labels = model_labels()
    configuration = campaign.configuration
    models = list(configuration.get("models") or [])
    state, state_label = _state(campaign)
    approved = campaign.approved_at is not None
    # The results were just brought up to date: their members say what is still active.
    members = (campaign.results or {}).get("members") or {}
    active = approved and any(members.get(status) for status in ACTIVE_RUN_STATUSES)
    context: dict[str, Any] = {
        "campaign": campaign,
        "state": state,
        "state_label": state_label,
        "approved": approved,
        "models": [(model, labels.get(model, model)) for model in models],
        "configuration": configuration,
        "active": active,
        "poll_seconds": POLL_SECONDS
        if active or campaign.status == CampaignStatus.RUNNING
        else None,
        "error": error,
    }
    if approved:
        context.update(_progress_context(campaign))
        context["results"] = results_view(campaign.results or {}, labels)
    context["short_models"] = short_labels(context["models"])
    if request.htmx and approved:
        return render(request, "replays/includes/campaign_live.html", context, status=status)
    context.update(_scan_context(campaign, labels))
    context.update(
        {
            "ready": campaign.status == CampaignStatus.READY_FOR_APPROVAL,
            "expired": campaign.is_expired,
            "has_token": CAMPAIGN_TOKEN.read(request, campaign.pk) is not None,
            "is_owner": campaign.owner_id == request.user.pk,
        }
    )
    return render(request, "replays/campaign_detail.html", context, status=status)


@dataclass
class StatusCount:
    status: str
    label: str
    count: int


def _progress_context(campaign: Campaign) -> dict[str, Any]:
    money = budgets.money_of(campaign)
    members = (campaign.results or {}).get("members") or {}
    total = sum(members.values())
    ended = sum(count for status, count in members.items() if status not in ACTIVE_RUN_STATUSES)
    exhausted = sum(
        (row.get("not_counted_reasons") or {}).get("budget exhausted", 0)
        for row in (campaign.results or {}).get("models") or []
    )
    budget = money.budget
    return {
        "money": money,
        "waiting_for_money": campaign.status == CampaignStatus.RUNNING
        and budgets.waiting_for_money(campaign, money),
        "member_counts": [
            StatusCount(value, label, members[value])
            for value, label in RunStatus.choices
            if members.get(value)
        ],
        "member_total": total,
        "member_ended": ended,
        "progress_percent": round(100 * ended / total) if total else 0,
        "budget_exhausted": exhausted,
        # The meter: spent, then what the runs in flight hold, against the budget.
        "spent_percent": _share(money.spent, budget),
        "held_percent": _share(money.in_flight, budget),
    }


def _share(amount: Decimal, budget: Decimal | None) -> float:
    if not budget:
        return 0.0
    return round(min(100.0, float(amount / budget * 100)), 2)


# --- the results, laid out -------------------------------------------------------------------


def ratio_text(ratio: float | None) -> str:
    """0.42×, 1.3×, 12×: a figure against history's."""
    if ratio is None:
        return "—"
    if ratio >= 10:
        return f"{ratio:.0f}×"
    if ratio >= 1:
        return f"{ratio:.1f}×"
    return f"{ratio:.2g}×"


def p_value_text(p: float | None) -> str:
    if p is None:
        return "—"
    return "<0.001" if p < 0.001 else f"{p:.3f}"


@dataclass
class ModelRow:
    row: dict[str, Any]
    label: str
    rate_text: str
    bar_low: float
    bar_width: float
    bar_rate: float
    not_counted_text: str
    cost_ratio: str
    time_ratio: str


@dataclass
class PairRow:
    a: str
    b: str
    record: dict[str, Any]
    p_text: str
    significant: bool


@dataclass
class OutcomeCell:
    text: str
    tone: str
    url: str
    title: str
    cost: str

    @property
    def html(self) -> SafeString:
        """The cell's content, written here once (a table can hold 4,000 of them)."""
        if self.url:
            badge = format_html(
                '<a class="outcome outcome-{}" href="{}" title="{}">{}</a>',
                self.tone, self.url, self.title, self.text,
            )  # fmt: skip
        else:
            badge = format_html(
                '<span class="outcome outcome-{}" title="{}">{}</span>',
                self.tone, self.title, self.text,
            )  # fmt: skip
        if self.cost:
            return format_html('{}<span class="outcome-cost">{}</span>', badge, self.cost)
        return badge


@dataclass
class RequestRow:
    item: dict[str, Any]
    url: str
    head: str
    repository: str
    gradable: str
    cells: list[OutcomeCell]

    @property
    def cells_html(self) -> SafeString:
        parts = [format_html('<td class="outcome-cell">{}</td>', cell.html) for cell in self.cells]
        return mark_safe("".join(parts))  # each part escaped by format_html


@dataclass
class ResultsView:
    rows: list[ModelRow]
    pairs: list[PairRow]
    calibration: dict[str, Any]
    wrong_runs: list[tuple[int, str]]  # the baselines' runs that came out wrong, to look at
    wrong_runs_more: int
    requests: list[RequestRow]
    models: list[tuple[str, str]]
    chart: Chart
    any_rate: bool

    @property
    def short_models(self) -> list[tuple[str, str]]:
        return short_labels(self.models)


def short_labels(models: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Column headings: a baseline's label without "(baseline)", cut to a column's width."""
    return [
        (model, Truncator(label.removesuffix(" (baseline)")).chars(28)) for model, label in models
    ]


def _model_row(row: dict[str, Any], label: str) -> ModelRow:
    figures = (row.get("rate"), row.get("rate_low"), row.get("rate_high"))
    bar_low, bar_width, bar_rate = interval_bar(*figures)
    reasons = row.get("not_counted_reasons") or {}
    return ModelRow(
        row=row,
        label=label,
        rate_text=interval_text(*figures),
        bar_low=bar_low,
        bar_width=bar_width,
        bar_rate=bar_rate,
        not_counted_text=", ".join(f"{count} {reason}" for reason, count in reasons.items()),
        cost_ratio=ratio_text(row.get("cost_ratio_median")),
        time_ratio=ratio_text(row.get("time_ratio_median")),
    )


def _outcome_cell(
    outcome: dict[str, Any] | None, label: str, compare_path: Callable[[int], str]
) -> OutcomeCell:
    if outcome is None:
        return OutcomeCell("—", "none", "", f"{label} has no run for this request", "")
    kind = str(outcome.get("outcome") or "")
    text = OUTCOME_WORDS.get(kind, kind.replace("_", " ").capitalize())
    score = outcome.get("score")
    cost = outcome.get("cost_usd")
    title = f"{label}: {text.lower()}" + (f", score {score:.2f}" if score is not None else "")
    return OutcomeCell(
        text=text,
        tone=OUTCOME_TONES.get(kind, "apart"),
        url=compare_path(outcome["run_id"]) if outcome.get("run_id") else "",
        title=title,
        cost=formatting.usd(cost) if cost is not None else "",
    )


def _gradable_text(value: bool | None) -> str:
    return "unknown" if value is None else ("yes" if value else "no")


def results_view(results: dict[str, Any], labels: dict[str, str]) -> ResultsView:
    rows = [
        _model_row(row, labels.get(row["model"], row["model"]))
        for row in results.get("models") or []
    ]
    models = [(row.row["model"], row.label) for row in rows]
    label_of = dict(models)
    pairs = [
        PairRow(
            a=label_of.get(pair["a"], pair["a"]),
            b=label_of.get(pair["b"], pair["b"]),
            record=pair,
            p_text=p_value_text(pair.get("p_value")),
            significant=pair.get("p_value") is not None and pair["p_value"] < 0.05,
        )
        for pair in results.get("head_to_head") or []
    ]
    requests = []
    found = results.get("requests") or []
    # The results name each request by its thread and message; its number in the thread
    # is the thread page's anchor (one query for all of them).
    keys = {(item["thread_id"], item.get("start_message_uuid")) for item in found}
    numbers = {
        (thread_id, uuid): index
        for thread_id, uuid, index in Turn.objects.filter(
            thread_id__in={thread_id for thread_id, _ in keys},
            message_uuid__in={uuid for _, uuid in keys},
        ).values_list("thread_id", "message_uuid", "index")
    }
    thread_path, compare_path = (
        path_maker("replays:thread-detail"),
        path_maker("replays:run-compare"),
    )
    for item in found:
        outcomes = item.get("outcomes") or {}
        index = numbers.get((item["thread_id"], item.get("start_message_uuid")))
        anchor = f"#turn-{index + 1}" if index is not None else ""
        requests.append(
            RequestRow(
                item=item,
                url=thread_path(item["thread_id"]) + anchor,
                head=first_line(item.get("request") or "", 100),
                repository=formatting.short_path(item.get("repository")),
                gradable=_gradable_text(item.get("gradable")),
                cells=[
                    _outcome_cell(outcomes.get(model), label, compare_path)
                    for model, label in models
                ],
            )
        )
    calibration = results.get("calibration") or {"checks": [], "trusted": None, "problems": []}
    wrong = [
        (run_id, compare_path(run_id))
        for check in calibration.get("checks") or []
        for run_id in check.get("wrong_runs") or []
    ]
    return ResultsView(
        rows=rows,
        pairs=pairs,
        calibration=calibration,
        wrong_runs=wrong[:WRONG_RUNS_SHOWN],
        wrong_runs_more=max(0, len(wrong) - WRONG_RUNS_SHOWN),
        requests=requests,
        models=models,
        chart=rate_cost_chart(results.get("chart") or [], label_of),
        any_rate=any(row.row.get("rate") is not None for row in rows),
    )


# --- the chart: rate against cost, drawn here as SVG ------------------------------------------

CHART_WIDTH = 760
CHART_HEIGHT = 430
CHART_LEFT = 70
CHART_RIGHT = 730
CHART_TOP = 20
CHART_BOTTOM = 370
# The cost axis: cost against history from 1/16 to 16 times, on a log scale (the results'
# `x` is already the position 0..1 on it).
CHART_RATIOS = (
    (1 / 16, "1/16×"), (1 / 8, "1/8×"), (1 / 4, "1/4×"), (1 / 2, "1/2×"), (1.0, "1×"),
    (2.0, "2×"), (4.0, "4×"), (8.0, "8×"), (16.0, "16×"),
)  # fmt: skip
CHART_RATES = (0, 25, 50, 75, 100)
CHART_LABEL_CHARS = 28


@dataclass(frozen=True)
class ChartPoint:
    label: str
    text: str
    baseline: bool
    cx: float
    cy: float
    y_low: float
    y_high: float
    label_x: float
    label_anchor: str

    @property
    def cap_left(self) -> float:
        return round(self.cx - 5, 1)

    @property
    def cap_right(self) -> float:
        return round(self.cx + 5, 1)


@dataclass(frozen=True)
class Chart:
    width: int
    height: int
    left: int
    right: int
    top: int
    bottom: int
    x_ticks: list[tuple[float, str]]
    y_ticks: list[tuple[float, str]]
    one_x: float  # the line at history's cost
    half_y: float
    points: list[ChartPoint]
    not_drawn: list[str]  # models with a rate but no cost against history

    @property
    def sweet_width(self) -> float:
        """The shaded quarter: cheaper than history and as good at least half the time."""
        return round(self.one_x - self.left, 1)

    @property
    def sweet_height(self) -> float:
        return round(self.half_y - self.top, 1)

    @property
    def sweet_label_x(self) -> float:
        return round(self.one_x - 10, 1)

    @property
    def sweet_label_y(self) -> float:
        return round(self.half_y - 10, 1)

    @property
    def x_title_y(self) -> int:
        return self.bottom + 44

    @property
    def middle_x(self) -> float:
        return (self.left + self.right) / 2

    @property
    def middle_y(self) -> float:
        return (self.top + self.bottom) / 2


def _chart_x(position: float) -> float:
    return round(CHART_LEFT + position * (CHART_RIGHT - CHART_LEFT), 1)


def _chart_y(rate: float) -> float:
    return round(CHART_BOTTOM - rate * (CHART_BOTTOM - CHART_TOP), 1)


def rate_cost_chart(points: list[dict[str, Any]], labels: dict[str, str]) -> Chart:
    """Each model's as-good-as-history rate (its Wilson interval as a whisker) against its
    median cost relative to history's, on a log scale from 1/16 to 16 times. The upper
    left quadrant (cheaper than history, as good on at least half the requests) reads
    "as good, for less"."""
    drawn = []
    not_drawn = []
    for point in points:
        label = labels.get(point["model"], point["model"])
        if point.get("x") is None or point.get("rate") is None:
            not_drawn.append(label)
            continue
        cx, cy = _chart_x(point["x"]), _chart_y(point["rate"])
        # A label near the right edge goes on the point's left.
        on_left = cx > CHART_RIGHT - 150
        rate = interval_text(point["rate"], point.get("rate_low"), point.get("rate_high"))
        text = (
            f"{label}: as good as history {rate}, cost {ratio_text(point.get('cost_ratio'))} "
            "history's"
        )
        drawn.append(
            ChartPoint(
                label=Truncator(label).chars(CHART_LABEL_CHARS),
                text=text,
                baseline=point["model"] in campaign_results.BASELINES,
                cx=cx,
                cy=cy,
                y_low=_chart_y(point.get("rate_low") or 0.0),
                y_high=_chart_y(point.get("rate_high") or 0.0),
                label_x=cx - 9 if on_left else cx + 9,
                label_anchor="end" if on_left else "start",
            )
        )
    count = len(CHART_RATIOS) - 1
    return Chart(
        width=CHART_WIDTH,
        height=CHART_HEIGHT,
        left=CHART_LEFT,
        right=CHART_RIGHT,
        top=CHART_TOP,
        bottom=CHART_BOTTOM,
        x_ticks=[(_chart_x(index / count), text) for index, (_, text) in enumerate(CHART_RATIOS)],
        y_ticks=[(_chart_y(rate / 100), f"{rate}%") for rate in CHART_RATES],
        one_x=_chart_x(_ratio_position(1.0)),
        half_y=_chart_y(0.5),
        points=drawn,
        not_drawn=not_drawn,
    )


def _ratio_position(ratio: float) -> float:
    low, high = math.log(CHART_RATIOS[0][0]), math.log(CHART_RATIOS[-1][0])
    return (math.log(ratio) - low) / (high - low)


# --- approve, cancel, prepare again -----------------------------------------------------------


@login_required
@require_POST
def campaign_approve(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)
    token = CAMPAIGN_TOKEN.read(request, campaign.pk)
    if token is None:
        if campaign.approved_at is not None:
            messages.info(request, f"Campaign {campaign.pk} was already approved.")
            return redirect(campaign)
        error = PageError(
            "This campaign's prepare token is not in this browser (it was prepared through "
            "the API, the command or another browser, or the token expired). Prepare it "
            "again to approve it here.",
            code="token_not_in_browser",
        )
        return _campaign_page(request, campaign, error=error, status=403)
    try:
        approval = campaigns.approve_campaign(
            campaign_id=campaign.pk,
            user=request.user,
            # The button sends approved=true: the explicit approval the service requires.
            approved=request.POST.get("approved") == "true",
            prepare_token=token,
        )
    except campaigns.CampaignApprovalError as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=exc.code != "not_found")
        return _campaign_page(request, campaign, error=error, status=http_status(exc))
    if approval.idempotent:
        messages.info(request, f"Campaign {campaign.pk} was already approved.")
    else:
        requests = len(approval.batches)
        runs = approval.campaign.estimate.get("runs") or 0
        messages.success(
            request,
            f"Approved: {requests} request{pluralize(requests)}, {runs} run{pluralize(runs)} "
            "queued.",
        )
    response = redirect(approval.campaign)
    CAMPAIGN_TOKEN.forget(response, campaign.pk)
    return response


@login_required
@require_POST
def campaign_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)
    if campaign.status not in (CampaignStatus.RUNNING, CampaignStatus.READY_FOR_APPROVAL):
        messages.info(
            request, f"Nothing to cancel: the campaign is {campaign.get_status_display().lower()}."
        )
        return redirect(campaign)
    campaign = campaigns.cancel_campaign(campaign=campaign)
    if Run.objects.filter(batch__campaign=campaign, status__in=ACTIVE_RUN_STATUSES).exists():
        messages.success(
            request,
            "Campaign cancelled: nothing more starts; running runs stop within a few seconds.",
        )
    else:
        messages.success(request, "Campaign cancelled: nothing more starts.")
    return redirect(campaign)


@login_required
@require_POST
def campaign_prepare_again(request: HttpRequest, pk: int) -> HttpResponse:
    """Prepare the same configuration again (a new campaign, a new token): what an expired
    or refused approval needs. Only the owner's own history is scanned."""
    campaign = get_object_or_404(Campaign.objects.filter(owner=request.user), pk=pk)
    try:
        prepared = campaigns.prepare_campaign(
            owner=request.user, raw_configuration=campaign.configuration
        )
    except campaigns.CampaignInputError as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=False)
        return _campaign_page(request, campaign, error=error, status=http_status(exc))
    return _after_prepare(request, prepared)


# --- exports ---------------------------------------------------------------------------------


def _approved_campaign(request: HttpRequest, pk: int) -> Campaign:
    campaign = get_object_or_404(Campaign.objects.visible_to(request.user), pk=pk)
    if campaign.approved_at is None:
        raise Http404("This campaign was not approved: it has no results.")
    return campaign_results.refresh_if_stale(campaign)


@login_required
def campaign_results_csv(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = _approved_campaign(request, pk)
    response = HttpResponse(
        campaign_results.results_csv(campaign.results or {}),
        content_type="text/csv; charset=utf-8",
    )
    response["Content-Disposition"] = f'attachment; filename="campaign-{campaign.pk}-results.csv"'
    return response


@login_required
def campaign_results_json(request: HttpRequest, pk: int) -> HttpResponse:
    campaign = _approved_campaign(request, pk)
    # The signature is the results' own bookkeeping (what they were computed from).
    results = {key: value for key, value in (campaign.results or {}).items() if key != "signature"}
    response = HttpResponse(
        json.dumps({"campaign": campaign.pk, "status": campaign.status, **results}, indent=2),
        content_type="application/json",
    )
    response["Content-Disposition"] = f'attachment; filename="campaign-{campaign.pk}-results.json"'
    return response


# --- the list --------------------------------------------------------------------------------


@login_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    by_status = {
        f"count_{value}": Count("batches__runs", filter=Q(batches__runs__status=value))
        for value in RunStatus.values
    }
    found = (
        Campaign.objects.visible_to(request.user)
        .select_related("owner")
        # The lists of the scan and the results can be large: the list reads none of them.
        .defer("results", "estimate", "test_commands", "blockers", "warnings")
        .annotate(
            run_count=Count("batches__runs"),
            estimate_total=KT("estimate__total_cost_usd"),
            **by_status,
        )
        .order_by("-created_at", "-id")
    )
    page = Paginator(found, CAMPAIGNS_PER_PAGE).get_page(request.GET.get("page"))
    labels = model_labels()
    rows = []
    for campaign in page.object_list:
        state, state_label = _state(campaign)
        counts = campaign.counts or {}
        rows.append(
            {
                "campaign": campaign,
                "state": state,
                "state_label": state_label,
                "models": [
                    (model, labels.get(model, model))
                    for model in campaign.configuration.get("models") or []
                ],
                "selected": counts.get("selected", 0),
                "scanned": counts.get("scanned", 0),
                "run_counts": [
                    StatusCount(value, label, getattr(campaign, f"count_{value}"))
                    for value, label in RunStatus.choices
                    if getattr(campaign, f"count_{value}")
                ],
            }
        )
    return render(
        request,
        "replays/campaign_list.html",
        {
            "page": page,
            "rows": rows,
            "page_range": page.paginator.get_elided_page_range(
                page.number, on_each_side=2, on_ends=1
            ),
            "show_owner": request.user.is_staff,
        },
    )
