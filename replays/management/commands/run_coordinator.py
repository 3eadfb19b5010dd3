from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from replays import coordinator


class Command(BaseCommand):
    help = (
        "Run one launching member of a batch end to end (started by dispatch). "
        "Does nothing when the run is not launching."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=int, help="The id of the run to coordinate.")

    def handle(self, *args: Any, run_id: int, **options: Any) -> None:
        outcome = coordinator.run_member(run_id=run_id)
        self.stdout.write(f"Run {run_id}: {outcome}")
