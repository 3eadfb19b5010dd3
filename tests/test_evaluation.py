"""Evaluation end to end with real processes: the bundled sample replayed and judged, the
shared review derived once for many runs of many plans, a crashed claimer taken over,
re-judging from the command line and the API, lost judgments, cancel and a lost
coordinator while reviewing, and review failures that keep the run's result.

Model evaluators here are `command` agents in judge mode (tests/agent_scripts/judge.py);
the real codex and claude binaries as evaluators are in tests/test_evaluators_real_cli.py.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from replays import approval, dispatch, planning, supervision
from replays.errors import ErrorKind
from replays.models import (
    Batch,
    FailureCode,
    Report,
    ReportStatus,
    Review,
    ReviewStatus,
    Run,
    RunPhase,
    RunStatus,
    Thread,
)
from tests.conftest import host_pids
from tests.test_dispatch import gone, wait_until

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
VERIFY = f"{sys.executable} {SCRIPTS / 'verify.py'} {{junit_xml}}"
LINE_COUNT_TESTS = {
    "tests.test_core.LineCountTest::test_counts_lines",
    "tests.test_core.WordCountTest::test_counts_words",
}


@dataclass
class Eval:
    """One test's world: its database, run root, agents file and the sample thread."""

    env: dict[str, str]
    root: Path
    thread: Thread
    repo: Path
    user: User

    @property
    def calls(self) -> Path:
        return self.root / "marks" / "verify-calls.txt"

    @property
    def judge_calls(self) -> Path:
        return self.root / "marks" / "judge-calls.txt"

    @property
    def pause_file(self) -> Path:
        return self.root / "paused"

    def verify_calls(self) -> list[str]:
        if not self.calls.exists():
            return []
        return [line.split()[0] for line in self.calls.read_text().splitlines()]

    def configuration(self, models: list[str], **extra: Any) -> dict[str, Any]:
        first = self.thread.turns.get(index=0)
        return {
            "configurations": [
                {
                    "thread_id": self.thread.pk,
                    "start_message_uuid": first.message_uuid,
                    "end_message_uuid": first.message_uuid,
                    "repository": str(self.repo),
                }
            ],
            "models": models,
            **extra,
        }

    def approve(self, models: list[str], **extra: Any) -> Batch:
        """Prepare and approve in this process (the services the doors call)."""
        prepared = planning.prepare_plan(
            owner=self.user, raw_configuration=self.configuration(models, **extra)
        )
        plan = prepared.plan
        assert plan.status == "ready_for_approval", (plan.blockers, plan.questions)
        return approval.approve_plan(
            plan_id=plan.pk,
            user=self.user,
            approved=True,
            prepare_token=prepared.prepare_token,
            run_config=plan.configuration,
        ).batch

    watched: subprocess.Popen[str] | None = None

    def command(self, *args: str, pause_at: str = "", **popen: Any) -> subprocess.Popen[str]:
        env = {**self.env, "REPLAYS_TEST_PAUSE_AT": pause_at,
               "REPLAYS_TEST_PAUSE_FILE": str(self.pause_file)}  # fmt: skip
        self.watched = subprocess.Popen(
            [sys.executable, str(MANAGE), *args],
            env=env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            **popen,
        )
        return self.watched

    def paused_pid(self, step: str, seconds: float = 30) -> int:
        def reached() -> int:
            if self.watched is not None and self.watched.poll() is not None:
                pytest.fail(f"it ended before {step}: {self.watched.communicate()[0]}")
            if not self.pause_file.exists():
                return 0
            name, _, pid = self.pause_file.read_text().strip().partition(" ")
            return int(pid) if name == step and pid else 0

        return wait_until(reached, seconds=seconds, what=f"a pause at {step}")


def finish_batch(batch: Batch, seconds: float = 90) -> list[Run]:
    """Dispatch until every run of the batch ended; its runs by model."""

    def ended() -> bool:
        supervision.dispatch_runs()
        return batch.finished

    wait_until(ended, seconds=seconds, what=f"batch {batch.pk} to finish")
    return list(batch.runs.order_by("id"))


