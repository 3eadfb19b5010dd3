"""Claude Code transcripts (``~/.claude/projects/<slug>/<sessionId>.jsonl``) -> ParsedThread.

Also home of the JSONL line reader both parsers share (the Codex parser imports
it from here), so both refuse whole files and report bad lines the same way.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import sys
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import orjson

from replays.transcripts.base import (
    MAX_EVIDENCE_COMMAND_CHARS,
    MAX_LINE_COST_USD,
    MAX_LINE_TOKENS,
    MAX_THREAD_TOKENS,
    OUT_OF_RANGE,
    Evidence,
    LineProblem,
    ParsedThread,
    ParsedTurn,
    TokensOutOfRange,
    TokenUsage,
    TranscriptError,
    UsageBudget,
    add_request,
    kept_text,
    make_message_ids_unique,
    text_sha256,
)

KIND = "claude_code"
TITLE_MAX_CHARS = 120

# Line types Claude Code writes. Anything else is skipped silently: new releases
# add types often, and an unknown one must not make a transcript unimportable.
KNOWN_LINE_TYPES = frozenset(
    {
        "user",
        "assistant",
        "system",
        "summary",
        "attachment",
        "queue-operation",
        "file-history-snapshot",
        "last-prompt",
        "ai-title",
        "custom-title",
        "agent-name",
        "mode",
        "permission-mode",
        "progress",
    }
)

# Types other tools use too ("user", "summary"...): such a line reads as Claude
# Code's only with one of its ids, so a generic chat log is not taken for one.
_GENERIC_LINE_TYPES = frozenset(
    {"user", "assistant", "system", "summary", "attachment", "mode", "progress"}
)
_CLAUDE_IDS = ("sessionId", "uuid", "leafUuid")

# Written by Claude Code when an API call fails; it carries no real usage.
SYNTHETIC_MODEL = "<synthetic>"

# User lines that are Claude Code's own plumbing (slash-command echoes, local
# command output, `!` shell input/output, background tasks' notifications), not a
# request to the model. A typed command is the exception: see _typed_command.
_WRAPPER_RE = re.compile(
    r"^\s*<(command-[a-z-]+|local-command-[a-z-]+|bash-[a-z-]+|task-notification)>"
)
_INTERRUPT_PREFIX = "[Request interrupted by user"
# A slash command or skill as Claude Code records it: its name, and what was typed after it.
_COMMAND_NAME_RE = re.compile(r"<command-name>\s*(.*?)\s*</command-name>", re.DOTALL)
_COMMAND_ARGS_RE = re.compile(r"<command-args>(.*?)</command-args>", re.DOTALL)
# What a command Claude Code ran itself (/model, /status, /compact...) printed: that command
# was no request to the model.
_LOCAL_OUTPUT_RE = re.compile(r"^\s*<local-command-(?:stdout|stderr)>")
# Blocks an IDE (the VS Code extension) or Claude Code puts around what the user typed:
# the file open, the lines selected, reminders. The agent got them; the user did not type them.
_CONTEXT_BLOCK_RE = re.compile(r"<(ide_[a-z_]+|system-reminder)>.*?</\1>", re.DOTALL)
# Who wrote a user line (Claude Code 2.1.x): "human", or "task-notification" for the events
# a background task (the Monitor tool) hands the model. Only a person's line is a request.
_TYPED_ORIGIN = "human"

# Text json.loads can make that no database column takes: a lone surrogate (Node
# writes half an emoji as "\ud83d") and NUL (PostgreSQL refuses it in text and
# JSON). Both can only come from a \u escape, so only lines holding such an escape
# are walked; the reader cleans them once and nothing downstream sees them.
_UNSTORABLE_ESCAPE_RE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F][0-9a-fA-F]{2})")
_SURROGATE_RE = re.compile("[\ud800-\udfff]")

# Agent CLIs date from the 2020s. A time before the Unix epoch or in datetime's
# last year is damaged, and one near datetime's ends overflows as soon as a page
# shows it in another time zone or adds a day to it.
EARLIEST_TIMESTAMP = datetime(1970, 1, 1, tzinfo=UTC)
LATEST_TIMESTAMP = datetime(9999, 1, 1, tzinfo=UTC)


# --- shared line reading -----------------------------------------------------


class JsonLines:
    """The JSON values of a JSONL file, one per non-blank line.

    Whole-file problems (too large, empty, binary, unreadable) raise
    TranscriptError; a bad line becomes a LineProblem in ``problems`` and is
    skipped, so one damaged line never costs the rest of a session.

    With a msgspec ``decoder``, a line it can read comes as its Struct instead: the
    decoder skips the fields the Struct does not declare without making Python objects
    of them, several times faster than building the whole value. A line goes that way
    only when it is certain to be one orjson or json would read too (valid UTF-8, no
    escape that needs cleaning, no integer too long for json); any line the decoder
    refuses, for its syntax or for a field of a shape the Struct does not expect, comes
    as its JSON value as without a decoder, so problems are reported the same way.
    """

    def __init__(
        self,
        path: Path,
        *,
        max_bytes: int,
        data: bytes | None = None,
        decoder: msgspec.json.Decoder[Any] | None = None,
    ) -> None:
        """``data``: the file's bytes when the caller has read them already (the importer
        hashes and stores the same bytes it parses)."""
        self.path = path
        self.max_bytes = max_bytes
        self.data = data
        self.decoder = decoder
        self.problems: list[LineProblem] = []
        self.lines_read = 0  # non-blank lines, good or bad
        if data is None:
            check_size(path, max_bytes=max_bytes)
        elif len(data) > max_bytes:
            raise TranscriptError(
                f"{path.name} is {len(data)} bytes, larger than the limit of {max_bytes} bytes"
            )
        elif not data:
            raise TranscriptError(f"{path.name} is empty")

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        bytes_read = 0
        decoder = self.decoder
        # json refuses an integer of more digits than this (0: no limit); msgspec skips it.
        max_digits = sys.get_int_max_str_digits()
        long_line = max_digits or sys.maxsize  # a shorter line cannot hold such an integer
        try:
            data = self.data
            if data is None and decoder is not None:
                # Read whole, to be checked at once; the lines are still counted against
                # the limit below, as when they are read one by one.
                with self.path.open("rb") as handle:
                    data = handle.read(self.max_bytes + 1)
            # Most files need no check line by line for the fast path.
            plain = decoder is not None and _plain_text(data)
            with self.path.open("rb") if data is None else io.BytesIO(data) as handle:
                for line_number, raw in enumerate(handle, start=1):
                    bytes_read += len(raw)
                    if bytes_read > self.max_bytes:
                        # The file grew while we read it (a live session).
                        raise TranscriptError(
                            f"{self.path.name} is larger than the limit of {self.max_bytes} bytes"
                        )
                    if (
                        decoder is not None
                        and raw[0] == 0x7B  # "{": not blank, no byte order mark, an object
                        and (plain or _plainly_readable(raw))
                        and (len(raw) <= long_line or not _long_integer(raw, max_digits))
                    ):
                        try:
                            value = decoder.decode(raw)
                        except (msgspec.DecodeError, RecursionError):
                            pass  # read again below, as any line is without a decoder
                        else:
                            self.lines_read += 1
                            yield line_number, value
                            continue
                    value = self._decode(line_number, raw)
                    if value is not _SKIP:
                        yield line_number, value
        except OSError as exc:
            raise TranscriptError(
                f"{self.path.name} cannot be read: {exc.strerror or exc}"
            ) from exc
        if self.lines_read == 0:
            raise TranscriptError(f"{self.path.name} is empty")

    def _decode(self, line_number: int, raw: bytes) -> Any:
        complete = raw.endswith(b"\n")
        if line_number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        if not raw.strip():
            return _SKIP
        self.lines_read += 1
        if b"\x00" not in raw:
            # orjson reads every well-formed line (most of them) several times faster than
            # json; whatever it refuses (bad UTF-8 or JSON, NaN, a lone surrogate, deep
            # nesting) is read again below, so problems are reported as before.
            try:
                value = orjson.loads(raw)
            except orjson.JSONDecodeError:
                pass
            else:
                if b"\\u" in raw and _UNSTORABLE_ESCAPE_RE.search(raw):
                    value = clean_strings(value)
                return value
        try:
            if b"\x00" in raw:
                raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if self.lines_read == 1:
                # A binary file: refuse it whole rather than list a problem per line.
                raise TranscriptError(f"{self.path.name} is not UTF-8 text") from exc
            if not complete:
                self.problem(line_number, "truncated last line (cut inside a character)")
            else:
                self.problem(line_number, "line is not UTF-8 text")
            return _SKIP
        try:
            value = json.loads(text)
        except (ValueError, RecursionError) as exc:
            if isinstance(exc, json.JSONDecodeError):
                detail = exc.msg
            elif isinstance(exc, RecursionError):
                detail = "nested too deeply"
            else:  # Python refuses to read integers of more than 4300 digits
                detail = "a number too long to read"
            if not complete:
                self.problem(line_number, f"truncated last line (invalid JSON: {detail})")
            else:
                self.problem(line_number, f"invalid JSON: {detail}")
            return _SKIP
        if _UNSTORABLE_ESCAPE_RE.search(raw):
            value = clean_strings(value)
        return value

    def problem(self, line_number: int, message: str) -> None:
        self.problems.append(LineProblem(line_number, message))


_SKIP = object()  # sentinel: the line produced no value (blank or a problem)


# What the fast path must leave to the general one, as msgspec reads it differently:
# - bytes that are not UTF-8: msgspec does not check the strings it skips;
# - the escape \u0000: msgspec makes NUL of it, which the general path cleans away. (A
#   lone surrogate, the other escape cleaned, msgspec refuses: that line goes the
#   general way by itself, as does a raw NUL byte or control character.)
# - an integer of more digits than json reads: msgspec skips it, json refuses the line.
_NUL_ESCAPE_RE = re.compile(rb"\\u0000")


def _plain_text(data: bytes) -> bool:
    """Whether no line of ``data`` needs _plainly_readable: the file is UTF-8 without
    the escape for NUL (checked on the whole file, much faster than line by line)."""
    if _NUL_ESCAPE_RE.search(data):
        return False
    if data.isascii():
        return True
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(data)
    try:
        for start in range(0, len(data), _CHUNK):  # no text of the whole file at once
            decoder.decode(view[start : start + _CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


_CHUNK = 1024 * 1024


def _plainly_readable(raw: bytes) -> bool:
    """Whether one line of a file that is not _plain_text can go the fast path."""
    if not raw.isascii():
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            return False
    return not _NUL_ESCAPE_RE.search(raw)


def _long_integer(raw: bytes, max_digits: int) -> bool:
    """Whether ``raw`` may hold an integer of more than ``max_digits`` digits. Such a run
    of digits covers a multiple of (max_digits + 1): only a line with a digit at one of
    those places is searched."""
    if not _DIGIT_RE.search(raw[:: max_digits + 1]):
        return False
    return re.search(rb"[0-9]{%d}" % (max_digits + 1), raw) is not None


_DIGIT_RE = re.compile(rb"[0-9]")


def clean_text(text: str) -> str:
    """``text`` with lone surrogates replaced by U+FFFD and NUL removed."""
    return _SURROGATE_RE.sub("\ufffd", text).replace("\x00", "")


def clean_strings(value: Any) -> Any:
    """A JSON value with every string in it cleaned (keys too), containers in place.

    Iterative, not recursive: json.loads accepts nesting deeper than a recursive
    walk could follow."""
    if isinstance(value, str):
        return clean_text(value)
    pending = [value] if isinstance(value, (dict, list)) else []
    while pending:
        container = pending.pop()
        if isinstance(container, list):
            for position, item in enumerate(container):
                if isinstance(item, str):
                    container[position] = clean_text(item)
                elif isinstance(item, (dict, list)):
                    pending.append(item)
            continue
        items = list(container.items())
        container.clear()
        for key, item in items:
            if isinstance(item, str):
                item = clean_text(item)
            elif isinstance(item, (dict, list)):
                pending.append(item)
            container[clean_text(key)] = item
    return value


def check_size(path: Path, *, max_bytes: int) -> None:
    """Refuse a file that is missing, empty or over the limit, before reading any of it."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise TranscriptError(f"{path.name} cannot be read: {exc.strerror or exc}") from exc
    if size > max_bytes:
        raise TranscriptError(
            f"{path.name} is {size} bytes, larger than the limit of {max_bytes} bytes"
        )
    if size == 0:
        raise TranscriptError(f"{path.name} is empty")


