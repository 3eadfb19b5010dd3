"""Campaigns: "would model X have done my last N tasks as well, for less?" answered over a
user's own history, with one approval and a budget (docs/campaigns.md).

Prepare scans the user's own threads that match the filters, newest request first, and
decides for every request with the planning machinery, without asking anyone: eligible,
or excluded with one reason (ExclusionReason). It finds each repository's test command in
what the historical agent itself ran there (its shell calls of a test runner), unless the
user gives one; knows which requests are gradable (their shared review's tests pass at
the historical ending and see the request's own change); selects N (the last, or a seeded
sample); estimates cost and time. One single-use approval of exactly that creates, in one
transaction, one plan and one batch per selected request (approval.create_batch), so every
rule of plans and batches holds for each member. The budget is kept by dispatch
(replays.budgets); the results by replays.evaluation.campaigns as reports are written.
"""

from __future__ import annotations

import hashlib
import random
import secrets
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from replays import (
    access,
    approval,
    context,
    evidence,
    planning,
    pricing,
    processes,
    repos,
    wakeups,
)
from replays.errors import ErrorKind, ServiceError
from replays.evaluation import evaluators
from replays.evaluation.campaign_results import gradability_of
from replays.evaluation.testcommands import find_test_command
from replays.models import (
    Batch,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    ExclusionReason,
    Plan,
    PlanStatus,
    Review,
    ReviewStatus,
    SourceKind,
    Thread,
    Turn,
)
from replays.runspec import DEFAULT_TEST_PATHS
from replays.transcripts.base import TokenUsage

if TYPE_CHECKING:
    from replays.evaluation.review import ReviewKey

# How many requests a campaign selects at most, and scans by default and at most.
MAX_SELECTED = 500
DEFAULT_SCAN = 2000
MAX_SCAN = 10_000
MAX_BUDGET_USD = Decimal(10) ** 9
SELECTIONS = ("last", "sample")
FILTER_KEYS = {"tool", "repository", "folder", "since", "until", "last"}
CONFIGURATION_KEYS = {
    "models", "evaluator", "limit", "selection", "seed", "budget_usd", "gradable_only",
    "filters", "verify_commands", "clones", "context", "timeout_seconds",
}  # fmt: skip

Progress = Callable[[str, int, int], None]


class CampaignInputError(ServiceError):
    """The campaign's configuration is not acceptable."""


class CampaignApprovalError(ServiceError):
    """A campaign's approval refused, with why."""


# --- the configuration ---------------------------------------------------------------------


def normalise_campaign(raw: Any) -> dict[str, Any]:
    """The canonical form of a campaign's configuration (its fingerprint's input)."""
    if not isinstance(raw, dict):
        raise CampaignInputError("The campaign must be a JSON object.")
    unknown = set(raw) - CONFIGURATION_KEYS
    if unknown:
        raise CampaignInputError(
            f"Unknown fields: {', '.join(sorted(unknown))}.", details={"fields": sorted(unknown)}
        )
    try:
        models = planning.normalise_models(raw.get("models"))
        evaluator = planning.normalise_evaluator(raw.get("evaluator"))
        modes = context.normalise_context(raw.get("context"), models)
    except planning.PlanInputError as exc:
        raise CampaignInputError(exc.message, code=exc.code, details=exc.details) from None
    except context.ContextError as exc:
        raise CampaignInputError(str(exc), details={"field": "context"}) from None
    selection = raw.get("selection") or "last"
    if selection not in SELECTIONS:
        raise CampaignInputError(
            f"selection must be one of {', '.join(SELECTIONS)}.", details={"field": "selection"}
        )
    normalised = {
        "models": models,
        "evaluator": evaluator,
        "limit": _whole(raw, "limit", default=20, low=1, high=MAX_SELECTED),
        "selection": selection,
        "seed": _whole(raw, "seed", default=0, low=0, high=2**31) if selection == "sample" else 0,
        "budget_usd": _budget(raw.get("budget_usd")),
        "gradable_only": _flag(raw, "gradable_only"),
        "filters": _filters(raw.get("filters")),
        "verify_commands": _verify_commands(raw.get("verify_commands")),
        "clones": _clones(raw.get("clones")),
        "timeout_seconds": _whole(
            raw, "timeout_seconds", default=settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS,
            low=planning.MIN_TIMEOUT_SECONDS, high=planning.MAX_TIMEOUT_SECONDS,
        ),
    }  # fmt: skip
    if modes is not None:
        normalised["context"] = modes
    return normalised


def _whole(raw: dict[str, Any], key: str, *, default: int, low: int, high: int) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise CampaignInputError(
            f"{key} must be a whole number from {low} to {high}.", details={"field": key}
        )
    return value


def _flag(raw: dict[str, Any], key: str) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise CampaignInputError(f"{key} must be true or false.", details={"field": key})
    return value


