"""Gemini CLI sessions read right: both formats, a resumed session, sub-agents, the folder.

The files are our own (tests/fixtures/transcripts/edge/gemini_*), in the shapes real ones
have (docs/realdata.md); the one Gemini CLI 0.61.0 wrote itself is in real/gemini/.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from replays import importing
from replays.transcripts import TranscriptError, parse_transcript
from replays.transcripts.base import TokenUsage
from tests.conftest import EDGE_TRANSCRIPTS, REAL_TRANSCRIPTS, importer, manifest_session

pytestmark = pytest.mark.django_db

HOME = EDGE_TRANSCRIPTS / "gemini_home"
CHATS = HOME / "tmp" / "blog" / "chats"
MAIN = CHATS / "session-2026-04-01T09-00-7f3a9c21.json"


def test_the_json_format_gives_requests_answers_and_tokens_read_as_ccusage_reads_them() -> None:
    thread = parse_transcript(EDGE_TRANSCRIPTS / "gemini_legacy.json")

    assert thread.kind == "gemini"
    assert [turn.request for turn in thread.turns] == [
        "Fix the typo in README.md",
        "@README.md give it a title",  # what the user typed; the files' text went along
    ]
    assert thread.turns[1].request_as_sent.startswith("@README.md give it a title\n\n--- Content")
    first, second = thread.turns
    # total = input + output + thoughts + tool: the cached part is inside input (600 + 400);
    # otherwise it is apart (1200 + 300). Thoughts are output; the tool-use prompt is input.
    assert first.usage_by_model == {
        "gemini-2.5-pro": TokenUsage(input_tokens=1800, output_tokens=60, cache_read_tokens=700)
    }
    assert second.usage_by_model == {
        "gemini-2.5-flash": TokenUsage(input_tokens=908, output_tokens=52)
    }
    assert first.final_answer == "Fixed the typo."
    assert first.model_seconds == 8.0  # each response from the message before it
    # A cancelled command changed nothing; a successful read and replace did.
    assert [(item["kind"], item["path"]) for item in first.evidence.items] == [
        ("read", "README.md"),
        ("edit", "README.md"),
    ]
    assert thread.cwd == "/home/ada/notes"  # `directories`, checked against projectHash
    assert [p.message for p in thread.problems] == ["message 8 is not a message object"]


def test_jsonl_keeps_the_latest_version_of_each_message_and_a_resume_changes_no_figure() -> None:
    thread = parse_transcript(EDGE_TRANSCRIPTS / "gemini_resumed.jsonl")

    # Three requests; the CLI's <session_context> message is none. Each response counted
    # once though written twice; the history the resume wrote again (no tokens, the resume's
    # time) leaves the first request's usage and time as they were.
    assert [turn.request for turn in thread.turns] == [
        "Rename the cart module to basket",
        "Also delete the old tests",
        "Keep the tests after all; rename them instead",
    ]
    assert thread.turns[0].usage_by_model["gemini-3-flash-preview"] == TokenUsage(
        input_tokens=3128, output_tokens=180, cache_read_tokens=3072
    )
    assert thread.turns[0].timestamp.isoformat() == "2026-05-02T08:00:01+00:00"
    assert (
        thread.started_at is not None
        and thread.started_at.isoformat() == "2026-05-02T08:00:00+00:00"
    )
    assert [item["command"] for item in thread.turns[0].evidence.items] == [
        "git mv cart.py basket.py"
    ]
    # A rewind takes the request back out of the conversation; it was sent and paid for.
    assert [turn.rolled_back for turn in thread.turns] == [False, True, False]
    assert thread.turns[1].usage.total == 3515
    assert thread.cwd == "/home/ada/shop"  # from the CLI's own context message
    assert [(p.line_number, p.message[:12]) for p in thread.problems] == [(9, "invalid JSON")]


def test_a_sub_agents_file_is_read_with_its_session_and_counted_in_its_turn() -> None:
    thread = parse_transcript(MAIN)

    (turn,) = thread.turns
    assert turn.request == "Find every broken link in the posts"
    assert turn.usage_by_model["gemini-3-flash-preview"] == TokenUsage(
        input_tokens=5000, output_tokens=600, cache_read_tokens=6000
    )
    assert {"kind": "other", "tool": "subagent", "path": None} in turn.evidence.items
    assert thread.cwd == "/home/ada/blog"  # the project folder's .project_root


def test_a_home_gives_each_session_file_once_and_a_continued_session_its_own_id() -> None:
    found = list(importing.find_transcript_files([HOME / "tmp"]))

    # The sub-agent's file goes with its session; the prompt log is no session.
    assert [p.relative_to(CHATS) for p in found] == [
        Path("session-2026-04-01T09-00-7f3a9c21.json"),
        Path("session-2026-04-01T10-00-7f3a9c21.json"),
        Path("skill-extraction-0a1b2c3d/x9y8z7.json"),
    ]
    first, continued, extraction = (parse_transcript(path) for path in found)
    assert first.session_id == "7f3a9c21-5555-4666-8777-988899990000"
    assert continued.session_id == first.session_id + "~2"
    assert continued.pre_turn_usage_by_model == {}  # the sub-agent is the first file's
    # A background skill extraction asks nothing of a person: its usage is the thread's.
    assert extraction.turns == []
    assert extraction.pre_turn_usage_by_model["gemini-3-flash-preview"].total == 4045


def test_both_files_of_a_continued_session_import_as_two_threads(tmp_path: Path) -> None:
    results = list(
        importing.import_files(
            paths=importing.find_transcript_files([HOME / "tmp"]), user=importer(), workers=1
        )
    )

    assert [result.outcome for result in results] == ["new", "new", "new"]
    assert (
        results[0].thread is not None
        and results[0].thread.get_source_kind_display() == "Gemini CLI"
    )


def test_a_prompt_log_or_an_unrelated_json_file_is_refused_saying_why(tmp_path: Path) -> None:
    logs = next((HOME / "tmp").glob("*/logs.json"))
    other = tmp_path / "package.json"
    other.write_text(json.dumps({"name": "x", "messages": []}, indent=2))

    for path in (logs, other):
        with pytest.raises(
            TranscriptError, match="is not a session file of Claude Code, Codex, Gemini CLI"
        ):
            parse_transcript(path)


def test_the_session_gemini_cli_wrote_reads_as_the_server_answered() -> None:
    session = manifest_session("gemini-longest-word")
    thread = parse_transcript(REAL_TRANSCRIPTS / session["path"])

    assert thread.session_id == session["session_id"]
    assert thread.cwd == session["cwd"]
    assert [turn.request for turn in thread.turns] == [t["request"] for t in session["turns"]]
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        usage = expected["usage"]
        assert turn.usage == TokenUsage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"] + usage["thoughts_tokens"],
            cache_read_tokens=usage["cached_tokens"],
        )
    assert [item["tool"] for item in thread.turns[0].evidence.items] == [
        "read_file", "replace", "run_shell_command"
    ]  # fmt: skip


def test_a_session_copied_with_its_project_folder_keeps_its_folder(tmp_path: Path) -> None:
    shutil.copytree(HOME, tmp_path / "gemini")
    thread = parse_transcript(tmp_path / "gemini" / MAIN.relative_to(HOME))
    assert thread.cwd == "/home/ada/blog"
    (tmp_path / "gemini" / "tmp" / "blog" / ".project_root").write_text("/somewhere/else")
    # A folder that does not hash to projectHash is not the session's; projects.json's is.
    assert parse_transcript(tmp_path / "gemini" / MAIN.relative_to(HOME)).cwd == "/home/ada/blog"
