"""Gemini CLI sessions (``~/.gemini/tmp/<project>/chats/session-*.json[l]``) -> ParsedThread.

Two formats, one content:

- ``.json`` (before v0.39): one object, rewritten whole on every change: ``sessionId``,
  ``projectHash`` (the SHA-256 of the project's folder), ``startTime``, ``lastUpdated``,
  ``messages``, later ``kind`` (main | subagent), ``summary``, ``directories``.
- ``.jsonl`` (v0.39 on): line 1 is that object without ``messages``; each message is appended
  whole, and again every time it changes (its tokens, its tool calls arrive later): the last
  line with an ``id`` wins, in the place of the first. ``{"$set": {...}}`` updates the
  metadata (Cloud Shell's server writes the whole ``messages`` list that way);
  ``{"$rewindTo": id}`` takes that message and all after it back out of the conversation
  (they were still sent and paid for: their turns are marked rolled back).

Messages: ``user`` (``content`` a string, or Gemini parts: text, functionResponse, ...;
``displayContent`` is what the user typed when the CLI sent more), ``gemini`` (``content``
the visible text, ``model``, ``tokens``, ``toolCalls``, ``thoughts``), ``info``, ``error``,
``warning``. A request is a user message with text and no function response; the CLI's own
``<session_context>`` message is not one. Each ``gemini`` message is one API response:
``tokens`` = input (the prompt, its cached part included), cached, output, thoughts, tool
(the tool-use prompt), total. Read as ccusage reads them: when total = input + output +
thoughts + tool, cached is part of input; else it is apart. Thoughts are output (they are
billed as output). Gemini CLI records no cost and no version.

A sub-agent writes its own file, ``chats/<parent session id>/<id>.json[l]``: it is read with
its parent, each response counted in the parent's turn whose time holds it (like Claude
Code's sub-agents). A sub-agent file read alone (``kind: "subagent"``, e.g. the background
skill extraction) has no request of a person: its usage is the thread's, before any turn.

The folder is not recorded in the file: it comes from the CLI's own context message
(``Workspace Directories``), else ``.project_root`` beside the project's folder, else
``~/.gemini/projects.json``, each checked against ``projectHash`` when that is a SHA-256.
Two files can hold one session (a session continued into a new file, Cloud Shell's fixed
``a2a-server``): the earliest keeps the id, the later ones are ``<id>~2``, ``<id>~3``.
"""

from __future__ import annotations

import hashlib
import json
import re
from bisect import bisect_right
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from replays.transcripts.base import (
    Evidence,
    LineProblem,
    ParsedThread,
    ParsedTurn,
    TokenUsage,
    TranscriptError,
    UsageBudget,
    edit_item,
    make_message_ids_unique,
    shell_item,
    write_item,
)
from replays.transcripts.claude_code import (
    JsonLines,
    check_size,
    clean_strings,
    make_title,
    parse_timestamp,
    token_counts,
)

KIND = "gemini"
UNKNOWN_MODEL = "unknown"
MESSAGE_TYPES = frozenset({"user", "gemini", "info", "error", "warning"})
_CONTEXT_PREFIX = "<session_context>"
_WORKSPACE_RE = re.compile(r"Workspace Directories:\**\s*\n\s*-\s*(\S[^\n]*)")
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# A sub-agent's folder is its parent's full session id.
_UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# What the start of a session file says (read without parsing the whole file).
_HEAD_ID_RE = re.compile(rb'"sessionId"\s*:\s*"([^"\\]{1,200})"')
_HEAD_START_RE = re.compile(rb'"startTime"\s*:\s*"([^"\\]{1,64})"')
_HEAD_BYTES = 4096


def _is_type(kind: object) -> bool:
    return isinstance(kind, str) and kind in MESSAGE_TYPES