def _budget(value: Any) -> str | None:
    """Dollars as a canonical decimal text (a JSON number loses digits), or None."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise CampaignInputError("budget_usd must be a number of dollars.")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise CampaignInputError(
            "budget_usd must be a number of dollars.", details={"field": "budget_usd"}
        ) from None
    if not amount.is_finite() or amount <= 0 or amount > MAX_BUDGET_USD:
        raise CampaignInputError(
            f"budget_usd must be more than 0 and at most {MAX_BUDGET_USD:,}.",
            details={"field": "budget_usd"},
        )
    return str(pricing.round_usd(amount).normalize())


def _filters(raw: Any) -> dict[str, Any]:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict) or set(raw) - FILTER_KEYS:
        raise CampaignInputError(
            f"filters take {', '.join(sorted(FILTER_KEYS))}.", details={"field": "filters"}
        )
    tool = raw.get("tool") or None
    if tool is not None and tool not in SourceKind.values:
        raise CampaignInputError(
            f"filters.tool must be one of {', '.join(SourceKind.values)}.",
            details={"field": "filters.tool"},
        )
    since, until = _day(raw, "since"), _day(raw, "until")
    if since and until and until < since:
        raise CampaignInputError(
            "filters.until is before filters.since.", details={"field": "filters.until"}
        )
    return {
        "tool": tool,
        "repository": _path_or_none(raw, "repository"),
        "folder": _path_or_none(raw, "folder"),
        "since": since,
        "until": until,
        "last": _whole(raw, "last", default=DEFAULT_SCAN, low=1, high=MAX_SCAN),
    }


def _day(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key) or None
    if value is None:
        return None
    try:
        return date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise CampaignInputError(
            f"filters.{key} must be a date written YYYY-MM-DD.", details={"field": key}
        ) from None


def _path_or_none(raw: dict[str, Any], key: str) -> str | None:
    value = raw.get(key) or None
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > planning.MAX_PATH_LENGTH or "\x00" in value:
        raise CampaignInputError(f"filters.{key} must be a path.", details={"field": key})
    return value.rstrip("/") or "/"


def _clones(raw: Any) -> dict[str, str]:
    """{recorded folder: clone}: where the repository of threads recorded in a folder that
    is gone (or elsewhere) is now; what prepare would ask ("Where is a clone of it?")
    answered ahead for every thread of that folder or below it."""
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise CampaignInputError("clones is {recorded folder: clone}.", details={"field": "clones"})
    clones = {}
    for recorded, clone in raw.items():
        if not isinstance(clone, str) or not clone.strip() or "\x00" in clone + str(recorded):
            raise CampaignInputError(
                f"The clone of {recorded} must be a path.", details={"field": "clones"}
            )
        clones[str(recorded).rstrip("/") or "/"] = clone.rstrip("/") or "/"
    return dict(sorted(clones.items()))


def _verify_commands(raw: Any) -> dict[str, str]:
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise CampaignInputError(
            "verify_commands is {repository: command}.", details={"field": "verify_commands"}
        )
    commands = {}
    for repository, command in raw.items():
        if not isinstance(command, str) or not command.strip():
            raise CampaignInputError(
                f"The verify command for {repository} must be a command.",
                details={"field": "verify_commands"},
            )
        try:
            shlex.split(command)
        except ValueError as exc:
            raise CampaignInputError(
                f"The verify command for {repository} cannot be split into words: {exc}.",
                details={"field": "verify_commands"},
            ) from None
        path = str(repository).rstrip("/")
        commands[path] = planning.verify_command_from(command, base=Path(path))
    return dict(sorted(commands.items()))


# --- the scan -------------------------------------------------------------------------------


@dataclass
class Candidate:
    """One scanned request and what the scan decided about it."""

    thread: Thread
    turn: Turn
    position: int
    reason: str = ""  # an ExclusionReason value; "" when eligible
    detail: str = ""
    repository: str = ""
    preparation: planning.ThreadPreparation | None = None
    verify_command: str = ""
    gradable: bool | None = None
    gradable_detail: str = ""
    selected: bool = False

    @property
    def eligible(self) -> bool:
        return not self.reason


@dataclass
class Scan:
    candidates: list[Candidate] = field(default_factory=list)
    # repository -> {"command", "runner", "typed", "origin": {...}} or {"error": ...}
    test_commands: dict[str, dict[str, Any]] = field(default_factory=dict)

    def counts(self) -> dict[str, Any]:
        excluded: dict[str, int] = {}
        for candidate in self.candidates:
            if candidate.reason:
                reason = str(ExclusionReason(candidate.reason).value)
                excluded[reason] = excluded.get(reason, 0) + 1
        return {
            "scanned": len(self.candidates),
            "eligible": sum(1 for c in self.candidates if c.eligible),
            "gradable": sum(1 for c in self.candidates if c.eligible and c.gradable),
            "gradable_unknown": sum(
                1 for c in self.candidates if c.eligible and c.gradable is None
            ),
            "excluded": dict(sorted(excluded.items())),
            "selected": sum(1 for c in self.candidates if c.selected),
        }

    @property
    def selected(self) -> list[Candidate]:
        return [candidate for candidate in self.candidates if candidate.selected]


def scanned_turns(owner: AbstractBaseUser, filters: dict[str, Any]) -> list[Turn]:
    """The owner's own requests the filters keep, newest first, at most `last` of them.
    Only the owner's threads: a campaign never scans another user's history, staff's
    included."""
    threads = Thread.objects.filter(owner=owner)
    if filters["tool"]:
        threads = threads.filter(source_kind=filters["tool"])
    for key in ("folder", "repository"):
        if filters[key]:
            # Threads recorded in it or below it.
            threads = threads.filter(Q(cwd=filters[key]) | Q(cwd__startswith=filters[key] + "/"))
    turns = Turn.objects.filter(thread__in=threads).select_related("thread")
    if filters["since"]:
        turns = turns.filter(timestamp__date__gte=filters["since"])
    if filters["until"]:
        turns = turns.filter(timestamp__date__lte=filters["until"])
    return list(turns.order_by("-timestamp", "-id")[: filters["last"]])


def scan(
    owner: AbstractBaseUser, configuration: dict[str, Any], *, progress: Progress | None = None
) -> Scan:
    """Every request the filters keep, decided (eligible or why not), with each
    repository's test command and what is known of gradability; then the selection."""
    found = Scan()
    turns = scanned_turns(owner, configuration["filters"])
    by_thread: dict[int, list[Turn]] = {}
    with repos.memoized_reads():
        for position, turn in enumerate(turns):
            if progress is not None:
                progress("scanning", position, len(turns))
            candidate = Candidate(thread=turn.thread, turn=turn, position=position)
            _decide(candidate, configuration, by_thread)
            found.candidates.append(candidate)
        found.test_commands = _test_commands(owner, found, configuration)
    for candidate in found.candidates:
        if candidate.eligible and candidate.preparation is not None:
            command = _command_of(found, candidate.repository)
            candidate.verify_command = command
            # Protected like a plan's: the files the command names, as they are now.
            candidate.preparation.verify_files = planning.verify_command_files(
                Path(candidate.repository), command or None
            )
            candidate.gradable, candidate.gradable_detail = known_gradability(candidate)
    return found


