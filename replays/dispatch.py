"""Dispatch: capacity, claiming queued runs, reconcile, cancel (the coordinators of
claimed runs are started by replays.supervision).

The database, not the queue, decides what runs. django-q2 may deliver a dispatch
task twice or lose one: a claim is a compare-and-set UPDATE (queued -> launching)
whose row count says who won, so a duplicate delivery claims nothing, and the
schedule makes a lost delivery late, not lost. Capacity (global and per host) is
counted in the database inside the same short transaction that claims, and claims
are serialised, so two dispatchers on two machines never exceed it.

Reconcile never relaunches: a member that lost its launcher or its coordinator
fails (launch_failed, coordinator_lost) with the reason on its own row.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models import Count, F, QuerySet, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from replays import budgets, processes, repos, runfolder, runlogs, wakeups
from replays.agents.base import read_tail
from replays.models import (
    Batch,
    FailureCode,
    LaunchError,
    LaunchErrorCode,
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunPhase,
    RunStatus,
)
from replays.runfolder import AGENT_LOG, run_folder

logger = logging.getLogger(__name__)

# Launching and running members hold a slot; queued ones wait for one.
SLOT_STATUSES = [RunStatus.LAUNCHING, RunStatus.RUNNING]
# Every dispatcher takes this PostgreSQL advisory lock before counting and claiming.
CLAIM_LOCK_KEY = 0x5245504C  # "REPL"
LAUNCHER_STOPPED = "Launcher stopped before the agent started"


def launcher_identity(host: str) -> str:
    """Who claimed a run: "host:pid@create_time" of this process."""
    return f"{host}:{processes.own_identity()}"


def parse_launcher(launcher: str) -> tuple[str, processes.ProcessIdentity | None]:
    host, _, identity = launcher.rpartition(":")
    pid, _, create_time = identity.partition("@")
    try:
        return host, processes.ProcessIdentity(int(pid), float(create_time))
    except ValueError:
        return host, None


# --- Capacity and claims -------------------------------------------------------------


def _queued_in_order() -> QuerySet[Run]:
    return Run.objects.filter(status=RunStatus.QUEUED, cancel_requested_at__isnull=True).order_by(
        "created_at", "id"
    )


def _serialise_claims() -> None:
    """Make the count-then-claim below one at a time across every process and machine."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CLAIM_LOCK_KEY])
    elif connection.vendor == "sqlite":
        # Settings open SQLite transactions with BEGIN IMMEDIATE, which already holds the
        # write lock; an empty write takes it when someone configured a deferred mode.
        if connection.settings_dict.get("OPTIONS", {}).get("transaction_mode") != "IMMEDIATE":
            Run.objects.filter(pk=-1).update(host="")


def _free_slots(host: str) -> int:
    active = Run.objects.filter(status__in=SLOT_STATUSES)
    global_free = settings.REPLAYS_MAX_PARALLEL_RUNS - active.count()
    host_free = settings.REPLAYS_MAX_RUNS_PER_HOST - active.filter(host=host).count()
    return max(0, min(global_free, host_free))


def waits_beside_free_slot(host: str | None = None) -> bool:
    """A queued run waits while `host` has a free slot: a dispatch there would claim it
    (or end it, its campaign's budget spent). One its campaign's budget holds back until
    a member in flight ends does not count: no dispatch would take it now."""
    host = host or settings.REPLAYS_HOST_NAME
    if _free_slots(host) <= 0:
        return False
    ledger = budgets.Ledger()
    for _, campaign_id, estimate in _queued_in_order().values_list(
        "pk", "batch__campaign_id", "estimated_cost_usd"
    )[:WATCHED_QUEUE]:
        admission = ledger.admit(campaign_id, estimate)
        if admission.admit or admission.exhausted:
            return True
    return False


# The watchdog looks at this many of the oldest queued runs.
WATCHED_QUEUE = 200


