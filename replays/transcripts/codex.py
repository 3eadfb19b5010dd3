"""Codex CLI session files (``$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl``) -> ParsedThread.

Every line is ``{timestamp, type, payload}``. The file is read in two steps:
the lines become a short list of events (prompt, usage, answer), then the
events become turns. Two steps because which lines count as prompts depends on
the whole file: user prompts appear both as events and as ``response_item``
messages, and the latter are only trusted when a file has no prompt events.
"""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from replays.transcripts.base import (
    MAX_EVIDENCE_COMMAND_CHARS,
    LongContextUsage,
    ParsedThread,
    ParsedTurn,
    TokensOutOfRange,
    TokenUsage,
    TranscriptError,
    UsageBudget,
    add_request,
    kept_text,
    make_message_ids_unique,
    patch_operations,
    unified_hunks,
)

# The line reader and helpers are shared with the Claude Code parser.
from replays.transcripts.claude_code import JsonLines, make_title, parse_timestamp, token_count

KIND = "codex"
LINE_TYPES = frozenset(
    {
        "session_meta",
        "response_item",
        "event_msg",
        "turn_context",
        "compacted",
        "token_usage_record",  # 0.169.0: one per model response, with its response_id
    }
)
# Used when usage arrives before any turn_context names the model (very old files).
UNKNOWN_MODEL = "unknown"

# User messages Codex injects itself (workspace context, AGENTS.md, permissions,
# aborted-turn notes); they are recorded like user input but are not requests.
_INJECTED_PREFIXES = (
    "<environment_context>",
    "<user_instructions>",
    "<permissions instructions>",
    "<collaboration_mode>",
    "<turn_aborted>",
    "<user_shell_command>",
    "<INSTRUCTIONS>",
    "# AGENTS.md instructions",
)
# Output the model produced: its time is when the turn was last answered.
_MODEL_OUTPUT_ITEMS = frozenset(
    {
        "function_call",
        "custom_tool_call",
        "local_shell_call",
        "web_search_call",
        "tool_search_call",
        "reasoning",
    }
)
_ANSWER_EVENTS = frozenset({"agent_message", "assistant_message", "agent_reasoning"})
_ANSWER_ITEMS = frozenset({"AgentMessage", "agent_message", "assistant_message", "Reasoning"})
_USER_ITEMS = frozenset({"UserMessage", "user_message"})
# Answers that are the agent's words (the rest is reasoning).
_MESSAGE_ITEMS = frozenset({"AgentMessage", "agent_message", "assistant_message"})
_ROLLOUT_UUID_RE = re.compile(
    r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$", re.IGNORECASE
)


@dataclass(frozen=True)
class _Prompt:
    at: datetime
    text: str
    turn_id: str | None
    source: Literal["event", "response_item"]


@dataclass(frozen=True)
class _Usage:
    at: datetime
    model: str
    usage: TokenUsage
    # "record": a token_usage_record (per response); "count": a token_count delta.
    # They describe the same responses: a turn takes one source, never both.
    source: Literal["record", "count"]
    # The request's own input (cached included), which long-context prices go by.
    input_size: int


@dataclass(frozen=True)
class _RolledBack:
    """The user rolled the thread back by this many turns (thread_rolled_back)."""

    turns: int


@dataclass(frozen=True)
class _Answer:
    at: datetime
    text: str = ""  # what the agent said (its messages; not reasoning)


@dataclass(frozen=True)
class _TurnStarted:
    turn_id: str


@dataclass(frozen=True)
class _ModelTime:
    """One response took the model this long: from the request it answered to its record."""

    at: datetime
    seconds: float


@dataclass(frozen=True)
class _Evidence:
    """What one tool call saw or changed (an evidence item, see base.Evidence)."""

    item: dict[str, Any]


@dataclass(frozen=True)
class _RecordedCommit:
    """A commit recorded after the session began (turn_context or a later session_meta):
    the next turn started from it."""

    commit: str