@pytest.fixture
def lab(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    user: User,
    real_threads: dict[str, Thread],
    sample_repo: Path,
) -> Eval:
    # The marker files of the judges and verify commands, in a folder their sandboxes may write.
    marks = tmp_path / "marks"
    marks.mkdir()
    agents = {
        "judge": {
            "kind": "command",
            "command": [sys.executable, "-c", "pass"],
            "judge_command": [sys.executable, str(SCRIPTS / "judge.py"), "{task_file}",
                              "{answer_file}"],
            "env": {"JUDGE_CALLS": str(marks / "judge-calls.txt")},
            "models": ["fair"],
        },
    }  # fmt: skip
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps(agents))
    values = {
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_MAX_PARALLEL_RUNS": "4",
        "REPLAYS_MAX_RUNS_PER_HOST": "4",
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        "REPLAYS_HEARTBEAT_STALE_SECONDS": "3",
        "REPLAYS_LAUNCH_GRACE_SECONDS": "5",
        "REPLAYS_TEST_PAUSE_AT": "",
        "VERIFY_CALLS": str(marks / "verify-calls.txt"),
        "REPLAYS_TEST_SANDBOX_WRITABLE": str(marks),
    }
    env = {**process_env, **values}
    for name in ("DATABASE_URL", "REPLAYS_VAR_DIR", *values):
        monkeypatch.setenv(name, env[name])
    settings.REPLAYS_AGENTS = agents
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    settings.REPLAYS_TEST_SANDBOX_WRITABLE = [marks]
    settings.REPLAYS_MAX_PARALLEL_RUNS = 4
    settings.REPLAYS_MAX_RUNS_PER_HOST = 4
    settings.REPLAYS_HEARTBEAT_SECONDS = 0.5
    settings.REPLAYS_HEARTBEAT_STALE_SECONDS = 3.0
    settings.REPLAYS_LAUNCH_GRACE_SECONDS = 5.0
    return Eval(
        env=env,
        root=tmp_path,
        thread=real_threads["claude-line-count"],
        repo=sample_repo,
        user=user,
    )


def by_model(runs: list[Run]) -> dict[str, Run]:
    return {run.model: run for run in runs}


# --- calibration on the bundled sample -------------------------------------------------------


def test_the_bundled_sample_calibrates_history_ties_and_no_change_loses(lab: Eval) -> None:
    """`replay --wait` with the historical and empty baselines and the tests evaluator on
    the sample repository's own tests: what a new user sees first."""
    first = lab.thread.turns.get(index=0)
    result = subprocess.run(
        [sys.executable, str(MANAGE), "replay", "--thread", str(lab.thread.pk),
         "--from", first.message_uuid, "--model", "historical", "--model", "empty",
         "--repository", str(lab.repo), "--verify-command", VERIFY, "--evaluator", "tests",
         "--user", "alice", "--yes", "--wait"],
        env=lab.env, text=True, capture_output=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "evaluator: tests" in result.stdout
    runs = by_model(list(Run.objects.order_by("id")))
    historical = runs["historical"].current_report
    empty = runs["empty"].current_report
    assert historical.winner in ("tie", "replay") and historical.score_replay == 1.0
    assert empty.winner == "historical" and empty.score_replay == 0.0
    assert runs["historical"].batch.results_ready
    # The table has the score and the winner.
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.strip()}
    assert "1.00 / 1.00" in lines["historical"] and lines["historical"].rstrip().endswith("tie")
    assert "1.00 / 0.00" in lines["empty"] and lines["empty"].rstrip().endswith("historical")
    # The tests history wrote fail at the baseline and pass historically; empty keeps none.
    tests = empty.data["tests"]
    assert set(tests["fail_to_pass"]) == LINE_COUNT_TESTS and tests["pass_to_pass"] == []
    assert set(tests["broken"]) == LINE_COUNT_TESTS
    assert set(historical.data["tests"]["kept"]) == LINE_COUNT_TESTS
    assert tests["test_files"] == ["tests/test_core.py"]
    # The historical side: the turn's own cost and time, from the transcript.
    turn = first
    assert historical.data["historical"]["cost_usd"] == pytest.approx(float(turn.cost_usd))
    assert historical.data["historical"]["files_changed"] == 2
    assert historical.review_id == empty.review_id  # one review for both models
    # The review keeps the historical diff: pages show it without the repository.
    assert Review.objects.get().historical_diff == runs["historical"].diff