def looks_like_claude_line(value: object) -> bool:
    """Whether a parsed line is recognisably Claude Code's (used to tell formats apart)."""
    if not isinstance(value, dict):
        return False
    line_type = value.get("type")
    has_id = any(isinstance(value.get(key), str) for key in _CLAUDE_IDS)
    if isinstance(line_type, str) and line_type in KNOWN_LINE_TYPES:
        return has_id or line_type not in _GENERIC_LINE_TYPES
    # A type newer than this parser, carrying Claude's ids.
    return isinstance(value.get("sessionId"), str) and isinstance(value.get("uuid"), str)


def parse_timestamp(value: object) -> datetime:
    """ISO 8601 text -> timezone-aware UTC datetime; ValueError when it is not one, or
    when it lies outside [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP)."""
    if type(value) is str and len(value) == 24 and value[23] == "Z":
        # What both CLIs write ("2026-01-04T12:08:00.296Z"), read without the general
        # steps below (it is UTC already); anything odd about it goes that way.
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            pass
        else:
            if EARLIEST_TIMESTAMP <= parsed < LATEST_TIMESTAMP:
                return parsed
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"bad timestamp {shown(value)}")
    try:
        parsed = datetime.fromisoformat(value.strip())
        # Both CLIs write UTC ("...Z"); a naive value is read as UTC too.
        parsed = parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    except ValueError:
        raise ValueError(f"bad timestamp {shown(value)}") from None
    except OverflowError:  # "0001-01-01T00:00:00+14:00" is before year 1 in UTC
        raise ValueError(f"timestamp {shown(value)} is out of range") from None
    if not EARLIEST_TIMESTAMP <= parsed < LATEST_TIMESTAMP:
        raise ValueError(f"timestamp {shown(value)} is out of range")
    return parsed


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` for a problem message, cut so a huge field makes no huge message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def make_title(text: str) -> str:
    """First non-blank line of ``text``, at most TITLE_MAX_CHARS characters."""
    for line in text.splitlines():
        line = line.strip()
        if line:
            if len(line) > TITLE_MAX_CHARS:
                return line[: TITLE_MAX_CHARS - 1] + "…"
            return line
    return ""


def token_count(container: dict[str, Any], key: str) -> int:
    """A whole token count from 0 to MAX_LINE_TOKENS; ValueError (TokensOutOfRange above
    the bound) when the field holds something else."""
    value = container.get(key)
    if type(value) is int and 0 <= value <= MAX_LINE_TOKENS:
        return value  # the usual case, first: this runs for every count of every line
    if value is None:
        return 0
    # bool is an int subclass; true/false in a count field is a broken line.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} is not a number")
    if value < 0:
        raise ValueError(f"{key} is negative")
    if value > MAX_LINE_TOKENS:  # 2**63, 1e300 and Infinity included
        raise TokensOutOfRange(f"{OUT_OF_RANGE}: {key} is over {MAX_LINE_TOKENS:,}")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{key} is not a whole number")
    return int(value)


def token_counts(container: dict[str, Any], keys: tuple[str, ...], where: str) -> list[int]:
    """token_count of each of `keys`; the ValueError names the field as `where.key`."""
    try:
        return [token_count(container, key) for key in keys]
    except TokensOutOfRange:
        raise
    except ValueError as exc:
        raise ValueError(f"{where}.{exc}") from None


def epoch_ms(value: object) -> datetime | None:
    """A time written as milliseconds since the epoch (OpenCode's, pi's), or None when it is
    not one or lies outside [EARLIEST_TIMESTAMP, LATEST_TIMESTAMP)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
        return None
    try:
        at = datetime.fromtimestamp(value / 1000, tz=UTC)
    except (OverflowError, OSError, ValueError):
        return None
    return at if EARLIEST_TIMESTAMP <= at < LATEST_TIMESTAMP else None


def _final_usage(counted: TokenUsage, line: TokenUsage) -> TokenUsage:
    """A response's usage after one more of its lines: the latest line's figures, unless it
    has less output than those counted so far.

    Claude Code writes the usage on every line of a streamed response, growing to its final
    figures (the first lines' output is 2-3x short). A proxy (glm-5 behind an Anthropic-style
    endpoint) writes an estimate first (input guessed high, output 0), then the final
    figures: taking each kind's largest would mix the estimate's input with the final
    output. The latest line with the most output is the final one in both."""
    return line if line.output_tokens >= counted.output_tokens else counted


# --- Claude Code ----------------------------------------------------------------


# _Response.turn_index before it names a turn.
_UNPLACED = -1  # from a sub-agent file: placed by time once all turns are known
_BEFORE_FIRST_TURN = -2  # written before the first request: the thread's, no turn's


@dataclass(slots=True)
class _Response:
    """One API response, possibly streamed over several lines sharing (message.id, requestId)."""

    turn_index: int  # a turn, _UNPLACED or _BEFORE_FIRST_TURN
    model: str
    first_at: datetime
    last_at: datetime
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost_usd: float | None = None
    # When the request this response answers was written (the user line before it).
    asked_at: datetime | None = None
    # The last usage object read for it, as written: a sibling repeating it adds nothing.
    raw_usage: dict[str, Any] | _Usage | None = None


@dataclass
class _State:
    turns: list[ParsedTurn] = field(default_factory=list)
    responses: dict[tuple[str, str], _Response] = field(default_factory=dict)
    budget: UsageBudget = field(default_factory=UsageBudget)
    seen_user_uuids: set[str] = field(default_factory=set)
    session_id: str = ""
    cwd: str = ""
    git_branch: str = ""
    cli_version: str = ""
    custom_title: str = ""
    ai_title: str = ""
    summary: str = ""
    started_at: datetime | None = None
    ended_at: datetime | None = None
    recognised: bool = False
    # Whether all four fields _read_metadata looks for are known (it then looks no more).
    metadata_known: bool = False
    # The latest user line (prompt or tool result) of the file being read.
    asked_at: datetime | None = None
    # Tool calls waiting for their result: tool_use id -> (turn index, tool name, input).
    pending_tools: dict[str, tuple[int, str, dict[str, Any]]] = field(default_factory=dict)
    # The latest turn when it is a typed command nothing has answered yet: its expansion
    # (a meta line) is added to what was sent, and output of Claude Code's own (a local
    # command's) withdraws it. -1: none.
    command_turn: int = -1
    pre_turn_usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    pre_turn_long_context_usage: dict[str, dict[int, TokenUsage]] = field(default_factory=dict)

    def saw_time(self, at: datetime) -> None:
        if self.started_at is None or at < self.started_at:
            self.started_at = at
        if self.ended_at is None or at > self.ended_at:
            self.ended_at = at


# --- the fast path: lines as Structs that declare only what the parser reads -------------
#
# msgspec skips every other field (tool output, file contents, thinking text, signatures)
# without making Python objects of it. Each field has the one shape Claude Code writes (a
# count is an int, a flag a bool): a line with any other shape fails to decode and goes
# through the general path (_read_line, over the line's JSON value), which reads odd
# shapes leniently and reports broken ones. So both paths give the same result for every
# line (tests/test_transcripts_claude_code.py checks it on real and mutated files). A
# field whose absence differs from null for the parser defaults to UNSET. No Struct can
# be part of a reference cycle, so none is tracked by the garbage collector.

_NO_RAW = msgspec.Raw(b"")  # a msgspec.Raw field that is absent


class _CacheSplit(msgspec.Struct, gc=False):
    ephemeral_5m_input_tokens: int | None = None
    ephemeral_1h_input_tokens: int | None = None


class _Usage(msgspec.Struct, gc=False):
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_input_tokens: int | None = None
    cache_creation_input_tokens: int | None = None
    cache_creation: _CacheSplit | None = None


class _Block(msgspec.Struct, gc=False):
    """A content block: text, tool_use, tool_result, image... (thinking and tool output
    are not declared, so never read)."""

    type: str | None = None
    text: str | None = None
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    # The tool call's input, as its JSON text: read only when its result makes evidence.
    input: msgspec.Raw = _NO_RAW
    tool_use_id: str | None = None  # tool_result
    is_error: bool | None = None  # tool_result


class _Message(msgspec.Struct, gc=False):
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None
    content: str | list[_Block] | None = None


class _Origin(msgspec.Struct, gc=False):
    kind: str | None = None


class _Line(msgspec.Struct, gc=False):
    type: str | None = None
    timestamp: str | msgspec.UnsetType = msgspec.UNSET
    sessionId: str | None = None
    uuid: str | None = None
    leafUuid: str | None = None
    cwd: str | None = None
    gitBranch: str | None = None
    version: str | None = None
    message: _Message | None = None
    requestId: str | None = None
    costUSD: float | None = None
    isSidechain: bool | None = None
    isMeta: bool | None = None
    isCompactSummary: bool | None = None
    origin: _Origin | None = None
    # The tool's own record beside a tool result, as its JSON text (_NO_RAW: absent).
    toolUseResult: msgspec.Raw = _NO_RAW
    summary: str | None = None
    aiTitle: str | None | msgspec.UnsetType = msgspec.UNSET
    customTitle: str | None | msgspec.UnsetType = msgspec.UNSET
    title: str | None = None


_LINE_DECODER = msgspec.json.Decoder(_Line)


def parse_claude_code(
    path: Path, *, max_bytes: int, include_subagents: bool = True, data: bytes | None = None
) -> ParsedThread:
    """Parse one Claude Code session file (its bytes ``data`` when already read).

    With ``include_subagents`` the sub-agent transcripts Claude Code keeps in
    ``<sessionId>/subagents/*.jsonl`` beside the file are read too, and their
    usage is added to the turn whose time window contains them.
    """
    lines = JsonLines(path, max_bytes=max_bytes, data=data, decoder=_LINE_DECODER)
    state = _State()
    for line_number, value in lines:
        if type(value) is _Line:
            _read_struct_line(state, lines, line_number, value, True)
        else:
            _read_line(state, lines, line_number, value, main_file=True)
    if not state.recognised:
        raise TranscriptError(f"{path.name} is not a Claude Code transcript")

    session_id = state.session_id or path.stem
    problems = lines.problems
    if include_subagents:
        problems = problems + _read_subagents(state, path, session_id, max_bytes=max_bytes)
    _finish_turns(state)
    make_message_ids_unique(state.turns)
    for index, turn in enumerate(state.turns):
        turn.index = index  # a withdrawn command leaves no gap
    for turn in state.turns:
        turn.evidence.relative_to(state.cwd)

    title = state.custom_title or state.ai_title or state.summary
    if not title and state.turns:
        title = state.turns[0].request
    return ParsedThread(
        kind=KIND,
        session_id=session_id,
        title=make_title(title),
        cwd=state.cwd,
        git_branch=state.git_branch,
        git_commit="",  # Claude Code records no commit; the importer derives a baseline from git
        repository_url="",
        cli_version=state.cli_version,
        started_at=state.started_at,
        ended_at=state.ended_at,
        turns=state.turns,
        problems=problems,
        lines_read=lines.lines_read,
        pre_turn_usage_by_model=state.pre_turn_usage_by_model,
        pre_turn_long_context_usage=state.pre_turn_long_context_usage,
    )


def _read_line(
    state: _State, lines: JsonLines, line_number: int, value: Any, *, main_file: bool
) -> None:
    if not isinstance(value, dict):
        lines.problem(line_number, f"line is a JSON {type(value).__name__}, not an object")
        return
    state.recognised = state.recognised or looks_like_claude_line(value)
    line_type = value.get("type")
    if not isinstance(line_type, str) or line_type not in KNOWN_LINE_TYPES:
        return  # unknown types are newer than this parser: skipped silently

    at: datetime | None = None
    if "timestamp" in value:
        try:
            at = parse_timestamp(value["timestamp"])
        except ValueError as exc:
            lines.problem(line_number, str(exc))
            return
    elif line_type in ("user", "assistant"):
        lines.problem(line_number, f"{line_type} line has no timestamp")
        return

    if line_type in ("user", "assistant"):
        message = value.get("message")
        if not isinstance(message, dict):
            lines.problem(line_number, f"{line_type} line has no message object")
            return

    try:
        if line_type == "assistant":
            assert at is not None
            _read_assistant(state, lines, line_number, value, at, from_subagent=not main_file)
            if main_file:
                _read_tool_uses(state, value)
                _read_answer_text(state, value)
        elif line_type == "user" and main_file:
            assert at is not None
            _read_user(state, line_number, value, at)
            _read_tool_results(state, value)
    except ValueError as exc:
        # A skipped line adds nothing, its metadata and time included.
        lines.problem(line_number, str(exc))
        return
    if line_type == "user" and at is not None:
        state.asked_at = at
    if not main_file:
        # A sub-agent file adds usage only; its prompts, titles and times are its own.
        return

    _read_metadata(state, value)
    if at is not None:
        state.saw_time(at)
    if line_type == "summary" and isinstance(value.get("summary"), str):
        state.summary = value["summary"]
    elif line_type == "ai-title":
        # Field name seen as "aiTitle"; "title" accepted too. The latest one wins.
        title = value.get("aiTitle", value.get("title"))
        if isinstance(title, str) and title.strip():
            state.ai_title = title
    elif line_type == "custom-title":
        title = value.get("customTitle", value.get("title"))
        if isinstance(title, str) and title.strip():
            state.custom_title = title


def _read_struct_line(
    state: _State, lines: JsonLines, line_number: int, line: _Line, main_file: bool
) -> None:
    """_read_line for a line the fast path decoded: the same steps in the same order, over
    a Struct whose fields have their usual shapes (so without most of _read_line's checks)."""
    line_type = line.type
    if not state.recognised:
        state.recognised = _looks_like_claude_struct(line)
    if line_type not in KNOWN_LINE_TYPES:
        return  # unknown types are newer than this parser: skipped silently

    at: datetime | None = None
    chat = line_type == "assistant" or line_type == "user"
    timestamp = line.timestamp
    if timestamp is not msgspec.UNSET:
        if len(timestamp) == 24 and timestamp[23] == "Z":
            # parse_timestamp's first step, inline (it runs for nearly every line).
            try:
                at = datetime.fromisoformat(timestamp)
            except ValueError:
                pass
            if at is not None and not EARLIEST_TIMESTAMP <= at < LATEST_TIMESTAMP:
                at = None
        if at is None:
            try:
                at = parse_timestamp(timestamp)
            except ValueError as exc:
                lines.problem(line_number, str(exc))
                return
    elif chat:
        lines.problem(line_number, f"{line_type} line has no timestamp")
        return

    if chat:
        message = line.message
        if message is None:
            lines.problem(line_number, f"{line_type} line has no message object")
            return
        assert at is not None
        try:
            if line_type == "assistant":
                _read_struct_assistant(state, lines, line_number, line, message, at, main_file)
            elif main_file:
                _read_struct_user(state, line_number, line, message, at)
        except ValueError as exc:
            # A skipped line adds nothing, its metadata and time included.
            lines.problem(line_number, str(exc))
            return
        if line_type == "user":
            state.asked_at = at
    if not main_file:
        # A sub-agent file adds usage only; its prompts, titles and times are its own.
        return

    if not state.metadata_known:
        # The first line that carries each field wins (as _read_metadata).
        if not state.session_id and line.sessionId:
            state.session_id = line.sessionId
        if not state.cwd and line.cwd:
            state.cwd = line.cwd
        if not state.git_branch and line.gitBranch:
            state.git_branch = line.gitBranch
        if not state.cli_version and line.version:
            state.cli_version = line.version
        state.metadata_known = bool(
            state.session_id and state.cwd and state.git_branch and state.cli_version
        )
    if at is not None:
        # state.saw_time, inline: it runs for nearly every line.
        if state.started_at is None or at < state.started_at:
            state.started_at = at
        if state.ended_at is None or at > state.ended_at:
            state.ended_at = at
    if chat:
        return
    if line_type == "summary" and line.summary is not None:
        state.summary = line.summary
    elif line_type == "ai-title":
        title = line.aiTitle if line.aiTitle is not msgspec.UNSET else line.title
        if title and title.strip():
            state.ai_title = title
    elif line_type == "custom-title":
        title = line.customTitle if line.customTitle is not msgspec.UNSET else line.title
        if title and title.strip():
            state.custom_title = title


def _looks_like_claude_struct(line: _Line) -> bool:
    """looks_like_claude_line of a decoded line."""
    if line.type in KNOWN_LINE_TYPES:
        has_id = line.sessionId is not None or line.uuid is not None or line.leafUuid is not None
        return has_id or line.type not in _GENERIC_LINE_TYPES
    return line.sessionId is not None and line.uuid is not None


_NO_USAGE = TokenUsage()


def _read_struct_assistant(
    state: _State,
    lines: JsonLines,
    line_number: int,
    line: _Line,
    message: _Message,
    at: datetime,
    main_file: bool,
) -> None:
    """_read_assistant, then (main file) _read_tool_uses and _read_answer_text, of a decoded
    line: the response's usage kept as _count_response keeps it, with the arithmetic on
    plain integers (this runs for every assistant line)."""
    model = message.model
    if model != SYNTHETIC_MODEL:
        if not model:
            model = "unknown"
        if message.id:
            key = (message.id, line.requestId or "")
        else:
            key = ("line", f"{lines.path.name}:{line_number}")
        response = state.responses.get(key)
        raw_usage = message.usage
        # A sibling repeating the usage already counted, or no usage, adds nothing.
        counts = None
        if raw_usage is not None and (response is None or raw_usage != response.raw_usage):
            counts = _struct_counts(raw_usage)
        cost = None if line.costUSD is None else _cost(line.costUSD)

        if not main_file:
            turn_index = _UNPLACED
        elif state.turns:
            turn_index = len(state.turns) - 1
        else:
            turn_index = _BEFORE_FIRST_TURN

        counted = response.usage if response is not None else _NO_USAGE
        merged = counted
        if counts is not None:
            i, o, r, w5, w1 = counts
            ci, co, cr = counted.input_tokens, counted.output_tokens, counted.cache_read_tokens
            c5, c1 = counted.cache_write_5m_tokens, counted.cache_write_1h_tokens
            # As _final_usage: the line's figures replace the counted ones unless they
            # have less output.
            if o >= co and (i != ci or o != co or r != cr or w5 != c5 or w1 != c1):
                # budget.add_counts, inline: past the session's bound, the line is skipped.
                budget = state.budget
                ti, to = budget.input_tokens + i - ci, budget.output_tokens + o - co
                tr, t5 = budget.cache_read_tokens + r - cr, budget.cache_write_5m_tokens + w5 - c5
                t1 = budget.cache_write_1h_tokens + w1 - c1
                if max(ti, to, tr, t5, t1) > MAX_THREAD_TOKENS:
                    budget.add_counts(i - ci, o - co, r - cr, w5 - c5, w1 - c1)  # raises
                budget.input_tokens, budget.output_tokens, budget.cache_read_tokens = ti, to, tr
                budget.cache_write_5m_tokens, budget.cache_write_1h_tokens = t5, t1
                merged = TokenUsage(i, o, r, w5, w1)
        if main_file and turn_index >= 0:
            state.command_turn = -1  # answered: a request, whatever follows
        if response is None:
            response = _Response(
                turn_index=turn_index, model=model, first_at=at, last_at=at, asked_at=state.asked_at
            )
            state.responses[key] = response
        else:
            if at < response.first_at:
                response.first_at = at
            if at > response.last_at:
                response.last_at = at
        response.usage = merged
        if raw_usage is not None:
            response.raw_usage = raw_usage
        if cost is not None:
            response.cost_usd = cost if response.cost_usd is None else max(response.cost_usd, cost)

    content = message.content
    if not main_file or not state.turns or type(content) is not list:
        return
    turn = len(state.turns) - 1
    texts = []
    for block in content:
        block_type = block.type
        if block_type == "text":
            if block.text is not None:
                texts.append(block.text)
        elif block_type == "tool_use":
            if block.id is not None and block.name is not None and _is_json_object(block.input):
                # Sidechain: an old-style inline sub-agent (as _read_tool_uses).
                name = "Task" if line.isSidechain else block.name
                state.pending_tools[block.id] = (turn, name, block.input)
    if texts and not line.isSidechain and model != SYNTHETIC_MODEL:
        state.turns[-1].answered("\n".join(texts))


def _struct_counts(raw: _Usage) -> tuple[int, int, int, int, int]:
    """The counts anthropic_usage makes of a _Usage (input, output, cache read, cache
    writes 5m and 1h); the same ValueError when one is out of bounds."""
    i = raw.input_tokens or 0
    o = raw.output_tokens or 0
    r = raw.cache_read_input_tokens or 0
    write = raw.cache_creation_input_tokens or 0
    split = raw.cache_creation
    if split is None:
        w5, w1 = write, 0
    else:
        w5 = split.ephemeral_5m_input_tokens or 0
        w1 = split.ephemeral_1h_input_tokens or 0
    bound = MAX_LINE_TOKENS
    if not (
        0 <= i <= bound and 0 <= o <= bound and 0 <= r <= bound and 0 <= write <= bound
        and 0 <= w5 <= bound and 0 <= w1 <= bound
    ):  # fmt: skip
        usage = _struct_usage(raw)  # raises, naming the first count out of bounds
        return (usage.input_tokens, usage.output_tokens, usage.cache_read_tokens,
                usage.cache_write_5m_tokens, usage.cache_write_1h_tokens)  # fmt: skip
    if split is not None and write > w5 + w1:
        w5 += write - w5 - w1  # whatever the split does not explain is priced as 5m
    return i, o, r, w5, w1


def _read_struct_user(
    state: _State, line_number: int, line: _Line, message: _Message, at: datetime
) -> None:
    """_read_user, then _read_tool_results, of a decoded line of the main file."""
    content = message.content
    parts = _struct_prompt_parts(line, content)
    uuid = line.uuid
    seen = False
    if uuid is not None:
        if uuid in state.seen_user_uuids:
            seen = True
        else:
            state.seen_user_uuids.add(uuid)
    if not seen:
        if parts is not None:
            _start_turn(state, parts, uuid if uuid else f"line-{line_number}", at)
        elif 0 <= state.command_turn == len(state.turns) - 1 and not line.isSidechain:
            _command_follow_up(state, line.isMeta is True, _struct_text(content))
    if type(content) is not list:
        return
    results = [block for block in content if block.type == "tool_result"]
    if not results:
        return
    record = line.toolUseResult if len(results) == 1 else None
    for result in results:
        pending = state.pending_tools.pop(str(result.tool_use_id), None)
        if pending is None or result.is_error is True:
            continue  # a failed call changed nothing
        turn, name, tool_input = pending
        if turn < len(state.turns):
            _tool_evidence(state.turns[turn].evidence, name, tool_input, record)


def _struct_prompt_parts(
    line: _Line, content: str | list[_Block] | None
) -> tuple[str, str, bool] | None:
    """prompt_parts of a decoded line."""
    if line.isSidechain or line.isMeta or line.isCompactSummary:
        return None
    if len(line.toolUseResult):  # present, whatever it holds
        return None
    origin = line.origin
    if origin is not None and origin.kind is not None and origin.kind != _TYPED_ORIGIN:
        return None
    if type(content) is str:
        text = content
    elif type(content) is list:
        texts: list[str] = []
        has_image = False
        for block in content:
            block_type = block.type
            if block_type == "tool_result":
                return None
            if block_type == "text" and block.text is not None:
                texts.append(block.text)
            elif block_type in ("image", "document"):
                has_image = True
        text = _joined_prompt(texts, has_image)
    else:
        raise ValueError("message.content is neither text nor a list of blocks")
    return _prompt_parts(text)


def _struct_text(content: str | list[_Block] | None) -> str:
    """_lenient_text of a decoded line's content."""
    if type(content) is str:
        return content
    if type(content) is list:
        return "\n".join(b.text for b in content if b.type == "text" and b.text is not None)
    return ""


def _lenient_text(content: object) -> str:
    """The text of a user line that is no request (a command's expansion, a local command's
    output); "" for a shape no text can be read from (no problem: nothing is counted)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            block["text"]
            for block in content
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        )
    return ""


def _joined_prompt(texts: list[str], has_image: bool) -> str:
    """A prompt's text blocks joined; "[image]" for a prompt of images only."""
    text = "\n".join(texts)
    return "[image]" if not text.strip() and has_image else text


def _prompt_parts(text: str) -> tuple[str, str, bool] | None:
    """(request, request_as_sent, is_command) of a user line's text; None for an empty line,
    Claude Code's plumbing or an interrupt. ``request`` is what the user typed: a command
    as typed, the text without an IDE's blocks; ``request_as_sent`` the text as the agent
    got it, "" when that is ``request``."""
    text = text.strip()
    if not text or text.startswith(_INTERRUPT_PREFIX):
        return None
    if _WRAPPER_RE.match(text):
        command = _typed_command(text)
        return None if command is None else (command, text, True)
    if "<" in text and _CONTEXT_BLOCK_RE.search(text):
        typed = _CONTEXT_BLOCK_RE.sub("", text).strip()
        if typed:  # a prompt of nothing but such blocks stays as it is
            return typed, text, False
    return text, "", False


def _typed_command(text: str) -> str | None:
    """A slash command or skill as the user typed it ("/review the parser"), from Claude
    Code's record of it; None when the line names none."""
    match = _COMMAND_NAME_RE.search(text)
    if match is None or not match.group(1):
        return None
    name = match.group(1)
    if not name.startswith("/"):
        name = "/" + name
    arguments = _COMMAND_ARGS_RE.search(text)
    typed = arguments.group(1).strip() if arguments else ""
    return f"{name} {typed}" if typed else name


def _start_turn(
    state: _State, parts: tuple[str, str, bool], message_uuid: str, at: datetime
) -> None:
    request, as_sent, is_command = parts
    state.turns.append(
        ParsedTurn(
            index=len(state.turns),
            message_uuid=message_uuid,
            timestamp=at,
            request=request,
            request_as_sent=as_sent,
        )
    )
    state.command_turn = len(state.turns) - 1 if is_command else -1


def _command_follow_up(state: _State, is_meta: bool, text: str) -> None:
    """A user line after a typed command nothing answered yet: its expansion (a meta line)
    is part of what the agent got; a local command's output says it never was a request."""
    if _LOCAL_OUTPUT_RE.match(text):  # some writers mark that output as meta too
        state.turns.pop()  # nothing refers to it: no response, no tool call served it
        state.command_turn = -1
    elif is_meta:
        expansion = text.strip()
        if expansion:
            turn = state.turns[-1]
            turn.request_as_sent = f"{turn.request_as_sent}\n\n{expansion}"
            state.command_turn = -1


def _read_metadata(state: _State, value: dict[str, Any]) -> None:
    # The first line that carries each field wins: later lines repeat it, and a
    # `cd` during the session should not move the thread's recorded cwd.
    if state.metadata_known:
        return  # all known (from the first few lines on)
    for key, attr in (
        ("sessionId", "session_id"),
        ("cwd", "cwd"),
        ("gitBranch", "git_branch"),
        ("version", "cli_version"),
    ):
        if not getattr(state, attr):
            field_value = value.get(key)
            if isinstance(field_value, str) and field_value:
                setattr(state, attr, field_value)
    state.metadata_known = bool(
        state.session_id and state.cwd and state.git_branch and state.cli_version
    )


def _read_user(state: _State, line_number: int, value: dict[str, Any], at: datetime) -> None:
    """Start a turn when the line is a real prompt; ValueError when its content is malformed."""
    parts = prompt_parts(value)
    uuid = value.get("uuid")
    if isinstance(uuid, str):
        # A resumed session can repeat earlier lines; one prompt is one turn.
        if uuid in state.seen_user_uuids:
            return
        state.seen_user_uuids.add(uuid)
    if parts is not None:
        message_uuid = uuid if isinstance(uuid, str) and uuid else f"line-{line_number}"
        _start_turn(state, parts, message_uuid, at)
    elif 0 <= state.command_turn == len(state.turns) - 1 and not value.get("isSidechain"):
        text = _lenient_text(value["message"].get("content"))
        _command_follow_up(state, value.get("isMeta") is True, text)


def prompt_text(value: dict[str, Any]) -> str | None:
    """What the user typed when a user line is a real prompt (see prompt_parts), else None.

    Raises ValueError when the message content has a shape no Claude Code writes.
    """
    parts = prompt_parts(value)
    return None if parts is None else parts[0]


def _typed_by_a_person(origin: object) -> bool:
    """Whether a user line's ``origin`` (absent before Claude Code 2.1) leaves it a person's."""
    if not isinstance(origin, dict):
        return True
    kind = origin.get("kind")
    return not isinstance(kind, str) or kind == _TYPED_ORIGIN


def prompt_parts(value: dict[str, Any]) -> tuple[str, str, bool] | None:
    """(request, request_as_sent, is_command) when a user line is a real prompt, else None:
    see _prompt_parts.

    Raises ValueError when the message content has a shape no Claude Code writes.
    """
    if value.get("isSidechain") or value.get("isMeta") or value.get("isCompactSummary"):
        return None
    if "toolUseResult" in value:
        return None
    if not _typed_by_a_person(value.get("origin")):
        return None
    content = value["message"].get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts: list[str] = []
        has_image = False
        for block in content:
            if not isinstance(block, dict):
                raise ValueError("message.content holds a block that is not an object")
            block_type = block.get("type")
            if block_type == "tool_result":
                return None
            if block_type == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block_type in ("image", "document"):
                has_image = True
        text = _joined_prompt(texts, has_image)
    else:
        raise ValueError("message.content is neither text nor a list of blocks")
    return _prompt_parts(text)


def _read_assistant(
    state: _State,
    lines: JsonLines,
    line_number: int,
    value: dict[str, Any],
    at: datetime,
    *,
    from_subagent: bool,
) -> None:
    """Add one assistant line to its response; ValueError when its usage is malformed."""
    message = value["message"]
    model = message.get("model")
    if model == SYNTHETIC_MODEL:
        return
    if not isinstance(model, str) or not model:
        model = "unknown"
    message_id = message.get("id")
    request_id = value.get("requestId")
    if isinstance(message_id, str) and message_id:
        key = (message_id, request_id if isinstance(request_id, str) else "")
    else:
        # Without an id a line cannot be matched to its siblings; count it alone.
        key = ("line", f"{lines.path.name}:{line_number}")
    _count_response(
        state, key, model, message.get("usage"), value.get("costUSD"), at,
        from_subagent=from_subagent,
    )  # fmt: skip


def _count_response(
    state: _State,
    key: tuple[str, str],
    model: str,
    raw_usage: dict[str, Any] | _Usage | None,
    raw_cost: object,
    at: datetime,
    *,
    from_subagent: bool,
) -> None:
    """One assistant line's usage (a JSON object, or its _Usage from the fast path) added to
    the response `key` names; ValueError when the usage or the cost is malformed."""
    response = state.responses.get(key)
    # A streamed sibling repeating the usage already counted (most of them do) is not
    # read again: the same object gave a valid usage before.
    repeated = response is not None and raw_usage == response.raw_usage
    usage = TokenUsage() if repeated else anthropic_usage(raw_usage, where="message.usage")
    cost = _cost(raw_cost)

    if from_subagent:
        turn_index = _UNPLACED
    elif state.turns:
        # Main-file work, sidechain lines included, serves the latest real prompt.
        turn_index = len(state.turns) - 1
    else:
        turn_index = _BEFORE_FIRST_TURN  # the thread's: no usage is left out

    counted = response.usage if response is not None else TokenUsage()
    if repeated:
        merged = counted
    else:
        merged = _final_usage(counted, usage)
        state.budget.add(merged - counted)  # past the session's bound: the line is skipped
    if not from_subagent and turn_index >= 0:
        state.command_turn = -1  # answered: a request, whatever follows
    if response is None:
        # The first line of a response decides its turn; a sub-agent file that
        # repeats a response already seen in the main file does not move it.
        response = _Response(
            turn_index=turn_index, model=model, first_at=at, last_at=at, asked_at=state.asked_at
        )
        state.responses[key] = response
    response.usage = merged
    if raw_usage is not None:  # an object: anything else was refused above
        response.raw_usage = raw_usage
    response.first_at = min(response.first_at, at)
    response.last_at = max(response.last_at, at)
    if cost is not None:
        response.cost_usd = cost if response.cost_usd is None else max(response.cost_usd, cost)


def _read_answer_text(state: _State, value: dict[str, Any]) -> None:
    """The text of a main-chain assistant line: the latest one is the turn's final answer."""
    message = value["message"]
    content = message.get("content")
    if not state.turns or value.get("isSidechain") or message.get("model") == SYNTHETIC_MODEL:
        return
    if isinstance(content, list):
        texts = [
            block["text"]
            for block in content
            if isinstance(block, dict)
            and block.get("type") == "text"
            and isinstance(block.get("text"), str)
        ]
        state.turns[-1].answered("\n".join(texts))


def anthropic_usage(raw: object, *, where: str = "usage") -> TokenUsage:
    """Anthropic usage as disjoint kinds; cache writes split 5m/1h where the API says so.
    ValueError (naming `where`) when it is not a usage object."""
    if raw is None:
        return TokenUsage()
    if type(raw) is _Usage:
        return _struct_usage(raw)
    if not isinstance(raw, dict):
        raise ValueError(f"{where} is not an object")
    cache_write = token_count(raw, "cache_creation_input_tokens")
    write_5m, write_1h = cache_write, 0
    split = raw.get("cache_creation")
    if isinstance(split, dict):
        write_5m = token_count(split, "ephemeral_5m_input_tokens")
        write_1h = token_count(split, "ephemeral_1h_input_tokens")
        # Whatever the split does not explain is priced as the default 5m write.
        write_5m += max(0, cache_write - write_5m - write_1h)
    return TokenUsage(
        token_count(raw, "input_tokens"),
        token_count(raw, "output_tokens"),
        token_count(raw, "cache_read_input_tokens"),
        write_5m,
        write_1h,
    )


def _struct_usage(raw: _Usage) -> TokenUsage:
    """anthropic_usage of a _Usage: the same counts, checked in the same order."""
    cache_write = _count(raw.cache_creation_input_tokens, "cache_creation_input_tokens")
    write_5m, write_1h = cache_write, 0
    split = raw.cache_creation
    if split is not None:
        write_5m = _count(split.ephemeral_5m_input_tokens, "ephemeral_5m_input_tokens")
        write_1h = _count(split.ephemeral_1h_input_tokens, "ephemeral_1h_input_tokens")
        write_5m += max(0, cache_write - write_5m - write_1h)
    return TokenUsage(
        _count(raw.input_tokens, "input_tokens"),
        _count(raw.output_tokens, "output_tokens"),
        _count(raw.cache_read_input_tokens, "cache_read_input_tokens"),
        write_5m,
        write_1h,
    )


def _count(value: int | None, key: str) -> int:
    """token_count of a _Usage field (an int or None)."""
    if value is None:
        return 0
    if 0 <= value <= MAX_LINE_TOKENS:
        return value
    return token_count({key: value}, key)  # raises, naming the field


def _cost(raw: object) -> float | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError("costUSD is not a non-negative number")
    if not 0 <= raw <= MAX_LINE_COST_USD:  # NaN fails both comparisons
        raise ValueError(f"costUSD is not a cost from 0 to {MAX_LINE_COST_USD:,} dollars")
    return float(raw)


def _read_subagents(
    state: _State, path: Path, session_id: str, *, max_bytes: int
) -> list[LineProblem]:
    """Read ``<sessionId>/subagents/*.jsonl``; _finish_turns places their responses by time."""
    # Only a session id that is a plain file name names a folder beside the file: a
    # hostile "../../somewhere" must not make us read sub-agents from elsewhere.
    if session_id in (".", "..") or "/" in session_id or "\\" in session_id:
        return []
    folder = path.parent / session_id / "subagents"
    try:
        if not folder.is_dir():
            return []
    except OSError:  # a name too long for the file system, for one
        return []
    problems: list[LineProblem] = []
    for sub_path in sorted(folder.glob("*.jsonl")):
        label = f"{session_id}/subagents/{sub_path.name}"
        sub_problems: list[LineProblem] = []
        sub_lines: JsonLines | None = None
        state.asked_at = None  # a sub-agent file's responses answer its own requests
        try:
            sub_lines = JsonLines(sub_path, max_bytes=max_bytes, decoder=_LINE_DECODER)
            sub_problems = sub_lines.problems
            for line_number, value in sub_lines:
                if type(value) is _Line:
                    _read_struct_line(state, sub_lines, line_number, value, False)
                else:
                    _read_line(state, sub_lines, line_number, value, main_file=False)
        except TranscriptError as exc:
            empty = _size(sub_path) == 0 or (sub_lines is not None and not sub_lines.lines_read)
            if empty:
                continue  # a sub-agent that never wrote a line: nothing to add, nothing wrong
            # A broken sub-agent file must not cost the main session; it is
            # reported, with line 0 meaning "the whole file".
            sub_problems = sub_problems + [LineProblem(0, str(exc))]
        problems.extend(LineProblem(p.line_number, f"{label}: {p.message}") for p in sub_problems)
    return problems


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _finish_turns(state: _State) -> None:
    """Place sub-agent responses by time, then sum each turn's responses per model (and the
    thread's, for responses before the first request)."""
    starts = [turn.timestamp for turn in state.turns]
    for response in state.responses.values():
        if response.turn_index == _UNPLACED:
            # The turn whose window [its request, the next request) holds the response
            # (-1, before the first request: the thread's).
            response.turn_index = bisect_right(starts, response.first_at) - 1

    # Sorted by time so usage_by_model lists models in the order they first answered,
    # sub-agent files (read last) included.
    ordered = sorted(state.responses.values(), key=lambda r: r.first_at)
    recorded: dict[int, Decimal] = {}
    for response in ordered:
        if response.turn_index < 0:
            if response.usage.total:
                add_request(
                    state.pre_turn_usage_by_model, state.pre_turn_long_context_usage,
                    response.model, response.usage,
                )  # fmt: skip
            continue
        turn = state.turns[response.turn_index]
        if turn.last_answer_at is None or response.last_at > turn.last_answer_at:
            turn.last_answer_at = response.last_at
        if response.asked_at is not None and response.asked_at <= response.first_at:
            answered_in = (response.last_at - response.asked_at).total_seconds()
            turn.model_seconds = (turn.model_seconds or 0.0) + answered_in
        turn.add_request(response.model, response.usage)
        if response.cost_usd is not None:
            # Summed as decimals so 0.03 + 0.005 is 0.035, not 0.034999...
            recorded[response.turn_index] = recorded.get(response.turn_index, Decimal(0)) + Decimal(
                repr(response.cost_usd)
            )
    for index, cost in recorded.items():
        state.turns[index].recorded_cost_usd = float(cost)


# --- evidence: the agent's tool calls ---------------------------------------------------

# Tools whose work on files is not recorded in this file: a sub-agent (its own transcript
# may edit files), a notebook edit.
_UNRECORDED_TOOLS = frozenset({"Task", "Agent", "NotebookEdit"})
# `cat FILE` and nothing else: its output is the file (Claude trims the trailing newline).
_SIMPLE_CAT_RE = re.compile(r"^\s*cat\s+(?:--\s+)?([^\s;&|<>`$\\'\"*?]+)\s*$")


