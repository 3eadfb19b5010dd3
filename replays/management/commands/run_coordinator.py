from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from replays import coordinator
from replays.management.base import ReplaysCommand


class Command(ReplaysCommand):
    # Started once per member, many at once: the project's system checks (URLs, every
    # view and the API schema imported) cost more CPU than the rest of its start-up.
    requires_system_checks: list[str] = []

    help = (
        "Run one launching member of a batch end to end (started by dispatch). "
        "Does nothing when the run is not launching."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("run_id", type=int, help="The id of the run to coordinate.")

    def handle(self, *args: Any, run_id: int, **options: Any) -> None:
        outcome = coordinator.run_member(run_id=run_id)
        self.stdout.write(f"Run {run_id}: {outcome}")