def _decide(
    candidate: Candidate, configuration: dict[str, Any], by_thread: dict[int, list[Turn]]
) -> None:
    """Eligible, or one reason: what prepare would say about this request alone. Where
    prepare would ask a person, the request is excluded, never guessed."""
    turn, thread = candidate.turn, candidate.thread
    if turn.rolled_back:
        candidate.reason = ExclusionReason.ROLLED_BACK
        candidate.detail = "The agent rolled this request back."
        return
    folder = _located(thread.cwd, configuration["clones"])
    if not folder or not access.under_roots(folder):
        candidate.reason = ExclusionReason.OUTSIDE_ROOTS
        candidate.detail = f"{folder or '(no folder recorded)'} {access.OUTSIDE_ROOTS}."
        return
    repository = repos.find_repository(Path(folder))
    if repository is None or not access.under_roots(repository):
        candidate.reason = ExclusionReason.REPOSITORY_MISSING
        candidate.detail = f"{folder} is not a git repository here."
        return
    if _changed_nothing(turn):
        candidate.reason = ExclusionReason.NO_CODE_CHANGE
        candidate.detail = "The agent only read and ran commands that change no file."
        return
    item = _item(turn, str(repository))
    prep = planning.resolve_thread(thread, item, verify_command=None)
    if prep.questions:
        question = prep.questions[0]
        candidate.reason = ExclusionReason.NEEDS_PERSON
        candidate.detail = f"Prepare would ask for the {question['field']}: {question['message']}"
        return
    if prep.blockers:
        candidate.reason, candidate.detail = ExclusionReason.BLOCKED, prep.blockers[0]
        return
    candidate.repository = prep.repository
    if prep.historical_result_sha256 == EMPTY_DIFF_SHA256:
        candidate.reason = ExclusionReason.NO_CODE_CHANGE
        candidate.detail = "The request changed no file (a question, a look around)."
        return
    planning.resolve_thread_context(prep, thread, {**configuration, "configurations": [item]})
    if prep.blockers:
        # An explicit context no chosen model can be given (a fork of another tool's).
        candidate.reason, candidate.detail = ExclusionReason.CANNOT_REPLAY, prep.blockers[0]
        return
    candidate.preparation = prep


def _located(recorded: str, clones: dict[str, str]) -> str:
    """Where a thread's recorded folder is now: its place in the clone given for it (the
    longest recorded folder that holds it), else itself."""
    for folder in sorted(clones, key=len, reverse=True):
        if recorded == folder or recorded.startswith(folder.rstrip("/") + "/"):
            return clones[folder] + recorded[len(folder.rstrip("/")) :]
    return recorded


