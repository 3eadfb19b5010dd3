"""The threads: the list, one thread with its replay form, the transcript upload."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.db.models import Count, Q, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.utils.text import Truncator
from django.views.decorators.http import require_http_methods

from replays import agents, importing, planning, pricing
from replays.evaluation import evaluators
from replays.formatting import short_path
from replays.forms import ReplayForm, TranscriptUploadForm, readable_size
from replays.middleware import RefusedBody, page_for_refused_body
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


def folder_labels(paths: list[str]) -> dict[str, str]:
    """The end of each folder, as much of it as tells the folders apart: `…/textstats`,
    or `…/a/app` and `…/b/app` when two end alike (the full path goes in a tooltip). Cutting
    the end off instead shows the same prefix on every row."""
    parts = {}
    for path in set(filter(None, paths)):
        shown = short_path(path)
        separator = "\\" if "\\" in shown and "/" not in shown else "/"
        parts[path] = (separator, shown.rstrip(separator).split(separator))
    labels = {}
    for path, (separator, names) in parts.items():
        others = [other for key, (_, other) in parts.items() if key != path]
        count = 1
        while count < len(names) and any(other[-count:] == names[-count:] for other in others):
            count += 1
        # Hiding one name (or just the root) saves nothing: show the whole path then.
        shown = separator.join(names)
        tail = separator.join(names[-count:])
        labels[path] = (shown or separator) if count >= len(names) - 1 else f"…{separator}{tail}"
    return labels


@login_required
def thread_list(request: HttpRequest) -> HttpResponse:
    query = request.GET.get("q", "").strip()[:MAX_QUERY_LENGTH]
    threads = Thread.objects.visible_to(request.user).search(query)
    page = Paginator(threads, THREADS_PER_PAGE).get_page(request.GET.get("page"))
    rows = list(page.object_list)
    labels = folder_labels([thread.cwd for thread in rows])
    for thread in rows:
        thread.folder_label = labels.get(thread.cwd, "")
    return render(
        request,
        "replays/thread_list.html",
        {
            "query": query,
            "page": page,
            "threads": rows,
            "page_range": page.paginator.get_elided_page_range(
                page.number, on_each_side=2, on_ends=1
            ),
            "totals": list_totals(threads),
            # No threads at all gets the getting-started text; no matches gets "nothing found".
            "has_threads": bool(rows) or Thread.objects.visible_to(request.user).exists(),
        },
    )


@dataclass
class PricedModel:
    """A model as the thread page lists it, with the price entry that priced it."""

    model: str
    entry: str | None  # None: no entry matched (unknown price)
    known: bool  # whether `entry` says anything (the model used tokens)

    @property
    def note(self) -> str:
        """Shown beside the model when the entry is not the model's own id."""
        if not self.known or self.entry == self.model:
            return ""
        if self.entry is None:
            return "unknown price"
        if self.entry == pricing.FREE_ENTRY:
            return "free variant: $0"
        if self.entry == pricing.RECORDED_ENTRY:
            return "cost as the agent recorded it"
        return f"priced as {self.entry}"

    @property
    def title(self) -> str:
        if not self.known:
            return "No tokens used"
        if self.entry is None:
            return "No entry of the price table matches this model: its cost is unknown"
        if self.entry == pricing.RECORDED_ENTRY:
            return "The agent recorded this model's cost itself (OpenCode, pi): it is shown as recorded"
        return f"Price table entry: {self.entry}"


def priced_models(models: list[str], priced_as: dict[str, str | None]) -> list[PricedModel]:
    return [PricedModel(model, priced_as.get(model), model in priced_as) for model in models]


@dataclass
class TurnView:
    turn: Turn
    head: str
    rest: str

    @property
    def models(self) -> list[PricedModel]:
        return priced_models(self.turn.models_used, self.turn.priced_as)

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
    request: HttpRequest,
    thread: Thread,
    form: ReplayForm,
    *,
    status: int = 200,
    body_error: str = "",
) -> HttpResponse:
    turns = []
    for turn in thread.turns.order_by("index"):
        head, rest = split_request(turn.request)
        turns.append(TurnView(turn=turn, head=head, rest=rest))
    pre_turn_tokens = sum(sum(usage.values()) for usage in thread.pre_turn_usage_by_model.values())
    context = {
        "thread": thread,
        "turns": turns,
        "models": priced_models(thread.models_used, thread.priced_as),
        "pre_turn_tokens": pre_turn_tokens,
        "form": form,
        "body_error": body_error,
    }
    return render(request, "replays/thread_detail.html", context, status=status)


def _replay_form(thread: Thread, user: Any, data: Any = None) -> ReplayForm:
    return ReplayForm(
        data,
        thread=thread,
        model_infos=agents.discover_models(),
        evaluator_infos=evaluators.discover_evaluators(),
        known_clones=planning.repository_suggestions(owner=user, thread=thread),
    )


@login_required
def _thread_page_refused(request: HttpRequest, refused: RefusedBody, pk: int) -> HttpResponse:
    """A replay form post too large to read: the same page, with a fresh form saying why."""
    thread = get_object_or_404(Thread.objects.visible_to(request.user), pk=pk)
    message = (
        f"The form sent {readable_size(refused.size)}, more than the {readable_size(refused.limit)} "
        "a form may send, so none of it was read and the fields below are back to their "
        "defaults. Fill them in again."
    )
    return _thread_page(
        request, thread, _replay_form(thread, request.user), status=413, body_error=message
    )


@login_required
@require_http_methods(["GET", "POST"])
@page_for_refused_body(_thread_page_refused)
def thread_detail(request: HttpRequest, pk: int) -> HttpResponse:
    """The thread, its turns, and the form that prepares a replay of them."""
    thread = get_object_or_404(Thread.objects.visible_to(request.user), pk=pk)
    if request.method != "POST":
        return _thread_page(request, thread, _replay_form(thread, request.user))
    form = _replay_form(thread, request.user, request.POST)
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


def transcript_limit() -> str:
    """The transcript limit as the upload page and its refusals say it (the number the
    import checks: REPLAYS_MAX_TRANSCRIPT_BYTES)."""
    return readable_size(importing.max_transcript_bytes())


def _upload_page(
    request: HttpRequest, form: TranscriptUploadForm, *, status: int = 200, body_error: str = ""
) -> HttpResponse:
    context = {"form": form, "max_size": transcript_limit(), "body_error": body_error}
    return render(request, "replays/thread_upload.html", context, status=status)


@login_required
def _upload_page_refused(request: HttpRequest, refused: RefusedBody) -> HttpResponse:
    message = (
        f"The upload is {readable_size(refused.size)}, larger than the transcript limit of "
        f"{transcript_limit()}, so it was not read: nothing was imported. Choose a smaller file."
    )
    return _upload_page(request, TranscriptUploadForm(), status=413, body_error=message)


@login_required
@require_http_methods(["GET", "POST"])
@page_for_refused_body(_upload_page_refused)
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
