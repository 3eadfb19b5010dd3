"""Codex CLI session files -> ParsedThread.

Plain Python (no database): runs with or without the Django plugin.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from replays.transcripts import (
    LineProblem,
    TokenUsage,
    TranscriptError,
    detect_kind,
    parse_codex,
    parse_transcript,
)

FIXTURES = Path(__file__).parent / "fixtures" / "transcripts"
REAL = FIXTURES / "real"
EDGE = FIXTURES / "edge"
SESSION = "0199a000-1111-7222-8333-444444444444"
MIB = 1024 * 1024


def parse(name: str) -> Any:
    return parse_transcript(EDGE / name)


def at(seconds: float) -> datetime:
    """Times in the hand-made files: 2026-01-02T03:00:00Z plus ``seconds``."""
    whole = int(seconds)
    return datetime(
        2026, 1, 2, 3, whole // 60, whole % 60, round((seconds - whole) * 1e6), tzinfo=UTC
    )


def codex_usage(raw: dict[str, int]) -> TokenUsage:
    """Codex's own figures (input includes cached) in our disjoint kinds."""
    cached = raw["cached_input_tokens"]
    return TokenUsage(
        input_tokens=raw["input_tokens"] - cached,
        cache_read_tokens=cached,
        output_tokens=raw["output_tokens"],  # reasoning is already inside output
    )


# --- real session files written by codex 0.169.0 --------------------------------------


def real_sessions() -> list[dict[str, Any]]:
    manifest = REAL / "manifest.json"
    if not manifest.exists():
        return []
    sessions = json.loads(manifest.read_text())["sessions"]
    return [s for s in sessions if s["kind"] == "codex"]


@pytest.mark.parametrize("session", real_sessions(), ids=lambda s: s["name"])
def test_real_session_file_matches_the_manifest(session: dict[str, Any]) -> None:
    thread = parse_transcript(REAL / session["path"])

    assert thread.kind == "codex"
    assert thread.session_id == session["session_id"]
    assert thread.cwd == session["cwd"]
    assert thread.git_branch == session["branch"]
    assert thread.git_commit == session["turns"][0]["head_before"]  # Codex records the commit
    assert thread.cli_version == "0.169.0"
    assert thread.problems == []
    assert [t.request for t in thread.turns] == [t["request"] for t in session["turns"]]
    assert thread.title == session["turns"][0]["request"]
    assert len({t.message_uuid for t in thread.turns}) == len(thread.turns)
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        assert turn.usage_by_model == {session["model"]: codex_usage(expected["usage"])}
        assert turn.last_answer_at is not None and turn.last_answer_at > turn.timestamp
        assert turn.recorded_cost_usd is None  # Codex reports no cost


@pytest.mark.parametrize("session", real_sessions(), ids=lambda s: s["name"])
def test_real_usage_is_the_same_from_token_count_totals_alone(
    session: dict[str, Any], tmp_path: Path
) -> None:
    # 0.169.0 and later write a token_usage_record per response; older releases only
    # token_count events. Without the records the totals give the same figures.
    lines = (REAL / session["path"]).read_text().splitlines()
    path = tmp_path / Path(session["path"]).name
    path.write_text("".join(line + "\n" for line in lines if '"token_usage_record"' not in line))

    from_records = parse_transcript(REAL / session["path"])
    from_totals = parse_transcript(path)

    assert [t.usage_by_model for t in from_totals.turns] == [
        t.usage_by_model for t in from_records.turns
    ]


@pytest.mark.parametrize("session", real_sessions(), ids=lambda s: s["name"])
def test_real_turn_ids_are_the_message_uuids(session: dict[str, Any]) -> None:
    thread = parse_transcript(REAL / session["path"])
    turn_ids = [
        json.loads(line)["payload"]["turn_id"]
        for line in (REAL / session["path"]).read_text().splitlines()
        if '"turn_context"' in line and json.loads(line)["type"] == "turn_context"
    ]
    assert [t.message_uuid for t in thread.turns] == list(dict.fromkeys(turn_ids))


# --- hand-made edge cases ------------------------------------------------------------