_Event = (
    _Prompt | _Usage | _Answer | _TurnStarted | _ModelTime | _Evidence | _RecordedCommit
    | _RolledBack
)  # fmt: skip
# Items that hand the model a new request: what the next response answers.
_REQUEST_ITEMS = frozenset({"function_call_output", "custom_tool_call_output"})
_SHELL_TOOLS = frozenset(
    {"exec_command", "shell", "shell_command", "local_shell", "container.exec"}
)
# Codex's own reading of a command (parsed_cmd) that changes no file.
_READING_COMMANDS = frozenset({"read", "search", "list_files"})
# `cat FILE` and nothing else: its output is the file.
_SIMPLE_CAT_RE = re.compile(r"^\s*cat\s+(?:--\s+)?([^\s;&|<>`$\\'\"*?]+)\s*$")
# Longer command output may have been cut by Codex: only its beginning is trusted then.
_WHOLE_OUTPUT_CHARS = 10_000
_OUTPUT_HEAD_CHARS = 4_000


@dataclass(frozen=True)
class _RawUsage:
    """Codex usage as written: input includes cached (and cache-write) tokens,
    output includes reasoning tokens."""

    input_tokens: int
    cached_input_tokens: int
    cache_write_input_tokens: int
    output_tokens: int

    def minus(self, other: _RawUsage) -> _RawUsage:
        return _RawUsage(
            self.input_tokens - other.input_tokens,
            self.cached_input_tokens - other.cached_input_tokens,
            self.cache_write_input_tokens - other.cache_write_input_tokens,
            self.output_tokens - other.output_tokens,
        )

    def is_below(self, other: _RawUsage) -> bool:
        return (
            self.input_tokens < other.input_tokens
            or self.cached_input_tokens < other.cached_input_tokens
            or self.cache_write_input_tokens < other.cache_write_input_tokens
            or self.output_tokens < other.output_tokens
        )

    def normalised(self) -> TokenUsage:
        """Disjoint kinds: cached reads and cache writes are taken out of input."""
        input_tokens = max(self.input_tokens, 0)
        cached = min(max(self.cached_input_tokens, 0), input_tokens)
        # cache_write_input_tokens is 0 in every file seen so far; it is read as
        # part of input like cached tokens (an assumption), priced as a 5m write.
        written = min(max(self.cache_write_input_tokens, 0), input_tokens - cached)
        return TokenUsage(
            input_tokens=input_tokens - cached - written,
            cache_read_tokens=cached,
            cache_write_5m_tokens=written,
            output_tokens=max(self.output_tokens, 0),
        )


