"""One run end to end, in its own process (`manage.py run_coordinator RUN_ID`, or forked
by replays.supervision).

Dispatch claims a run (queued -> launching) and a coordinator is started for it. The
first write here is a compare-and-set launching -> running: only the process that wins
it ever starts the agent, so a member starts at most once however often a coordinator is
started for it. Every later write is conditional on the run still being running: a
reconcile may have failed it meanwhile, and then this process stops its agent and leaves
the row alone.

The rooms inside: `member` (the run's steps in order and its row writes), `supervisor`
(one agent process: started, watched, stopped), `turns` (what the turns add up to and
what the ending makes of it), `rows` (conditional writes, heartbeats, outages). Anything
that goes wrong on our side fails the run as `infrastructure` with the reason; nothing
ends in a silent crash.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType
from typing import Any

from django.conf import settings
from django.db import connections
from django.utils import timezone

from replays import processes, runfolder, wakeups
from replays.coordinator.member import CoordinatorStopped, Member, describe
from replays.models import Run, RunPhase, RunStatus
from replays.processes import pause_point
from replays.runfolder import WORKSPACE

logger = logging.getLogger(__name__)


def run_member(*, run_id: int) -> str:
    """Run one launching member to its end. Returns what happened, for the command's output.

    Does nothing (and returns "not started") when the run is not launching: another
    coordinator owns it, a reconcile failed it, or it was cancelled before it started.
    """
    try:
        pause_point("coordinator_before_start")
        if not _start(run_id):
            if _cancel_before_start(run_id):
                _next_dispatch()
                return "cancelled before start"
            return "not started"
        run = Run.objects.select_related("thread", "batch").get(pk=run_id)
        previous = _stop_on_signals()
        try:
            result = Member(run).execute()
        finally:
            _restore_signals(previous)
        _next_dispatch()
        return result
    finally:
        connections.close_all()


def _start(run_id: int) -> bool:
    """The compare-and-set that makes a member start at most once."""
    me = processes.own_identity()
    now = timezone.now()
    run_dir = runfolder.run_folder(run_id)
    started = Run.objects.filter(
        pk=run_id, status=RunStatus.LAUNCHING, cancel_requested_at__isnull=True
    ).update(
        status=RunStatus.RUNNING,
        phase=RunPhase.WORKSPACE,
        pid=me.pid,
        pid_create_time=me.create_time,
        host=settings.REPLAYS_HOST_NAME,
        started_at=now,
        heartbeat_at=now,
        run_dir=str(run_dir),
        workspace_path=str(run_dir / WORKSPACE),
    )
    return started == 1


def _cancel_before_start(run_id: int) -> bool:
    now = timezone.now()
    cancelled = Run.objects.filter(
        pk=run_id, status=RunStatus.LAUNCHING, cancel_requested_at__isnull=False
    ).update(status=RunStatus.CANCELLED, phase=RunPhase.DONE, finished_at=now, heartbeat_at=now)
    return cancelled == 1


def _next_dispatch() -> None:
    """A run ended (capacity freed): ask for the next dispatch. Never fails the coordinator."""
    try:
        wakeups.request_dispatch_if_waiting()
    except Exception as exc:  # noqa: BLE001 - the schedule dispatches later anyway
        logger.warning("Could not request a dispatch: %s", describe(exc))


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM/SIGINT become an exception, so the agent is stopped and the run failed cleanly."""

    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return  # already stopping the agent and writing the result: let that finish
        stopping = True
        raise CoordinatorStopped(
            f"The coordinator was stopped ({signal.Signals(signum).name}) while the run was active."
        )

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, stop)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)
