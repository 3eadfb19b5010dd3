"""Blind judging: the historical result and a replay, as A and B, in both orders.

The evaluator never learns which candidate is which: they are shown as A and B
in a random mapping (stored), and judged twice with the order swapped. Each
verdict gives per-check pass/fail with a one-line reason, a score per candidate
in [0, 1] and a preference. The rules that decide the winner are here as plain
functions, so they are tested alone:

- both orders prefer the same side (or both say tie): that is the winner;
  otherwise the winner is a tie and the judgment is inconsistent;
- a replay that breaks a test that passed historically cannot win: the winner
  is historical whatever the evaluator said;
- with usable tests, a side's score is the mean of the evaluator's score and
  the share of FAIL_TO_PASS and PASS_TO_PASS tests it passes; without them, the
  evaluator's score alone. The `tests` evaluator scores from the tests alone.

A verdict that cannot be read is not an exception for the caller: it becomes
VerdictUnreadable, which the report turns into a review failure with the reason.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

from replays.evaluation import checks, evaluators
from replays.evaluation.review import cut_diff, prompt_template
from replays.transcripts.base import TokenUsage

HISTORICAL = "historical"
REPLAY = "replay"
TIE = "tie"
SIDES = (HISTORICAL, REPLAY)
LABELS = ("A", "B")

VERDICT_SCHEMA = evaluators.strict_object(
    {
        "checks": {
            "type": "array",
            "items": evaluators.strict_object(
                {
                    "id": {"type": "string"},
                    "a": {"type": "boolean"},
                    "b": {"type": "boolean"},
                    "reason": {"type": "string"},
                }
            ),
        },
        "score_a": {"type": "number"},
        "score_b": {"type": "number"},
        "preferred": {"type": "string", "enum": ["A", "B", "tie"]},
        "reason": {"type": "string"},
    }
)
MAX_REASON_CHARS = 500

Tick = Callable[[], None]


class VerdictUnreadable(Exception):
    """The evaluator's verdict cannot be used; the message says why."""


@dataclass
class Candidate:
    side: str  # HISTORICAL or REPLAY
    diff: str
    tests: checks.TreeTests | None  # None without a verify command


@dataclass
class Verdict:
    """One order's verdict, mapped back from A/B to the sides."""

    order: int  # 1 or 2
    labels: dict[str, str]  # {"A": side, "B": side}
    preferred: str  # HISTORICAL, REPLAY or TIE
    scores: dict[str, float]  # by side
    checks: dict[str, dict[str, Any]]  # check id -> {side: bool | None, "reason": str}
    reason: str
    prompt: str = ""
    raw: str = ""
    seconds: float = 0.0
    cost_usd: Decimal | None = None
    usage: TokenUsage = field(default_factory=TokenUsage)

    def as_dict(self) -> dict[str, Any]:
        return {
            "order": self.order,
            "labels": self.labels,
            "preferred": self.preferred,
            "scores": self.scores,
            "checks": self.checks,
            "reason": self.reason,
            "prompt": self.prompt,
            "raw": self.raw,
            "seconds": self.seconds,
            "cost_usd": None if self.cost_usd is None else str(self.cost_usd),
            "tokens": self.usage.as_dict(),
        }


@dataclass
class Judgment:
    """The decision about one replay against history."""

    winner: str
    consistent: bool | None  # None: judged in one deterministic pass (tests)
    scores: dict[str, float]  # final, by side
    checks: list[dict[str, Any]]  # per check: text, and by side {"passed", "reasons"}
    evaluator_scores: dict[str, float] | None = None
    test_scores: dict[str, float] | None = None
    tests_override: bool = False  # the replay broke a test, so history won
    verdicts: list[Verdict] = field(default_factory=list)

    @property
    def cost_usd(self) -> Decimal | None:
        if not self.verdicts:
            return Decimal(0)
        costs = [verdict.cost_usd for verdict in self.verdicts]
        if any(cost is None for cost in costs):
            return None
        return sum((cost for cost in costs if cost is not None), Decimal(0))

    @property
    def seconds(self) -> float:
        return round(sum(verdict.seconds for verdict in self.verdicts), 3)

    @property
    def usage(self) -> TokenUsage:
        return sum((verdict.usage for verdict in self.verdicts), TokenUsage())


# --- the rules -----------------------------------------------------------------------------


def first_order_labels(first: str) -> dict[str, str]:
    """{"A": side, "B": side} with `first` shown as A."""
    other = REPLAY if first == HISTORICAL else HISTORICAL
    return {"A": first, "B": other}


def random_first() -> str:
    """Which side is A in the first order; the second order swaps them."""
    return secrets.choice(SIDES)


