"""One run compared with history: the verdict, the checks, the tests, both diffs side by
side, the run's judgments; and judging it again."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.text import Truncator
from django.views.decorators.http import require_POST

from replays import context, diffview
from replays.evaluation import document as documents
from replays.evaluation import evaluators
from replays.evaluation import report as reports
from replays.models import Report, ReportStatus, ReviewStatus, Run, RunStatus
from replays.views.common import model_labels
from replays.views.threads import split_request

# While a judgment runs the page reloads, so the new report shows when it is stored.
JUDGING_REFRESH_SECONDS = 5
APPROVED = "yes"

CHECK_STATES = {True: "passed", False: "failed", None: "split"}


@dataclass
class SideCheck:
    state: str  # passed, failed, or split (the two orders disagreed)
    reasons: list[str]


@dataclass
class CheckRow:
    id: str
    text: str
    historical: SideCheck
    replay: SideCheck

    @property
    def sides(self) -> list[SideCheck]:
        return [self.historical, self.replay]


def check_rows(document: dict[str, Any]) -> list[CheckRow]:
    rows = []
    for check in document.get("checks") or []:
        sides = {}
        for side in ("historical", "replay"):
            found = check.get(side) or {}
            state = CHECK_STATES.get(found.get("passed"), "split")
            reasons = [str(reason) for reason in found.get("reasons") or [] if reason]
            if state != "split":  # both orders agreed, often in the same words
                reasons = list(dict.fromkeys(reasons))
            sides[side] = SideCheck(state, reasons)
        rows.append(CheckRow(id=str(check.get("id", "")), text=str(check.get("text", "")), **sides))
    return rows


@dataclass
class TestEntry:
    name: str
    state: str  # kept, broken, or unknown (no result for it)


@dataclass
class TreeOutcome:
    label: str
    outcome: dict[str, Any] | None


@dataclass
class TestsView:
    verify_command: str
    usable: bool
    reason: str
    test_files: list[str]
    fail_to_pass: list[TestEntry]
    pass_to_pass: list[TestEntry]
    trees: list[TreeOutcome]

    @property
    def broken(self) -> int:
        return sum(1 for entry in self.fail_to_pass + self.pass_to_pass if entry.state == "broken")


def tests_view(tests: dict[str, Any] | None) -> TestsView | None:
    if not tests:
        return None
    kept, broken = set(tests.get("kept") or []), set(tests.get("broken") or [])

    def entries(names: list[str]) -> list[TestEntry]:
        return [
            TestEntry(name, "broken" if name in broken else "kept" if name in kept else "unknown")
            for name in names
        ]

    return TestsView(
        verify_command=str(tests.get("verify_command") or ""),
        usable=bool(tests.get("usable")),
        reason=str(tests.get("reason") or ""),
        test_files=list(tests.get("test_files") or []),
        fail_to_pass=entries(tests.get("fail_to_pass") or []),
        pass_to_pass=entries(tests.get("pass_to_pass") or []),
        trees=[
            TreeOutcome("Baseline", tests.get("baseline")),
            TreeOutcome("Historical", tests.get("historical")),
            TreeOutcome("Replay", tests.get("replay")),
        ],
    )


@dataclass
class Figure:
    """One line of the two sides' table."""

    label: str
    kind: str  # score, usd, duration, count
    historical: Any
    replay: Any


def side_figures(document: dict[str, Any]) -> list[Figure]:
    historical, replay = document.get("historical") or {}, document.get("replay") or {}
    figures = []
    for key, label in (
        ("scores", "Score"),
        ("evaluator_scores", "Evaluator score"),
        ("test_scores", "Test score"),
    ):
        values = document.get(key)
        if isinstance(values, dict):
            figures.append(Figure(label, "score", values.get("historical"), values.get("replay")))
    if historical or replay:
        figures += [
            Figure(
                "Context",
                "text",
                context.LABELS.get(historical.get("context"), historical.get("context")),
                context.LABELS.get(replay.get("context"), replay.get("context")),
            ),
            Figure("Cost", "usd", historical.get("cost_usd"), replay.get("cost_usd")),
            Figure("Time", "duration", historical.get("seconds"), replay.get("seconds")),
            Figure(
                "Files changed",
                "count",
                historical.get("files_changed"),
                replay.get("files_changed"),
            ),
        ]
    return figures


@dataclass
class TurnRow:
    """One turn of a range replayed turn by turn (Run.turns), with its request's first line."""

    number: int
    request: str
    ending: str
    exit_code: int | None
    seconds: float | None
    cost_usd: Decimal | None
    tokens: int
    files_changed: int | None
    diff: str