class _Reader:
    """Step one: lines -> events, plus the thread's metadata."""

    def __init__(self, lines: JsonLines) -> None:
        self.lines = lines
        self.events: list[_Event] = []
        self.session_id = ""
        self.cwd = ""
        self.cli_version = ""
        self.git_commit = ""
        self.git_branch = ""
        self.repository_url = ""
        self.started_at: datetime | None = None
        self.ended_at: datetime | None = None
        self.model = UNKNOWN_MODEL
        self.previous_total: _RawUsage | None = None
        self.recorded_responses: set[str] = set()
        # Both usage sources are added: a turn counts one of them, so the sums stay within.
        self.budget = UsageBudget()
        self.recognised = False
        # When the latest request to the model (a prompt or a tool's output) was written.
        self.asked_at: datetime | None = None
        # The folder the current turn runs in (turn_context), for relative patch paths.
        self.turn_cwd = ""
        # apply_patch calls whose outcome is not known yet: call id -> patch text.
        self.pending_patches: dict[str, str] = {}
        # Calls whose file changes were recorded (FileChange / patch_apply_* events).
        self.changed_calls: set[str] = set()
        # Shell items by call id, so Codex's reading of the command can refine them.
        self.shell_items: dict[str, dict[str, Any]] = {}
        # Changes a patch_apply_begin announced, kept until patch_apply_end says they held.
        self.pending_changes: tuple[str, list[dict[str, Any]]] | None = None
        self.session_metas = 0

    def read(self) -> None:
        for line_number, value in self.lines:
            try:
                self._line(value)
            except ValueError as exc:
                self.lines.problem(line_number, str(exc))

    def _line(self, value: Any) -> None:
        if not isinstance(value, dict):
            raise ValueError(f"line is a JSON {type(value).__name__}, not an object")
        line_type = _string(value.get("type"))
        if line_type not in LINE_TYPES:
            return  # unknown line types are newer than this parser: skip them
        self.recognised = True
        payload = value.get("payload")
        if not isinstance(payload, dict):
            raise ValueError(f"{line_type} line has no payload object")
        at = parse_timestamp(value.get("timestamp"))
        self.started_at = at if self.started_at is None else min(self.started_at, at)
        self.ended_at = at if self.ended_at is None else max(self.ended_at, at)

        if line_type == "session_meta":
            self._session_meta(payload)
        elif line_type == "turn_context":
            self._turn_context(payload)
        elif line_type == "event_msg":
            self._event_msg(payload, at)
        elif line_type == "response_item":
            self._response_item(payload, at)
        elif line_type == "token_usage_record":
            self._token_usage_record(payload, at)
        # "compacted" holds a summary of earlier history: neither a prompt nor usage.

    def _session_meta(self, payload: dict[str, Any]) -> None:
        # A resumed or forked session can carry more than one session_meta; the
        # first describes this file's session. A later one with a commit says what the
        # next turn started from.
        self.session_metas += 1
        if self.session_metas > 1:
            self._recorded_commit(payload.get("git"))
        self._first("session_id", payload.get("id"))
        self._first("cwd", payload.get("cwd"))
        self._first("cli_version", payload.get("cli_version"))
        git = payload.get("git")
        if isinstance(git, dict):
            self._first("git_commit", git.get("commit_hash"))
            self._first("git_branch", git.get("branch"))
            self._first("repository_url", git.get("repository_url"))

    def _first(self, attr: str, value: object) -> None:
        if not getattr(self, attr) and isinstance(value, str) and value:
            setattr(self, attr, value)

    def _turn_context(self, payload: dict[str, Any]) -> None:
        model = payload.get("model")
        if isinstance(model, str) and model:
            self.model = model
        self._first("cwd", payload.get("cwd"))
        if isinstance(payload.get("cwd"), str):
            self.turn_cwd = payload["cwd"]
        self._recorded_commit(payload.get("git"))
        turn_id = payload.get("turn_id")
        if isinstance(turn_id, str) and turn_id:
            self.events.append(_TurnStarted(turn_id))

    def _recorded_commit(self, git: object) -> None:
        commit = git.get("commit_hash") if isinstance(git, dict) else None
        if isinstance(commit, str) and commit:
            self.events.append(_RecordedCommit(commit))

    def _event_msg(self, payload: dict[str, Any], at: datetime) -> None:
        event_type = _string(payload.get("type"))
        if event_type == "user_message":
            # Some releases tagged injected context with a `kind`; "plain" is what the user typed.
            kind = payload.get("kind")
            text = payload.get("message")
            if kind not in (None, "plain") or not isinstance(text, str):
                return
            if payload.get("images") and not text.strip():
                text = "[image]"
            self._prompt(at, text, _string(payload.get("turn_id")), "event")
        elif event_type == "item_completed":
            item = payload.get("item")
            if not isinstance(item, dict):
                raise ValueError("item_completed event has no item object")
            item_type = _string(item.get("type", item.get("item_type")))
            if item_type in _USER_ITEMS:
                turn_id = _string(payload.get("turn_id")) or _string(item.get("turn_id"))
                self._prompt(at, _item_text(item), turn_id, "event")
            elif item_type in _ANSWER_ITEMS:
                said = _item_text(item) if item_type in _MESSAGE_ITEMS else ""
                self.events.append(_Answer(at, said))
            elif item_type == "FileChange":
                self._file_changes(item.get("id"), item.get("changes"), item.get("status"))
            elif item_type == "CommandExecution":
                self._command_output(item)
        elif event_type == "patch_apply_begin":  # releases before item_completed FileChange
            self._file_changes(payload.get("call_id"), payload.get("changes"), "pending")
        elif event_type == "patch_apply_end":
            self._patch_end(payload)
        elif event_type == "exec_command_end":
            self._command_output(payload)
        elif event_type in ("task_started", "turn_started"):
            turn_id = _string(payload.get("turn_id"))
            if turn_id:
                self.events.append(_TurnStarted(turn_id))
        elif event_type in _ANSWER_EVENTS:
            said = _item_text(payload) if event_type in _MESSAGE_ITEMS else ""
            self.events.append(_Answer(at, said))
        elif event_type == "token_count":
            counted = self._token_count(payload)
            if counted is not None and counted[0].total:
                usage, size = counted
                self.events.append(_Usage(at, self.model, usage, "count", size))
                self.events.append(_Answer(at))
        elif event_type == "thread_rolled_back":
            turns = payload.get("num_turns")
            if type(turns) is int and turns > 0:
                self.events.append(_RolledBack(turns))

    def _response_item(self, payload: dict[str, Any], at: datetime) -> None:
        item_type = _string(payload.get("type", payload.get("item_type")))
        if item_type == "message":
            role = payload.get("role")
            if role == "user":
                text = _item_text(payload)
                if not text.lstrip().startswith(_INJECTED_PREFIXES):
                    self._prompt(at, text, None, "response_item")
                self.asked_at = at
            elif role == "assistant":
                self.events.append(_Answer(at, _item_text(payload)))
        elif item_type in _MODEL_OUTPUT_ITEMS:
            self.events.append(_Answer(at))
            self._tool_call(payload)
        elif item_type in _REQUEST_ITEMS:
            self.asked_at = at
            self._tool_output(payload)

    # --- evidence ------------------------------------------------------------------------

    def _evidence(self, item: dict[str, Any]) -> None:
        self.events.append(_Evidence(item))

    def _absolute(self, path: str) -> str:
        """A path as the agent gave it, made absolute against the turn's folder."""
        if path.startswith("/") or not (self.turn_cwd or self.cwd):
            return path
        return posixpath.join(self.turn_cwd or self.cwd, path)

    def _tool_call(self, payload: dict[str, Any]) -> None:
        name = _string(payload.get("name"))
        call_id = _string(payload.get("call_id")) or ""
        arguments: Any = payload.get("input")
        if payload.get("type") == "function_call":
            try:
                arguments = json.loads(str(payload.get("arguments") or "{}"))
            except (ValueError, RecursionError):
                arguments = {}
        if name == "apply_patch":
            text = arguments.get("input") if isinstance(arguments, dict) else arguments
            if isinstance(text, str):
                self.pending_patches[call_id] = text
        elif name in _SHELL_TOOLS or payload.get("type") == "local_shell_call":
            command = _command_text(arguments if isinstance(arguments, dict) else {})
            action = payload.get("action")
            if payload.get("type") == "local_shell_call" and isinstance(action, dict):
                command = _command_text(action)
            if command:
                item = {"kind": "shell", "tool": name or "local_shell", "parsed": [],
                        "command": command[:MAX_EVIDENCE_COMMAND_CHARS],
                        "cut": len(command) > MAX_EVIDENCE_COMMAND_CHARS}  # fmt: skip
                self.shell_items[call_id] = item
                self._evidence(item)

    def _tool_output(self, payload: dict[str, Any]) -> None:
        """An apply_patch whose changes no event recorded: its own text, when it worked."""
        call_id = _string(payload.get("call_id")) or ""
        text = self.pending_patches.pop(call_id, None)
        if text is None or call_id in self.changed_calls:
            return
        output = payload.get("output")
        output = output.get("content") if isinstance(output, dict) else output
        if not isinstance(output, str) or not (
            output.startswith("Exit code: 0") or output.startswith("Success.")
        ):
            return
        for operation in patch_operations(text) or [{"op": "unknown"}]:
            if operation["op"] == "unknown":
                self._evidence({"kind": "other", "tool": "apply_patch", "path": None})
                continue
            operation["path"] = self._absolute(operation["path"])
            if operation.get("move_to"):
                operation["move_to"] = self._absolute(operation["move_to"])
            if "text" in operation:
                operation["text"] = kept_text(operation["text"])
            self._evidence({"kind": "patch", "tool": "apply_patch", **operation})

    def _file_changes(self, call_id: object, changes: object, status: object) -> None:
        """Codex's own record of what a patch changed (0.169.0: item_completed FileChange;
        older releases: patch_apply_begin, confirmed by patch_apply_end)."""
        if not isinstance(changes, dict):
            return
        call = call_id if isinstance(call_id, str) else ""
        self.changed_calls.add(call)
        self.pending_patches.pop(call, None)
        if status not in ("completed", "pending"):
            return  # failed or declined: nothing changed
        items = []
        for path, change in changes.items():
            if isinstance(path, str) and isinstance(change, dict):
                item = _change_item(self._absolute(path), change)
                if item.get("move_to"):
                    item["move_to"] = self._absolute(item["move_to"])
                items.append(item)
        if status == "pending":
            self.pending_changes = (call, items)
            return
        for item in items:
            self._evidence(item)

    def _patch_end(self, payload: dict[str, Any]) -> None:
        pending = self.pending_changes
        if (
            pending
            and pending[0] == (_string(payload.get("call_id")) or "")
            and payload.get("success")
        ):
            for item in pending[1]:
                self._evidence(item)
        self.pending_changes = None

    def _command_output(self, item: dict[str, Any]) -> None:
        """What a finished command printed: a simple `cat FILE` shows the file."""
        call_id = _string(item.get("id")) or _string(item.get("call_id")) or ""
        parsed_cmd = item.get("parsed_cmd")
        parsed = (
            [p.get("type") for p in parsed_cmd if isinstance(p, dict)]
            if isinstance(parsed_cmd, list)
            else []
        )
        shell = self.shell_items.get(call_id)
        if shell is not None:
            shell["parsed"] = [kind for kind in parsed if isinstance(kind, str)]
        command = item.get("command")
        if isinstance(command, list) and command:
            command = command[-1]  # ["/bin/bash", "-lc", "cat x"]
        output = item.get("aggregated_output", item.get("stdout"))
        match = _SIMPLE_CAT_RE.match(command) if isinstance(command, str) else None
        if not match or item.get("exit_code") != 0 or not isinstance(output, str):
            return
        whole = len(output) <= _WHOLE_OUTPUT_CHARS
        self._evidence(
            {"kind": "read", "tool": "exec_command", "path": self._absolute(match.group(1)),
             "text": kept_text(output if whole else output[:_OUTPUT_HEAD_CHARS]),
             "match": "whole" if whole else "head"}
        )  # fmt: skip

    def _prompt(
        self,
        at: datetime,
        text: str,
        turn_id: str | None,
        source: Literal["event", "response_item"],
    ) -> None:
        text = text.strip()
        if text and not text.startswith(_INJECTED_PREFIXES):
            self.events.append(_Prompt(at, text, turn_id, source))

    def _token_usage_record(self, payload: dict[str, Any], at: datetime) -> None:
        raw = _raw_usage(payload.get("usage"), "usage")
        if raw is None:
            return
        response_id = _string(payload.get("response_id"))
        # A record written twice (a resumed process replaying) counts once.
        if response_id is not None and response_id in self.recorded_responses:
            return
        usage = raw.normalised()
        self.budget.add(usage)  # past the session's bound: the line is skipped
        if response_id is not None:
            self.recorded_responses.add(response_id)
        if usage.total:
            self.events.append(_Usage(at, self.model, usage, "record", raw.input_tokens))
            self.events.append(_Answer(at))
            if self.asked_at is not None and self.asked_at <= at:
                self.events.append(_ModelTime(at, (at - self.asked_at).total_seconds()))

    def _token_count(self, payload: dict[str, Any]) -> tuple[TokenUsage, int] | None:
        """The usage this token_count event adds and the input size of the request it
        describes (its last_token_usage), or None when it adds nothing knowable.

        Codex writes the running total and the last request's usage. The total
        is the robust source: an event repeated with the same total adds 0,
        where summing last_token_usage would count it twice. When the counter
        restarted (a new process that did not restore it: the total equals the
        last request, or went down), the last request's usage is what this
        event adds.
        """
        info = payload.get("info")
        if info is None:
            return None  # rate-limit-only events carry no usage
        if not isinstance(info, dict):
            raise ValueError("token_count info is not an object")
        total = _raw_usage(info.get("total_token_usage"), "total_token_usage")
        last = _raw_usage(info.get("last_token_usage"), "last_token_usage")
        if total is None:
            usage = last.normalised() if last is not None else None
        else:
            usage = self._usage_since(self.previous_total, total, last)
        if usage is not None:
            # Past the session's bound the line is skipped, the running total left as it was.
            self.budget.add(usage)
        if total is not None:
            self.previous_total = total
        if usage is None:
            return None
        return usage, (last.input_tokens if last is not None else usage.input_size)

    @staticmethod
    def _usage_since(
        previous: _RawUsage | None, total: _RawUsage, last: _RawUsage | None
    ) -> TokenUsage | None:
        if previous is None:
            return total.normalised()
        if total == previous:
            return None  # the same event again
        if total == last or total.is_below(previous):
            return (last or total).normalised()
        return total.minus(previous).normalised()


