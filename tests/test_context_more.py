"""Forks of Gemini CLI, OpenCode and pi sessions: each cut just before the request, as its
CLI resumes it (the real CLIs resume them in tests/test_more_agents_real_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from replays import context, importing
from replays.models import Thread
from tests.conftest import EDGE_TRANSCRIPTS, REAL_TRANSCRIPTS, importer, manifest_session

pytestmark = pytest.mark.django_db


def imported(path: Path) -> Thread:
    result = importing.import_transcript_file(path=path, user=importer())
    assert result.thread is not None, result.error
    return result.thread


def test_a_gemini_json_session_is_cut_to_the_messages_before_the_request() -> None:
    thread = imported(EDGE_TRANSCRIPTS / "gemini_legacy.json")
    second = thread.turns.get(index=1)

    [document] = context.cut_transcript(thread, second)

    assert [m["id"] for m in document["messages"]] == ["u1", "g1", "g2", "i1"]
    assert document["sessionId"] == thread.session_id
    assert context.fork_problem(thread, second, "gemini") == ""
    assert context.fork_problem(thread, second, "pi") == (
        "the thread is a Gemini CLI session, and a pi agent resumes only pi sessions"
    )


def test_a_gemini_jsonl_session_is_cut_at_the_requests_first_line(tmp_path: Path) -> None:
    session = manifest_session("gemini-longest-word")
    thread = imported(REAL_TRANSCRIPTS / session["path"])
    second = thread.turns.get(index=1)

    lines = context.cut_transcript(thread, second)

    assert lines[0]["sessionId"] == session["session_id"]
    texts = json.dumps(lines)
    assert session["turns"][0]["request"] in texts and session["turns"][1]["request"] not in texts
    workspace = tmp_path / "worktree"
    workspace.mkdir()
    fork = context.fork_session(thread, second, workspace=workspace, repository=workspace)
    assert fork.session_id == session["session_id"] and fork.file_name == Path(session["path"]).name
    first_line = json.loads(fork.text.splitlines()[0])
    # Gemini CLI keeps a project by its folder's hash: the copy's is the worktree's.
    import hashlib

    assert first_line["projectHash"] == hashlib.sha256(str(workspace).encode()).hexdigest()


def test_a_pi_session_is_cut_to_the_requests_chain_of_parents() -> None:
    thread = imported(EDGE_TRANSCRIPTS / "pi_tree.jsonl")
    second = thread.turns.get(index=1)

    lines = context.cut_transcript(thread, second)

    # The header, the model change and request #1 with its answer; not the extension's
    # message that branched off beside them.
    assert [line.get("id") for line in lines] == [
        "01a00000-aaaa-7bbb-8ccc-dddddddddddd", "m0", "u1", "a1"
    ]  # fmt: skip


def test_a_pi_session_of_format_1_is_cut_to_everything_before_the_request() -> None:
    thread = imported(EDGE_TRANSCRIPTS / "pi_v1.jsonl")
    second = thread.turns.get(index=1)

    lines = context.cut_transcript(thread, second)

    assert lines[0]["type"] == "session"
    assert lines[-1]["message"]["role"] == "bashExecution"  # what came right before it
    assert context.fork_problem(thread, second, "pi") == ""


def test_an_opencode_session_is_cut_to_the_messages_before_the_request() -> None:
    session = manifest_session("opencode-contributing")
    thread = imported(REAL_TRANSCRIPTS / session["path"])
    second = thread.turns.get(index=1)

    [document] = context.cut_transcript(thread, second)

    assert document["info"]["id"] == session["session_id"]
    assert [m["info"]["role"] for m in document["messages"]] == [
        "user",
        "assistant",
        "assistant",
        "assistant",
    ]
    assert set(document) == {"info", "messages"}  # what `opencode import` takes
    assert context.fork_problem(thread, second, "opencode") == ""