def test_history_replayed_never_loses_to_a_model_judge_and_no_change_does(lab: Eval) -> None:
    batch = lab.approve(["historical", "empty"], evaluator="judge:fair")
    runs = by_model(finish_batch(batch))
    historical = runs["historical"].current_report
    empty = runs["empty"].current_report
    assert historical.winner == "tie" and historical.consistent is True
    assert empty.winner == "historical" and empty.consistent is True
    assert empty.score_historical == 0.9 and empty.score_replay == 0.1
    # One review (checks derived once), two verdicts per run, orders swapped.
    calls = lab.judge_calls.read_text().split()
    assert calls[::2].count("checks") == 1 and calls[::2].count("verdict-1") == 2
    mapping = empty.data["mapping"]
    assert mapping["first_order"]["A"] == mapping["second_order"]["B"]
    assert {check["id"] for check in empty.data["checks"]} == {"c1", "c2"}
    assert empty.data["checks"][0]["replay"]["passed"] is False
    # The evaluator's own cost is kept apart from the replay's.
    assert float(empty.evaluator_cost_usd) == pytest.approx(0.025)
    assert empty.data["evaluator"]["review_cost_usd"] == pytest.approx(0.0125)
    assert runs["empty"].cost_usd == 0


def test_a_position_biased_judge_gives_an_inconsistent_tie(lab: Eval, settings: Any) -> None:
    settings.REPLAYS_AGENTS["judge"]["env"]["JUDGE_MODE"] = "always-a"
    (lab.root / "agents.json").write_text(json.dumps(settings.REPLAYS_AGENTS))
    batch = lab.approve(["empty"], evaluator="judge:fair")
    [run] = finish_batch(batch)
    report = run.current_report
    assert (report.winner, report.consistent) == ("tie", False)
    verdicts = report.data["verdicts"]
    assert [v["preferred"] for v in verdicts] == [v["labels"]["A"] for v in verdicts]
    rates = json.loads(
        subprocess.run(
            [sys.executable, str(MANAGE), "evaluators", "--json"],
            env=lab.env, capture_output=True, text=True, check=True,
        ).stdout
    )["consistency"]  # fmt: skip
    assert rates == [
        {"evaluator": "judge:fair", "prompt_version": "v1", "n": 1, "agreed": 0, "rate": 0.0,
         "rate_low": 0.0, "rate_high": pytest.approx(0.7935, abs=1e-4)}
    ]  # fmt: skip


def test_an_unreadable_verdict_is_a_review_failure_that_keeps_the_runs_result(
    lab: Eval, settings: Any
) -> None:
    settings.REPLAYS_AGENTS["judge"]["env"]["JUDGE_MODE"] = "garbage"
    (lab.root / "agents.json").write_text(json.dumps(settings.REPLAYS_AGENTS))
    batch = lab.approve(["historical"], evaluator="judge:fair")
    [run] = finish_batch(batch)
    assert run.status == RunStatus.COMPLETED and run.diff  # the result is kept
    report = run.current_report
    assert report.status == ReportStatus.REVIEW_FAILED and report.winner is None
    assert "gave no usable checks" in report.reason and "not JSON" in report.reason
    assert batch.results_ready
    review = Review.objects.get()
    assert review.status == ReviewStatus.FAILED and review.audit["raw"].startswith("I think")


