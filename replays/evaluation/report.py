"""One judgment of a run, from its claim to the stored report.

A judgment is a Report row: created `judging` by the process that will judge
(the run's coordinator, `manage.py judge`, or the `run_judgment` process the API
starts), which holds it by host, pid and create time and writes a heartbeat;
at most one per run is judging at a time (a database constraint). It ends
`judged` or `review_failed` and becomes the run's current report in the same
transaction that retires the previous one; reconcile marks a judgment whose
process is gone `lost`. Problems of the review or the evaluator are data (a
`review_failed` report with the reason), never an exception for the caller;
only the caller's own tick (cancel, a lost claim) stops a judgment.

What the report stores is built by replays.evaluation.document (versioned, described in
docs/reports.md); the run's own tree tests by replays.evaluation.treetests; reads over
stored reports (consistency rates, a report in brief) are in replays.evaluation.results.
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Callable
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from replays import processes, repos, runfolder
from replays.errors import ErrorKind, ServiceError
from replays.evaluation import campaign_results, checks, document, evaluators, judge, treetests
from replays.evaluation.review import PROMPT_VERSION, ReviewInputs, ReviewKey, obtain_review
from replays.models import (
    ACTIVE_RUN_STATUSES,
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunStatus,
)
from replays.processes import ProcessIdentity

logger = logging.getLogger(__name__)

Tick = Callable[[], None]


class JudgmentInProgress(ServiceError):
    """The run is being judged already: nothing is judged twice at once."""

    kind = ErrorKind.CONFLICT


class JudgmentGone(processes.StopRequested):
    """Our judgment is no longer ours (reconcile marked it lost)."""


class JudgmentRefused(ServiceError):
    """A judgment cannot be asked for (the run has not completed, no approval, ...)."""


# --- asking for a judgment -------------------------------------------------------------------


def start_judgment(
    *,
    run: Run,
    evaluator: str,
    holder: ProcessIdentity | None,
    requested_by: Any = None,
) -> Report:
    """The judging Report row that claims this run's next judgment; `holder` is the
    process that judges it (None: a process started later claims it)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            return Report.objects.create(
                run=run,
                status=ReportStatus.JUDGING,
                evaluator=evaluator,
                prompt_version=PROMPT_VERSION,
                context=run.spec.context,
                requested_by=requested_by,
                host=settings.REPLAYS_HOST_NAME if holder else "",
                pid=holder.pid if holder else None,
                pid_create_time=holder.create_time if holder else None,
                heartbeat_at=now,
                created_at=now,
            )
    except IntegrityError:
        raise JudgmentInProgress(
            f"Run {run.pk} is being judged already; wait for that judgment to end.",
            code="judgment_in_progress",
        ) from None


def check_judgeable(*, run: Run, evaluator: str | None, approved: Any) -> evaluators.EvaluatorInfo:
    """The evaluator a re-judgment of this run uses, or JudgmentRefused saying why not.
    A model evaluator spends money: it needs the explicit approval (`tests` does not)."""
    if run.status != RunStatus.COMPLETED:
        raise JudgmentRefused(
            f"Run {run.pk} is {run.get_status_display().lower()}: only a completed run is judged.",
            code="not_completed",
            kind=ErrorKind.CONFLICT,
        )
    wanted = evaluator or run.batch.evaluator
    if not wanted:
        raise JudgmentRefused(
            "This batch has no evaluator: name one.",
            code="evaluator_required",
            kind=ErrorKind.INVALID,
        )
    try:
        info = evaluators.resolve_evaluator(wanted)
    except evaluators.UnknownEvaluator as exc:
        raise JudgmentRefused(str(exc), code="unknown_evaluator", kind=ErrorKind.INVALID) from None
    if not info.available:
        raise JudgmentRefused(
            f"The evaluator {info.id} cannot judge here: {info.reason}",
            code="evaluator_unavailable",
            kind=ErrorKind.CONFLICT,
        )
    if not info.is_tests and approved is not True:
        raise JudgmentRefused(
            f"Judging with {info.id} calls a model and costs money: send approved: true.",
            code="approval_required",
            kind=ErrorKind.INVALID,
        )
    return info