def claim_queued_runs(*, host: str | None = None, limit: int | None = None) -> list[Run]:
    """Move queued runs to launching, oldest first, up to the free capacity (and `limit`)
    and within their campaigns' budgets (replays.budgets): a member its budget holds back
    waits, one it never will admit ends budget_exhausted."""
    host = host or settings.REPLAYS_HOST_NAME
    launcher = launcher_identity(host)
    claimed: list[int] = []
    with transaction.atomic():
        _serialise_claims()
        wanted = _free_slots(host)
        if limit is not None:
            wanted = min(wanted, limit)
        tried: set[int] = set()
        ledger = budgets.Ledger()
        while len(claimed) < wanted:
            candidates = list(
                _queued_in_order()
                .exclude(pk__in=tried)
                .values_list("pk", "batch__campaign_id", "estimated_cost_usd")[
                    : wanted - len(claimed)
                ]
            )
            if not candidates:
                break
            for run_id, campaign_id, estimate in candidates:
                tried.add(run_id)
                admission = ledger.admit(campaign_id, estimate)
                if admission.exhausted:
                    _end_out_of_budget(run_id)
                if not admission.admit:
                    continue
                # A run cancelled in between is not claimed: the row count says so.
                won = Run.objects.filter(
                    pk=run_id, status=RunStatus.QUEUED, cancel_requested_at__isnull=True
                ).update(
                    status=RunStatus.LAUNCHING,
                    host=host,
                    launcher=launcher,
                    claimed_at=timezone.now(),
                    cost_cap_usd=admission.cap,
                )
                if won == 1:
                    claimed.append(run_id)
                    ledger.claimed(campaign_id, estimate)
    return list(Run.objects.filter(pk__in=claimed).order_by("created_at", "id"))


def _end_out_of_budget(run_id: int) -> None:
    """queued -> failed budget_exhausted: its campaign's money left does not cover its
    estimate and nothing else of it is in flight to free any."""
    Run.objects.filter(pk=run_id, status=RunStatus.QUEUED).update(
        status=RunStatus.FAILED,
        failure_code=FailureCode.BUDGET_EXHAUSTED,
        failure_message=(
            "Not started: the campaign's budget left did not cover what this run was "
            "estimated to cost."
        ),
        finished_at=timezone.now(),
        phase=RunPhase.DONE,
    )


def fail_launch(
    *, run_id: int, code: str, message: str, host: str, failure_message: str = LAUNCHER_STOPPED
) -> bool:
    """launching -> failed launch_failed with one LaunchError; False when the run moved on."""
    now = timezone.now()
    with transaction.atomic():
        changed = Run.objects.filter(pk=run_id, status=RunStatus.LAUNCHING).update(
            status=RunStatus.FAILED,
            failure_code=FailureCode.LAUNCH_FAILED,
            failure_message=failure_message,
            finished_at=now,
            phase=RunPhase.DONE,
        )
        if not changed:
            return False
        try:
            with transaction.atomic():
                LaunchError.objects.create(run_id=run_id, code=code, message=message, host=host)
        except IntegrityError:
            pass  # Already recorded: a member fails to launch once.
    return True


def capacity_snapshot() -> dict[str, Any]:
    """Slots in use per host and overall, the limits, and what waits (for pages and the API)."""
    host = settings.REPLAYS_HOST_NAME
    by_host = {
        row["host"]: row["count"]
        for row in Run.objects.filter(status__in=SLOT_STATUSES)
        .values("host")
        .annotate(count=Count("id"))
        .order_by("host")
    }
    active = sum(by_host.values())
    on_host = by_host.get(host, 0)
    return {
        "host": host,
        "max_parallel_runs": settings.REPLAYS_MAX_PARALLEL_RUNS,
        "max_runs_per_host": settings.REPLAYS_MAX_RUNS_PER_HOST,
        "active": active,
        "active_by_host": by_host,
        "active_on_host": on_host,
        "queued": Run.objects.filter(status=RunStatus.QUEUED).count(),
        "free": max(
            0,
            min(
                settings.REPLAYS_MAX_PARALLEL_RUNS - active,
                settings.REPLAYS_MAX_RUNS_PER_HOST - on_host,
            ),
        ),
    }


# --- Reconcile -----------------------------------------------------------------------


@dataclass
class ReconcileReport:
    launch_failed: int = 0
    coordinator_lost: int = 0
    cancelled: int = 0
    judgments_lost: int = 0
    lines: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "launch_failed": self.launch_failed,
            "coordinator_lost": self.coordinator_lost,
            "cancelled": self.cancelled,
            "judgments_lost": self.judgments_lost,
            "lines": list(self.lines),
        }


def reconcile_runs(*, now: datetime | None = None) -> ReconcileReport:
    """End launching and running members whose launcher or coordinator is gone. Never relaunches."""
    now = now or timezone.now()
    report = ReconcileReport()
    for run in Run.objects.filter(status=RunStatus.LAUNCHING).order_by("id"):
        _reconcile_launching(run, now, report)
    for run in Run.objects.filter(status=RunStatus.RUNNING).order_by("id"):
        _reconcile_running(run, now, report)
    for judgment in Report.objects.filter(status=ReportStatus.JUDGING).order_by("id"):
        _reconcile_judgment(judgment, now, report)
    return report