def test_a_judge_reporting_an_absurd_cost_is_a_review_failure_that_says_so(
    lab: Eval, settings: Any
) -> None:
    """A judge's usage file reporting a cost of 1e15 ended the judgment as an error of
    ours (`[<class 'decimal.InvalidOperation'>]`); it is the judge's, with the reason."""
    settings.REPLAYS_AGENTS["judge"]["env"]["JUDGE_COST"] = "1e15"
    (lab.root / "agents.json").write_text(json.dumps(settings.REPLAYS_AGENTS))
    batch = lab.approve(["historical"], evaluator="judge:fair")
    [run] = finish_batch(batch)
    assert run.status == RunStatus.COMPLETED and run.diff  # the result is kept
    report = run.current_report
    assert report.status == ReportStatus.REVIEW_FAILED and report.winner is None
    assert "usage.json reports a cost of 1e+15 dollars" in report.reason, report.reason


def test_tests_that_do_not_pass_historically_are_no_reference_and_judging_goes_on(
    lab: Eval,
) -> None:
    batch = lab.approve(["historical"], evaluator="judge:fair", verify_command="false")
    [run] = finish_batch(batch)
    report = run.current_report
    assert report.status == ReportStatus.JUDGED and report.winner == "tie"
    assert report.data["tests"]["usable"] is False
    assert "cannot be used as a reference" in report.data["tests"]["reason"]
    assert report.data["test_scores"] is None


def test_the_tests_evaluator_without_a_reference_fails_the_review_not_the_run(
    lab: Eval,
) -> None:
    batch = lab.approve(["historical"], evaluator="tests", verify_command="false")
    [run] = finish_batch(batch)
    assert run.status == RunStatus.COMPLETED
    report = run.current_report
    assert report.status == ReportStatus.REVIEW_FAILED
    assert "needs the verify command to pass on the historical ending" in report.reason


# --- the shared review --------------------------------------------------------------------------


def test_the_review_is_derived_once_for_many_runs_of_many_plans_at_once(
    lab: Eval, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    # No claim is lost here: with the lab's 3 s stale limit, a heartbeat delayed by a loaded
    # machine (CI's two passes and the fault suite) would look like a lost claimer's.
    monkeypatch.setenv("REPLAYS_HEARTBEAT_STALE_SECONDS", "30")
    settings.REPLAYS_HEARTBEAT_STALE_SECONDS = 30.0
    lab.env["VERIFY_SLEEP"] = "1"
    os.environ["VERIFY_SLEEP"] = "1"
    try:
        first = lab.approve(["historical", "empty"], evaluator="tests", verify_command=VERIFY)
        second = lab.approve(["historical", "empty"], evaluator="tests", verify_command=VERIFY,
                             timeout_seconds=600)  # fmt: skip
        started = supervision.dispatch_runs()
        assert len(started) == 4  # four coordinators need the review at the same moment
        runs = finish_batch(first) + finish_batch(second)
    finally:
        del os.environ["VERIFY_SLEEP"]
    review = Review.objects.get()
    assert review.status == ReviewStatus.READY
    assert {run.current_report.review_id for run in runs} == {review.pk}
    calls = lab.verify_calls()
    review_trees = [cwd for cwd in calls if "/reviews/" in cwd]
    run_trees = [cwd for cwd in calls if "/reviews/" not in cwd]
    assert len(review_trees) == 2, calls  # the baseline and the historical ending, once
    assert len(run_trees) == 4 and len(set(run_trees)) == 4


def test_a_crashed_claimer_is_taken_over_and_the_review_derived_once(lab: Eval) -> None:
    batch = lab.approve(["historical", "empty"], evaluator="tests", verify_command=VERIFY)
    # Both runs complete; their reviews are judged again by two processes.
    runs = by_model(finish_batch(batch))
    Review.objects.all().delete()
    lab.calls.unlink()
    crashed = lab.command("judge", "--run", str(runs["historical"].pk), pause_at="review_claimed")
    pid = lab.paused_pid("review_claimed")
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), seconds=5, what="the claimer to die")
    crashed.communicate(timeout=10)
    claimed = Review.objects.get()
    assert claimed.status == ReviewStatus.PENDING and f":{pid}@" in claimed.claimed_by
    taker = lab.command("judge", "--run", str(runs["empty"].pk))
    out, _ = taker.communicate(timeout=90)
    assert taker.returncode == 0, out
    review = Review.objects.get()
    assert review.status == ReviewStatus.READY and review.claimed_by != claimed.claimed_by
    assert len([cwd for cwd in lab.verify_calls() if "/reviews/" in cwd]) == 2
    # The crashed judgment is lost (reconcile says why); the other one is current.
    dispatch.reconcile_runs()
    lost = Report.objects.get(run=runs["historical"], status=ReportStatus.LOST)
    assert f"pid {pid}" in lost.reason
    assert runs["empty"].current_report.winner == "historical"


