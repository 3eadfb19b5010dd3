"""Every named constraint, hit in the database (IntegrityError) and in full_clean (ValidationError)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.apps import apps
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.db import IntegrityError, connection, models, transaction
from django.utils import timezone

from replays.models import (
    ApiToken,
    Batch,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    LaunchError,
    Plan,
    PlanStatus,
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunLog,
    RunStatus,
    SourceKind,
    Thread,
    Transcript,
    Turn,
    Winner,
)

Graph = dict[str, models.Model]


def clone(obj: models.Model, **changes: Any) -> models.Model:
    new = copy.copy(obj)
    new.pk = None
    new._state.adding = True
    for name, value in changes.items():
        setattr(new, name, value)
    return new


@pytest.fixture
def graph(db: None, user: User) -> Graph:
    now = timezone.now()
    thread = Thread.objects.create(
        owner=user,
        source_kind=SourceKind.CODEX,
        session_id="s-1",
        title="t",
        source_path="/tmp/x.jsonl",
        source_sha256="a" * 64,
        source_size=10,
        started_at=now,
        ended_at=now + timedelta(minutes=1),
    )
    turn = Turn.objects.create(
        thread=thread, index=0, message_uuid="m-0", timestamp=now, request="do it"
    )
    plan = Plan.objects.create(
        owner=user,
        configuration={"models": ["empty"]},
        fingerprint="f" * 64,
        status=PlanStatus.READY_FOR_APPROVAL,
        token_hash="1" * 64,
        expires_at=now + timedelta(minutes=5),
        created_at=now,
    )
    batch = Batch.objects.create(
        plan=plan,
        owner=user,
        models_list=["empty"],
        thread_count=1,
        configuration={"models": ["empty"]},
    )
    run = Run.objects.create(
        batch=batch, thread=thread, model="empty", configuration={"model": "empty"}
    )
    launch_error = LaunchError.objects.create(run=run, code="launch_failed", message="gone")
    review = Review.objects.create(
        thread=thread,
        start_message_uuid="m-0",
        end_message_uuid="m-0",
        baseline_commit="b" * 40,
        ending_commit="e" * 40,
        historical_result_sha256="c" * 64,
        evaluator="claude:claude-sonnet-4-5",
        tests_digest="d" * 64,
    )
    report = Report.objects.create(
        run=run,
        review=review,
        status=ReportStatus.JUDGED,
        is_current=True,
        winner=Winner.TIE,
        score_historical=1.0,
        score_replay=1.0,
        consistent=True,
        evaluator="tests",
        finished_at=now,
    )
    campaign = Campaign.objects.create(
        owner=user,
        configuration={"models": ["empty"]},
        fingerprint="f" * 64,
        status=CampaignStatus.READY_FOR_APPROVAL,
        budget_usd=Decimal("5"),
        token_hash="4" * 64,
        created_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    campaign_request = CampaignRequest.objects.create(
        campaign=campaign,
        thread=thread,
        turn=turn,
        message_uuid="m-0",
        request="do it",
        timestamp=now,
        position=0,
        eligible=True,
        selected=True,
    )
    return {
        "thread": thread,
        "turn": turn,
        "campaign": campaign,
        "campaign_request": campaign_request,
        "plan": plan,
        "batch": batch,
        "run": run,
        "launch_error": launch_error,
        "review": review,
        "report": report,
    }


def _other_plan(g: Graph) -> Plan:
    return Plan.objects.create(
        owner=g["plan"].owner,
        configuration={},
        fingerprint="e" * 64,
        status=PlanStatus.BLOCKED,
        token_hash="2" * 64,
        expires_at=timezone.now() + timedelta(minutes=5),
    )


def _other_run(g: Graph) -> Run:
    return Run.objects.create(batch=g["batch"], thread=g["thread"], model="historical")


# constraint name -> a builder of an unsaved row that breaks exactly that constraint
VIOLATIONS: dict[str, Callable[[Graph], models.Model]] = {
    "thread_unique_session": lambda g: clone(g["thread"]),
    "thread_source_kind_valid": lambda g: clone(
        g["thread"], session_id="s-2", source_kind="cursor"
    ),
    "thread_source_size_gte_0": lambda g: clone(g["thread"], session_id="s-2", source_size=-1),
    "thread_ends_after_start": lambda g: clone(
        g["thread"], session_id="s-2", ended_at=g["thread"].started_at - timedelta(seconds=1)
    ),
    "transcript_size_gte_0": lambda g: Transcript(
        thread=g["thread"], codec="zstd", data=b"x", size=-1, sha256="0" * 64
    ),
    # A key opens one account; and only a key's sha256 is ever stored.
    "apitoken_unique_key": lambda g: _token_twice(g),
    "apitoken_key_is_sha256": lambda g: ApiToken(user=g["thread"].owner, key_sha256="a-key"),
    # More left out than the log had.
    "runlog_sizes_valid": lambda g: RunLog(run=g["run"], codec="zstd", data=b"x", size=10, cut=11),
    "turn_unique_index": lambda g: clone(g["turn"], message_uuid="m-1"),
    "turn_unique_message": lambda g: clone(g["turn"], index=1),
    "turn_seconds_gte_0": lambda g: clone(g["turn"], index=1, message_uuid="m-1", seconds=-0.5),
    "plan_unique_token_hash": lambda g: clone(g["plan"]),
    "campaign_unique_token_hash": lambda g: clone(g["campaign"]),
    "campaign_status_valid": lambda g: clone(g["campaign"], token_hash="5" * 64, status="paused"),
    "campaign_expires_after_creation": lambda g: clone(
        g["campaign"], token_hash="5" * 64, expires_at=g["campaign"].created_at
    ),
    "campaign_budget_positive": lambda g: clone(
        g["campaign"], token_hash="5" * 64, budget_usd=Decimal(0)
    ),
    "campaign_approved_runs": lambda g: clone(
        g["campaign"], token_hash="5" * 64, approved_at=timezone.now()
    ),
    "campaign_request_once": lambda g: clone(g["campaign_request"]),
    "campaign_request_reason_valid": lambda g: clone(
        g["campaign_request"],
        message_uuid="m-1",
        eligible=False,
        selected=False,
        reason="bored",
    ),  # fmt: skip
    "campaign_request_eligible_xor_reason": lambda g: clone(
        g["campaign_request"], message_uuid="m-1", reason="rolled_back"
    ),
    "campaign_request_selected_is_eligible": lambda g: clone(
        g["campaign_request"], message_uuid="m-1", eligible=False, reason="rolled_back"
    ),
    "plan_status_valid": lambda g: clone(g["plan"], token_hash="3" * 64, status="approved"),
    "plan_expires_after_creation": lambda g: clone(
        g["plan"], token_hash="3" * 64, expires_at=g["plan"].created_at
    ),
    "batch_one_per_plan": lambda g: clone(g["batch"]),
    "batch_thread_count_range": lambda g: clone(g["batch"], plan=_other_plan(g), thread_count=13),
    "run_unique_member": lambda g: clone(g["run"]),
    "run_status_valid": lambda g: clone(g["run"], model="m2", status="paused"),
    "run_phase_valid": lambda g: clone(g["run"], model="m2", phase="thinking"),
    "run_failure_code_valid": lambda g: clone(
        g["run"],
        model="m2",
        status=RunStatus.FAILED,
        failure_code="oops",
        finished_at=timezone.now(),
    ),
    "run_failed_has_code": lambda g: clone(
        g["run"], model="m2", status=RunStatus.FAILED, finished_at=timezone.now()
    ),
    "run_code_only_when_failed": lambda g: clone(g["run"], model="m2", failure_code="timeout"),
    "run_finished_has_time": lambda g: clone(g["run"], model="m2", status=RunStatus.COMPLETED),
    "run_wall_seconds_gte_0": lambda g: clone(g["run"], model="m2", wall_seconds=-1.0),
    "launch_error_once_per_run": lambda g: clone(g["launch_error"]),
    "launch_error_code_valid": lambda g: clone(g["launch_error"], run=_other_run(g), code="boom"),
    "review_unique_range": lambda g: clone(g["review"]),
    "review_status_valid": lambda g: clone(g["review"], end_message_uuid="m-9", status="maybe"),
    "review_failed_has_error": lambda g: clone(
        g["review"], end_message_uuid="m-9", status=ReviewStatus.FAILED
    ),
    "review_seconds_gte_0": lambda g: clone(g["review"], end_message_uuid="m-9", seconds=-1.0),
    "review_cost_usd_gte_0": lambda g: clone(g["review"], end_message_uuid="m-9", cost_usd=-1),
    "report_one_current_per_run": lambda g: clone(g["report"]),
    "report_one_judging_per_run": lambda g: _judging_twice(g),
    "report_status_valid": lambda g: clone(
        g["report"], is_current=False, status="maybe", winner=None, reason="x"
    ),
    "report_winner_valid": lambda g: clone(g["report"], is_current=False, winner="nobody"),
    "report_winner_only_when_judged": lambda g: clone(
        g["report"], is_current=False, status=ReportStatus.JUDGED, winner=None
    ),
    "report_current_is_finished": lambda g: clone(
        g["report"], run=_other_run(g), status=ReportStatus.JUDGING, winner=None
    ),
    "report_failure_has_reason": lambda g: clone(
        g["report"], is_current=False, status=ReportStatus.LOST, winner=None
    ),
    "report_score_historical_range": lambda g: clone(
        g["report"], is_current=False, score_historical=1.5
    ),
    "report_score_replay_range": lambda g: clone(g["report"], is_current=False, score_replay=-0.1),
    "report_evaluator_cost_gte_0": lambda g: clone(
        g["report"], is_current=False, evaluator_cost_usd=-1
    ),
}


def _token_twice(g: Graph) -> ApiToken:
    ApiToken.objects.create(user=g["thread"].owner, key_sha256="a" * 64)
    return ApiToken(user=g["thread"].owner, key_sha256="a" * 64)


def _judging_twice(g: Graph) -> Report:
    clone(g["report"], is_current=False, status=ReportStatus.JUDGING, winner=None).save()
    return clone(g["report"], is_current=False, status=ReportStatus.JUDGING, winner=None)


for _owner in ("thread", "turn", "run", "review"):
    for _field in (
        "input_tokens",
        "output_tokens",
        "cache_read_tokens",
        "cache_write_5m_tokens",
        "cache_write_1h_tokens",
    ):

        def _negative(g: Graph, owner: str = _owner, field: str = _field) -> models.Model:
            distinct = {
                "thread": {"session_id": "s-2"},
                "turn": {"index": 1, "message_uuid": "m-1"},
                "run": {"model": "m2"},
                "review": {"end_message_uuid": "m-9"},
            }[owner]
            return clone(g[owner], **distinct, **{field: -1})

        VIOLATIONS[f"{_owner}_{_field}_gte_0"] = _negative


def declared_constraints() -> set[str]:
    names: set[str] = set()
    for model in apps.get_app_config("replays").get_models():
        names |= {constraint.name for constraint in model._meta.constraints}
    return names


def test_every_declared_constraint_has_a_violation_case() -> None:
    assert declared_constraints() == set(VIOLATIONS)


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_database_refuses_the_violation(graph: Graph, name: str) -> None:
    row = VIOLATIONS[name](graph)
    with pytest.raises(IntegrityError) as error, transaction.atomic():
        row.save()
    message = str(error.value)
    constraint = next(c for c in row._meta.constraints if c.name == name)
    if isinstance(constraint, models.UniqueConstraint) and connection.vendor == "sqlite":
        # SQLite names the columns of a broken unique constraint, not the constraint.
        assert "UNIQUE constraint failed" in message
        for field in constraint.fields:
            assert row._meta.get_field(field).column in message
    else:
        assert name in message


@pytest.mark.parametrize("name", sorted(VIOLATIONS))
def test_full_clean_refuses_the_violation(graph: Graph, name: str) -> None:
    row = VIOLATIONS[name](graph)
    with pytest.raises(ValidationError):
        row.full_clean()


def test_the_valid_rows_pass_full_clean(graph: Graph) -> None:
    for row in graph.values():
        row.full_clean()
