"""A cluster that takes no task any more still starts queued runs: the host loop dispatches.

A django-q2 worker SIGKILLed while it waits for a task holds the task queue's read lock
(multiprocessing.Queue.get reads under it), and the worker that replaces it waits on that
lock for ever: every process looks alive, and no task runs again (django-q2 #23). Here
it is done for real (every process below the sentinel killed at once, so the one holding
the lock is among them) and a run approved afterwards must still start and finish.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from django_q.models import OrmQ

from replays import supervision, wakeups
from replays.models import Host, Run, RunStatus
from tests.faults import below_sentinel
from tests.test_cluster import stop_cluster
from tests.test_dispatch import MANAGE, Lab, finished, queued_runs, wait_until
from tests.test_dispatch import lab as lab  # noqa: F401 (the fixture)


def start_logged_cluster(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, str(MANAGE), "qcluster"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def test_a_cluster_stuck_on_its_queue_lock_still_starts_what_is_approved(
    lab: Lab, user: User, monkeypatch: pytest.MonkeyPatch
) -> None:
    lab.env["REPLAYS_DISPATCH_STALL_SECONDS"] = "2"
    log = lab.root / "cluster.log"
    cluster = start_logged_cluster(lab.env, log)
    try:
        wait_until(lambda: Host.objects.exists(), seconds=30, what="the cluster's host loop")
        killed = below_sentinel(cluster.pid)
        assert len(killed) >= 3  # two workers, the pusher, the monitor
        for process in killed:
            os.kill(process.pid, signal.SIGKILL)

        def replaced() -> bool:
            now = {p.pid for p in below_sentinel(cluster.pid)}
            return len(now) >= len(killed) and not now & {p.pid for p in killed}

        wait_until(replaced, seconds=30, what="the sentinel to replace what was killed")

        _, [run] = lab.batch(user, ["editor:m1"])
        wakeups.request_dispatch()  # as approval does: a task nobody will take now
        wait_until(lambda: finished(run), seconds=60, what="the run to start and finish")

        run.refresh_from_db()
        assert run.status == RunStatus.COMPLETED, run.failure_message
        assert lab.starts() == {run.pk: 1}
        # The loop started it, not a task: the dispatch asked for was never done (an
        # ORM-broker task stays in its table until a worker finished it).
        assert "no dispatch came from the task queue: the loop dispatched it" in (log.read_text())
        assert OrmQ.objects.count() >= 1
    finally:
        stop_cluster(cluster)


def test_the_loop_waits_for_the_stall_limit_and_never_dispatches_into_a_full_host(
    transactional_db: None, user: User, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.REPLAYS_DISPATCH_STALL_SECONDS = 20
    settings.REPLAYS_MAX_PARALLEL_RUNS = 1
    started: list[str] = []
    monkeypatch.setattr(supervision, "dispatch_runs", lambda **_: started.append("yes") or [1])
    monkeypatch.setattr(supervision, "_waiting_since", None)
    [first, _] = queued_runs(user, 2)

    assert supervision.dispatch_if_stalled(now=100.0) == []  # it starts waiting
    assert supervision.dispatch_if_stalled(now=119.0) == []  # not long enough
    assert supervision.dispatch_if_stalled(now=120.5) == [1] and started == ["yes"]

    # A full host: the queued run waits for a slot, not for a dispatch.
    Run.objects.filter(pk=first.pk).update(status=RunStatus.RUNNING)
    for now in (200.0, 300.0, 400.0):
        assert supervision.dispatch_if_stalled(now=now) == []
    # The slot frees: the wait starts again from there, not from before.
    Run.objects.filter(pk=first.pk).update(status=RunStatus.COMPLETED, finished_at=timezone.now())
    assert supervision.dispatch_if_stalled(now=500.0) == []
    assert supervision.dispatch_if_stalled(now=519.0) == []
    assert supervision.dispatch_if_stalled(now=521.0) == [1] and started == ["yes", "yes"]