# --- re-judging -----------------------------------------------------------------------------------


def test_judging_again_from_the_command_line_keeps_the_old_report(lab: Eval) -> None:
    batch = lab.approve(["empty"], evaluator="tests", verify_command=VERIFY)
    [run] = finish_batch(batch)
    old = run.current_report
    refused = lab.command("judge", "--run", str(run.pk), "--evaluator", "judge:fair")
    out, _ = refused.communicate(timeout=30)
    assert refused.returncode != 0 and "--yes" in out  # a model costs money: it asks
    again = lab.command("judge", "--batch", str(batch.pk), "--evaluator", "judge:fair", "--yes")
    out, _ = again.communicate(timeout=90)
    assert again.returncode == 0, out
    assert "winner historical" in out
    new = Run.objects.get(pk=run.pk).current_report
    assert new.pk != old.pk and new.evaluator == "judge:fair" and new.winner == "historical"
    old.refresh_from_db()
    assert old.is_current is False and old.status == ReportStatus.JUDGED
    assert (lab.root / "runs" / f"run-{run.pk}").exists()
    assert Run.objects.get(pk=run.pk).status == RunStatus.COMPLETED  # the agent did not run


def test_judging_again_through_the_api_runs_in_its_own_process(lab: Eval) -> None:
    batch = lab.approve(["empty"], evaluator="tests", verify_command=VERIFY)
    [run] = finish_batch(batch)
    api = APIClient()
    api.force_authenticate(lab.user)
    url = f"/api/runs/{run.pk}/judge"
    refused = api.post(url, {"evaluator": "judge:fair"}, format="json")
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "approval_required"
    accepted = api.post(url, {"evaluator": "judge:fair", "approved": True}, format="json")
    assert accepted.status_code == 202, accepted.json()
    judging = accepted.json()
    assert judging["status"] == "judging" and judging["current"] is False
    busy = api.post(url, {"evaluator": "tests"}, format="json")
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "judgment_in_progress"

    def ended() -> bool:
        return Report.objects.get(pk=judging["id"]).status != ReportStatus.JUDGING

    wait_until(ended, seconds=60, what="the judgment process")
    report = api.get(f"/api/runs/{run.pk}/report").json()
    assert report["id"] == judging["id"] and report["winner"] == "historical"
    assert report["evaluator"] == "judge:fair" and report["data"]["mapping"]
    detail = api.get(f"/api/batches/{batch.pk}/").json()
    assert detail["results_ready"] is True and detail["evaluator"] == "tests"
    assert detail["runs"][0]["report"]["winner"] == "historical"


def test_a_run_that_did_not_complete_is_not_judged(lab: Eval) -> None:
    batch = lab.approve(["empty"], evaluator="tests", verify_command=VERIFY)
    run = batch.runs.get()
    api = APIClient()
    api.force_authenticate(lab.user)
    response = api.post(f"/api/runs/{run.pk}/judge", {}, format="json")
    assert response.status_code == 409 and response.json()["error"]["code"] == "not_completed"
    missing = api.get(f"/api/runs/{run.pk}/report")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "no_report"