def turn_rows(run: Run) -> list[TurnRow]:
    """The run's turns, when it had several (one turn is the run itself)."""
    records = [item for item in run.turns if isinstance(item, dict)]
    if len(records) < 2:
        return []
    requests = run.spec.requests
    rows = []
    for number, item in enumerate(records, start=1):
        text = str(requests[number - 1]) if number <= len(requests) else ""
        cost = item.get("cost_usd")
        tokens = item.get("tokens") if isinstance(item.get("tokens"), dict) else {}
        rows.append(
            TurnRow(
                number=number,
                request=Truncator(text.strip().split("\n")[0]).chars(80),
                ending=str(item.get("ending") or ""),
                exit_code=item.get("exit_code"),
                seconds=item.get("seconds"),
                cost_usd=Decimal(cost) if isinstance(cost, str) else None,
                tokens=sum(value for value in tokens.values() if isinstance(value, int)),
                files_changed=item.get("files_changed"),
                diff=str(item.get("diff") or ""),
            )
        )
    return rows


@dataclass
class EvaluatorOption:
    info: evaluators.EvaluatorInfo
    selected: bool


def evaluator_options(default: str) -> list[EvaluatorOption]:
    found = evaluators.discover_evaluators()
    if not any(info.id == default and info.available for info in found):
        default = next((info.id for info in found if info.available), "")
    return [EvaluatorOption(info, info.id == default) for info in found]


def _historical_diff(report: Report | None) -> str | None:
    """The historical diff the report's review kept; None when it has none to show."""
    review = report.review if report is not None else None
    if review is None:
        return None
    if review.status == ReviewStatus.READY or review.historical_diff:
        return review.historical_diff
    return None


@login_required
def run_compare(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(
        Run.objects.visible_to(request.user)
        .select_related("thread", "batch")
        .with_current_report(),
        pk=pk,
    )
    report = run.current_report
    # Every judgment of the run, newest first; their documents stay in the database.
    judgments = list(
        run.reports.only(
            "id", "status", "is_current", "winner", "evaluator", "prompt_version",
            "score_historical", "score_replay", "reason", "created_at", "finished_at",
        ).order_by("-created_at", "-id")
    )  # fmt: skip
    judging = next((item for item in judgments if item.status == ReportStatus.JUDGING), None)
    document = report.data if report is not None and isinstance(report.data, dict) else {}
    historical_diff = _historical_diff(report)
    comparison = diffview.compare_diffs(
        historical_diff or "",
        run.diff,
        historical_cut=bool(report and report.review and report.review.historical_diff_cut),
        replay_cut=run.diff_cut,
    )
    request_text = run.spec.request
    head, rest = split_request(request_text)
    options = evaluator_options(run.batch.evaluator)
    labels = {option.info.id: option.info.label for option in options}
    verdicts = [item for item in document.get("verdicts") or [] if item.get("reason")]
    return render(
        request,
        "replays/comparison.html",
        {
            "run": run,
            "label": model_labels().get(run.model, run.model),
            "report": report,
            "judged": report is not None and report.status == ReportStatus.JUDGED,
            "document": document,
            "evaluator_label": labels.get(report.evaluator, "") if report else "",
            "figures": side_figures(document),
            "verdict_reasons": [str(item["reason"]) for item in verdicts],
            "checks": check_rows(document),
            "tests": tests_view(
                document.get("tests")
                or (documents.tests_document_of(report) if report is not None else None)
            ),
            "request_head": head,
            "request_rest": rest,
            "turns": turn_rows(run),
            "comparison": comparison,
            "has_historical_diff": historical_diff is not None,
            "judgments": judgments,
            "judging": judging,
            "can_judge": run.status == RunStatus.COMPLETED and judging is None,
            "evaluator_options": options,
            "refresh_seconds": JUDGING_REFRESH_SECONDS if judging else None,
            "max_diff_bytes": settings.REPLAYS_MAX_DIFF_BYTES,
        },
    )


@login_required
@require_POST
def run_judge(request: HttpRequest, pk: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.visible_to(request.user).select_related("batch"), pk=pk)
    evaluator = request.POST.get("evaluator", "").strip() or None
    try:
        judging = reports.request_judgment(
            run=run,
            evaluator=evaluator,
            approved=request.POST.get("approved") == APPROVED,
            user=request.user,
        )
    except reports.JudgmentRefused as exc:
        messages.error(request, exc.message)
    except reports.JudgmentInProgress as exc:
        messages.error(request, str(exc))
    else:
        if judging.status == ReportStatus.LOST:
            messages.error(request, judging.reason)
        else:
            messages.success(
                request,
                f"Judging again with {judging.evaluator}: "
                "the page shows the new report when it is ready.",
            )
    return redirect("replays:run-compare", run.pk)