EMPTY_DIFF_SHA256 = hashlib.sha256(b"").hexdigest()
# Evidence items that change files whatever they hold.
CHANGING_KINDS = frozenset({"edit", "write", "patch", "other"})


def _changed_nothing(turn: Turn) -> bool:
    """The request's own evidence says its agent changed no file: it only read, and every
    shell command it ran only reads or runs tests. False when unsure (no evidence kept,
    or cut short), so prepare decides."""
    recorded = turn.evidence or {}
    items = recorded.get("items")
    if not isinstance(items, list) or recorded.get("cut"):
        return False
    for item in items:
        if not isinstance(item, dict) or item.get("kind") in CHANGING_KINDS:
            return False
        if item.get("kind") == "shell" and evidence.shell_may_write(item):
            if find_test_command(str(item.get("command") or "")) is None:
                return False
    return True


def _item(turn: Turn, repository: str) -> dict[str, Any]:
    """The request as one plan's thread item: itself alone, in its repository."""
    return {
        "thread_id": turn.thread_id,
        "start_message_uuid": turn.message_uuid,
        "end_message_uuid": turn.message_uuid,
        "repository": repository,
        "baseline_commit": None,
        "ending_commit": None,
        "request": None,
        "thread_title": None,
    }


def _same_path(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a.rstrip("/") == b.rstrip("/")


# --- test commands and gradability ---------------------------------------------------------


def _test_commands(
    owner: AbstractBaseUser, found: Scan, configuration: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """Per repository of the eligible requests: the user's command, else the test runner
    the historical agent itself last ran there (with where it came from), made runnable
    from the repository (a relative program is taken from it); or why there is none."""
    given = configuration["verify_commands"]
    recorded: dict[str, set[str]] = {}
    for candidate in found.candidates:
        if candidate.eligible:
            recorded.setdefault(candidate.repository, set()).add(candidate.thread.cwd)
    commands: dict[str, dict[str, Any]] = {}
    for repository in sorted(recorded):
        if repository in given:
            commands[repository] = {"command": given[repository], "origin": {"given": True}}
            continue
        commands[repository] = _found_command(
            owner, repository, recorded[repository], configuration["clones"]
        )
    return commands


def _found_command(
    owner: AbstractBaseUser, repository: str, folders: set[str], clones: dict[str, str]
) -> dict[str, Any]:
    """The test runner last run by a historical agent in `repository` (any of the user's
    threads whose folder is in it, or was recorded in one of `folders`, the folders its
    requests were made in), newest request first."""
    where = Q(thread__cwd=repository) | Q(thread__cwd__startswith=repository + "/")
    for folder in folders:
        where |= Q(thread__cwd=folder)
    turns = (
        Turn.objects.filter(thread__owner=owner)
        .filter(where)
        .select_related("thread")
        .order_by("-timestamp", "-id")
    )
    for turn in turns[:500]:
        for item in reversed((turn.evidence or {}).get("items") or []):
            if not isinstance(item, dict) or item.get("kind") != "shell":
                continue
            found = find_test_command(str(item.get("command") or ""))
            if found is None:
                continue
            origin = {"thread_id": turn.thread_id, "turn": turn.index + 1,
                      "message_uuid": turn.message_uuid, "typed": found.typed}  # fmt: skip
            # Where the agent typed it: its folder, where that is now.
            typed_in = _located(turn.thread.cwd or "", clones)
            base = Path(typed_in if typed_in.startswith(repository) else repository)
            try:
                command = planning.verify_command_from(found.verify_command, base=base)
            except planning.PlanInputError as exc:
                return {"error": exc.message, "runner": found.runner, "origin": origin}
            return {"command": command, "runner": found.runner, "origin": origin}
    return {"error": "No test runner was found among the commands the agents ran here."}


def _command_of(found: Scan, repository: str) -> str:
    return str(found.test_commands.get(repository, {}).get("command") or "")


def known_gradability(candidate: Candidate) -> tuple[bool | None, str]:
    """Whether the request is gradable, as far as a shared review of its range already
    says (None: not known until its tests run); False without a test command."""
    if not candidate.verify_command:
        return False, "No test command for its repository."
    review = _tests_review(candidate)
    if review is None:
        return None, "Its tests have not run yet."
    return gradability_of(review)


def _tests_key(candidate: Candidate) -> ReviewKey:
    """The key of the request's shared review by `tests` (the one every batch would use)."""
    from replays.evaluation.review import ReviewKey

    prep = candidate.preparation
    assert prep is not None
    return ReviewKey(
        thread_id=candidate.thread.pk, start_message_uuid=prep.start_message_uuid,
        end_message_uuid=prep.end_message_uuid, baseline_commit=prep.baseline_commit,
        ending_commit=prep.ending_commit, historical_result_sha256=prep.historical_result_sha256,
        evaluator=evaluators.TESTS, verify_command=candidate.verify_command,
        test_paths=DEFAULT_TEST_PATHS,
    )  # fmt: skip


def _tests_review(candidate: Candidate) -> Review | None:
    key = _tests_key(candidate)
    return Review.objects.filter(**key.lookup()).exclude(status=ReviewStatus.PENDING).first()


def check_gradability(candidate: Candidate, *, tick: Callable[[], None]) -> None:
    """Run the request's historical tests now (the shared review by `tests`: sandboxed,
    no model, free) and record whether it is gradable."""
    from replays.evaluation.review import ReviewInputs, obtain_review

    prep = candidate.preparation
    assert prep is not None
    key = _tests_key(candidate)
    inputs = ReviewInputs(
        repository=Path(prep.repository), request=prep.request,
        timeout_seconds=float(settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS),
    )  # fmt: skip
    review = obtain_review(key=key, inputs=inputs, requested_at=timezone.now(), tick=tick)
    candidate.gradable, candidate.gradable_detail = gradability_of(review)


# --- selection and estimates -------------------------------------------------------------------


def select(
    found: Scan,
    configuration: dict[str, Any],
    *,
    evaluator: str = "",
    progress: Progress | None = None,
    tick: Callable[[], None] = lambda: None,
) -> None:
    """The last N eligible requests (newest first), or a seeded sample of N; restricted to
    gradable ones when asked (their tests are run as needed, in the selection's order).
    Judged by `tests`, a request of a repository without a test command cannot be judged:
    it is excluded as not gradable."""
    if evaluator == evaluators.TESTS:
        for candidate in found.candidates:
            if candidate.eligible and not candidate.verify_command:
                candidate.reason = ExclusionReason.NOT_GRADABLE
                candidate.detail = (
                    "No test command for its repository: the `tests` evaluator cannot judge it."
                )
    eligible = [candidate for candidate in found.candidates if candidate.eligible]
    if configuration["selection"] == "sample":
        eligible = random.Random(configuration["seed"]).sample(eligible, len(eligible))
    wanted = configuration["limit"]
    chosen: list[Candidate] = []
    for number, candidate in enumerate(eligible):
        if len(chosen) >= wanted:
            break
        if configuration["gradable_only"]:
            if candidate.gradable is None:
                if progress is not None:
                    progress("checking gradability", number, len(eligible))
                check_gradability(candidate, tick=tick)
            if not candidate.gradable:
                continue
        chosen.append(candidate)
    for candidate in chosen:
        candidate.selected = True
    if configuration["gradable_only"]:
        for candidate in eligible:
            if candidate.gradable is False and not candidate.selected:
                candidate.reason = ExclusionReason.NOT_GRADABLE
                candidate.detail = candidate.gradable_detail


def estimate(found: Scan, configuration: dict[str, Any], evaluator: str) -> dict[str, Any]:
    """What the selection may cost and take: each request's historical tokens priced for
    each model (unknown where a price is unknown, never $0), the evaluator's judgments on
    top (its model's price for the two verdicts and the checks; `tests` costs nothing),
    and the time at the current capacity."""
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    selected = found.selected
    per_model: dict[str, dict[str, Any]] = {}
    seconds_total = 0.0
    for model in configuration["models"]:
        name = priced_name(model)
        usage = [turn_usage(candidate.turn) for candidate in selected]
        costs = [
            Decimal(0) if name is None else pricing.cost_usd(name, one, table) for one in usage
        ]
        seconds = sum(candidate.turn.seconds or 0.0 for candidate in selected)
        seconds_total += seconds
        per_model[model] = {"cost_usd": _sum(costs), "seconds": round(seconds, 1),
                            "per_request": [_text(cost) for cost in costs]}  # fmt: skip
    judging = _evaluator_estimate(selected, configuration, evaluator, table)
    models_cost = [_decimal(item["cost_usd"]) for item in per_model.values()]
    total = _sum([*models_cost, _decimal(judging)])
    capacity = max(1, int(settings.REPLAYS_MAX_PARALLEL_RUNS))
    runs = len(selected) * len(configuration["models"])
    return {
        "models": {
            model: {**item, "cost_usd": _text(item["cost_usd"])}
            for model, item in per_model.items()
        },  # fmt: skip
        "evaluator_cost_usd": _text(judging),
        # Each member holds its share of the judging within the budget until it is judged.
        "evaluator_per_run_usd": _text(judging / runs if judging is not None and runs else None),
        "total_cost_usd": _text(total),
        "runs": len(selected) * len(configuration["models"]),
        "seconds": round(seconds_total / capacity, 1),
        "capacity": capacity,
    }


def run_estimate(usage: TokenUsage, model: str, table: pricing.PriceTable) -> Decimal | None:
    """One member's expected cost: its request's historical tokens at the model's price
    (a baseline calls no model: $0; an unknown price: None)."""
    name = priced_name(model)
    return Decimal(0) if name is None else pricing.cost_usd(name, usage, table)


def priced_name(model: str) -> str | None:
    """The model's name in the price table; None for a baseline (it calls no model)."""
    from replays import agents

    try:
        info = agents.resolve_model(model)
    except agents.UnknownModel:
        return model.partition(":")[2] or model
    return None if info.is_baseline else (info.model or model)


def turn_usage(turn: Turn) -> TokenUsage:
    return TokenUsage(
        input_tokens=turn.input_tokens, output_tokens=turn.output_tokens,
        cache_read_tokens=turn.cache_read_tokens,
        cache_write_5m_tokens=turn.cache_write_5m_tokens,
        cache_write_1h_tokens=turn.cache_write_1h_tokens,
    )  # fmt: skip


def _evaluator_estimate(
    selected: list[Candidate], configuration: dict[str, Any], evaluator: str,
    table: pricing.PriceTable,
) -> Decimal | None:  # fmt: skip
    """A model evaluator reads the request and both diffs twice per run, and derives the
    checks once per request: about three calls per member at its price."""
    if not evaluator or evaluator == evaluators.TESTS:
        return Decimal(0)
    from replays import agents

    try:
        info = agents.resolve_model(evaluator)
    except agents.UnknownModel:
        return None
    total = Decimal(0)
    calls = 2 * len(configuration["models"]) + 1
    for candidate in selected:
        words = len(candidate.turn.request) + 2 * len(candidate.turn.final_answer or "") + 4000
        usage = TokenUsage(input_tokens=words // 4 * calls, output_tokens=400 * calls)
        cost = pricing.cost_usd(info.model, usage, table)
        if cost is None:
            return None
        total += cost
    return total


def _sum(values: list[Decimal | None]) -> Decimal | None:
    if any(value is None for value in values):
        return None
    return sum((value for value in values if value is not None), Decimal(0))


def _text(value: Decimal | None) -> str | None:
    return None if value is None else str(pricing.round_usd(value))


def _decimal(value: Any) -> Decimal | None:
    return None if value is None else Decimal(str(value))


# --- prepare ----------------------------------------------------------------------------------


@dataclass
class PreparedCampaign:
    campaign: Campaign
    prepare_token: str | None  # shown once; None when it cannot be approved


def prepare_campaign(
    *,
    owner: AbstractBaseUser,
    raw_configuration: Any,
    progress: Progress | None = None,
    tick: Callable[[], None] = lambda: None,
) -> PreparedCampaign:
    """Scan, select, estimate; a Campaign ready for one approval (or blocked, saying why)."""
    configuration = normalise_campaign(raw_configuration)
    evaluator, blockers, warnings = _evaluator_of(configuration)
    found = scan(owner, configuration, progress=progress)
    select(found, configuration, evaluator=evaluator, progress=progress, tick=tick)
    found_estimate = estimate(found, configuration, evaluator)
    blockers += _blockers(found, configuration, found_estimate)
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    with transaction.atomic():
        campaign = Campaign.objects.create(
            owner=owner,
            configuration=configuration,
            fingerprint=_fingerprint(configuration, found),
            status=CampaignStatus.BLOCKED if blockers else CampaignStatus.READY_FOR_APPROVAL,
            evaluator=evaluator,
            budget_usd=_decimal(configuration["budget_usd"]),
            counts=found.counts(),
            estimate=found_estimate,
            test_commands=found.test_commands,
            blockers=blockers,
            warnings=warnings,
            approval_prompt="" if blockers else _prompt(found, configuration),
            token_hash=planning.hash_token(token),
            created_at=now,
            expires_at=now + timedelta(seconds=settings.REPLAYS_PREPARE_TOKEN_SECONDS),
        )
        CampaignRequest.objects.bulk_create(_rows(campaign, found))
    return PreparedCampaign(campaign, None if blockers else token)


def preview(owner: AbstractBaseUser, raw_configuration: Any) -> dict[str, Any]:
    """The counts prepare would show, nothing stored (the form's live preview)."""
    configuration = normalise_campaign(raw_configuration)
    evaluator, _, _ = _evaluator_of(configuration)
    found = scan(owner, configuration)
    # As prepare selects, but no test runs for a preview: gradable only counts what is known.
    select(found, {**configuration, "gradable_only": False}, evaluator=evaluator)
    counts = found.counts()
    eligible = [c for c in found.candidates if c.eligible and
                (c.gradable is not False or not configuration["gradable_only"])]  # fmt: skip
    return {**counts, "would_select": min(configuration["limit"], len(eligible))}


def _evaluator_of(configuration: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """The campaign's one evaluator, as a plan resolves it (the verify commands are
    found per repository later: `tests` is possible whenever some repository has one)."""
    plan_like = {**configuration, "verify_command": "(found per repository)"}
    return planning.resolve_plan_evaluator(plan_like)


def _blockers(
    found: Scan, configuration: dict[str, Any], found_estimate: dict[str, Any]
) -> list[str]:
    blockers = []
    if not found.selected:
        blockers.append("No request of the history is eligible: nothing to replay (see why "
                        "each was excluded).")  # fmt: skip
    if configuration["budget_usd"] is not None and found_estimate["total_cost_usd"] is None:
        unknown = [m for m, item in found_estimate["models"].items() if item["cost_usd"] is None]
        blockers.append(
            "A budget cannot be kept without prices: "
            + (f"{', '.join(unknown)} has no price." if unknown else "the evaluator has none.")
        )
    for model in configuration["models"]:
        from replays import agents

        info = agents.resolve_model(model)
        if not info.available:
            blockers.append(f"Model {model} cannot run here: {info.reason}")
    return blockers


def _prompt(found: Scan, configuration: dict[str, Any]) -> str:
    requests, models = len(found.selected), len(configuration["models"])
    budget = configuration["budget_usd"]
    return (
        f"Approve {requests} request{'s' if requests != 1 else ''} using {models} "
        f"model{'s' if models != 1 else ''} ({requests * models} runs)"
        + (f" within ${budget}?" if budget else "?")
    )


def _fingerprint(configuration: dict[str, Any], found: Scan) -> str:
    """What one approval covers: the configuration, each selected request and what it was
    resolved to (commits, historical result, transcript), and the test commands."""
    selection = [
        {
            "message_uuid": candidate.turn.message_uuid,
            "transcript_sha256": candidate.thread.source_sha256,
            **(candidate.preparation.protected_inputs() if candidate.preparation else {}),
            "verify_command": candidate.verify_command,
        }
        for candidate in found.selected
    ]
    return planning.fingerprint({"configuration": configuration, "selection": selection})


def _rows(campaign: Campaign, found: Scan) -> list[CampaignRequest]:
    return [
        CampaignRequest(
            campaign=campaign,
            thread=candidate.thread,
            turn=candidate.turn,
            message_uuid=candidate.turn.message_uuid,
            request=candidate.turn.request,
            timestamp=candidate.turn.timestamp,
            history_cost_usd=candidate.turn.cost_usd,
            history_seconds=candidate.turn.seconds,
            history_usage=turn_usage(candidate.turn).as_dict(),
            position=candidate.position,
            eligible=candidate.eligible,
            reason=candidate.reason,
            detail=candidate.detail,
            gradable=candidate.gradable,
            gradable_detail=candidate.gradable_detail,
            selected=candidate.selected,
            repository=candidate.repository,
            verify_command=candidate.verify_command,
            preparation=candidate.preparation.stored() if candidate.preparation else {},
        )
        for candidate in found.candidates
    ]


# --- approve -------------------------------------------------------------------------------------


@dataclass
class CampaignApproval:
    campaign: Campaign
    batches: list[Batch]
    idempotent: bool


def approve_campaign(
    *, campaign_id: int, user: AbstractBaseUser, approved: Any, prepare_token: Any
) -> CampaignApproval:
    """Every member of the campaign, in one transaction: per selected request a plan and
    its batch with every run queued. Single use: a second approval returns the same
    campaign (idempotent); a changed input (a transcript, a commit, a test command's
    files) refuses, as for plans."""
    if approved is not True:
        raise CampaignApprovalError(
            "Nothing runs without an explicit approval: send approved: true.",
            code="approval_required",
        )
    campaign = _campaign_of_token(campaign_id, user, prepare_token)
    if campaign.approved_at is not None:
        return CampaignApproval(campaign, list(campaign.batches.order_by("id")), True)
    if campaign.is_expired:
        raise CampaignApprovalError(
            "The prepare token expired. Prepare the campaign again.",
            code="token_expired", kind=ErrorKind.GONE,
        )  # fmt: skip
    if campaign.status != CampaignStatus.READY_FOR_APPROVAL:
        raise CampaignApprovalError(
            f"The campaign is {campaign.get_status_display().lower()}: it cannot be approved.",
            code="campaign_not_ready", kind=ErrorKind.CONFLICT,
            details={"blockers": campaign.blockers},
        )  # fmt: skip
    members = _unchanged_members(campaign)
    try:
        with transaction.atomic():
            # Single use: only the approval that moves it out of ready makes the members.
            won = Campaign.objects.filter(
                pk=campaign.pk, status=CampaignStatus.READY_FOR_APPROVAL, approved_at=None
            ).update(status=CampaignStatus.RUNNING, approved_at=timezone.now())
            if not won:
                raise _AlreadyApproved()
            batches = [_member_batch(campaign, request, thread) for request, thread in members]
            processes.pause_point("campaign_approval_in_transaction")
            wakeups.request_dispatch()
    except (_AlreadyApproved, IntegrityError):
        campaign.refresh_from_db()
        return CampaignApproval(campaign, list(campaign.batches.order_by("id")), True)
    campaign.refresh_from_db()
    return CampaignApproval(campaign, batches, False)


class _AlreadyApproved(Exception):
    pass


def _campaign_of_token(campaign_id: int, user: AbstractBaseUser, prepare_token: Any) -> Campaign:
    if not isinstance(prepare_token, str) or not prepare_token:
        raise CampaignApprovalError("prepare_token is required.", code="token_required")
    campaign = Campaign.objects.visible_to(user).filter(pk=campaign_id).first()
    if campaign is None:
        raise CampaignApprovalError(
            f"Campaign {campaign_id} not found.", code="not_found", kind=ErrorKind.NOT_FOUND
        )
    if not approval.token_matches(approval.offered_token_hash(prepare_token), campaign.token_hash):
        raise CampaignApprovalError(
            "Unknown prepare token.", code="unknown_token", kind=ErrorKind.NOT_ALLOWED
        )
    return campaign


def _unchanged_members(campaign: Campaign) -> list[tuple[CampaignRequest, Thread]]:
    """The selected requests, refused when one's inputs changed since prepare: its
    transcript, its historical result (the commits and their diff), the files of its
    repository's test command."""
    members = list(
        campaign.requests.filter(selected=True).select_related("thread").order_by("position")
    )
    changes = []
    if len(members) != campaign.counts.get("selected"):
        changes.append("requests of the selection are gone (their thread was deleted)")
    for request in members:
        prep = request.preparation
        thread = request.thread
        if planning.transcript_digest(thread) != prep.get("transcript_sha256"):
            changes.append(f"the transcript of thread {thread.pk} changed")
            continue
        try:
            diff = repos.historical_diff(
                Path(prep["repository"]), prep["baseline_commit"], prep["ending_commit"]
            )
        except repos.GitError as exc:
            changes.append(f"the history of thread {thread.pk} cannot be read: {exc}")
            continue
        if repos.sha256_text(diff) != prep["historical_result_sha256"]:
            changes.append(f"the historical result of thread {thread.pk} changed")
        files = planning.verify_command_files(
            Path(prep["repository"]), request.verify_command or None
        )
        if files != prep.get("verify_files", {}):
            changes.append(f"the test command's files for thread {thread.pk} changed")
    if changes:
        raise CampaignApprovalError(
            "Inputs changed since prepare: " + "; ".join(changes[:10])
            + (f" (and {len(changes) - 10} more)" if len(changes) > 10 else "")
            + ". Prepare the campaign again.",
            code="protected_input_changed", kind=ErrorKind.CONFLICT,
            details={"changes": changes},
        )  # fmt: skip
    return [(request, request.thread) for request in members]


def _member_batch(campaign: Campaign, request: CampaignRequest, thread: Thread) -> Batch:
    """One selected request as a ready plan and its batch (every run queued)."""
    configuration = campaign.configuration
    prep = planning.ThreadPreparation.from_dict(request.preparation)
    plan_configuration = planning.normalise_configuration(
        {
            "configurations": [
                {
                    "thread_id": thread.pk,
                    "start_message_uuid": prep.start_message_uuid,
                    "end_message_uuid": prep.end_message_uuid,
                    "repository": prep.repository,
                }
            ],
            "models": configuration["models"],
            "evaluator": campaign.evaluator or None,
            "verify_command": request.verify_command or None,
            "timeout_seconds": configuration["timeout_seconds"],
            **({"context": configuration["context"]} if "context" in configuration else {}),
        }
    )
    for model in plan_configuration["models"]:
        prep.prepared_configuration_sha256[model] = planning.prepared_configuration_sha256(
            prep, model, plan_configuration, campaign.evaluator
        )
    plan = Plan.objects.create(
        owner=campaign.owner,
        configuration=plan_configuration,
        fingerprint=planning.fingerprint(plan_configuration),
        preparations=[prep.as_dict()],
        status=PlanStatus.READY_FOR_APPROVAL,
        evaluator=campaign.evaluator,
        approval_prompt=f"Part of campaign {campaign.pk}",
        token_hash=hashlib.sha256(secrets.token_bytes(32)).hexdigest(),
        created_at=campaign.created_at,
        expires_at=campaign.expires_at,
    )
    CampaignRequest.objects.filter(pk=request.pk).update(plan=plan)
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    share = _decimal(campaign.estimate.get("evaluator_per_run_usd")) or Decimal(0)
    estimates = {}
    for model in plan_configuration["models"]:
        cost = run_estimate(TokenUsage(**request.history_usage), model, table)
        estimates[model] = None if cost is None else cost + share
    return approval.create_batch(
        plan,
        {thread.pk: (thread, prep)},
        campaign=campaign,
        estimates=estimates,
        ask_for_dispatch=False,
    )


# --- cancel --------------------------------------------------------------------------------------


def cancel_campaign(*, campaign: Campaign) -> Campaign:
    """Cancel every member that has not ended (idempotent); the campaign then ends as
    cancelled once nothing runs."""
    from replays import dispatch

    for batch in campaign.batches.all():
        dispatch.cancel_batch(batch=batch)
    Campaign.objects.filter(
        pk=campaign.pk, status__in=[CampaignStatus.RUNNING, CampaignStatus.READY_FOR_APPROVAL]
    ).update(status=CampaignStatus.CANCELLED)
    campaign.refresh_from_db()
    return campaign