def test_a_judgment_whose_process_died_is_lost_and_can_be_asked_for_again(lab: Eval) -> None:
    batch = lab.approve(["empty"], evaluator="tests", verify_command=VERIFY)
    [run] = finish_batch(batch)
    dying = lab.command("judge", "--run", str(run.pk), pause_at="judgment_started")
    pid = lab.paused_pid("judgment_started")
    os.kill(pid, signal.SIGKILL)
    dying.communicate(timeout=10)
    assert Report.objects.filter(run=run, status=ReportStatus.JUDGING).exists()
    report = dispatch.reconcile_runs()
    assert report.judgments_lost == 1
    lost = Report.objects.get(run=run, status=ReportStatus.LOST)
    assert "Judge the run again" in lost.reason and not lost.is_current
    assert run.current_report.status == ReportStatus.JUDGED  # the old one still stands
    again = lab.command("judge", "--run", str(run.pk))
    out, _ = again.communicate(timeout=60)
    assert again.returncode == 0, out


def test_a_lost_judgment_leaves_no_evaluator_calling_its_model(lab: Eval, settings: Any) -> None:
    """An evaluator runs in a process group of its own (a cancel or timeout stops it as a
    whole); its sandbox dies with the judging process that started it, killed with
    SIGKILL, whether it was giving a verdict or deriving the review's checks, and
    reconcile counts the judgment lost (and stops a recorded evaluator still running)."""
    batch = lab.approve(["empty"], evaluator="judge:fair")
    [run] = finish_batch(batch)
    assert Review.objects.filter(evaluator="judge:fair", status=ReviewStatus.READY).exists()
    settings.REPLAYS_AGENTS["judge"]["env"].update(JUDGE_MODE="slow", JUDGE_SLEEP="300")
    (lab.root / "agents.json").write_text(json.dumps(settings.REPLAYS_AGENTS))

    for stage in ("verdict", "checks"):
        if stage == "checks":
            Review.objects.filter(evaluator="judge:fair").delete()  # derived again, slowly
        lab.judge_calls.unlink()
        judging = lab.command("judge", "--run", str(run.pk), "--evaluator", "judge:fair", "--yes")

        def evaluator_pid() -> int:
            # The judge writes its pid in its sandbox's own numbering: found as this
            # machine numbers it, by the environment it was given.
            if not lab.judge_calls.exists():
                return 0
            pids = host_pids("JUDGE_CALLS", str(lab.judge_calls), running="judge.py")
            return pids[0] if pids else 0

        pid = wait_until(evaluator_pid, seconds=60, what=f"the {stage} evaluator to start")
        assert lab.judge_calls.read_text().startswith(stage)
        holder = Report.objects.get(run=run, status=ReportStatus.JUDGING).pid
        os.kill(holder, signal.SIGKILL)
        judging.communicate(timeout=10)
        wait_until(functools.partial(gone, pid), seconds=10, what=f"the {stage} evaluator to stop")
        assert dispatch.reconcile_runs().judgments_lost == 1


# --- the coordinator while reviewing ---------------------------------------------------------------


