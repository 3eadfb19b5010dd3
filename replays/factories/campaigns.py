"""Campaigns written directly in the database, as approval, the coordinators and the judges
leave them: a campaign over N requests of its owner's history, one plan and batch per
selected request, every member run with its ending and report, excluded requests beside
them, and the results computed as the pages and the API read them. For the campaign pages'
tests and the benchmarks (bench/); a few queries per table whatever the size.

An outcome is what the leaderboard's factory takes (replays/factories/leaderboard.py): a
string, or a (string, score) pair for a judged one: `win`, `tie`, `loss` (a current judged
report), `review_failed`, `pending` (completed, no report yet), `queued`, `running`,
`cancelled`, or a failure code (`timeout`, `agent_error`, `setup`, `budget_exhausted`,
`launch_failed`, `infrastructure`, `coordinator_lost`).
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User

from replays.approval import configuration_columns
from replays.evaluation import campaign_results
from replays.factories.leaderboard import WINNERS
from replays.models import (
    Batch,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    ExclusionReason,
    FailureCode,
    Plan,
    PlanStatus,
    Report,
    ReportStatus,
    Run,
    RunPhase,
    RunStatus,
    SourceKind,
    Thread,
    Turn,
)
from replays.runspec import RunSpec

REPOSITORIES = ("/srv/repos/api", "/srv/repos/web", "/srv/repos/tools")
CREATED = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)
DEFAULT_MODELS = ("historical", "empty", "codex:gpt-5.5", "claude_code:claude-sonnet-4-5")
# What each model does by default: history's own change ties (as good), no change loses,
# the agents' models vary, with now and then a failure, a setup problem, a budget stop.
DEFAULT_OUTCOMES: dict[str, Sequence[Any]] = {
    "historical": [("tie", 1.0)],
    "empty": [("loss", 0.0)],
}
AGENT_OUTCOMES: Sequence[Any] = (
    ("win", 0.9), ("tie", 0.8), ("loss", 0.3), ("tie", 0.7), ("win", 0.95), "timeout",
    ("tie", 0.75), ("loss", 0.2), "setup", ("win", 0.85), "budget_exhausted", ("tie", 0.6),
)  # fmt: skip
# Each agent model spends a share of history's cost: the chart's points spread out.
COST_SHARES = (Decimal("0.35"), Decimal("1.6"), Decimal("0.8"), Decimal("3"))

_numbers = itertools.count(1)

Outcomes = dict[str, Sequence[Any]] | Callable[[int, str], Any]


@dataclass
class MadeCampaign:
    campaign: Campaign
    requests: list[CampaignRequest]  # the selected ones, in order
    runs: dict[str, list[Run]]  # per model, in the requests' order


def _outcome(outcomes: Outcomes | None, index: int, model: str, agent_index: int) -> Any:
    if callable(outcomes):
        return outcomes(index, model)
    if outcomes is not None and model in outcomes:
        found = outcomes[model]
        return found[index % len(found)]
    if model in DEFAULT_OUTCOMES:
        found = DEFAULT_OUTCOMES[model]
        return found[index % len(found)]
    return AGENT_OUTCOMES[(index + 3 * agent_index) % len(AGENT_OUTCOMES)]


def make_campaign(
    owner: User,
    *,
    requests: int = 10,
    models: Sequence[str] = DEFAULT_MODELS,
    outcomes: Outcomes | None = None,
    excluded: int = 3,
    budget_usd: Decimal | None = Decimal("25"),
    evaluator: str = "tests",
    gradable: bool | None = True,
    created_at: datetime = CREATED,
) -> MadeCampaign:
    """A finished campaign of `requests` requests times `models`, each member ended as
    `outcomes` says (per model a list cycled over the requests, or a function of the
    request's index and the model), plus `excluded` requests left out with a reason; its
    results written as replays.evaluation.campaign_results computes them."""
    number = next(_numbers)
    models = list(models)
    threads = Thread.objects.bulk_create(
        Thread(
            owner=owner,
            source_kind=SourceKind.CLAUDE_CODE,
            session_id=f"campaign-{number}-{index}",
            title=f"Campaign {number} thread {index + 1}",
            cwd=REPOSITORIES[index % len(REPOSITORIES)],
            git_branch="main",
            started_at=created_at - timedelta(days=1, minutes=index),
            source_path=f"/tmp/campaign-{number}-{index}.jsonl",
            source_sha256=hashlib.sha256(f"{number}-{index}".encode()).hexdigest(),
            source_size=1000,
            turn_count=1,
            models_used=["claude-sonnet-4-5"],
        )
        for index in range(requests + excluded)
    )
    turns = Turn.objects.bulk_create(
        Turn(
            thread=thread,
            index=0,
            message_uuid=f"campaign-{number}-{index}",
            timestamp=created_at - timedelta(days=1, minutes=index),
            request=f"Change number {index + 1} in {thread.cwd}: add the option and its test.",
            models_used=["claude-sonnet-4-5"],
            input_tokens=20_000,
            output_tokens=1_500,
            cost_usd=Decimal("0.20") + Decimal(index % 7) / 100,
            seconds=120.0 + 10 * (index % 5),
        )
        for index, thread in enumerate(threads)
    )
    table_estimate = {
        model: {
            "cost_usd": "0" if model in campaign_results.BASELINES else f"{requests * 0.2:.6f}",
            "seconds": 120.0 * requests,
            "per_request": ["0.200000"] * requests,
        }
        for model in models
    }
    campaign = Campaign.objects.create(
        owner=owner,
        configuration={
            "models": models,
            "evaluator": evaluator,
            "limit": requests,
            "selection": "last",
            "seed": 0,
            "budget_usd": None if budget_usd is None else str(budget_usd),
            "gradable_only": False,
            "filters": {
                "tool": None,
                "repository": None,
                "folder": None,
                "since": None,
                "until": None,
                "last": 2000,
            },
            "verify_commands": {},
            "timeout_seconds": 1800,
        },  # fmt: skip
        fingerprint=hashlib.sha256(f"campaign-{number}".encode()).hexdigest(),
        status=CampaignStatus.RUNNING,
        evaluator=evaluator,
        budget_usd=budget_usd,
        counts={
            "scanned": requests + excluded,
            "eligible": requests,
            "gradable": requests if gradable else 0,
            "gradable_unknown": requests if gradable is None else 0,
            "excluded": {ExclusionReason.NO_CODE_CHANGE.value: excluded} if excluded else {},
            "selected": requests,
        },  # fmt: skip
        estimate={
            "models": table_estimate,
            "evaluator_cost_usd": "0",
            "evaluator_per_run_usd": "0",
            "total_cost_usd": f"{requests * 0.2 * len(models):.6f}",
            "runs": requests * len(models),
            "seconds": 120.0 * requests,
            "capacity": 2,
        },  # fmt: skip
        test_commands={
            repository: {
                "command": "python -m pytest -q --junitxml={junit_xml}",
                "runner": "pytest",
                "origin": {
                    "thread_id": threads[index].pk,
                    "turn": 1,
                    "message_uuid": turns[index].message_uuid,
                    "typed": "python -m pytest -q",
                },
            }
            for index, repository in enumerate(REPOSITORIES[: min(requests, len(REPOSITORIES))])
        },  # fmt: skip
        approval_prompt=f"Approve {requests} requests using {len(models)} models?",
        token_hash=hashlib.sha256(f"campaign-token-{number}".encode()).hexdigest(),
        created_at=created_at,
        expires_at=created_at + timedelta(minutes=5),
        approved_at=created_at + timedelta(minutes=1),
    )
    plans = Plan.objects.bulk_create(
        Plan(
            owner=owner,
            configuration={},
            fingerprint="0" * 64,
            status=PlanStatus.READY_FOR_APPROVAL,
            evaluator=evaluator,
            approval_prompt=f"Part of campaign {campaign.pk}",
            token_hash=hashlib.sha256(f"campaign-{number}-plan-{index}".encode()).hexdigest(),
            created_at=created_at,
            expires_at=created_at + timedelta(minutes=5),
        )
        for index in range(requests)
    )
    rows = CampaignRequest.objects.bulk_create(
        CampaignRequest(
            campaign=campaign,
            thread=thread,
            turn=turn,
            message_uuid=turn.message_uuid,
            request=turn.request,
            timestamp=turn.timestamp,
            history_cost_usd=turn.cost_usd,
            history_seconds=turn.seconds,
            history_usage={
                "input_tokens": turn.input_tokens,
                "output_tokens": turn.output_tokens,
                "cache_read_tokens": 0,
                "cache_write_5m_tokens": 0,
                "cache_write_1h_tokens": 0,
            },  # fmt: skip
            position=index,
            eligible=index < requests,
            reason="" if index < requests else ExclusionReason.NO_CODE_CHANGE,
            detail="" if index < requests else "The request changed no file (a question).",
            gradable=gradable if index < requests else None,
            gradable_detail="Gradable: 1 test(s) fail before and pass after." if gradable else "",
            selected=index < requests,
            repository=thread.cwd,
            verify_command="python -m pytest -q --junitxml={junit_xml}",
            plan=plans[index] if index < requests else None,
        )
        for index, (thread, turn) in enumerate(zip(threads, turns, strict=True))
    )
    batches = Batch.objects.bulk_create(
        Batch(
            plan=plan,
            owner=owner,
            models_list=models,
            thread_count=1,
            campaign=campaign,
            evaluator=evaluator,
            approved_at=created_at + timedelta(minutes=1),
        )
        for plan in plans
    )
    runs: list[Run] = []
    kinds: list[tuple[Run, str, float]] = []
    agent_index = {model: index for index, model in enumerate(models)}
    for index, (batch, thread, turn) in enumerate(zip(batches, threads, turns, strict=False)):
        for model in models:
            item = _outcome(outcomes, index, model, agent_index[model])
            kind, score = item if isinstance(item, tuple) else (item, 0.5)
            run = _run(batch, thread, turn, model, kind, created_at, evaluator, agent_index[model])
            runs.append(run)
            kinds.append((run, kind, score))
    Run.objects.bulk_create(runs)
    Report.objects.bulk_create(
        _report(run, kind, score, evaluator, created_at)
        for run, kind, score in kinds
        if kind in WINNERS or kind == "review_failed"
    )
    campaign_results.refresh(campaign.pk)
    campaign.refresh_from_db()
    by_model: dict[str, list[Run]] = {}
    for run in runs:
        by_model.setdefault(run.model, []).append(run)
    return MadeCampaign(campaign=campaign, requests=rows[:requests], runs=by_model)


def _run(
    batch: Batch, thread: Thread, turn: Turn, model: str, kind: str, created_at: datetime,
    evaluator: str, position: int,
) -> Run:  # fmt: skip
    configuration = {
        "batch_id": batch.pk, "plan_id": batch.plan_id, "thread_id": thread.pk, "model": model,
        "repository": thread.cwd, "start_message_uuid": turn.message_uuid,
        "end_message_uuid": turn.message_uuid, "context": "cold", "evaluator": evaluator,
    }  # fmt: skip
    baseline = model in campaign_results.BASELINES
    share = Decimal(0) if baseline else COST_SHARES[position % len(COST_SHARES)]
    history = turn.cost_usd or Decimal(0)
    run = Run(
        batch=batch,
        thread=thread,
        model=model,
        phase=RunPhase.DONE,
        configuration=configuration,
        **configuration_columns(RunSpec.from_json(configuration)),
        created_at=created_at + timedelta(minutes=1),
        started_at=created_at + timedelta(minutes=2),
        finished_at=created_at + timedelta(minutes=4),
        wall_seconds=(turn.seconds or 60.0) * (0.5 if baseline else float(share) * 0.9),
        cost_usd=(history * share).quantize(Decimal("0.000001")),
        estimated_cost_usd=history * share,
        output_tokens=0 if baseline else 1_200,
    )
    if kind == "budget_exhausted":
        # It never started: no cost, no time.
        run.started_at = run.cost_usd = run.wall_seconds = None
        run.status, run.failure_code = RunStatus.FAILED, FailureCode.BUDGET_EXHAUSTED
        run.failure_message = "The campaign's budget was spent before this run could start."
    elif kind in FailureCode.values:
        run.status, run.failure_code = RunStatus.FAILED, kind
        run.failure_message = f"{kind} (made by the campaign factory)"
    elif kind == "cancelled":
        run.status = RunStatus.CANCELLED
    elif kind == "queued":
        run.status, run.phase = RunStatus.QUEUED, RunPhase.QUEUED
        run.started_at = run.finished_at = run.cost_usd = run.wall_seconds = None
    elif kind == "running":
        run.status, run.phase = RunStatus.RUNNING, RunPhase.IMPLEMENTING
        run.finished_at = run.cost_usd = run.wall_seconds = None
    else:
        run.status = RunStatus.COMPLETED
    return run


def _report(run: Run, kind: str, score: float, evaluator: str, created_at: datetime) -> Report:
    if kind == "review_failed":
        return Report(
            run=run, status=ReportStatus.REVIEW_FAILED, is_current=True, evaluator=evaluator,
            context="cold", reason="The evaluator's reply was not JSON.", finished_at=created_at,
        )  # fmt: skip
    return Report(
        run=run,
        status=ReportStatus.JUDGED,
        is_current=True,
        winner=WINNERS[kind],
        score_historical=1.0,
        score_replay=score,
        consistent=True,
        evaluator=evaluator,
        prompt_version="v1",
        context="cold",
        evaluator_cost_usd=Decimal(0),
        finished_at=created_at + timedelta(minutes=5),
        data={"tests": {"kept": ["t1"], "broken": [] if kind != "loss" else ["t2"]}},
    )
