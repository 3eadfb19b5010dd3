"""Replaying: the plan a replay form prepared, its questions, and its single-use approval."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.defaultfilters import pluralize
from django.views.decorators.http import require_POST

from replays import agents, approval, estimates, planning
from replays.errors import http_status
from replays.forms import AnswerForm
from replays.models import (
    Batch,
    Plan,
    PlanStatus,
    Thread,
    Turn,
)
from replays.views.common import TokenCookie, model_labels

# The page flow hands the prepare token to the browser once, in a signed cookie scoped to
# the plan's pages.
PLAN_TOKEN = TokenCookie("prepare_token_", "replays.prepare-token", "replays:plan-detail")


# --- Plans ---------------------------------------------------------------------------------


def after_prepare(request: HttpRequest, prepared: planning.PreparedPlan) -> HttpResponse:
    plan = prepared.plan
    response = redirect("replays:plan-detail", pk=plan.pk)
    if prepared.prepare_token is not None:
        PLAN_TOKEN.give(request, response, plan.pk, prepared.prepare_token)
    return response


@dataclass
class PageError:
    """An approval refusal as the plan page shows it."""

    message: str
    code: str
    # Most refusals are cured by preparing the same configuration again.
    can_prepare_again: bool = True


@dataclass
class ThreadPreparationView:
    item: dict[str, Any]
    preparation: dict[str, Any]
    thread: Thread | None
    first_turn: int | None = None
    last_turn: int | None = None
    questions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def title(self) -> str:
        if self.thread is not None:
            return str(self.thread)
        return self.item.get("thread_title") or f"Thread {self.item['thread_id']}"


ANSWER_LABELS = {
    "repository": "Repository path",
    "baseline_commit": "Baseline commit",
    "ending_commit": "Ending commit",
}


def _question_view(question: dict[str, Any]) -> dict[str, Any]:
    """A stored question with its field named for people and its commit dates parsed."""
    choices = []
    for choice in question.get("choices", []):
        try:
            committed_at = datetime.fromisoformat(choice.get("committed_at", ""))
        except (TypeError, ValueError):
            committed_at = None
        choices.append({**choice, "committed_at": committed_at})
    field_name = question.get("field", "")
    return {
        **question,
        "choices": choices,
        "field_label": ANSWER_LABELS.get(field_name, field_name),
        "answerable": field_name in ANSWER_LABELS,
    }


def _preparation_views(plan: Plan) -> list[ThreadPreparationView]:
    items = plan.configuration.get("configurations", [])
    threads = Thread.objects.visible_to(plan.owner).in_bulk([item["thread_id"] for item in items])
    preparations = {prep.get("thread_id"): prep for prep in plan.preparations}
    uuids = {
        prep.get(key)
        for prep in plan.preparations
        for key in ("start_message_uuid", "end_message_uuid")
        if prep.get(key)
    }
    turn_numbers = {
        (thread_id, uuid): index + 1
        for thread_id, uuid, index in Turn.objects.filter(
            thread__in=list(threads), message_uuid__in=uuids
        ).values_list("thread_id", "message_uuid", "index")
    }
    views = []
    for item in items:
        thread_id = item["thread_id"]
        prep = preparations.get(thread_id, {})
        views.append(
            ThreadPreparationView(
                item=item,
                preparation=prep,
                thread=threads.get(thread_id),
                first_turn=turn_numbers.get((thread_id, prep.get("start_message_uuid"))),
                last_turn=turn_numbers.get((thread_id, prep.get("end_message_uuid"))),
                questions=[
                    _question_view(q) for q in plan.questions if q.get("thread_id") == thread_id
                ],
            )
        )
    return views


def _plan_state(plan: Plan, batch: Batch | None) -> tuple[str, str]:
    """(badge class, label): approved and expired say more than the prepared status."""
    if batch is not None:
        return "approved", "Approved"
    if plan.is_expired:
        return "expired", "Expired"
    return plan.status, plan.get_status_display()


def _plan_page(
    request: HttpRequest,
    plan: Plan,
    *,
    error: PageError | None = None,
    answer_form: AnswerForm | None = None,
    status: int = 200,
) -> HttpResponse:
    batch = plan.batch
    state, state_label = _plan_state(plan, batch)
    known_models = agents.discover_models()
    labels = model_labels(known_models)
    configuration = plan.configuration
    ready = plan.status == PlanStatus.READY_FOR_APPROVAL
    # The estimate is for deciding on the approval: shown only while it can be given.
    estimate = (
        estimates.plan_estimate(plan, known_models=known_models)
        if ready and batch is None and not plan.is_expired
        else None
    )
    context = {
        "plan": plan,
        "batch": batch,
        "state": state,
        "state_label": state_label,
        "threads": _preparation_views(plan),
        "models": [(model, labels.get(model, model)) for model in configuration["models"]],
        "timeout_seconds": configuration.get("timeout_seconds"),
        "verify_command": configuration.get("verify_command"),
        "ready": ready,
        "estimate": estimate,
        "expired": plan.is_expired,
        "has_token": PLAN_TOKEN.read(request, plan.pk) is not None,
        "error": error,
        "answer_form": answer_form,
    }
    return render(request, "replays/plan_detail.html", context, status=status)


@login_required
def plan_detail(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    return _plan_page(request, plan)


@login_required
@require_POST
def plan_prepare_again(request: HttpRequest, pk: int) -> HttpResponse:
    """Prepare the plan's configuration again, with a question's answer filled in if given."""
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    configuration = copy.deepcopy(plan.configuration)
    if "field" in request.POST:
        form = AnswerForm(request.POST)
        if not form.is_valid():
            return _plan_page(request, plan, answer_form=form, status=400)
        answer = form.cleaned_data
        item = next(
            (c for c in configuration["configurations"] if c["thread_id"] == answer["thread_id"]),
            None,
        )
        if item is None:
            form.add_error("thread_id", "That thread is not part of this plan.")
            return _plan_page(request, plan, answer_form=form, status=400)
        item[answer["field"]] = answer["answer"]
    try:
        prepared = planning.prepare_plan(owner=request.user, raw_configuration=configuration)
    except (planning.PlanInputError, planning.PrepareConflict) as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=False)
        return _plan_page(request, plan, error=error, status=http_status(exc))
    return after_prepare(request, prepared)


@login_required
@require_POST
def plan_approve(request: HttpRequest, pk: int) -> HttpResponse:
    plan = get_object_or_404(Plan.objects.visible_to(request.user), pk=pk)
    token = PLAN_TOKEN.read(request, plan.pk)
    if token is None:
        batch = plan.batch
        if batch is not None:
            messages.info(request, f"Plan {plan.pk} was already approved: this is its batch.")
            return redirect(batch)
        error = PageError(
            "This plan's prepare token is not in this browser (the plan was prepared through "
            "the API or in another browser, or the token expired). Prepare it again to "
            "approve it here.",
            code="token_not_in_browser",
        )
        return _plan_page(request, plan, error=error, status=403)
    try:
        result = approval.approve_plan(
            plan_id=plan.pk,
            user=request.user,
            # The button sends approved=true: the explicit approval the service requires.
            approved=request.POST.get("approved") == "true",
            prepare_token=token,
            run_config=plan.configuration,
        )
    except approval.ApprovalError as exc:
        error = PageError(exc.message, exc.code, can_prepare_again=exc.code != "not_found")
        return _plan_page(request, plan, error=error, status=http_status(exc))
    if result.idempotent:
        messages.info(request, f"Plan {plan.pk} was already approved: this is its batch.")
    else:
        runs = len(result.runs)
        messages.success(request, f"Approved: {runs} run{pluralize(runs)} queued.")
    response = redirect(result.batch)
    PLAN_TOKEN.forget(response, plan.pk)
    return response
