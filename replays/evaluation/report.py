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

The report's JSON document is versioned (SCHEMA_VERSION) and described in
docs/reports.md.
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
from django.db.models import Count, Q
from django.utils import timezone

from replays import processes, repos, runfolder, statistics
from replays.context import COLD, HISTORICAL_CONTEXT
from replays.evaluation import checks, evaluators, judge
from replays.evaluation.review import (
    PROMPT_VERSION,
    ReviewInputs,
    ReviewKey,
    obtain_review,
    tree_tests_at,
    verify_tree,
)
from replays.models import (
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunStatus,
    Turn,
)
from replays.processes import ProcessIdentity

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CONTEXT_COLD = COLD
# The note the coordinator appends to a diff it had to cut (see coordinator._collect_diff).
CUT_DIFF_NOTE = "[replays] The diff is larger than"

Tick = Callable[[], None]


class JudgmentInProgress(Exception):
    """The run is being judged already: nothing is judged twice at once."""


class JudgmentGone(processes.StopRequested):
    """Our judgment is no longer ours (reconcile marked it lost)."""


class JudgmentRefused(Exception):
    """A judgment cannot be asked for (the run has not completed, no approval, ...)."""

    def __init__(self, message: str, *, code: str, status: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status = status


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
                context=str(run.configuration.get("context") or CONTEXT_COLD),
                requested_by=requested_by,
                host=settings.REPLAYS_HOST_NAME if holder else "",
                pid=holder.pid if holder else None,
                pid_create_time=holder.create_time if holder else None,
                heartbeat_at=now,
                created_at=now,
            )
    except IntegrityError:
        raise JudgmentInProgress(
            f"Run {run.pk} is being judged already; wait for that judgment to end."
        ) from None


