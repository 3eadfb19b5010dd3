"""OpenCode sessions -> ParsedThread, from any of OpenCode's layouts.

OpenCode (npm ``opencode-ai``) keeps its sessions in its data home
(``~/.local/share/opencode``), in one of three layouts:

- 1.2 on: the SQLite database ``opencode.db`` (``opencode-<channel>.db`` for other release
  channels): tables ``session``, ``message`` (``data``: the message object without its ids)
  and ``part``. Read read-only; a session there is named ``<database>/<session id>``.
- 0.6 to 1.1: JSON files, ``storage/session/<project>/<session>.json``,
  ``storage/message/<session>/<message>.json``, ``storage/part/<message>/<part>.json``.
- 0.5: ``project/<project>/storage/session/info/<session>.json``,
  ``.../session/message/<session>/<message>.json``, ``.../session/part/<session>/<message>/<part>.json``.

Whichever it is, a session is first assembled into the document ``opencode export <id>``
prints: ``{"info": session, "messages": [{"info": message, "parts": [...]}]}``, with two
keys of ours: ``children`` (its sub-agents' sessions, documents of the same shape: their work
is counted in the parent's turns, as Claude Code's sub-agents are) and ``problems`` (the files
of it that could not be read). That document is what is parsed, kept as the thread's
transcript and hashed; an ``opencode export`` file uploaded is read the same way.

- A request is a user message with text that OpenCode did not add itself (``synthetic``
  parts are its own context); a message that only compacts the conversation is not one.
- An assistant message answers its ``parentID`` (the request); it may span several model
  calls, one ``step-finish`` part each with its tokens and cost, the message's ``tokens`` their
  sum. ``tokens`` = input, output, reasoning, cache {read, write}, total: disjoint in
  current releases; as ccusage reads them, what ``total`` counts beyond the four is output
  (reasoning). OpenCode records the cost it computed (models.dev prices): a cost above 0 is
  the request's; a 0 (a free or unpriced model, older releases) is priced from the table.
- The folder is the session's ``directory`` (0.5: the assistant's ``path.cwd``); OpenCode
  records its version, no git commit or branch.
"""

from __future__ import annotations

import json
import re
import sqlite3
import urllib.parse
from bisect import bisect_right
from dataclasses import dataclass
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
    kept_text,
    make_message_ids_unique,
    patch_operations,
    recorded_usd,
    shell_item,
    write_item,
)
from replays.transcripts.claude_code import (
    clean_strings,
    epoch_ms,
    make_title,
    token_counts,
)

KIND = "opencode"
UNKNOWN_MODEL = "unknown"
DATABASE_RE = re.compile(r"^opencode(?:-[A-Za-z0-9_.-]+)?\.db$")
SESSION_ID_RE = re.compile(r"^ses_[A-Za-z0-9]{1,100}$")
# How deep sub-agents' sessions are followed (a sub-agent may start its own).
MAX_CHILD_DEPTH = 4


def looks_like_opencode_document(value: object) -> bool:
    """Whether a JSON document is an OpenCode session as ``opencode export`` prints it."""
    if not isinstance(value, dict) or not isinstance(value.get("messages"), list):
        return False
    info = value.get("info")
    return (
        isinstance(info, dict) and isinstance(info.get("id"), str) and info["id"].startswith("ses_")
    )


# --- where sessions are ---------------------------------------------------------------


def is_database(path: Path) -> bool:
    return bool(DATABASE_RE.match(path.name))


def database_session(path: Path) -> tuple[Path, str] | None:
    """(database, session id) when ``path`` names a session in a database
    (``.../opencode.db/ses_...``), else None."""
    if is_database(path.parent) and SESSION_ID_RE.match(path.name):
        return path.parent, path.name
    return None


