"""The JSONL transcript parsers (Claude Code, Codex, Gemini CLI, pi), and the import on top
of them, fuzzed with hypothesis.

Each example is a real fixture file (tests/fixtures/transcripts/real/) with a few
lines mutated: a value somewhere in a line replaced by a hostile one (huge or
non-integral counts, lone surrogates, NUL, out-of-range timestamps, long ids,
containers where strings belong), random lines inserted, lines dropped, repeated
or cut short. Whatever comes out, no exception but TranscriptError escapes the
parser, none at all escapes the import, a failed import leaves no thread, and
every line is counted once.

Small enough for CI (a few seconds per parser) and repeatable there: the examples
are derived from the test, not drawn at random each run. To search wider locally,
raise max_examples and drop derandomize.
"""

from __future__ import annotations

import io
import json
import shutil
import tempfile
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replays import importing
from replays.models import TOKEN_FIELDS, Thread
from replays.transcripts import TranscriptError, parse_transcript
from replays.transcripts.base import MAX_MESSAGE_ID_CHARS, MAX_THREAD_TOKENS, ParsedThread
from replays.transcripts.claude_code import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from tests.conftest import REAL_TRANSCRIPTS, importer

MANIFEST = json.loads((REAL_TRANSCRIPTS / "manifest.json").read_text())
REAL_FILES = {
    kind: [
        (
            REAL_TRANSCRIPTS / s["path"],
            [REAL_TRANSCRIPTS / p for p in s.get("subagent_paths") or []],
        )
        for s in MANIFEST["sessions"]
        if s["kind"] == kind
    ]
    for kind in ("claude_code", "codex", "gemini", "pi")
}

PARSER_EXAMPLES = 120
IMPORT_EXAMPLES = 25


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,  # nothing written under the work tree
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


# Field names both formats use, so that inserted lines often look like real ones.
KEYS = [
    "type", "timestamp", "uuid", "sessionId", "message", "usage", "model", "id", "requestId",
    "content", "text", "role", "isSidechain", "costUSD", "cwd", "gitBranch", "version",
    "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens",
    "cache_creation", "ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens", "payload",
    "info", "total_token_usage", "last_token_usage", "cached_input_tokens", "turn_id",
    "response_id", "item", "item_type", "images", "kind", "cli_version", "git",
    # Gemini CLI's and pi's
    "tokens", "cached", "thoughts", "tool", "total", "toolCalls", "$set", "$rewindTo",
    "projectHash", "displayContent", "startTime", "cacheRead", "cacheWrite", "totalTokens",
    "cost", "toolCallId", "parentId", "arguments", "args", "status",
]  # fmt: skip
LINE_TYPES = [
    "user", "assistant", "summary", "ai-title", "session_meta", "turn_context", "event_msg",
    "response_item", "token_usage_record", "user_message", "item_completed", "UserMessage",
    "token_count", "task_started", "message", "function_call_output",
    "gemini", "info", "session", "model_change", "toolResult", "toolCall",
]  # fmt: skip
HOSTILE_SCALARS = [
    10**12, 10**12 + 1, 10**13, 2**63 - 1, 2**63, 2**64, -1, 1e300, -0.0, 0.5,
    float("inf"), float("nan"), "\ud83d", "\udc00 half", "a\x00b", "\x00",
    "0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00", "1969-12-31T23:59:59Z",
    "2026-11-29T20:48:39.000Z", "x" * 250, "line-1", "../../..", "", " ",
]  # fmt: skip

scalars = st.one_of(
    st.sampled_from(HOSTILE_SCALARS),
    st.sampled_from(LINE_TYPES),
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),
    st.text(max_size=30),
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), children, max_size=5)
    ),
    max_leaves=12,
)


