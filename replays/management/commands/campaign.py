"""`manage.py campaign`: a user's own history as their benchmark (docs/campaigns.md).

Prepare (scan, select, estimate), show what one approval covers, approve it, and with
--wait follow the members until they end, then print the results table.
"""

from __future__ import annotations

import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from replays import budgets, campaigns, planning, supervision
from replays.errors import ServiceError
from replays.evaluation import campaign_results
from replays.formatting import duration, usd
from replays.management.base import ReplaysCommand, command_user, json_text
from replays.management.commands.replay import context_option
from replays.models import Campaign, CampaignStatus, ExclusionReason, RunStatus

POLL_SECONDS = 1.0
BAR_WIDTH = 30


class Command(ReplaysCommand):
    help = (
        "Replay many of your own past requests with other models under one approval and a "
        "budget, and compare: would model X have done my last N tasks as well, for less?"
    )

    def add_arguments(self, parser: CommandParser) -> None:
        chosen = parser.add_mutually_exclusive_group()
        chosen.add_argument(
            "--last", type=int, metavar="N", help="Select the newest N eligible requests (default 20)."
        )  # fmt: skip
        chosen.add_argument("--sample", type=int, metavar="N", help="Select a random sample of N.")
        parser.add_argument("--seed", type=int, default=0, help="The sample's seed (default 0).")
        parser.add_argument(
            "--model", action="append", dest="models", default=[],
            help="Model id, e.g. codex:gpt-5.5, claude:claude-sonnet-4-5, historical (repeat).",
        )  # fmt: skip
        parser.add_argument("--evaluator", help="Who judges every run: `tests` or a model id.")
        parser.add_argument(
            "--verify-command", action="append", dest="verify_commands", default=[],
            metavar="REPO=COMMAND",
            help="The test command of a repository (repeat); otherwise the one its historical "
            "agent ran. A relative program is taken from where you type it.",
        )  # fmt: skip
        parser.add_argument(
            "--clone", action="append", dest="clones", default=[], metavar="FOLDER=CLONE",
            help="Where the repository of threads recorded in FOLDER (gone or elsewhere) is "
            "now (repeat).",
        )  # fmt: skip
        parser.add_argument("--budget", metavar="USD", help="Dollars the campaign may spend.")
        parser.add_argument(
            "--gradable-only", action="store_true",
            help="Only requests whose historical tests see their change (runs their tests now).",
        )  # fmt: skip
        parser.add_argument("--tool", help="Only threads of this tool (claude_code, codex, ...).")
        parser.add_argument("--repository", help="Only threads recorded in this repository.")
        parser.add_argument("--folder", help="Only threads whose folder is this one or inside it.")
        parser.add_argument("--since", help="Only requests on or after this day (YYYY-MM-DD).")
        parser.add_argument("--until", help="Only requests on or before this day (YYYY-MM-DD).")
        parser.add_argument(
            "--scan", type=int, metavar="N",
            help=f"Look at most at the newest N requests (default {campaigns.DEFAULT_SCAN}).",
        )  # fmt: skip
        parser.add_argument(
            "--context", action="append", default=[], metavar="[MODEL=]MODE",
            help="cold, digest or fork, for every model or MODEL=MODE for one (repeat).",
        )  # fmt: skip
        parser.add_argument("--timeout", type=int, help="Seconds each run may take.")
        parser.add_argument("--user", help="Whose history (default: the only superuser).")
        parser.add_argument("--yes", action="store_true", help="Approve without asking.")
        parser.add_argument("--wait", action="store_true", help="Follow it, then print results.")
        parser.add_argument("--follow", type=int, metavar="ID", help="Follow an approved campaign.")
        parser.add_argument("--cancel", type=int, metavar="ID", help="Cancel a campaign's rest.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        self.as_json = options["json"]
        user = command_user(options["user"], acting="owns the history")
        if options["follow"] or options["cancel"]:
            campaign = (
                Campaign.objects.visible_to(user)
                .filter(pk=options["follow"] or options["cancel"])
                .first()
            )
            if campaign is None:
                raise CommandError(f"Campaign {options['follow'] or options['cancel']} not found.")
            if options["cancel"]:
                campaign = campaigns.cancel_campaign(campaign=campaign)
                self.stdout.write(f"Campaign {campaign.pk}: {campaign.get_status_display()}.")
                return
            self.follow(campaign)
            return
        if not options["models"]:
            raise CommandError("Give at least one --model (for example --model codex:gpt-5.5).")
        if self.as_json and not options["yes"]:
            raise CommandError("--json needs --yes: there is no prompt to answer.")
        try:
            prepared = campaigns.prepare_campaign(
                owner=user, raw_configuration=self.configuration(options), progress=self.progress
            )
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        self.progress_done()
        campaign = prepared.campaign
        if not self.as_json:
            self.stdout.write(self.describe(campaign))
        if prepared.prepare_token is None:
            if self.as_json:
                self.stdout.write(json_text({"campaign": campaign.pk, "status": campaign.status,
                                             "blockers": campaign.blockers}))  # fmt: skip
            raise CommandError(f"Campaign {campaign.pk} is blocked: " + " ".join(campaign.blockers))
        if not options["yes"] and not self.confirm(campaign.approval_prompt):
            self.stdout.write("Not approved. Nothing runs.")
            return
        try:
            campaigns.approve_campaign(
                campaign_id=campaign.pk, user=user, approved=True,
                prepare_token=prepared.prepare_token,
            )  # fmt: skip
        except ServiceError as exc:
            raise CommandError(exc.message) from None
        # Start what capacity (and the budget) allows now, so it works without a cluster.
        supervision.dispatch_runs()
        campaign.refresh_from_db()
        if not self.as_json:
            self.stdout.write(
                self.style.SUCCESS(
                    f"Approved: campaign {campaign.pk}, {campaign.estimate.get('runs', 0)} runs."
                )
            )
        if options["wait"]:
            self.follow(campaign)
        elif self.as_json:
            self.print_json(campaign)
        else:
            self.stdout.write(f"Follow it with: python manage.py campaign --follow {campaign.pk}")

    # --- input ----------------------------------------------------------------------------

    def configuration(self, options: dict[str, Any]) -> dict[str, Any]:
        configuration: dict[str, Any] = {"models": options["models"]}
        if options["sample"] is not None:
            configuration.update(selection="sample", limit=options["sample"], seed=options["seed"])
        elif options["last"] is not None:
            configuration["limit"] = options["last"]
        if options["evaluator"]:
            configuration["evaluator"] = options["evaluator"]
        if options["budget"] is not None:
            configuration["budget_usd"] = options["budget"]
        if options["gradable_only"]:
            configuration["gradable_only"] = True
        if options["timeout"] is not None:
            configuration["timeout_seconds"] = options["timeout"]
        if options["context"]:
            configuration["context"] = context_option(options["context"])
        filters = {key: options[key] for key in ("tool", "repository", "folder", "since", "until")
                   if options[key]}  # fmt: skip
        for key in ("repository", "folder"):
            if key in filters:
                filters[key] = str(Path(filters[key]).expanduser().resolve())
        if options["scan"] is not None:
            filters["last"] = options["scan"]
        configuration["filters"] = filters
        commands = {}
        for given in options["verify_commands"]:
            repository, separator, command = given.partition("=")
            if not separator or not repository or not command.strip():
                raise CommandError(f"--verify-command takes REPO=COMMAND, not {given!r}.")
            # A relative program is where the user typed it, as for `replay`.
            commands[str(Path(repository).expanduser().resolve())] = (
                planning.verify_command_from(command, base=Path.cwd())
            )
        if commands:
            configuration["verify_commands"] = commands
        clones = {}
        for given in options["clones"]:
            folder, separator, clone = given.partition("=")
            if not separator or not folder or not clone:
                raise CommandError(f"--clone takes FOLDER=CLONE, not {given!r}.")
            # The recorded folder as recorded (it may not exist here); the clone from here.
            clones[folder] = str(Path(clone).expanduser().resolve())
        if clones:
            configuration["clones"] = clones
        return configuration

    def confirm(self, prompt: str) -> bool:
        if not sys.stdin.isatty():
            raise CommandError(f"{prompt} Pass --yes to approve when there is no terminal to ask.")
        return input(f"{prompt} [y/N] ").strip().lower() in {"y", "yes"}

    # --- output -----------------------------------------------------------------------------

    def progress(self, what: str, done: int, total: int) -> None:
        """Prepare's progress, on stderr (stdout stays the answer, JSON included)."""
        if not self.stderr.isatty() or not total:
            return
        self.stderr.raw(f"\r\x1b[2K{what} {done + 1}/{total}")
        self.stderr.flush()

    def progress_done(self) -> None:
        if self.stderr.isatty():
            self.stderr.raw("\r\x1b[2K")

    def describe(self, campaign: Campaign) -> str:
        counts, estimate = campaign.counts, campaign.estimate
        excluded = counts.get("excluded") or {}
        lines = [
            f"Campaign {campaign.pk}: {campaign.get_status_display().lower()}.",
            f"  scanned {counts.get('scanned', 0)} requests: {counts.get('eligible', 0)} eligible "
            f"({counts.get('gradable', 0)} known gradable), "
            f"{sum(excluded.values())} excluded",
        ]
        for reason, count in excluded.items():
            lines.append(f"    {count:>5}  {ExclusionReason(reason).label.lower()}")
        lines.append(f"  selected {counts.get('selected', 0)} requests")
        for repository, found in sorted(campaign.test_commands.items()):
            if "command" in found:
                origin = found.get("origin") or {}
                where = ("given" if origin.get("given") else
                         f"run by the agent in thread {origin.get('thread_id')}, request "
                         f"{origin.get('turn')}: {origin.get('typed')}")  # fmt: skip
                lines.append(f"  tests of {repository}: {found['command']}  ({where})")
            else:
                lines.append(f"  tests of {repository}: none ({found.get('error', '')})")
        lines.append(f"  models: {', '.join(campaign.configuration['models'])}")
        lines.append(f"  evaluator: {campaign.evaluator or 'none'}")
        for model, item in (estimate.get("models") or {}).items():
            lines.append(f"  estimate {model}: {usd(_money(item.get('cost_usd')))}")
        lines.append(
            f"  estimate in all: {usd(_money(estimate.get('total_cost_usd')))} (judging "
            f"{usd(_money(estimate.get('evaluator_cost_usd')))}), about "
            f"{duration(estimate.get('seconds'))} at {estimate.get('capacity')} runs at once"
        )
        budget = campaign.budget_usd
        lines.append(f"  budget: {usd(budget) if budget is not None else 'none'}")
        lines += [f"  warning: {warning}" for warning in campaign.warnings]
        lines += [f"  blocked: {blocker}" for blocker in campaign.blockers]
        return "\n".join(lines)

    def follow(self, campaign: Campaign) -> None:
        live = self.stdout.isatty() and not self.as_json
        drawn = 0
        try:
            while True:
                campaign = campaign_results.refresh_if_stale(campaign)
                if live:
                    drawn = self.draw(campaign, drawn)
                if campaign.status != CampaignStatus.RUNNING:
                    break
                if (campaign.results.get("members") or {}).get(RunStatus.QUEUED):
                    supervision.dispatch_runs()
                time.sleep(POLL_SECONDS)
                campaign.refresh_from_db()
        except KeyboardInterrupt:
            self.stdout.write("")
            self.stdout.write(
                f"Detached; the campaign goes on. Follow: python manage.py campaign --follow "
                f"{campaign.pk}   Cancel: python manage.py campaign --cancel {campaign.pk}"
            )
            return
        if self.as_json:
            self.print_json(campaign)
            return
        self.stdout.write(self.results_table(campaign))

    def draw(self, campaign: Campaign, previous: int) -> int:
        members = campaign.results.get("members") or {}
        total = sum(members.values()) or 1
        ended = sum(members.get(s, 0) for s in ("completed", "failed", "cancelled"))
        filled = BAR_WIDTH * ended // total
        money = budgets.money_of(campaign)
        spent = f"{usd(money.spent)}" + (
            f" of {usd(campaign.budget_usd)}" if campaign.budget_usd is not None else ""
        )
        line = (
            f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {ended}/{total} ended  "
            + "  ".join(f"{name} {count}" for name, count in sorted(members.items()))
            + f"  spent {spent}"
        )
        if previous:
            self.stdout.raw("\r\x1b[2K")
        self.stdout.raw(line[:200])
        self.stdout.flush()
        return 1

    def results_table(self, campaign: Campaign) -> str:
        results = campaign.results or {}
        header = (
            f"{'model':<30} {'n':>4} {'win':>4} {'tie':>4} {'loss':>4} {'fail':>4} "
            f"{'as good as history (95%)':<26} {'cost':>11} {'vs hist':>8} {'time':>8} "
            f"{'not counted'}"
        )
        lines = ["", f"Campaign {campaign.pk}: {campaign.get_status_display().lower()}.",
                 header, "-" * len(header)]  # fmt: skip
        for row in results.get("models") or []:
            rate = (
                f"{row['rate']:.0%} ({row['rate_low']:.0%}-{row['rate_high']:.0%})"
                if row["rate"] is not None
                else "—"
            )
            ratio = row["cost_ratio_median"]
            apart = dict(row["not_counted_reasons"])
            if row["setup"]:
                apart["setup"] = row["setup"]
            lines.append(
                f"{row['model'][:30]:<30} {row['n']:>4} {row['wins']:>4} {row['ties']:>4} "
                f"{row['losses']:>4} {row['failed']:>4} {rate:<26} "
                f"{usd(_money(row['cost_usd'])):>11} "
                f"{(f'{ratio:.2f}x' if ratio is not None else '—'):>8} "
                f"{duration(row['seconds']):>8} "
                + ", ".join(f"{name} {count}" for name, count in apart.items())
            )
        pairs = results.get("head_to_head") or []
        if pairs:
            lines += ["", "Head to head (requests both ran; sign test, ties left out):"]
            for pair in pairs:
                p = pair["p_value"]
                lines.append(
                    f"  {pair['a']} vs {pair['b']}: {pair['wins']}-{pair['ties']}-"
                    f"{pair['losses']} over {pair['n']}"
                    + (f", p = {p:.3g}" if p is not None else "")
                )
        calibration = results.get("calibration") or {}
        if calibration.get("trusted") is False:
            lines += ["", "Calibration: the judge is not to be trusted here: "
                      + " ".join(calibration["problems"])]  # fmt: skip
        elif calibration.get("trusted"):
            lines += ["", "Calibration: historical did not lose and empty lost, as they must."]
        money = budgets.money_of(campaign)
        lines.append(
            f"\nSpent {usd(money.spent)}"
            + (f" of a {usd(campaign.budget_usd)} budget." if campaign.budget_usd else ".")
        )
        return "\n".join(lines)

    def print_json(self, campaign: Campaign) -> None:
        money = budgets.money_of(campaign)
        results = campaign.results or {}
        self.stdout.write(
            json_text(
                {
                    "campaign": campaign.pk,
                    "status": campaign.status,
                    "counts": campaign.counts,
                    "budget_usd": campaign.budget_usd,
                    "spent_usd": money.spent,
                    "estimate": _numbers(campaign.estimate),
                    "members": results.get("members") or {},
                    "models": _numbers(results.get("models") or []),
                    "head_to_head": results.get("head_to_head") or [],
                    "calibration": results.get("calibration") or {},
                }
            )
        )


def _money(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


def _numbers(value: Any) -> Any:
    """Stored results with their dollars (text, for exactness) as numbers, as --json prints
    money everywhere."""
    if isinstance(value, dict):
        return {
            key: _money(item) if key.endswith("_usd") and isinstance(item, str) else _numbers(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_numbers(item) for item in value]
    return value