def _reconcile_judgment(judgment: Report, now: datetime, report: ReconcileReport) -> None:
    """A judgment whose process is gone is lost (never judged again by itself): same host,
    its pid and create time no longer match; any host, its heartbeat is stale; a
    judgment no process ever took, after the launch grace."""
    host = settings.REPLAYS_HOST_NAME
    last_sign = judgment.heartbeat_at or judgment.created_at
    reason = ""
    if judgment.pid is None:
        grace = timedelta(seconds=settings.REPLAYS_LAUNCH_GRACE_SECONDS)
        if judgment.created_at < now - grace:
            reason = "no process took the judgment within the launch grace"
    elif judgment.host == host and not processes.is_alive(judgment.pid, judgment.pid_create_time):
        reason = f"its process (pid {judgment.pid} on {host}) stopped before it finished"
    elif last_sign < now - timedelta(seconds=settings.REPLAYS_HEARTBEAT_STALE_SECONDS):
        seconds = (now - last_sign).total_seconds()
        reason = f"its process on {judgment.host or 'an unknown host'} sent no heartbeat for {seconds:.0f} s"
    if not reason:
        return
    # Only if nothing moved since we looked: a heartbeat written meanwhile keeps it.
    lost = Report.objects.filter(
        pk=judgment.pk, status=ReportStatus.JUDGING, heartbeat_at=judgment.heartbeat_at
    ).update(
        status=ReportStatus.LOST,
        reason=f"The judgment was lost: {reason}. Judge the run again to get a report.",
        finished_at=now,
    )
    if lost:
        report.judgments_lost += 1
        report.lines.append(f"report {judgment.pk} of run {judgment.run_id}: lost ({reason})")
        if judgment.host == host:
            _stop_evaluators_of(judgment)


def _stop_evaluators_of(judgment: Report) -> None:
    """A lost judgment's evaluators (its verdicts', and its process's review's, when that
    process is the one that died): each runs in a process group of its own calling a paid
    model, and the process that waited for it is gone, so nobody else would stop it."""
    runfolder.stop_evaluators(runfolder.judgment_folder(judgment.pk))
    if judgment.pid is None or judgment.pid_create_time is None:
        return
    if processes.is_alive(judgment.pid, judgment.pid_create_time):
        return  # alive but silent: its review is its own to finish or lose
    holder = f"{judgment.host}:{processes.ProcessIdentity(judgment.pid, judgment.pid_create_time)}"
    for review_id in Review.objects.filter(
        claimed_by=holder, status=ReviewStatus.PENDING
    ).values_list("pk", flat=True):
        runfolder.stop_evaluators(runfolder.review_folder(review_id))


def _reconcile_launching(run: Run, now: datetime, report: ReconcileReport) -> None:
    host = settings.REPLAYS_HOST_NAME
    same_host = run.host == host
    coordinator_alive = same_host and processes.is_alive(run.pid, run.pid_create_time)
    code = ""
    detail = ""
    if same_host and not coordinator_alive:
        launcher_host, launcher = parse_launcher(run.launcher)
        launcher_alive = (
            launcher is not None
            and launcher_host == host
            and processes.is_alive(launcher.pid, launcher.create_time)
        )
        if not launcher_alive:
            code = LaunchErrorCode.LAUNCHER_LOST
            detail = f"the launcher {run.launcher or '(unknown)'} is gone and no coordinator runs"
        elif run.pid is not None:
            # The launcher finished its part; the coordinator it started died before starting.
            code = LaunchErrorCode.LAUNCH_FAILED
            detail = f"the coordinator (pid {run.pid}) exited before it started the run"
    claimed_at = run.claimed_at or run.created_at
    if not code and claimed_at < now - timedelta(seconds=settings.REPLAYS_LAUNCH_GRACE_SECONDS):
        code = LaunchErrorCode.LAUNCH_FAILED
        detail = (
            f"no coordinator reported within {settings.REPLAYS_LAUNCH_GRACE_SECONDS:g} s "
            f"of the claim on {run.host or 'an unknown host'}"
        )
    if not code:
        return  # Its launcher or coordinator is alive and within grace: it will move soon.
    if run.cancel_requested_at is not None:
        if _cancel_launching(run.pk, now):
            report.cancelled += 1
            report.lines.append(f"run {run.pk}: cancelled (cancel requested; {detail})")
        return
    if fail_launch(
        run_id=run.pk, code=code, host=run.host or host, message=f"{LAUNCHER_STOPPED}: {detail}."
    ):
        report.launch_failed += 1
        report.lines.append(f"run {run.pk}: launch_failed ({detail})")


