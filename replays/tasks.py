"""django-q2 entry points: thin, short and idempotent; the services decide.

django-q2 may deliver a task twice or lose one (FACTS.md). Dispatch claims with a
compare-and-set, so a second delivery claims nothing; the schedules below make a
lost delivery late, not lost. Each cluster's host loop lives in replays.supervision.
"""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections

from replays import dispatch, supervision

# Schedule name -> task, every minute. Reconcile has no schedule: every cluster runs it for
# its own host every few seconds (supervision.host_loop).
SCHEDULES = {
    "replays: dispatch queued runs": "replays.tasks.dispatch_runs_task",
}
# Schedules of earlier versions, removed where they exist.
RETIRED_SCHEDULES = ["replays: reconcile runs"]


def dispatch_runs_task() -> list[int]:
    return supervision.dispatch_runs()


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
