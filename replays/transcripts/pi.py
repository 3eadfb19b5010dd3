"""pi coding agent sessions (``~/.pi/agent/sessions/--<cwd>--/<time>_<id>.jsonl``) -> ParsedThread.

Line 1 is the header ``{"type": "session", "version": 3, "id", "timestamp", "cwd"}`` (format 1
has no version, and may name the provider and model); then one entry a line: ``message``
(``message.role`` user, assistant, toolResult, bashExecution, custom...), ``model_change``,
``thinking_level_change``, ``compaction``, ``custom``, ``custom_message``, ``label``,
``session_info``. From format 2 every entry has an ``id`` and a ``parentId`` (a tree: a
branch goes back to an earlier entry); pi appends entries in the order they happen, so the
file's order is the order of the requests, branches included.

- A request is a ``user`` message with text (or an image). ``bashExecution`` (a ``!command``
  the user ran), ``custom_message`` (an extension's text) and the summaries pi writes are
  not requests.
- Each ``assistant`` message is one model call: ``usage`` {input, output, cacheRead,
  cacheWrite, totalTokens, cost {..., total}}. pi makes the four counts disjoint for every
  provider; what ``totalTokens`` counts beyond them (reasoning, in some providers) is output.
  pi records the cost it computed from its own model table: that figure is the request's
  cost (a free or unknown model's is $0 as pi recorded it); a line without one is priced
  from the table.
- The line's ``timestamp`` is when the entry was written (the response done), the
  message's epoch-ms ``timestamp`` when it began: their difference is the model's time.
- Old files can hold two entries on one line (``{...}{...}``): both are read (pi itself, and
  ccusage, skip such a line and lose the response on it).
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from replays.transcripts.base import (
    Evidence,
    ParsedThread,
    ParsedTurn,
    TokenUsage,
    TranscriptError,
    UsageBudget,
    edit_item,
    kept_text,
    make_message_ids_unique,
    recorded_usd,
    shell_item,
    write_item,
)
from replays.transcripts.claude_code import (
    JsonLines,
    epoch_ms,
    make_title,
    parse_timestamp,
    token_counts,
)

KIND = "pi"
LINE_TYPES = frozenset(
    {
        "session",
        "message",
        "model_change",
        "thinking_level_change",
        "compaction",
        "branch_summary",
        "custom",
        "custom_message",
        "label",
        "session_info",
    }
)
UNKNOWN_MODEL = "unknown"
# The file name pi gives a session: <header timestamp>_<session id>.jsonl.
_NAME_RE = re.compile(r"^[0-9T:._-]+Z?_(?P<id>.+)$")


def looks_like_pi_line(value: object) -> bool:
    """Whether a parsed line is recognisably pi's (used to tell formats apart): its header,
    or an entry no other tool writes."""
    if not isinstance(value, dict):
        return False
    kind = value.get("type")
    if kind == "session":
        return isinstance(value.get("id"), str) and isinstance(value.get("cwd"), str)
    if kind == "message":
        message = value.get("message")
        return isinstance(message, dict) and isinstance(message.get("role"), str)
    return kind in ("model_change", "thinking_level_change") and "timestamp" in value


class _Several:
    """The entries of one line that holds more than one JSON object."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values


class _PiLines(JsonLines):
    """pi's lines: a line of several objects (``{...}{...}``, old releases) gives them all."""

    def _decode(self, line_number: int, raw: bytes) -> Any:
        several = _several_objects(raw)
        if several is not None:
            self.lines_read += 1
            return _Several(several)
        return super()._decode(line_number, raw)