def looks_like_gemini_line(value: object) -> bool:
    """Whether a parsed JSONL line is recognisably Gemini CLI's: its metadata line, an update
    of it, or a message (an ``id``, a Gemini CLI type, no Claude Code ids)."""
    if not isinstance(value, dict):
        return False
    if isinstance(value.get("sessionId"), str) and "projectHash" in value:
        return True
    if "$set" in value or "$rewindTo" in value:
        return len(value) == 1
    kind = value.get("type")
    return (
        _is_type(kind)
        and isinstance(value.get("id"), str)
        and "content" in value
        and "uuid" not in value
        and "sessionId" not in value
    )


def looks_like_gemini_document(value: object) -> bool:
    """Whether a whole JSON document is a Gemini CLI session (the .json format)."""
    return (
        isinstance(value, dict)
        and isinstance(value.get("sessionId"), str)
        and isinstance(value.get("messages"), list)
    )


@dataclass
class _Session:
    """One file's content: its metadata and its messages, the latest version of each."""

    meta: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    # The line each message was last read from (1 for the .json format: one document).
    lines: list[int] = field(default_factory=list)
    # Ids of the messages a $rewindTo took back out (they were still sent).
    rewound: set[str] = field(default_factory=set)
    problems: list[LineProblem] = field(default_factory=list)
    lines_read: int = 0


def _read_session(path: Path, *, max_bytes: int, data: bytes | None) -> _Session:
    """The file as a _Session: a .json document, or .jsonl lines."""
    if data is None:
        check_size(path, max_bytes=max_bytes)
        data = path.read_bytes()
    document = _whole_document(data)
    if document is not None and looks_like_gemini_document(document):
        session = _Session(meta={k: v for k, v in document.items() if k != "messages"})
        session.lines_read = 1
        for position, message in enumerate(document["messages"], start=1):
            if isinstance(message, dict) and _is_type(message.get("type")):
                session.messages.append(message)
                session.lines.append(1)
            else:
                session.problems.append(
                    LineProblem(1, f"message {position} is not a message object")
                )
        return session
    return _read_lines(path, max_bytes=max_bytes, data=data)


def _whole_document(data: bytes) -> Any:
    """The file read as one JSON value when it is one (the .json format), else None."""
    head = data.lstrip()[:1]
    if head not in (b"{", b"\xef"):
        return None
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return clean_strings(value) if isinstance(value, dict) else None


def _read_lines(path: Path, *, max_bytes: int, data: bytes) -> _Session:
    lines = JsonLines(path, max_bytes=max_bytes, data=data)
    session = _Session()
    positions: dict[str, int] = {}
    # Ids of the messages appended as lines of their own: those are the record (their
    # tokens, their times). A resumed session (0.61) writes its whole history again as
    # `$set: {messages}`, rebuilt without tokens and dated at the resume: that copy never
    # replaces a message appended before. Messages known only from `$set` (Cloud Shell's
    # server writes nothing else) take their latest version.
    appended: set[str] = set()
    recognised = False
    for line_number, value in lines:
        if not isinstance(value, dict):
            lines.problem(line_number, f"line is a JSON {type(value).__name__}, not an object")
            continue
        if "$set" in value:
            update = value["$set"]
            if not isinstance(update, dict):
                lines.problem(line_number, "$set is not an object")
                continue
            recognised = True
            messages = update.get("messages")
            if isinstance(messages, list):
                for message in messages:
                    identifier = message.get("id") if isinstance(message, dict) else None
                    if not isinstance(identifier, str) or not _is_type(message.get("type")):
                        continue
                    if identifier in appended:
                        continue
                    if identifier in positions:
                        session.messages[positions[identifier]] = message
                        session.lines[positions[identifier]] = line_number
                    else:
                        positions[identifier] = len(session.messages)
                        session.messages.append(message)
                        session.lines.append(line_number)
            _update_meta(session.meta, {k: v for k, v in update.items() if k != "messages"})
        elif "$rewindTo" in value:
            recognised = True
            target = value["$rewindTo"]
            if isinstance(target, str) and target in positions:
                for message in session.messages[positions[target] :]:
                    if isinstance(message.get("id"), str):
                        session.rewound.add(message["id"])
        elif isinstance(value.get("sessionId"), str) and "projectHash" in value:
            recognised = True
            _update_meta(session.meta, {k: v for k, v in value.items() if k != "messages"})
        elif _is_type(value.get("type")):
            recognised = True
            identifier = value.get("id")
            if not isinstance(identifier, str):
                lines.problem(line_number, "message has no id")
                continue
            if identifier in positions:
                session.messages[positions[identifier]] = value  # a newer version of it
                session.lines[positions[identifier]] = line_number
            else:
                positions[identifier] = len(session.messages)
                session.messages.append(value)
                session.lines.append(line_number)
            appended.add(identifier)
            session.rewound.discard(identifier)
        # Anything else is newer than this parser: skipped.
    if not recognised:
        raise TranscriptError(f"{path.name} is not a Gemini CLI session")
    session.problems = lines.problems
    session.lines_read = lines.lines_read
    return session