def test_new_format_uses_turn_ids_and_counts_each_prompt_once() -> None:
    thread = parse("codex_new_format.jsonl")

    assert thread.problems == []
    assert thread.session_id == SESSION
    assert (thread.git_commit, thread.git_branch, thread.repository_url) == (
        "def456",
        "feature/x",
        "",
    )
    assert thread.cli_version == "0.169.0"
    # Each prompt is written as a response_item and an item_completed UserMessage;
    # the developer message and <environment_context> are not prompts.
    assert [t.request for t in thread.turns] == ["Add a char_count function.", "Now document it."]
    assert [t.message_uuid for t in thread.turns] == [
        "0199a000-aaaa-7000-8000-000000000001",
        "0199a000-aaaa-7000-8000-000000000002",
    ]
    first, second = thread.turns
    # Totals 1000/0/50 then 2200/900/80: input minus cached is what is left uncached.
    assert first.usage_by_model == {
        "gpt-5.5": TokenUsage(input_tokens=1300, cache_read_tokens=900, output_tokens=80)
    }
    # The model comes from the latest turn_context; the repeated total adds nothing.
    assert second.usage_by_model == {
        "gpt-5.3-codex": TokenUsage(input_tokens=200, cache_read_tokens=1100, output_tokens=20)
    }
    assert first.timestamp == at(0.6)
    assert first.last_answer_at == at(2.1)
    assert second.last_answer_at == at(11)
    assert (thread.started_at, thread.ended_at) == (at(0), at(11.5))


def test_duplicate_token_count_events_do_not_double_count() -> None:
    thread = parse("codex_duplicate_token_count.jsonl")

    first, second, third = thread.turns
    # 500/100/20, the same again, 1300/600/50 twice, then an event without info.
    assert first.usage == TokenUsage(input_tokens=700, cache_read_tokens=600, output_tokens=50)
    # The counter restarts at 400/300/10 (a new process): that event adds its
    # last_token_usage, and the next one its difference.
    assert second.usage == TokenUsage(input_tokens=200, cache_read_tokens=700, output_tokens=25)
    # Restarted again, now above the old total (2000 > 900): the total equals
    # the last request, so the whole request counts, not 2000 - 900.
    assert third.usage == TokenUsage(input_tokens=1000, cache_read_tokens=1000, output_tokens=60)
    assert [t.message_uuid for t in thread.turns] == [f"{SESSION}:{i}" for i in range(3)]


def test_old_format_with_user_message_events_and_old_field_names() -> None:
    thread = parse("codex_old_format.jsonl")

    assert thread.problems == []
    assert thread.repository_url == "git@example.com:demo.git"
    assert thread.cli_version == "0.46.0"
    assert [t.request for t in thread.turns] == ["Add a --verbose flag.", "Also document it."]
    # No token_count in files this old: no usage, but the turns and times are there.
    assert all(t.usage_by_model == {} for t in thread.turns)
    assert thread.turns[0].last_answer_at == at(4)  # the assistant_message event
    assert thread.turns[1].last_answer_at == at(6)


def test_oldest_format_takes_prompts_from_user_response_items() -> None:
    thread = parse("codex_response_items_only.jsonl")

    # <environment_context> and AGENTS.md instructions are injected, not typed.
    assert [t.request for t in thread.turns] == ["Fix the typo in main.py."]
    assert thread.turns[0].last_answer_at == at(2)


def test_bad_lines_are_reported_with_their_line_numbers() -> None:
    thread = parse("codex_bad_lines.jsonl")

    assert [p.line_number for p in thread.problems] == [4, 5, 6, 7, 8, 11]
    messages = dict((p.line_number, p.message) for p in thread.problems)
    assert messages[4] == "event_msg line has no payload object"
    assert messages[5] == "bad timestamp 'not a time'"
    assert messages[6].startswith("invalid JSON")
    assert messages[7] == "total_token_usage.input_tokens is not a number"
    assert messages[8] == "line is a JSON list, not an object"
    assert messages[11] == "item_completed event has no item object"
    assert [t.request for t in thread.turns] == ["Speed up the loop."]
    assert thread.turns[0].usage_by_model == {
        "gpt-5": TokenUsage(input_tokens=500, cache_read_tokens=200, output_tokens=40)
    }


