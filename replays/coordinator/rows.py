"""The run's row while its coordinator works: every write conditional on the run still
running (a reconcile may have failed it meanwhile: RunGone), heartbeats that also carry
the log tail and answer whether a cancel was asked for, writes that wait out a database
outage, and a heartbeat kept in the background while slow git work blocks the thread."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)
from django.utils import timezone

from replays import processes
from replays.models import Run, RunStatus

logger = logging.getLogger(__name__)

# A write that meets a database outage is tried again after this long, doubling up to 5 s.
OUTAGE_RETRY_SECONDS = 0.5


class RunGone(processes.StopRequested):
    """The run is no longer ours: a reconcile or someone else finished it while we worked."""


class RunRow:
    """Writes to one running run's row."""

    def __init__(self, run_id: int) -> None:
        self.run_id = run_id

    def update(self, *, wait_out_outage: bool = True, **values: Any) -> None:
        """Write `values` while the run is running; RunGone when it no longer is."""

        def write() -> int:
            return self._running().update(**values)

        if not (through_an_outage(write) if wait_out_outage else write()):
            raise RunGone()

    def heartbeat(self, log_tail: str) -> bool:
        """Write the heartbeat and the log tail; True when a cancel was requested.

        A database hiccup skips one heartbeat (a stale one is what reconcile acts on); a
        run that is no longer running raises RunGone.
        """
        try:
            # Never waits: the agent is watched meanwhile, and the next beat tries again.
            self.update(wait_out_outage=False, heartbeat_at=timezone.now(), log_tail=log_tail)
            return self.cancel_requested()
        except DatabaseError as exc:
            logger.warning("Run %s: heartbeat skipped: %s", self.run_id, exc)
            return False
        finally:
            # Between heartbeats the database owes us nothing: give the connection back
            # (and drop a broken one) rather than hold it for the whole run.
            close_old_connections()

    def cancel_requested(self) -> bool:
        return Run.objects.filter(pk=self.run_id, cancel_requested_at__isnull=False).exists()

    def finish(self, values: dict[str, Any]) -> bool:
        """The final write (waits out an outage); False when the run was finished elsewhere."""
        return bool(through_an_outage(lambda: self._running().update(**values)))

    def _running(self) -> Any:
        return Run.objects.filter(pk=self.run_id, status=RunStatus.RUNNING)


@contextmanager
def heartbeat_in_background(run_id: int) -> Iterator[None]:
    """Keep the heartbeat going while the main thread waits on slow git work.

    Creating a worktree or diffing a large repository can take longer than the stale
    limit; without this a reconcile would take the coordinator for lost. The agent
    wait loop beats in the main thread and needs no helper.
    """
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(float(settings.REPLAYS_HEARTBEAT_SECONDS)):
                try:
                    Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
                        heartbeat_at=timezone.now()
                    )
                except DatabaseError as exc:
                    logger.warning("Run %s: heartbeat skipped: %s", run_id, exc)
                finally:
                    close_old_connections()
        finally:
            # Connections are per thread: this one's dies with it.
            connections.close_all()

    thread = threading.Thread(target=beat, name=f"heartbeat-run-{run_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def through_an_outage(write: Callable[[], int]) -> int:
    """Run a conditional write, waiting out a database that cannot be reached: an agent
    that ended while the database was down keeps its result. Tried again (on a fresh
    connection) until the stale limit has passed; by then a reconcile counts the run as
    lost anyway (the design), and the coordinator gives up with the error."""
    give_up = time.monotonic() + float(settings.REPLAYS_HEARTBEAT_STALE_SECONDS)
    pause = OUTAGE_RETRY_SECONDS
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            close_old_connections()
            if time.monotonic() >= give_up:
                raise
            logger.warning("The database cannot be reached (%s); trying again.", exc)
            time.sleep(max(0.0, min(pause, give_up - time.monotonic())))
            pause = min(pause * 2, 5.0)
