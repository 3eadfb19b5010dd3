from __future__ import annotations

import signal
from types import FrameType
from typing import Any

from django.core.management.base import CommandParser
from django.db import connections

from replays import processes
from replays.evaluation import report as reports
from replays.management.base import ReplaysCommand
from replays.models import Report


class _Stopped(processes.StopRequested):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(f"the judgment process was stopped ({signal.Signals(signum).name})")


class Command(ReplaysCommand):
    help = (
        "Judge one run again, for a judgment the API asked for (started by it, not by hand): "
        "takes the judging report once, judges, stores the report."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("report_id", type=int, help="The judging report to take.")

    def handle(self, *args: Any, report_id: int, **options: Any) -> None:
        if not reports.claim_judgment(report_id=report_id):
            self.stdout.write(f"Report {report_id}: not started (taken or ended already).")
            return
        # A stop becomes an exception, so the judgment is marked lost with the reason.
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _stop)
        try:
            requested_at = Report.objects.values_list("created_at", flat=True).get(pk=report_id)
            done = reports.judge_report(report_id=report_id, requested_at=requested_at)
            self.stdout.write(f"Report {report_id}: {done.status} ({done.winner or done.reason})")
        except reports.JudgmentGone:
            self.stdout.write(f"Report {report_id}: marked lost while it was judged.")
        finally:
            connections.close_all()