def _update_meta(meta: dict[str, Any], update: dict[str, Any]) -> None:
    """The metadata with an update: a resumed session writes its metadata again, dated at
    the resume; the session still began when it first did."""
    for key, value in update.items():
        if key == "startTime" and key in meta:
            continue
        meta[key] = value


# --- reading a session's messages -------------------------------------------------------


def _parts(content: object) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"text": content}]
    if isinstance(content, dict):
        return [content]
    return [part for part in content if isinstance(part, dict)] if isinstance(content, list) else []


def _text_of(content: object) -> str:
    texts = [part["text"] for part in _parts(content) if isinstance(part.get("text"), str)]
    return "\n".join(texts)


def _is_tool_result(content: object) -> bool:
    return any("functionResponse" in part for part in _parts(content))


def _has_image(content: object) -> bool:
    return any("inlineData" in part or "fileData" in part for part in _parts(content))


def _usage(tokens: dict[str, Any]) -> tuple[TokenUsage, int]:
    """One response's usage as disjoint kinds, and its prompt's size (for long-context
    prices), read as ccusage reads Gemini CLI's tokens."""
    prompt, output, cached, thoughts, tool, total = token_counts(
        tokens, ("input", "output", "cached", "thoughts", "tool", "total"), "tokens"
    )
    if total == prompt + output + thoughts + tool:
        input_tokens = max(prompt - cached, 0) + tool  # cached is part of the prompt
    else:
        input_tokens = prompt + tool  # cached was counted apart
    usage = TokenUsage(
        input_tokens=input_tokens, output_tokens=output + thoughts, cache_read_tokens=cached
    )
    return usage, input_tokens + cached


@dataclass
class _Response:
    at: datetime
    model: str
    usage: TokenUsage
    input_size: int
    asked_at: datetime | None  # when the request it answered was sent


@dataclass
class _Parsed:
    """One session file read: its requests (turns) and every response, placed later."""

    session_id: str
    meta: dict[str, Any]
    turns: list[ParsedTurn]
    responses: list[_Response]
    cwd_hint: str
    started_at: datetime | None
    ended_at: datetime | None
    problems: list[LineProblem]
    lines_read: int