def _several_objects(raw: bytes) -> list[Any] | None:
    """The objects of a line that holds two or more whole JSON objects one after the other
    (None for any other line, which the ordinary reader takes)."""
    text = raw.strip()
    if not text.startswith(b"{") or b"}{" not in text:
        return None
    try:
        decoded = text.decode("utf-8")
        json.loads(decoded)
    except UnicodeDecodeError:
        return None
    except ValueError:
        pass
    else:
        return None  # one object: the ordinary reader's
    decoder = json.JSONDecoder()
    values: list[Any] = []
    position = 0
    try:
        while position < len(decoded):
            value, position = decoder.raw_decode(decoded, position)
            if not isinstance(value, dict):
                return None
            values.append(value)
            while position < len(decoded) and decoded[position].isspace():
                position += 1
    except (ValueError, RecursionError):
        return None
    return values if len(values) > 1 else None


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.session_id = ""
        self.cwd = ""
        self.version = 1
        self.started_at: datetime | None = None
        self.ended_at: datetime | None = None
        self.model = UNKNOWN_MODEL
        self.turns: list[ParsedTurn] = []
        self.thread = ParsedThread(
            kind=KIND, session_id="", title="", cwd="", git_branch="", git_commit="",
            repository_url="", cli_version="", started_at=None, ended_at=None,
        )  # fmt: skip
        self.budget = UsageBudget()
        # Tool calls waiting for their result: call id -> (turn index, tool name, arguments).
        self.pending: dict[str, tuple[int, str, dict[str, Any]]] = {}
        self.recognised = False
        self.entries = 0

    def entry(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"line is a JSON {type(value).__name__}, not an object")
        kind = value.get("type")
        if kind is None and isinstance(value.get("message"), dict):
            kind = "message"  # format 1 wrote some messages without a type
        if not isinstance(kind, str) or kind not in LINE_TYPES:
            return  # newer than this parser
        self.recognised = True
        if kind == "session":
            self._header(value)
            return
        at = parse_timestamp(value.get("timestamp"))
        self._saw(at)
        if kind == "model_change":
            model = value.get("modelId")
            if isinstance(model, str) and model:
                self.model = model
        elif kind == "message":
            message = value.get("message")
            if not isinstance(message, dict):
                raise ValueError("message entry has no message object")
            self._message(value, message, at)

    def _saw(self, at: datetime) -> None:
        self.started_at = at if self.started_at is None else min(self.started_at, at)
        self.ended_at = at if self.ended_at is None else max(self.ended_at, at)

    def _header(self, value: dict[str, Any]) -> None:
        if self.session_id:
            return  # one header a session; a second one is a copy's
        identifier, cwd = value.get("id"), value.get("cwd")
        if not isinstance(identifier, str) or not identifier:
            raise ValueError("session header has no id")
        self.session_id = identifier
        self.cwd = cwd if isinstance(cwd, str) else ""
        version = value.get("version")
        self.version = version if type(version) is int else 1
        model = value.get("modelId")
        if isinstance(model, str) and model:
            self.model = model
        try:
            self._saw(parse_timestamp(value.get("timestamp")))
        except ValueError:
            pass  # the entries still date the session

    def _message(self, line: dict[str, Any], message: dict[str, Any], at: datetime) -> None:
        role = message.get("role")
        if role == "user":
            text = _content_text(message.get("content"))
            if text.strip():
                identifier = line.get("id")
                self.turns.append(
                    ParsedTurn(
                        index=len(self.turns),
                        message_uuid=identifier
                        if isinstance(identifier, str) and identifier
                        else f"{self.session_id or self.path.stem}:{len(self.turns)}",
                        timestamp=at,
                        request=text.strip(),
                    )
                )
        elif role == "assistant":
            self._assistant(message, at)
        elif role == "toolResult":
            self._tool_result(message)
        # bashExecution, custom, branchSummary, compactionSummary: no request, no model call.

    def _assistant(self, message: dict[str, Any], at: datetime) -> None:
        model = message.get("model")
        model = model if isinstance(model, str) and model else self.model
        usage_value = message.get("usage")
        usage: TokenUsage | None = None
        usd = None
        if usage_value is not None:
            if not isinstance(usage_value, dict):
                raise ValueError("assistant usage is not an object")
            usage = _usage(usage_value)
            self.budget.add(usage)  # past the session's bound: the line is skipped
            cost = usage_value.get("cost")
            if isinstance(cost, dict) and "total" in cost:
                usd = recorded_usd(cost.get("total"))
                if usd is None:
                    raise ValueError(f"usage.cost.total is not a cost: {cost.get('total')!r}"[:120])
        turn = self.turns[-1] if self.turns else None
        if usage is not None and usage.total:
            if turn is None:
                if usd is not None:
                    self.thread.add_pre_turn_recorded_request(model, usage, usd)
                else:
                    self.thread.add_pre_turn_request(model, usage)
            elif usd is not None:
                turn.add_recorded_request(model, usage, usd)
            else:
                turn.add_request(model, usage)
        if turn is None:
            return
        if turn.last_answer_at is None or at > turn.last_answer_at:
            turn.last_answer_at = at
        began = epoch_ms(message.get("timestamp"))
        if began is not None and began <= at:
            turn.model_seconds = (turn.model_seconds or 0.0) + (at - began).total_seconds()
        content = message.get("content")
        texts: list[str] = []
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "toolCall":
                call_id, name = block.get("id"), block.get("name")
                arguments = block.get("arguments")
                if (
                    isinstance(call_id, str)
                    and isinstance(name, str)
                    and isinstance(arguments, dict)
                ):
                    self.pending[call_id] = (len(self.turns) - 1, name, arguments)
        if isinstance(content, str):
            texts.append(content)
        turn.answered("\n".join(texts))

    def _tool_result(self, message: dict[str, Any]) -> None:
        pending = self.pending.pop(str(message.get("toolCallId")), None)
        if pending is None or message.get("isError") is True:
            return  # a failed call changed nothing
        index, name, arguments = pending
        details = message.get("details")
        _tool_evidence(
            self.turns[index].evidence, name, arguments, message.get("content"),
            details if isinstance(details, dict) else {},
        )  # fmt: skip


