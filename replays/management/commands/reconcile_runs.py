from __future__ import annotations

from typing import Any

from replays import dispatch, supervision
from replays.management.base import ReplaysCommand


class Command(ReplaysCommand):
    help = (
        "End launching and running runs whose launcher or coordinator is gone "
        "(launch_failed, coordinator_lost), and judgments whose process is gone (lost). "
        "Never relaunches or judges anything again."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument(
            "--dispatch",
            action="store_true",
            help="Then start queued runs that fit the free capacity.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        report = dispatch.reconcile_runs()
        for line in report.lines:
            self.stdout.write(line)
        self.stdout.write(
            f"Reconciled: {report.launch_failed} launch_failed, "
            f"{report.coordinator_lost} coordinator_lost, {report.cancelled} cancelled, "
            f"{report.judgments_lost} judgments lost."
        )
        if options["dispatch"]:
            started = supervision.dispatch_runs()
            self.stdout.write(f"Dispatched: {', '.join(map(str, started)) or 'none'}.")