def check_judgeable(*, run: Run, evaluator: str | None, approved: Any) -> evaluators.EvaluatorInfo:
    """The evaluator a re-judgment of this run uses, or JudgmentRefused saying why not.
    A model evaluator spends money: it needs the explicit approval (`tests` does not)."""
    if run.status != RunStatus.COMPLETED:
        raise JudgmentRefused(
            f"Run {run.pk} is {run.get_status_display().lower()}: only a completed run is judged.",
            code="not_completed",
            status=409,
        )
    wanted = evaluator or run.batch.evaluator
    if not wanted:
        raise JudgmentRefused(
            "This batch has no evaluator: name one.", code="evaluator_required", status=400
        )
    try:
        info = evaluators.resolve_evaluator(wanted)
    except evaluators.UnknownEvaluator as exc:
        raise JudgmentRefused(str(exc), code="unknown_evaluator", status=400) from None
    if not info.available:
        raise JudgmentRefused(
            f"The evaluator {info.id} cannot judge here: {info.reason}",
            code="evaluator_unavailable",
            status=409,
        )
    if not info.is_tests and approved is not True:
        raise JudgmentRefused(
            f"Judging with {info.id} calls a model and costs money: send approved: true.",
            code="approval_required",
            status=400,
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


def judge_report(*, report_id: int, requested_at: datetime, tick: Tick | None = None) -> Report:
    """Do the judgment this process holds and store it. Raises only what `tick` raises
    (the judgment is then marked lost with that reason) and JudgmentGone."""
    processes.pause_point("judgment_started")
    report = Report.objects.select_related("run__thread", "run__batch").get(pk=report_id)
    beat = _holding(report, tick or (lambda: None))
    started = time.monotonic()
    try:
        values = _judge(report, requested_at, beat)
    except JudgmentGone:
        raise
    except processes.StopRequested as exc:
        mark_lost(report_id=report.pk, reason=_stop_reason(exc), only_if=_held_by(report))
        raise
    except Exception as exc:  # noqa: BLE001 - a fault of ours is recorded, never a failed run
        logger.error("Report %s: the judgment failed:\n%s", report.pk, traceback.format_exc())
        values = _review_failed({"schema": SCHEMA_VERSION, "run": report.run_id},
                                f"The judgment failed: {exc}")  # fmt: skip
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


def _judge(report: Report, requested_at: datetime, beat: Tick) -> dict[str, Any]:
    """The fields of the finished report: judged, or review_failed with the reason."""
    run = report.run
    base = _base_document(run, report)
    if not report.evaluator:
        return _review_failed(base, "This batch names no evaluator, so its runs are not judged.")
    try:
        info = evaluators.resolve_evaluator(report.evaluator)
        if not info.available:
            return _review_failed(
                base, f"The evaluator {info.id} is not available here: {info.reason}"
            )
        configuration = run.configuration
        historical_diff = repos.historical_diff(
            Path(configuration["repository"]),
            configuration["baseline_commit"],
            configuration["ending_commit"],
        )
        base["historical"]["files_changed"] = len(repos.changed_files(historical_diff))
        replay_tests = replay_tree_tests(run, historical_diff=historical_diff, tick=beat)
        review = obtain_review(
            key=ReviewKey.for_run_configuration(run.configuration, report.evaluator),
            inputs=ReviewInputs(
                repository=Path(run.configuration["repository"]),
                request=str(run.configuration.get("request", "")),
                timeout_seconds=_timeout_seconds(run),
            ),
            requested_at=requested_at,
            tick=beat,
        )
        base["review"] = _review_summary(review)
        if review.status != ReviewStatus.READY:
            # What the verify command said on each tree is the cause a user looks for.
            base["tests"] = _tests_document(review, replay_tests, {})
            return {**_review_failed(base, review.error), "review": review}
        kept_broken = judge.replay_tests(review.tests, replay_tests)
        base["tests"] = _tests_document(review, replay_tests, kept_broken)
        if info.is_tests:
            decision = judge.judge_with_tests(review.checks, kept_broken)
        else:
            decision = _judge_with_model(
                info, run, review, historical_diff, replay_tests, kept_broken, report, beat
            )
    except evaluators.UnknownEvaluator as exc:
        return _review_failed(base, str(exc))
    except judge.VerdictUnreadable as exc:
        return _review_failed(base, str(exc))
    except (repos.GitError, OSError, ValueError, KeyError) as exc:
        logger.warning("Report %s: the review failed:\n%s", report.pk, traceback.format_exc())
        return _review_failed(base, f"The review failed: {exc}")
    return _judged(base, decision, review)


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
    configuration = run.configuration
    historical_tests = (
        checks.TreeTests.from_dict(review.tests["historical"]) if review.tests else None
    )
    return judge.judge_with_model(
        info,
        request=str(configuration.get("request", "")),
        review_checks=review.checks,
        historical=judge.Candidate(judge.HISTORICAL, historical_diff, historical_tests),
        replay=judge.Candidate(judge.REPLAY, run.diff, replay_tests),
        kept_broken=kept_broken,
        folder=runfolder.judgment_folder(report.pk),
        first=judge.random_first(),
        tick=beat,
    )


def replay_tree_tests(run: Run, *, historical_diff: str, tick: Tick) -> checks.TreeTests | None:
    """The verify command's outcome on the run's tree: as stored by its coordinator, else
    rebuilt from the baseline and the stored diff (and then stored); None without a
    verify command."""
    configuration = run.configuration
    command = configuration.get("verify_command")
    if not command:
        return None
    if run.tree_tests:
        return checks.TreeTests.from_dict(run.tree_tests)
    if CUT_DIFF_NOTE in run.diff:
        tests = checks.TreeTests(
            outcome="error",
            message="The run's diff was stored cut, so its tree cannot be rebuilt for the tests.",
        )
    else:
        tests = tree_tests_at(
            repository=Path(configuration["repository"]),
            commit=configuration["baseline_commit"],
            ending=configuration["ending_commit"],
            test_files=_test_files(run, historical_diff),
            command=command,
            timeout_seconds=_timeout_seconds(run),
            folder=runfolder.run_folder(run.pk) / runfolder.CHECKS_DIR,
            tick=tick,
            diff=run.diff,
        )
    Run.objects.filter(pk=run.pk, tree_tests__isnull=True).update(tree_tests=tests.as_dict())
    return tests


def verify_run_tree(
    run: Run, *, tree: Path, historical_diff: str, tick: Tick
) -> checks.TreeTests | None:
    """The verify command on a run's own worktree, before it is removed (the coordinator);
    None without a verify command."""
    configuration = run.configuration
    command = configuration.get("verify_command")
    if not command:
        return None
    return verify_tree(
        tree=tree,
        repository=Path(configuration["repository"]),
        ending=configuration["ending_commit"],
        test_files=_test_files(run, historical_diff),
        command=command,
        timeout_seconds=_timeout_seconds(run),
        folder=runfolder.run_folder(run.pk) / runfolder.CHECKS_DIR,
        tick=tick,
    )


def _test_files(run: Run, historical_diff: str) -> list[str]:
    paths = run.configuration.get("test_paths")
    return checks.historical_test_files(
        historical_diff, paths if paths is not None else checks.DEFAULT_TEST_PATHS
    )


def _timeout_seconds(run: Run) -> float:
    value = run.configuration.get("timeout_seconds")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return float(settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS)


# --- the document -----------------------------------------------------------------------------


def _base_document(run: Run, report: Report) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "run": run.pk,
        "evaluator": {"id": report.evaluator},
        "prompt_version": report.prompt_version,
        "context": report.context,
        "historical": historical_side(run),
        "replay": replay_side(run),
        "tests": None,
        "review": None,
    }


