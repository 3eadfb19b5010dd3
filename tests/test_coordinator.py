"""The coordinator as a real process: one run from launching to its end, with real agents.

Each test claims a run the way dispatch does (queued -> launching) and starts
`manage.py run_coordinator RUN_ID` against the test database.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from replays import processes, repos
from replays.factories.runs import make_git_repo, make_run_graph, mark_launching
from replays.models import FailureCode, Run, RunPhase, RunStatus
from tests.conftest import host_pids, is_within

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
HEARTBEAT_SECONDS = 0.5


class Setup:
    """A git repo, the agents file, and the environment for coordinator processes."""

    def __init__(self, tmp_path: Path, process_env: dict[str, str], owner: User) -> None:
        self.owner = owner
        self.repo, self.baseline, self.ending = make_git_repo(tmp_path)
        self.run_root = tmp_path / "runs"
        # The agents' marker files, in a folder their sandboxes may write.
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        self.marker = self.marks / "starts.txt"
        self.pids_file = self.marks / "pids.txt"
        edit = [
            sys.executable,
            str(SCRIPTS / "edit_files.py"),
            "--model",
            "{model}",
            "--request-file",
            "{request_file}",
        ]
        agents = {
            "scripted": {
                "kind": "command",
                "command": edit,
                "models": ["gpt-5"],
                "env": {"MARKER_FILE": str(self.marker)},
                "label": "Scripted",
            },
            "priced": {
                "kind": "command",
                "command": [*edit, "--cost", "0.42"],
                "models": ["gpt-5"],
                "env": {"MARKER_FILE": str(self.marker)},
            },
            "sloppy": {
                "kind": "command",
                "command": [*edit, "--bad-usage"],
                "models": ["gpt-5"],
                "env": {"MARKER_FILE": str(self.marker)},
            },
            "failing": {
                "kind": "command",
                "command": [sys.executable, str(SCRIPTS / "fail.py")],
                "models": ["any"],
            },
            "sleeper": {
                "kind": "command",
                "command": [sys.executable, str(SCRIPTS / "sleep_tree.py")],
                "models": ["any"],
                "env": {"PIDS_FILE": str(self.pids_file)},
            },
            "ghost": {
                "kind": "command",
                "command": ["replays-no-such-agent-cli"],
                "models": ["any"],
            },
        }
        agents_file = tmp_path / "agents.json"
        agents_file.write_text(json.dumps(agents))
        self.env = {
            **process_env,
            "REPLAYS_AGENTS_FILE": str(agents_file),
            "REPLAYS_RUN_ROOT": str(self.run_root),
            "REPLAYS_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
            "REPLAYS_TEST_SANDBOX_WRITABLE": str(self.marks),
        }

    def launching_run(self, model: str, **options: Any) -> Run:
        _, runs = make_run_graph(
            owner=self.owner,
            repo=self.repo,
            baseline=self.baseline,
            ending=self.ending,
            models=[model],
            **options,
        )
        return mark_launching(runs[0])

    def start(self, run: Run, **env: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
            env={**self.env, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def coordinate(self, run: Run, *, seconds: float = 30) -> str:
        coordinator = self.start(run)
        output, _ = coordinator.communicate(timeout=seconds)
        assert coordinator.returncode == 0, output
        run.refresh_from_db()
        return output

    def starts(self) -> list[str]:
        return self.marker.read_text().splitlines() if self.marker.exists() else []

    def agent_pids(self) -> list[int]:
        """The sleeping agent's three processes, as this machine numbers them."""
        wait_for(self.pids_file.exists, "the agent to start its children")
        pids = host_pids("PIDS_FILE", str(self.pids_file))
        assert len(pids) == 3, pids
        return pids

    def agent_processes_left(self) -> list[int]:
        return host_pids("PIDS_FILE", str(self.pids_file))


@pytest.fixture
def setup(tmp_path: Path, process_env: dict[str, str], user: User) -> Iterator[Setup]:
    made = Setup(tmp_path, process_env, user)
    yield made
    # A failed test must not leave its agent's processes sleeping.
    for pid in host_pids("PIDS_FILE", str(made.pids_file)):
        if still_running(pid):
            os.kill(pid, signal.SIGKILL)


