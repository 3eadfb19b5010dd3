"""Cancel: a queued member ends at once and never starts; a running one is stopped, tree and all."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from replays import dispatch, supervision, tasks
from replays.factories.runs import make_run_graph
from replays.models import FailureCode, Run, RunPhase, RunStatus
from tests.conftest import is_within
from tests.test_dispatch import Lab, finished, gone, make_lab, wait_until


@pytest.fixture
def lab(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
) -> Lab:
    return make_lab(process_env, tmp_path, monkeypatch, settings)


def test_capacity_n_starts_n_members_and_the_rest_start_in_order_as_slots_free(
    lab: Lab,
    user: User,
) -> None:
    batch, runs = lab.batch(user, ["sleeper:m1", "sleeper:m2", "sleeper:m3", "sleeper:m4"])

    assert supervision.dispatch_runs() == [runs[0].pk, runs[1].pk]
    wait_until(lambda: all(lab.agent_pids(run) for run in runs[:2]), what="two agents")
    for run in runs[2:]:
        run.refresh_from_db()
        assert (run.status, run.phase) == (RunStatus.QUEUED, RunPhase.QUEUED)
    assert dispatch.capacity_snapshot()["free"] == 0

    # A queued member is cancelled at once and never starts.
    third = dispatch.cancel_run(run=runs[2])
    assert third.status == RunStatus.CANCELLED
    assert third.phase == RunPhase.DONE and third.finished_at is not None

    # Cancelling a running member frees its slot; the next queued member (not the
    # cancelled one) starts when dispatch runs again.
    first_tree = lab.agent_pids(runs[0])
    dispatch.cancel_run(run=runs[0])
    wait_until(lambda: finished(runs[0]), what="the running member to stop")
    assert runs[0].status == RunStatus.CANCELLED
    wait_until(lambda: all(gone(pid) for pid in first_tree), what="its agent tree to stop")

    assert tasks.dispatch_runs_task() == [runs[3].pk]
    wait_until(lambda: lab.agent_pids(runs[3]), what="the fourth agent")
    assert tasks.dispatch_runs_task() == []
    assert lab.starts() == {runs[0].pk: 1, runs[1].pk: 1, runs[3].pk: 1}

    trees = [pid for run in (runs[1], runs[3]) for pid in lab.agent_pids(run)]
    dispatch.cancel_batch(batch=batch)
    wait_until(lambda: all(finished(run) for run in runs), what="the batch to stop")
    assert [run.status for run in runs] == [RunStatus.CANCELLED] * 4
    wait_until(lambda: all(gone(pid) for pid in trees), what="every agent tree to stop")
    assert runs[2].pk not in lab.starts()


def test_cancelling_a_running_member_leaves_no_process_behind_and_is_idempotent(
    lab: Lab,
    user: User,
) -> None:
    _, [run] = lab.batch(user, ["sleeper:m1"])
    supervision.dispatch_runs()
    agent, child, grandchild = wait_until(lambda: lab.agent_pids(run), what="the agent tree")
    run.refresh_from_db()
    coordinator = run.pid
    assert run.status == RunStatus.RUNNING and is_within(agent, run.agent_pid)

    requested = dispatch.cancel_run(run=run).cancel_requested_at
    assert requested is not None
    assert dispatch.cancel_run(run=run).cancel_requested_at == requested  # idempotent

    wait_until(lambda: finished(run), seconds=10, what="the cancel to land")
    assert run.status == RunStatus.CANCELLED
    assert run.failure_code == FailureCode.NONE
    assert run.finished_at is not None and run.phase == RunPhase.DONE
    wait_until(
        lambda: all(gone(pid) for pid in (agent, child, grandchild, coordinator)),
        what="the coordinator and the agent's child and grandchild to stop",
    )
    assert lab.starts() == {run.pk: 1}

    again = dispatch.cancel_run(run=run)
    assert (again.status, again.cancel_requested_at, again.finished_at) == (
        RunStatus.CANCELLED,
        requested,
        run.finished_at,
    )


def test_cancelling_finished_runs_changes_nothing(transactional_db: None, user: User) -> None:
    _, runs = make_run_graph(
        owner=user,
        repo=Path("/nonexistent/repo"),
        baseline="0" * 40,
        ending="1" * 40,
        models=["a", "b", "c"],
        result_sha256="0" * 64,
    )
    ended = timezone.now()
    Run.objects.filter(pk=runs[0].pk).update(
        status=RunStatus.COMPLETED, phase=RunPhase.DONE, finished_at=ended, diff="x"
    )
    Run.objects.filter(pk=runs[1].pk).update(
        status=RunStatus.FAILED,
        phase=RunPhase.DONE,
        finished_at=ended,
        failure_code=FailureCode.AGENT_ERROR,
        failure_message="no",
    )
    Run.objects.filter(pk=runs[2].pk).update(
        status=RunStatus.CANCELLED, phase=RunPhase.DONE, finished_at=ended
    )
    before = list(Run.objects.order_by("id").values())

    for run in runs:
        dispatch.cancel_run(run=run)
    dispatch.cancel_batch(batch=runs[0].batch)

    assert list(Run.objects.order_by("id").values()) == before


def test_cancelling_a_batch_ends_queued_and_launching_members_at_once(
    transactional_db: None, user: User
) -> None:
    batch, runs = make_run_graph(
        owner=user,
        repo=Path("/nonexistent/repo"),
        baseline="0" * 40,
        ending="1" * 40,
        models=["a", "b", "c"],
        result_sha256="0" * 64,
    )
    [launching] = dispatch.claim_queued_runs(limit=1)  # claimed, its coordinator not started

    dispatch.cancel_batch(batch=batch)
    dispatch.cancel_batch(batch=batch)

    for run in runs:
        run.refresh_from_db()
        assert run.status == RunStatus.CANCELLED
        assert run.finished_at is not None and run.cancel_requested_at is not None
    # A coordinator started late for the claimed one finds nothing to start.
    assert Run.objects.filter(pk=launching.pk, status=RunStatus.LAUNCHING).count() == 0
    assert dispatch.claim_queued_runs() == []
