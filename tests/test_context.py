"""Context modes (replays/context.py): normalising and resolving them, the defaults and the
blockers, the digest's bounds and its cut mark, the transcript cut and the folder rewrite,
on the real fixture transcripts; and a range run turn by turn by a command agent."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import approval, context, importing, planning
from replays.agents.base import ForkedSession, RunContext
from replays.agents.claude_code import ClaudeCodeAgent, claude_project_slug
from replays.agents.codex import CodexAgent
from replays.factories.runs import make_git_repo, make_run_graph, mark_launching
from replays.models import PlanStatus, Run, RunStatus, Thread, Transcript, Turn
from replays.runspec import RunSpec
from replays.transcripts import parse_transcript
from replays.transcripts.base import MAX_FINAL_ANSWER_CHARS, ParsedTurn
from tests.conftest import FIXTURES, REAL_TRANSCRIPTS, manifest_session

pytestmark = pytest.mark.django_db

CLAUDE = "claude:claude-sonnet-4-5"
CODEX = "codex:gpt-5.5"
COMMAND = "aider:gpt-5"
MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
SAME_SECOND = FIXTURES / "transcripts" / "same-second"
FIXTURE_FOLDER = "/var/tmp/replays-fixtures/textstats"


@pytest.fixture(autouse=True)
def three_agents(settings: Any) -> None:
    """One agent of each kind (never started here: only their kinds matter)."""
    settings.REPLAYS_AGENTS = {
        "claude": {"kind": "claude_code", "binary": sys.executable, "models": ["claude-sonnet-4-5"]},
        "codex": {"kind": "codex", "binary": sys.executable, "models": ["gpt-5.5"]},
        "aider": {"kind": "command", "command": [sys.executable], "models": ["gpt-5"]},
    }  # fmt: skip


def turn(thread: Thread, number: int) -> Turn:
    return thread.turns.get(index=number - 1)


def item(thread: Thread, repo: Path, first: int, last: int | None = None) -> dict[str, Any]:
    return {
        "thread_id": thread.pk,
        "start_message_uuid": turn(thread, first).message_uuid,
        "end_message_uuid": turn(thread, last or first).message_uuid,
        "repository": str(repo),
    }


# --- the configuration's `context` --------------------------------------------------------


def normalised(**raw: Any) -> dict[str, Any]:
    base = {"configurations": [{"thread_id": 1}], "models": [CLAUDE, CODEX, "historical"]}
    return planning.normalise_configuration({**base, **raw})


def test_one_mode_for_every_model_or_a_mode_per_model() -> None:
    assert normalised(context=" Fork ")["context"] == "fork"
    per_model = normalised(context={"claude-sonnet-4-5": "digest", CODEX: "cold"})
    # Bare model names become the plan's canonical ids.
    assert per_model["context"] == {CLAUDE: "digest", CODEX: "cold"}
    assert planning.normalise_configuration(per_model) == per_model


def test_no_context_means_the_default_and_leaves_the_fingerprint_as_it_was() -> None:
    for raw in ({}, {"context": None}, {"context": ""}, {"context": {}}):
        configuration = normalised(**raw)
        assert "context" not in configuration
        assert planning.fingerprint(configuration) == planning.fingerprint(normalised())
    assert planning.fingerprint(normalised(context="cold")) != planning.fingerprint(normalised())


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("warm", "'warm' is not a mode: cold, digest or fork"),
        ({CLAUDE: "hot"}, f"context of {CLAUDE}: 'hot' is not a mode"),
        ({CLAUDE: 3}, "'int' is not a mode"),
        ({"codex:nope": "cold"}, "codex:nope is not one of the plan's models"),
        ({"nobody:x": "cold"}, "context: Unknown model 'nobody:x'"),
        (["fork"], "context must be a mode (cold, digest, fork) or {model id: mode}"),
        ({CLAUDE: "cold", "claude-sonnet-4-5": "fork"}, f"{CLAUDE} is given twice"),
    ],
)
def test_unknown_modes_and_models_are_refused(value: Any, message: str) -> None:
    with pytest.raises(planning.PlanInputError) as caught:
        normalised(context=value)
    assert message in caught.value.message
    assert caught.value.details == {"field": "context"}


# --- resolving: defaults and blockers --------------------------------------------------------

MODELS = [CLAUDE, CODEX, COMMAND, "historical"]


def modes(resolved: dict[str, context.Resolved]) -> dict[str, str]:
    return {model: item.mode for model, item in resolved.items()}


def test_the_first_request_of_a_thread_is_cold_whatever_is_asked(real_threads: Any) -> None:
    thread = real_threads["claude-cli"]
    for asked in (None, "digest", "fork"):
        resolved = context.resolve_modes(thread, turn(thread, 1), MODELS, asked)
        assert set(modes(resolved).values()) == {"cold"}
        assert not any(item.blocker for item in resolved.values())
    assert resolved[CLAUDE].reason == "the first request of the thread: nothing came before it"
    assert resolved["historical"].reason == "a baseline ignores the context"


def test_a_later_request_forks_for_the_threads_own_tool_and_digests_for_the_others(
    real_threads: Any,
) -> None:
    claude_thread = real_threads["claude-cli"]
    resolved = context.resolve_modes(claude_thread, turn(claude_thread, 2), MODELS, None)
    assert modes(resolved) == {CLAUDE: "fork", CODEX: "digest", COMMAND: "digest", "historical": "cold"}  # fmt: skip
    assert resolved[CLAUDE].reason == "a later request of a Claude Code session"
    assert resolved[CODEX].reason == (
        "a later request; no fork: the thread is a Claude Code session, and a Codex agent "
        "resumes only Codex sessions"
    )
    assert "a command agent has no session to resume" in resolved[COMMAND].reason
    codex_thread = real_threads["codex-char-count"]
    resolved = context.resolve_modes(codex_thread, turn(codex_thread, 3), MODELS, None)
    assert modes(resolved)[CODEX] == "fork" and modes(resolved)[CLAUDE] == "digest"


def test_a_chosen_mode_is_kept_and_an_impossible_fork_blocks_with_the_reason(
    real_threads: Any,
) -> None:
    thread = real_threads["claude-cli"]
    resolved = context.resolve_modes(
        thread, turn(thread, 2), MODELS, {CLAUDE: "cold", CODEX: "fork", COMMAND: "fork"}
    )
    assert resolved[CLAUDE] == context.Resolved("cold", "chosen")
    assert resolved[CODEX].mode == "fork"
    assert resolved[CODEX].blocker == (
        f"Model {CODEX} cannot fork thread {thread.pk}: the thread is a Claude Code session, "
        "and a Codex agent resumes only Codex sessions"
    )
    assert resolved[COMMAND].blocker.startswith(f"Model {COMMAND} cannot fork thread")


def test_a_transcript_gone_falls_back_to_the_digest_and_blocks_a_chosen_fork(
    real_threads: Any, tmp_path: Path
) -> None:
    """A thread imported before transcripts were stored, whose file is gone."""
    thread = real_threads["claude-cli"]
    Transcript.objects.filter(thread=thread).delete()
    thread.source_path = str(tmp_path / "gone.jsonl")
    resolved = context.resolve_modes(thread, turn(thread, 2), [CLAUDE], None)
    assert resolved[CLAUDE] == context.Resolved(
        "digest", f"a later request; no fork: the transcript {tmp_path / 'gone.jsonl'} is gone"
    )
    chosen = context.resolve_modes(thread, turn(thread, 2), [CLAUDE], "fork")
    assert chosen[CLAUDE].blocker.endswith(f"the transcript {tmp_path / 'gone.jsonl'} is gone")


def test_the_plan_blocks_on_an_impossible_fork_and_shows_every_models_context(
    user: User, real_threads: Any, sample_repo: Path
) -> None:
    thread = real_threads["claude-cli"]
    raw = {"configurations": [item(thread, sample_repo, 2)], "models": [CLAUDE, CODEX]}
    prepared = planning.prepare_plan(owner=user, raw_configuration={**raw, "context": "fork"})
    assert prepared.plan.status == PlanStatus.BLOCKED
    assert prepared.plan.blockers == [
        f"Model {CODEX} cannot fork thread {thread.pk}: the thread is a Claude Code session, "
        "and a Codex agent resumes only Codex sessions"
    ]
    prepared = planning.prepare_plan(owner=user, raw_configuration=raw)
    assert prepared.plan.status == PlanStatus.READY_FOR_APPROVAL, prepared.plan.blockers
    [prep] = prepared.plan.preparations
    assert {model: chosen["mode"] for model, chosen in prep["context"].items()} == {
        CLAUDE: "fork",
        CODEX: "digest",
    }
    assert prep["digest_sha256"] == context.text_sha256(context.digest_preamble(thread, 1))
    # The mode is part of what each model runs with.
    cold = planning.prepare_plan(owner=user, raw_configuration={**raw, "context": "cold"})
    [cold_prep] = cold.plan.preparations
    for model in (CLAUDE, CODEX):
        assert (
            cold_prep["prepared_configuration_sha256"][model]
            != prep["prepared_configuration_sha256"][model]
        )


def test_approved_runs_carry_their_mode_their_requests_and_the_digest(
    user: User, real_threads: Any, sample_repo: Path
) -> None:
    thread = real_threads["claude-line-count"]
    raw = {
        "configurations": [item(thread, sample_repo, 2, 3)],
        "models": [CLAUDE, CODEX, "historical"],
    }
    prepared = planning.prepare_plan(owner=user, raw_configuration=raw)
    assert prepared.plan.status == PlanStatus.READY_FOR_APPROVAL, prepared.plan.blockers
    approval.approve_plan(
        plan_id=prepared.plan.pk, user=user, approved=True,
        prepare_token=prepared.prepare_token, run_config=prepared.plan.configuration,
    )  # fmt: skip
    runs = {run.model: run.configuration for run in Run.objects.all()}
    requests = [entry["request"] for entry in manifest_session("claude-line-count")["turns"]]
    assert {model: config["context"] for model, config in runs.items()} == {
        CLAUDE: "fork",
        CODEX: "digest",
        "historical": "cold",
    }
    for config in runs.values():
        assert config["requests"] == requests[1:3]
        assert config["request"] == planning.REQUEST_SEPARATOR.join(requests[1:3])
    assert runs[CODEX]["preamble"] == context.digest_preamble(thread, 1)
    assert requests[0] in runs[CODEX]["preamble"] and requests[1] not in runs[CODEX]["preamble"]
    assert runs[CLAUDE]["preamble"] == "" and runs[CLAUDE]["transcript_sha256"]


def test_approval_refuses_a_context_that_changed(
    user: User, real_threads: Any, sample_repo: Path, tmp_path: Path
) -> None:
    """Between prepare and approval the transcript a fork would cut went away: its stored
    copy deleted and its file moved."""
    thread = real_threads["claude-cli"]
    raw = {"configurations": [item(thread, sample_repo, 2)], "models": [CLAUDE]}
    prepared = planning.prepare_plan(owner=user, raw_configuration=raw)
    Transcript.objects.filter(thread=thread).delete()
    Thread.objects.filter(pk=thread.pk).update(source_path=str(tmp_path / "moved.jsonl"))
    with pytest.raises(approval.ApprovalError) as caught:
        approval.approve_plan(
            plan_id=prepared.plan.pk, user=user, approved=True,
            prepare_token=prepared.prepare_token, run_config=prepared.plan.configuration,
        )  # fmt: skip
    assert f"the context a model gets of thread {thread.pk} changed" in caught.value.message


# --- digest ----------------------------------------------------------------------------------


def test_the_digest_quotes_each_earlier_request_and_the_agents_answer(real_threads: Any) -> None:
    thread = real_threads["claude-line-count"]
    turns = manifest_session("claude-line-count")["turns"]
    preamble = context.digest_preamble(thread, 2)
    assert preamble.startswith(context.DIGEST_INTRO)
    first, second = preamble.index(turns[0]["request"]), preamble.index(turns[1]["request"])
    assert first < preamble.index("Added `line_count` with a test; all tests pass.") < second
    assert turns[2]["request"] not in preamble and "left out" not in preamble
    assert context.digest_preamble(thread, 0) == ""
    request = context.with_preamble(preamble, turns[2]["request"])
    assert request.startswith(preamble) and request.endswith(f"The request:\n\n{turns[2]['request']}")  # fmt: skip


def test_the_digest_is_bounded_and_leaves_the_oldest_out_first(make_thread: Any) -> None:
    requests = [f"Request number {n}: " + "x" * 3000 for n in range(1, 31)]
    thread = make_thread(turns=30, requests=requests)
    Turn.objects.filter(thread=thread).update(final_answer="y" * MAX_FINAL_ANSWER_CHARS)
    Turn.objects.filter(thread=thread, index=28).update(final_answer="")
    preamble = context.digest_preamble(thread, 29)
    assert len(preamble) <= context.MAX_DIGEST_CHARS
    kept = [n for n in range(1, 30) if f"## Request #{n}\n" in preamble]
    assert kept == list(range(kept[0], 30)) and kept[0] > 2
    assert f"[Requests #1–#{kept[0] - 1} are left out to keep this short.]" in preamble
    # Each request is quoted up to its own bound, with a mark; an answer never recorded says so.
    assert f"Request number 29: {'x' * 100}" in preamble and "x […]" in preamble
    assert preamble.endswith(context.NO_FINAL_ANSWER)
    assert "Request number 30" not in preamble


def test_final_answers_are_kept_at_import_and_bounded(real_threads: Any) -> None:
    answers = [turn.final_answer for turn in real_threads["codex-char-count"].turns.all()]
    assert answers == [
        "Added `char_count`; the tests still pass.",
        "Documented both functions in README.md.",
        "There are 2 tests.",
    ]
    claude = real_threads["claude-cli"].turns.all()
    assert [turn.final_answer for turn in claude] == [
        "`python3 -m textstats` prints the word count.",
        "`--lines` prints the line count.",
    ]
    parsed = ParsedTurn(index=0, message_uuid="u", timestamp=claude[0].timestamp, request="r")
    parsed.answered("z" * (MAX_FINAL_ANSWER_CHARS + 10))
    assert len(parsed.final_answer) == MAX_FINAL_ANSWER_CHARS
    assert parsed.final_answer.endswith(" […]")


# --- fork: the cut and the rewrite -----------------------------------------------------------


def fixture_sessions() -> list[tuple[Path, dict[str, Any]]]:
    found = []
    for root in (REAL_TRANSCRIPTS, SAME_SECOND):
        for session in json.loads((root / "manifest.json").read_text())["sessions"]:
            found.append((root, session))
    return found


@pytest.mark.parametrize(
    ("root", "session"), fixture_sessions(), ids=[s["name"] for _, s in fixture_sessions()]
)
def test_a_cut_reads_back_as_the_requests_before_it(
    user: User, tmp_path: Path, root: Path, session: dict[str, Any]
) -> None:
    result = importing.import_transcript_file(path=root / session["path"], user=user)
    assert result.thread is not None, result.error
    thread = result.thread
    turns = list(thread.turns.order_by("index"))
    for later in turns[1:]:
        values = context.cut_transcript(thread, later)
        cut = tmp_path / f"cut-{later.index}" / Path(session["path"]).name
        cut.parent.mkdir()
        cut.write_text("".join(json.dumps(value) + "\n" for value in values))
        parsed = parse_transcript(cut)
        assert [t.request for t in parsed.turns] == [t.request for t in turns[: later.index]]
        assert [t.final_answer for t in parsed.turns] == [
            t.final_answer for t in turns[: later.index]
        ]
        if thread.source_kind == "claude_code":
            # The conversation's chain only: no sub-agent lines, no queue plumbing.
            assert not any(v.get("isSidechain") for v in values)
            assert not any(v.get("type") in ("queue-operation", "last-prompt") for v in values)


def test_the_claude_cut_is_the_chain_of_parents_up_to_the_request(real_threads: Any) -> None:
    thread = real_threads["claude-cli"]
    second = turn(thread, 2)
    lines = [json.loads(line) for line in Path(thread.source_path).read_text().splitlines()]
    position = next(i for i, v in enumerate(lines) if v.get("uuid") == second.message_uuid)
    expected = [v["uuid"] for v in lines[:position] if v.get("type") in ("user", "assistant", "attachment")]  # fmt: skip
    values = context.cut_transcript(thread, second)
    assert [v["uuid"] for v in values] == expected
    assert values[-1]["uuid"] == lines[position]["parentUuid"]


def test_the_codex_cut_ends_with_the_turn_before_and_keeps_the_thread_totals(
    real_threads: Any, tmp_path: Path
) -> None:
    thread = real_threads["codex-char-count"]
    second = turn(thread, 2)
    values = context.cut_transcript(thread, second)
    assert values[0]["type"] == "session_meta"
    assert values[-1]["payload"]["type"] == "task_complete"
    assert values[-1]["payload"]["turn_id"] == turn(thread, 1).message_uuid
    assert second.message_uuid not in json.dumps(values)
    fork = context.fork_session(
        thread, second, workspace=tmp_path / "workspace", repository=tmp_path / "elsewhere"
    )
    last_count = [
        v["payload"]["info"]["total_token_usage"]
        for v in values
        if v["type"] == "event_msg" and v["payload"].get("type") == "token_count"
    ][-1]
    assert fork.base_usage == last_count and fork.base_usage["input_tokens"] == 39400
    source = Path(thread.source_path)  # sessions/YYYY/MM/DD/rollout-...jsonl
    assert (fork.file_name, fork.day_folder) == (source.name, "/".join(source.parts[-4:-1]))


@pytest.mark.parametrize("name", ["claude-cli", "codex-char-count"])
def test_a_fork_works_from_the_stored_copy_after_the_file_is_deleted(
    user: User, tmp_path: Path, sample_repo: Path, name: str
) -> None:
    """The transcript is kept compressed in the database at import: with the file gone (or
    on a machine that never saw it), the cut, the digest and the fork are the same."""
    source = REAL_TRANSCRIPTS / manifest_session(name)["path"]
    copy = tmp_path / "history" / source.name
    copy.parent.mkdir()
    copy.write_bytes(source.read_bytes())
    thread = importing.import_transcript_file(path=copy, user=user).thread
    assert thread is not None
    stored = Transcript.objects.get(thread=thread)
    assert stored.codec in ("zstd", "zlib") and stored.size == len(source.read_bytes())
    assert len(bytes(stored.data)) < stored.size
    second = turn(thread, 2)
    before = (context.cut_transcript(thread, second), context.transcript_digest(thread))
    workspace = tmp_path / "run" / "workspace"
    workspace.mkdir(parents=True)
    fork_before = context.fork_session(thread, second, workspace=workspace, repository=sample_repo)
    copy.unlink()
    assert importing.read_transcript(thread) == source.read_bytes()
    assert (context.cut_transcript(thread, second), context.transcript_digest(thread)) == before
    assert context.fork_problem(thread, second, thread.source_kind) == ""
    fork_after = context.fork_session(thread, second, workspace=workspace, repository=sample_repo)
    assert fork_after == fork_before


def test_a_reimported_changed_file_replaces_the_stored_copy(user: User, tmp_path: Path) -> None:
    source = REAL_TRANSCRIPTS / manifest_session("claude-cli")["path"]
    copy = tmp_path / source.name
    lines = source.read_bytes().splitlines(keepends=True)
    copy.write_bytes(b"".join(lines[:-1]))
    thread = importing.import_transcript_file(path=copy, user=user).thread
    assert thread is not None
    assert importing.read_transcript(thread) == b"".join(lines[:-1])
    copy.write_bytes(source.read_bytes())
    assert importing.import_transcript_file(path=copy, user=user).outcome == "updated"
    assert importing.read_transcript(thread) == source.read_bytes()
    assert Transcript.objects.get(thread=thread).sha256 == importing.file_sha256(source)


@pytest.mark.parametrize("name", ["claude-cli", "codex-char-count"])
def test_a_fork_names_the_worktree_wherever_the_session_named_the_checkout(
    user: User, tmp_path: Path, sample_repo: Path, name: str
) -> None:
    """The session ran in a folder inside the user's checkout: every copied line names the
    worktree instead, and the agent runs in the same folder inside the worktree."""
    checkout_folder = sample_repo / "textstats"
    source = REAL_TRANSCRIPTS / manifest_session(name)["path"]
    copy = tmp_path / "history" / source.name
    copy.parent.mkdir()
    copy.write_text(source.read_text().replace(FIXTURE_FOLDER, str(checkout_folder)))
    thread = importing.import_transcript_file(path=copy, user=user).thread
    assert thread is not None and thread.cwd == str(checkout_folder)
    workspace = tmp_path / "run" / "workspace"
    (workspace / "textstats").mkdir(parents=True)
    fork = context.fork_session(
        thread, turn(thread, 2), workspace=workspace, repository=sample_repo
    )
    assert fork.cwd == workspace / "textstats"
    assert str(sample_repo) not in fork.text
    assert fork.text.count(f"{workspace}/textstats") >= 3
    assert fork.session_id == thread.session_id
    for line in fork.text.splitlines():
        value = json.loads(line)
        for key in ("cwd",):
            if key in value:
                assert value[key] == f"{workspace}/textstats"


def test_the_folder_is_rewritten_as_a_whole_path_only() -> None:
    value = {
        "cwd": "/work/repo",
        "input": {"file_path": "/work/repo/a.py", "command": "cd /work/repo && ls /work/repo/"},
        "others": ["/work/repo-old/a.py", "/work/repository", "/home/u/work/repo/a.py"],
        "text": ["see /work/repo.", "file:///work/repo/x"],
        "changes": {"/work/repo/b.py": {"type": "add"}, "/work/repo.git/x": {}},
    }
    assert context.rewrite_folder(value, "/work/repo/", "/runs/7/workspace") == {
        "cwd": "/runs/7/workspace",
        "input": {
            "file_path": "/runs/7/workspace/a.py",
            "command": "cd /runs/7/workspace && ls /runs/7/workspace/",
        },
        "others": ["/work/repo-old/a.py", "/work/repository", "/home/u/work/repo/a.py"],
        "text": ["see /runs/7/workspace.", "file:///runs/7/workspace/x"],
        "changes": {"/runs/7/workspace/b.py": {"type": "add"}, "/work/repo.git/x": {}},
    }


def test_claude_names_a_project_folder_as_claude_code_does() -> None:
    assert claude_project_slug("/tmp/run-1/workspace") == "-tmp-run-1-workspace"
    # Longer than 200: cut, then Claude's own hash of the path in base 36 (the values
    # Claude 2.1.197's function gives, computed with node).
    long = "/tmp/" + "a" * 250
    assert claude_project_slug(long) == ("-tmp-" + "a" * 195)[:200] + "-bxbzwn"
    accented = "/var/tmp/été/" + "b/" * 120
    assert claude_project_slug(accented).endswith("-dv8w08")


def run_context(tmp_path: Path, **fields: Any) -> RunContext:
    return RunContext(
        run_id=1, model="m", spec=RunSpec(), run_dir=tmp_path, workspace=tmp_path / "ws",
        request_file=tmp_path / "request.md", log_path=tmp_path / "agent.log", **fields,
    )  # fmt: skip


def test_each_cli_finds_the_fork_where_it_looks_and_later_turns_resume_its_own_session(
    tmp_path: Path,
) -> None:
    claude = ClaudeCodeAgent(name="claude", model="claude-sonnet-4-5")
    fork = ForkedSession(
        tool="claude_code", session_id="11111111-2222-3333-4444-555555555555",
        text="{}\n", file_name="11111111-2222-3333-4444-555555555555.jsonl", cwd=tmp_path / "ws",
    )  # fmt: skip
    argv = claude.invocation(run_context(tmp_path, fork=fork)).argv
    assert argv[-3:] == ["--resume", fork.session_id, "--fork-session"]
    placed = tmp_path / "claude-home/.claude/projects" / claude_project_slug(tmp_path / "ws")
    assert (placed / fork.file_name).read_text() == "{}\n"
    later = claude.invocation(run_context(tmp_path, fork=fork, turn=2, resume_session="abc-1"))
    assert later.argv[-2:] == ["--resume", "abc-1"] and "--fork-session" not in later.argv

    codex = CodexAgent(name="codex", model="gpt-5.5")
    fork = ForkedSession(
        tool="codex", session_id="019", text="{}\n", file_name="rollout-x-019.jsonl",
        cwd=tmp_path / "ws" / "sub", day_folder="2026/11/29",
    )  # fmt: skip
    argv = codex.invocation(run_context(tmp_path, fork=fork)).argv
    assert argv[-3:] == ["fork", "019", "-"]
    assert argv[argv.index("-C") + 1] == str(tmp_path / "ws" / "sub")
    assert (tmp_path / "codex-home/sessions/2026/11/29/rollout-x-019.jsonl").is_file()
    assert codex.invocation(run_context(tmp_path, turn=2, resume_session="t-9")).argv[-3:] == [
        "resume",
        "t-9",
        "-",
    ]
    with pytest.raises(Exception, match="not a session"):
        codex.invocation(run_context(tmp_path, turn=2, resume_session="--all"))


def test_codex_counts_only_what_a_turn_added_to_the_threads_totals(tmp_path: Path) -> None:
    log = tmp_path / "agent.log"

    def completed(input_tokens: int, cached: int, output: int) -> str:
        usage = {
            "input_tokens": input_tokens,
            "cached_input_tokens": cached,
            "output_tokens": output,
        }
        return json.dumps({"type": "turn.completed", "usage": usage}) + "\n"  # fmt: skip

    first = '{"type":"thread.started","thread_id":"t-1"}\n' + completed(1500, 500, 40)
    log.write_text(first)
    codex = CodexAgent(name="codex", model="gpt-5.5")
    fork = ForkedSession(
        tool="codex", session_id="s", text="", file_name="f", cwd=tmp_path,
        base_usage={"input_tokens": 1000, "cached_input_tokens": 400, "output_tokens": 10},
    )  # fmt: skip
    one = codex.outcome(run_context(tmp_path, fork=fork), exit_code=0)
    with log.open("a") as more:
        more.write("[replays] Request 2 of 2.\n" + completed(4000, 1500, 100))
    assert (one.usage.input_tokens, one.usage.cache_read_tokens, one.usage.output_tokens) == (
        400,
        100,
        30,
    )
    two = codex.outcome(run_context(tmp_path, fork=fork, log_offset=len(first) + 26), exit_code=0)
    assert (two.usage.input_tokens, two.usage.cache_read_tokens, two.usage.output_tokens) == (
        1500,
        1000,
        60,
    )
    assert codex.session_id(run_context(tmp_path)) == "t-1"


# --- a command agent, turn by turn -----------------------------------------------------------

TURN_SCRIPT = """
import json, os, pathlib, sys
turn = os.environ["REPLAYS_TURN"]
request = pathlib.Path(sys.argv[1]).read_text()
pathlib.Path(f"turn-{turn}.txt").write_text(f"{turn}/{os.environ['REPLAYS_TURNS']}: {request}")
usage = {"input_tokens": 100 * int(turn), "output_tokens": 10, "cost_usd": "0.01"}
pathlib.Path(os.environ["REPLAYS_USAGE_FILE"]).write_text(json.dumps(usage))
"""


def test_a_command_agent_gets_one_process_per_request_in_the_same_workspace(
    process_env: dict[str, str], tmp_path: Path, user: User
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps({"aider": {
        "kind": "command", "command": [sys.executable, "-c", TURN_SCRIPT, "{request_file}"],
        "models": ["gpt-5"],
    }}))  # fmt: skip
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=[COMMAND]
    )
    run.configuration = {
        **run.configuration, "requests": ["First.", "Second."], "context": "digest",
        "preamble": "Earlier: the first request of the thread.",
    }  # fmt: skip
    run.save()
    mark_launching(run)
    env = {**process_env, "REPLAYS_AGENTS_FILE": str(agents_file),
           "REPLAYS_RUN_ROOT": str(tmp_path / "runs"), "REPLAYS_KEEP_WORKSPACES": "1"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.failure_message
    workspace = Path(run.workspace_path)
    first = (workspace / "turn-1.txt").read_text()
    # The digest starts the first turn's request only.
    assert first.startswith("1/2: Earlier: the first request of the thread.")
    assert first.endswith("The request:\n\nFirst.")
    assert (workspace / "turn-2.txt").read_text() == "2/2: Second."
    assert [t["tokens"]["input_tokens"] for t in run.turns] == [100, 200]
    assert [t["cost_usd"] for t in run.turns] == ["0.010000", "0.010000"]
    assert (run.input_tokens, str(run.cost_usd)) == (300, "0.020000")
    assert [t["session_id"] for t in run.turns] == ["", ""]
    assert "[replays] Request 2 of 2." in (Path(run.run_dir) / "agent.log").read_text()


SLOW_FIRST_TURN = """
import os, pathlib, time
pathlib.Path(f"turn-{os.environ['REPLAYS_TURN']}.txt").write_text("started")
time.sleep(30 if os.environ["REPLAYS_TURN"] == "1" else 0)
"""


def test_one_timeout_for_the_whole_range_stops_it_where_it_is(
    process_env: dict[str, str], tmp_path: Path, user: User
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps({"aider": {
        "kind": "command", "command": [sys.executable, "-c", SLOW_FIRST_TURN], "models": ["gpt-5"],
    }}))  # fmt: skip
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=[COMMAND],
        timeout_seconds=2,
    )  # fmt: skip
    run.configuration = {**run.configuration, "requests": ["Slow.", "Never."]}
    run.save()
    mark_launching(run)
    env = {**process_env, "REPLAYS_AGENTS_FILE": str(agents_file),
           "REPLAYS_RUN_ROOT": str(tmp_path / "runs"), "REPLAYS_KEEP_WORKSPACES": "1",
           "REPLAYS_HEARTBEAT_SECONDS": "0.5"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    run.refresh_from_db()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, "timeout")
    assert [(t["turn"], t["ending"]) for t in run.turns] == [(1, "timeout")]
    workspace = Path(run.workspace_path)
    assert (workspace / "turn-1.txt").exists() and not (workspace / "turn-2.txt").exists()


# --- the doors: plan page, form, comparison ----------------------------------------------------


def test_the_plan_page_shows_each_models_context_and_why(
    logged_in_client: Any, user: User, real_threads: Any, sample_repo: Path
) -> None:
    thread = real_threads["claude-cli"]
    raw = {"configurations": [item(thread, sample_repo, 2)], "models": [CLAUDE, CODEX]}
    plan = planning.prepare_plan(owner=user, raw_configuration=raw).plan
    page = logged_in_client.get(f"/plans/{plan.pk}/").content.decode()
    assert f'<code class="model-id">{CLAUDE}</code> <strong>fork</strong>' in page
    assert "(a later request of a Claude Code session)" in page
    assert f'<code class="model-id">{CODEX}</code> <strong>digest</strong>' in page


def test_the_replay_form_chooses_a_mode_for_every_model(real_threads: Any) -> None:
    from replays import agents
    from replays.evaluation import evaluators
    from replays.forms import ReplayForm

    thread = real_threads["claude-cli"]
    uuid = turn(thread, 2).message_uuid
    data = {"models": [CLAUDE], "start_message_uuid": uuid, "end_message_uuid": uuid,
            "timeout_minutes": 5, "context": "digest"}  # fmt: skip
    form = ReplayForm(
        data, thread=thread, model_infos=agents.discover_models(),
        evaluator_infos=evaluators.discover_evaluators(),
    )  # fmt: skip
    assert form.is_valid(), form.errors
    assert form.configuration()["context"] == "digest"
    assert "context" not in planning.normalise_configuration({**form.configuration(), "context": None})  # fmt: skip


def test_the_comparison_shows_each_turn_of_a_range(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"]
    )
    tokens = {"input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 0,
              "cache_write_5m_tokens": 0, "cache_write_1h_tokens": 0}  # fmt: skip
    run.configuration = {**run.configuration, "requests": ["Add one.", "Then two."]}
    run.turns = [
        {"turn": 1, "ending": "exited", "exit_code": 0, "seconds": 1.5, "model_seconds": 1.0,
         "cost_usd": "0.010000", "tokens": tokens, "session_id": "s", "files_changed": 1,
         "diff": "diff --git a/ONE.txt b/ONE.txt\n"},
        {"turn": 2, "ending": "timeout", "exit_code": None, "seconds": 9.0, "model_seconds": None,
         "cost_usd": None, "tokens": tokens, "session_id": "s", "files_changed": 2, "diff": ""},
    ]  # fmt: skip
    run.save()
    page = logged_in_client.get(f"/runs/{run.pk}/compare/").content.decode()
    assert "Turn by turn" in page and '#1 <span class="muted">Add one.</span>' in page
    assert "The diff after request #1" in page and "timeout" in page


def test_the_comparison_says_which_context_each_side_had() -> None:
    from replays.views.comparison import side_figures

    document = {"historical": {"context": "session"}, "replay": {"context": "digest"}}
    [figure] = [figure for figure in side_figures(document) if figure.label == "Context"]
    assert (figure.historical, figure.replay) == (
        "its own session",
        "digest: the earlier requests and answers",
    )


# --- a fork runs inside its worktree only -------------------------------------------------


def _repository_with_link(tmp_path: Path, name: str, target: str) -> tuple[Path, str]:
    """A repository whose one commit holds `name`, a symbolic link to `target`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    (repo / "README").write_text("hello\n")
    (repo / name).symlink_to(target)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "a link"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True)
    return repo, head.stdout.strip()


