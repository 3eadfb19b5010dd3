"""django-q2 entry points: thin, short and idempotent; the services decide.

django-q2 may deliver a task twice or lose one (FACTS.md). Dispatch claims with a
compare-and-set, so a second delivery claims nothing; the schedules below make a
lost delivery late, not lost.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from replays import dispatch, hosts

logger = logging.getLogger(__name__)

# Schedule name -> task, every minute. Reconcile has no schedule: every cluster runs it for
# its own host every few seconds (host_loop below).
SCHEDULES = {
    "replays: dispatch queued runs": "replays.tasks.dispatch_runs_task",
}
# Schedules of earlier versions, removed where they exist.
RETIRED_SCHEDULES = ["replays: reconcile runs"]


def dispatch_runs_task() -> list[int]:
    return dispatch.dispatch_runs()


def reconcile_runs_task() -> dict[str, Any]:
    return dispatch.reconcile_runs().as_dict()


def ensure_schedules(*, using: str = DEFAULT_DB_ALIAS) -> None:
    """Create or update the every-minute schedules (idempotent; run after migrate)."""
    from django_q.models import Schedule

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return  # django_q is not migrated (yet) on this database.
    Schedule.objects.using(using).filter(name__in=RETIRED_SCHEDULES).delete()
    for name, func in SCHEDULES.items():
        existing = list(Schedule.objects.using(using).filter(name=name).order_by("id"))
        for duplicate in existing[1:]:
            duplicate.delete()
        Schedule.objects.using(using).update_or_create(
            name=name,
            defaults={"func": func, "schedule_type": Schedule.MINUTES, "minutes": 1, "repeats": -1},
        )


def create_schedules_after_migrate(
    sender: Any, using: str = DEFAULT_DB_ALIAS, **kwargs: Any
) -> None:
    ensure_schedules(using=using)


def reconcile_at_cluster_start(sender: Any, proc_name: str = "", **kwargs: Any) -> None:
    """django-q2's post_spawn handler: start this worker's host loop (once per process).

    django-q2 1.11 has no "cluster started" signal; post_spawn is sent in every worker
    process as it starts (also when a worker is recycled or reincarnated). Every worker
    starts a loop thread, and the thread holding this host's lock (see `host_loop`) does
    the work: at its first turn the cluster's start (report the host, reconcile, dispatch),
    then every few seconds the host's report and reconcile. A worker that dies releases the
    lock with its process, and a sibling's thread takes the work over at its next turn.
    """
    if _host_loop_started.is_set():
        return
    _host_loop_started.set()
    os.register_at_fork(
        before=_turn_lock.acquire,
        after_in_parent=_turn_lock.release,
        after_in_child=_turn_lock.release,
    )
    threading.Thread(target=host_loop, name="replays-host-loop", daemon=True).start()


# Held by the loop thread for the whole of a turn's database work, and taken by any fork
# of this worker process (a coordinator, REPLAYS_FORK_COORDINATORS) until the fork is done:
# a forked child must not inherit the thread's open connection (SQLite's own lock state
# is copied with it, and the child's first write then finds the database locked), so a
# fork waits for the turn to end, and a turn closes its connections before it lets go.
_turn_lock = threading.Lock()


# Set in a worker process once its loop thread runs (a fork starts with it clear: the
# sentinel never starts a loop).
_host_loop_started = threading.Event()


def host_loop_seconds() -> float:
    """How often a cluster reports its host and reconciles: every heartbeat, so a run whose
    coordinator died on this host fails within a heartbeat or two (not one minute)."""
    return max(1.0, float(settings.REPLAYS_HEARTBEAT_SECONDS))


def host_loop(*, turns: int | None = None) -> None:
    """Report this host and reconcile, forever (or `turns` times), in whichever worker of
    this host holds the host's lock. Reconcile judges this host's runs by pid and create
    time and other hosts' runs by heartbeat age only, so running it on every host (not one
    global schedule that may land anywhere) is what makes a dead coordinator on any machine
    fail fast. Never raises: a failed turn is logged and the next one tries again."""
    lock = None
    count = 0
    while turns is None or count < turns:
        count += 1
        try:
            first = lock is None
            if first:
                lock = _take_host_lock()
            if lock is not None:
                # The agents' --version runs (a few seconds at worst, cached for minutes)
                # come before the turn, so a fork never waits for them.
                hosts.agent_versions()
                with _turn_lock:
                    try:
                        host_loop_turn(first=first)
                    finally:
                        connections.close_all()  # this thread's connections only
        except Exception:
            logger.exception("The host loop's turn failed; it tries again")
        time.sleep(host_loop_seconds())


def host_loop_turn(*, first: bool) -> dict[str, Any]:
    """One turn: report the host, reconcile, and ask for a dispatch at the cluster's start
    or when reconcile freed a slot (the schedule would otherwise take up to a minute).
    The dispatch is a task, run by a worker's main thread: coordinators are forked from
    there. Only when the task queue has stalled does this thread dispatch itself
    (`dispatch_if_stalled`)."""
    hosts.report_host()
    report = dispatch.reconcile_runs()
    freed = report.launch_failed + report.coordinator_lost + report.cancelled
    if first or freed:
        logger.info("%s: %s", "Cluster start" if first else "Reconciled", report.as_dict())
        dispatch.request_dispatch()
    return {**report.as_dict(), "dispatched_by_the_loop": dispatch_if_stalled()}


# Since when (time.monotonic()) this process's loop has seen a queued run wait beside a
# free slot of this host; None while nothing waits so.
_waiting_since: float | None = None


def dispatch_if_stalled(now: float | None = None) -> list[int]:
    """Dispatch from the loop when a queued run has waited beside a free slot of this host
    for REPLAYS_DISPATCH_STALL_SECONDS; the runs started.

    A dispatch task claims such a run within a second or two, so a wait that long means
    no dispatch reached this host: most often the cluster takes no task at all, because a
    worker SIGKILLed (the OOM killer, a person) while it held the task queue's read lock
    leaves every other worker blocked on that lock for ever though every process looks
    alive (django-q2 #23); or the dispatches asked for went to another host's cluster,
    which was full. The coordinators are started as new interpreters (this thread never
    forks, see dispatch._forks_coordinators). The error logged says what to do, since a
    stuck cluster stays stuck for every task until it is restarted."""
    global _waiting_since
    now = time.monotonic() if now is None else now
    if not dispatch.waits_beside_free_slot():
        _waiting_since = None
        return []
    if _waiting_since is None:
        _waiting_since = now
    waited = now - _waiting_since
    if waited < settings.REPLAYS_DISPATCH_STALL_SECONDS:
        return []
    _waiting_since = None
    started = dispatch.dispatch_runs()
    logger.error(
        "A queued run waited %.0f s beside a free slot on %s and no dispatch came from the "
        "task queue: the loop dispatched it (runs %s). If this repeats, the cluster takes no "
        "task (a worker killed while it held the queue's lock, django-q2 #23): restart it.",
        waited,
        settings.REPLAYS_HOST_NAME,
        started,
    )
    return started


def _take_host_lock() -> IO[bytes] | None:
    """This host's lock file, held for the process's life; None when another process of
    this host holds it. A POSIX record lock (lockf), not flock: the kernel drops it when the
    process dies, however it dies, and a child the worker forks (a coordinator) does not
    inherit it, so a sibling can take over as soon as the worker is gone."""
    folder = Path(settings.REPLAYS_VAR_DIR) / "hosts"
    folder.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", settings.REPLAYS_HOST_NAME)
    digest = hashlib.sha256(settings.REPLAYS_HOST_NAME.encode()).hexdigest()[:12]
    handle = (folder / f"{safe[:64]}-{digest}.lock").open("ab")
    try:
        fcntl.lockf(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        handle.close()
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            return None
        raise
    return handle
