"""Reads over stored judgments: a batch's results, one row per run (what the export
gives, CSV or JSON: two queries however many runs the batch has), each evaluator's
consistency rate, and a report in brief (what the commands print)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.db.models import Count, Q

from replays import statistics
from replays.models import Batch, Report, ReportStatus


@dataclass(frozen=True)
class ResultRow:
    run: int
    thread: int
    thread_title: str
    model: str
    status: str
    failure_code: str
    winner: str | None
    consistent: bool | None
    score_historical: float | None
    score_replay: float | None
    tests_kept: int | None
    tests_broken: int | None
    replay_cost_usd: Decimal | None
    historical_cost_usd: Decimal | None
    replay_seconds: float | None
    historical_seconds: float | None
    evaluator: str | None
    evaluator_cost_usd: Decimal | None
    report_status: str | None


def _section(report: Report | None, name: str) -> dict[str, Any]:
    section = report.data.get(name) if report is not None else None
    return section if isinstance(section, dict) else {}


def _count(value: object) -> int | None:
    return len(value) if isinstance(value, list) else None


def _money(value: object) -> Decimal | None:
    return None if value is None or isinstance(value, bool) else Decimal(str(value))


def batch_results(*, batch: Batch) -> list[ResultRow]:
    """Each run of the batch with its current report (if any), in the batch's model order."""
    runs = list(batch.runs.select_related("thread").with_current_report())
    order = {model: index for index, model in enumerate(batch.models_list)}
    runs.sort(key=lambda run: (run.thread_id, order.get(run.model, len(order)), run.pk))
    rows = []
    for run in runs:
        report = run.current_report
        tests = _section(report, "tests")
        historical = _section(report, "historical")
        rows.append(
            ResultRow(
                run=run.pk,
                thread=run.thread_id,
                thread_title=str(run.thread),
                model=run.model,
                status=run.status,
                failure_code=run.failure_code,
                winner=report.winner if report else None,
                consistent=report.consistent if report else None,
                score_historical=report.score_historical if report else None,
                score_replay=report.score_replay if report else None,
                tests_kept=_count(tests.get("kept")),
                tests_broken=_count(tests.get("broken")),
                # The replay's own figures are the run's (a report copies them).
                replay_cost_usd=run.cost_usd,
                historical_cost_usd=_money(historical.get("cost_usd")),
                replay_seconds=run.wall_seconds,
                historical_seconds=historical.get("seconds"),
                evaluator=report.evaluator if report else None,
                evaluator_cost_usd=report.evaluator_cost_usd if report else None,
                report_status=report.status if report else None,
            )
        )
    return rows


def consistency_rates() -> list[dict[str, Any]]:
    """Per evaluator and prompt version: the share of both-order judgments whose two orders
    agreed, over every stored judged report (current or not), with its Wilson interval."""
    rows = (
        Report.objects.filter(status=ReportStatus.JUDGED, consistent__isnull=False)
        .values("evaluator", "prompt_version")
        .annotate(n=Count("id"), agreed=Count("id", filter=Q(consistent=True)))
        .order_by("evaluator", "prompt_version")
    )
    rates = []
    for row in rows:
        rate = statistics.wilson_interval(row["agreed"], row["n"])
        rates.append({**row, "rate": rate.value, "rate_low": rate.low, "rate_high": rate.high})
    return rates


def brief(report: Report | None) -> dict[str, Any] | None:
    """A report in brief, as the commands print it (JSON)."""
    if report is None:
        return None
    return {
        "id": report.pk,
        "run": report.run_id,
        "status": report.status,
        "winner": report.winner,
        "score_historical": report.score_historical,
        "score_replay": report.score_replay,
        "consistent": report.consistent,
        "evaluator": report.evaluator,
        "reason": report.reason,
    }
