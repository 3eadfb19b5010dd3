"""Supervision: who starts coordinators, the locks that keep forks safe, and each
cluster's host loop. In one place because they are one set of rules about processes.

- Dispatch (`dispatch_runs`) claims queued runs (replays.dispatch) and starts one
  coordinator per claimed run, in its own process and session: forked from a django-q2
  worker's main thread (Django already set up: milliseconds), else a new interpreter
  (`manage.py run_coordinator`). A fork copies the forking thread alone, so only a
  worker's main thread forks; and it never inherits an open database connection: the
  host loop's turn holds `_turn_lock` for its database work and every fork of a worker
  takes it (os.register_at_fork), while a reconcile holding a repository's flock holds
  processes.no_fork.
- Every worker process starts the host loop (post_spawn); the one holding this host's
  lock file reports the host and reconciles every heartbeat, and dispatches itself when
  the task queue stalled (the watchdog).
"""

from __future__ import annotations

import errno
import fcntl
import functools
import hashlib
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import IO, Any

from django.conf import settings
from django.db import connections, transaction
from django_q.signals import post_spawn

from replays import coordinator, dispatch, hosts, processes, runfolder, wakeups
from replays.evaluation import campaign_results
from replays.models import LaunchErrorCode, Run, RunStatus
from replays.runfolder import COORDINATOR_LOG, run_folder

logger = logging.getLogger(__name__)

# The command a coordinator started as a new interpreter runs.
COORDINATOR_COMMAND = "run_coordinator"


# --- starting coordinators ----------------------------------------------------------------


def dispatch_runs(*, host: str | None = None) -> list[int]:
    """Claim what capacity allows, start one coordinator per claimed run; the spawned ids."""
    if transaction.get_connection().in_atomic_block:
        # A coordinator could not see an uncommitted claim, and no process starts inside a
        # transaction: use request_dispatch() there, which waits for the commit.
        raise RuntimeError("dispatch_runs() must run outside a transaction")
    host = host or settings.REPLAYS_HOST_NAME
    spawned: list[int] = []
    while True:
        runs = dispatch.claim_queued_runs(host=host)
        if not runs:
            return spawned
        launched = launch_coordinators(runs=runs, host=host)
        spawned.extend(launched)
        if len(launched) == len(runs):
            # Every claimed slot is now held; a failed spawn freed one, so claim again.
            return spawned


def launch_coordinators(*, runs: list[Run], host: str | None = None) -> list[int]:
    """Start the coordinators of claimed runs, outside any transaction; the started ids.

    Every coordinator is started first, then their pids are written in one transaction:
    no query runs between two starts (a forked coordinator must not inherit an open
    connection, and 64 single writes would each wait for the database's write lock
    behind the coordinators already writing). A coordinator writes its own pid when it
    starts anyway; until then reconcile knows the run by its launcher (this process).
    """
    host = host or settings.REPLAYS_HOST_NAME
    fork = _forks_coordinators(host)
    if fork:
        # A connection shared with the children would be used by two processes at once.
        connections.close_all()
    started: list[tuple[int, processes.ProcessIdentity]] = []
    failed: list[tuple[int, Exception]] = []
    for run in runs:
        processes.pause_point("dispatch_after_claim")
        try:
            identity = launch_coordinator(run=run, host=host, fork=fork)
        except Exception as exc:  # Any reason it could not start is this member's failure.
            logger.warning("Could not start the coordinator of run %s: %s", run.pk, exc)
            failed.append((run.pk, exc))
            continue
        processes.pause_point("dispatch_after_spawn")
        started.append((run.pk, identity))
    with transaction.atomic():
        for run_id, identity in started:
            # The coordinator may already have moved it to running and written its own pid.
            Run.objects.filter(pk=run_id, status=RunStatus.LAUNCHING).update(
                pid=identity.pid, pid_create_time=identity.create_time
            )
    for run_id, exc in failed:
        dispatch.fail_launch(
            run_id=run_id,
            code=LaunchErrorCode.SPAWN_ERROR,
            host=host,
            message=f"Could not start the coordinator: {exc}",
            failure_message=f"Could not start the coordinator: {exc}",
        )
    return [run_id for run_id, _ in started]


