from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

from django.core.management.base import CommandError, CommandParser
from django.utils import timezone

from replays import processes
from replays.evaluation import report as reports
from replays.evaluation import results
from replays.management.base import ReplaysCommand, json_text
from replays.models import Batch, Report, Run, RunStatus


class _Stopped(processes.StopRequested):
    pass


def _stop(signum: int, frame: FrameType | None) -> None:
    raise _Stopped(f"the judge command was stopped ({signal.Signals(signum).name})")


class Command(ReplaysCommand):
    help = (
        "Judge stored results again, without running any agent: a new current report per "
        "completed run (the old reports are kept). Judging with a model costs money and "
        "needs --yes (or a yes at the prompt); the `tests` evaluator does not."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        target = parser.add_mutually_exclusive_group(required=True)
        target.add_argument("--run", type=int, help="A run id.")
        target.add_argument("--batch", type=int, help="A batch id: every completed run of it.")
        parser.add_argument(
            "--evaluator", help="`tests` or a model id (default: the batch's evaluator)."
        )
        parser.add_argument("--yes", action="store_true", help="Approve the evaluator's cost.")
        parser.add_argument("--json", action="store_true", help="Print the reports as JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        # With --json, stdout is the JSON alone: progress goes to stderr.
        self.progress = self.stderr if options["json"] else self.stdout
        runs = self.runs(options["run"], options["batch"])
        approved = options["yes"]
        info = self.judgeable(runs[0], options["evaluator"], approved=True)
        if not info.is_tests and not approved:
            approved = self.confirm(
                f"Judge {len(runs)} run{'s' if len(runs) != 1 else ''} with {info.id}? "
                "It calls a model, which costs money."
            )
            if not approved:
                self.stdout.write("Not approved. Nothing was judged.")
                return
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, _stop)
        requested_at = timezone.now()
        done: list[Report] = []
        for number, run in enumerate(runs, 1):
            done.append(self.judge_one(run, info.id, requested_at, number, len(runs)))
        if options["json"]:
            self.stdout.write(json_text([results.brief(item) for item in done]))

    def runs(self, run_id: int | None, batch_id: int | None) -> list[Run]:
        if run_id is not None:
            run = Run.objects.select_related("batch", "thread").filter(pk=run_id).first()
            if run is None:
                raise CommandError(f"Run {run_id} not found.")
            return [run]
        batch = Batch.objects.filter(pk=batch_id).first()
        if batch is None:
            raise CommandError(f"Batch {batch_id} not found.")
        runs = list(
            batch.runs.filter(status=RunStatus.COMPLETED)
            .select_related("batch", "thread")
            .order_by("id")
        )
        if not runs:
            raise CommandError(f"Batch {batch_id} has no completed run to judge.")
        return runs

    def judgeable(self, run: Run, evaluator: str | None, *, approved: bool) -> Any:
        try:
            return reports.check_judgeable(run=run, evaluator=evaluator, approved=approved)
        except reports.JudgmentRefused as exc:
            raise CommandError(exc.message) from None

    def confirm(self, prompt: str) -> bool:
        if not sys.stdin.isatty():
            raise CommandError(f"{prompt} Pass --yes to approve when there is no terminal to ask.")
        return input(f"{prompt} [y/N] ").strip().lower() in {"y", "yes"}

    def judge_one(
        self, run: Run, evaluator: str, requested_at: Any, number: int, total: int
    ) -> Report:
        self.judgeable(run, evaluator, approved=True)
        self.progress.write(
            f"[{number}/{total}] run {run.pk} {run.model}: judging with {evaluator}…"
        )
        try:
            judging = reports.start_judgment(
                run=run, evaluator=evaluator, holder=processes.own_identity()
            )
        except reports.JudgmentInProgress as exc:
            raise CommandError(str(exc)) from None
        try:
            done = reports.judge_report(report_id=judging.pk, requested_at=requested_at)
        except reports.JudgmentGone:
            raise CommandError(
                f"Report {judging.pk} was marked lost while it was judged."
            ) from None
        except _Stopped as exc:
            raise CommandError(f"Stopped: {exc}. Report {judging.pk} is marked lost.") from None
        self.progress.write(f"    {self.describe(done)}")
        return done

    def describe(self, report: Report) -> str:
        if report.winner is None:
            return f"review failed: {report.reason}"
        consistency = {True: "consistent", False: "inconsistent", None: "tests only"}
        return (
            f"winner {report.winner}; score historical {report.score_historical:.2f}, "
            f"replay {report.score_replay:.2f} ({consistency[report.consistent]})"
        )