def wait_for(condition: Callable[[], object], what: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def still_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_status(run: Run) -> str:
    run.refresh_from_db()
    return run.status


# --- baselines ---------------------------------------------------------------------------


def test_historical_baseline_reapplies_the_historical_diff(setup: Setup) -> None:
    run = setup.launching_run("historical")
    setup.coordinate(run)
    expected = repos.historical_diff(setup.repo, setup.baseline, setup.ending)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.phase == RunPhase.DONE
    assert run.diff == expected
    assert run.files_changed == 4  # app.py changed, notes.md and logo.bin added, obsolete.txt gone
    assert run.exit_code == 0 and run.cost_usd == Decimal(0) and run.total_tokens == 0
    assert run.started_at and run.finished_at and run.wall_seconds is not None
    run_dir = Path(run.run_dir)
    assert run_dir == setup.run_root / f"run-{run.pk}"
    assert (run_dir / "historical.diff").read_text() == expected
    # The worktree is gone (and forgotten by git); the folder with log and configuration stays.
    assert not Path(run.workspace_path).exists()
    assert (
        str(run.workspace_path)
        not in subprocess.run(
            ["git", "worktree", "list"], cwd=setup.repo, capture_output=True, text=True
        ).stdout
    )
    assert (run_dir / "configuration.json").exists() and (run_dir / "agent.log").exists()


def test_empty_baseline_completes_with_no_change(setup: Setup) -> None:
    run = setup.launching_run("empty")
    setup.coordinate(run)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert (run.diff, run.files_changed, run.exit_code) == ("", 0, 0)
    assert run.cost_usd == Decimal(0)


def test_a_changed_historical_result_fails_the_run_as_infrastructure(setup: Setup) -> None:
    run = setup.launching_run("historical", result_sha256="0" * 64)
    setup.coordinate(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.INFRASTRUCTURE
    assert run.failure_message == "The historical result changed since approval."
    assert run.phase == RunPhase.DONE and run.finished_at is not None
    assert not Path(run.workspace_path).exists()


# --- command agents ------------------------------------------------------------------------


def test_a_diff_over_the_limit_is_stored_cut_and_kept_whole_in_the_run_folder(
    setup: Setup,
) -> None:
    run = setup.launching_run("scripted:gpt-5")
    coordinator = setup.start(run, REPLAYS_MAX_DIFF_BYTES="200")
    output, _ = coordinator.communicate(timeout=30)
    assert coordinator.returncode == 0, output
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.files_changed == 3  # counted on the whole diff
    whole = (Path(run.run_dir) / "workspace.diff").read_text()
    assert len(whole) > 200 and run.diff == whole[:200]
    assert run.diff_cut  # a fact beside the diff, not a note inside it


def test_command_agent_completes_with_its_diff_usage_and_cost(setup: Setup) -> None:
    request = "Shorten the greeting.\n" + "Pasted log line\n" * 20_000  # a long request
    run = setup.launching_run("scripted:gpt-5", request=request)
    setup.coordinate(run)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.files_changed == 3
    assert '+    return "Hi " + name' in run.diff
    assert "CHANGES.md" in run.diff and "deleted file mode" in run.diff
    assert (run.input_tokens, run.output_tokens, run.cache_read_tokens) == (1000, 200, 500)
    assert run.cost_usd == Decimal("0.003313")  # 0.0033125 from the price table, rounded
    assert run.model_seconds == 1.5 and run.exit_code == 0
    assert "Edited app.py" in run.log_tail

    # Started once, in the workspace, with the run id in its environment.
    workspace = Path(run.workspace_path)
    assert setup.starts() == [f"{run.pk} gpt-5 {workspace}"]

    run_dir = Path(run.run_dir)
    request_file = run_dir / "request.md"
    assert stat.S_IMODE(request_file.stat().st_mode) == 0o600
    assert request_file.read_text() == request
    configuration_file = run_dir / "configuration.json"
    assert stat.S_IMODE(configuration_file.stat().st_mode) == 0o600
    assert json.loads(configuration_file.read_text()) == {**run.configuration, "run_id": run.pk}
    assert not workspace.exists()


def test_a_cost_the_agent_reports_is_kept(setup: Setup) -> None:
    run = setup.launching_run("priced:gpt-5")
    setup.coordinate(run)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.cost_usd == Decimal("0.42")


def test_a_malformed_usage_file_is_noted_in_the_log_not_a_failure(setup: Setup) -> None:
    run = setup.launching_run("sloppy:gpt-5")
    setup.coordinate(run)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.cost_usd is None and run.total_tokens == 0
    assert "[replays] The usage file usage.json was ignored" in run.log_tail
    assert run.files_changed == 3


def test_a_failing_agent_fails_the_run_with_its_own_words_as_plain_text(setup: Setup) -> None:
    run = setup.launching_run("failing:any")
    setup.coordinate(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.AGENT_ERROR
    assert run.exit_code == 3
    words = 'Error: the model refused <script>alert("x")</script> & <b>stopped</b>'
    assert run.failure_message.startswith("The agent exited with code 3:")
    assert words in run.failure_message
    # Stored as the agent wrote it; pages escape it when they render it.
    assert words in run.log_tail and "&lt;" not in run.log_tail
    assert "Working on it..." in run.log_tail


def test_an_agent_whose_program_is_missing_fails_as_a_setup_problem(setup: Setup) -> None:
    """Not the model's failure, not ours: the user's setup, said with the fix."""
    run = setup.launching_run("ghost:any")
    setup.coordinate(run)
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.SETUP
    assert run.failure_message.startswith("Setup problem (the agent's program cannot start)")
    assert "'replays-no-such-agent-cli' was not found on PATH" in run.failure_message
    assert "Fix: Install it" in run.failure_message


# --- stopping agents -------------------------------------------------------------------------


def test_a_timeout_kills_the_whole_agent_tree(setup: Setup) -> None:
    run = setup.launching_run("sleeper:any", timeout_seconds=2)
    started = time.monotonic()
    setup.coordinate(run)
    assert time.monotonic() - started < 20  # a 2 s timeout, not the 60 s default
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.TIMEOUT
    assert run.failure_message == "The agent did not finish within 2s."
    assert "Started a child and a grandchild" in run.log_tail
    # It had started its three processes; none is left.
    assert setup.pids_file.exists() and setup.agent_processes_left() == []


def test_cancel_while_running_stops_the_agent_tree_within_a_heartbeat(setup: Setup) -> None:
    run = setup.launching_run("sleeper:any")
    coordinator = setup.start(run)
    try:
        pids = setup.agent_pids()
        wait_for(
            lambda: "Started a child" in (Run.objects.get(pk=run.pk).log_tail or ""),
            "a heartbeat with the agent's log",
        )
        assert run_status(run) == RunStatus.RUNNING
        assert is_within(pids[0], run.agent_pid) and run.phase == RunPhase.IMPLEMENTING
        asked = time.monotonic()
        Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now())
        coordinator.wait(timeout=10)
        # Noticed at the next heartbeat; the rest is the kill's grace and the final writes,
        # slower on a loaded machine. Without the heartbeat check it would run to its timeout.
        assert time.monotonic() - asked < 2 * HEARTBEAT_SECONDS + 5
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert (run.phase, run.failure_code) == (RunPhase.DONE, "")
    assert run.finished_at is not None
    assert "Started a child and a grandchild" in run.log_tail  # the partial log is kept
    assert (Path(run.run_dir) / "agent.log").exists()
    assert not any(still_running(pid) for pid in pids)
    assert not Path(run.workspace_path).exists()


def test_a_run_failed_elsewhere_while_running_makes_the_coordinator_stop(setup: Setup) -> None:
    run = setup.launching_run("sleeper:any")
    coordinator = setup.start(run)
    try:
        pids = setup.agent_pids()
        wait_for(lambda: Run.objects.get(pk=run.pk).agent_pid, "the agent pid")
        # What reconcile writes when it believes the coordinator is lost.
        Run.objects.filter(pk=run.pk, status=RunStatus.RUNNING).update(
            status=RunStatus.FAILED,
            failure_code=FailureCode.COORDINATOR_LOST,
            failure_message="Lost.",
            finished_at=timezone.now(),
            phase=RunPhase.DONE,
        )
        coordinator.wait(timeout=10)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    run.refresh_from_db()
    assert (run.status, run.failure_code, run.failure_message) == (
        RunStatus.FAILED,
        FailureCode.COORDINATOR_LOST,
        "Lost.",
    )
    assert not any(still_running(pid) for pid in pids)


def test_a_coordinator_killed_while_the_agent_runs_has_recorded_the_agent_and_takes_it_along(
    setup: Setup,
) -> None:
    run = setup.launching_run("sleeper:any")
    pause_file = setup.run_root.parent / "paused.txt"
    coordinator = setup.start(
        run,
        REPLAYS_TEST_PAUSE_AT="coordinator_agent_running",
        REPLAYS_TEST_PAUSE_FILE=str(pause_file),
    )
    try:
        wait_for(pause_file.exists, "the coordinator to reach the pause point")
        pids = setup.agent_pids()
        run.refresh_from_db()
        assert is_within(pids[0], run.agent_pid)  # recorded: a reconcile could kill it
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=10)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING  # until a reconcile counts it lost
    # The sandbox dies with its coordinator: nothing is left for anyone to find.
    wait_for(lambda: not any(still_running(pid) for pid in pids), "the agent to end with it")
    assert not processes.is_alive(run.agent_pid, run.agent_pid_create_time)


# --- starting at most once ------------------------------------------------------------------


def test_a_member_starts_at_most_once_however_many_coordinators_race(setup: Setup) -> None:
    run = setup.launching_run("scripted:gpt-5")
    first, second = setup.start(run), setup.start(run)
    outputs = [first.communicate(timeout=30)[0], second.communicate(timeout=30)[0]]
    assert first.returncode == second.returncode == 0, outputs
    assert sorted("not started" in output for output in outputs) == [False, True], outputs
    assert len(setup.starts()) == 1
    assert run_status(run) == RunStatus.COMPLETED
    finished_at = run.finished_at

    assert "not started" in setup.coordinate(run)
    assert len(setup.starts()) == 1
    assert (run.status, run.finished_at) == (RunStatus.COMPLETED, finished_at)


def test_a_run_that_is_not_launching_is_not_started(setup: Setup) -> None:
    _, runs = make_run_graph(
        owner=setup.owner,
        repo=setup.repo,
        baseline=setup.baseline,
        ending=setup.ending,
        models=["scripted:gpt-5"],
    )
    queued = runs[0]
    assert "not started" in setup.coordinate(queued)
    assert (queued.status, queued.phase, queued.pid) == (RunStatus.QUEUED, RunPhase.QUEUED, None)
    assert setup.starts() == []
    assert not (setup.run_root / f"run-{queued.pk}").exists()


def test_a_run_cancelled_while_launching_is_cancelled_and_never_started(setup: Setup) -> None:
    run = setup.launching_run("scripted:gpt-5")
    Run.objects.filter(pk=run.pk).update(cancel_requested_at=timezone.now() - timedelta(seconds=1))
    assert "cancelled before start" in setup.coordinate(run)
    assert (run.status, run.phase) == (RunStatus.CANCELLED, RunPhase.DONE)
    assert run.finished_at is not None and run.started_at is None
    assert setup.starts() == []


def test_a_stopped_coordinator_stops_its_agent_and_fails_the_run(setup: Setup) -> None:
    run = setup.launching_run("sleeper:any")
    coordinator = setup.start(run)
    try:
        pids = setup.agent_pids()
        coordinator.send_signal(signal.SIGTERM)
        coordinator.wait(timeout=10)
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED
    assert run.failure_code == FailureCode.INFRASTRUCTURE
    assert run.failure_message.startswith("The coordinator was stopped (SIGTERM)")
    assert not any(still_running(pid) for pid in pids)
    assert not Path(run.workspace_path).exists()


def test_slow_git_work_keeps_the_heartbeat_going(setup: Setup, settings: Any) -> None:
    from replays.coordinator.rows import heartbeat_in_background as _heartbeat_in_background

    settings.REPLAYS_HEARTBEAT_SECONDS = 0.1
    run = setup.launching_run("empty")
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, heartbeat_at=None)
    with _heartbeat_in_background(run.pk):
        wait_for(lambda: Run.objects.get(pk=run.pk).heartbeat_at, "a background heartbeat", 5)
    # A run that is no longer running gets no heartbeat.
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.CANCELLED, finished_at=timezone.now(), heartbeat_at=None
    )
    with _heartbeat_in_background(run.pk):
        time.sleep(0.35)
    assert Run.objects.get(pk=run.pk).heartbeat_at is None
