"""Repositories are opened only under REPLAYS_REPOSITORY_ROOTS: at prepare, at approval and
in the coordinator, symlinks followed first, with one message that says nothing about
whether a path outside exists."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import approval, coordinator, planning
from replays.errors import ErrorKind
from replays.factories.runs import make_git_repo, make_run_graph, mark_launching
from replays.models import FailureCode, Run, RunStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def roots(tmp_path: Path, settings: Any) -> Path:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    settings.REPLAYS_REPOSITORY_ROOTS = [allowed]
    return allowed


def prepare(user: User, thread: Any, repository: str, **commits: str) -> Any:
    return planning.prepare_plan(
        owner=user,
        raw_configuration={
            "configurations": [{"thread_id": thread.pk, "repository": repository, **commits}],
            "models": ["historical"],
        },
    )


def test_a_repository_outside_the_roots_is_refused_without_saying_whether_it_exists(
    roots: Path, tmp_path: Path, user: User, make_thread: Any
) -> None:
    outside, _, _ = make_git_repo(tmp_path / "elsewhere")  # a real checkout the server can read
    thread = make_thread()
    real = prepare(user, thread, str(outside)).plan
    missing = prepare(user, thread, str(tmp_path / "no-such-folder")).plan
    assert real.status == missing.status == "blocked"
    words = [blocker.replace(str(outside), "P") for blocker in real.blockers]
    assert words == [b.replace(str(tmp_path / "no-such-folder"), "P") for b in missing.blockers]
    assert "REPLAYS_REPOSITORY_ROOTS" in words[0] and "not a git repository" not in words[0]


def test_a_link_under_a_root_that_points_outside_is_outside(
    roots: Path, tmp_path: Path, user: User, make_thread: Any
) -> None:
    outside, _, _ = make_git_repo(tmp_path / "elsewhere")
    os.symlink(outside, roots / "looks-inside")
    plan = prepare(user, make_thread(), str(roots / "looks-inside")).plan
    assert plan.status == "blocked" and "REPLAYS_REPOSITORY_ROOTS" in plan.blockers[0]


def test_a_repository_under_a_root_is_used(roots: Path, user: User, make_thread: Any) -> None:
    inside, _, _ = make_git_repo(roots)
    plan = prepare(user, make_thread(cwd=str(inside)), str(inside)).plan
    assert not [b for b in plan.blockers if "REPLAYS_REPOSITORY_ROOTS" in b]
    assert plan.preparations[0]["repository"] == str(inside.resolve())


def test_a_threads_folder_outside_the_roots_asks_for_a_clone(
    roots: Path, tmp_path: Path, user: User, make_thread: Any
) -> None:
    outside, _, _ = make_git_repo(tmp_path / "elsewhere")
    plan = planning.prepare_plan(
        owner=user,
        raw_configuration={
            "configurations": [{"thread_id": make_thread(cwd=str(outside)).pk}],
            "models": ["historical"],
        },
    ).plan
    assert plan.status == "needs_user_input"
    assert plan.questions[0]["field"] == "repository"


def test_approval_refuses_when_the_repository_left_the_roots(
    roots: Path, tmp_path: Path, user: User, make_thread: Any, settings: Any
) -> None:
    inside, baseline, ending = make_git_repo(roots)
    prepared = prepare(
        user,
        make_thread(cwd=str(inside)),
        str(inside),
        baseline_commit=baseline,
        ending_commit=ending,
    )
    plan = prepared.plan
    assert plan.status == "ready_for_approval", plan.blockers + plan.questions
    settings.REPLAYS_REPOSITORY_ROOTS = [tmp_path / "somewhere-else"]
    with pytest.raises(approval.ApprovalError) as refused:
        approval.approve_plan(
            plan_id=plan.pk,
            user=user,
            approved=True,
            prepare_token=prepared.prepare_token,
            run_config=plan.configuration,
        )
    assert refused.value.kind == ErrorKind.CONFLICT


def test_the_coordinator_refuses_a_repository_outside_the_roots(
    transactional_db: None, roots: Path, tmp_path: Path, user: User, settings: Any
) -> None:
    outside, baseline, ending = make_git_repo(tmp_path / "elsewhere")
    _, [run] = make_run_graph(
        owner=user, repo=outside, baseline=baseline, ending=ending, models=["historical"]
    )
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    mark_launching(run)
    coordinator.run_member(run_id=run.pk)
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.FAILED and run.failure_code == FailureCode.INFRASTRUCTURE
    assert "REPLAYS_REPOSITORY_ROOTS" in run.failure_message and run.diff == ""