@pytest.mark.parametrize("link", ["elsewhere", "up"])
def test_a_fork_through_a_committed_link_is_blocked_and_never_runs_outside_the_worktree(
    user: User, tmp_path: Path, link: str
) -> None:
    """The attack: a repository commits `vendor -> /somewhere/real-checkout` (or `up ->
    ..`) and the thread's folder is that link: a fork resuming there would make Claude Code
    work in the other checkout (and Codex's -C, its writable root) or in the run folder."""
    elsewhere = tmp_path / "real-checkout"
    elsewhere.mkdir()
    target = str(elsewhere) if link == "elsewhere" else ".."
    repo, baseline = _repository_with_link(tmp_path, link, target)
    source = REAL_TRANSCRIPTS / manifest_session("claude-cli")["path"]
    copy = tmp_path / "history" / source.name
    copy.parent.mkdir()
    copy.write_text(source.read_text().replace(FIXTURE_FOLDER, str(repo / link)))
    thread = importing.import_transcript_file(path=copy, user=user).thread
    assert thread is not None and thread.cwd == str(repo / link)

    chosen = context.resolve_modes(
        thread, turn(thread, 2), [CLAUDE], "fork", repository=repo, baseline=baseline
    )
    assert chosen[CLAUDE].blocker == (
        f"Model {CLAUDE} cannot fork thread {thread.pk}: the thread's folder {link} is not "
        f"inside the worktree: {link} is a symbolic link in the repository at the baseline, "
        "and a fork runs only in the run's own worktree"
    )
    default = context.resolve_modes(
        thread, turn(thread, 2), [CLAUDE], None, repository=repo, baseline=baseline
    )
    assert default[CLAUDE].mode == "digest" and "symbolic link" in default[CLAUDE].reason

    # At run time too (a link made after prepare): the folder, links followed, must be the
    # worktree's own.
    workspace = tmp_path / "run" / "workspace"
    subprocess.run(
        ["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(workspace), baseline],
        check=True,
    )
    with pytest.raises(context.CannotFork, match="leads outside the worktree"):
        context.fork_session(thread, turn(thread, 2), workspace=workspace, repository=repo)