def test_a_session_without_session_meta_takes_its_id_from_the_file_name(tmp_path: Path) -> None:
    path = tmp_path / "rollout-2026-01-02T03-00-00-0199b000-0000-7000-8000-00000000abcd.jsonl"
    path.write_text(
        json.dumps(
            {
                "timestamp": "2026-01-02T03:00:00Z",
                "type": "event_msg",
                "payload": {"type": "user_message", "message": "Hello"},
            }
        )
        + "\n"
    )

    thread = parse_transcript(path)

    assert thread.session_id == "0199b000-0000-7000-8000-00000000abcd"
    assert [t.message_uuid for t in thread.turns] == ["0199b000-0000-7000-8000-00000000abcd:0"]
    assert thread.turns[0].usage_by_model == {}


def test_token_usage_records_are_counted_once_per_response(tmp_path: Path) -> None:
    def line(seconds: int, type_: str, payload: dict[str, Any]) -> str:
        return json.dumps(
            {"timestamp": f"2026-01-02T03:00:{seconds:02d}Z", "type": type_, "payload": payload}
        )

    record = {
        "response_id": "resp_1",
        "turn_id": "t1",
        "usage": {
            "input_tokens": 1000,
            "cached_input_tokens": 400,
            "cache_write_input_tokens": 100,
            "output_tokens": 30,
            "reasoning_output_tokens": 10,
        },
    }
    path = tmp_path / "records.jsonl"
    path.write_text(
        "\n".join(
            [
                line(0, "turn_context", {"turn_id": "t1", "model": "gpt-5.5"}),
                line(
                    1,
                    "event_msg",
                    {
                        "type": "item_completed",
                        "turn_id": "t1",
                        "item": {
                            "type": "UserMessage",
                            "content": [{"type": "text", "text": "Go"}],
                        },
                    },
                ),
                line(2, "token_usage_record", record),
                line(3, "token_usage_record", record),  # written again: the same response
            ]
        )
        + "\n"
    )

    thread = parse_transcript(path)

    assert [t.message_uuid for t in thread.turns] == ["t1"]
    # Cache writes are taken out of input like cached reads, and priced as writes.
    assert thread.turns[0].usage_by_model == {
        "gpt-5.5": TokenUsage(
            input_tokens=500, cache_read_tokens=400, cache_write_5m_tokens=100, output_tokens=30
        )
    }


def test_a_codex_file_with_no_prompt_is_a_thread_without_turns(tmp_path: Path) -> None:
    path = tmp_path / "meta-only.jsonl"
    path.write_text(
        json.dumps(
            {
                "timestamp": "2026-01-02T03:00:00Z",
                "type": "session_meta",
                "payload": {"id": "s1", "cwd": "/w"},
            }
        )
        + "\n"
    )

    thread = parse_transcript(path)

    assert (thread.kind, thread.session_id, thread.turns, thread.title) == ("codex", "s1", [], "")


def test_detect_kind_recognises_codex_files() -> None:
    for name in ("codex_new_format.jsonl", "codex_old_format.jsonl", "codex_bad_lines.jsonl"):
        assert detect_kind(EDGE / name) == "codex"


def test_parse_codex_refuses_a_claude_file() -> None:
    with pytest.raises(TranscriptError, match="is not a Codex session file"):
        parse_codex(EDGE / "claude_tool_result.jsonl", max_bytes=MIB)


def test_parse_codex_refuses_files_over_the_limit() -> None:
    with pytest.raises(TranscriptError, match="larger than the limit of 10 bytes"):
        parse_codex(EDGE / "codex_new_format.jsonl", max_bytes=10)