def test_a_coordinator_lost_while_reviewing_fails_the_run_and_keeps_its_diff(
    lab: Eval, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = lab.approve(["historical"], evaluator="tests", verify_command=VERIFY)
    monkeypatch.setenv("REPLAYS_TEST_PAUSE_AT", "judgment_started")
    monkeypatch.setenv("REPLAYS_TEST_PAUSE_FILE", str(lab.pause_file))
    supervision.dispatch_runs()
    pid = lab.paused_pid("judgment_started", seconds=60)
    run = batch.runs.get()
    assert run.phase == RunPhase.REVIEWING and run.diff and run.tree_tests  # stored first
    os.kill(pid, signal.SIGKILL)
    wait_until(lambda: gone(pid), seconds=5, what="the coordinator to die")
    dispatch.reconcile_runs()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.failure_code == FailureCode.COORDINATOR_LOST
    assert "diff --git" in run.diff
    assert Report.objects.get(run=run).status == ReportStatus.LOST


def test_cancel_while_the_runs_tree_is_tested_stops_the_tests_and_keeps_the_result(
    lab: Eval, monkeypatch: pytest.MonkeyPatch
) -> None:
    batch = lab.approve(["historical"], evaluator="tests", verify_command=VERIFY)
    monkeypatch.setenv("VERIFY_SLEEP", "60")
    supervision.dispatch_runs()
    run = batch.runs.get()
    wait_until(lambda: lab.verify_calls(), seconds=60, what="the verify command to start")
    verify_pid = host_pids("VERIFY_CALLS", str(lab.calls), running="verify.py")[0]
    run.refresh_from_db()
    assert run.phase == RunPhase.REVIEWING
    dispatch.cancel_run(run=run)
    wait_until(lambda: Run.objects.get(pk=run.pk).is_finished, seconds=15, what="the cancel")
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and "diff --git" in run.diff
    assert gone(verify_pid)
    assert not sleepers_of(lab)


def sleepers_of(lab: Eval) -> list[psutil.Process]:
    """The verify command's `sleep 60` children still alive (this test's only: another test
    run on the same machine has its own VERIFY_CALLS)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        try:
            if process.info["cmdline"] == ["sleep", "60"] and process.environ().get(
                "VERIFY_CALLS"
            ) == str(lab.calls):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_plans_name_their_evaluator_or_say_why_they_cannot(lab: Eval, settings: Any) -> None:
    def prepare(**extra: Any) -> Any:
        return planning.prepare_plan(
            owner=lab.user, raw_configuration=lab.configuration(["historical"], **extra)
        ).plan

    assert prepare(evaluator="tests", verify_command="true").evaluator == "tests"
    assert prepare().evaluator == "judge:fair"  # the first judge-capable model
    blocked = prepare(evaluator="tests")
    assert blocked.status == "blocked" and "give a verify command" in blocked.blockers[0]
    settings.REPLAYS_AGENTS = {}
    unjudged = prepare()
    assert unjudged.status == "ready_for_approval" and unjudged.evaluator == ""
    assert "will not be judged" in unjudged.warnings[0]
    with pytest.raises(planning.PlanInputError, match="Unknown evaluator"):
        prepare(evaluator="nobody:m")


def test_approval_refuses_when_the_evaluator_changed_since_prepare(
    lab: Eval, settings: Any
) -> None:
    prepared = planning.prepare_plan(
        owner=lab.user, raw_configuration=lab.configuration(["historical"])
    )
    assert prepared.plan.evaluator == "judge:fair"
    settings.REPLAYS_DEFAULT_EVALUATOR = "tests"
    with pytest.raises(approval.ApprovalError) as refused:
        approval.approve_plan(
            plan_id=prepared.plan.pk,
            user=lab.user,
            approved=True,
            prepare_token=prepared.prepare_token,
            run_config=prepared.plan.configuration,
        )
    assert refused.value.kind == ErrorKind.CONFLICT
    assert "the evaluator changed" in refused.value.message


def test_the_evaluator_list_is_tests_first(lab: Eval) -> None:
    api = APIClient()
    api.force_authenticate(lab.user)
    body = api.get("/api/evaluators/").json()
    assert body[0] == {"id": "tests", "label": "Tests only (offline, no model)", "kind": "tests",
                       "available": True, "reason": ""}  # fmt: skip
    assert body[1]["id"] == "judge:fair" and body[1]["available"] is True


def test_the_judgment_of_a_finished_batch_counts_for_results_ready(lab: Eval) -> None:
    batch = lab.approve(["historical", "empty"], evaluator="tests", verify_command=VERIFY)
    runs = finish_batch(batch)
    assert batch.results_ready
    Report.objects.filter(run=runs[0]).update(is_current=False)
    assert not batch.results_ready  # a completed run without its report waits
