"""Approve: consume a ready Plan once, creating its Batch and every Run in one transaction.

The database decides single use: Batch has a unique constraint on its plan, so two
approvals racing create one batch and both callers get it.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from replays import context, planning, wakeups
from replays.errors import ErrorKind, ServiceError
from replays.models import Batch, Campaign, LaunchError, Plan, PlanStatus, Run, Thread
from replays.runspec import RunSpec

CONFIGURATION_CHANGED = "The approved configuration changed. Prepare and approve it again."
# What planning's secrets.token_urlsafe(32) gives (43 characters), with room to spare:
# anything else is no token of ours, and is not even hashed.
TOKEN_SHAPE = re.compile(r"[A-Za-z0-9_-]{1,128}")


class ApprovalError(ServiceError):
    """An approval refused, with why."""


@dataclass
class ApprovalResult:
    batch: Batch
    runs: list[Run]
    launch_errors: list[LaunchError]
    idempotent: bool


def approve_plan(
    *, plan_id: int, user: AbstractBaseUser, approved: Any, prepare_token: Any, run_config: Any
) -> ApprovalResult:
    """The batch of an approved plan: made now (every run queued, in one transaction), or
    the one an earlier approval of the same plan made. ApprovalError says why not."""
    if approved is not True:
        raise ApprovalError(
            "Nothing runs without an explicit approval: send approved: true.",
            code="approval_required",
        )
    plan = _plan_of_token(plan_id, user, prepare_token)
    _require_same_configuration(plan, run_config)
    existing = plan.batch
    if existing is not None:
        # The same approval again (a retry, a restart): the same batch, nothing new.
        return _result(existing, idempotent=True)
    if plan.is_expired:
        raise ApprovalError(
            "The prepare token expired. Prepare the plan again.",
            code="token_expired",
            kind=ErrorKind.GONE,
        )
    if plan.status != PlanStatus.READY_FOR_APPROVAL:
        raise ApprovalError(
            f"The plan {planning.status_phrase(plan.status)}: it cannot be approved.",
            code="plan_not_ready",
            kind=ErrorKind.CONFLICT,
            details={"blockers": plan.blockers, "questions": plan.questions},
        )
    return _create_batch(plan, _unchanged_inputs(plan))


def offered_token_hash(prepare_token: str) -> str:
    """The sha256 of a prepare token of the right shape; "" for anything else (never matches)."""
    return planning.hash_token(prepare_token) if TOKEN_SHAPE.fullmatch(prepare_token) else ""


def token_matches(offered_hash: str, stored_hash: str) -> bool:
    """Whether an offered token's hash is the stored one (compared in constant time)."""
    return bool(offered_hash) and hmac.compare_digest(offered_hash, stored_hash)


def _plan_of_token(plan_id: int, user: AbstractBaseUser, prepare_token: Any) -> Plan:
    """The plan, when the token is its own (only its sha256 is stored)."""
    if not isinstance(prepare_token, str) or not prepare_token:
        raise ApprovalError("prepare_token is required.", code="token_required")
    plan = Plan.objects.visible_to(user).filter(pk=plan_id).first()
    if plan is None:
        raise ApprovalError(
            f"Plan {plan_id} not found.", code="not_found", kind=ErrorKind.NOT_FOUND
        )
    token_hash = offered_token_hash(prepare_token)
    if not token_matches(token_hash, plan.token_hash):
        if token_hash and Plan.objects.filter(token_hash=token_hash).exists():
            raise ApprovalError(
                "This prepare token belongs to another plan.",
                code="foreign_token",
                kind=ErrorKind.NOT_ALLOWED,
            )
        raise ApprovalError(
            "Unknown prepare token.", code="unknown_token", kind=ErrorKind.NOT_ALLOWED
        )
    return plan


