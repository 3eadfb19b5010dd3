"""The report's document: what a judgment stores about the run against history.

Versioned (SCHEMA_VERSION) and described in docs/reports.md: both sides' cost, time,
tokens and context, the shared review in brief, the tests (FAIL_TO_PASS, PASS_TO_PASS,
what the replay kept and broke, the verify command's output on each tree), and, once
judged, the winner, scores, checks, the both-order verdicts and the evaluator's cost.
Plain functions over rows; the judgment (replays.evaluation.report) stores what they build.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from replays.context import HISTORICAL_CONTEXT
from replays.evaluation import checks, judge
from replays.models import Report, ReportStatus, Review, Run, Turn

SCHEMA_VERSION = 1


def base_document(run: Run, report: Report) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "run": run.pk,
        "evaluator": {"id": report.evaluator},
        "prompt_version": report.prompt_version,
        "context": report.context,
        "historical": historical_side(run),
        "replay": replay_side(run),
        "tests": None,
        "review": None,
    }


def historical_side(run: Run) -> dict[str, Any]:
    """Cost, time and tokens the historical agent spent on the range, from its turns."""
    spec = run.spec
    turns = list(run.thread.turns.order_by("index"))
    indexes = {turn.message_uuid: turn.index for turn in turns}
    first = indexes.get(spec.start_message_uuid)
    last = indexes.get(spec.end_message_uuid)
    selected: list[Turn] = (
        [turn for turn in turns if first <= turn.index <= last]
        if first is not None and last is not None
        else []
    )
    costs = [turn.cost_usd for turn in selected]
    return {
        "turns": len(selected),
        "cost_usd": None if not selected or None in costs else money(sum(costs, Decimal(0))),
        "seconds": _sum_or_none([turn.seconds for turn in selected]),
        "model_seconds": _sum_or_none([turn.model_seconds for turn in selected]),
        "tokens": {
            name: sum(getattr(turn, name) for turn in selected)
            for name in (
                "input_tokens",
                "output_tokens",
                "cache_read_tokens",
                "cache_write_5m_tokens",
                "cache_write_1h_tokens",
            )
        },  # fmt: skip
        "files_changed": None,  # filled from the historical diff when it is read
        # What the historical agent knew: its own session, every earlier request in full.
        "context": HISTORICAL_CONTEXT,
        # A tree rebuilt from the transcript's edits stood in for a missing commit:
        # {"ending"?: {commit, base, files, edits, unsure, repository}, "baseline"?: ...}.
        "rebuilt": dict(spec.rebuilt) or None,
    }


def replay_side(run: Run) -> dict[str, Any]:
    return {
        "model": run.model,
        "cost_usd": money(run.cost_usd),
        "seconds": run.wall_seconds,
        "model_seconds": run.model_seconds,
        "tokens": run.tokens,
        "files_changed": run.files_changed,
        # What the replay knew before the request (cold, digest, fork), and in how many
        # turns it got the range's requests.
        "context": run.spec.context,
        "turns": len(run.turns) or 1,
    }


def review_summary(review: Review) -> dict[str, Any]:
    return {
        "id": review.pk,
        "status": review.status,
        "checks": len(review.checks),
        "cost_usd": money(review.cost_usd),
        "seconds": review.seconds,
    }


def tests_document_of(report: Report) -> dict[str, Any] | None:
    """The tests part of a report that was stored without one (a review that failed before
    this was kept): from its review and the run's own tree, as far as they were run."""
    review = report.review
    if review is None or not review.tests:
        return None
    tree = report.run.tree_tests
    replay_tests = checks.TreeTests.from_dict(tree) if isinstance(tree, dict) else None
    return tests_document(review, replay_tests, {})


def tests_document(
    review: Review, replay_tests: checks.TreeTests | None, kept_broken: dict[str, Any]
) -> dict[str, Any] | None:
    tests = review.tests
    if not tests:
        return None
    sets = checks.TestSets.from_dict(tests["sets"])
    return {
        "verify_command": tests["verify_command"],
        "test_files": tests["test_files"],
        "usable": sets.usable,
        "reason": sets.reason,
        "fail_to_pass": sets.fail_to_pass,
        "pass_to_pass": sets.pass_to_pass,
        "kept": kept_broken.get("kept", []),
        "broken": kept_broken.get("broken", []),
        "baseline": _tree_summary(tests.get("baseline")),
        "historical": _tree_summary(tests.get("historical")),
        "replay": _tree_summary(replay_tests.as_dict() if replay_tests else None),
    }


def _tree_summary(tree: dict[str, Any] | None) -> dict[str, Any] | None:
    if tree is None:
        return None
    return {key: tree.get(key) for key in ("outcome", "exit_code", "seconds", "message",
                                            "output_tail", "tests")}  # fmt: skip


def review_failed(base: dict[str, Any], reason: str) -> dict[str, Any]:
    reason = reason.strip() or "The review failed without a reason."
    document = {**base, "status": ReportStatus.REVIEW_FAILED, "winner": None, "reason": reason}
    return {"status": ReportStatus.REVIEW_FAILED, "reason": reason, "data": document}


def judged(base: dict[str, Any], decision: judge.Judgment, review: Review) -> dict[str, Any]:
    verdicts = decision.verdicts
    document = {
        **base,
        "status": ReportStatus.JUDGED,
        "winner": decision.winner,
        "consistent": decision.consistent,
        "scores": decision.scores,
        "evaluator_scores": decision.evaluator_scores,
        "test_scores": decision.test_scores,
        "tests_override": decision.tests_override,
        "mapping": (
            {"first_order": verdicts[0].labels, "second_order": verdicts[1].labels}
            if verdicts
            else None
        ),
        "checks": decision.checks,
        "verdicts": [verdict.as_dict() for verdict in verdicts],
    }
    document["evaluator"] = {
        **base["evaluator"],
        "cost_usd": money(decision.cost_usd),
        "seconds": decision.seconds,
        "tokens": decision.usage.as_dict(),
        "review_cost_usd": money(review.cost_usd),
    }
    return {
        "status": ReportStatus.JUDGED,
        "winner": decision.winner,
        "score_historical": decision.scores[judge.HISTORICAL],
        "score_replay": decision.scores[judge.REPLAY],
        "consistent": decision.consistent,
        "evaluator_cost_usd": decision.cost_usd,
        "review": review,
        "data": document,
    }


def money(value: Decimal | None) -> float | None:
    return None if value is None else float(round(value, 6))


def _sum_or_none(values: list[float | None]) -> float | None:
    if not values or any(value is None for value in values):
        return None
    return round(sum(value for value in values if value is not None), 3)