def storage_session(path: Path) -> str | None:
    """The layout of a session file of OpenCode's JSON storage: "storage" (0.6 to 1.1:
    storage/session/<project>/<id>.json), "project" (0.5: .../storage/session/info/<id>.json),
    None for any other path."""
    if path.suffix != ".json" or not SESSION_ID_RE.match(path.stem):
        return None
    parents = path.parents
    if (
        len(parents) >= 3
        and parents[0].name == "info"
        and parents[1].name == "session"
        and parents[2].name == "storage"
    ):
        return "project"
    if len(parents) >= 3 and parents[1].name == "session" and parents[2].name == "storage":
        return "storage"
    return None


def is_assembled(path: Path) -> bool:
    """Whether the session at ``path`` is assembled from a database or from many files
    (its bytes are the assembled document, not the file's)."""
    return database_session(path) is not None or storage_session(path) is not None


def _connect(database: Path) -> sqlite3.Connection:
    """The database opened read-only (never written, never locked against OpenCode)."""
    location = urllib.parse.quote(str(database.resolve()))
    try:
        connection = sqlite3.connect(f"file:{location}?mode=ro", uri=True, timeout=10)
        connection.execute("SELECT 1 FROM session LIMIT 1")
    except sqlite3.OperationalError:
        # A read-only folder next to a WAL file: read the file as it is, without the WAL.
        connection = sqlite3.connect(f"file:{location}?immutable=1", uri=True, timeout=10)
    return connection


def database_sessions(database: Path) -> list[Path]:
    """The sessions of a database a thread each: those with no parent (or a parent that is
    not there), oldest first. TranscriptError when it is not OpenCode's database."""
    try:
        connection = _connect(database)
        try:
            rows = connection.execute(
                "SELECT id FROM session WHERE parent_id IS NULL OR parent_id = '' "
                "OR parent_id NOT IN (SELECT id FROM session) ORDER BY time_created, id"
            ).fetchall()
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise TranscriptError(
            f"{database.name} is not an OpenCode database that can be read: {exc}"
        ) from None
    return [
        database / row[0] for row in rows if isinstance(row[0], str) and SESSION_ID_RE.match(row[0])
    ]


def storage_sessions(folder: Path) -> list[Path]:
    """The session files of a JSON storage folder (``storage/session/<project>/`` or 0.5's
    ``session/info/``) a thread each: those whose parent session is not among them."""
    files = sorted(p for p in folder.glob("*.json") if SESSION_ID_RE.match(p.stem))
    parents = {p.stem: _json_file(p).get("parentID") for p in files}
    return [
        p for p in files if not (isinstance(parents[p.stem], str) and parents[p.stem] in parents)
    ]