def historical_side(run: Run) -> dict[str, Any]:
    """Cost, time and tokens the historical agent spent on the range, from its turns."""
    configuration = run.configuration
    turns = list(run.thread.turns.order_by("index"))
    indexes = {turn.message_uuid: turn.index for turn in turns}
    first = indexes.get(configuration.get("start_message_uuid"))
    last = indexes.get(configuration.get("end_message_uuid"))
    selected: list[Turn] = (
        [turn for turn in turns if first <= turn.index <= last]
        if first is not None and last is not None
        else []
    )
    costs = [turn.cost_usd for turn in selected]
    return {
        "turns": len(selected),
        "cost_usd": None if not selected or None in costs else _money(sum(costs, Decimal(0))),
        "seconds": _sum_or_none([turn.seconds for turn in selected]),
        "model_seconds": _sum_or_none([turn.model_seconds for turn in selected]),
        "tokens": {
            name: sum(getattr(turn, name) for turn in selected)
            for name in (
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_5m_tokens",
                "cache_write_1h_tokens",
            )
        },  # fmt: skip
        "files_changed": None,  # filled from the historical diff when it is read
        # What the historical agent knew: its own session, every earlier request in full.
        "context": HISTORICAL_CONTEXT,
        # A tree rebuilt from the transcript's edits stood in for a missing commit:
        # {"ending"?: {commit, base, files, edits, unsure, repository}, "baseline"?: ...}.
        "rebuilt": configuration.get("rebuilt") or None,
    }


def replay_side(run: Run) -> dict[str, Any]:
    return {
        "model": run.model,
        "cost_usd": _money(run.cost_usd),
        "seconds": run.wall_seconds,
        "model_seconds": run.model_seconds,
        "tokens": run.tokens,
        "files_changed": run.files_changed,
        # What the replay knew before the request (cold, digest, fork), and in how many
        # turns it got the range's requests.
        "context": str(run.configuration.get("context") or CONTEXT_COLD),
        "turns": len(run.turns) or 1,
    }


def _review_summary(review: Review) -> dict[str, Any]:
    return {
        "id": review.pk,
        "status": review.status,
        "checks": len(review.checks),
        "cost_usd": _money(review.cost_usd),
        "seconds": review.seconds,
    }


def tests_document_of(report: Report) -> dict[str, Any] | None:
    """The tests part of a report that was stored without one (a review that failed before
    this was kept): from its review and the run's own tree, as far as they were run."""
    review = report.review
    if review is None or not review.tests:
        return None
    tree = report.run.tree_tests
    replay_tests = checks.TreeTests.from_dict(tree) if isinstance(tree, dict) else None
    return _tests_document(review, replay_tests, {})