def _walk(path: Path, session: _Session, *, requests: bool) -> _Parsed:
    """The session's turns (when ``requests``: a sub-agent's prompts are not a person's)
    and its responses, each response served by the latest turn before it."""
    turns: list[ParsedTurn] = []
    responses: list[_Response] = []
    problems = list(session.problems)
    budget = UsageBudget()
    cwd_hint = ""
    started: datetime | None = None
    ended: datetime | None = None
    asked_at: datetime | None = None  # the latest request to the model
    session_id = (
        session.meta.get("sessionId") if isinstance(session.meta.get("sessionId"), str) else ""
    )
    for position, (message, where) in enumerate(
        zip(session.messages, session.lines, strict=True), start=1
    ):
        try:
            at = parse_timestamp(message.get("timestamp"))
        except ValueError as exc:
            problems.append(
                LineProblem(where, f"message {message.get('id', position)!s:.40}: {exc}")
            )
            continue
        started = at if started is None else min(started, at)
        ended = at if ended is None else max(ended, at)
        kind = message.get("type")
        content = message.get("content")
        if kind == "user":
            asked_at = at
            text = _text_of(content).strip()
            if _is_tool_result(content):
                continue
            if text.startswith(_CONTEXT_PREFIX):
                found = _WORKSPACE_RE.search(text)
                if found and not cwd_hint:
                    cwd_hint = found.group(1).strip()
                continue
            if not text and _has_image(content):
                text = "[image]"
            if not text or not requests:
                continue
            shown = _text_of(message.get("displayContent")).strip()
            identifier = message.get("id")
            turn = ParsedTurn(
                index=len(turns),
                message_uuid=identifier
                if isinstance(identifier, str) and identifier
                else f"{session_id}:{len(turns)}",
                timestamp=at,
                request=shown or text,
                request_as_sent=text if shown and shown != text else "",
                rolled_back=identifier in session.rewound,
            )
            turns.append(turn)
        elif kind == "gemini":
            tokens = message.get("tokens")
            model = message.get("model")
            model = model if isinstance(model, str) and model else UNKNOWN_MODEL
            if tokens is not None:
                if not isinstance(tokens, dict):
                    problems.append(LineProblem(where, "tokens is not an object"))
                else:
                    try:
                        usage, size = _usage(tokens)
                        budget.add(usage)
                    except ValueError as exc:
                        problems.append(LineProblem(where, str(exc)))
                    else:
                        if usage.total:
                            responses.append(_Response(at, model, usage, size, asked_at))
            calls = [c for c in message.get("toolCalls") or [] if isinstance(c, dict)]
            finished = at
            for call in calls:
                try:
                    finished = max(finished, parse_timestamp(call.get("timestamp")))
                except ValueError:
                    pass
            asked_at = finished if calls else asked_at
            if turns and requests:
                turn = turns[-1]
                if turn.last_answer_at is None or finished > turn.last_answer_at:
                    turn.last_answer_at = finished
                turn.answered(_text_of(content))
                for call in calls:
                    _tool_evidence(turn.evidence, call)
        # info, error and warning messages are the CLI's own notes.
    return _Parsed(
        session_id=session_id, meta=session.meta, turns=turns, responses=responses,
        cwd_hint=cwd_hint, started_at=started, ended_at=ended, problems=_one_per_line(problems),
        lines_read=session.lines_read,
    )  # fmt: skip


def _one_per_line(problems: list[LineProblem]) -> list[LineProblem]:
    """One problem a line: a line holding several messages (a `$set`, the .json document)
    says all of its problems at once."""
    by_line: dict[int, list[str]] = {}
    for problem in problems:
        by_line.setdefault(problem.line_number, []).append(problem.message)
    return [
        LineProblem(number, messages[0] if len(messages) == 1 else "; ".join(messages)[:1000])
        for number, messages in sorted(by_line.items())
    ]


def _tool_evidence(evidence: Evidence, call: dict[str, Any]) -> None:
    """The evidence of one successful call of Gemini CLI's file and shell tools."""
    if call.get("status") != "success":
        return  # failed, cancelled or refused: nothing changed
    name = call.get("name")
    arguments = call.get("args")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return
    path = arguments.get("file_path", arguments.get("absolute_path"))
    path = path if isinstance(path, str) and path else None
    if name == "read_file" and path:
        # Its output may be cut or masked: only that the file was read is kept.
        evidence.add({"kind": "read", "tool": name, "path": path, "text": None, "match": "whole"})
    elif name == "write_file" and path and isinstance(arguments.get("content"), str):
        evidence.add(write_item(name, path, arguments["content"]))
    elif name in ("replace", "edit") and path:
        old, new = arguments.get("old_string"), arguments.get("new_string")
        if isinstance(old, str) and isinstance(new, str):
            count = arguments.get("expected_replacements")
            every = arguments.get("allow_multiple") is True or (type(count) is int and count > 1)
            evidence.add(edit_item(name, path, old, new, every=every))
    elif name == "run_shell_command" and isinstance(arguments.get("command"), str):
        evidence.add(shell_item(name, arguments["command"]))


