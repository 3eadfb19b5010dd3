"""kill -9 at each step of a launch: every member ends accounted for, none starts twice.

Real dispatchers, coordinators, agents and clusters stop at a named pause point
(REPLAYS_TEST_PAUSE_AT) and are killed there with SIGKILL. Afterwards every member
has ended (or carries its LaunchError), the agent start marker shows no member
started twice, and reconciling again and dispatching again relaunch nothing.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import dispatch, supervision
from replays.models import (
    FINISHED_RUN_STATUSES,
    FailureCode,
    LaunchError,
    LaunchErrorCode,
    Run,
    RunStatus,
)
from tests.test_cluster import start_cluster, stop_cluster
from tests.test_dispatch import Lab, finished, gone, make_lab, wait_until


@pytest.fixture
def lab(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> Lab:
    return make_lab(process_env, tmp_path, monkeypatch, settings)


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), seconds=5, what=f"pid {pid} to die")


def pause_in_children(lab: Lab, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Coordinators started by this process stop at `step` (this process never does)."""
    monkeypatch.setenv("REPLAYS_TEST_PAUSE_AT", step)
    monkeypatch.setenv("REPLAYS_TEST_PAUSE_FILE", str(lab.pause_file))


def assert_every_member_accounted_for(lab: Lab, runs: list[Run]) -> None:
    for run in runs:
        run.refresh_from_db()
        assert run.status in FINISHED_RUN_STATUSES, f"run {run.pk} is still {run.status}"
        errors = LaunchError.objects.filter(run=run).count()
        if run.failure_code == FailureCode.LAUNCH_FAILED:
            assert errors == 1
            assert run.pk not in lab.starts(), f"run {run.pk} failed to launch yet started"
        else:
            assert errors == 0
    assert all(count == 1 for count in lab.starts().values()), lab.starts()

    # Nothing relaunches: reconcile again and again, dispatch again.
    before = [(run.pk, run.status, run.failure_code) for run in runs]
    starts = lab.starts()
    for _ in range(3):
        report = dispatch.reconcile_runs()
        assert (report.launch_failed, report.coordinator_lost) == (0, 0)
    assert supervision.dispatch_runs() == []
    time.sleep(0.5)
    assert [
        (run.pk, run.status, run.failure_code)
        for run in Run.objects.filter(pk__in=[r.pk for r in runs]).order_by("id")
    ] == before
    assert lab.starts() == starts
    assert not Run.objects.filter(status__in=[RunStatus.LAUNCHING, RunStatus.RUNNING]).exists()


def test_dispatcher_killed_after_its_claim_fails_the_launch_and_nothing_starts(
    lab: Lab,
    user: User,
) -> None:
    _, runs = lab.batch(user, ["editor:m1", "editor:m2"])
    dispatcher = lab.start_dispatcher(pause_at="dispatch_after_claim")
    assert lab.paused_pid("dispatch_after_claim") == dispatcher.pid
    assert [Run.objects.get(pk=run.pk).status for run in runs] == [RunStatus.LAUNCHING] * 2

    dispatcher.kill()
    dispatcher.wait()
    report = dispatch.reconcile_runs()

    assert report.launch_failed == 2
    for run in runs:
        run.refresh_from_db()
        assert run.failure_code == FailureCode.LAUNCH_FAILED
        assert run.failure_message == "Launcher stopped before the agent started"
        assert LaunchError.objects.get(run=run).code == LaunchErrorCode.LAUNCHER_LOST
    assert_every_member_accounted_for(lab, runs)
    assert lab.starts() == {}


