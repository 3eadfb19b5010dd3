"""Server-rendered pages: threads, the transcript upload, and replaying (plan, batch, run).

Thin: reads go straight to the models; writes go through the services the command
and the API use (importing, planning, approval, dispatch).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import Truncator
from django.views.decorators.http import require_http_methods, require_POST

from replays import agents, approval, dispatch, importing, planning
from replays.evaluation import evaluators
from replays.forms import AnswerForm, ReplayForm, TranscriptUploadForm, readable_size
from replays.models import (
    ACTIVE_RUN_STATUSES,
    TOKEN_FIELDS,
    Batch,
    LaunchError,
    Plan,
    PlanStatus,
    Run,
    RunQuerySet,
    RunStatus,
    Thread,
    Turn,
)

THREADS_PER_PAGE = 25
MAX_QUERY_LENGTH = 200
# Long requests (a pasted log, a spec) show their start; the rest opens on demand.
REQUEST_PREVIEW_LINES = 20
REQUEST_PREVIEW_CHARS = 4000
MAX_PROBLEMS_SHOWN = 10


@dataclass
class ListTotals:
    threads: int
    known_cost: Decimal | None
    unknown_cost_threads: int
    tokens: int


def list_totals(threads: QuerySet[Thread]) -> ListTotals:
    sums = threads.aggregate(
        count=Count("pk"),
        cost=Sum("cost_usd"),
        unknown=Count("pk", filter=Q(cost_usd__isnull=True)),
        **{name: Sum(name) for name in TOKEN_FIELDS},
    )
    return ListTotals(
        threads=sums["count"],
        # Sum skips nulls; with no known price at all the total stays unknown, never $0.
        known_cost=sums["cost"] if sums["count"] > sums["unknown"] else None,
        unknown_cost_threads=sums["unknown"],
        tokens=sum(sums[name] or 0 for name in TOKEN_FIELDS),
    )


@login_required
def thread_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:MAX_QUERY_LENGTH]
    threads = Thread.objects.search(query)
    page = Paginator(threads, THREADS_PER_PAGE).get_page(request.GET.get("page"))
    return render(
        request,
        "replays/thread_list.html",
        {
            "query": query,
            "page": page,
            "threads": page.object_list,
            "page_range": page.paginator.get_elided_page_range(
                page.number, on_each_side=2, on_ends=1
            ),
            "totals": list_totals(threads),
            # No threads at all gets the getting-started text; no matches gets "nothing found".
            "has_threads": bool(page.object_list) or Thread.objects.exists(),
        },
    )


@dataclass
class TurnView:
    turn: Turn
    head: str
    rest: str

    @property
    def rest_label(self) -> str:
        if self.head.endswith("\n"):
            lines = self.rest.count("\n") + (0 if self.rest.endswith("\n") else 1)
            return f"Show {lines} more line{pluralize(lines)}"
        return f"Show the rest ({len(self.rest):,} more characters)"


def split_request(text: str) -> tuple[str, str]:
    """The first lines of a request (at most REQUEST_PREVIEW_* of them) and the rest."""
    cut = 0
    for _ in range(REQUEST_PREVIEW_LINES):
        newline = text.find("\n", cut)
        if newline == -1:
            cut = len(text)
            break
        cut = newline + 1
    cut = min(cut, REQUEST_PREVIEW_CHARS)
    # Keep a few trailing lines inline rather than hiding them behind a toggle.
    if text.count("\n", cut) < 3 and len(text) - cut < 400:
        cut = len(text)
    return text[:cut], text[cut:]


def _thread_page(
    request: HttpRequest, thread: Thread, form: ReplayForm, *, status: int = 200
) -> HttpResponse:
    turns = []
    for turn in thread.turns.order_by("index"):
        head, rest = split_request(turn.request)
        turns.append(TurnView(turn=turn, head=head, rest=rest))
    context = {"thread": thread, "turns": turns, "form": form}
    return render(request, "replays/thread_detail.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def thread_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The thread, its turns, and the form that prepares a replay of them."""
    thread = get_object_or_404(Thread, pk=pk)
    choices = {
        "model_infos": agents.discover_models(),
        "evaluator_infos": evaluators.discover_evaluators(),
    }
    if request.method != "POST":
        return _thread_page(request, thread, ReplayForm(thread=thread, **choices))
    form = ReplayForm(request.POST, thread=thread, **choices)
    if form.is_valid():
        try:
            prepared = planning.prepare_plan(
                owner=request.user, raw_configuration=form.configuration()
            )
        except (planning.PlanInputError, planning.PrepareConflict) as exc:
            form.add_error(None, exc.message)
        else:
            return _after_prepare(request, prepared)
    return _thread_page(request, thread, form, status=400)