# --- where the session ran ----------------------------------------------------------------


def _project_folder(path: Path) -> Path | None:
    """The project's folder under ~/.gemini/tmp that holds the file (tmp/<project>/chats/...)."""
    for parent in path.parents:
        if parent.name == "chats":
            return parent.parent
    return None


def _cwd(path: Path, parsed: _Parsed) -> str:
    """The session's folder: what the session says itself (the CLI's context message, its
    `directories`), else the project folder's .project_root or projects.json, taken only
    when it agrees with projectHash (when that is a SHA-256): those say where the project
    folder's name is used now, which need not be where this session ran."""
    directories = parsed.meta.get("directories")
    said = [parsed.cwd_hint]
    if isinstance(directories, list):
        said += [d for d in directories if isinstance(d, str)]
    for folder in said:
        if folder:
            return folder
    project_hash = parsed.meta.get("projectHash")
    project_hash = (
        project_hash if isinstance(project_hash, str) and _SHA256_RE.match(project_hash) else ""
    )
    project = _project_folder(path)
    if project is None:
        return ""
    registered: list[str] = []
    try:
        registered.append((project / ".project_root").read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError):
        pass
    registered += _registered_roots(project)
    for folder in registered:
        if folder and (
            not project_hash or hashlib.sha256(folder.encode()).hexdigest() == project_hash
        ):
            return folder
    return ""