def _json_file(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


# --- assembling a session's document -------------------------------------------------------


class _Budget:
    """The bytes a document may still take: one over the transcript limit is refused."""

    def __init__(self, name: str, max_bytes: int) -> None:
        self.name = name
        self.left = max_bytes

    def take(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise TranscriptError(f"{self.name} is larger than the transcript limit")


def session_document(path: Path, *, max_bytes: int) -> bytes:
    """The document of the session at ``path`` (a database's or a storage file's), as bytes:
    compact JSON, the same bytes for the same content. TranscriptError when it cannot be
    read or is larger than ``max_bytes``."""
    budget = _Budget(path.name, max_bytes)
    found = database_session(path)
    if found is not None:
        database, session_id = found
        try:
            connection = _connect(database)
            try:
                document = _database_document(connection, session_id, budget, depth=0)
            finally:
                connection.close()
        except sqlite3.Error as exc:
            raise TranscriptError(f"{path}: the database cannot be read: {exc}") from None
        if document is None:
            raise TranscriptError(f"{path}: no such session in {database.name}")
    else:
        layout = storage_session(path)
        if layout is None:
            raise TranscriptError(f"{path.name} is not an OpenCode session")
        document = _storage_document(path, layout, budget, depth=0)
    data = json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )
    if len(data) > max_bytes:
        raise TranscriptError(
            f"{path.name} is {len(data)} bytes, larger than the limit of {max_bytes} bytes"
        )
    return data


def _loaded(text: object, budget: _Budget) -> Any:
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    if not isinstance(text, str):
        return None
    budget.take(len(text))
    try:
        return clean_strings(json.loads(text))
    except (ValueError, RecursionError):
        return None


def _database_document(
    connection: sqlite3.Connection, session_id: str, budget: _Budget, *, depth: int
) -> dict[str, Any] | None:
    columns = [row[1] for row in connection.execute("PRAGMA table_info(session)")]
    row = connection.execute("SELECT * FROM session WHERE id = ?", (session_id,)).fetchone()
    if row is None:
        return None
    session = dict(zip(columns, row, strict=False))
    info: dict[str, Any] = {
        "id": session_id,
        "slug": session.get("slug"),
        "projectID": session.get("project_id"),
        "directory": session.get("directory"),
        "title": session.get("title"),
        "version": session.get("version"),
        "time": {"created": session.get("time_created"), "updated": session.get("time_updated")},
    }
    if session.get("parent_id"):
        info["parentID"] = session["parent_id"]
    problems: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []
    by_id: dict[str, dict[str, Any]] = {}
    for message_id, data in connection.execute(
        "SELECT id, data FROM message WHERE session_id = ? ORDER BY time_created, id", (session_id,)
    ):
        value = _loaded(data, budget)
        if not isinstance(value, dict):
            problems.append(
                {"where": f"message {message_id}", "message": "its data is not a JSON object"}
            )
            continue
        value = {**value, "id": message_id, "sessionID": session_id}
        entry = {"info": value, "parts": []}
        messages.append(entry)
        by_id[message_id] = entry
    for part_id, message_id, data in connection.execute(
        "SELECT id, message_id, data FROM part WHERE session_id = ? ORDER BY message_id, id",
        (session_id,),
    ):
        entry = by_id.get(message_id)
        if entry is None:
            continue  # a part of a message that is gone
        value = _loaded(data, budget)
        if not isinstance(value, dict):
            problems.append(
                {"where": f"part {part_id}", "message": "its data is not a JSON object"}
            )
            continue
        entry["parts"].append(
            {**value, "id": part_id, "messageID": message_id, "sessionID": session_id}
        )
    document: dict[str, Any] = {"info": info, "messages": messages}
    if depth < MAX_CHILD_DEPTH:
        children = [
            child
            for (child_id,) in connection.execute(
                "SELECT id FROM session WHERE parent_id = ? ORDER BY time_created, id",
                (session_id,),
            )
            if (child := _database_document(connection, child_id, budget, depth=depth + 1))
            is not None
        ]
        if children:
            document["children"] = children
    if problems:
        document["problems"] = problems
    return document


def _storage_document(path: Path, layout: str, budget: _Budget, *, depth: int) -> dict[str, Any]:
    """A session of the JSON storage: its info file, its messages' and their parts' files."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TranscriptError(f"{path}: cannot read ({exc.strerror})") from None
    info = _loaded(raw, budget)
    if not isinstance(info, dict) or not isinstance(info.get("id"), str):
        raise TranscriptError(f"{path.name} is not an OpenCode session: not a session object")
    session_id = info["id"]
    if layout == "storage":  # storage/session/<project>/<id>.json
        storage = path.parents[2]
        message_folder = storage / "message" / session_id
        part_folder = lambda message_id: storage / "part" / message_id  # noqa: E731
    else:  # .../storage/session/info/<id>.json
        session_root = path.parents[1]
        message_folder = session_root / "message" / session_id
        part_folder = lambda message_id: session_root / "part" / session_id / message_id  # noqa: E731
    problems: list[dict[str, str]] = []
    messages: list[dict[str, Any]] = []
    for file in sorted(message_folder.glob("*.json")):
        value = _storage_object(file, budget, problems)
        if value is None:
            continue
        message_id = value.get("id") if isinstance(value.get("id"), str) else file.stem
        parts = []
        for part_file in sorted(part_folder(message_id).glob("*.json")):
            part = _storage_object(part_file, budget, problems)
            if part is not None:
                parts.append(part)
        messages.append({"info": {**value, "id": message_id}, "parts": parts})
    messages.sort(
        key=lambda m: (
            _number(m["info"].get("time", {}).get("created"))
            if isinstance(m["info"].get("time"), dict)
            else 0,
            m["info"]["id"],
        )
    )
    document: dict[str, Any] = {"info": info, "messages": messages}
    if depth < MAX_CHILD_DEPTH:
        children = []
        for sibling in sorted(path.parent.glob("ses_*.json")):
            if sibling != path and _json_file(sibling).get("parentID") == session_id:
                children.append(_storage_document(sibling, layout, budget, depth=depth + 1))
        if children:
            document["children"] = children
    if problems:
        document["problems"] = problems
    return document


def _storage_object(
    file: Path, budget: _Budget, problems: list[dict[str, str]]
) -> dict[str, Any] | None:
    try:
        raw = file.read_bytes()
    except OSError as exc:
        problems.append({"where": file.name, "message": f"cannot be read ({exc.strerror})"})
        return None
    value = _loaded(raw, budget)
    if not isinstance(value, dict):
        problems.append({"where": file.name, "message": "not a JSON object"})
        return None
    return value


def _number(value: object) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


# --- parsing a document -------------------------------------------------------------------


def _times(info: dict[str, Any]) -> tuple[datetime | None, datetime | None]:
    time = info.get("time")
    if not isinstance(time, dict):
        return None, None
    return epoch_ms(time.get("created")), epoch_ms(time.get("completed", time.get("updated")))


def _usage(tokens: dict[str, Any]) -> TokenUsage:
    """OpenCode's tokens as disjoint kinds: input, output, cache read and write as written,
    and what ``total`` counts beyond them (reasoning) as output, as ccusage reads them."""
    cache = tokens.get("cache")
    cache = cache if isinstance(cache, dict) else {}
    input_tokens, output, total = token_counts(tokens, ("input", "output", "total"), "tokens")
    read, write = token_counts(cache, ("read", "write"), "tokens.cache")
    rest = total - (input_tokens + output + read + write) if "total" in tokens else 0
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output + max(rest, 0),
        cache_read_tokens=read,
        cache_write_5m_tokens=write,
    )


@dataclass
class _Request:
    """One model call of an assistant message: its time, model, usage and cost."""

    at: datetime
    model: str
    usage: TokenUsage
    usd: Any  # Decimal | None: OpenCode's cost when above 0


def _requests(
    info: dict[str, Any], parts: list[dict[str, Any]], budget: UsageBudget
) -> list[_Request]:
    """The model calls of an assistant message: one per step-finish part when those add up
    to the message's tokens (each then priced by its own input), else the message as one."""
    tokens = info.get("tokens")
    if tokens is None:
        return []
    if not isinstance(tokens, dict):
        raise ValueError("tokens is not an object")
    usage = _usage(tokens)
    model = info.get("modelID")
    model = model if isinstance(model, str) and model else UNKNOWN_MODEL
    created, completed = _times(info)
    at = completed or created
    if at is None:
        raise ValueError("assistant message has no time")
    budget.add(usage)
    steps: list[_Request] = []
    for part in parts:
        if part.get("type") != "step-finish" or not isinstance(part.get("tokens"), dict):
            continue
        try:
            step = _usage(part["tokens"])
        except ValueError:
            steps = []
            break
        steps.append(_Request(at, model, step, _cost(part.get("cost"))))
    if steps and sum((s.usage for s in steps), TokenUsage()) == usage:
        return [s for s in steps if s.usage.total]
    return [_Request(at, model, usage, _cost(info.get("cost")))] if usage.total else []


def _cost(value: object) -> Any:
    """OpenCode's recorded cost when it is above 0 (a 0 is priced from the table)."""
    usd = recorded_usd(value)
    return usd if usd is not None and usd > 0 else None


def _texts(parts: list[dict[str, Any]], *, own: bool) -> str:
    """The text parts (``own``: without those OpenCode added itself)."""
    return "\n".join(
        part["text"]
        for part in parts
        if part.get("type") == "text"
        and isinstance(part.get("text"), str)
        and not (own and part.get("synthetic"))
        and not part.get("ignored")
    )


def _tool_evidence(evidence: Evidence, part: dict[str, Any]) -> None:
    """The evidence of one finished call of OpenCode's file and shell tools."""
    state = part.get("state")
    if not isinstance(state, dict) or state.get("status") != "completed":
        return  # failed, pending or cut short: nothing changed
    name, arguments = part.get("tool"), state.get("input")
    if not isinstance(name, str) or not isinstance(arguments, dict):
        return
    path = arguments.get("filePath")
    path = path if isinstance(path, str) and path else None
    if name == "read" and path:
        # OpenCode numbers the lines it shows: only that the file was read is kept.
        evidence.add({"kind": "read", "tool": name, "path": path, "text": None, "match": "whole"})
    elif name == "write" and path and isinstance(arguments.get("content"), str):
        evidence.add(write_item(name, path, arguments["content"]))
    elif name in ("edit", "multiedit") and path:
        edits = arguments.get("edits") if name == "multiedit" else [arguments]
        for edit in edits if isinstance(edits, list) else []:
            if not isinstance(edit, dict):
                continue
            old, new = edit.get("oldString"), edit.get("newString")
            if isinstance(old, str) and isinstance(new, str):
                evidence.add(edit_item(name, path, old, new, every=bool(edit.get("replaceAll"))))
    elif name in ("patch", "apply_patch") and isinstance(arguments.get("patchText"), str):
        for operation in patch_operations(arguments["patchText"]) or []:
            if operation["op"] == "add":
                operation["text"] = kept_text(operation["text"])
            evidence.add({"kind": "patch", "tool": name, **operation})
    elif name == "bash" and isinstance(arguments.get("command"), str):
        evidence.add(shell_item(name, arguments["command"]))
    elif name == "task":
        evidence.add({"kind": "other", "tool": name, "path": None})


class _Reader:
    def __init__(self) -> None:
        self.problems: list[LineProblem] = []
        self.budget = UsageBudget()
        self.turns: list[ParsedTurn] = []
        self.requests: list[
            tuple[_Request, int | None]
        ] = []  # (request, turn index or None: by time)
        self.started: datetime | None = None
        self.ended: datetime | None = None
        self.cwd = ""

    def saw(self, at: datetime | None) -> None:
        if at is not None:
            self.started = at if self.started is None else min(self.started, at)
            self.ended = at if self.ended is None else max(self.ended, at)

    def session(self, document: dict[str, Any], *, main: bool, depth: int = 0) -> None:
        info = document.get("info") if isinstance(document.get("info"), dict) else {}
        for problem in document.get("problems") or []:
            if isinstance(problem, dict):
                where, message = problem.get("where", ""), problem.get("message", "")
                self.problems.append(LineProblem(1, f"{where}: {message}"[:300]))
        if main:
            directory = info.get("directory")
            self.cwd = directory if isinstance(directory, str) else ""
            self.saw(_times(info)[0])
        turn_of: dict[str, int] = {}
        for position, entry in enumerate(document.get("messages") or [], start=1):
            try:
                self._message(entry, turn_of, main=main)
            except ValueError as exc:
                self.problems.append(LineProblem(position, f"message {position}: {exc}"[:300]))
        if depth < MAX_CHILD_DEPTH:
            for child in document.get("children") or []:
                if isinstance(child, dict):
                    self.session(child, main=False, depth=depth + 1)

    def _message(self, entry: Any, turn_of: dict[str, int], *, main: bool) -> None:
        if not isinstance(entry, dict) or not isinstance(entry.get("info"), dict):
            raise ValueError("not a message with its info")
        info = entry["info"]
        parts = [p for p in entry.get("parts") or [] if isinstance(p, dict)]
        created, completed = _times(info)
        self.saw(created)
        self.saw(completed)
        role = info.get("role")
        if role == "user":
            if not main:
                return  # a sub-agent's prompt is the parent agent's, not a person's
            if created is None:
                raise ValueError("user message has no time")
            text = _texts(parts, own=True).strip()
            if not text and any(p.get("type") == "file" for p in parts):
                text = "[file]"
            if not text or any(p.get("type") == "compaction" for p in parts):
                return
            sent = _texts(parts, own=False).strip()
            identifier = info.get("id")
            index = len(self.turns)
            self.turns.append(
                ParsedTurn(
                    index=index,
                    message_uuid=identifier if isinstance(identifier, str) else f"message-{index}",
                    timestamp=created,
                    request=text,
                    request_as_sent=sent if sent != text else "",
                )
            )
            if isinstance(identifier, str):
                turn_of[identifier] = index
        elif role == "assistant":
            if main and self.cwd == "":
                path = info.get("path")
                if isinstance(path, dict) and isinstance(path.get("cwd"), str):
                    self.cwd = path["cwd"]
            parent = info.get("parentID")
            index = turn_of.get(parent) if isinstance(parent, str) else None
            if main and index is None and self.turns:
                index = len(self.turns) - 1
            for request in _requests(info, parts, self.budget):
                self.requests.append((request, index if main else None))
            if main and index is not None:
                turn = self.turns[index]
                if created is not None and completed is not None and created <= completed:
                    turn.model_seconds = (turn.model_seconds or 0.0) + (
                        completed - created
                    ).total_seconds()
                finished = completed or created
                if finished is not None and (
                    turn.last_answer_at is None or finished > turn.last_answer_at
                ):
                    turn.last_answer_at = finished
                turn.answered(_texts(parts, own=True))
                for part in parts:
                    if part.get("type") == "tool":
                        _tool_evidence(turn.evidence, part)

    def place(self, thread: ParsedThread) -> None:
        """Each model call in its turn (a sub-agent's: the turn whose time holds it)."""
        starts = [turn.timestamp for turn in self.turns]
        for request, index in sorted(self.requests, key=lambda item: item[0].at):
            if index is None:
                index = bisect_right(starts, request.at) - 1
            if index < 0:
                if request.usd is not None:
                    thread.add_pre_turn_recorded_request(request.model, request.usage, request.usd)
                else:
                    thread.add_pre_turn_request(request.model, request.usage)
                continue
            turn = self.turns[index]
            if request.usd is not None:
                turn.add_recorded_request(request.model, request.usage, request.usd)
            else:
                turn.add_request(request.model, request.usage)
            if turn.last_answer_at is None or request.at > turn.last_answer_at:
                turn.last_answer_at = request.at


def parse_opencode(path: Path, *, max_bytes: int, data: bytes | None = None) -> ParsedThread:
    """Parse one OpenCode session: ``data`` is its document (assembled, or an ``opencode
    export`` file's bytes); without it the session at ``path`` is assembled first."""
    if data is None:
        data = (
            session_document(path, max_bytes=max_bytes) if is_assembled(path) else path.read_bytes()
        )
    if len(data) > max_bytes:
        raise TranscriptError(
            f"{path.name} is {len(data)} bytes, larger than the limit of {max_bytes} bytes"
        )
    try:
        document = clean_strings(json.loads(data.decode("utf-8-sig")))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise TranscriptError(f"{path.name} is not an OpenCode session: not JSON") from None
    if not looks_like_opencode_document(document):
        raise TranscriptError(f"{path.name} is not an OpenCode session")
    info = document["info"]
    reader = _Reader()
    reader.session(document, main=True)
    started, ended = reader.started, reader.ended
    updated = _times(info)[1]
    if updated is not None and started is not None and updated >= started:
        ended = max(ended or updated, updated)
    version = info.get("version")
    thread = ParsedThread(
        kind=KIND,
        session_id=info["id"],
        title="",
        cwd=reader.cwd,
        git_branch="",
        git_commit="",
        repository_url="",
        cli_version=version if isinstance(version, str) else "",
        started_at=started,
        ended_at=ended,
        turns=reader.turns,
        problems=reader.problems,
        lines_read=len(document["messages"]),
    )
    reader.place(thread)
    for turn in thread.turns:
        turn.evidence.relative_to(thread.cwd)
    make_message_ids_unique(thread.turns)
    title = info.get("title")
    first = thread.turns[0].request if thread.turns else ""
    thread.title = make_title(first) or (make_title(title) if isinstance(title, str) else "")
    return thread