def _require_same_configuration(plan: Plan, run_config: Any) -> None:
    """The configuration sent is the one prepared, exactly (by its fingerprint)."""
    try:
        given = planning.normalise_configuration(run_config)
    except planning.PlanInputError as exc:
        raise ApprovalError(
            CONFIGURATION_CHANGED,
            code="configuration_changed",
            kind=ErrorKind.CONFLICT,
            details={"reason": exc.message},
        ) from None
    if planning.fingerprint(given) != plan.fingerprint:
        raise ApprovalError(
            CONFIGURATION_CHANGED, code="configuration_changed", kind=ErrorKind.CONFLICT
        )


def _unchanged_inputs(plan: Plan) -> dict[int, tuple[Thread, planning.ThreadPreparation]]:
    """Every thread resolved again (the batch is made from these), refused when anything
    prepare depended on changed meanwhile: the inputs, or the evaluator it resolved."""
    changes, current = protected_input_changes(plan)
    evaluator, blockers, _ = planning.resolve_plan_evaluator(plan.configuration)
    if evaluator != plan.evaluator or blockers:
        changes.append(
            {
                "thread_id": None,
                "input": "evaluator",
                "message": f"the evaluator changed ({plan.evaluator or 'none'} at prepare, "
                f"{evaluator or 'none'} now{': ' + blockers[0] if blockers else ''})",
            }
        )
    if changes:
        raise ApprovalError(
            "Inputs changed since prepare: "
            + "; ".join(c["message"] for c in changes)
            + ". Prepare and approve it again.",
            code="protected_input_changed",
            kind=ErrorKind.CONFLICT,
            details={"changes": changes},
        )
    return current


def protected_input_changes(
    plan: Plan,
) -> tuple[list[dict[str, Any]], dict[int, tuple[Thread, planning.ThreadPreparation]]]:
    """Resolve every thread again (git, files) and name what differs from prepare; also
    hand back the fresh resolutions, which the batch is made from when nothing changed."""
    configuration = plan.configuration
    threads = Thread.objects.visible_to(plan.owner).in_bulk(
        [item["thread_id"] for item in configuration["configurations"]]
    )
    changes: list[dict[str, Any]] = []
    current: dict[int, tuple[Thread, planning.ThreadPreparation]] = {}
    labels = {
        "transcript_sha256": "the transcript",
        "repository": "the repository",
        "baseline_commit": "the baseline commit",
        "ending_commit": "the ending commit",
        "historical_result_sha256": "the historical result",
        "verify_files": "the verify command's files",
        "request_sha256": "the request text",
        "rebuilt": "the tree rebuilt from the transcript",
        "context": "the context a model gets",
        "digest_sha256": "the digest of the earlier requests",
    }
    for item, prepared in zip(configuration["configurations"], plan.preparations, strict=True):
        thread = threads.get(item["thread_id"])
        if thread is None:
            changes.append(
                {
                    "thread_id": item["thread_id"],
                    "input": "thread",
                    "message": f"thread {item['thread_id']} was deleted",
                }
            )
            continue
        try:
            now = planning.resolve_thread(
                thread, item, verify_command=configuration["verify_command"]
            )
        except planning.PlanInputError as exc:
            changes.append({"thread_id": thread.pk, "input": "thread", "message": exc.message})
            continue
        planning.resolve_thread_context(now, thread, configuration)
        current[thread.pk] = (thread, now)
        inputs = now.protected_inputs()
        prepared_inputs = {
            **prepared,
            "context": {model: item["mode"] for model, item in prepared.get("context", {}).items()},
        }
        for key, label in labels.items():
            # Preparations stored before results were rebuilt have no "rebuilt": none was.
            if inputs[key] != prepared_inputs.get(key, {} if key == "rebuilt" else None):
                changes.append(
                    {
                        "thread_id": thread.pk,
                        "input": key,
                        "message": f"{label} of thread {thread.pk} changed",
                    }
                )
    return changes, current


def configuration_columns(spec: RunSpec) -> dict[str, str]:
    """The Run columns that copy fields of its spec (what the leaderboard filters and
    groups on), for Run(..., **configuration_columns(spec))."""
    return {
        "repository": spec.repository,
        "start_message_uuid": spec.start_message_uuid,
        "end_message_uuid": spec.end_message_uuid,
        "context": spec.context,
    }