def combine_preferences(first: str, second: str) -> tuple[str, bool]:
    """(winner, consistent): the side both orders prefer, else a tie marked inconsistent."""
    if first == second:
        return first, True
    return TIE, False


def winner_after_tests(winner: str, broken: list[str]) -> tuple[str, bool]:
    """(winner, overridden): a replay that breaks a historically passing test cannot win."""
    if broken and winner != HISTORICAL:
        return HISTORICAL, True
    return winner, False


def test_scores(kept: list[str], broken: list[str]) -> dict[str, float]:
    """Share of FAIL_TO_PASS ∪ PASS_TO_PASS tests each side passes (history passes all)."""
    total = len(kept) + len(broken)
    return {HISTORICAL: 1.0, REPLAY: len(kept) / total if total else 1.0}


def final_scores(
    evaluator_scores: dict[str, float] | None, tests: dict[str, float] | None
) -> dict[str, float]:
    if evaluator_scores is None:
        assert tests is not None
        return dict(tests)
    if tests is None:
        return dict(evaluator_scores)
    return {side: round((evaluator_scores[side] + tests[side]) / 2, 4) for side in SIDES}


def replay_tests(review_tests: dict[str, Any], replay: checks.TreeTests | None) -> dict[str, Any]:
    """Kept and broken FAIL_TO_PASS / PASS_TO_PASS tests of the replay ({} when the tests
    cannot be used as a reference)."""
    if not review_tests.get("sets"):
        return {}
    sets = checks.TestSets.from_dict(review_tests["sets"])
    if not sets.usable:
        return {}
    tree = replay or checks.TreeTests(outcome="error", message="The replay's tree was not tested.")
    kept, broken = checks.kept_and_broken(sets, tree)
    return {"kept": kept, "broken": broken}


# --- the tests evaluator ---------------------------------------------------------------------


def judge_with_tests(review_checks: list[dict[str, Any]], kept_broken: dict[str, Any]) -> Judgment:
    """Scores and winner from the tests alone: history passes every reference test; the
    replay ties when it keeps them all and loses when it breaks one."""
    kept, broken = kept_broken["kept"], kept_broken["broken"]
    scores = test_scores(kept, broken)
    winner, _ = winner_after_tests(TIE, broken)
    per_check = []
    for check in review_checks:
        names = check.get("tests", [])
        failing = [name for name in names if name in broken]
        per_check.append(
            {
                "id": check["id"],
                "text": check["text"],
                HISTORICAL: {"passed": True, "reasons": ["Passes on the historical tree."]},
                REPLAY: {
                    "passed": not failing,
                    "reasons": [
                        "Fails on the replay's tree: " + ", ".join(failing)
                        if failing
                        else "Passes on the replay's tree."
                    ],
                },
            }
        )
    return Judgment(
        winner=winner,
        consistent=None,
        scores=scores,
        checks=per_check,
        test_scores=scores,
        tests_override=bool(broken),
    )


# --- a model evaluator ---------------------------------------------------------------------


def judge_with_model(
    info: evaluators.EvaluatorInfo,
    *,
    request: str,
    review_checks: list[dict[str, Any]],
    historical: Candidate,
    replay: Candidate,
    kept_broken: dict[str, Any],
    folder: Path,
    first: str,
    tick: Tick,
) -> Judgment:
    """Two verdicts, orders swapped; VerdictUnreadable when either cannot be used."""
    candidates = {HISTORICAL: historical, REPLAY: replay}
    verdicts = []
    for order, labels in enumerate(
        (first_order_labels(first), first_order_labels(_other(first))), 1
    ):
        prompt = verdict_prompt(
            request=request,
            review_checks=review_checks,
            a=candidates[labels["A"]],
            b=candidates[labels["B"]],
        )
        answer, seconds = evaluators.ask(
            info,
            name=f"verdict-{order}",
            prompt=prompt,
            schema=VERDICT_SCHEMA,
            inputs={
                "request": request,
                "checks": review_checks,
                "a": _candidate_inputs(candidates[labels["A"]]),
                "b": _candidate_inputs(candidates[labels["B"]]),
            },
            folder=folder,
            tick=tick,
        )
        if answer.answer is None:
            raise VerdictUnreadable(
                f"The evaluator {info.id} gave no usable verdict (order {order}): {answer.error}"
            )
        verdict = parse_verdict(answer.answer, review_checks, labels, order=order)
        verdict.prompt, verdict.raw, verdict.seconds = prompt, answer.raw, seconds
        verdict.cost_usd, verdict.usage = answer.cost_usd, answer.usage
        verdicts.append(verdict)
    return combine_verdicts(verdicts, review_checks, kept_broken)