def _slots(value: Any) -> list[tuple[Any, Any]]:
    """Every (container, key) inside a JSON value, so one can be replaced."""
    found: list[tuple[Any, Any]] = []
    pending = [value]
    while pending:
        container = pending.pop()
        keys = container.keys() if isinstance(container, dict) else range(len(container))
        for key in keys:
            found.append((container, key))
            if isinstance(container[key], (dict, list)):
                pending.append(container[key])
    return found


@st.composite
def mutated_lines(draw: st.DrawFn, original: bytes) -> bytes:
    lines = original.splitlines(keepends=True)
    for _ in range(draw(st.integers(min_value=1, max_value=5))):
        where = draw(st.integers(min_value=0, max_value=max(len(lines) - 1, 0)))
        operation = draw(
            st.sampled_from(
                ["replace", "replace", "replace", "insert", "raw", "drop", "repeat", "cut"]
            )
        )
        if operation == "replace" and lines:
            try:
                value = json.loads(lines[where])
            except ValueError:
                continue
            slots = _slots(value) if isinstance(value, (dict, list)) else []
            if slots:
                container, key = draw(st.sampled_from(slots))
                container[key] = draw(json_values)
            else:
                value = draw(json_values)
            lines[where] = json.dumps(value).encode() + b"\n"
        elif operation == "insert":
            lines.insert(where, json.dumps(draw(json_values)).encode() + b"\n")
        elif operation == "raw":
            raw = draw(st.binary(max_size=40) | st.text(max_size=40).map(_utf8))
            lines.insert(where, raw + b"\n")
        elif operation == "drop" and lines:
            del lines[where]
        elif operation == "repeat" and lines:
            lines.insert(where, lines[where])
        elif operation == "cut" and lines:
            line = lines[where]
            lines[where] = line[: draw(st.integers(min_value=0, max_value=len(line)))]
    return b"".join(line if line.endswith(b"\n") else line + b"\n" for line in lines[:-1]) + (
        lines[-1] if lines else b""
    )


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@st.composite
def transcripts(draw: st.DrawFn, kind: str) -> tuple[Path, bytes, list[tuple[Path, bytes]]]:
    """A real file of `kind`, mutated; for Claude Code its sub-agent files too, mutated or not."""
    path, subagents = draw(st.sampled_from(REAL_FILES[kind]))
    content = draw(mutated_lines(path.read_bytes()))
    sub_files = []
    for sub in subagents:
        sub_content = sub.read_bytes()
        if draw(st.booleans()):
            sub_content = draw(mutated_lines(sub_content))
        sub_files.append((sub, sub_content))
    return path, content, sub_files


def write_transcript(folder: Path, example: tuple[Path, bytes, list[tuple[Path, bytes]]]) -> Path:
    path, content, sub_files = example
    target = folder / path.name
    target.write_bytes(content)
    for sub, sub_content in sub_files:
        sub_target = folder / sub.relative_to(path.parent)
        sub_target.parent.mkdir(parents=True, exist_ok=True)
        sub_target.write_bytes(sub_content)
    return target


def non_blank_lines(content: bytes) -> int:
    """The lines the reader counts: as iterating the file gives them, BOM and blanks aside."""
    count = 0
    for number, raw in enumerate(io.BytesIO(content), start=1):
        if number == 1:
            raw = raw.removeprefix(b"\xef\xbb\xbf")
        count += bool(raw.strip())
    return count


