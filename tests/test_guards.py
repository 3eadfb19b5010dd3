"""Guards for judging rules that a mutation check found unguarded, or guarded by one test:
each test here fails with its break in place (issue 19 says which).

- the shared review's key holds the range's first and last message, and the tests' digest;
- the order a model judge sees the two sides in is the drawn one, where the report uses it;
- a run judged twice counts once on the leaderboard (its current report);
- what n counts, a changed configuration refused at approval, and FAIL_TO_PASS, each
  guarded a second way.
"""

from __future__ import annotations

import dataclasses
import sys
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from replays import processes
from replays.evaluation import checks, judge
from replays.evaluation import leaderboard as leaderboards
from replays.evaluation import report as reports
from replays.evaluation.review import ReviewInputs, ReviewKey, obtain_review
from replays.factories.leaderboard import REPOSITORY, seed
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Report, ReportStatus, Review, Run, RunPhase, RunStatus

SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
PASSING = f"{sys.executable} -c pass"


@pytest.fixture
def graph(user: User, tmp_path: Path, settings: Any) -> tuple[Path, Run]:
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    repo, baseline, ending = make_git_repo(tmp_path / "git")
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"],
        verify_command=PASSING, evaluator="tests",
    )  # fmt: skip
    return repo, run


def review_for(key: ReviewKey, repo: Path, request: str) -> Review:
    inputs = ReviewInputs(repository=repo, request=request, timeout_seconds=60)
    return obtain_review(key=key, inputs=inputs, requested_at=timezone.now(), tick=lambda: None)


# --- the shared review's key ------------------------------------------------------------------


@pytest.mark.django_db
def test_two_ranges_of_one_thread_with_the_same_commits_and_diff_get_their_own_reviews(
    graph: tuple[Path, Run],
) -> None:
    """Their checks are written for their own requests: sharing one review would judge
    the second range against the first one's checks."""
    repo, run = graph
    first = ReviewKey.for_spec(run.spec, "tests")
    other = dataclasses.replace(first, start_message_uuid="uuid-b", end_message_uuid="uuid-c")
    one, two = review_for(first, repo, "request one"), review_for(other, repo, "request two")
    assert one.pk != two.pk and Review.objects.count() == 2
    assert (two.start_message_uuid, two.end_message_uuid) == ("uuid-b", "uuid-c")
    # The same range again is the same review.
    assert review_for(first, repo, "request one").pk == one.pk


@pytest.mark.django_db
@pytest.mark.parametrize(
    "change",
    [{"verify_command": f"{sys.executable} -c 'pass'"}, {"test_paths": ("spec/**",)}],
    ids=["another verify command", "other test paths"],
)
def test_another_verify_command_or_test_paths_never_reuse_a_review(
    graph: tuple[Path, Run], change: dict[str, Any]
) -> None:
    repo, run = graph
    first = ReviewKey.for_spec(run.spec, "tests")
    one = review_for(first, repo, "request")
    two = review_for(dataclasses.replace(first, **change), repo, "request")
    assert one.pk != two.pk
    assert two.tests["verify_command"] == (change.get("verify_command") or PASSING)


# --- the order a model judge sees -----------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("drawn", [judge.HISTORICAL, judge.REPLAY])
def test_a_model_judgment_shows_the_sides_in_the_drawn_order(
    graph: tuple[Path, Run], settings: Any, monkeypatch: pytest.MonkeyPatch, drawn: str
) -> None:
    """The draw is tested in its helper; here, where the report uses it: the first verdict
    puts the drawn side as A, the second swaps them, and the report keeps the mapping."""
    repo, run = graph
    settings.REPLAYS_AGENTS = {
        "judge": {
            "kind": "command",
            "command": [sys.executable, "-c", "pass"],
            "judge_command": [sys.executable, str(SCRIPTS / "judge.py"), "{task_file}",
                              "{answer_file}"],
            "models": ["fair"],
        }
    }  # fmt: skip
    monkeypatch.setattr(judge, "random_first", lambda: drawn)
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.COMPLETED, phase=RunPhase.DONE, finished_at=timezone.now(),
        diff=reports.repos.historical_diff(
            repo, run.configuration["baseline_commit"], run.configuration["ending_commit"]
        ),
    )  # fmt: skip
    run.refresh_from_db()
    judgment = reports.start_judgment(
        run=run, evaluator="judge:fair", holder=processes.own_identity()
    )
    done = reports.judge_report(report_id=judgment.pk, requested_at=timezone.now())
    assert done.status == ReportStatus.JUDGED, done.reason
    other = judge.REPLAY if drawn == judge.HISTORICAL else judge.HISTORICAL
    assert done.data["mapping"]["first_order"] == {"A": drawn, "B": other}
    assert done.data["mapping"]["second_order"] == {"A": other, "B": drawn}


# --- the leaderboard counts current reports ---------------------------------------------------


