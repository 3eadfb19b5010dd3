"""Claude Code transcripts -> ParsedThread, and the file-level refusals all transcripts share.

Plain Python (no database): runs with or without the Django plugin.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replays.transcripts import (
    LineProblem,
    TokenUsage,
    TranscriptError,
    claude_code,
    detect_kind,
    parse_claude_code,
    parse_transcript,
)

FIXTURES = Path(__file__).parent / "fixtures" / "transcripts"
REAL = FIXTURES / "real"
EDGE = FIXTURES / "edge"
SUBAGENT_SESSION = "11111111-2222-4333-8444-555555555555"
MIB = 1024 * 1024


def parse(name: str) -> Any:
    return parse_transcript(EDGE / name)


def at(seconds: float) -> datetime:
    """Times in the hand-made files: 2026-01-02T03:00:00Z plus ``seconds``."""
    return datetime(2026, 1, 2, 3, 0, 0, tzinfo=UTC).replace(
        minute=int(seconds) // 60,
        second=int(seconds) % 60,
        microsecond=round((seconds - int(seconds)) * 1_000_000),
    )


# --- real transcripts written by claude 2.1.332 -----------------------------------


def real_sessions() -> list[dict[str, Any]]:
    manifest = REAL / "manifest.json"
    if not manifest.exists():
        return []
    sessions = json.loads(manifest.read_text())["sessions"]
    return [s for s in sessions if s["kind"] == "claude_code"]


@pytest.mark.parametrize("session", real_sessions(), ids=lambda s: s["name"])
def test_real_transcript_matches_the_manifest(session: dict[str, Any]) -> None:
    thread = parse_transcript(REAL / session["path"])

    assert thread.kind == "claude_code"
    assert thread.session_id == session["session_id"]
    assert thread.cwd == session["cwd"]
    assert thread.git_branch == session["branch"]
    assert thread.cli_version == "2.1.332"
    assert thread.git_commit == ""
    assert thread.problems == []
    assert [t.request for t in thread.turns] == [t["request"] for t in session["turns"]]
    assert thread.title == session["turns"][0]["request"]
    assert len({t.message_uuid for t in thread.turns}) == len(thread.turns)
    assert thread.started_at is not None and thread.ended_at is not None
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        expected_usage = {session["model"]: TokenUsage(**expected["usage"])}
        if "subagent" in expected:
            # The sub-agent's own model, from <sessionId>/subagents/*.jsonl.
            for model in expected["subagent"]["models"]:
                expected_usage[model] = TokenUsage(**expected["subagent"]["usage"])
        assert turn.usage_by_model == expected_usage, turn.request
        assert turn.last_answer_at is not None
        assert thread.started_at <= turn.timestamp <= turn.last_answer_at <= thread.ended_at
        assert turn.recorded_cost_usd is None  # claude 2.x writes no costUSD


def test_real_transcripts_do_stream_one_response_over_several_lines() -> None:
    # What the usage assertions above rely on: without grouping on (message.id,
    # requestId) these files would count some responses twice.
    keys = [
        (line["message"]["id"], line["requestId"])
        for session in real_sessions()
        for line in map(json.loads, (REAL / session["path"]).read_text().splitlines())
        if line.get("type") == "assistant"
    ]
    if not keys:
        pytest.skip("no real Claude Code transcripts")
    assert len(set(keys)) < len(keys)


def test_real_subagent_usage_is_left_out_when_asked() -> None:
    with_subagents = [s for s in real_sessions() if s["subagent_paths"]]
    if not with_subagents:
        pytest.skip("no real session with a sub-agent")
    session = with_subagents[0]
    thread = parse_claude_code(REAL / session["path"], max_bytes=MIB, include_subagents=False)
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        assert turn.usage_by_model == {session["model"]: TokenUsage(**expected["usage"])}


# --- hand-made edge cases ------------------------------------------------------------


def test_invalid_json_and_non_object_lines_are_reported_and_skipped() -> None:
    thread = parse("claude_invalid_lines.jsonl")

    assert [p.line_number for p in thread.problems] == [3, 5, 6]
    assert thread.problems[0].message.startswith("invalid JSON")
    assert "list, not an object" in thread.problems[1].message
    assert [t.request for t in thread.turns] == ["Rename foo to bar.", "Now run the tests."]
    assert thread.turns[0].usage == TokenUsage(10, 20, 100, 5, 0)
    assert thread.turns[1].usage == TokenUsage(3, 7)
    assert thread.lines_read == 7  # the blank line 4 is not counted


def test_truncated_last_line_is_a_problem_not_a_failure() -> None:
    thread = parse("claude_truncated_last_line.jsonl")

    assert thread.problems == [
        LineProblem(3, thread.problems[0].message),
    ]
    assert thread.problems[0].message.startswith("truncated last line")
    assert [t.request for t in thread.turns] == ["Add a README."]
    assert thread.turns[0].usage == TokenUsage(input_tokens=4, output_tokens=40)


def test_wrong_shaped_lines_are_reported_with_their_line_numbers() -> None:
    thread = parse("claude_wrong_shapes.jsonl")

    assert [(p.line_number, p.message) for p in thread.problems] == [
        (2, "assistant line has no message object"),
        (3, "message.content is neither text nor a list of blocks"),
        (4, "message.usage is not an object"),
        (5, "input_tokens is not a number"),
        (6, "bad timestamp 'yesterday'"),
        (7, "user line has no timestamp"),
    ]
    assert [t.request for t in thread.turns] == ["Fix the bug."]
    assert thread.turns[0].usage == TokenUsage(input_tokens=2, output_tokens=9)


def test_meta_and_command_wrapper_lines_make_no_turns() -> None:
    thread = parse("claude_only_meta.jsonl")

    assert thread.kind == "claude_code"
    assert thread.turns == []
    assert thread.problems == []
    assert thread.title == ""
    assert thread.session_id == SUBAGENT_SESSION


def test_compaction_summary_is_not_a_turn_and_its_work_stays_with_the_turn() -> None:
    thread = parse("claude_compaction.jsonl")

    assert [t.request for t in thread.turns] == [
        "Make the parser skip bad lines.",
        "Now add tests for it.",
    ]
    assert [t.message_uuid for t in thread.turns] == ["u1", "u3"]
    # The answer after the compaction (a2) serves the request before it.
    assert thread.turns[0].usage == TokenUsage(7, 80, 900, 1000, 0)
    assert thread.turns[0].last_answer_at == at(22)
    assert thread.title == "Parser hardening"  # the summary line


def test_tool_results_are_not_turns() -> None:
    thread = parse("claude_tool_result.jsonl")

    assert [t.request for t in thread.turns] == ["List the files."]
    assert thread.turns[0].usage == TokenUsage(
        input_tokens=4, output_tokens=40, cache_read_tokens=200
    )
    assert thread.turns[0].seconds == 4.0


def test_streamed_lines_of_one_response_count_once_with_the_largest_usage() -> None:
    thread = parse("claude_streamed_duplicates.jsonl")

    (turn,) = thread.turns
    # msg_1/req_1 streamed over three lines: output grew 1 -> 60 -> 120, counted once.
    # msg_1/req_9 is another response (5 output, 400 cache writes without a split: 5m).
    # The <synthetic> error line adds nothing.
    assert turn.usage_by_model == {
        "claude-sonnet-4-5": TokenUsage(
            input_tokens=9,
            output_tokens=125,
            cache_read_tokens=100,
            cache_write_5m_tokens=2400,
            cache_write_1h_tokens=3000,
        )
    }
    assert turn.recorded_cost_usd == 0.035  # largest costUSD per response, summed
    assert turn.last_answer_at == at(3)  # the synthetic line at 4s is not an answer


def test_sidechain_work_counts_toward_the_turn_it_served() -> None:
    thread = parse("claude_sidechain.jsonl")

    assert [t.request for t in thread.turns] == [
        "Review the diff with a sub-agent.",
        "Thanks. Commit it.",
    ]
    assert thread.turns[0].usage_by_model == {
        "claude-sonnet-4-5": TokenUsage(input_tokens=4, output_tokens=40),
        "claude-haiku-4-5-20251001": TokenUsage(input_tokens=7, output_tokens=70),
    }
    assert thread.turns[0].models == ["claude-sonnet-4-5", "claude-haiku-4-5-20251001"]
    assert thread.turns[1].usage == TokenUsage(input_tokens=1, output_tokens=5)


def test_unknown_line_types_are_skipped_silently_and_the_ai_title_wins() -> None:
    thread = parse("claude_unknown_types.jsonl")

    assert thread.problems == []
    assert [t.request for t in thread.turns] == ["Add logging."]
    assert thread.title == "Add structured logging"  # the latest ai-title, over the summary
    assert thread.lines_read == 10


def test_subagent_files_are_placed_in_the_turn_whose_time_window_holds_them() -> None:
    path = EDGE / "claude_subagents" / f"{SUBAGENT_SESSION}.jsonl"
    thread = parse_claude_code(path, max_bytes=MIB)

    assert [t.request for t in thread.turns] == [
        "Write the parser.",
        "Have a sub-agent review it.",
        "Commit.",
    ]
    assert thread.turns[0].usage == TokenUsage(input_tokens=3, output_tokens=30)
    # msg_s1 is in the main file (sidechain) and in agent-abc.jsonl: counted once.
    # agent-broken.jsonl's good line (25s) falls in turn 2's window [10s, 30s).
    assert thread.turns[1].usage_by_model["claude-haiku-4-5-20251001"] == TokenUsage(
        input_tokens=4 + 6 + 1 + 7,
        output_tokens=40 + 60 + 1 + 70,
        cache_read_tokens=400,
        cache_write_5m_tokens=100,
    )
    assert thread.turns[1].last_answer_at == at(25)
    assert thread.turns[2].usage == TokenUsage(input_tokens=1, output_tokens=5)
    assert [(p.line_number, p.message.split(":")[0]) for p in thread.problems] == [
        (1, f"{SUBAGENT_SESSION}/subagents/agent-broken.jsonl"),
    ]


def test_empty_or_oversized_subagent_files_do_not_cost_the_session(tmp_path: Path) -> None:
    source = EDGE / "claude_subagents" / f"{SUBAGENT_SESSION}.jsonl"
    shutil.copy(source, tmp_path / source.name)
    folder = tmp_path / SUBAGENT_SESSION / "subagents"
    folder.mkdir(parents=True)
    (folder / "agent-new.jsonl").write_bytes(b"")  # spawned, nothing written yet
    (folder / "agent-blank.jsonl").write_bytes(b"\n\n")
    limit = source.stat().st_size + 100
    (folder / "agent-huge.jsonl").write_text("x" * (limit + 1))

    thread = parse_claude_code(tmp_path / source.name, max_bytes=limit)

    assert [t.request for t in thread.turns] == [
        "Write the parser.",
        "Have a sub-agent review it.",
        "Commit.",
    ]
    assert [(p.line_number, p.message.split(":")[0]) for p in thread.problems] == [
        (0, f"{SUBAGENT_SESSION}/subagents/agent-huge.jsonl"),  # 0: the whole file
    ]
    assert "larger than the limit" in thread.problems[0].message


def test_subagents_can_be_left_out() -> None:
    path = EDGE / "claude_subagents" / f"{SUBAGENT_SESSION}.jsonl"
    thread = parse_claude_code(path, max_bytes=MIB, include_subagents=False)

    assert thread.turns[1].usage_by_model["claude-haiku-4-5-20251001"] == TokenUsage(
        input_tokens=4, output_tokens=40
    )
    assert thread.problems == []


def test_a_repeated_user_line_is_one_turn(tmp_path: Path) -> None:
    lines = (EDGE / "claude_tool_result.jsonl").read_text().splitlines()
    # A resumed session can write the same prompt line (same uuid) again.
    path = tmp_path / "s.jsonl"
    path.write_text("\n".join([lines[0], *lines, lines[0]]) + "\n")

    thread = parse_transcript(path)

    assert [t.request for t in thread.turns] == ["List the files."]


def test_session_id_falls_back_to_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "abc-123.jsonl"
    path.write_text(
        json.dumps(
            {
                "type": "user",
                "uuid": "u1",
                "timestamp": "2026-01-02T03:00:00Z",
                "message": {"role": "user", "content": "Hi"},
            }
        )
        + "\n"
    )

    thread = parse_transcript(path)

    assert thread.session_id == "abc-123"
    assert thread.turns[0].timestamp == at(0)


def test_first_request_title_is_one_line_of_at_most_120_characters(tmp_path: Path) -> None:
    request = "x" * 200 + "\nsecond line"
    path = tmp_path / "long.jsonl"
    path.write_text(
        json.dumps(
            {
                "type": "user",
                "uuid": "u1",
                "sessionId": "s",
                "timestamp": "2026-01-02T03:00:00Z",
                "message": {"role": "user", "content": request},
            }
        )
        + "\n"
    )

    thread = parse_transcript(path)

    assert len(thread.title) == 120
    assert "\n" not in thread.title
    assert thread.turns[0].request == request  # the request itself is kept whole


# --- what real sessions of other people showed (issue 18) ---------------------------


SONNET = "claude-sonnet-4-5-20250929"


def test_background_task_notifications_are_not_requests() -> None:
    # Claude Code 2.1.x hands the model a background task's events (the Monitor tool) as
    # user lines with origin "task-notification"; one real session had 89 turns for 15
    # typed prompts.
    thread = parse("claude_task_notifications.jsonl")

    assert [t.request for t in thread.turns] == [
        "Watch the test run and tell me when it ends.",
        "Thanks. Now make the slow test faster.",
    ]
    # The answers to the notifications (and to one written without an origin) serve the
    # request that started the monitor.
    assert thread.turns[0].usage == TokenUsage(input_tokens=55, output_tokens=42)
    assert thread.turns[0].final_answer == "The monitor stopped."
    assert thread.turns[1].usage == TokenUsage(input_tokens=20, output_tokens=30)
    assert thread.problems == []


def test_a_typed_command_is_a_request_and_claude_codes_own_commands_are_not() -> None:
    thread = parse("claude_commands.jsonl")

    # /model and /compact ran in Claude Code (their output is Claude Code's own); the
    # skill with its arguments, a typed prompt and a command without arguments went to
    # the model.
    assert [t.request for t in thread.turns] == [
        "/review-plan check the retry logic in fetch.py",
        "Fix the first risk.",
        "/ship",
    ]
    assert [t.index for t in thread.turns] == [0, 1, 2]
    assert [t.message_uuid for t in thread.turns] == ["k-u4", "k-u6", "k-u7"]
    assert thread.title == "/review-plan check the retry logic in fetch.py"
    # What the agent got: the command as recorded, then its expansion.
    sent = thread.turns[0].request_as_sent
    assert sent.startswith("<command-message>review-plan</command-message>")
    assert sent.endswith("ARGUMENTS: check the retry logic in fetch.py")
    assert "# Review a plan" in sent
    assert thread.turns[1].request_as_sent == ""
    assert thread.turns[2].request_as_sent.endswith("\n\nCommit the change and push the branch.")
    # No usage is lost: the skill's work is its own turn's, not the thread's.
    assert thread.turns[0].usage_by_model == {SONNET: TokenUsage(100, 50, 2000, 0, 300)}
    assert thread.turns[2].usage == TokenUsage(30, 10, 2400, 0, 0)
    assert thread.pre_turn_usage_by_model == {}


def test_work_before_the_first_request_is_kept_on_the_thread() -> None:
    thread = parse("claude_work_before_first_request.jsonl")

    assert [t.request for t in thread.turns] == ["Check the deploy log for warnings."]
    assert thread.turns[0].usage == TokenUsage(5, 11, 600, 0, 0)
    # Before: the answer to the notification that opened the session served no turn and
    # was dropped. Now it is the thread's, so its totals hold every usage in the file.
    assert thread.pre_turn_usage_by_model == {SONNET: TokenUsage(7, 9, 500, 0, 100)}


def test_ide_blocks_are_kept_as_sent_but_left_out_of_requests_and_titles() -> None:
    thread = parse("claude_ide_context.jsonl")

    assert thread.title == "Why does parse() drop the last row?"
    assert [t.request for t in thread.turns] == [
        "Why does parse() drop the last row?",
        "Make it keep the last row.",
    ]
    first, second = (t.request_as_sent for t in thread.turns)
    assert first.startswith("<ide_opened_file>The user opened the file /home/dev/csvkit/src/")
    assert first.endswith("</ide_opened_file>\nWhy does parse() drop the last row?")
    assert "<ide_selection>" in second and "<system-reminder>" in second
    assert "Make it keep the last row." in second


def test_a_prompt_of_nothing_but_ide_blocks_stays_whole(tmp_path: Path) -> None:
    text = "<ide_opened_file>The user opened the file a.py in the IDE.</ide_opened_file>"
    path = tmp_path / "s.jsonl"
    path.write_text(
        json.dumps(
            {"type": "user", "uuid": "u1", "sessionId": "s", "timestamp": "2026-01-02T03:00:00Z",
             "message": {"role": "user", "content": text}}
        )
        + "\n"
    )  # fmt: skip

    (turn,) = parse_transcript(path).turns

    assert (turn.request, turn.request_as_sent) == (text, "")


def test_a_proxys_partial_usage_gives_way_to_the_final_figures() -> None:
    # glm-5 through a proxy, no requestId: each response's first line carries an input
    # estimate and no output, the later lines the final figures.
    thread = parse("claude_proxy_partial_usage.jsonl")

    (turn,) = thread.turns
    assert turn.usage_by_model == {
        "glm-5": TokenUsage(input_tokens=4900 + 5350, output_tokens=120 + 45)
    }


def test_long_requests_are_counted_apart_for_long_context_prices(tmp_path: Path) -> None:
    lines = [
        {"type": "user", "uuid": "u1", "sessionId": "s", "timestamp": "2026-01-02T03:00:00Z",
         "message": {"role": "user", "content": "Read the whole repository."}},
    ]  # fmt: skip
    # Three responses: 150k, 210k and 280k of input (cache reads and writes included).
    for number, (read, write) in enumerate([(140_000, 9_990), (200_000, 9_990), (270_000, 9_990)]):
        lines.append(
            {"type": "assistant", "uuid": f"a{number}", "sessionId": "s", "requestId": f"r{number}",
             "timestamp": f"2026-01-02T03:00:0{number + 1}Z",
             "message": {"id": f"m{number}", "model": "claude-sonnet-4-5", "content": [],
                         "usage": {"input_tokens": 10, "output_tokens": 100,
                                   "cache_read_input_tokens": read,
                                   "cache_creation_input_tokens": write}}}
        )  # fmt: skip
    path = tmp_path / "s.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))

    (turn,) = parse_transcript(path).turns

    one = [TokenUsage(10, 100, read, write, 0) for read, write in
           [(140_000, 9_990), (200_000, 9_990), (270_000, 9_990)]]  # fmt: skip
    assert turn.usage == one[0] + one[1] + one[2]
    assert turn.long_context_usage == {
        "claude-sonnet-4-5": {
            32_000: one[0] + one[1] + one[2],
            100_000: one[0] + one[1] + one[2],
            128_000: one[0] + one[1] + one[2],
            200_000: one[1] + one[2],
            256_000: one[2],
            272_000: one[2],
        }
    }


# --- refusing whole files (parse_transcript, detect_kind) ----------------------------------


@pytest.mark.parametrize(
    "name",
    [
        "not_a_transcript_readme.md",
        "not_a_transcript_random.json",
        "not_a_transcript_objects.jsonl",
    ],
)
def test_files_that_are_not_transcripts_are_refused_by_name(name: str) -> None:
    with pytest.raises(
        TranscriptError,
        match=f"{name} is not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi",
    ):
        parse_transcript(EDGE / name)


@pytest.mark.parametrize("name", ["empty.jsonl", "blank_lines.jsonl"])
def test_empty_files_are_refused(name: str) -> None:
    with pytest.raises(TranscriptError, match=f"{name} is empty"):
        parse_transcript(EDGE / name)


def test_files_larger_than_the_limit_are_refused_before_reading() -> None:
    path = EDGE / "claude_tool_result.jsonl"
    with pytest.raises(TranscriptError, match="larger than the limit of 100 bytes"):
        parse_transcript(path, max_bytes=100)
    with pytest.raises(TranscriptError, match="larger than the limit"):
        parse_claude_code(path, max_bytes=100)


def test_binary_files_are_refused_as_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "picture.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe" * 10)

    with pytest.raises(TranscriptError, match="picture.png is not UTF-8 text"):
        parse_transcript(path)


def test_a_line_that_is_not_utf8_inside_a_transcript_is_a_problem(tmp_path: Path) -> None:
    lines = (EDGE / "claude_tool_result.jsonl").read_bytes().splitlines(keepends=True)
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"".join([lines[0], b'{"type": "user", "x": "\xff\xfe"}\n', *lines[1:]]))

    thread = parse_transcript(path)

    assert thread.problems == [LineProblem(2, "line is not UTF-8 text")]
    assert [t.request for t in thread.turns] == ["List the files."]


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TranscriptError, match="gone.jsonl cannot be read"):
        parse_transcript(tmp_path / "gone.jsonl")


def test_a_byte_order_mark_and_crlf_line_ends_are_accepted(tmp_path: Path) -> None:
    text = (EDGE / "claude_tool_result.jsonl").read_text().replace("\n", "\r\n")
    path = tmp_path / "windows.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())

    thread = parse_transcript(path)

    assert thread.problems == []
    assert [t.request for t in thread.turns] == ["List the files."]


def test_detect_kind_reads_claude_files_from_their_first_lines(tmp_path: Path) -> None:
    assert (
        detect_kind(EDGE / "claude_compaction.jsonl") == "claude_code"
    )  # starts with a summary line
    assert detect_kind(EDGE / "claude_only_meta.jsonl") == "claude_code"
    # A line of a type newer than the parser still reads as Claude by its ids.
    path = tmp_path / "future.jsonl"
    path.write_text('{"type": "hologram", "sessionId": "s", "uuid": "u"}\n')
    assert detect_kind(path) == "claude_code"


def test_parse_claude_code_refuses_a_codex_file() -> None:
    with pytest.raises(TranscriptError, match="is not a Claude Code transcript"):
        parse_claude_code(EDGE / "codex_new_format.jsonl", max_bytes=MIB)


def test_copying_a_session_without_its_subagents_folder_still_parses(tmp_path: Path) -> None:
    source = EDGE / "claude_subagents" / f"{SUBAGENT_SESSION}.jsonl"
    shutil.copy(source, tmp_path / source.name)

    thread = parse_transcript(tmp_path / source.name)

    assert thread.problems == []
    assert len(thread.turns) == 3


# --- the fast path and the general path read every line the same way ----------------
#
# Most lines are decoded by msgspec into Structs of the fields the parser reads (the fast
# path); any other line is read as its JSON value (the general path). Parsing a file with
# the fast path switched off must give exactly the same thread, problems included.

CLAUDE_FILES = sorted(
    [REAL / s["path"] for s in real_sessions()]
    + [p for p in EDGE.glob("claude_*.jsonl")]
    + [EDGE / "claude_subagents" / f"{SUBAGENT_SESSION}.jsonl"]
)


def both_ways(path: Path) -> tuple[object, object]:
    """The thread (as a dict) or the refusal, with the fast path and without it."""

    def outcome() -> object:
        try:
            return dataclasses.asdict(parse_claude_code(path, max_bytes=MIB))
        except TranscriptError as exc:
            return f"refused: {exc}"

    fast = outcome()
    decoder = claude_code._LINE_DECODER
    claude_code._LINE_DECODER = None
    try:
        general = outcome()
    finally:
        claude_code._LINE_DECODER = decoder
    return fast, general


@pytest.mark.parametrize("path", CLAUDE_FILES, ids=lambda p: p.name)
def test_the_fast_path_reads_every_fixture_as_the_general_path_does(path: Path) -> None:
    fast, general = both_ways(path)
    assert fast == general


def test_the_fast_path_reads_nearly_every_line_of_a_real_transcript() -> None:
    path = REAL / real_sessions()[0]["path"]
    lines = claude_code.JsonLines(path, max_bytes=MIB, decoder=claude_code._LINE_DECODER)
    decoded = [type(value) is claude_code._Line for _, value in lines]
    assert sum(decoded) >= 0.95 * len(decoded) > 0


# Lines the fast path must leave to the general one, or read as it would: each is put
# into a real transcript after its first prompt.
HOSTILE_LINES = {
    "NUL escaped in a prompt": b'{"type":"user","message":{"role":"user","content":"a\\u0000b"},'
    b'"uuid":"h1","timestamp":"2026-01-02T03:00:00.000Z","sessionId":"s"}',
    "lone surrogate in a prompt": b'{"type":"user","message":{"role":"user","content":"a\\ud83db"},'
    b'"uuid":"h2","timestamp":"2026-01-02T03:00:00.000Z","sessionId":"s"}',
    "bytes not UTF-8 in a skipped field": b'{"type":"system","skipped":"\xff\xfe",'
    b'"timestamp":"2026-01-02T03:00:00.000Z"}',
    "an integer json refuses in a skipped field": b'{"type":"system","skipped":'
    + b"9" * 4301
    + b',"timestamp":"2026-01-02T03:00:00.000Z"}',
    "raw NUL in a skipped field": b'{"type":"system","skipped":"a\x00b"}',
    "nested deeper than json reads": b'{"type":"system","x":' + b"[" * 1100 + b"]" * 1100 + b"}",
    "a count that is a float": b'{"type":"assistant","message":{"id":"m1","model":"claude-x",'
    b'"usage":{"input_tokens":5.0,"output_tokens":2}},"requestId":"r1",'
    b'"timestamp":"2026-01-02T03:00:01.000Z"}',
    "a count past the bound": b'{"type":"assistant","message":{"id":"m2","model":"claude-x",'
    b'"usage":{"input_tokens":1000000000001}},"requestId":"r2",'
    b'"timestamp":"2026-01-02T03:00:01.000Z"}',
    "a timestamp out of range": b'{"type":"user","message":{"role":"user","content":"x"},'
    b'"uuid":"h3","timestamp":"1969-12-31T23:59:59.000Z"}',
    "a timestamp with an offset": b'{"type":"user","message":{"role":"user","content":"x"},'
    b'"uuid":"h4","timestamp":"2026-01-02T05:00:00+02:00"}',
    "a null timestamp": b'{"type":"user","message":{"role":"user","content":"x"},"timestamp":null}',
    "a null AI title beside a title": b'{"type":"ai-title","aiTitle":null,"title":"T","sessionId":"s"}',
    "a key spelt with an escape": b'{"typ\\u0065":"custom-title","customTitle":"Escaped"}',
    "a repeated key": b'{"type":"custom-title","customTitle":"First","customTitle":"Second"}',
    "a block that is not an object": b'{"type":"user","message":{"role":"user","content":'
    b'[{"type":"text","text":"a"},7]},"timestamp":"2026-01-02T03:00:00.000Z"}',
    "a tool input that is not an object": b'{"type":"assistant","message":{"id":"m3",'
    b'"model":"claude-x","content":[{"type":"tool_use","id":"t1","name":"Read","input":[1]}]},'
    b'"timestamp":"2026-01-02T03:00:01.000Z"}',
    "a line cut short": b'{"type":"user","message":{"role":"user","content":"cut',
}


@pytest.mark.parametrize("name", HOSTILE_LINES)
def test_the_fast_path_reads_a_hostile_line_as_the_general_path_does(
    name: str, tmp_path: Path
) -> None:
    source = REAL / real_sessions()[0]["path"]
    lines = source.read_bytes().splitlines(keepends=True)
    first_prompt = next(
        n
        for n, line in enumerate(lines)
        if b'"type":"user"' in line and b"toolUseResult" not in line
    )
    lines.insert(first_prompt + 1, HOSTILE_LINES[name] + b"\n")
    path = tmp_path / source.name
    path.write_bytes(b"".join(lines))

    fast, general = both_ways(path)

    assert fast == general
    assert isinstance(fast, dict)
    text = json.dumps(fast, default=str)
    assert "\\u0000" not in text and "\\ud83d" not in text  # cleaned, as before


def test_bad_lines_the_fast_path_cannot_judge_are_still_reported(tmp_path: Path) -> None:
    source = REAL / real_sessions()[0]["path"]
    lines = source.read_bytes().splitlines(keepends=True)
    for name in (
        "bytes not UTF-8 in a skipped field",
        "an integer json refuses in a skipped field",
        "raw NUL in a skipped field",
        "nested deeper than json reads",
    ):
        lines.insert(2, HOSTILE_LINES[name] + b"\n")
    path = tmp_path / source.name
    path.write_bytes(b"".join(lines))

    thread = parse_claude_code(path, max_bytes=MIB)

    assert [(p.line_number, p.message) for p in thread.problems] == [
        (3, "invalid JSON: nested too deeply"),
        (4, "line is not UTF-8 text"),
        (5, "invalid JSON: a number too long to read"),
        (6, "line is not UTF-8 text"),
    ]


@st.composite
def mutated_transcript(draw: st.DrawFn) -> bytes:
    """A real transcript with a few values replaced by odd ones, lines inserted or cut."""
    source = draw(st.sampled_from([REAL / s["path"] for s in real_sessions()]))
    lines = source.read_bytes().splitlines(keepends=True)
    odd = st.one_of(
        st.sampled_from(
            [None, True, 0, -1, 1.5, 10**12 + 1, 2**64, "", "x", "\x00", "\ud83d", [], {}]
        ),
        st.text(max_size=8),
        st.integers(),
    )
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        where = draw(st.integers(min_value=0, max_value=len(lines) - 1))
        operation = draw(st.sampled_from(["replace", "replace", "insert", "cut"]))
        if operation == "insert":
            lines.insert(where, draw(st.sampled_from(list(HOSTILE_LINES.values()))) + b"\n")
            continue
        if operation == "cut":
            lines[where] = lines[where][: draw(st.integers(0, len(lines[where])))] + b"\n"
            continue
        try:
            value = json.loads(lines[where])
        except ValueError:
            continue
        slots = []
        pending = [value]
        while pending:
            container = pending.pop()
            keys = container.keys() if isinstance(container, dict) else range(len(container))
            for key in keys:
                slots.append((container, key))
                if isinstance(container[key], (dict, list)):
                    pending.append(container[key])
        if slots:
            container, key = draw(st.sampled_from(slots))
            container[key] = draw(odd)
            lines[where] = json.dumps(value, separators=(",", ":")).encode() + b"\n"
    return b"".join(lines)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(content=mutated_transcript())
def test_the_fast_path_reads_mutated_transcripts_as_the_general_path_does(content: bytes) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "session.jsonl"
        path.write_bytes(content)
        fast, general = both_ways(path)
    assert fast == general


# --- every line kind real files hold (Claude Code 1.0 to 2.1.x) -------------------------

LINE_KINDS = (
    "mode", "agent-name", "custom-title", "attachment", "queue-operation", "ai-title",
    "progress", "permission-mode", "last-prompt", "file-history-snapshot", "system",
)  # fmt: skip


def turns_of(thread: Any) -> list[tuple[object, ...]]:
    return [
        (t.request, t.usage_by_model, t.final_answer, t.evidence.items, t.last_answer_at)
        for t in thread.turns
    ]


@pytest.mark.parametrize("kind", LINE_KINDS)
def test_each_line_kind_of_real_files_is_read_and_makes_no_turn(kind: str, tmp_path: Path) -> None:
    source = EDGE / "claude_line_kinds.jsonl"
    lines = source.read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["type"] != kind]
    assert len(kept) < len(lines), f"the fixture has no {kind} line"
    path = tmp_path / source.name
    path.write_text("\n".join(kept) + "\n")

    thread, without = parse_transcript(source), parse_transcript(path)

    assert thread.problems == [] and without.problems == []
    assert thread.lines_read == len(lines)
    # The lines of the kind change no request, usage, answer or evidence...
    assert turns_of(thread) == turns_of(without)
    assert [t.request for t in thread.turns] == ["Map the public API of atlas."]
    # ...and only the two title kinds change the title.
    if kind not in ("custom-title", "ai-title"):
        assert without.title == thread.title


def test_a_custom_title_wins_over_the_ai_title_and_an_agent_name_is_no_title() -> None:
    thread = parse("claude_line_kinds.jsonl")

    assert thread.title == "Atlas API map"  # /rename's custom-title
    assert (thread.cli_version, thread.cwd) == ("2.1.185", "/home/dev/atlas")
    # A prompt typed while the agent worked, handed over as a queued_command attachment,
    # is part of the running turn (its usage and answer), not a turn of its own.
    (turn,) = thread.turns
    assert turn.usage == TokenUsage(42, 55, 8200, 0, 200)
    assert turn.final_answer == "Two public functions: load and save."
