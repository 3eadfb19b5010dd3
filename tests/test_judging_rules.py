"""The rules that decide a judgment, alone: the blind mapping, the both-order tie rule, a
replay that breaks a test cannot win, scores, reading a verdict, the evaluator fallback
order, and the statistics over stored judgments."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from replays import statistics
from replays.evaluation import checks, evaluators, judge
from replays.evaluation.judge import HISTORICAL, REPLAY, TIE

CHECKS = [{"id": "c1", "text": "counts lines"}, {"id": "c2", "text": "has a test"}]


def verdict(preferred: str, score_a: float = 0.8, score_b: float = 0.4, **extra: Any) -> dict:
    return {
        "checks": [
            {"id": "c1", "a": True, "b": False, "reason": "B  does not\ncount"},
            {"id": "c2", "a": True, "b": True, "reason": "both"},
        ],
        "score_a": score_a,
        "score_b": score_b,
        "preferred": preferred,
        "reason": "A is better",
        **extra,
    }


def test_the_mapping_is_random_and_the_second_order_swaps_it() -> None:
    seen = Counter(judge.random_first() for _ in range(400))
    assert set(seen) == {HISTORICAL, REPLAY}
    assert min(seen.values()) > 120  # both orders come first about half the time
    first = judge.first_order_labels(HISTORICAL)
    second = judge.first_order_labels(REPLAY)
    assert first == {"A": HISTORICAL, "B": REPLAY} and second == {"A": REPLAY, "B": HISTORICAL}


@pytest.mark.parametrize(
    ("first", "second", "winner", "consistent"),
    [
        (REPLAY, REPLAY, REPLAY, True),
        (HISTORICAL, HISTORICAL, HISTORICAL, True),
        (TIE, TIE, TIE, True),
        (REPLAY, HISTORICAL, TIE, False),  # position bias: each order preferred its A
        (REPLAY, TIE, TIE, False),
        (TIE, HISTORICAL, TIE, False),
    ],
)
def test_two_orders_that_disagree_are_a_tie_marked_inconsistent(
    first: str, second: str, winner: str, consistent: bool
) -> None:
    assert judge.combine_preferences(first, second) == (winner, consistent)


@pytest.mark.parametrize("said", [REPLAY, TIE, HISTORICAL])
def test_a_replay_that_breaks_a_historically_passing_test_cannot_win(said: str) -> None:
    assert judge.winner_after_tests(said, ["tests::test_a"]) == (
        HISTORICAL,
        said != HISTORICAL,
    )
    assert judge.winner_after_tests(said, []) == (said, False)


def test_a_verdict_is_mapped_back_from_positions_to_sides() -> None:
    labels = judge.first_order_labels(REPLAY)  # the replay is shown as A
    read = judge.parse_verdict(verdict("A"), CHECKS, labels, order=1)
    assert read.preferred == REPLAY
    assert read.scores == {REPLAY: 0.8, HISTORICAL: 0.4}
    assert read.checks["c1"] == {REPLAY: True, HISTORICAL: False, "reason": "B does not count"}


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"preferred": "C"}, "`preferred` must be A, B or tie"),
        ({"score_a": 1.5}, "`score_a` must be a number from 0 to 1"),
        ({"score_b": "high"}, "`score_b` must be a number from 0 to 1"),
        ({"score_a": True}, "`score_a` must be a number from 0 to 1"),
        ({"checks": "all good"}, "`checks` must be a list"),
    ],
)
def test_a_verdict_that_cannot_be_read_says_why(change: dict, complaint: str) -> None:
    answer = {**verdict("A"), **change}
    with pytest.raises(judge.VerdictUnreadable, match=complaint):
        judge.parse_verdict(answer, CHECKS, judge.first_order_labels(HISTORICAL), order=2)


def test_checks_the_evaluator_was_not_asked_about_are_ignored() -> None:
    answer = verdict("tie")
    answer["checks"].append({"id": "c9", "a": False, "b": False, "reason": "made up"})
    read = judge.parse_verdict(answer, CHECKS, judge.first_order_labels(HISTORICAL), order=1)
    assert set(read.checks) == {"c1", "c2"} and read.preferred == TIE


def both_orders(first_answer: dict, second_answer: dict, first: str = HISTORICAL) -> list:
    return [
        judge.parse_verdict(first_answer, CHECKS, judge.first_order_labels(first), order=1),
        judge.parse_verdict(
            second_answer,
            CHECKS,
            judge.first_order_labels(REPLAY if first == HISTORICAL else HISTORICAL),
            order=2,
        ),
    ]


def test_a_consistent_judgment_averages_both_orders_and_agrees_per_check() -> None:
    # History is A first, then B: both verdicts prefer history.
    verdicts = both_orders(verdict("A", 0.9, 0.5), verdict("B", 0.6, 0.8))
    decided = judge.combine_verdicts(verdicts, CHECKS, {})
    assert decided.winner == HISTORICAL and decided.consistent is True
    assert decided.scores == {HISTORICAL: 0.85, REPLAY: 0.55}
    # c1: history passed in order 1 (as A) but failed in order 2 (as B): no agreement.
    assert decided.checks[0][HISTORICAL]["passed"] is None
    assert decided.checks[1][REPLAY]["passed"] is True


def test_a_position_biased_evaluator_gives_an_inconsistent_tie() -> None:
    verdicts = both_orders(verdict("A"), verdict("A"))  # always the first shown
    decided = judge.combine_verdicts(verdicts, CHECKS, {})
    assert (decided.winner, decided.consistent) == (TIE, False)


def test_tests_count_in_the_score_and_broken_tests_overrule_the_evaluator() -> None:
    verdicts = both_orders(verdict("B", 0.5, 1.0), verdict("A", 1.0, 0.5))  # both prefer replay
    kept_broken = {"kept": ["t1"], "broken": ["t2"]}
    decided = judge.combine_verdicts(verdicts, CHECKS, kept_broken)
    assert decided.winner == HISTORICAL and decided.tests_override
    assert decided.consistent is True  # the evaluator itself was consistent
    assert decided.test_scores == {HISTORICAL: 1.0, REPLAY: 0.5}
    assert decided.scores == {HISTORICAL: 0.75, REPLAY: 0.75}


def test_the_tests_evaluator_ties_when_every_test_is_kept_and_loses_otherwise() -> None:
    review_checks = [
        {"id": "c1", "text": "t1 passes", "tests": ["t1"]},
        {"id": "c2", "text": "the 2 tests still pass", "tests": ["t2", "t3"]},
    ]
    kept = judge.judge_with_tests(review_checks, {"kept": ["t1", "t2", "t3"], "broken": []})
    assert (kept.winner, kept.scores, kept.consistent) == (
        TIE,
        {HISTORICAL: 1.0, REPLAY: 1.0},
        None,
    )
    broke = judge.judge_with_tests(review_checks, {"kept": ["t1"], "broken": ["t2", "t3"]})
    assert broke.winner == HISTORICAL and broke.scores[REPLAY] == pytest.approx(1 / 3)
    assert [check[REPLAY]["passed"] for check in broke.checks] == [True, False]


def test_the_replays_kept_and_broken_tests_come_from_the_reference_sets() -> None:
    baseline = checks.TreeTests(outcome="failed", tests={"t1": "failed", "t2": "passed"})
    historical = checks.TreeTests(outcome="passed", tests={"t1": "passed", "t2": "passed"})
    review_tests = {"sets": checks.test_sets(baseline, historical).as_dict()}
    replay = checks.TreeTests(outcome="failed", tests={"t1": "passed", "t2": "failed"})
    assert judge.replay_tests(review_tests, replay) == {"kept": ["t1"], "broken": ["t2"]}
    assert judge.replay_tests(review_tests, None) == {"kept": [], "broken": ["t1", "t2"]}
    unusable = {"sets": checks.test_sets(baseline, baseline).as_dict()}
    assert judge.replay_tests(unusable, replay) == {}  # the tests cannot be a reference
    assert judge.replay_tests({}, replay) == {}


def test_the_prompts_keep_the_two_candidates_blind() -> None:
    a = judge.Candidate(HISTORICAL, "diff --git a/x b/x\n+one\n", checks.TreeTests("passed", 0))
    b = judge.Candidate(REPLAY, "", checks.TreeTests("failed", 1, message="/runs/run-7/checks"))
    prompt = judge.verdict_prompt(request="Count lines.", review_checks=CHECKS, a=a, b=b)
    assert "historical" not in prompt.lower() and "replay" not in prompt.lower()
    assert "run-7" not in prompt  # messages name folders; they stay out
    assert "c1: counts lines" in prompt and "(no changes)" in prompt


def test_a_long_diff_is_cut_with_a_marker_the_evaluator_sees(settings: Any) -> None:
    settings.REPLAYS_JUDGE_DIFF_CHARS = 1000
    cut = judge.cut_diff("+" + "x" * 5000)
    assert len(cut) < 1100 and "[replays] The diff is cut here: 4,001 more characters" in cut


# --- the evaluator fallback ---------------------------------------------------------------


@pytest.fixture
def judges(settings: Any, tmp_path: Any) -> Any:
    program = tmp_path / "judge.py"
    program.write_text("")
    settings.REPLAYS_AGENTS = {
        "aider": {"kind": "command", "command": ["true"], "models": ["m1"]},
        "judge": {
            "kind": "command",
            "command": ["true"],
            "judge_command": ["true", "{task_file}", "{answer_file}"],
            "models": ["j1", "j2"],
        },
    }
    return settings


def test_a_configured_default_evaluator_comes_first(judges: Any) -> None:
    judges.REPLAYS_DEFAULT_EVALUATOR = "tests"
    assert evaluators.default_evaluator(models=["aider:m1"], verify_command=None) == "tests"


def test_else_the_first_available_judge_capable_model_in_discovery_order(judges: Any) -> None:
    assert evaluators.default_evaluator(models=["aider:m1"], verify_command="pytest") == "judge:j1"


def test_else_tests_with_a_verify_command_else_the_first_candidate_agent(judges: Any) -> None:
    judges.REPLAYS_AGENTS = {"aider": judges.REPLAYS_AGENTS["aider"]}
    assert evaluators.default_evaluator(models=["aider:m1"], verify_command="pytest") == "tests"
    # It cannot judge: the plan is blocked with that reason (tests/test_evaluation.py).
    found = evaluators.default_evaluator(models=["historical", "aider:m1"], verify_command=None)
    assert found == "aider:m1"
    assert evaluators.default_evaluator(models=["historical", "empty"], verify_command=None) is None


def test_the_evaluator_list_puts_tests_first_and_says_why_others_cannot_judge(
    judges: Any,
) -> None:
    found = {info.id: info for info in evaluators.discover_evaluators()}
    assert list(found)[0] == "tests" and found["tests"].available
    assert not found["aider:m1"].available
    assert "judge_command" in found["aider:m1"].reason
    assert found["judge:j2"].available and found["judge:j2"].kind == "command"
    assert "historical" not in found
    with pytest.raises(evaluators.UnknownEvaluator, match="calibration baseline"):
        evaluators.resolve_evaluator("empty")


# --- statistics -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("successes", "n", "low", "high"),
    [
        (0, 10, 0.0, 0.2775),
        (3, 3, 0.4385, 1.0),  # 3 of 3 is not "100%"
        (81, 100, 0.7222, 0.8749),
        (150, 300, 0.4438, 0.5562),
    ],
)
def test_wilson_intervals_match_known_values(
    successes: int, n: int, low: float, high: float
) -> None:
    rate = statistics.wilson_interval(successes, n)
    assert (round(rate.low, 4), round(rate.high, 4)) == (low, high)
    assert rate.value == successes / n


def test_a_rate_over_nothing_is_unknown() -> None:
    rate = statistics.wilson_interval(0, 0)
    assert rate.value is None and (rate.low, rate.high) == (0.0, 1.0)
    with pytest.raises(ValueError):
        statistics.wilson_interval(4, 3)