def request_judgment(*, run: Run, evaluator: str | None, approved: Any, user: Any) -> Report:
    """Judge a completed run again in its own process (`manage.py run_judgment`), as the
    API does; returns the judging row at once."""
    info = check_judgeable(run=run, evaluator=evaluator, approved=approved)
    report = start_judgment(run=run, evaluator=info.id, holder=None, requested_by=user)
    folder = runfolder.judgment_folder(report.pk)
    try:
        processes.spawn(
            runfolder.manage_command("run_judgment", str(report.pk)),
            cwd=Path(settings.BASE_DIR),
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            log_path=folder / "judgment.log",
        )
    except OSError as exc:
        mark_lost(report_id=report.pk, reason=f"The judgment process could not start: {exc}")
    report.refresh_from_db()
    return report


def claim_judgment(*, report_id: int) -> bool:
    """The process started for a judgment takes it (once: the pid is set by one only)."""
    me = processes.own_identity()
    return (
        Report.objects.filter(pk=report_id, status=ReportStatus.JUDGING, pid__isnull=True).update(
            host=settings.REPLAYS_HOST_NAME,
            pid=me.pid,
            pid_create_time=me.create_time,
            heartbeat_at=timezone.now(),
        )
        == 1
    )


def mark_lost(*, report_id: int, reason: str, only_if: dict[str, Any] | None = None) -> bool:
    """judging -> lost with the reason (False when it had ended already)."""
    return (
        Report.objects.filter(pk=report_id, status=ReportStatus.JUDGING, **(only_if or {})).update(
            status=ReportStatus.LOST, reason=reason, finished_at=timezone.now()
        )
        == 1
    )


# --- judging ----------------------------------------------------------------------------------


def judge_report(
    *,
    report_id: int,
    requested_at: datetime,
    tick: Tick | None = None,
    historical_diff: str | None = None,
) -> Report:
    """Do the judgment this process holds and store it. Raises only what `tick` raises
    (the judgment is then marked lost with that reason) and JudgmentGone. The caller that
    already read the historical diff (the run's coordinator, checked against the approved
    sha256) hands it on; otherwise it is read here, once."""
    processes.pause_point("judgment_started")
    report = Report.objects.select_related("run__thread", "run__batch").get(pk=report_id)
    beat = _holding(report, tick or (lambda: None))
    started = time.monotonic()
    try:
        values = _judge(report, requested_at, beat, historical_diff)
    except JudgmentGone:
        raise
    except processes.StopRequested as exc:
        mark_lost(report_id=report.pk, reason=_stop_reason(exc), only_if=_held_by(report))
        raise
    except Exception as exc:  # noqa: BLE001 - a fault of ours is recorded, never a failed run
        logger.error("Report %s: the judgment failed:\n%s", report.pk, traceback.format_exc())
        values = document.review_failed(
            {"schema": document.SCHEMA_VERSION, "run": report.run_id},
            f"The judgment failed: {exc}",
        )
    except BaseException as exc:
        mark_lost(report_id=report.pk, reason=_stop_reason(exc), only_if=_held_by(report))
        raise
    values["evaluator_seconds"] = round(time.monotonic() - started, 3)
    if report.evaluator == evaluators.TESTS:
        # It asks no model: it costs nothing, judged or not (a known $0, never "unknown").
        values.setdefault("evaluator_cost_usd", Decimal(0))
    if not _finish(report, values):
        raise JudgmentGone()
    report.refresh_from_db()
    status, campaign_id = Run.objects.values_list("status", "batch__campaign_id").get(
        pk=report.run_id
    )
    if campaign_id is not None and status not in ACTIVE_RUN_STATUSES:
        # A judgment written anew (`judge` again) changes its campaign's results (the
        # coordinator refreshes them itself when its run ends).
        campaign_results.refresh(campaign_id)
    return report


