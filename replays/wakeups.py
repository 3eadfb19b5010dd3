"""Asking a cluster for a dispatch: a message through django-q2's queue, by the task's name.

Below the protocol's rooms that ask (approval when it queues runs, dispatch when a cancel
frees a slot, the coordinator when its run ends) and above none of them: the dispatch
itself happens in a worker's task (replays.tasks), never inside the asker. A request lost
(a broker down) is late, not lost: the every-minute schedule dispatches too.
"""

from __future__ import annotations

import logging

from django.db import transaction

from replays.models import Run, RunStatus

logger = logging.getLogger(__name__)

DISPATCH_TASK = "replays.tasks.dispatch_runs_task"


def request_dispatch() -> None:
    """Ask a cluster to dispatch once the current transaction commits (at once outside one)."""
    transaction.on_commit(_enqueue_dispatch)


def request_dispatch_if_waiting() -> None:
    """A run ended and freed its slot: ask for a dispatch when a queued run waits for one.

    When none waits, nothing is asked: a run queued later asks for its own dispatch as it
    is queued (approval). Launching a batch of 64 no longer runs 64 empty dispatch tasks
    beside the coordinators still starting, one per member that ends meanwhile.
    """
    if Run.objects.filter(status=RunStatus.QUEUED, cancel_requested_at__isnull=True).exists():
        request_dispatch()


def _enqueue_dispatch() -> None:
    from django_q.tasks import async_task

    try:
        async_task(DISPATCH_TASK)
    except Exception:
        # The schedule dispatches within a minute: a lost request is late, not lost.
        logger.exception("Could not enqueue a dispatch; the schedule will pick the runs up")
