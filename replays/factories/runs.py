"""Build a Thread -> Plan -> Batch -> Run graph directly in the database, and a small git repo.

For tests of dispatch and the coordinator, which start where approval ends: runs
that are queued with a full, approved Run.configuration. Plain functions, no
fixtures, so any test module can import them.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import subprocess
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.utils import timezone

from replays.approval import configuration_columns
from replays.evaluation.checks import DEFAULT_TEST_PATHS
from replays.models import Batch, Plan, PlanStatus, Run, RunStatus, SourceKind, Thread, Turn
from replays.runspec import RunSpec

DEFAULT_REQUEST = "Make the greeting friendlier, add notes, and remove the obsolete file."

# Commits made by these helpers never depend on the machine's git configuration.
_GIT_ENV = {
    "GIT_AUTHOR_NAME": "Replays Tests",
    "GIT_AUTHOR_EMAIL": "tests@replays.invalid",
    "GIT_COMMITTER_NAME": "Replays Tests",
    "GIT_COMMITTER_EMAIL": "tests@replays.invalid",
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(repo: Path, *args: str) -> str:
    """Run git in `repo` and return its stdout (raises CalledProcessError on failure)."""
    completed = subprocess.run(
        ["git", "-c", "init.defaultBranch=main", "-c", "commit.gpgsign=false", *args],
        cwd=repo,
        env={**os.environ, **_GIT_ENV},
        capture_output=True,
        text=True,
        check=True,
    )
    return completed.stdout


def make_git_repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repo with a baseline commit and an ending commit after it.

    The ending changes app.py, adds notes.md and a small binary file, and deletes obsolete.txt.
    Returns (repo, baseline, ending) with full commit ids.
    """
    repo = tmp_path / "project"
    repo.mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "README.md").write_text("# Project\n\nA tiny project for replay tests.\n")
    (repo / "app.py").write_text('def greet(name):\n    return "Hello " + name\n')
    (repo / "obsolete.txt").write_text("This file is no longer needed.\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Baseline")
    baseline = git(repo, "rev-parse", "HEAD").strip()

    (repo / "app.py").write_text(
        'def greet(name):\n    return f"Hello, {name}! Nice to see you."\n'
    )
    (repo / "notes.md").write_text("# Notes\n\nThe greeting is friendlier now.\n")
    (repo / "logo.bin").write_bytes(bytes(range(256)) * 2)
    (repo / "obsolete.txt").unlink()
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "Ending")
    ending = git(repo, "rev-parse", "HEAD").strip()
    return repo, baseline, ending


def historical_result_sha256(repo: Path, baseline: str, ending: str) -> str:
    """The sha256 that approval records for the historical diff (as replays.repos computes it)."""
    from replays import repos

    return repos.sha256_text(repos.historical_diff(repo, baseline, ending))


def _sha256_json(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def make_run_graph(
    *,
    owner: User,
    repo: Path,
    baseline: str,
    ending: str,
    models: list[str],
    timeout_seconds: int = 60,
    request: str = DEFAULT_REQUEST,
    verify_command: str | None = None,
    result_sha256: str | None = None,
    evaluator: str = "",
) -> tuple[Batch, list[Run]]:
    """A thread with one turn, a ready plan, its batch and one queued Run per model.

    Each run's configuration has every key approval writes (see the coordinator).
    `result_sha256` overrides the historical result's sha256 (default: computed from git).
    """
    now = timezone.now()
    suffix = secrets.token_hex(6)
    thread = Thread.objects.create(
        owner=owner,
        source_kind=SourceKind.CLAUDE_CODE,
        session_id=f"session-{suffix}",
        title=f"Replay test thread {suffix}",
        cwd=str(repo),
        git_branch="main",
        started_at=now - timedelta(hours=1),
        ended_at=now - timedelta(minutes=30),
        source_path=f"/tmp/replays-tests/{suffix}.jsonl",
        source_sha256=hashlib.sha256(suffix.encode()).hexdigest(),
        source_size=1000,
        turn_count=1,
        models_used=["claude-sonnet-4-5"],
    )
    turn = Turn.objects.create(
        thread=thread,
        index=0,
        message_uuid=f"uuid-{suffix}",
        timestamp=now - timedelta(hours=1),
        request=request,
        models_used=["claude-sonnet-4-5"],
    )
    if result_sha256 is None:
        result_sha256 = historical_result_sha256(repo, baseline, ending)
    # The same shape replays.planning.normalise_configuration produces.
    plan_configuration = {
        "configurations": [
            {
                "thread_id": thread.pk,
                "start_message_uuid": turn.message_uuid,
                "end_message_uuid": turn.message_uuid,
                "request": None,
                "repository": str(repo),
                "baseline_commit": baseline,
                "ending_commit": ending,
                "thread_title": None,
            }
        ],
        "models": list(models),
        "timeout_seconds": timeout_seconds,
        "verify_command": verify_command,
        "evaluator": evaluator or None,
        "test_paths": None,
    }
    plan = Plan.objects.create(
        owner=owner,
        configuration=plan_configuration,
        fingerprint=_sha256_json(plan_configuration),
        status=PlanStatus.READY_FOR_APPROVAL,
        approval_prompt=f"Approve 1 thread using {len(models)} models?",
        token_hash=hashlib.sha256(secrets.token_bytes(32)).hexdigest(),
        created_at=now,
        expires_at=now + timedelta(minutes=5),
    )
    batch = Batch.objects.create(
        plan=plan,
        owner=owner,
        models_list=list(models),
        configuration=plan_configuration,
        thread_count=1,
        evaluator=evaluator,
        approved_at=now,
    )
    runs = []
    for model in models:
        configuration: dict[str, Any] = {
            "plan_id": plan.pk,
            "batch_id": batch.pk,
            "thread_id": thread.pk,
            "thread_title": thread.title,
            "model": model,
            "repository": str(repo),
            "baseline_commit": baseline,
            "ending_commit": ending,
            "historical_result_sha256": result_sha256,
            "start_message_uuid": turn.message_uuid,
            "end_message_uuid": turn.message_uuid,
            "request": request,
            "timeout_seconds": timeout_seconds,
            "verify_command": verify_command,
            "test_paths": list(DEFAULT_TEST_PATHS),
            "evaluator": evaluator,
            "context": "cold",
        }
        configuration["prepared_configuration_sha256"] = _sha256_json(configuration)
        runs.append(
            Run.objects.create(
                batch=batch,
                thread=thread,
                model=model,
                status=RunStatus.QUEUED,
                configuration=configuration,
                **configuration_columns(RunSpec.from_json(configuration)),
                created_at=now,
            )
        )
    return batch, runs


def mark_launching(run: Run, *, host: str = "", launcher: str = "tests") -> Run:
    """Claim a queued run the way dispatch does (queued -> launching), for coordinator tests."""
    from django.conf import settings

    changed = Run.objects.filter(pk=run.pk, status=RunStatus.QUEUED).update(
        status=RunStatus.LAUNCHING,
        host=host or settings.REPLAYS_HOST_NAME,
        launcher=launcher,
        claimed_at=timezone.now(),
    )
    assert changed == 1, f"run {run.pk} was not queued"
    run.refresh_from_db()
    return run