def _read_tool_uses(state: _State, value: dict[str, Any]) -> None:
    """Remember the tool calls of an assistant line until their results come."""
    content = value["message"].get("content")
    if not state.turns or not isinstance(content, list):
        return
    turn = len(state.turns) - 1
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "tool_use":
            continue
        tool_id, name, tool_input = block.get("id"), block.get("name"), block.get("input")
        if not (
            isinstance(tool_id, str) and isinstance(name, str) and isinstance(tool_input, dict)
        ):
            continue
        if value.get("isSidechain"):
            # An old-style inline sub-agent: its edits are its own; say the turn had one.
            name = "Task"
        state.pending_tools[tool_id] = (turn, name, tool_input)


def _read_tool_results(state: _State, value: dict[str, Any]) -> None:
    """A user line carrying tool results: each successful call becomes evidence."""
    content = value["message"].get("content")
    if not isinstance(content, list):
        return
    results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
    # Claude Code writes one result per line, with the tool's own record beside it.
    record = value.get("toolUseResult") if len(results) == 1 else None
    for result in results:
        pending = state.pending_tools.pop(str(result.get("tool_use_id")), None)
        if pending is None or result.get("is_error") is True:
            continue  # a failed call changed nothing
        turn, name, tool_input = pending
        if turn < len(state.turns):
            _tool_evidence(
                state.turns[turn].evidence, name, tool_input,
                record if isinstance(record, dict) else {},
            )  # fmt: skip


