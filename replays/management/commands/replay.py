from __future__ import annotations

import json
import shlex
import shutil
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from replays import approval, planning, supervision
from replays.evaluation import results
from replays.formatting import DASH, duration, usd
from replays.management.base import ReplaysCommand, command_user, json_text
from replays.models import Batch, FailureOwner, PlanStatus, Report, Run, RunStatus, Winner

POLL_SECONDS = 1.0
# The option that answers each kind of question (its `field` in the API), and what it takes.
ANSWER_OPTIONS = {
    "repository": ("--repository", "PATH"),
    "baseline_commit": ("--baseline", "COMMIT"),
    "ending_commit": ("--ending", "COMMIT"),
}


class Command(ReplaysCommand):
    help = (
        "Replay a thread (or a range of its requests) with one or more models: prepare, "
        "show the approval prompt, approve, and optionally follow the runs until they end."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--thread",
            type=int,
            action="append",
            dest="threads",
            default=[],
            help="Thread id (repeat for several threads: whole threads are replayed).",
        )
        parser.add_argument("--from", dest="start", help="Message uuid of the first request.")
        parser.add_argument("--to", dest="end", help="Message uuid of the last request.")
        parser.add_argument(
            "--model",
            action="append",
            dest="models",
            default=[],
            help="Model id, e.g. historical, empty, codex:gpt-5.5 (repeat).",
        )
        parser.add_argument("--timeout", type=int, help="Seconds each run may take.")
        parser.add_argument(
            "--repository", help="The git repository (when the thread's folder is not one)."
        )
        parser.add_argument("--baseline", help="Baseline commit (answers a baseline question).")
        parser.add_argument("--ending", help="Ending commit (answers an ending question).")
        parser.add_argument("--request", help="Replace the request text.")
        parser.add_argument(
            "--verify-command",
            help="A command that checks a result, run in each tree (no shell); {junit_xml} "
            "becomes a path it may write JUnit XML to.",
        )
        parser.add_argument(
            "--evaluator",
            help="Who judges the runs: `tests` or a model id (default: resolved by prepare).",
        )
        parser.add_argument(
            "--test-path",
            action="append",
            dest="test_paths",
            help="Glob of the historical diff's test files (repeat; default: test_*.py, "
            "*_test.py, tests/**, *.test.*, *_spec.*).",
        )
        parser.add_argument(
            "--context",
            action="append",
            dest="context",
            default=[],
            metavar="[MODEL=]MODE",
            help="What the agent knows before the request: cold, digest or fork, for every "
            "model or MODEL=MODE for one (repeat). Default: cold for a thread's first request, "
            "else fork when the model's agent is the thread's own tool, else digest.",
        )
        parser.add_argument("--user", help="Who owns the plan (default: the only superuser).")
        parser.add_argument("--yes", action="store_true", help="Approve without asking.")
        parser.add_argument("--wait", action="store_true", help="Follow the runs until they end.")
        parser.add_argument("--follow", type=int, metavar="BATCH", help="Follow an approved batch.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        if options["follow"]:
            batch = Batch.objects.filter(pk=options["follow"]).first()
            if batch is None:
                raise CommandError(f"Batch {options['follow']} not found.")
            self.follow(batch)
            return
        if not options["threads"]:
            raise CommandError("Give --thread ID (and at least one --model).")
        if not options["models"]:
            raise CommandError("Give at least one --model (for example --model historical).")
        if self.as_json and not options["yes"]:
            raise CommandError("--json needs --yes: there is no prompt to answer.")
        user = command_user(options["user"], acting="owns the plan")
        try:
            configuration = self.configuration(options)
            prepared = planning.prepare_plan(owner=user, raw_configuration=configuration)
        except (planning.PlanInputError, planning.PrepareConflict) as exc:
            raise CommandError(exc.message) from None
        plan = prepared.plan
        if plan.status != PlanStatus.READY_FOR_APPROVAL:
            self.explain_unready(plan)
            again = " Run the command again with the answers." if plan.questions else ""
            raise CommandError(f"Plan {plan.pk} {planning.status_phrase(plan.status)}.{again}")
        if not self.as_json:
            self.stdout.write(self.describe(plan))
        if not options["yes"] and not self.confirm(plan.approval_prompt):
            self.stdout.write("Not approved. Nothing runs.")
            return
        try:
            result = approval.approve_plan(
                plan_id=plan.pk,
                user=user,
                approved=True,
                prepare_token=prepared.prepare_token,
                run_config=plan.configuration,
            )
        except approval.ApprovalError as exc:
            raise CommandError(exc.message) from None
        batch = result.batch
        # Start what capacity allows right away, so a replay works without a running cluster;
        # with one running, the claims make this duplicate dispatch harmless.
        supervision.dispatch_runs()
        if not self.as_json:
            self.stdout.write(
                self.style.SUCCESS(f"Approved: batch {batch.pk} with {len(result.runs)} runs.")
            )
        if options["wait"]:
            self.follow(batch)
        elif self.as_json:
            self.print_json(batch)
        else:
            self.stdout.write(f"Follow it with: python manage.py replay --follow {batch.pk}")

    # --- steps ---------------------------------------------------------------------------

    def configuration(self, options: dict[str, Any]) -> dict[str, Any]:
        items = []
        for thread_id in options["threads"]:
            item: dict[str, Any] = {"thread_id": thread_id}
            for key, option in [
                ("start_message_uuid", "start"),
                ("end_message_uuid", "end"),
                ("repository", "repository"),
                ("baseline_commit", "baseline"),
                ("ending_commit", "ending"),
                ("request", "request"),
            ]:
                if options[option] is not None:
                    item[key] = options[option]
            items.append(item)
        configuration: dict[str, Any] = {"configurations": items, "models": options["models"]}
        if options["timeout"] is not None:
            configuration["timeout_seconds"] = options["timeout"]
        if options["verify_command"]:
            # A relative program is where the user typed it, not in the run's worktree.
            configuration["verify_command"] = planning.verify_command_from(
                options["verify_command"], base=Path.cwd()
            )
        if options["evaluator"]:
            configuration["evaluator"] = options["evaluator"]
        if options["test_paths"]:
            configuration["test_paths"] = options["test_paths"]
        if options["context"]:
            configuration["context"] = context_option(options["context"])
        return configuration

    def describe(self, plan: Any) -> str:
        lines = [f"Plan {plan.pk}: ready for approval."]
        for prep in plan.preparations:
            lines.append(
                f"  thread {prep['thread_id']}: {prep['repository']} "
                f"{prep['baseline_commit'][:12]}..{prep['ending_commit'][:12]}"
            )
            for side, done in (prep.get("rebuilt") or {}).items():
                files = ", ".join(done["files"]) or "no file"
                lines.append(
                    f"    {side} {done['commit'][:12]} rebuilt from the transcript (no commit "
                    f"holds it): {done['edits']} edits of {files} on {done['base'][:12]}"
                )
            for model, chosen in (prep.get("context") or {}).items():
                lines.append(f"    context of {model}: {chosen['mode']} ({chosen['reason']})")
        lines.append(f"  models: {', '.join(plan.configuration['models'])}")
        lines.append(f"  evaluator: {plan.evaluator or 'none (the runs will not be judged)'}")
        lines += [f"  warning: {warning}" for warning in plan.warnings]
        return "\n".join(lines)

    def explain_unready(self, plan: Any) -> None:
        if self.as_json:
            self.stdout.write(
                json.dumps(
                    {
                        "plan": plan.pk,
                        "status": plan.status,
                        "blockers": plan.blockers,
                        "questions": plan.questions,
                    },
                    indent=2,
                )
            )
            return
        for blocker in plan.blockers:
            self.stderr.write(self.style.ERROR(f"Blocked: {blocker}"))
        for question in plan.questions:
            self.stderr.write(self.style.WARNING(f"Question: {question['message']}"))
            option, value = ANSWER_OPTIONS.get(question["field"], (question["field"], "VALUE"))
            choices = question["choices"]
            self.stderr.write(
                f"  Answer with {option} {value}{', for example:' if choices else '.'}"
            )
            for choice in choices:
                if "repository" in choice:
                    self.stderr.write(
                        f"    {option} {shlex.quote(choice['repository'])}  ({choice['reason']})"
                    )
                else:
                    self.stderr.write(
                        f"    {option} {choice['commit'][:12]}  {choice.get('committed_at', '')[:19]}  "
                        f"{choice['subject'][:60]}"
                    )

    def confirm(self, prompt: str) -> bool:
        if not sys.stdin.isatty():
            raise CommandError(f"{prompt} Pass --yes to approve when there is no terminal to ask.")
        answer = input(f"{prompt} [y/N] ").strip().lower()
        return answer in {"y", "yes"}

    def follow(self, batch: Batch) -> None:
        if self.as_json:
            self.wait_quietly(batch)
            self.print_json(batch)
            self.fail_if_unfinished(batch)
            return
        live = self.stdout.isatty()
        shown: dict[int, str] = {}
        try:
            while True:
                runs = list(batch.runs.select_related("thread").order_by("id"))
                if live:
                    self.draw_live(runs, len(shown))
                    shown = {run.pk: "" for run in runs}
                else:
                    for run in runs:
                        state = f"{run.status}/{run.phase}"
                        if shown.get(run.pk) != state:
                            shown[run.pk] = state
                            self.stdout.write(
                                f"run {run.pk} {run.model}: {run.get_status_display().lower()}"
                                f" ({run.get_phase_display().lower()})"
                            )
                if all(run.is_finished for run in runs):
                    break
                self.help_dispatch(runs)
                time.sleep(POLL_SECONDS)
        except KeyboardInterrupt:
            self.stdout.write("")
            self.stdout.write(
                f"Detached; the runs go on. Follow: python manage.py replay --follow {batch.pk}   "
                f"Cancel: python manage.py cancel_runs --batch {batch.pk}"
            )
            return
        runs = batch.runs.select_related("thread").with_current_report().order_by("id")
        self.stdout.write(self.table(list(runs)))
        self.fail_if_unfinished(batch)

    def wait_quietly(self, batch: Batch) -> None:
        while not batch.finished:
            self.help_dispatch(list(batch.runs.all()))
            time.sleep(POLL_SECONDS)

    def help_dispatch(self, runs: list[Run]) -> None:
        """Queued members start as slots free, even when no cluster is running."""
        if any(run.status == RunStatus.QUEUED for run in runs):
            supervision.dispatch_runs()

    def draw_live(self, runs: list[Run], previous_lines: int) -> None:
        if previous_lines:
            self.stdout.raw(f"\x1b[{previous_lines}F")  # back to the first line drawn
        for run in runs:
            elapsed = run.wall_seconds
            if elapsed is None and run.started_at:
                from django.utils import timezone

                elapsed = (timezone.now() - run.started_at).total_seconds()
            self.stdout.raw("\x1b[2K")  # clear the line, then write it
            self.stdout.write(
                f"  run {run.pk:<5} {run.model[:28]:<28} {run.get_status_display():<10} "
                f"{run.get_phase_display():<20} {duration(elapsed)}"
            )
        self.stdout.flush()

    def table(self, runs: list[Run]) -> str:
        header = (
            f"{'model':<28} {'thread':<24} {'status':<10} {'files':>5} {'time':>8} {'cost':>14} "
            f"{'score h/r':>11} {'winner':<12}"
        )
        lines = [header, "-" * len(header)]
        for run in runs:
            report = run.current_report
            lines.append(
                f"{run.model[:28]:<28} {run.thread.title[:24]:<24} {run.status:<10} "
                f"{run.files_changed:>5} {duration(run.wall_seconds):>8} {usd(run.cost_usd):>14} "
                f"{score_text(report):>11} {winner_text(report):<12}"
            )
        return "\n".join(lines + self.reasons(runs))

    def reasons(self, runs: list[Run]) -> list[str]:
        """Why each run failed or was not judged, whole, wrapped to the terminal's width."""
        width = max(40, shutil.get_terminal_size(fallback=(100, 24)).columns)
        lines: list[str] = []
        for run in runs:
            report = run.current_report
            said = []
            if run.failure_code:
                owner = run.failure_owner
                whose = "" if owner == FailureOwner.MODEL else f" ({owner.label}, not counted)"
                said.append((f"{run.failure_code}{whose}", run.failure_message))
            if report is not None and report.winner is None:
                said.append(("not judged", report.reason))
            for title, text in said:
                lines += ["", f"run {run.pk} {run.model}: {title}"]
                for paragraph in (text.strip() or "(no message)").splitlines():
                    lines += textwrap.wrap(
                        paragraph, width=width, initial_indent="    ", subsequent_indent="    "
                    ) or [""]
        return lines

    def print_json(self, batch: Batch) -> None:
        runs = [
            {
                "id": run.pk,
                "thread": run.thread_id,
                "model": run.model,
                "status": run.status,
                "phase": run.phase,
                "files_changed": run.files_changed,
                "wall_seconds": run.wall_seconds,
                "cost_usd": run.cost_usd,
                "failure_code": run.failure_code,
                "failure_message": run.failure_message,
                "report": results.brief(run.current_report),
            }
            for run in batch.runs.with_current_report().order_by("id")
        ]
        body = {
            "batch": batch.pk,
            "plan": batch.plan_id,
            "evaluator": batch.evaluator,
            "finished": batch.finished,
            "results_ready": batch.results_ready,
            "runs": runs,
        }
        self.stdout.write(json_text(body))

    def fail_if_unfinished(self, batch: Batch) -> None:
        runs = list(batch.runs.all())
        not_completed = [run for run in runs if run.status != "completed"]
        if not_completed:
            raise CommandError(f"{len(not_completed)} of {len(runs)} runs did not complete.")


def context_option(values: list[str]) -> str | dict[str, str]:
    """`--context MODE` (every model) or `--context MODEL=MODE` (repeatable) as the
    configuration's `context`; planning says what is wrong with a mode or a model."""
    plain = [value for value in values if "=" not in value]
    if plain and len(values) > 1:
        raise CommandError("Give --context MODE once, or --context MODEL=MODE for each model.")
    if plain:
        return plain[0]
    modes: dict[str, str] = {}
    for value in values:
        model, _, mode = value.rpartition("=")
        if model in modes:
            raise CommandError(f"--context names {model} twice.")
        modes[model] = mode
    return modes


def score_text(report: Report | None) -> str:
    """ "0.95 / 0.40": historical / replay; "—" when not judged."""
    if report is None or report.score_replay is None or report.score_historical is None:
        return DASH
    return f"{report.score_historical:.2f} / {report.score_replay:.2f}"


def winner_text(report: Report | None) -> str:
    if report is None:
        return DASH
    if report.winner is None:
        return "not judged"
    if report.winner == Winner.TIE and report.consistent is False:
        return "tie (split)"
    return report.winner