def run_spec(
    plan: Plan,
    prepared: dict[str, Any],
    item: dict[str, Any],
    model: str,
    thread: Thread,
    resolved: planning.ThreadPreparation,
    *,
    batch_id: int | None = None,
) -> RunSpec:
    """The exact configuration one member runs with (also written into its run folder)."""
    mode = resolved.mode_of(model)
    return RunSpec(
        plan_id=plan.pk,
        batch_id=batch_id,
        thread_id=thread.pk,
        thread_title=item["thread_title"] or thread.title,
        model=model,
        repository=prepared["repository"],
        baseline_commit=prepared["baseline_commit"],
        ending_commit=prepared["ending_commit"],
        historical_result_sha256=prepared["historical_result_sha256"],
        start_message_uuid=prepared["start_message_uuid"],
        end_message_uuid=prepared["end_message_uuid"],
        request=resolved.request,
        # One turn each, in order: the first starts the candidate's session, the next resume it.
        requests=tuple(resolved.requests),
        timeout_seconds=plan.configuration["timeout_seconds"],
        verify_command=plan.configuration["verify_command"] or "",
        test_paths=tuple(planning.effective_test_paths(plan.configuration)),
        evaluator=plan.evaluator,
        # What the agent knows before the request (replays.context), and why.
        context=mode,
        context_reason=resolved.context.get(model, {}).get("reason", ""),
        # The digest's preamble, which the first turn's request file starts with.
        preamble=resolved.digest if mode == context.DIGEST else "",
        # A fork cuts the transcript the approval saw (the coordinator checks it still is).
        transcript_sha256=prepared["transcript_sha256"],
        prepared_configuration_sha256=prepared["prepared_configuration_sha256"][model],
        # What was rebuilt from the transcript (the report says so), {} when nothing was.
        rebuilt=prepared.get("rebuilt") or {},
    )


def _create_batch(
    plan: Plan, current: dict[int, tuple[Thread, planning.ThreadPreparation]]
) -> ApprovalResult:
    try:
        batch = create_batch(plan, current)
    except IntegrityError:
        # Another approval of the same plan won the race: hand back its batch.
        found = Batch.objects.filter(plan=plan).first()
        if found is None:
            raise
        return _result(found, idempotent=True)
    return _result(batch, idempotent=False)


def create_batch(
    plan: Plan,
    current: dict[int, tuple[Thread, planning.ThreadPreparation]],
    *,
    campaign: Campaign | None = None,
    estimates: dict[str, Decimal | None] | None = None,
    ask_for_dispatch: bool = True,
) -> Batch:
    """The plan's batch and every run (queued), in one transaction: membership is durable
    before anything starts. A campaign's member carries each model's cost estimate (what
    its budget counts while it runs). IntegrityError when the plan has its batch already."""
    configuration = plan.configuration
    with transaction.atomic():
        batch = Batch.objects.create(
            plan=plan,
            owner=plan.owner,
            models_list=configuration["models"],
            configuration=configuration,
            thread_count=len(configuration["configurations"]),
            evaluator=plan.evaluator,
            approved_at=timezone.now(),
            campaign=campaign,
        )
        runs = []
        for item, prepared in zip(configuration["configurations"], plan.preparations, strict=True):
            thread, resolved = current[item["thread_id"]]
            for model in configuration["models"]:
                spec = run_spec(plan, prepared, item, model, thread, resolved, batch_id=batch.pk)
                runs.append(
                    Run(
                        batch=batch,
                        thread=thread,
                        model=model,
                        configuration=spec.as_json(),
                        estimated_cost_usd=(estimates or {}).get(model),
                        **configuration_columns(spec),
                    )
                )
        Run.objects.bulk_create(runs)
        if ask_for_dispatch:
            wakeups.request_dispatch()
    return batch


def _result(batch: Batch, *, idempotent: bool) -> ApprovalResult:
    runs = list(batch.runs.select_related("thread").order_by("id"))
    launch_errors = list(LaunchError.objects.filter(run__batch=batch).order_by("id"))
    return ApprovalResult(
        batch=batch, runs=runs, launch_errors=launch_errors, idempotent=idempotent
    )