def _import_message(result: importing.ImportResult) -> str:
    title = Truncator(str(result.thread)).chars(80)
    turns = f"{result.turns} turn{pluralize(result.turns)}"
    if result.outcome == "updated":
        return (
            f"Imported “{title}”: {turns} (the transcript had changed, so the thread was updated)."
        )
    return f"Imported “{title}”: {turns}."


def _problems_message(result: importing.ImportResult) -> str:
    shown = [f"line {p.line_number}: {p.message}" for p in result.problems[:MAX_PROBLEMS_SHOWN]]
    more = len(result.problems) - len(shown)
    lines = len(result.problems)
    text = f"Skipped {lines} line{pluralize(lines)} that could not be read: " + "; ".join(shown)
    return text + (f"; and {more} more." if more else ".")


def _upload_page(
    request: HttpRequest, form: TranscriptUploadForm, *, status: int = 200
) -> HttpResponse:
    context = {"form": form, "max_size": readable_size(importing.max_transcript_bytes())}
    return render(request, "replays/thread_upload.html", context, status=status)


@login_required
@require_http_methods(["GET", "POST"])
def thread_upload(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _upload_page(request, TranscriptUploadForm())
    form = TranscriptUploadForm(request.POST, request.FILES)
    if form.is_valid():
        upload = form.cleaned_data["transcript"]
        result = importing.import_uploaded_transcript(
            upload=upload, filename=upload.name, user=request.user
        )
        if result.outcome == "failed" or result.thread is None:
            form.add_error("transcript", result.error or "The transcript could not be imported.")
        elif result.outcome == "unchanged":
            title = Truncator(str(result.thread)).chars(80)
            messages.info(request, f"“{title}” was already imported, unchanged.")
            return redirect(result.thread)
        else:
            messages.success(request, _import_message(result))
            if result.problems:
                messages.warning(request, _problems_message(result))
            return redirect(result.thread)
    return _upload_page(request, form, status=400)


# --- Replays: who sees what ----------------------------------------------------------------

BATCHES_PER_PAGE = 25
# The diff on the run page is for reading; the raw diff link has all of it.
MAX_DIFF_LINES = 5000
# The page flow hands the prepare token to the browser once, in a signed cookie scoped to
# the plan's pages: the server keeps only its hash, as with the API (DESIGN.md).
TOKEN_COOKIE_SALT = "replays.prepare-token"


def _token_cookie(plan_id: int) -> str:
    return f"prepare_token_{plan_id}"


def _plan_path(plan_id: int) -> str:
    return reverse("replays:plan-detail", args=[plan_id])


def _token_from_cookie(request: HttpRequest, plan_id: int) -> str | None:
    return request.get_signed_cookie(
        _token_cookie(plan_id),
        default=None,
        salt=TOKEN_COOKIE_SALT,
        max_age=settings.REPLAYS_PREPARE_TOKEN_SECONDS,
    )


def _model_labels() -> dict[str, str]:
    return {info.id: info.label for info in agents.discover_models()}


def _safe_next(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


# --- Plans ---------------------------------------------------------------------------------


def _after_prepare(request: HttpRequest, prepared: planning.PreparedPlan) -> HttpResponse:
    plan = prepared.plan
    response = redirect("replays:plan-detail", pk=plan.pk)
    if prepared.prepare_token is not None:
        response.set_signed_cookie(
            _token_cookie(plan.pk),
            prepared.prepare_token,
            salt=TOKEN_COOKIE_SALT,
            max_age=settings.REPLAYS_PREPARE_TOKEN_SECONDS,
            path=_plan_path(plan.pk),
            secure=request.is_secure(),
            httponly=True,
            samesite="Strict",
        )
    return response


@dataclass
class PageError:
    """An approval refusal as the plan page shows it."""

    message: str
    code: str
    # Most refusals are cured by preparing the same configuration again.
    can_prepare_again: bool = True


@dataclass
class ThreadPreparationView:
    item: dict[str, Any]
    preparation: dict[str, Any]
    thread: Thread | None
    first_turn: int | None = None
    last_turn: int | None = None
    questions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.thread is not None:
            return str(self.thread)
        return self.item.get("thread_title") or f"Thread {self.item['thread_id']}"


ANSWER_LABELS = {
    "repository": "Repository path",
    "baseline_commit": "Baseline commit",
    "ending_commit": "Ending commit",
}


def _question_view(question: dict[str, Any]) -> dict[str, Any]:
    """A stored question with its field named for people and its commit dates parsed."""
    choices = []
    for choice in question.get("choices", []):
        try:
            committed_at = datetime.fromisoformat(choice.get("committed_at", ""))
        except (TypeError, ValueError):
            committed_at = None
        choices.append({**choice, "committed_at": committed_at})
    field_name = question.get("field", "")
    return {
        **question,
        "choices": choices,
        "field_label": ANSWER_LABELS.get(field_name, field_name),
        "answerable": field_name in ANSWER_LABELS,
    }


def _preparation_views(plan: Plan) -> list[ThreadPreparationView]:
    items = plan.configuration.get("configurations", [])
    threads = Thread.objects.in_bulk([item["thread_id"] for item in items])
    preparations = {prep.get("thread_id"): prep for prep in plan.preparations}
    uuids = {
        prep.get(key)
        for prep in plan.preparations
        for key in ("start_message_uuid", "end_message_uuid")
        if prep.get(key)
    }
    turn_numbers = {
        (thread_id, uuid): index + 1
        for thread_id, uuid, index in Turn.objects.filter(
            thread__in=list(threads), message_uuid__in=uuids
        ).values_list("thread_id", "message_uuid", "index")
    }
    views = []
    for item in items:
        thread_id = item["thread_id"]
        prep = preparations.get(thread_id, {})
        views.append(
            ThreadPreparationView(
                item=item,
                preparation=prep,
                thread=threads.get(thread_id),
                first_turn=turn_numbers.get((thread_id, prep.get("start_message_uuid"))),
                last_turn=turn_numbers.get((thread_id, prep.get("end_message_uuid"))),
                questions=[
                    _question_view(q) for q in plan.questions if q.get("thread_id") == thread_id
                ],
            )
        )
    return views


def _plan_state(plan: Plan, batch: Batch | None) -> tuple[str, str]:
    """(badge class, label): approved and expired say more than the prepared status."""
    if batch is not None:
        return "approved", "Approved"
    if plan.is_expired:
        return "expired", "Expired"
    return plan.status, plan.get_status_display()


def _plan_page(
    request: HttpRequest,
    plan: Plan,
    *,
    error: PageError | None = None,
    answer_form: AnswerForm | None = None,
    status: int = 200,
) -> HttpResponse:
    batch = plan.batch
    state, state_label = _plan_state(plan, batch)
    labels = _model_labels()
    configuration = plan.configuration
    context = {
        "plan": plan,
        "batch": batch,
        "state": state,
        "state_label": state_label,
        "threads": _preparation_views(plan),
        "models": [(model, labels.get(model, model)) for model in configuration["models"]],
        "timeout_seconds": configuration.get("timeout_seconds"),
        "verify_command": configuration.get("verify_command"),
        "ready": plan.status == PlanStatus.READY_FOR_APPROVAL,
        "expired": plan.is_expired,
        "has_token": _token_from_cookie(request, plan.pk) is not None,
        "error": error,
        "answer_form": answer_form,
    }
    return render(request, "replays/plan_detail.html", context, status=status)


@login_required
def plan_detail(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    return _plan_page(request, plan)


@login_required
@require_POST
def plan_prepare_again(request: HttpRequest, pk: int) -> HttpResponse:
    """Prepare the plan's configuration again, with a question's answer filled in if given."""
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    configuration = copy.deepcopy(plan.configuration)
    if "field" in request.POST:
        form = AnswerForm(request.POST)
        if not form.is_valid():
            return _plan_page(request, plan, answer_form=form, status=400)
        answer = form.cleaned_data
        item = next(
            (c for c in configuration["configurations"] if c["thread_id"] == answer["thread_id"]),
            None,
        )
        if item is None:
            form.add_error("thread_id", "That thread is not part of this plan.")
            return _plan_page(request, plan, answer_form=form, status=400)
        item[answer["field"]] = answer["answer"]
    try:
        prepared = planning.prepare_plan(owner=request.user, raw_configuration=configuration)
    except (planning.PlanInputError, planning.PrepareConflict) as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=False)
        return _plan_page(request, plan, error=error, status=exc.status)
    return _after_prepare(request, prepared)


@login_required
@require_POST
def plan_approve(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    token = _token_from_cookie(request, plan.pk)
    if token is None:
        batch = plan.batch
        if batch is not None:
            messages.info(request, f"Plan {plan.pk} was already approved: this is its batch.")
            return redirect(batch)
        error = PageError(
            "This plan's prepare token is not in this browser (the plan was prepared through "
            "the API or in another browser, or the token expired). Prepare it again to "
            "approve it here.",
            code="token_not_in_browser",
        )
        return _plan_page(request, plan, error=error, status=403)
    try:
        result = approval.approve_plan(
            plan_id=plan.pk,
            user=request.user,
            # The button sends approved=true: the explicit approval the service requires.
            approved=request.POST.get("approved") == "true",
            prepare_token=token,
            run_config=plan.configuration,
        )
    except approval.ApprovalError as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=exc.code != "not_found")
        return _plan_page(request, plan, error=error, status=exc.status)
    if result.idempotent:
        messages.info(request, f"Plan {plan.pk} was already approved: this is its batch.")
    else:
        runs = len(result.runs)
        messages.success(request, f"Approved: {runs} run{pluralize(runs)} queued.")
    response = redirect(result.batch)
    # Single use: the browser has no more need for the token.
    response.delete_cookie(_token_cookie(plan.pk), path=_plan_path(plan.pk), samesite="Strict")
    return response


# --- Batches -------------------------------------------------------------------------------


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


def _run_cards(runs: list[Run], labels: dict[str, str]) -> list[RunCard]:
    now = timezone.now()
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
class ThreadGroup:
    thread: Thread
    cards: list[RunCard]


@dataclass
class StatusCount:
    status: str
    label: str
    count: int


def _status_counts(runs: list[Run]) -> list[StatusCount]:
    counts = [
        StatusCount(value, label, sum(1 for run in runs if run.status == value))
        for value, label in RunStatus.choices
    ]
    return [item for item in counts if item.count]


def batch_state(*, active: int, unreported: int) -> tuple[str, str]:
    """(badge class, label) of a batch from its counts of active and unreported runs."""
    if active:
        return "running", "In progress"
    if unreported:
        return "finished", "Finished · reviews pending"
    return "results_ready", "Results ready"


@login_required
def batch_list(request: HttpRequest) -> HttpResponse:
    by_status = {
        f"count_{value}": Count("runs", filter=Q(runs__status=value)) for value in RunStatus.values
    }
    batches = (
        Batch.objects.visible_to(request.user)
        .select_related("owner")
        .annotate(
            run_count=Count("runs"),
            known_cost=Sum("runs__cost_usd"),
            unknown_cost=Count(
                "runs", filter=Q(runs__status=RunStatus.COMPLETED, runs__cost_usd__isnull=True)
            ),
            **by_status,
        )
        .order_by("-approved_at", "-id")
    )
    page = Paginator(batches, BATCHES_PER_PAGE).get_page(request.GET.get("page"))
    page_ids = [batch.pk for batch in page.object_list]
    unreported = dict(
        Run.objects.filter(batch__in=page_ids, status=RunStatus.COMPLETED)
        .filter(RunQuerySet.waiting_for_results())
        .values("batch")
        .annotate(count=Count("id"))
        .values_list("batch", "count")
    )
    titles: dict[int, list[Thread]] = {}
    runs = (
        Run.objects.filter(batch__in=[batch.pk for batch in page.object_list])
        .select_related("thread")
        .order_by("batch_id", "thread_id")
    )
    for run in runs:
        threads = titles.setdefault(run.batch_id, [])
        if run.thread not in threads:
            threads.append(run.thread)
    labels = _model_labels()
    rows = []
    for batch in page.object_list:
        active = sum(getattr(batch, f"count_{value}") for value in ACTIVE_RUN_STATUSES)
        state, state_label = batch_state(active=active, unreported=unreported.get(batch.pk, 0))
        rows.append(
            {
                "batch": batch,
                "threads": titles.get(batch.pk, []),
                "models": [(model, labels.get(model, model)) for model in batch.models_list],
                "counts": [
                    StatusCount(value, label, getattr(batch, f"count_{value}"))
                    for value, label in RunStatus.choices
                    if getattr(batch, f"count_{value}")
                ],
                "state": state,
                "state_label": state_label,
            }
        )
    return render(
        request,
        "replays/batch_list.html",
        {
            "page": page,
            "rows": rows,
            "page_range": page.paginator.get_elided_page_range(
                page.number, on_each_side=2, on_ends=1
            ),
            "show_owner": request.user.is_staff,
        },
    )


@login_required
def batch_detail(request: HttpRequest, pk: int) -> HttpResponse:
    batch = get_object_or_404(Batch.objects.visible_to(request.user).select_related("plan"), pk=pk)
    # A batch is shown whole, however old its runs are: no window here.
    runs = list(
        batch.runs.select_related("thread")
        .with_current_report()
        .prefetch_related(Prefetch("launch_errors", queryset=LaunchError.objects.order_by("id")))
    )
    model_order = {model: index for index, model in enumerate(batch.models_list)}
    runs.sort(key=lambda run: (model_order.get(run.model, len(model_order)), run.pk))
    labels = _model_labels()
    cards = _run_cards(runs, labels)
    groups: dict[int, ThreadGroup] = {}
    for card in cards:
        thread = card.run.thread
        groups.setdefault(thread.pk, ThreadGroup(thread=thread, cards=[])).cards.append(card)
    active = sum(1 for run in runs if run.status in ACTIVE_RUN_STATUSES)
    unreported = sum(
        1 for run in runs if run.status == RunStatus.COMPLETED and run.current_report is None
    )
    state, state_label = batch_state(active=active, unreported=unreported)
    known = [run.cost_usd for run in runs if run.cost_usd is not None]
    finished_at = max((run.finished_at for run in runs if run.finished_at), default=None)
    return render(
        request,
        "replays/batch_detail.html",
        {
            "batch": batch,
            "groups": list(groups.values()),
            "models": [(model, labels.get(model, model)) for model in batch.models_list],
            "counts": _status_counts(runs),
            "run_count": len(runs),
            "active": active,
            "state": state,
            "state_label": state_label,
            "finished_at": None if active else finished_at,
            "known_cost": sum(known, Decimal(0)) if known else None,
            "unknown_cost_runs": sum(1 for card in cards if card.cost_is_unknown),
            "tokens": sum(run.total_tokens for run in runs),
            "refresh_seconds": 3 if active else None,
        },
    )


@login_required
@require_POST
def batch_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    batch = get_object_or_404(Batch.objects.visible_to(request.user), pk=pk)
    active_before = batch.runs.filter(status__in=ACTIVE_RUN_STATUSES).count()
    dispatch.cancel_batch(batch=batch)
    if not active_before:
        messages.info(request, "Nothing to cancel: every run of this batch had already ended.")
    else:
        running = batch.runs.filter(status=RunStatus.RUNNING).count()
        cancelled = active_before - running
        text = f"Cancelled {cancelled} run{pluralize(cancelled)}."
        if running:
            text += f" {running} running run{pluralize(running)} will stop within a few seconds."
        messages.success(request, text)
    return redirect(batch)


# --- Runs ----------------------------------------------------------------------------------


@dataclass
class DiffLine:
    kind: str  # file, meta, hunk, add, del, context, note
    text: str


def diff_lines(diff: str) -> list[DiffLine]:
    """A unified git diff cut into lines classed for colouring (the template escapes the text).

    Inside a hunk the first character decides; a removed line that reads "--- x" is
    still a removal, so headers are only recognised between `diff --git` and `@@`.
    """
    lines: list[DiffLine] = []
    in_hunk = False
    for text in diff.splitlines():
        if text.startswith("diff --git "):
            in_hunk = False
            kind = "file"
        elif text.startswith("@@"):
            in_hunk = True
            kind = "hunk"
        elif not in_hunk:
            kind = "meta"
        elif text.startswith("+"):
            kind = "add"
        elif text.startswith("-"):
            kind = "del"
        elif text.startswith("\\"):
            kind = "note"
        else:
            kind = "context"
        lines.append(DiffLine(kind, text))
    return lines


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(
        Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
    )
    [card] = _run_cards([run], _model_labels())
    lines = diff_lines(run.diff)
    configuration = dict(run.configuration)
    request_text = configuration.pop("request", None)
    return render(
        request,
        "replays/run_detail.html",
        {
            "run": run,
            "card": card,
            "diff_lines": lines[:MAX_DIFF_LINES],
            "diff_line_count": len(lines),
            "diff_truncated": len(lines) > MAX_DIFF_LINES,
            "additions": sum(1 for line in lines if line.kind == "add"),
            "deletions": sum(1 for line in lines if line.kind == "del"),
            "configuration_json": json.dumps(configuration, indent=2, ensure_ascii=False),
            "request_text": request_text,
            "report_json": (
                json.dumps(report.data, indent=2, ensure_ascii=False)
                if (report := run.current_report) is not None
                else None
            ),
            "raw_diff_url": reverse("api-run-diff", args=[run.pk]),
            "refresh_seconds": 3 if card.is_active else None,
        },
    )


@login_required
@require_POST
def run_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(
        Run.objects.visible_to(request.user).select_related("thread", "batch"), pk=pk
    )
    before = run.status
    run = dispatch.cancel_run(run=run)
    name = f"Run {run.pk} ({run.model})"
    if run.status == RunStatus.CANCELLED and before != RunStatus.CANCELLED:
        messages.success(request, f"{name} cancelled.")
    elif run.status == RunStatus.RUNNING:
        messages.info(request, f"Cancel requested: {name} stops within a few seconds.")
    else:
        messages.info(request, f"{name} had already ended ({run.get_status_display().lower()}).")
    return redirect(_safe_next(request, run.batch.get_absolute_url()))
