from __future__ import annotations

from typing import Any

from django.core.management.base import CommandError, CommandParser

from replays import dispatch
from replays.management.base import ReplaysCommand
from replays.models import Batch, Run


class Command(ReplaysCommand):
    help = (
        "Cancel a run or every run of a batch: queued runs are cancelled at once and never "
        "start; running ones are stopped (with their whole process tree) within a heartbeat; "
        "finished runs are left as they are."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--run", type=int, help="A run id.")
        target.add_argument("--batch", type=int, help="A batch id.")

    def handle(self, *args: Any, run: int | None, batch: int | None, **options: Any) -> None:
        if run is not None:
            found = Run.objects.filter(pk=run).first()
            if found is None:
                raise CommandError(f"Run {run} not found.")
            runs = [dispatch.cancel_run(run=found)]
        else:
            found_batch = Batch.objects.filter(pk=batch).first()
            if found_batch is None:
                raise CommandError(f"Batch {batch} not found.")
            runs = list(dispatch.cancel_batch(batch=found_batch).runs.order_by("id"))
        for item in runs:
            state = item.get_status_display().lower()
            if item.cancel_requested_at and not item.is_finished:
                state = "stopping (cancel requested)"
            self.stdout.write(f"run {item.pk} {item.model}: {state}")