@pytest.mark.parametrize(
    "coordinator_first", [False, True], ids=["reconcile-first", "coordinator-first"]
)
def test_dispatcher_killed_after_spawning_leaves_one_outcome_per_member(
    lab: Lab,
    user: User,
    coordinator_first: bool,
) -> None:
    _, runs = lab.batch(user, ["editor:m1", "editor:m2"])
    dispatcher = lab.start_dispatcher(pause_at="dispatch_after_spawn")
    lab.paused_pid("dispatch_after_spawn")
    dispatcher.kill()
    dispatcher.wait()
    # The first member's coordinator is running on its own; the second was never spawned.
    if coordinator_first:
        wait_until(
            lambda: Run.objects.get(pk=runs[0].pk).status != RunStatus.LAUNCHING,
            what="the orphaned coordinator to start its run",
        )

    dispatch.reconcile_runs()

    wait_until(lambda: lab.coordinator_done(runs[0]), what="the orphaned coordinator to end")
    wait_until(lambda: finished(runs[0]), what="the first member to end")
    first, second = (Run.objects.get(pk=run.pk) for run in runs)
    assert second.failure_code == FailureCode.LAUNCH_FAILED
    if coordinator_first:
        assert first.status == RunStatus.COMPLETED
    if first.status == RunStatus.COMPLETED:  # the coordinator won the race
        assert lab.starts() == {first.pk: 1}
        assert "CHANGES.md" in first.diff
    else:  # reconcile won: the coordinator found the run failed and never started it
        assert first.failure_code == FailureCode.LAUNCH_FAILED
        assert lab.starts() == {}
        assert (
            f"Run {first.pk}: not started" in (lab.run_dir(first) / "coordinator.log").read_text()
        )
    assert_every_member_accounted_for(lab, runs)


