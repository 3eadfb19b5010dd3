"""Results: batches, their runs, and each run's page."""

from __future__ import annotations

import json
from dataclasses import dataclass
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Prefetch, Q, Sum
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from replays import dispatch, runlogs
from replays.models import (
    ACTIVE_RUN_STATUSES,
    Batch,
    LaunchError,
    Run,
    RunStatus,
    Thread,
)
from replays.views.cards import (
    ResultCounts,
    RunCard,
    batch_results,
    batch_state,
    result_counts,
    run_cards,
)
from replays.views.common import model_labels, safe_next

BATCHES_PER_PAGE = 25
# The diff on the run page is for reading; the raw diff link has all of it.
MAX_DIFF_LINES = 5000
# Run columns the batch page's cards never read (deferred there; reading one would ask a
# query per run, which tests/test_query_counts.py would catch).
CARD_UNUSED_RUN_FIELDS = ("configuration", "diff", "log_tail", "turns", "tree_tests")
# How often a page with active runs asks for its live part again.
POLL_SECONDS = 2


# --- Batches -------------------------------------------------------------------------------


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
    counts = result_counts([batch.pk for batch in page.object_list])
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
    labels = model_labels()
    rows = []
    for batch in page.object_list:
        active = sum(getattr(batch, f"count_{value}") for value in ACTIVE_RUN_STATUSES)
        state, state_label = batch_state(active=active, counts=counts.get(batch.pk, ResultCounts()))
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
    # A batch is shown whole, however old its runs are: no window here. The cards never
    # show a run's diff, log, turns or configuration, which can be megabytes per run.
    runs = list(
        batch.runs.select_related("thread")
        .defer(*CARD_UNUSED_RUN_FIELDS)
        .with_current_report()
        .prefetch_related(Prefetch("launch_errors", queryset=LaunchError.objects.order_by("id")))
    )
    model_order = {model: index for index, model in enumerate(batch.models_list)}
    runs.sort(key=lambda run: (model_order.get(run.model, len(model_order)), run.pk))
    labels = model_labels()
    cards = run_cards(runs, labels, timezone.now())
    groups: dict[int, ThreadGroup] = {}
    for card in cards:
        thread = card.run.thread
        groups.setdefault(thread.pk, ThreadGroup(thread=thread, cards=[])).cards.append(card)
    active = sum(1 for run in runs if run.status in ACTIVE_RUN_STATUSES)
    state, state_label = batch_state(
        active=active, counts=result_counts([batch.pk]).get(batch.pk, ResultCounts())
    )
    known = [run.cost_usd for run in runs if run.cost_usd is not None]
    finished_at = max((run.finished_at for run in runs if run.finished_at), default=None)
    # While runs are active the page polls for this part (htmx) and swaps it in place; the
    # last answer, with nothing active, no longer asks to be polled.
    template = "replays/includes/batch_live.html" if request.htmx else "replays/batch_detail.html"
    return render(
        request,
        template,
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
            "results": batch_results(cards),
            "poll_seconds": POLL_SECONDS if active else None,
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
def run_log(request: HttpRequest, pk: int) -> HttpResponse:
    """The run's whole agent log as plain text (from the database: any machine shows it)."""
    run = get_object_or_404(Run.objects.visible_to(request.user), pk=pk)
    text = runlogs.log_text(run)
    if text is None:
        raise Http404("This run has no log.")
    response = HttpResponse(text, content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="run-{run.pk}.log"'
    return response


@login_required
def run_detail(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(
        Run.objects.visible_to(request.user)
        .select_related("thread", "batch")
        .with_current_report()
        .prefetch_related("launch_errors"),
        pk=pk,
    )
    [card] = run_cards([run], model_labels(), timezone.now())
    lines = diff_lines(run.diff)
    configuration = run.spec.as_json()
    request_text = configuration.pop("request", None)
    template = "replays/includes/run_live.html" if request.htmx else "replays/run_detail.html"
    return render(
        request,
        template,
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
                if (report := card.report) is not None
                else None
            ),
            "raw_diff_url": reverse("api-run-diff", args=[run.pk]),
            "poll_seconds": POLL_SECONDS if card.is_active else None,
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
    return redirect(safe_next(request, run.batch.get_absolute_url()))