def _usage(raw: dict[str, Any]) -> TokenUsage:
    """pi's usage as disjoint kinds; what totalTokens counts beyond the four is output."""
    input_tokens, output, cache_read, cache_write, total = token_counts(
        raw, ("input", "output", "cacheRead", "cacheWrite", "totalTokens"), "usage"
    )
    rest = total - (input_tokens + output + cache_read + cache_write)
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output + max(rest, 0),
        cache_read_tokens=cache_read,
        cache_write_5m_tokens=cache_write,
    )


def _content_text(content: object) -> str:
    """A user message's text: a string, or its text blocks ("[image]" for an image alone)."""
    if isinstance(content, str):
        return content
    texts: list[str] = []
    image = False
    for block in content if isinstance(content, list) else []:
        if isinstance(block, dict):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") == "image":
                image = True
    text = "\n".join(texts)
    return "[image]" if not text.strip() and image else text


def _result_text(content: object) -> str | None:
    """A tool result's text when it is one text block (a read's file), else None."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and len(content) == 1 and isinstance(content[0], dict):
        block = content[0]
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            return block["text"]
    return None


def _tool_evidence(
    evidence: Evidence,
    name: str,
    arguments: dict[str, Any],
    content: object,
    details: dict[str, Any],
) -> None:
    """The evidence of one successful call of pi's built-in tools (read, write, edit, bash)."""
    path = arguments.get("path")
    path = path if isinstance(path, str) and path else None
    if name == "read" and path:
        # Without offset or limit, and not truncated, pi returns the whole file as it is.
        text = _result_text(content)
        whole = (
            text is not None
            and arguments.get("offset") is None
            and arguments.get("limit") is None
            and not details.get("truncation")
        )
        evidence.add(
            {"kind": "read", "tool": name, "path": path,
             "text": kept_text(text) if whole and text is not None else None, "match": "whole"}
        )  # fmt: skip
    elif name == "write" and path and isinstance(arguments.get("content"), str):
        evidence.add(write_item(name, path, arguments["content"]))
    elif name == "edit" and path:
        edits = arguments.get("edits")
        if isinstance(edits, str):  # some models send the list as JSON text, which pi reads
            try:
                edits = json.loads(edits)
            except ValueError:
                edits = None
        pairs = [e for e in edits if isinstance(e, dict)] if isinstance(edits, list) else []
        if isinstance(arguments.get("oldText"), str):
            pairs.append(arguments)  # format of older releases: one replacement
        for pair in pairs:
            old, new = pair.get("oldText"), pair.get("newText")
            if isinstance(old, str) and isinstance(new, str):
                evidence.add(edit_item(name, path, old, new))
    elif name == "bash" and isinstance(arguments.get("command"), str):
        evidence.add(shell_item(name, arguments["command"]))


def session_id_from_name(path: Path) -> str:
    """The session id in pi's file name (<timestamp>_<id>.jsonl), else the name."""
    match = _NAME_RE.match(path.stem)
    return match.group("id") if match else path.stem


def parse_pi(path: Path, *, max_bytes: int, data: bytes | None = None) -> ParsedThread:
    """Parse one pi session file (its bytes ``data`` when already read)."""
    lines = _PiLines(path, max_bytes=max_bytes, data=data)
    reader = _Reader(path)
    for line_number, value in lines:
        for item in value.values if isinstance(value, _Several) else [value]:
            try:
                reader.entry(item)
            except ValueError as exc:
                lines.problem(line_number, str(exc))
    if not reader.recognised:
        raise TranscriptError(f"{path.name} is not a pi session file")
    thread = reader.thread
    thread.session_id = reader.session_id or session_id_from_name(path)
    thread.cwd = reader.cwd
    thread.started_at = reader.started_at
    thread.ended_at = reader.ended_at
    thread.turns = reader.turns
    thread.problems = lines.problems
    thread.lines_read = lines.lines_read
    for turn in thread.turns:
        turn.evidence.relative_to(reader.cwd)
    make_message_ids_unique(thread.turns)
    thread.title = make_title(thread.turns[0].request) if thread.turns else ""
    return thread
