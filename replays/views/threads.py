"""The threads: the list, one thread with its replay form, the transcript upload."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.utils.text import Truncator
from django.views.decorators.http import require_http_methods

from replays import agents, importing, planning
from replays.evaluation import evaluators
from replays.forms import ReplayForm, TranscriptUploadForm, readable_size
from replays.models import (
    TOKEN_FIELDS,
    Thread,
    Turn,
)
from replays.views.replays import after_prepare

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
            return after_prepare(request, prepared)
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