def combine_verdicts(
    verdicts: list[Verdict], review_checks: list[dict[str, Any]], kept_broken: dict[str, Any]
) -> Judgment:
    winner, consistent = combine_preferences(verdicts[0].preferred, verdicts[1].preferred)
    evaluator_scores = {
        side: round(sum(v.scores[side] for v in verdicts) / len(verdicts), 4) for side in SIDES
    }
    tests = None
    overridden = False
    if kept_broken:
        tests = test_scores(kept_broken["kept"], kept_broken["broken"])
        winner, overridden = winner_after_tests(winner, kept_broken["broken"])
    per_check = []
    for check in review_checks:
        entry: dict[str, Any] = {"id": check["id"], "text": check["text"]}
        for side in SIDES:
            results = [v.checks.get(check["id"], {}).get(side) for v in verdicts]
            reasons = [v.checks.get(check["id"], {}).get("reason", "") for v in verdicts]
            # Both orders must agree for a check to count as passed or failed.
            passed = results[0] if results[0] == results[1] else None
            entry[side] = {"passed": passed, "reasons": [r for r in reasons if r]}
        per_check.append(entry)
    return Judgment(
        winner=winner,
        consistent=consistent,
        scores=final_scores(evaluator_scores, tests),
        checks=per_check,
        evaluator_scores=evaluator_scores,
        test_scores=tests,
        tests_override=overridden,
        verdicts=verdicts,
    )


def parse_verdict(
    answer: dict[str, Any],
    review_checks: list[dict[str, Any]],
    labels: dict[str, str],
    *,
    order: int,
) -> Verdict:
    """One verdict read strictly; VerdictUnreadable says what is wrong with it."""
    preferred = answer.get("preferred")
    if preferred not in ("A", "B", "tie"):
        raise VerdictUnreadable(
            f"Verdict {order}: `preferred` must be A, B or tie, not {preferred!r}."
        )
    scores = {}
    for label, key in (("A", "score_a"), ("B", "score_b")):
        value = answer.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
            raise VerdictUnreadable(
                f"Verdict {order}: `{key}` must be a number from 0 to 1, not {value!r}."
            )
        scores[labels[label]] = float(value)
    items = answer.get("checks")
    if not isinstance(items, list):
        raise VerdictUnreadable(f"Verdict {order}: `checks` must be a list.")
    known = {check["id"] for check in review_checks}
    per_check: dict[str, dict[str, Any]] = {}
    for item in items:
        if not isinstance(item, dict) or item.get("id") not in known:
            continue  # a check we did not ask about says nothing
        results = {}
        for label, key in (("A", "a"), ("B", "b")):
            value = item.get(key)
            results[labels[label]] = value if isinstance(value, bool) else None
        reason = item.get("reason")
        per_check[item["id"]] = {
            **results,
            "reason": " ".join(reason.split())[:MAX_REASON_CHARS]
            if isinstance(reason, str)
            else "",
        }
    reason = answer.get("reason")
    return Verdict(
        order=order,
        labels=labels,
        preferred=TIE if preferred == "tie" else labels[preferred],
        scores=scores,
        checks=per_check,
        reason=" ".join(reason.split())[:MAX_REASON_CHARS] if isinstance(reason, str) else "",
    )


def verdict_prompt(
    *, request: str, review_checks: list[dict[str, Any]], a: Candidate, b: Candidate
) -> str:
    listed = "\n".join(f"{check['id']}: {check['text']}" for check in review_checks)
    return prompt_template("verdict").substitute(
        request=request.strip(),
        checks=listed or "(none were derived: judge the request as a whole)",
        diff_a=cut_diff(a.diff),
        tests_a=describe_tree_tests(a.tests),
        diff_b=cut_diff(b.diff),
        tests_b=describe_tree_tests(b.tests),
    )


def describe_tree_tests(tests: checks.TreeTests | None) -> str:
    """A candidate's tests, worded the same for both sides (the evaluator stays blind)."""
    if tests is None:
        return "Not tested (no verify command)."
    lines = [
        f"The verify command {tests.outcome}"
        + (f" (exit {tests.exit_code})." if tests.exit_code is not None else ".")
    ]
    if tests.tests:
        failing = sorted(
            name for name, status in tests.tests.items() if status in ("failed", "error")
        )
        passing = sum(1 for status in tests.tests.values() if status == "passed")
        lines.append(
            f"{passing} tests passed, {len(failing)} failed"
            + (": " + ", ".join(failing[:30]) if failing else ".")
        )
    # Not the command's messages or output: they name folders, which would tell the sides apart.
    return "\n".join(lines)


def _candidate_inputs(candidate: Candidate) -> dict[str, Any]:
    return {
        "diff": cut_diff(candidate.diff),
        "tests": candidate.tests.as_dict() if candidate.tests else None,
    }


def _other(side: str) -> str:
    return REPLAY if side == HISTORICAL else HISTORICAL