def test_a_truncated_last_codex_line_is_a_problem(tmp_path: Path) -> None:
    text = (EDGE / "codex_duplicate_token_count.jsonl").read_text()
    path = tmp_path / "cut.jsonl"
    path.write_text(text + '{"timestamp": "2026-01-02T03:00:30Z", "type": "event_msg", "pay')
    line_count = text.count("\n") + 1

    thread = parse_transcript(path)

    assert [p.line_number for p in thread.problems] == [line_count]
    assert thread.problems == [LineProblem(line_count, thread.problems[0].message)]
    assert thread.problems[0].message.startswith("truncated last line")
    assert len(thread.turns) == 3


# --- what real sessions of other people showed (issue 18) ---------------------------


def test_a_rolled_back_turn_is_marked_and_its_usage_still_counted() -> None:
    thread = parse("codex_rolled_back.jsonl")

    assert [(t.request, t.rolled_back) for t in thread.turns] == [
        ("Draft the grant application [$apply](/skills/apply.md)", True),
        ("Draft the grant application", False),
    ]
    assert thread.turns[0].usage == TokenUsage(
        input_tokens=2100 - 900, cache_read_tokens=900, output_tokens=70
    )
    assert thread.turns[1].usage == TokenUsage(
        input_tokens=1200 - 900, cache_read_tokens=900, output_tokens=50
    )


def test_each_request_past_a_long_context_size_is_counted_by_its_own_input() -> None:
    thread = parse("codex_long_context.jsonl")

    (turn,) = thread.turns
    short = TokenUsage(input_tokens=50_000, cache_read_tokens=100_000, output_tokens=2_000)
    long_1 = TokenUsage(input_tokens=10_000, cache_read_tokens=270_000, output_tokens=1_000)
    long_2 = TokenUsage(input_tokens=10_000, cache_read_tokens=290_000, output_tokens=4_000)
    assert turn.usage_by_model == {"gpt-5.5": short + long_1 + long_2}
    # 280k and 300k of input passed 272k; the repeated total added nothing.
    assert turn.long_context_usage["gpt-5.5"][272_000] == long_1 + long_2
    assert turn.long_context_usage["gpt-5.5"][128_000] == short + long_1 + long_2
    assert 512_000 not in turn.long_context_usage["gpt-5.5"]


def test_usage_before_the_first_prompt_is_kept_on_the_thread(tmp_path: Path) -> None:
    lines = (EDGE / "codex_rolled_back.jsonl").read_text().splitlines()
    usage_line = next(line for line in lines if '"token_count"' in line)
    prompt = next(n for n, line in enumerate(lines) if '"user_message"' in line)
    # A token_count written before the first prompt (a resumed file's first lines).
    lines.insert(prompt, usage_line)
    path = tmp_path / "rollout.jsonl"
    path.write_text("\n".join(lines) + "\n")

    thread = parse_transcript(path)

    assert thread.pre_turn_usage_by_model == {"gpt-5.5": TokenUsage(1000, 40, 0, 0, 0)}
    assert len(thread.turns) == 2


@pytest.mark.parametrize(
    ("kind", "event"), [("world_state", None), ("event_msg", "thread_settings_applied")]
)
def test_codex_line_kinds_of_new_releases_are_read_and_change_nothing(
    kind: str, event: str | None, tmp_path: Path
) -> None:
    source = EDGE / "codex_line_kinds.jsonl"
    lines = source.read_text().splitlines()

    def of_kind(line: str) -> bool:
        value = json.loads(line)
        return value["type"] == kind and (event is None or value["payload"]["type"] == event)

    kept = [line for line in lines if not of_kind(line)]
    assert len(kept) < len(lines)
    path = tmp_path / source.name
    path.write_text("\n".join(kept) + "\n")

    thread, without = parse_transcript(source), parse_transcript(path)

    assert thread.problems == [] and thread.lines_read == len(lines)
    assert [(t.request, t.usage_by_model, t.final_answer) for t in thread.turns] == [
        (t.request, t.usage_by_model, t.final_answer) for t in without.turns
    ]
    assert thread.turns[0].usage_by_model == {
        "gpt-5.5": TokenUsage(input_tokens=1100, cache_read_tokens=800, output_tokens=70)
    }
    assert (thread.cli_version, thread.git_commit) == ("0.144.5", "fed321")