def check_parsed(thread: ParsedThread, content: bytes) -> None:
    lines = non_blank_lines(content)
    total_lines = len(io.BytesIO(content).readlines())
    assert thread.lines_read == lines
    # Every bad line of the main file is reported once, with its own line number.
    main = [p.line_number for p in thread.problems if "/subagents/" not in p.message]
    assert len(main) == len(set(main))
    assert all(1 <= number <= total_lines for number in main)
    assert all(p.message for p in thread.problems)

    assert [turn.index for turn in thread.turns] == list(range(len(thread.turns)))
    ids = [turn.message_uuid for turn in thread.turns]
    assert len(set(ids)) == len(ids)
    assert all(0 < len(uuid) <= MAX_MESSAGE_ID_CHARS for uuid in ids)
    texts = [thread.session_id, thread.title, thread.cwd, thread.git_branch, thread.cli_version]
    for turn in thread.turns:
        texts += [turn.request, turn.message_uuid, *turn.models]
        assert EARLIEST_TIMESTAMP <= turn.timestamp < LATEST_TIMESTAMP
    for text in texts:
        assert "\x00" not in text
        text.encode("utf-8")  # no lone surrogate
    for kind in TOKEN_FIELDS:
        counts = [getattr(u, kind) for t in thread.turns for u in t.usage_by_model.values()]
        counts += [getattr(u, kind) for u in thread.pre_turn_usage_by_model.values()]
        assert all(count >= 0 for count in counts)
        assert sum(counts) <= MAX_THREAD_TOKENS


def parse_or_refuse(path: Path) -> ParsedThread | None:
    try:
        return parse_transcript(path)
    except TranscriptError as exc:
        assert str(exc)
        return None


# --- the parsers alone: many examples --------------------------------------------------


@pytest.mark.parametrize("kind", ["claude_code", "codex", "gemini", "pi"])
def test_a_parser_only_ever_reports_bad_lines_or_refuses_the_file(kind: str) -> None:
    @fuzz_settings(PARSER_EXAMPLES)
    @given(example=transcripts(kind))
    def check(example: tuple[Path, bytes, list[tuple[Path, bytes]]]) -> None:
        with tempfile.TemporaryDirectory() as folder:
            path = write_transcript(Path(folder), example)
            thread = parse_or_refuse(path)
            if thread is not None:
                check_parsed(thread, example[1])

    check()


# --- the whole import: fewer examples, each against the database -----------------------


@pytest.mark.django_db
@pytest.mark.parametrize("kind", ["claude_code", "codex", "gemini", "pi"])
def test_an_import_never_crashes_and_never_half_writes_a_thread(kind: str, api_client: Any) -> None:
    @fuzz_settings(IMPORT_EXAMPLES)
    @given(example=transcripts(kind))
    def check(example: tuple[Path, bytes, list[tuple[Path, bytes]]]) -> None:
        folder = Path(tempfile.mkdtemp())
        try:
            path = write_transcript(folder, example)
            with transaction.atomic():
                import_and_check(path, example[1], api_client)
                transaction.set_rollback(True)  # the next example starts from no thread
        finally:
            shutil.rmtree(folder)

    check()


def import_and_check(path: Path, content: bytes, api_client: Any) -> None:
    result = importing.import_transcript_file(path=path, user=importer())
    summary = importing.ImportSummary()
    summary.add(result)
    assert summary.files == 1
    assert summary.lines_skipped == len(result.problems)
    if result.outcome == "failed":
        assert path.name in result.error
        assert Thread.objects.count() == 0
        return
    assert result.outcome == "new"
    thread = Thread.objects.get()
    turns = list(thread.turns.all())
    assert len(turns) == thread.turn_count == result.turns
    # The thread counts every usage: its turns' and the work before its first turn.
    for kind in TOKEN_FIELDS:
        before = sum(usage[kind] for usage in thread.pre_turn_usage_by_model.values())
        assert getattr(thread, kind) == sum(getattr(turn, kind) for turn in turns) + before
    costs = [turn.cost_usd for turn in turns] + [thread.pre_turn_cost_usd]
    if None not in costs:
        # Each figure is stored rounded to micro-dollars; the thread's from its exact sum.
        assert abs(thread.cost_usd - sum(costs)) <= Decimal("0.000001") * len(costs)
    else:
        assert thread.cost_usd is None
    check_parsed(parse_transcript(path), content)
    # What broke for everyone once: the list reads every row back.
    assert api_client.get("/api/threads/").status_code == 200