# The tools whose calls _tool_evidence records.
_EVIDENCE_TOOLS = _UNRECORDED_TOOLS | {"Read", "Edit", "MultiEdit", "Write", "Bash"}


def _tool_evidence(
    evidence: Evidence,
    name: str,
    tool_input: dict[str, Any] | msgspec.Raw,
    record: dict[str, Any] | msgspec.Raw | None,
) -> None:
    """The evidence of one successful tool call. Its input and the tool's record come as
    JSON objects (the general path) or as their JSON text (the fast path), read here only
    for the tools and the fields that make evidence."""
    if name not in _EVIDENCE_TOOLS:
        return
    tool_input = _json_object(tool_input)
    path = tool_input.get("file_path")
    path = path if isinstance(path, str) and path else None
    if name in _UNRECORDED_TOOLS:
        evidence.add({"kind": "other", "tool": name, "path": path})
    elif name == "Read" and path:
        _read_evidence(evidence, path, _json_object(record))
    elif name == "Edit" and path:
        record = _json_object(record)
        old = _string_field(record, "oldString", tool_input, "old_string")
        new = _string_field(record, "newString", tool_input, "new_string")
        if old is None or new is None:
            return
        original = record.get("originalFile")
        evidence.add(
            {
                "kind": "edit", "tool": name, "path": path,
                "old": kept_text(old), "new": kept_text(new),
                "all": bool(tool_input.get("replace_all") or record.get("replaceAll")),
                "before": text_sha256(original) if isinstance(original, str) else None,
            }
        )  # fmt: skip
    elif name == "MultiEdit" and path and isinstance(tool_input.get("edits"), list):
        for edit in tool_input["edits"]:
            if not isinstance(edit, dict):
                continue
            old, new = edit.get("old_string"), edit.get("new_string")
            if isinstance(old, str) and isinstance(new, str):
                evidence.add(
                    {"kind": "edit", "tool": name, "path": path, "old": kept_text(old),
                     "new": kept_text(new), "all": bool(edit.get("replace_all")), "before": None}
                )  # fmt: skip
    elif name == "Write" and path and isinstance(tool_input.get("content"), str):
        record = _json_object(record)
        original = record.get("originalFile")
        kind = record.get("type")
        evidence.add(
            {
                "kind": "write", "tool": name, "path": path,
                "text": kept_text(tool_input["content"]),
                "created": kind == "create" if kind in ("create", "update") else None,
                "before": text_sha256(original) if isinstance(original, str) else None,
            }
        )  # fmt: skip
    elif name == "Bash" and isinstance(tool_input.get("command"), str):
        command = tool_input["command"]
        evidence.add(
            {"kind": "shell", "tool": name, "command": command[:MAX_EVIDENCE_COMMAND_CHARS],
             "cut": len(command) > MAX_EVIDENCE_COMMAND_CHARS}
        )  # fmt: skip
        match = _SIMPLE_CAT_RE.match(command)
        if not match:
            return
        record = _json_object(record)
        stdout = record.get("stdout")
        if isinstance(stdout, str) and not record.get("interrupted"):
            if not record.get("stderr"):
                evidence.add(
                    {"kind": "read", "tool": name, "path": match.group(1),
                     "text": kept_text(stdout), "match": "trimmed"}
                )  # fmt: skip


