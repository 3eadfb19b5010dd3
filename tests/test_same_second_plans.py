"""Prepare on real transcripts whose commits fall in the same second as a request, whose
work was never committed, or which started from uncommitted changes
(tests/fixtures/transcripts/same-second, made by generate_same_second.py with the real
CLIs): the baseline and the ending come from the transcript's evidence, and a result no
commit holds is rebuilt from the agent's own edits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import approval, planning, repos
from replays.models import PlanStatus, Run, RunStatus, Thread, Turn
from tests.conftest import FIXTURES

pytestmark = pytest.mark.django_db

SAME_SECOND = FIXTURES / "transcripts" / "same-second"
MANIFEST = json.loads((SAME_SECOND / "manifest.json").read_text())
MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
WAVE = (
    '\n\ndef wave(name: str) -> str:\n    """Wave at someone."""\n    return f"*waves at {name}*"\n'
)


def session(name: str) -> dict[str, Any]:
    return next(s for s in MANIFEST["sessions"] if s["name"] == name)


def commits(name: str) -> list[str]:
    return [c["commit"] for c in session(name)["commits"]]


@pytest.fixture
def notes_repo(tmp_path: Path) -> Path:
    """A clone of the repository the sessions worked in, its branches local."""
    repo = tmp_path / "notes"
    subprocess.run(["git", "clone", "-q", str(SAME_SECOND / "repo.bundle"), str(repo)], check=True)
    for branch in ("claude", "codex"):
        subprocess.run(["git", "-C", str(repo), "branch", "-q", "-f", branch, f"origin/{branch}"],
                       check=True)  # fmt: skip
    return repo


@pytest.fixture
def threads(user: User) -> dict[str, Thread]:
    from replays import importing

    found = {}
    for entry in MANIFEST["sessions"]:
        result = importing.import_transcript_file(path=SAME_SECOND / entry["path"], user=user)
        assert result.thread is not None, result.error
        found[entry["name"]] = result.thread
    return found


def configuration(
    thread: Thread, repo: Path, first: int | None = None, last: int | None = None, **answers: str
) -> dict[str, Any]:
    item: dict[str, Any] = {"thread_id": thread.pk, "repository": str(repo), **answers}
    if first is not None:
        item["start_message_uuid"] = thread.turns.get(index=first).message_uuid
        item["end_message_uuid"] = thread.turns.get(index=last if last is not None else first).message_uuid  # fmt: skip
    return {"configurations": [item], "models": ["historical"], "evaluator": None}


def prepare(user: User, config: dict[str, Any]) -> planning.PreparedPlan:
    return planning.prepare_plan(owner=user, raw_configuration=config)


@pytest.fixture(params=["claude-same-second", "codex-same-second"])
def same_second(request: Any, threads: dict[str, Thread]) -> tuple[str, Thread]:
    """Each tool's same-second session: (its manifest name, its thread)."""
    return request.param, threads[request.param]


def ready(user: User, config: dict[str, Any]) -> dict[str, Any]:
    """The preparation of a plan that must be ready for approval."""
    plan = prepare(user, config).plan
    assert plan.status == PlanStatus.READY_FOR_APPROVAL, (plan.blockers, plan.questions)
    [prep] = plan.preparations
    return prep


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          check=True).stdout  # fmt: skip


def test_the_first_request_does_not_start_from_its_own_commit(
    user: User, notes_repo: Path, same_second: tuple[str, Thread]
) -> None:
    name, thread = same_second
    first_commit, _ = commits(name)
    request = thread.turns.get(index=0).timestamp
    # The agent committed within the second of its request: the clock cannot tell.
    clock = repos.resolve_baseline(notes_repo, branch=thread.git_branch, before=request)
    assert clock.question is not None
    assert first_commit in [c.sha for c in clock.question.choices]
    prep = ready(user, configuration(thread, notes_repo, 0))
    assert prep["baseline_commit"] == session(name)["started_from"]
    assert prep["ending_commit"] == first_commit
    assert prep["rebuilt"] == {}