@pytest.mark.django_db
def test_a_run_judged_twice_counts_once_by_its_current_report(user: User) -> None:
    seeded = seed(user, {"codex:m": [("win", 0.9)]})
    [run] = seeded.runs["codex:m"]
    # An earlier judgment of the same run, retired: it said history won.
    Report.objects.create(
        run=run, status=ReportStatus.JUDGED, is_current=False, winner="historical",
        score_historical=1.0, score_replay=0.2, evaluator="tests", prompt_version="v1",
        context="cold", finished_at=timezone.now(),
    )  # fmt: skip
    board = leaderboards.leaderboard(user=user, filters=leaderboards.Filters())
    [row] = board.rows
    assert (row.n, row.wins, row.losses) == (1, 1, 0)


@pytest.mark.django_db
def test_the_filters_choices_count_only_current_reports_when_a_filter_narrows(user: User) -> None:
    """The choices are worked out apart when a run filter is set: a retired judgment by
    another evaluator must offer neither its evaluator nor its version, nor count twice."""
    seeded = seed(user, {"codex:m": [("win", 0.9)]})
    [run] = seeded.runs["codex:m"]
    Report.objects.create(
        run=run, status=ReportStatus.JUDGED, is_current=False, winner="historical",
        score_historical=1.0, score_replay=0.2, evaluator="judge:old", prompt_version="v0",
        context="cold", finished_at=timezone.now(),
    )  # fmt: skip
    unfiltered = leaderboards.leaderboard(user=user, filters=leaderboards.Filters()).choices
    filtered = leaderboards.leaderboard(
        user=user, filters=leaderboards.Filters(repository=REPOSITORY)
    ).choices
    assert [(choice.value, choice.count) for choice in filtered.evaluators] == [("tests", 1)]
    assert [(choice.value, choice.count) for choice in filtered.prompt_versions] == [("v1", 1)]
    assert filtered == unfiltered


# --- what n counts, a second way -------------------------------------------------------------

OUTCOMES = ["win", "tie", "loss", "timeout", "agent_error", "setup", "infrastructure",
            "launch_failed", "coordinator_lost", "review_failed", "cancelled", "pending"]  # fmt: skip
IN_N = {"win", "tie", "loss", "timeout", "agent_error"}


@pytest.mark.django_db
@hypothesis_settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(outcomes=st.lists(st.sampled_from(OUTCOMES), min_size=1, max_size=12))
def test_n_is_the_judged_runs_and_the_models_own_failures_whatever_the_mix(
    user: User, outcomes: list[str]
) -> None:
    Run.objects.all().delete()
    seed(user, {"codex:m": outcomes})
    [row] = leaderboards.leaderboard(user=user, filters=leaderboards.Filters()).rows
    counted = Counter(outcome for outcome in outcomes if outcome in IN_N)
    assert row.n == sum(counted.values())
    assert (row.wins, row.ties, row.losses) == (counted["win"], counted["tie"], counted["loss"])
    assert row.failed == counted["timeout"] + counted["agent_error"]
    assert row.setup == outcomes.count("setup")
    assert row.n + row.setup + row.not_counted == len(outcomes)
    assert row.total_cost_usd == (Decimal("0.10") * row.n if row.n else None)


# --- FAIL_TO_PASS, a second way ---------------------------------------------------------------

STATUS = st.sampled_from(["passed", "failed", "error", "skipped"])


@given(
    baseline=st.dictionaries(st.sampled_from("abcdef"), STATUS, max_size=6),
    historical=st.dictionaries(st.sampled_from("abcdef"), STATUS, min_size=1, max_size=6),
)
def test_fail_to_pass_is_what_passes_historically_and_not_at_the_baseline(
    baseline: dict[str, str], historical: dict[str, str]
) -> None:
    """Against the definition itself, for any per-test results: the tests that pass on the
    historical tree split into those that did not pass at the baseline (FAIL_TO_PASS, a
    test missing there counting as not passing) and those that did (PASS_TO_PASS)."""
    sets = checks.test_sets(
        checks.TreeTests(outcome="failed", exit_code=1, tests=baseline),
        checks.TreeTests(outcome="passed", exit_code=0, tests=historical),
    )
    passing = {name for name, status in historical.items() if status == "passed"}
    if not passing:
        # Without a passing test, the whole command is the one test: failed at the baseline.
        assert sets.fail_to_pass == [checks.VERIFY_COMMAND_TEST] and sets.pass_to_pass == []
        return
    assert set(sets.fail_to_pass) == {n for n in passing if baseline.get(n) != "passed"}
    assert set(sets.pass_to_pass) == {n for n in passing if baseline.get(n) == "passed"}
    # A replay that keeps only the PASS_TO_PASS tests breaks every FAIL_TO_PASS one.
    replay = checks.TreeTests(outcome="failed", exit_code=1,
                              tests={name: "passed" for name in sets.pass_to_pass})  # fmt: skip
    kept, broken = checks.kept_and_broken(sets, replay)
    assert sorted(broken) == sorted(sets.fail_to_pass) and sorted(kept) == sets.pass_to_pass