def launch_coordinator(*, run: Run, host: str, fork: bool) -> processes.ProcessIdentity:
    """Start the coordinator of one claimed run in its own process; its identity.

    Forked (inside a django-q2 worker, see _forks_coordinators), it starts with Django
    already imported and set up: a few milliseconds, where `manage.py run_coordinator
    RUN_ID` costs a new interpreter and a second or two of CPU, which 64 members at
    once on two cores turned into half a minute. Either way it is its own process and
    session, identified by pid and create time, so a crash or a kill of one member
    touches no other and reconcile finds it the same way. Touches no database.
    """
    # The coordinator sees what this dispatcher sees (host name, run root).
    env = {
        **os.environ,
        "REPLAYS_HOST_NAME": host,
        "REPLAYS_RUN_ROOT": str(settings.REPLAYS_RUN_ROOT),
    }
    log_path = run_folder(run.pk) / COORDINATOR_LOG
    runfolder.create_run_folder(run.pk)
    if fork:
        return processes.fork_detached(
            functools.partial(_coordinate, run.pk),
            cwd=Path(settings.BASE_DIR),
            env=env,
            log_path=log_path,
        )
    _, identity = processes.spawn(
        runfolder.manage_command(COORDINATOR_COMMAND, str(run.pk)),
        cwd=Path(settings.BASE_DIR),
        env=env,
        log_path=log_path,
    )
    return identity


def _mark_task_worker(sender: Any, **kwargs: Any) -> None:
    global _in_task_worker
    _in_task_worker = True


def _forks_coordinators(host: str) -> bool:
    """Fork only in a worker's main thread: a fork copies the forking thread alone, and the
    host loop's thread (which dispatches when the task queue stalls) runs beside a main
    thread that may hold any lock; from there a new interpreter is started instead."""
    return (
        _in_task_worker
        and settings.REPLAYS_FORK_COORDINATORS
        and host == settings.REPLAYS_HOST_NAME
        and threading.current_thread() is threading.main_thread()
    )


def _coordinate(run_id: int) -> None:
    """The forked coordinator's work: what `manage.py run_coordinator` does, the same
    output in its log."""
    print(f"Run {run_id}: {coordinator.run_member(run_id=run_id)}", flush=True)


# Set in each django-q2 worker as it starts (post_spawn): its settings were read from the
# environment its coordinators get, so a coordinator forked from it is the same as one
# started afresh. Any other caller (a command, a shell, a test runner that changed its
# settings or environment since it started) spawns a new interpreter.
_in_task_worker = False


post_spawn.connect(_mark_task_worker, dispatch_uid="replays.supervision.mark_task_worker")


# --- the host loop ------------------------------------------------------------------------

# Held by the loop thread for the whole of a turn's database work, and taken by any fork
# of this worker process (a coordinator, REPLAYS_FORK_COORDINATORS) until the fork is done:
# a forked child must not inherit the thread's open connection (SQLite's own lock state
# is copied with it, and the child's first write then finds the database locked), so a
# fork waits for the turn to end, and a turn closes its connections before it lets go.
_turn_lock = threading.Lock()


# Set in a worker process once its loop thread runs (a fork starts with it clear: the
# sentinel never starts a loop).
_host_loop_started = threading.Event()

# Since when (time.monotonic()) this process's loop has seen a queued run wait beside a
# free slot of this host; None while nothing waits so.
_waiting_since: float | None = None


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
        wakeups.request_dispatch()
    # Members ended by dispatch (a budget spent) or reconcile change their campaigns'
    # results too; the coordinators keep them for what they end themselves.
    campaigns = campaign_results.refresh_running()
    return {
        **report.as_dict(),
        "campaigns_refreshed": campaigns,
        "dispatched_by_the_loop": dispatch_if_stalled(),
    }


def dispatch_if_stalled(now: float | None = None) -> list[int]:
    """Dispatch from the loop when a queued run has waited beside a free slot of this host
    for REPLAYS_DISPATCH_STALL_SECONDS; the runs started.

    A dispatch task claims such a run within a second or two, so a wait that long means
    no dispatch reached this host: most often the cluster takes no task at all, because a
    worker SIGKILLed (the OOM killer, a person) while it held the task queue's read lock
    leaves every other worker blocked on that lock for ever though every process looks
    alive (django-q2 #23); or the dispatches asked for went to another host's cluster,
    which was full. The coordinators are started as new interpreters (this thread never
    forks, see _forks_coordinators). The error logged says what to do, since a
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
    started = dispatch_runs()
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
