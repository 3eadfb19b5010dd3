"""django-q2 entry points: thin, short and idempotent; the services decide.

django-q2 may deliver a task twice or lose one (FACTS.md). Dispatch claims with a
compare-and-set, so a second delivery claims nothing; the schedules below make a
lost delivery late, not lost.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import psutil
from django.db import DEFAULT_DB_ALIAS, connections

from replays import dispatch

logger = logging.getLogger(__name__)

# Schedule name -> task: both every minute.
SCHEDULES = {
    "replays: dispatch queued runs": "replays.tasks.dispatch_runs_task",
    "replays: reconcile runs": "replays.tasks.reconcile_runs_task",
}


def dispatch_runs_task() -> list[int]:
    return dispatch.dispatch_runs()


def reconcile_runs_task() -> dict[str, Any]:
    return dispatch.reconcile_runs().as_dict()


def ensure_schedules(*, using: str = DEFAULT_DB_ALIAS) -> None:
    """Create or update the every-minute schedules (idempotent; run after migrate)."""
    from django_q.models import Schedule

    if Schedule._meta.db_table not in connections[using].introspection.table_names():
        return  # django_q is not migrated (yet) on this database.
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
    """django-q2's post_spawn handler: reconcile, then dispatch, once per cluster start.

    django-q2 1.11 has no "cluster started" signal; post_spawn is sent in every worker
    process as it starts (also when a worker is recycled or reincarnated). Workers are
    forked from the cluster's sentinel, so only the sentinel's oldest child, its first
    worker, does the work: a later or replacement worker sees an older sibling and skips.
    Both services are idempotent, so a rare second run costs a few queries, nothing more.
    """
    if not _is_first_child_of_sentinel():
        return
    try:
        report = dispatch.reconcile_runs()
        started = dispatch.dispatch_runs()
        logger.info("Cluster start: %s; dispatched runs %s", report.as_dict(), started)
    except Exception:
        # The every-minute schedules retry; a worker must still come up.
        logger.exception("Reconcile and dispatch at cluster start failed")
    finally:
        connections.close_all()


def _is_first_child_of_sentinel() -> bool:
    try:
        me = psutil.Process()
        siblings = psutil.Process(os.getppid()).children()
        oldest = min(siblings, key=lambda process: (process.create_time(), process.pid))
    except (psutil.Error, ValueError):
        return True
    return oldest.pid == me.pid