def _raw_usage(value: object, name: str) -> _RawUsage | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ValueError(f"{name} is not an object")
    cached_key = (
        "cached_input_tokens" if "cached_input_tokens" in value else "cache_read_input_tokens"
    )
    try:
        return _RawUsage(
            input_tokens=token_count(value, "input_tokens"),
            cached_input_tokens=token_count(value, cached_key),
            cache_write_input_tokens=token_count(value, "cache_write_input_tokens"),
            output_tokens=token_count(value, "output_tokens"),
        )
    except TokensOutOfRange:
        raise
    except ValueError as exc:
        raise ValueError(f"{name}.{exc}") from None


def _string(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _command_text(arguments: dict[str, Any]) -> str:
    """The command line of a shell call: `cmd` (exec_command) or `command` (a string, or
    an argv whose last word is the script of `bash -lc`)."""
    command = arguments.get("cmd", arguments.get("command"))
    if isinstance(command, list) and command and all(isinstance(w, str) for w in command):
        if len(command) >= 3 and command[-2] in ("-c", "-lc"):
            return str(command[-1])
        return " ".join(command)
    return command if isinstance(command, str) else ""


def _change_item(path: str, change: dict[str, Any]) -> dict[str, Any]:
    """One file of a Codex FileChange as a patch item. 0.169.0 writes {type: add, content},
    {type: delete, content}, {type: update, unified_diff, move_path}; older releases
    {add: {content}}, {delete: {content}}, {update: {unified_diff, move_path}}."""
    kind = change.get("type")
    body = change
    if not isinstance(kind, str):
        kind = next((key for key in ("add", "delete", "update") if key in change), "")
        body = change.get(kind) if isinstance(change.get(kind), dict) else {}
    item: dict[str, Any] = {"kind": "patch", "tool": "apply_patch", "path": path, "op": kind}
    if kind in ("add", "delete"):
        content = body.get("content")
        item["text"] = kept_text(content) if isinstance(content, str) else None
    elif kind == "update":
        diff = body.get("unified_diff")
        item["hunks"] = unified_hunks(diff) if isinstance(diff, str) else None
        move = body.get("move_path")
        item["move_to"] = move if isinstance(move, str) and move else None
    else:
        return {"kind": "other", "tool": "apply_patch", "path": path}
    return item


def _item_text(item: dict[str, Any]) -> str:
    """Text of a message item: content blocks (input_text / text), or a plain text field."""
    content = item.get("content")
    if isinstance(content, str):
        return content
    texts: list[str] = []
    has_image = False
    if isinstance(content, list):
        for block in content:
            if not isinstance(block, dict):
                continue
            if isinstance(block.get("text"), str):
                texts.append(block["text"])
            elif block.get("type") in ("image", "input_image", "local_image"):
                has_image = True
    for key in ("text", "message"):
        if not texts and isinstance(item.get(key), str):
            texts.append(item[key])
    text = "\n".join(texts)
    if not text.strip() and has_image:
        return "[image]"
    return text


def parse_codex(path: Path, *, max_bytes: int, data: bytes | None = None) -> ParsedThread:
    """Parse one Codex rollout file (its bytes ``data`` when already read)."""
    lines = JsonLines(path, max_bytes=max_bytes, data=data)
    reader = _Reader(lines)
    reader.read()
    if not reader.recognised:
        raise TranscriptError(f"{path.name} is not a Codex session file")

    session_id = reader.session_id or _session_id_from_name(path)
    turns, before = _build_turns(reader.events, session_id)
    for turn in turns:
        turn.evidence.relative_to(reader.cwd)
    return ParsedThread(
        kind=KIND,
        session_id=session_id,
        title=make_title(turns[0].request) if turns else "",
        cwd=reader.cwd,
        git_branch=reader.git_branch,
        git_commit=reader.git_commit,
        repository_url=reader.repository_url,
        cli_version=reader.cli_version,
        started_at=reader.started_at,
        ended_at=reader.ended_at,
        turns=turns,
        problems=lines.problems,
        lines_read=lines.lines_read,
        pre_turn_usage_by_model=before.usage_by_model,
        pre_turn_long_context_usage=before.long_context,
    )


def _session_id_from_name(path: Path) -> str:
    # rollout-2025-10-01T12-00-00-<uuid>.jsonl: the uuid is the session id.
    match = _ROLLOUT_UUID_RE.search(path.stem)
    return match.group(1) if match else path.stem


@dataclass
class _Sums:
    """Usage per model with its long-context part (one source of one turn, or the work
    before the first turn)."""

    usage_by_model: dict[str, TokenUsage] = field(default_factory=dict)
    long_context: LongContextUsage = field(default_factory=dict)

    def add(self, event: _Usage) -> None:
        add_request(
            self.usage_by_model, self.long_context, event.model, event.usage, event.input_size
        )


def _build_turns(events: list[_Event], session_id: str) -> tuple[list[ParsedTurn], _Sums]:
    """Step two: events -> turns, and the usage before the first turn. Each usage and
    answer serves the latest turn."""
    # Prompt events are authoritative. Files without them (the oldest format)
    # fall back to user response_items, already stripped of injected context.
    source = (
        "event"
        if any(isinstance(e, _Prompt) and e.source == "event" for e in events)
        else "response_item"
    )
    turns: list[ParsedTurn] = []
    turn_ids: list[str | None] = []  # the Codex turn id of each turn, when known
    # Per turn, usage by source and model; one source is chosen per turn at the end.
    usage: list[dict[str, _Sums]] = []
    before: dict[str, _Sums] = {"record": _Sums(), "count": _Sums()}
    used_ids: set[str] = set()
    latest_turn_id: str | None = None
    worked = False  # usage or an answer since the latest prompt
    recorded: str | None = None  # a commit recorded for the next turn

    for event in events:
        if isinstance(event, _TurnStarted):
            latest_turn_id = event.turn_id
        elif isinstance(event, _RecordedCommit):
            recorded = event.commit
        elif isinstance(event, _RolledBack):
            # Codex drops the latest turns from the thread's history; they were still run.
            for turn in turns[-event.turns :]:
                turn.rolled_back = True
        elif isinstance(event, _Evidence):
            if turns:
                turns[-1].evidence.add(event.item)
        elif isinstance(event, _Prompt):
            if event.source != source:
                continue
            if turns:
                current_id = turn_ids[-1]
                # One prompt recorded twice (user_message and item_completed),
                # or a message the user added to a turn still running.
                same_id = event.turn_id is not None and event.turn_id == current_id
                repeated = not worked and event.text == turns[-1].request
                if same_id or repeated:
                    if event.turn_id and current_id is None and event.turn_id not in used_ids:
                        turn_ids[-1] = event.turn_id
                        used_ids.add(event.turn_id)
                        turns[-1].message_uuid = event.turn_id
                    continue
            turn_id = event.turn_id
            if turn_id is None and latest_turn_id is not None and latest_turn_id not in used_ids:
                turn_id = latest_turn_id
            if turn_id is not None and turn_id in used_ids:
                turn_id = None
            if turn_id is not None:
                used_ids.add(turn_id)
            turn_ids.append(turn_id)
            usage.append({"record": _Sums(), "count": _Sums()})
            turns.append(
                ParsedTurn(
                    index=len(turns),
                    message_uuid=turn_id or f"{session_id}:{len(turns)}",
                    timestamp=event.at,
                    request=event.text,
                )
            )
            if recorded:
                turns[-1].evidence.recorded_commit = recorded[:40]
                recorded = None
            worked = False
        elif not turns:
            # Work before the first prompt serves no turn; the thread keeps its usage.
            if isinstance(event, _Usage):
                before[event.source].add(event)
        else:
            turn = turns[-1]
            worked = True
            if turn.last_answer_at is None or event.at > turn.last_answer_at:
                turn.last_answer_at = event.at
            if isinstance(event, _ModelTime):
                turn.model_seconds = (turn.model_seconds or 0.0) + event.seconds
            if isinstance(event, _Answer) and event.text:
                turn.answered(event.text)
            if isinstance(event, _Usage):
                usage[-1][event.source].add(event)

    for turn, by_source in zip(turns, usage, strict=True):
        # Per-response records are exact; token_count deltas cover files (or
        # turns written by older releases) that have no records.
        chosen = _chosen(by_source)
        turn.usage_by_model = chosen.usage_by_model
        turn.long_context_usage = chosen.long_context
    make_message_ids_unique(turns)
    return turns, _chosen(before)


def _chosen(by_source: dict[str, _Sums]) -> _Sums:
    return by_source["record"] if by_source["record"].usage_by_model else by_source["count"]
