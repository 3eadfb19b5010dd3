"""Reconcile ends runs whose launcher or coordinator is gone, and never relaunches anything.

Real processes stand in for launchers, coordinators and agents: they are started,
killed and then looked for again. Old claims and heartbeats are written on the rows.
"""

from __future__ import annotations

import io
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.utils import timezone

from replays import dispatch, processes, runlogs, supervision, tasks
from replays.factories.runs import make_run_graph
from replays.models import (
    FailureCode,
    LaunchError,
    LaunchErrorCode,
    Run,
    RunLog,
    RunPhase,
    RunStatus,
)

# A process with a child and a grandchild, all asleep; it writes their pids to argv[1].
SLEEPING_TREE = """
import os, subprocess, sys, time
pid_file, depth, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if depth < 2:
    subprocess.Popen([sys.executable, "-c", code, pid_file, str(depth + 1), code])
with open(pid_file, "a") as pids:
    pids.write(f"{os.getpid()}\\n")
print(f"level {depth} asleep", flush=True)
time.sleep(600)
"""


def start_tree(tmp_path: Path, log: Path) -> tuple[processes.ProcessIdentity, list[int]]:
    pid_file = tmp_path / f"tree-{time.monotonic_ns()}.pids"
    _, identity = processes.spawn(
        [sys.executable, "-c", SLEEPING_TREE, str(pid_file), "0", SLEEPING_TREE],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        log_path=log,
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = [int(line) for line in pid_file.read_text().split()] if pid_file.exists() else []
        if len(pids) == 3:
            return identity, pids
        time.sleep(0.05)
    pytest.fail("the sleeping tree did not start")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def dead_identity() -> processes.ProcessIdentity:
    """The identity a process had; it has exited since."""
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    identity = processes.identity_of(process.pid) or processes.ProcessIdentity(process.pid, 1.0)
    process.wait()
    return identity


def one_run(owner: User, **values: Any) -> Run:
    _, [run] = make_run_graph(
        owner=owner,
        repo=Path("/nonexistent/repo"),
        baseline="0" * 40,
        ending="1" * 40,
        models=["empty"],
        result_sha256="0" * 64,
    )
    Run.objects.filter(pk=run.pk).update(**values)
    run.refresh_from_db()
    return run


def launching(
    owner: User,
    settings: Any,
    *,
    launcher: processes.ProcessIdentity,
    host: str | None = None,
    **values: Any,
) -> Run:
    host = host or settings.REPLAYS_HOST_NAME
    return one_run(
        owner,
        status=RunStatus.LAUNCHING,
        host=host,
        launcher=f"{host}:{launcher}",
        claimed_at=timezone.now(),
        **values,
    )


def test_a_launching_run_whose_launcher_died_before_spawning_fails_once(
    transactional_db: None, user: User, settings: Any
) -> None:
    run = launching(user, settings, launcher=dead_identity())

    report = dispatch.reconcile_runs()

    assert (report.launch_failed, report.coordinator_lost) == (1, 0)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.LAUNCH_FAILED
    assert run.failure_message == "Launcher stopped before the agent started"
    assert run.phase == RunPhase.DONE and run.finished_at is not None
    error = LaunchError.objects.get(run=run)
    assert error.code == LaunchErrorCode.LAUNCHER_LOST
    assert error.message.startswith("Launcher stopped before the agent started: the launcher ")
    assert error.host == settings.REPLAYS_HOST_NAME
    # Again and again: nothing more happens, nothing is relaunched.
    for _ in range(3):
        assert dispatch.reconcile_runs().launch_failed == 0
    assert supervision.dispatch_runs() == []
    assert LaunchError.objects.count() == 1
    assert Run.objects.get(pk=run.pk).status == RunStatus.FAILED


def test_a_launching_run_with_a_live_launcher_or_coordinator_is_left_alone(
    transactional_db: None, user: User, settings: Any, tmp_path: Path
) -> None:
    # The launcher (this process) is still between claim and spawn.
    claimed = launching(user, settings, launcher=processes.own_identity())
    # Its launcher died, but the coordinator it started lives and will move it on.
    coordinator, _ = start_tree(tmp_path, tmp_path / "coordinator.log")
    try:
        started = launching(
            user,
            settings,
            launcher=dead_identity(),
            pid=coordinator.pid,
            pid_create_time=coordinator.create_time,
        )

        report = dispatch.reconcile_runs()

        assert (report.launch_failed, report.coordinator_lost) == (0, 0)
        assert Run.objects.get(pk=claimed.pk).status == RunStatus.LAUNCHING
        assert Run.objects.get(pk=started.pk).status == RunStatus.LAUNCHING

        # Past the grace period no coordinator reported: the launch failed, alive or not.
        old = timezone.now() - timedelta(seconds=settings.REPLAYS_LAUNCH_GRACE_SECONDS + 1)
        Run.objects.filter(pk__in=[claimed.pk, started.pk]).update(claimed_at=old)
        assert dispatch.reconcile_runs().launch_failed == 2
        assert set(LaunchError.objects.values_list("code", flat=True)) == {"launch_failed"}
        assert "no coordinator reported within" in LaunchError.objects.first().message
    finally:
        processes.kill_tree(coordinator.pid, coordinator.create_time, grace_seconds=1)


def test_a_launching_run_whose_coordinator_died_before_starting_fails(
    transactional_db: None, user: User, settings: Any
) -> None:
    # The launcher lives on (a cluster worker) and recorded the coordinator, which is gone.
    coordinator = dead_identity()
    run = launching(
        user,
        settings,
        launcher=processes.own_identity(),
        pid=coordinator.pid,
        pid_create_time=coordinator.create_time,
    )

    assert dispatch.reconcile_runs().launch_failed == 1

    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.failure_code == FailureCode.LAUNCH_FAILED
    assert LaunchError.objects.get(run=run).code == LaunchErrorCode.LAUNCH_FAILED


def test_a_launching_run_on_another_host_fails_only_after_the_grace_period(
    transactional_db: None, user: User, settings: Any
) -> None:
    # Another machine's processes cannot be looked at: a dead-looking pid here means nothing.
    run = launching(user, settings, launcher=dead_identity(), host="elsewhere")
    assert dispatch.reconcile_runs().launch_failed == 0
    assert Run.objects.get(pk=run.pk).status == RunStatus.LAUNCHING

    Run.objects.filter(pk=run.pk).update(
        claimed_at=timezone.now() - timedelta(seconds=settings.REPLAYS_LAUNCH_GRACE_SECONDS + 1)
    )
    assert dispatch.reconcile_runs().launch_failed == 1
    error = LaunchError.objects.get(run=run)
    assert (error.code, error.host) == (LaunchErrorCode.LAUNCH_FAILED, "elsewhere")


def test_a_launching_run_with_a_cancel_request_and_no_launcher_ends_cancelled(
    transactional_db: None, user: User, settings: Any
) -> None:
    run = launching(user, settings, launcher=dead_identity(), cancel_requested_at=timezone.now())
    report = dispatch.reconcile_runs()
    assert (report.cancelled, report.launch_failed) == (1, 0)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at is not None
    assert not LaunchError.objects.exists()


def test_a_running_run_whose_coordinator_died_is_lost_its_agent_killed_and_its_log_kept(
    transactional_db: None, user: User, settings: Any, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    agent, tree = start_tree(tmp_path, run_dir / "agent.log")
    coordinator = dead_identity()
    run = one_run(
        user,
        status=RunStatus.RUNNING,
        phase=RunPhase.IMPLEMENTING,
        host=settings.REPLAYS_HOST_NAME,
        pid=coordinator.pid,
        pid_create_time=coordinator.create_time,
        agent_pid=agent.pid,
        agent_pid_create_time=agent.create_time,
        run_dir=str(run_dir),
        claimed_at=timezone.now(),
        started_at=timezone.now(),
        heartbeat_at=timezone.now(),
    )

    report = dispatch.reconcile_runs()

    assert (report.launch_failed, report.coordinator_lost) == (0, 1)
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.COORDINATOR_LOST
    assert f"pid {coordinator.pid}" in run.failure_message
    assert "partial log is kept" in run.failure_message
    assert run.phase == RunPhase.DONE and run.finished_at is not None
    assert "level 0 asleep" in run.log_tail and "level 2 asleep" in run.log_tail
    # The whole partial log is in the database too, for pages on any machine.
    assert "level 0 asleep" in (runlogs.log_text(run) or "")
    assert RunLog.objects.filter(run=run).exists()
    assert all(gone(pid) for pid in tree), "the agent's tree outlived its lost coordinator"
    assert not LaunchError.objects.exists()  # it did start
    assert dispatch.reconcile_runs().coordinator_lost == 0


def test_a_running_run_is_lost_when_its_heartbeat_is_stale_on_any_host(
    transactional_db: None, user: User, settings: Any, tmp_path: Path
) -> None:
    # On another machine: the heartbeat is all there is to go by. A local process with the
    # recorded agent pid is not that machine's agent and stays untouched.
    agent, tree = start_tree(tmp_path, tmp_path / "agent.log")
    try:
        stale = timezone.now() - timedelta(seconds=settings.REPLAYS_HEARTBEAT_STALE_SECONDS + 5)
        fresh_remote = one_run(
            user,
            status=RunStatus.RUNNING,
            host="elsewhere",
            pid=1,
            pid_create_time=1.0,
            heartbeat_at=timezone.now(),
        )
        stale_remote = one_run(
            user,
            status=RunStatus.RUNNING,
            host="elsewhere",
            pid=1,
            pid_create_time=1.0,
            heartbeat_at=stale,
            agent_pid=agent.pid,
            agent_pid_create_time=agent.create_time,
            log_tail="kept",
        )
        # Here, with a live coordinator: a fresh heartbeat keeps it.
        live = processes.own_identity()
        fresh_local = one_run(
            user,
            status=RunStatus.RUNNING,
            host=settings.REPLAYS_HOST_NAME,
            pid=live.pid,
            pid_create_time=live.create_time,
            heartbeat_at=timezone.now(),
        )

        report = dispatch.reconcile_runs()

        assert report.coordinator_lost == 1
        assert Run.objects.get(pk=fresh_remote.pk).status == RunStatus.RUNNING
        assert Run.objects.get(pk=fresh_local.pk).status == RunStatus.RUNNING
        lost = Run.objects.get(pk=stale_remote.pk)
        assert lost.status == RunStatus.FAILED
        assert lost.failure_code == FailureCode.COORDINATOR_LOST
        assert "sent no heartbeat" in lost.failure_message and "elsewhere" in lost.failure_message
        assert lost.log_tail == "kept"  # the last tail its coordinator wrote
        assert not any(gone(pid) for pid in tree)
    finally:
        processes.kill_tree(agent.pid, agent.create_time, grace_seconds=1)


def test_queued_runs_are_left_alone_and_the_command_says_what_it_did(
    transactional_db: None, user: User, settings: Any
) -> None:
    queued = one_run(user)
    lost = launching(user, settings, launcher=dead_identity())

    out = io.StringIO()
    call_command("reconcile_runs", stdout=out)

    assert Run.objects.get(pk=queued.pk).status == RunStatus.QUEUED
    assert Run.objects.get(pk=lost.pk).status == RunStatus.FAILED
    text = out.getvalue()
    assert f"run {lost.pk}: launch_failed" in text
    assert "Reconciled: 1 launch_failed, 0 coordinator_lost, 0 cancelled, 0 judgments lost." in text
    # The task is the same service, short and repeatable.
    assert tasks.reconcile_runs_task() == {
        "launch_failed": 0,
        "coordinator_lost": 0,
        "cancelled": 0,
        "judgments_lost": 0,
        "lines": [],
    }