def test_a_later_request_gets_the_commit_made_in_the_second_before_it(
    user: User, notes_repo: Path, same_second: tuple[str, Thread]
) -> None:
    name, thread = same_second
    first_commit, second_commit = commits(name)
    # Request 2's agent committed as its last tool call and request 3 came at once.
    following = thread.turns.get(index=2).timestamp
    assert int(repos.commit_info(notes_repo, second_commit).committed_at.timestamp()) == int(
        following.timestamp()
    )
    prep = ready(user, configuration(thread, notes_repo, 1))
    assert (prep["baseline_commit"], prep["ending_commit"]) == (first_commit, second_commit)


def test_an_uncommitted_ending_is_rebuilt_from_the_edits_the_same_way_every_time(
    user: User, notes_repo: Path, same_second: tuple[str, Thread], settings: Any
) -> None:
    name, thread = same_second
    _, second_commit = commits(name)
    refs_before = git(notes_repo, "for-each-ref")
    objects_before = git(notes_repo, "count-objects", "-v")
    prep = ready(user, configuration(thread, notes_repo, 2))
    # Its baseline is the commit made in the same second as the request, before it.
    assert prep["baseline_commit"] == second_commit
    rebuilt = prep["rebuilt"]["ending"]
    assert prep["ending_commit"] == rebuilt["commit"]
    assert rebuilt["base"] == second_commit
    assert rebuilt["files"] == ["greet/farewell.py"] and rebuilt["edits"] == 1
    assert rebuilt["unsure"] == []
    # In a repository Replays owns under the var folder, which the runs check out from.
    repository = Path(prep["repository"])
    assert repository.parent == Path(settings.REPLAYS_VAR_DIR) / "rebuilt"
    assert rebuilt["repository"] == prep["repository"]
    before = repos.file_at(notes_repo, second_commit, "greet/farewell.py")
    after = repos.file_at(repository, rebuilt["commit"], "greet/farewell.py")
    assert after == before + WAVE.encode()
    diff = repos.historical_diff(repository, second_commit, rebuilt["commit"])
    assert prep["historical_result_sha256"] == repos.sha256_text(diff)
    # Deterministic: the same transcript gives the same commit.
    again = prepare(user, configuration(thread, notes_repo, 2)).plan
    assert again.preparations[0]["ending_commit"] == rebuilt["commit"]
    # The user's repository was only read.
    assert git(notes_repo, "for-each-ref") == refs_before
    assert git(notes_repo, "count-objects", "-v") == objects_before
    assert repos.resolve_commit(notes_repo, rebuilt["commit"]) is None


def test_a_whole_thread_plan_starts_where_the_agent_started(
    user: User, notes_repo: Path, same_second: tuple[str, Thread]
) -> None:
    name, thread = same_second
    prep = ready(user, configuration(thread, notes_repo))
    # By the clock alone the first request's own commit would have been the baseline.
    assert prep["baseline_commit"] == session(name)["started_from"]
    # Requests 3 and 4 were never committed: the thread's result is rebuilt from every edit.
    rebuilt = prep["rebuilt"]["ending"]
    assert rebuilt["base"] == session(name)["started_from"]
    content = repos.file_at(Path(prep["repository"]), prep["ending_commit"], "greet/farewell.py")
    assert b"def goodbye(name: str, word: str" in content and b"Hi!" in content


def test_a_request_after_uncommitted_work_offers_the_rebuilt_start(
    user: User, notes_repo: Path, same_second: tuple[str, Thread]
) -> None:
    name, thread = same_second
    _, second_commit = commits(name)
    plan = prepare(user, configuration(thread, notes_repo, 3)).plan
    assert plan.status == PlanStatus.NEEDS_USER_INPUT
    [question] = plan.questions
    assert question["field"] == "baseline_commit"
    assert "started from uncommitted changes" in question["message"]
    assert [c["commit"] for c in question["choices"]] == [planning.TRANSCRIPT, second_commit]
    assert "with the edits of request #3 applied" in question["message"]
    prep = ready(user, configuration(thread, notes_repo, 3, baseline_commit="transcript"))
    assert set(prep["rebuilt"]) == {"baseline", "ending"}
    assert prep["rebuilt"]["baseline"]["base"] == second_commit
    assert prep["baseline_commit"] == prep["rebuilt"]["baseline"]["commit"]
    assert prep["rebuilt"]["ending"]["base"] == prep["baseline_commit"]
    diff = repos.historical_diff(
        Path(prep["repository"]), prep["baseline_commit"], prep["ending_commit"]
    )
    added = [line for line in diff.splitlines() if line.startswith("+") and line[:3] != "+++"]
    assert added == ['+    return f"*waves at {name}* Hi!"']