def _registered_roots(project: Path) -> list[str]:
    """The folders ~/.gemini/projects.json names for this project folder (v0.29 on)."""
    registry = project.parent.parent / "projects.json"
    try:
        if registry.stat().st_size > 10 * 1024 * 1024:
            return []
        value = json.loads(registry.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        return []
    projects = value.get("projects") if isinstance(value, dict) else None
    if not isinstance(projects, dict):
        return []
    return [
        root for root, name in projects.items() if name == project.name and isinstance(root, str)
    ]


# --- sessions spread over files -----------------------------------------------------------


def _head(path: Path) -> tuple[str, str]:
    """(sessionId, startTime) from the start of a session file, "" where not found."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES)
    except OSError:
        return "", ""
    found_id, found_start = _HEAD_ID_RE.search(head), _HEAD_START_RE.search(head)
    return (
        found_id.group(1).decode("utf-8", "replace") if found_id else "",
        found_start.group(1).decode("utf-8", "replace") if found_start else "",
    )


def _numbered_id(path: Path, session_id: str, started: str) -> str:
    """The thread's id: the session id, or ``<id>~N`` when N-1 other files beside this one
    began the same session earlier (a session continued into a new file)."""
    try:
        siblings = [
            p for p in path.parent.iterdir() if p != path and p.suffix in (".json", ".jsonl")
        ]
    except OSError:
        return session_id
    earlier = 0
    for sibling in siblings:
        other_id, other_start = _head(sibling)
        if other_id == session_id and (other_start, sibling.name) < (started, path.name):
            earlier += 1
    return session_id if earlier == 0 else f"{session_id}~{earlier + 1}"


def subagent_files(path: Path, session_id: str) -> list[Path]:
    """The sub-agent files of the session in ``path``: chats/<session id>/*.json[l]."""
    if not session_id or not _UUID_RE.match(session_id):
        return []
    folder = path.parent / session_id
    try:
        return sorted(
            p for p in folder.iterdir() if p.suffix in (".json", ".jsonl") and p.is_file()
        )
    except OSError:
        return []


def is_nested_subagent_file(path: Path) -> bool:
    """Whether ``path`` is a sub-agent's file whose parent session file is beside its folder
    (it is read with the parent, not alone)."""
    folder = path.parent
    if not _UUID_RE.match(folder.name) or folder.parent.name != "chats":
        return False
    short = folder.name[:8]
    return any(folder.parent.glob(f"session-*-{short}.json*"))


def parse_gemini(path: Path, *, max_bytes: int, data: bytes | None = None) -> ParsedThread:
    """Parse one Gemini CLI session file (its bytes ``data`` when already read), with the
    sub-agent files beside it."""
    session = _read_session(path, max_bytes=max_bytes, data=data)
    alone_subagent = session.meta.get("kind") == "subagent"
    parsed = _walk(path, session, requests=not alone_subagent)
    if not parsed.session_id:
        raise TranscriptError(f"{path.name} is not a Gemini CLI session: it names no sessionId")
    responses = list(parsed.responses)
    started_at, ended_at = parsed.started_at, parsed.ended_at
    subagent_runs: list[datetime] = []
    for file in subagent_files(path, parsed.session_id):
        try:
            sub = _walk(file, _read_session(file, max_bytes=max_bytes, data=None), requests=False)
        except (OSError, TranscriptError) as exc:
            parsed.problems.append(LineProblem(1, f"sub-agent file {file.name}: {exc}"))
            continue
        # A session continued into a second file keeps one folder of sub-agents: each is
        # read with the file whose time holds its start.
        if sub.started_at is None or started_at is None or ended_at is None:
            continue
        if not started_at <= sub.started_at <= ended_at:
            continue
        responses += sub.responses
        subagent_runs.append(sub.started_at)
    meta_start = session.meta.get("startTime")
    started_text = meta_start if isinstance(meta_start, str) else ""
    try:
        begun = parse_timestamp(meta_start)
    except ValueError:
        begun = None
    if begun is not None and (started_at is None or begun < started_at):
        started_at = begun
        ended_at = ended_at if ended_at is not None and ended_at >= begun else begun
    thread = ParsedThread(
        kind=KIND,
        session_id=_numbered_id(path, parsed.session_id, started_text),
        title="",
        cwd=_cwd(path, parsed),
        git_branch="",
        git_commit="",
        repository_url="",
        cli_version="",
        started_at=started_at,
        ended_at=ended_at,
        turns=parsed.turns,
        problems=parsed.problems,
        lines_read=parsed.lines_read,
    )
    _place(thread, responses, subagent_runs)
    for turn in thread.turns:
        turn.evidence.relative_to(thread.cwd)
    make_message_ids_unique(thread.turns)
    summary = session.meta.get("summary")
    first = thread.turns[0].request if thread.turns else ""
    thread.title = make_title(first) or (make_title(summary) if isinstance(summary, str) else "")
    return thread


def _place(thread: ParsedThread, responses: list[_Response], subagent_runs: list[datetime]) -> None:
    """Each response in the turn whose window [its request, the next request) holds it;
    before the first request, the thread's own. A sub-agent run is marked in its turn."""
    starts = [turn.timestamp for turn in thread.turns]
    for response in sorted(responses, key=lambda r: r.at):
        index = bisect_right(starts, response.at) - 1
        if index < 0:
            thread.add_pre_turn_request(response.model, response.usage, response.input_size)
            continue
        turn = thread.turns[index]
        turn.add_request(response.model, response.usage, response.input_size)
        if turn.last_answer_at is None or response.at > turn.last_answer_at:
            turn.last_answer_at = response.at
        if response.asked_at is not None and response.asked_at <= response.at:
            seconds = (response.at - response.asked_at).total_seconds()
            turn.model_seconds = (turn.model_seconds or 0.0) + seconds
    for started in subagent_runs:
        index = bisect_right(starts, started) - 1
        if index >= 0:
            thread.turns[index].evidence.add({"kind": "other", "tool": "subagent", "path": None})