def _is_json_object(raw: msgspec.Raw) -> bool:
    """Whether a Raw field holds an object (msgspec keeps its text from its first byte)."""
    return len(raw) > 0 and memoryview(raw)[0] == 0x7B  # "{"


def _json_object(value: dict[str, Any] | msgspec.Raw | None) -> dict[str, Any]:
    """A tool call's input or record as the general path reads it: the object, or {} when
    it is absent or no object."""
    if type(value) is dict:
        return value
    if value is None or not len(value):
        return {}
    try:
        decoded = orjson.loads(memoryview(value))
    except orjson.JSONDecodeError:
        # A number out of orjson's range (1e400): json reads it, as it read the line.
        try:
            decoded = json.loads(bytes(value).decode("utf-8"))
        except (ValueError, RecursionError):
            return {}
    return decoded if isinstance(decoded, dict) else {}


def _read_evidence(evidence: Evidence, path: str, record: dict[str, Any]) -> None:
    """A Read: the text it returned when the record has it (whole or a part of the file)."""
    read = record.get("file") if record.get("type") == "text" else None
    text: Any = None
    match = "whole"
    if isinstance(read, dict) and isinstance(read.get("content"), str):
        text = read["content"]
        start, count, total = (read.get(k) for k in ("startLine", "numLines", "totalLines"))
        whole = start == 1 and isinstance(count, int) and isinstance(total, int) and count >= total
        match = "whole" if whole else "part"
    evidence.add(
        {"kind": "read", "tool": "Read", "path": path,
         "text": kept_text(text) if text is not None else None, "match": match}
    )  # fmt: skip


def _string_field(
    record: dict[str, Any], record_key: str, tool_input: dict[str, Any], input_key: str
) -> str | None:
    # The tool's record says what was applied (the user may have changed the proposal).
    value = record.get(record_key)
    if not isinstance(value, str):
        value = tool_input.get(input_key)
    return value if isinstance(value, str) else None
