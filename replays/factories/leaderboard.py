"""Finished runs with their reports, written directly in the database, for the leaderboard
and the exports. Plain functions, no fixtures, so any test module can import them.

An outcome is a string, or a (string, score) pair for a judged one:
`win`, `tie`, `loss` (a current judged report), `review_failed`, `pending` (completed,
no report yet), `cancelled`, or a failure code (`timeout`, `agent_error`,
`launch_failed`, `infrastructure`, `coordinator_lost`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import User

from replays.approval import configuration_columns
from replays.models import (
    Batch,
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
    Winner,
)
from replays.runspec import RunSpec

REPOSITORY = "/srv/repos/project"
CREATED = datetime(2026, 11, 10, 12, 0, tzinfo=UTC)
WINNERS = {"win": Winner.REPLAY, "tie": Winner.TIE, "loss": Winner.HISTORICAL}

_numbers = itertools.count(1)


@dataclass
class Seeded:
    batch: Batch
    threads: list[Thread]
    runs: dict[str, list[Run]]


def make_threads(count: int) -> list[Thread]:
    threads = []
    for _ in range(count):
        number = next(_numbers)
        threads.append(
            Thread(
                source_kind=SourceKind.CLAUDE_CODE,
                session_id=f"leaderboard-{number}",
                title=f"Leaderboard thread {number}",
                source_path=f"/tmp/leaderboard-{number}.jsonl",
                source_sha256=f"{number:064x}",
                source_size=100,
            )
        )
    return Thread.objects.bulk_create(threads)


def make_batch(owner: User, *, evaluator: str = "tests", models: list[str] | None = None) -> Batch:
    now = CREATED
    plan = Plan.objects.create(
        owner=owner,
        configuration={},
        fingerprint="0" * 64,
        status=PlanStatus.READY_FOR_APPROVAL,
        token_hash=f"{next(_numbers):064x}",
        created_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    return Batch.objects.create(
        plan=plan,
        owner=owner,
        models_list=models or [],
        thread_count=1,
        evaluator=evaluator,
        approved_at=now,
    )


def seed(
    owner: User,
    outcomes: dict[str, list[Any]],
    *,
    evaluator: str = "tests",
    prompt_version: str = "v1",
    context: str = "cold",
    repository: str = REPOSITORY,
    created_at: datetime = CREATED,
    threads: list[Thread] | None = None,
    cost: Decimal | None = Decimal("0.10"),
    seconds: float = 60.0,
    consistent: bool | None = None,
) -> Seeded:
    """One batch: the i-th outcome of every model is a run on the i-th thread (so models
    replayed the same requests), with its report. Three or four queries in all."""
    width = max((len(items) for items in outcomes.values()), default=0)
    threads = threads or make_threads(width)
    batch = make_batch(owner, evaluator=evaluator, models=list(outcomes))
    runs: list[Run] = []
    reports: list[tuple[Run, Any]] = []
    for model, items in outcomes.items():
        for thread, item in zip(threads, items, strict=False):
            kind, score = item if isinstance(item, tuple) else (item, 0.5)
            configuration = {
                "repository": repository,
                "start_message_uuid": f"uuid-{thread.pk}",
                "end_message_uuid": f"uuid-{thread.pk}",
                "context": context,
            }
            run = Run(
                batch=batch,
                thread=thread,
                model=model,
                phase=RunPhase.DONE,
                configuration=configuration,
                # As approval writes them (the leaderboard reads these columns).
                **configuration_columns(RunSpec.from_json(configuration)),
                created_at=created_at,
                finished_at=created_at + timedelta(seconds=seconds),
                wall_seconds=seconds,
                cost_usd=cost,
                output_tokens=100,
            )
            if kind in FailureCode.values:
                run.status, run.failure_code = RunStatus.FAILED, kind
                run.failure_message = f"{kind} in a test"
            elif kind == "cancelled":
                run.status = RunStatus.CANCELLED
            else:
                run.status = RunStatus.COMPLETED
            runs.append(run)
            reports.append((run, (kind, score)))
    Run.objects.bulk_create(runs)
    made = []
    for run, (kind, score) in reports:
        if kind in WINNERS:
            made.append(
                Report(
                    run=run,
                    status=ReportStatus.JUDGED,
                    is_current=True,
                    winner=WINNERS[kind],
                    score_historical=1.0,
                    score_replay=score,
                    consistent=consistent,
                    evaluator=evaluator,
                    prompt_version=prompt_version,
                    context=context,
                    evaluator_cost_usd=Decimal("0.01"),
                    finished_at=created_at,
                    data={
                        "tests": {"kept": ["t1", "t2"], "broken": [] if kind != "loss" else ["t3"]},
                        "historical": {"cost_usd": 0.25, "seconds": 30.0},
                    },
                )
            )
        elif kind == "review_failed":
            made.append(
                Report(
                    run=run,
                    status=ReportStatus.REVIEW_FAILED,
                    is_current=True,
                    evaluator=evaluator,
                    prompt_version=prompt_version,
                    context=context,
                    reason="The evaluator's reply was not JSON.",
                    finished_at=created_at,
                )
            )
    Report.objects.bulk_create(made)
    by_model: dict[str, list[Run]] = {}
    for run in runs:
        by_model.setdefault(run.model, []).append(run)
    return Seeded(batch=batch, threads=threads, runs=by_model)
