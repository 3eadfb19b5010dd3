"""The worktree is hostile ground: nothing an agent writes there decides what our own
processes run. The attack: rewrite the worktree's `.git` file to point at a git dir of the
agent's own whose `core.fsmonitor` is a program; our `git add -A` would run it, with our
whole environment. Also: filters the repository defines, and run folders that are links."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest

from replays import repos, runfolder
from replays.factories.runs import git, make_git_repo, make_run_graph, mark_launching
from replays.models import Run, RunStatus

PAYLOAD = """#!/bin/sh
env > "{marker}"
exit 1
"""


def plant_fsmonitor(worktree: Path, tmp_path: Path) -> Path:
    """What a malicious agent does inside its worktree; the marker file its program writes."""
    marker = tmp_path / "PWNED"
    program = tmp_path / "fsmonitor.sh"
    program.write_text(PAYLOAD.format(marker=marker))
    program.chmod(program.stat().st_mode | stat.S_IXUSR)
    evil = tmp_path / "evil"
    git(tmp_path, "init", "-q", str(evil))
    git(evil, "config", "core.fsmonitor", str(program))
    (worktree / ".git").write_text(f"gitdir: {evil / '.git'}\n")
    return marker


def test_collecting_a_diff_never_runs_a_program_the_worktree_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgres://replays:secret@db/replays")
    repo, baseline, _ = make_git_repo(tmp_path)
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, baseline)
    (worktree / "app.py").write_text("print('the agent was here')\n")
    marker = plant_fsmonitor(worktree, tmp_path)
    diff = repos.workspace_diff(repo, worktree, baseline)
    assert not marker.exists(), marker.read_text()
    # The agent's work is still collected, from the worktree's real git dir.
    assert repos.changed_files(diff) == ["app.py"] and "the agent was here" in diff
    assert ".git" not in repos.changed_files(diff)


def test_filters_the_repository_defines_do_not_run_on_an_agents_tree(
    tmp_path: Path,
) -> None:
    repo, baseline, _ = make_git_repo(tmp_path)
    marker = tmp_path / "FILTERED"
    git(repo, "config", "filter.sneaky.clean", f"sh -c 'touch {marker}; cat'")
    worktree = tmp_path / "wt"
    repos.add_worktree(repo, worktree, baseline)
    # The agent names the filter for every file it wrote.
    (worktree / ".gitattributes").write_text("* filter=sneaky\n")
    (worktree / "new.txt").write_text("new\n")
    diff = repos.workspace_diff(repo, worktree, baseline)
    assert not marker.exists()
    assert set(repos.changed_files(diff)) == {".gitattributes", "new.txt"}


def test_a_worktree_that_is_not_the_repositorys_is_refused(tmp_path: Path) -> None:
    repo, baseline, _ = make_git_repo(tmp_path)
    other = tmp_path / "elsewhere"
    other.mkdir()
    with pytest.raises(repos.GitError, match="is not a worktree of"):
        repos.workspace_diff(repo, other, baseline)


AGENT = """
import pathlib, stat, subprocess, sys
tmp = pathlib.Path(sys.argv[1])
program = tmp / "fsmonitor.sh"
program.write_text('#!/bin/sh\\nenv > "%s"\\nexit 1\\n' % (tmp / "PWNED"))
program.chmod(0o755)
subprocess.run(["git", "init", "-q", str(tmp / "evil")], check=True)
subprocess.run(["git", "-C", str(tmp / "evil"), "config", "core.fsmonitor", str(program)], check=True)
pathlib.Path("app.py").write_text("print('edited')\\n")
pathlib.Path(".git").write_text("gitdir: %s\\n" % (tmp / "evil" / ".git"))
"""


def test_an_agent_that_plants_the_attack_gets_nothing_run_by_the_coordinator(
    process_env: dict[str, str], tmp_path: Path, user: Any, settings: Any
) -> None:
    """The attack end to end, by a real `command` agent in a real coordinator process."""
    import subprocess

    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps({"evil": {
        "kind": "command", "models": ["m"],
        "command": [sys.executable, "-c", AGENT, str(tmp_path)],
    }}))  # fmt: skip
    repo, baseline, ending = make_git_repo(tmp_path)
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["evil:m"]
    )
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    mark_launching(run)
    env = {**process_env, "REPLAYS_AGENTS_FILE": str(agents_file),
           "REPLAYS_RUN_ROOT": str(tmp_path / "runs"), "SECRET_KEY": "do-not-leak"}  # fmt: skip
    manage = Path(__file__).resolve().parent.parent / "manage.py"
    done = subprocess.run(
        [sys.executable, str(manage), "run_coordinator", str(run.pk)],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert not (tmp_path / "PWNED").exists(), (tmp_path / "PWNED").read_text()
    assert repos.changed_files(run.diff) == ["app.py"]


def test_a_run_folder_that_is_a_link_is_refused(tmp_path: Path, settings: Any) -> None:
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    (tmp_path / "runs").mkdir()
    target = tmp_path / "somewhere-else"
    target.mkdir()
    os.symlink(target, tmp_path / "runs" / "run-7")
    with pytest.raises(runfolder.UnsafeRunFolder, match="is a link"):
        runfolder.create_run_folder(7)
    assert list(target.iterdir()) == []
    fresh = runfolder.create_run_folder(8)
    assert fresh.is_dir() and not fresh.is_symlink() and stat.S_IMODE(fresh.stat().st_mode) == 0o700
