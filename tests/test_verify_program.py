"""A relative program in a verify command is taken from where the user typed it: the
command line's working folder, or the plan's repository for the API and the pages; never
looked up in the run's worktree, where `.venv/bin/python` named nothing ("cannot start:
No such file or directory" for the README's own example)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

from replays import planning
from replays.factories.runs import make_git_repo


def executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def test_the_command_line_takes_a_relative_program_from_its_working_folder(
    tmp_path: Path,
) -> None:
    program = executable(tmp_path / ".venv" / "bin" / "python")
    command = planning.verify_command_from(
        ".venv/bin/python -m pytest -q --junitxml={junit_xml}", base=tmp_path
    )
    assert shlex.split(command) == [str(program), "-m", "pytest", "-q", "--junitxml={junit_xml}"]
    # A bare name is found on PATH when it runs, an absolute path is kept.
    assert planning.verify_command_from("pytest -q", base=tmp_path) == "pytest -q"
    absolute = f"{sys.executable} -m pytest"
    assert planning.verify_command_from(absolute, base=tmp_path) == absolute


def test_a_relative_program_that_is_not_there_is_refused_with_where_it_looked(
    tmp_path: Path,
) -> None:
    with pytest.raises(planning.PlanInputError) as refused:
        planning.verify_command_from("bin/nothing -q", base=tmp_path)
    assert refused.value.code == "verify_program_missing"
    assert f"is not an executable file in {tmp_path} ({tmp_path / 'bin' / 'nothing'})" in (
        refused.value.message
    )


@pytest.mark.django_db
def test_the_api_takes_it_from_the_plans_repository(
    api_client: Any, make_thread: Any, user: Any, tmp_path: Path
) -> None:
    repo, _, _ = make_git_repo(tmp_path)
    program = executable(repo / ".venv" / "bin" / "python")
    thread = make_thread(owner=user, cwd=str(repo))
    body = {
        "configurations": [{"thread_id": thread.pk, "repository": str(repo)}],
        "models": ["historical"],
        "evaluator": "tests",
        "verify_command": ".venv/bin/python -m pytest",
    }
    response = api_client.post("/api/plans/", body, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["run_config"]["verify_command"] == f"{program} -m pytest"


@pytest.mark.django_db
def test_the_api_refuses_a_relative_program_without_a_repository(
    api_client: Any, make_thread: Any, user: Any
) -> None:
    thread = make_thread(owner=user)
    body = {
        "configurations": [{"thread_id": thread.pk}],
        "models": ["historical"],
        "verify_command": "./run-tests.sh",
    }
    response = api_client.post("/api/plans/", body, format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "verify_program_relative"
    assert "names no repository" in error["message"]
