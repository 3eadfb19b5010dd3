"""`manage.py replay` end to end: prepare, approve, launch and wait, with real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from replays import repos
from replays.models import Run, RunStatus
from tests.conftest import manifest_session

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def replay(
    env: dict[str, str], *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "replay", *args],
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def replay_env(process_env: dict[str, str], tmp_path: Path, user) -> dict[str, str]:
    return {
        **process_env,
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
    }


def test_replay_with_the_baselines_ends_with_both_runs_completed(
    replay_env: dict[str, str], real_threads, sample_repo: Path
) -> None:
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    result = replay(
        replay_env,
        "--thread",
        str(thread.pk),
        "--from",
        first.message_uuid,
        "--to",
        first.message_uuid,
        "--model",
        "historical",
        "--model",
        "empty",
        "--repository",
        str(sample_repo),
        "--user",
        "alice",
        "--yes",
        "--wait",
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Approved: batch" in result.stdout
    assert "historical" in result.stdout and "completed" in result.stdout
    runs = {run.model: run for run in Run.objects.all()}
    assert {run.status for run in runs.values()} == {RunStatus.COMPLETED}
    turn = manifest_session("claude-line-count")["turns"][0]
    assert runs["historical"].diff == repos.historical_diff(
        sample_repo, turn["head_before"], turn["commit_after"]
    )
    assert runs["historical"].files_changed >= 1
    assert runs["empty"].diff == ""


def test_replay_prints_the_question_and_runs_nothing(replay_env, real_threads, sample_repo) -> None:
    thread = real_threads["claude-line-count"]
    second = thread.turns.get(index=1)
    result = replay(
        replay_env,
        "--thread",
        str(thread.pk),
        "--from",
        second.message_uuid,
        "--model",
        "empty",
        "--repository",
        str(sample_repo),
        "--user",
        "alice",
        "--yes",
    )
    assert result.returncode == 1
    assert "Question:" in result.stderr and "--ending" in result.stderr
    assert "needs your input" in result.stderr
    assert Run.objects.count() == 0


def test_replay_without_yes_and_without_a_terminal_does_not_approve(
    replay_env, real_threads, sample_repo
) -> None:
    thread = real_threads["codex-gitignore"]
    result = replay(
        replay_env,
        "--thread",
        str(thread.pk),
        "--model",
        "empty",
        "--repository",
        str(sample_repo),
        "--user",
        "alice",
        "--ending",
        manifest_session("codex-gitignore")["turns"][-1]["commit_after"] or "HEAD",
    )
    assert result.returncode == 1
    assert "Pass --yes" in result.stderr
    assert Run.objects.count() == 0


def test_replay_json_reports_the_batch(replay_env, real_threads, sample_repo) -> None:
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    result = replay(
        replay_env,
        "--thread",
        str(thread.pk),
        "--from",
        first.message_uuid,
        "--model",
        "empty",
        "--repository",
        str(sample_repo),
        "--user",
        "alice",
        "--yes",
        "--wait",
        "--json",
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["finished"] is True
    assert [run["status"] for run in body["runs"]] == ["completed"]
    # Money is a number, as in the API (empty changes nothing: a known $0).
    assert body["runs"][0]["cost_usd"] == 0 and isinstance(body["runs"][0]["cost_usd"], float)


def test_a_failed_runs_reason_is_printed_whole_and_wrapped_to_the_terminal(
    replay_env, real_threads, sample_repo, tmp_path
) -> None:
    """It printed "agent_error: The agent exited with code 1:" and dropped the reason."""
    agents_file = tmp_path / "agents.json"
    words = "the model wrote a very long explanation " * 8 + "AND THE CAUSE IS HERE AT THE END"
    agents_file.write_text(
        json.dumps(
            {"failing": {"kind": "command", "models": ["any"],
                         "command": [sys.executable, "-c",
                                     f"import sys; print({words!r}); sys.exit(1)"]}}
        )
    )  # fmt: skip
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    result = replay(
        {**replay_env, "REPLAYS_AGENTS_FILE": str(agents_file), "COLUMNS": "60"},
        "--thread", str(thread.pk), "--from", first.message_uuid, "--model", "failing:any",
        "--repository", str(sample_repo), "--user", "alice", "--evaluator", "tests",
        "--verify-command", "true", "--yes", "--wait",
    )  # fmt: skip
    assert result.returncode == 1 and "did not complete" in result.stderr, result.stderr
    table, _, why = result.stdout.partition("\n\nrun ")
    assert why.startswith(f"{Run.objects.get().pk} failing:any: agent_error\n")
    reason = why.split("\n")[1:]
    assert reason[0] == "    The agent exited with code 1:"
    assert all(len(line) <= 60 for line in reason)
    assert (
        " ".join(line.strip() for line in reason)
        .strip()
        .endswith("AND THE CAUSE IS HERE AT THE END")
    )


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_while_waiting_detaches_without_cancelling(
    replay_env, real_threads, sample_repo, tmp_path
) -> None:
    agents_file = tmp_path / "agents.json"
    sleeper = Path(__file__).parent / "agent_scripts" / "sleep_tree.py"
    agents_file.write_text(
        json.dumps(
            {
                "slow": {
                    "kind": "command",
                    "command": [sys.executable, str(sleeper)],
                    "models": ["m"],
                    "env": {"PIDS_FILE": str(tmp_path / "pids")},
                }
            }
        )
    )
    env = {**replay_env, "REPLAYS_AGENTS_FILE": str(agents_file)}
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    process = subprocess.Popen(
        [
            sys.executable,
            str(MANAGE),
            "replay",
            "--thread",
            str(thread.pk),
            "--from",
            first.message_uuid,
            "--model",
            "slow:m",
            "--verify-command",
            "true",
            "--repository",
            str(sample_repo),
            "--user",
            "alice",
            "--yes",
            "--wait",
        ],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        # Ctrl-C as at a terminal: a job a script starts in the background (CI runs the
        # PostgreSQL pass so) inherits SIGINT ignored, and Python keeps an ignored SIGINT.
        preexec_fn=_default_sigint,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not Run.objects.filter(status=RunStatus.RUNNING).exists():
        time.sleep(0.2)
    assert Run.objects.filter(status=RunStatus.RUNNING).exists()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=30)
    assert "Detached" in out and "--follow" in out and "cancel_runs --batch" in out
    run = Run.objects.get()
    assert run.status == RunStatus.RUNNING and run.cancel_requested_at is None
    # Clean up: cancel it, and its coordinator stops the agent.
    subprocess.run(
        [sys.executable, str(MANAGE), "cancel_runs", "--run", str(run.pk)],
        env=env,
        check=True,
        capture_output=True,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        run.refresh_from_db()
        if run.status == RunStatus.CANCELLED:
            break
        time.sleep(0.2)
    assert run.status == RunStatus.CANCELLED
    assert os.path.exists(run.run_dir)