@pytest.mark.parametrize("name", ["claude-dirty-start", "codex-dirty-start"])
def test_a_session_that_started_from_uncommitted_changes_asks(
    user: User, threads: dict[str, Thread], notes_repo: Path, name: str
) -> None:
    thread = threads[name]
    plan = prepare(user, configuration(thread, notes_repo)).plan
    assert plan.status == PlanStatus.NEEDS_USER_INPUT
    [question] = plan.questions
    assert question["field"] == "baseline_commit"
    assert "started from uncommitted changes" in question["message"]
    assert "greet/core.py" in question["message"]
    # The branch's commit is offered; nothing earlier in the session can rebuild the start.
    assert [c["commit"] for c in question["choices"]] == [session(name)["started_from"]]
    assert "cannot be rebuilt" in question["message"]
    # The user may still choose to start from that commit.
    answer = configuration(thread, notes_repo, baseline_commit=session(name)["started_from"])
    assert prepare(user, answer).plan.status != PlanStatus.BLOCKED


def test_approval_refuses_a_rebuilt_result_that_changed(
    user: User, threads: dict[str, Thread], notes_repo: Path
) -> None:
    thread = threads["claude-same-second"]
    prepared = prepare(user, configuration(thread, notes_repo, 2))
    # The turn's record changes after prepare (as a re-import of an edited file would).
    turn = thread.turns.get(index=2)
    evidence = turn.evidence
    evidence["items"][0]["new"] += "# changed\n"
    Turn.objects.filter(pk=turn.pk).update(evidence=evidence)
    with pytest.raises(approval.ApprovalError) as refused:
        approval.approve_plan(
            plan_id=prepared.plan.pk, user=user, approved=True,
            prepare_token=prepared.prepare_token, run_config=prepared.plan.configuration,
        )  # fmt: skip
    inputs = {change["input"] for change in refused.value.details["changes"]}
    assert "rebuilt" in inputs and "ending_commit" in inputs


def test_the_plan_page_says_what_was_rebuilt(
    logged_in_client: Any, user: User, threads: dict[str, Thread], notes_repo: Path
) -> None:
    plan = prepare(user, configuration(threads["codex-same-second"], notes_repo, 2)).plan
    page = logged_in_client.get(f"/plans/{plan.pk}/").content.decode()
    assert "is rebuilt from the transcript" in page and "greet/farewell.py" in page


@pytest.fixture
def replay_env(process_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**process_env, "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
            "REPLAYS_HEARTBEAT_SECONDS": "0.5"}  # fmt: skip


def test_the_rebuilt_result_replays_end_to_end(
    replay_env: dict[str, str], user: User, notes_repo: Path, same_second: tuple[str, Thread]
) -> None:
    name, thread = same_second
    third = thread.turns.get(index=2).message_uuid
    result = subprocess.run(
        [sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk), "--from", third,
         "--to", third, "--model", "historical", "--repository", str(notes_repo),
         "--user", user.username, "--yes", "--wait"],
        env=replay_env, text=True, capture_output=True, timeout=180, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ending" in result.stdout and "rebuilt from the transcript" in result.stdout
    run = Run.objects.get()
    assert run.status == RunStatus.COMPLETED
    config = run.configuration
    rebuilt = config["rebuilt"]["ending"]
    assert config["ending_commit"] == rebuilt["commit"]
    assert run.diff == repos.historical_diff(
        Path(config["repository"]), config["baseline_commit"], rebuilt["commit"]
    )
    assert "+def wave(name: str) -> str:" in run.diff
    report = run.reports.get(is_current=True)
    assert report.data["historical"]["rebuilt"]["ending"]["commit"] == rebuilt["commit"]