def test_coordinator_killed_before_start_fails_the_launch(
    lab: Lab,
    user: User,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, [run] = lab.batch(user, ["editor:m1"])
    pause_in_children(lab, monkeypatch, "coordinator_before_start")
    assert supervision.dispatch_runs() == [run.pk]
    coordinator = lab.paused_pid("coordinator_before_start")
    run.refresh_from_db()
    assert (run.status, run.pid) == (RunStatus.LAUNCHING, coordinator)
    # Alive but not yet started (within the grace period): reconcile leaves it.
    assert dispatch.reconcile_runs().launch_failed == 0

    kill9(coordinator)
    report = dispatch.reconcile_runs()

    assert report.launch_failed == 1
    run.refresh_from_db()
    assert run.failure_code == FailureCode.LAUNCH_FAILED
    error = LaunchError.objects.get(run=run)
    assert error.code == LaunchErrorCode.LAUNCH_FAILED
    assert f"the coordinator (pid {coordinator}) exited" in error.message
    assert_every_member_accounted_for(lab, [run])
    assert lab.starts() == {}


def test_coordinator_killed_before_the_agent_loses_the_run_without_starting_it(
    lab: Lab,
    user: User,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, [run] = lab.batch(user, ["sleeper:m1"])
    pause_in_children(lab, monkeypatch, "coordinator_before_agent")
    supervision.dispatch_runs()
    coordinator = lab.paused_pid("coordinator_before_agent")
    assert dispatch.reconcile_runs().coordinator_lost == 0  # alive: left alone

    kill9(coordinator)
    report = dispatch.reconcile_runs()

    assert report.coordinator_lost == 1
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.COORDINATOR_LOST
    assert f"pid {coordinator}" in run.failure_message
    assert not LaunchError.objects.exists()
    assert_every_member_accounted_for(lab, [run])
    assert lab.starts() == {}


def test_coordinator_killed_while_the_agent_runs_loses_the_run_ends_the_tree_keeps_the_log(
    lab: Lab,
    user: User,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _, [run] = lab.batch(user, ["sleeper:m1"])
    pause_in_children(lab, monkeypatch, "coordinator_agent_running")
    supervision.dispatch_runs()
    coordinator = lab.paused_pid("coordinator_agent_running")
    tree = wait_until(lambda: lab.agent_pids(run), what="the agent tree")
    wait_until(
        lambda: "sleeping" in (lab.run_dir(run) / "agent.log").read_text(),
        what="the agent's log line",
    )

    # What the agent did so far (as if it had written it): a crash must not lose it.
    workspace = Path(Run.objects.get(pk=run.pk).workspace_path)
    (workspace / "PARTIAL.md").write_text("half of the work\n")

    kill9(coordinator)
    # The sandbox dies with the coordinator that started it: no orphan runs on, spending.
    wait_until(lambda: all(gone(pid) for pid in tree), what="the agent tree to end with it")
    report = dispatch.reconcile_runs()

    assert report.coordinator_lost == 1
    run.refresh_from_db()
    assert run.failure_code == FailureCode.COORDINATOR_LOST
    assert "Started a child and a grandchild; sleeping." in run.log_tail
    assert "+half of the work" in run.diff and run.files_changed == 1
    assert not workspace.exists()  # the worktree is removed once its diff is stored
    assert all(gone(pid) for pid in tree), "the lost coordinator's agent tree is still running"
    assert_every_member_accounted_for(lab, [run])
    assert lab.starts() == {run.pk: 1}


def test_a_cluster_killed_while_launching_a_batch_leaves_every_member_accounted_for(
    lab: Lab,
    user: User,
) -> None:
    _, runs = lab.batch(user, ["editor:m1", "editor:m2", "editor:m3"])
    env = {
        **lab.env,
        "REPLAYS_MAX_PARALLEL_RUNS": "3",
        "REPLAYS_MAX_RUNS_PER_HOST": "3",
        "REPLAYS_TEST_PAUSE_AT": "dispatch_after_spawn",
        "REPLAYS_TEST_PAUSE_FILE": str(lab.pause_file),
    }
    cluster = start_cluster(env)
    try:
        lab.paused_pid("dispatch_after_spawn", seconds=30)
        assert Run.objects.filter(status=RunStatus.QUEUED).count() == 0
    finally:
        os.killpg(cluster.pid, signal.SIGKILL)  # the whole cluster: main, sentinel, workers
        cluster.wait()

    cluster = start_cluster(lab.env)  # its first worker reconciles and dispatches
    try:
        wait_until(
            lambda: all(finished(run) for run in runs), seconds=30, what="every member to end"
        )
        wait_until(lambda: lab.coordinator_done(runs[0]), what="the orphaned coordinator to end")
    finally:
        stop_cluster(cluster)

    first, *others = (Run.objects.get(pk=run.pk) for run in runs)
    assert [run.failure_code for run in others] == [FailureCode.LAUNCH_FAILED] * 2
    assert first.status in (RunStatus.COMPLETED, RunStatus.FAILED)
    assert_every_member_accounted_for(lab, runs)


def test_a_pause_variable_that_leaks_into_a_deployment_does_nothing(
    process_env: dict[str, str], tmp_path: Path
) -> None:
    """Only tests/settings.py turns the pause points on: under the deployment's settings a
    REPLAYS_TEST_PAUSE_AT in the environment neither stops a process nor writes a file."""
    import subprocess
    import sys

    manage = Path(__file__).resolve().parent.parent / "manage.py"
    pause_file = tmp_path / "paused"
    probe = "from replays import processes; processes.pause_point('dispatch_after_claim'); print('went on')"
    env = {**process_env, "REPLAYS_TEST_PAUSE_AT": "dispatch_after_claim",
           "REPLAYS_TEST_PAUSE_FILE": str(pause_file)}  # fmt: skip
    deployed = subprocess.run(
        [sys.executable, str(manage), "shell", "-c", probe],
        env={**env, "DJANGO_SETTINGS_MODULE": "replaysite.settings"},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert deployed.returncode == 0 and "went on" in deployed.stdout
    assert not pause_file.exists()
    tested = subprocess.Popen(
        [sys.executable, str(manage), "shell", "-c", probe],
        env={**env, "DJANGO_SETTINGS_MODULE": "tests.settings"},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        wait_until(pause_file.exists, seconds=30, what="the test settings' pause")
    finally:
        tested.kill()
        tested.communicate()