def _tests_document(
    review: Review, replay_tests: checks.TreeTests | None, kept_broken: dict[str, Any]
) -> dict[str, Any] | None:
    tests = review.tests
    if not tests:
        return None
    sets = checks.TestSets.from_dict(tests["sets"])
    return {
        "verify_command": tests["verify_command"],
        "test_files": tests["test_files"],
        "usable": sets.usable,
        "reason": sets.reason,
        "fail_to_pass": sets.fail_to_pass,
        "pass_to_pass": sets.pass_to_pass,
        "kept": kept_broken.get("kept", []),
        "broken": kept_broken.get("broken", []),
        "baseline": _tree_summary(tests.get("baseline")),
        "historical": _tree_summary(tests.get("historical")),
        "replay": _tree_summary(replay_tests.as_dict() if replay_tests else None),
    }


def _tree_summary(tree: dict[str, Any] | None) -> dict[str, Any] | None:
    if tree is None:
        return None
    return {key: tree.get(key) for key in ("outcome", "exit_code", "seconds", "message",
                                            "output_tail", "tests")}  # fmt: skip


def _review_failed(base: dict[str, Any], reason: str) -> dict[str, Any]:
    reason = reason.strip() or "The review failed without a reason."
    document = {**base, "status": ReportStatus.REVIEW_FAILED, "winner": None, "reason": reason}
    return {"status": ReportStatus.REVIEW_FAILED, "reason": reason, "data": document}


def _judged(base: dict[str, Any], decision: judge.Judgment, review: Review) -> dict[str, Any]:
    verdicts = decision.verdicts
    document = {
        **base,
        "status": ReportStatus.JUDGED,
        "winner": decision.winner,
        "consistent": decision.consistent,
        "scores": decision.scores,
        "evaluator_scores": decision.evaluator_scores,
        "test_scores": decision.test_scores,
        "tests_override": decision.tests_override,
        "mapping": (
            {"first_order": verdicts[0].labels, "second_order": verdicts[1].labels}
            if verdicts
            else None
        ),
        "checks": decision.checks,
        "verdicts": [verdict.as_dict() for verdict in verdicts],
    }
    document["evaluator"] = {
        **base["evaluator"],
        "cost_usd": _money(decision.cost_usd),
        "seconds": decision.seconds,
        "tokens": decision.usage.as_dict(),
        "review_cost_usd": _money(review.cost_usd),
    }
    return {
        "status": ReportStatus.JUDGED,
        "winner": decision.winner,
        "score_historical": decision.scores[judge.HISTORICAL],
        "score_replay": decision.scores[judge.REPLAY],
        "consistent": decision.consistent,
        "evaluator_cost_usd": decision.cost_usd,
        "review": review,
        "data": document,
    }


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


def _money(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, 6))


def _sum_or_none(values: list[float | None]) -> float | None:
    if not values or any(value is None for value in values):
        return None
    return round(sum(value for value in values if value is not None), 3)


# --- reading the stored judgments ---------------------------------------------------------------


def consistency_rates() -> list[dict[str, Any]]:
    """Per evaluator and prompt version: the share of both-order judgments whose two orders
    agreed, over every stored judged report (current or not), with its Wilson interval."""
    rows = (
        Report.objects.filter(status=ReportStatus.JUDGED, consistent__isnull=False)
        .values("evaluator", "prompt_version")
        .annotate(n=Count("id"), agreed=Count("id", filter=Q(consistent=True)))
        .order_by("evaluator", "prompt_version")
    )
    rates = []
    for row in rows:
        rate = statistics.wilson_interval(row["agreed"], row["n"])
        rates.append({**row, "rate": rate.value, "rate_low": rate.low, "rate_high": rate.high})
    return rates


def brief(report: Report | None) -> dict[str, Any] | None:
    """A report in brief, as the commands print it (JSON)."""
    if report is None:
        return None
    return {
        "id": report.pk,
        "run": report.run_id,
        "status": report.status,
        "winner": report.winner,
        "score_historical": report.score_historical,
        "score_replay": report.score_replay,
        "consistent": report.consistent,
        "evaluator": report.evaluator,
        "reason": report.reason,
    }