def _reconcile_running(run: Run, now: datetime, report: ReconcileReport) -> None:
    host = settings.REPLAYS_HOST_NAME
    same_host = run.host == host
    stale = timedelta(seconds=settings.REPLAYS_HEARTBEAT_STALE_SECONDS)
    last_sign = run.heartbeat_at or run.started_at or run.claimed_at or run.created_at
    message = ""
    if same_host and run.pid is not None and not processes.is_alive(run.pid, run.pid_create_time):
        message = (
            f"The coordinator (pid {run.pid} on {host}) stopped while the run was in "
            "progress; the partial log is kept."
        )
    elif last_sign < now - stale:
        seconds = (now - last_sign).total_seconds()
        message = (
            f"The coordinator on {run.host or 'an unknown host'} sent no heartbeat for "
            f"{seconds:.0f} s; the partial log is kept."
        )
    if not message:
        return
    # Only if nothing moved since we looked: a heartbeat written meanwhile keeps the run.
    changed = Run.objects.filter(
        pk=run.pk, status=RunStatus.RUNNING, heartbeat_at=run.heartbeat_at
    ).update(
        status=RunStatus.FAILED,
        failure_code=FailureCode.COORDINATOR_LOST,
        failure_message=message,
        finished_at=now,
        phase=RunPhase.DONE,
    )
    if not changed:
        return
    report.coordinator_lost += 1
    report.lines.append(f"run {run.pk}: coordinator_lost ({message})")
    if not same_host:
        return  # Its processes and files live on another machine.
    # Nobody else will stop the agent now: its coordinator is gone (or hung).
    processes.kill_tree(run.agent_pid, run.agent_pid_create_time)
    processes.kill_tree(run.pid, run.pid_create_time)
    kept: dict[str, Any] = {}
    agent_log = (Path(run.run_dir) if run.run_dir else run_folder(run.pk)) / AGENT_LOG
    tail = read_tail(agent_log)
    if tail:
        kept["log_tail"] = tail
    runlogs.store_log(run.pk, agent_log)
    kept.update(_collect_partial_work(run))
    if kept:
        Run.objects.filter(
            pk=run.pk, status=RunStatus.FAILED, failure_code=FailureCode.COORDINATOR_LOST
        ).update(**kept)


def _collect_partial_work(run: Run) -> dict[str, Any]:
    """The diff a lost run's agent left in its worktree (work is kept, not lost), then the
    worktree is removed like any finished run's."""
    workspace = Path(run.workspace_path) if run.workspace_path else None
    repository = run.spec.repository
    baseline = run.spec.baseline_commit
    if workspace is None or not workspace.is_dir() or not repository or not baseline:
        return {}
    kept: dict[str, Any] = {}
    try:
        diff = repos.workspace_diff(
            Path(repository),
            workspace,
            baseline,
            private_objects=runfolder.collected_objects(workspace),
        )
        bounded = repos.bound_diff(diff, settings.REPLAYS_MAX_DIFF_BYTES)
        kept = {
            "diff": bounded.text,
            "diff_cut": bounded.cut,
            "files_changed": len(repos.changed_files(diff)),
        }
    except repos.GitError as exc:
        logger.warning("Run %s: the partial diff could not be collected: %s", run.pk, exc)
    if not settings.REPLAYS_KEEP_WORKSPACES:
        try:
            repos.remove_worktree(Path(repository), workspace)
        except repos.GitError as exc:
            logger.warning("Run %s: the worktree could not be removed: %s", run.pk, exc)
    return kept


# --- Cancel --------------------------------------------------------------------------


def _cancel_launching(run_id: int, now: datetime) -> int:
    return Run.objects.filter(pk=run_id, status=RunStatus.LAUNCHING).update(
        status=RunStatus.CANCELLED,
        finished_at=now,
        phase=RunPhase.DONE,
    )


def _cancel(runs: QuerySet[Run]) -> None:
    # Statuses only move forward (queued -> launching -> running), so these three steps in
    # that order catch a run that moves between them.
    now = timezone.now()
    # Nothing has started yet for queued and launching runs: they end at once. A launching
    # run's coordinator then finds its compare-and-set lost and exits without starting.
    for status in (RunStatus.QUEUED, RunStatus.LAUNCHING):
        runs.filter(status=status).update(
            status=RunStatus.CANCELLED,
            finished_at=now,
            phase=RunPhase.DONE,
            cancel_requested_at=Coalesce(F("cancel_requested_at"), Value(now)),
        )
    # The coordinator of a running run kills the agent's tree within one heartbeat.
    runs.filter(status=RunStatus.RUNNING, cancel_requested_at__isnull=True).update(
        cancel_requested_at=now
    )


def cancel_run(*, run: Run) -> Run:
    """Cancel one member (idempotent); finished runs are left as they are."""
    _cancel(Run.objects.filter(pk=run.pk))
    wakeups.request_dispatch()  # A slot may be free.
    run.refresh_from_db()
    return run


def cancel_batch(*, batch: Batch) -> Batch:
    """Cancel every member of a batch that has not finished (idempotent)."""
    _cancel(Run.objects.filter(batch=batch))
    wakeups.request_dispatch()
    return batch