def _stop_reason(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return f"The judgment was stopped before it finished: {text}"


def _held_by(report: Report) -> dict[str, Any]:
    return {"pid": report.pid, "pid_create_time": report.pid_create_time}


def _holding(report: Report, tick: Tick) -> Tick:
    """`tick`, plus the judgment's heartbeat; JudgmentGone when it is no longer ours."""
    return evaluators.holding(
        tick,
        beat=lambda: (
            Report.objects.filter(
                pk=report.pk, status=ReportStatus.JUDGING, **_held_by(report)
            ).update(heartbeat_at=timezone.now())
            == 1
        ),
        lost=JudgmentGone,
    )


def _judge(
    report: Report, requested_at: datetime, beat: Tick, historical_diff: str | None
) -> dict[str, Any]:
    """The fields of the finished report: judged, or review_failed with the reason."""
    run = report.run
    base = document.base_document(run, report)
    if not report.evaluator:
        return document.review_failed(
            base, "This batch names no evaluator, so its runs are not judged."
        )
    try:
        info = evaluators.resolve_evaluator(report.evaluator)
        if not info.available:
            return document.review_failed(
                base, f"The evaluator {info.id} is not available here: {info.reason}"
            )
        spec = run.spec
        if historical_diff is None:
            historical_diff = repos.approved_historical_diff(
                Path(spec.repository),
                spec.baseline_commit,
                spec.ending_commit,
                spec.historical_result_sha256,
            )
        base["historical"]["files_changed"] = len(repos.changed_files(historical_diff))
        return _review_and_decide(report, info, base, historical_diff, requested_at, beat)
    except (evaluators.UnknownEvaluator, judge.VerdictUnreadable) as exc:
        return document.review_failed(base, str(exc))
    except (repos.GitError, OSError, ValueError, KeyError) as exc:
        logger.warning("Report %s: the review failed:\n%s", report.pk, traceback.format_exc())
        return document.review_failed(base, f"The review failed: {exc}")


def _review_and_decide(
    report: Report,
    info: evaluators.EvaluatorInfo,
    base: dict[str, Any],
    historical_diff: str,
    requested_at: datetime,
    beat: Tick,
) -> dict[str, Any]:
    """The replay's tests, the shared review, then the evaluator's decision."""
    run = report.run
    spec = run.spec
    replay_tests = treetests.replay_tree_tests(run, historical_diff=historical_diff, tick=beat)
    review = obtain_review(
        key=ReviewKey.for_spec(spec, report.evaluator),
        inputs=ReviewInputs(
            repository=Path(spec.repository),
            request=spec.request,
            timeout_seconds=spec.timeout(),
            historical_diff=historical_diff,
        ),
        requested_at=requested_at,
        tick=beat,
    )
    base["review"] = document.review_summary(review)
    if review.status != ReviewStatus.READY:
        # What the verify command said on each tree is the cause a user looks for.
        base["tests"] = document.tests_document(review, replay_tests, {})
        return {**document.review_failed(base, review.error), "review": review}
    kept_broken = judge.replay_tests(review.tests, replay_tests)
    base["tests"] = document.tests_document(review, replay_tests, kept_broken)
    if info.is_tests:
        decision = judge.judge_with_tests(review.checks, kept_broken)
    else:
        decision = _judge_with_model(
            info, run, review, historical_diff, replay_tests, kept_broken, report, beat
        )
    return document.judged(base, decision, review)


def _judge_with_model(
    info: evaluators.EvaluatorInfo,
    run: Run,
    review: Review,
    historical_diff: str,
    replay_tests: checks.TreeTests | None,
    kept_broken: dict[str, Any],
    report: Report,
    beat: Tick,
) -> judge.Judgment:
    historical_tests = (
        checks.TreeTests.from_dict(review.tests["historical"]) if review.tests else None
    )
    return judge.judge_with_model(
        info,
        request=run.spec.request,
        review_checks=review.checks,
        historical=judge.Candidate(judge.HISTORICAL, historical_diff, historical_tests),
        replay=judge.Candidate(judge.REPLAY, run.diff, replay_tests),
        kept_broken=kept_broken,
        folder=runfolder.judgment_folder(report.pk),
        first=judge.random_first(),
        tick=beat,
    )


# --- the document -----------------------------------------------------------------------------


def _finish(report: Report, values: dict[str, Any]) -> bool:
    """Store the finished judgment as the run's current report, retiring the previous one,
    in one transaction conditional on the judgment still being ours."""
    values = {**values, "finished_at": timezone.now(), "is_current": True}
    with transaction.atomic():
        Report.objects.filter(run_id=report.run_id, is_current=True).exclude(pk=report.pk).update(
            is_current=False
        )
        written = Report.objects.filter(
            pk=report.pk, status=ReportStatus.JUDGING, **_held_by(report)
        ).update(**values)
        if not written:
            transaction.set_rollback(True)
    return written == 1


# --- reading the stored judgments ---------------------------------------------------------------
