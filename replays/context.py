"""What the agent knows before the request: `cold`, `digest` or `fork` (docs/design.md,
"Context").

- `cold`: the request alone.
- `digest`: a preamble quoting the thread's earlier requests and the agent's final answer
  to each (bounded: the oldest are left out first, and the preamble says so), then the
  request.
- `fork`: the historical session cut just before the range's first request, copied into
  the run's own home with the thread's folder rewritten to the worktree, and resumed
  natively by the candidate's CLI under its own model: a Claude Code thread for claude_code
  models (`claude -p --resume ID --fork-session`), a Codex thread for codex models (`codex
  exec fork ID`), a Gemini CLI thread for gemini models (the copy in the run's project
  folder, `gemini --resume ID`), an OpenCode thread for opencode models (`opencode import`
  of the cut session, then `opencode run --session ID --fork`), a pi thread for pi models
  (`pi --fork FILE`). The copy names the worktree wherever the session named the user's
  checkout, so the agent never edits the real one.

The default: `cold` for a range that starts the thread (every mode means the same there);
for a later request `fork` when the candidate's agent is the thread's own tool and the
transcript can be cut, else `digest`. The baselines ignore context. An explicit `fork`
that cannot be done blocks the plan with the reason.

A service module: it reads Thread and Turn rows and the thread's transcript. Planning
resolves the modes, approval writes the resolved mode (and the digest) into each run's
configuration, the coordinator cuts the transcript for a fork and hands it to the adapter.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from replays import agents, evidence, importing, repos
from replays.agents.base import ForkedSession
from replays.models import SourceKind, Thread, Turn
from replays.runspec import COLD, CONTEXT_MODES, DIGEST, FORK
from replays.transcripts.claude_code import prompt_text

MODES = CONTEXT_MODES
# What the historical side of a comparison knew: its own session, every earlier turn in full.
HISTORICAL_CONTEXT = "session"
# Each context in words, for pages.
LABELS = {
    COLD: "cold: the request alone",
    DIGEST: "digest: the earlier requests and answers",
    FORK: "fork: the historical session, resumed",
    HISTORICAL_CONTEXT: "its own session",
}
# The agent kinds whose own sessions a fork resumes: the thread's tool is the same string.
FORKING_KINDS = (
    SourceKind.CLAUDE_CODE.value,
    SourceKind.CODEX.value,
    SourceKind.GEMINI.value,
    SourceKind.OPENCODE.value,
    SourceKind.PI.value,
)
# The tools whose session is one JSON document rather than lines (Gemini CLI's .json
# format, OpenCode's export document).
_DOCUMENT_KINDS = (SourceKind.GEMINI.value, SourceKind.OPENCODE.value)

# The digest: at most this many characters, each earlier request quoted up to its own
# bound (the answers are bounded at import: transcripts.base.MAX_FINAL_ANSWER_CHARS).
MAX_DIGEST_CHARS = 16_000
MAX_DIGEST_REQUEST_CHARS = 2_000
NO_FINAL_ANSWER = "(no final answer recorded)"
DIGEST_INTRO = (
    "This request continues an earlier conversation about this repository. What was asked "
    "before, and what the agent answered, for context (the files already hold that work):"
)
DIGEST_REQUEST = "The request:"

# Session ids a CLI resumes by (anything else is not an id a resume flag takes): a UUID;
# OpenCode's ses_...; Gemini CLI's own (a UUID, Cloud Shell's "a2a-server"; a thread of a
# second file of one session is "<id>~2", the file holding the id itself).
_SESSION_ID_RE = re.compile(
    r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_SESSION_IDS = {
    SourceKind.OPENCODE.value: re.compile(r"^ses_[A-Za-z0-9]{1,100}$"),
    SourceKind.GEMINI.value: re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}(~[0-9]+)?$"),
}
# Codex's rollout name: rollout-YYYY-MM-DDTHH-MM-SS-<uuid>.jsonl.
_ROLLOUT_RE = re.compile(r"^rollout-(\d{4})-(\d{2})-(\d{2})T\d{2}-\d{2}-\d{2}-(.+)\.jsonl$")
# Claude Code line types kept in a cut besides the conversation's own chain.
_CLAUDE_KEPT_META = frozenset({"summary", "custom-title", "ai-title", "agent-name", "mode", "permission-mode"})  # fmt: skip
# Codex lines that open a turn (before its prompt): they go with the turn that follows.
_CODEX_TURN_OPENERS = frozenset({"task_started", "turn_started", "thread_settings_applied"})


class ContextError(ValueError):
    """The `context` of a configuration is not acceptable (planning says so as a 400)."""


class CannotFork(Exception):
    """The historical session cannot be cut and resumed (the reason is the message)."""


@dataclass(frozen=True)
class Resolved:
    """The context one model runs with, and why."""

    mode: str
    reason: str
    blocker: str = ""  # an explicit `fork` that cannot be done

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode, "reason": self.reason}


# --- the configuration's `context` ------------------------------------------------------


def normalise_context(raw: Any, models: list[str]) -> str | dict[str, str] | None:
    """None (the default for every model), one mode for every model, or {model id: mode}
    for some of them (canonical ids of `models`); ContextError saying what is wrong."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if isinstance(raw, str):
        return _mode(raw, "context")
    if not isinstance(raw, dict):
        raise ContextError("context must be a mode (cold, digest, fork) or {model id: mode}.")
    modes: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or len(key) > 200:
            raise ContextError("context: each key is a model id of the plan.")
        try:
            model = agents.resolve_model(key).id
        except agents.UnknownModel as exc:
            raise ContextError(f"context: {exc}") from None
        if model not in models:
            raise ContextError(f"context: {model} is not one of the plan's models.")
        if model in modes:
            raise ContextError(f"context: {model} is given twice.")
        modes[model] = _mode(value, f"context of {model}")
    return modes or None


def _mode(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.strip().lower() not in MODES:
        shown = value if isinstance(value, str) else type(value).__name__
        raise ContextError(f"{where}: {str(shown)[:40]!r} is not a mode: cold, digest or fork.")
    return value.strip().lower()


def requested_mode(context: str | dict[str, str] | None, model: str) -> str | None:
    """The mode the configuration names for `model`; None: the default."""
    if isinstance(context, dict):
        return context.get(model)
    return context


# --- resolving a model's mode -------------------------------------------------------------


def resolve_modes(
    thread: Thread,
    first: Turn,
    models: list[str],
    context: str | dict[str, str] | None,
    *,
    repository: Path | None = None,
    baseline: str = "",
) -> dict[str, Resolved]:
    """The mode of each model for a range starting at `first`, with the reason (and a
    blocker for an explicit fork that cannot be done). The transcript is cut once, when a
    fork is asked for or could be the default. With the repository and the baseline, a
    thread folder that is a link there cannot be forked in (fork_folder_problem)."""
    problems: dict[str, str] = {}  # per tool: why its session cannot be forked ("" if it can)
    resolved = {}
    for model in models:
        info = agents.resolve_model(model)
        asked = requested_mode(context, model)
        if info.is_baseline:
            resolved[model] = Resolved(COLD, "a baseline ignores the context")
            continue
        if first.index == 0:
            resolved[model] = Resolved(
                COLD, "the first request of the thread: nothing came before it"
            )
            continue
        if asked in (COLD, DIGEST):
            resolved[model] = Resolved(asked, "chosen")
            continue
        if info.kind not in problems:
            problems[info.kind] = fork_problem(thread, first, info.kind)
            if not problems[info.kind] and repository is not None and baseline:
                problems[info.kind] = fork_folder_problem(thread, repository, baseline)
        problem = problems[info.kind]
        if asked == FORK:
            blocker = f"Model {model} cannot fork thread {thread.pk}: {problem}" if problem else ""
            resolved[model] = Resolved(FORK, "chosen", blocker)
        elif problem:
            resolved[model] = Resolved(DIGEST, f"a later request; no fork: {problem}")
        else:
            resolved[model] = Resolved(
                FORK, f"a later request of a {thread.get_source_kind_display()} session"
            )
    return resolved


def fork_problem(thread: Thread, first: Turn, kind: str) -> str:
    """Why an agent of `kind` cannot fork the thread's session before `first` ("" when it
    can): the other tool's thread, an agent with no sessions, a transcript gone or unreadable."""
    tool = thread.get_source_kind_display()
    if kind not in FORKING_KINDS:
        return f"a {kind} agent has no session to resume (digest gives it the earlier requests)"
    if kind != thread.source_kind:
        own = SourceKind(kind).label
        return f"the thread is a {tool} session, and a {own} agent resumes only {own} sessions"
    if not _SESSION_IDS.get(kind, _SESSION_ID_RE).match(thread.session_id):
        return f"the session id {thread.session_id[:60]!r} is not one {tool} resumes"
    try:
        cut_transcript(thread, first)
    except CannotFork as exc:
        return str(exc)
    return ""


def fork_folder_problem(thread: Thread, repository: Path, baseline: str) -> str:
    """Why a fork cannot run in the thread's folder inside the worktree ("" when it can):
    a folder on the way to it is a link in the repository at the baseline (`vendor ->
    /somewhere/else`, `up -> ..`), which would put the agent, and Codex's writable root,
    outside the worktree."""
    prefix = evidence.PathMap.for_thread(thread.cwd, repository).prefix
    if not prefix:
        return ""
    parts = prefix.split("/")
    for index in range(1, len(parts) + 1):
        folder = "/".join(parts[:index])
        try:
            entry = repos.tree_entry(repository, baseline, folder)
        except repos.GitError as exc:
            return f"the thread's folder {prefix} cannot be looked up at the baseline: {exc}"
        if entry is None or entry.kind == "commit":
            return ""  # not in the tree (a submodule is not checked out): the worktree's top
        if entry.mode == LINK_MODE:
            return (
                f"the thread's folder {prefix} is not inside the worktree: {folder} is a "
                "symbolic link in the repository at the baseline, and a fork runs only in the "
                "run's own worktree"
            )
    return ""


# Git's mode of a symbolic link.
LINK_MODE = 0o120000


# --- digest -------------------------------------------------------------------------------


def digest_preamble(thread: Thread, first_index: int) -> str:
    """The earlier requests of the thread (before `first_index`) with the agent's final
    answer to each, newest kept first within MAX_DIGEST_CHARS; "" when there are none."""
    earlier = list(thread.turns.filter(index__lt=first_index).order_by("index"))
    if not earlier:
        return ""
    entries: list[str] = []
    used = len(DIGEST_INTRO)
    for turn in reversed(earlier):
        entry = _digest_entry(turn)
        if entries and used + len(entry) > MAX_DIGEST_CHARS:
            break
        entries.insert(0, entry)
        used += len(entry)
    left_out = len(earlier) - len(entries)
    parts = [DIGEST_INTRO]
    if left_out:
        parts.append(
            f"[Requests #1–#{left_out} are left out to keep this short.]"
            if left_out > 1
            else "[Request #1 is left out to keep this short.]"
        )
    return "\n\n".join(parts + entries)


def _digest_entry(turn: Turn) -> str:
    request = turn.request.strip()
    if len(request) > MAX_DIGEST_REQUEST_CHARS:
        request = request[: MAX_DIGEST_REQUEST_CHARS - 4] + " […]"
    answer = turn.final_answer.strip() or NO_FINAL_ANSWER
    number = turn.index + 1
    return f"## Request #{number}\n\n{request}\n\n## The agent's answer to #{number}\n\n{answer}"


def with_preamble(preamble: str, request: str) -> str:
    """The text a digest run's first turn gets: the preamble, then the request."""
    if not preamble:
        return request
    return f"{preamble}\n\n---\n\n{DIGEST_REQUEST}\n\n{request}"


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", errors="surrogatepass")).hexdigest()


# --- fork: the transcript cut and rewritten -----------------------------------------------


def transcript_digest(thread: Thread) -> str:
    """The transcript a fork would cut: the copy stored at import (replaced when a changed
    file is imported again), so the file may be gone or elsewhere. A thread imported
    before copies were kept: the file as it is now (if it is still there)."""
    stored = importing.transcript_copy_sha256(thread)
    if stored is not None:
        current = f"stored:{stored}"
    else:
        path = Path(thread.source_path)
        current = importing.file_sha256(path) if path.is_file() else "missing"
    return hashlib.sha256(f"{thread.source_sha256}:{current}".encode()).hexdigest()


def fork_session(
    thread: Thread, first: Turn, *, workspace: Path, repository: Path
) -> ForkedSession:
    """The thread's session cut just before `first`, for a run in `workspace` (a worktree of
    `repository`): the repository's top as the session saw it becomes the worktree in every
    copied line, and the agent runs in the thread's folder inside it. CannotFork saying why
    not."""
    values = cut_transcript(thread, first)
    paths = evidence.PathMap.for_thread(thread.cwd, repository)
    cwd = workspace / paths.prefix if paths.prefix else workspace
    old = paths.top
    if not cwd.is_dir():  # the thread's folder is not in the tree it starts from
        cwd, old = workspace, thread.cwd
    # Links followed: the folder the agent (and Codex's -C, its writable root) gets must be
    # the worktree's own, never where a committed link leads.
    resolved, top = cwd.resolve(), workspace.resolve()
    if resolved != top and top not in resolved.parents:
        raise CannotFork(
            f"the thread's folder {cwd.relative_to(workspace)} leads outside the worktree "
            f"(to {resolved}): a fork runs only in the run's own worktree"
        )
    old = old.rstrip("/")
    if old:
        values = [rewrite_folder(value, old, str(workspace)) for value in values]
    kind = thread.source_kind
    if kind in _DOCUMENT_KINDS and len(values) == 1 and "messages" in values[0]:
        document = values[0]
        if kind == SourceKind.GEMINI:
            # Gemini CLI keeps a project by its folder's hash: the worktree's now.
            document["projectHash"] = _folder_hash(cwd)
        text = json.dumps(document, ensure_ascii=False, separators=(",", ":")) + "\n"
    else:
        if kind == SourceKind.GEMINI and values and "projectHash" in values[0]:
            values[0]["projectHash"] = _folder_hash(cwd)
        text = "".join(json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n" for value in values)  # fmt: skip
    if kind == SourceKind.CLAUDE_CODE:
        return ForkedSession(
            tool=kind,
            session_id=thread.session_id,
            text=text,
            file_name=f"{thread.session_id}.jsonl",
            cwd=cwd,
        )
    if kind == SourceKind.CODEX:
        name, day = _rollout_place(thread)
        return ForkedSession(
            tool=kind,
            session_id=thread.session_id,
            text=text,
            file_name=name,
            day_folder=day,
            cwd=cwd,
            base_usage=_codex_totals(values),
        )
    session_id = _own_session_id(thread, values)
    return ForkedSession(
        tool=kind,
        session_id=session_id,
        text=text,
        file_name=_file_name(thread, session_id),
        cwd=cwd,
    )


def _folder_hash(folder: Path) -> str:
    return hashlib.sha256(str(folder).encode("utf-8", "surrogateescape")).hexdigest()


def _own_session_id(thread: Thread, values: list[dict[str, Any]]) -> str:
    """The id the tool resumes the cut session by: Gemini CLI's file's own sessionId (a
    second file of a session is thread `<id>~2`), pi's header's, OpenCode's session's."""
    first = values[0] if values else {}
    found: object = None
    if thread.source_kind == SourceKind.GEMINI:
        found = first.get("sessionId")
    elif thread.source_kind == SourceKind.PI:
        found = first.get("id") if first.get("type") == "session" else None
    elif thread.source_kind == SourceKind.OPENCODE:
        info = first.get("info")
        found = info.get("id") if isinstance(info, dict) else None
    return found if isinstance(found, str) and found else thread.session_id.split("~")[0]


# The names the tools give their session files.
_GEMINI_NAME_RE = re.compile(r"^session-[0-9T-]+-[^/]+\.jsonl?$")
_PI_NAME_RE = re.compile(r"^[0-9T-]+Z_[^/]+\.jsonl$")


def _file_name(thread: Thread, session_id: str) -> str:
    """The cut copy's file name: the session's own where it is the tool's, else one made
    the tool's way."""
    name = Path(thread.source_path).name
    started = thread.started_at
    if thread.source_kind == SourceKind.GEMINI:
        if _GEMINI_NAME_RE.match(name):
            return name
        stamp = started.strftime("%Y-%m-%dT%H-%M") if started else "1970-01-01T00-00"
        return f"session-{stamp}-{session_id[:8]}.json"
    if thread.source_kind == SourceKind.PI:
        if _PI_NAME_RE.match(name):
            return name
        stamp = (
            started.strftime("%Y-%m-%dT%H-%M-%S-000Z") if started else "1970-01-01T00-00-00-000Z"
        )
        return f"{stamp}_{session_id}.jsonl"
    return f"{session_id}.json"


def cut_transcript(thread: Thread, first: Turn) -> list[dict[str, Any]]:
    """The transcript's lines that come before `first`, as the tool resumes them: Claude
    Code's conversation chain up to the request (and its titles and modes), Codex's rollout
    up to the turn before. CannotFork when the file is gone, too large, or lacks the request."""
    values = _transcript_lines(thread)
    if thread.source_kind == SourceKind.CLAUDE_CODE:
        kept = _cut_claude(values, first)
    elif thread.source_kind == SourceKind.CODEX:
        kept = _cut_codex(values, first)
    elif thread.source_kind == SourceKind.GEMINI:
        kept = _cut_gemini(values, first)
    elif thread.source_kind == SourceKind.OPENCODE:
        kept = _cut_opencode(values, first)
    else:
        kept = _cut_pi(values, first)
    if not kept:
        raise CannotFork(f"nothing comes before request #{first.index + 1} in the transcript")
    return kept


def _transcript_lines(thread: Thread) -> list[dict[str, Any]]:
    """The transcript's lines as imported (the stored copy; see importing.read_transcript)."""
    try:
        data = importing.read_transcript(thread)
    except importing.TranscriptUnavailable as exc:
        raise CannotFork(str(exc)) from None
    limit = settings.REPLAYS_MAX_TRANSCRIPT_BYTES
    if len(data) > limit:
        raise CannotFork(f"the transcript {thread.source_path} is larger than {limit:,} bytes")
    if thread.source_kind in _DOCUMENT_KINDS:
        try:
            document = json.loads(data.decode("utf-8-sig"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            document = None  # Gemini CLI's JSONL: read by lines below
        if isinstance(document, dict) and isinstance(document.get("messages"), list):
            return [document]
    values = []
    for raw in data.split(b"\n"):
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            continue  # a damaged line: the tool would skip it as well
        if isinstance(value, dict):
            values.append(value)
    return values


def _cut_claude(values: list[dict[str, Any]], first: Turn) -> list[dict[str, Any]]:
    """Claude Code: the lines before the request's user line that are on its chain of
    parents (another branch, sub-agent lines and the queue's plumbing are left out)."""
    position = next(
        (i for i, v in enumerate(values) if v.get("type") == "user" and v.get("uuid") == first.message_uuid),
        None,
    )  # fmt: skip
    if position is None:  # an id made unique at import: the prompt's text and time
        position = next((i for i, v in enumerate(values) if _is_claude_prompt(v, first)), None)
    if position is None:
        raise CannotFork(f"request #{first.index + 1} is not in the transcript any more")
    before = values[:position]
    parents = {v["uuid"]: v.get("parentUuid") for v in before if isinstance(v.get("uuid"), str)}
    chain: set[str] = set()
    parent = values[position].get("parentUuid")
    while isinstance(parent, str) and parent in parents and parent not in chain:
        chain.add(parent)
        parent = parents[parent]
    kept = []
    for value in before:
        if isinstance(value.get("uuid"), str):
            if value["uuid"] in chain and not value.get("isSidechain"):
                kept.append(value)
        elif value.get("type") in _CLAUDE_KEPT_META:
            leaf = value.get("leafUuid")
            if not isinstance(leaf, str) or leaf in chain:
                kept.append(value)
    return kept if chain else []


def _is_claude_prompt(value: dict[str, Any], first: Turn) -> bool:
    if value.get("type") != "user" or not isinstance(value.get("message"), dict):
        return False
    try:
        text = prompt_text(value)
    except ValueError:
        return False
    return text == first.request and _same_time(value.get("timestamp"), first)


def _same_time(stamp: object, turn: Turn) -> bool:
    from replays.transcripts.claude_code import parse_timestamp

    try:
        return parse_timestamp(stamp) == turn.timestamp
    except ValueError:
        return False


def _cut_codex(values: list[dict[str, Any]], first: Turn) -> list[dict[str, Any]]:
    """Codex: the rollout's lines before the turn's first line (its turn id, or its prompt
    and the lines that open it)."""
    position = next((i for i, v in enumerate(values) if _turn_id(v) == first.message_uuid), None)
    if position is None:
        position = next((i for i, v in enumerate(values) if _is_codex_prompt(v, first)), None)
    if position is None:
        raise CannotFork(f"request #{first.index + 1} is not in the transcript any more")
    while position > 0 and _opens_turn(values[position - 1]):
        position -= 1
    kept = values[:position]
    if not any(v.get("type") == "session_meta" for v in kept):
        return []
    return kept


def _cut_gemini(values: list[dict[str, Any]], first: Turn) -> list[dict[str, Any]]:
    """Gemini CLI: the .json document with its messages before the request, or the JSONL
    lines before the request's first line (a later version of a message is a later line)."""
    if len(values) == 1 and isinstance(values[0].get("messages"), list):
        document = values[0]
        messages = [m for m in document["messages"] if isinstance(m, dict)]
        position = _gemini_position(messages, first)
        if not position:
            return []
        return [{**document, "messages": messages[:position]}]
    position = _gemini_position(values, first)
    if not position or not isinstance(values[0].get("sessionId"), str):
        return []
    return values[:position]


def _gemini_position(values: list[dict[str, Any]], first: Turn) -> int | None:
    """Where the request's message is (by its id, else by its text and time)."""
    for position, value in enumerate(values):
        if value.get("type") == "user" and value.get("id") == first.message_uuid:
            return position
    for position, value in enumerate(values):
        if value.get("type") == "user" and _gemini_text(value) == first.request.strip():
            if _same_time(value.get("timestamp"), first):
                return position
    raise CannotFork(f"request #{first.index + 1} is not in the transcript any more")


def _gemini_text(value: dict[str, Any]) -> str:
    for key in ("displayContent", "content"):
        content = value.get(key)
        if isinstance(content, str) and content.strip():
            return content.strip()
        if isinstance(content, list):
            text = "\n".join(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
            if text.strip():
                return text.strip()
    return ""


def _cut_opencode(values: list[dict[str, Any]], first: Turn) -> list[dict[str, Any]]:
    """OpenCode: the session document with its messages before the request (its sub-agents'
    sessions and our own notes left out: `opencode import` takes a session as it exports it)."""
    document = values[0] if len(values) == 1 else {}
    messages = [m for m in document.get("messages") or [] if isinstance(m, dict)]
    position = next(
        (
            index
            for index, message in enumerate(messages)
            if isinstance(message.get("info"), dict)
            and message["info"].get("role") == "user"
            and message["info"].get("id") == first.message_uuid
        ),
        None,
    )
    if position is None:
        raise CannotFork(f"request #{first.index + 1} is not in the transcript any more")
    if position == 0:
        return []
    return [{"info": document["info"], "messages": messages[:position]}]


def _cut_pi(values: list[dict[str, Any]], first: Turn) -> list[dict[str, Any]]:
    """pi: the header and, from format 2 on, the entries on the request's chain of parents
    (another branch is left out); format 1 has no tree: every entry before the request."""
    if not values or values[0].get("type") != "session":
        return []
    header = values[0]
    position = next(
        (i for i, v in enumerate(values) if v.get("type") == "message" and v.get("id") == first.message_uuid),
        None,
    )  # fmt: skip
    if position is None:
        position = next((i for i, v in enumerate(values) if _is_pi_prompt(v, first)), None)
    if position is None:
        raise CannotFork(f"request #{first.index + 1} is not in the transcript any more")
    before = values[1:position]
    if not isinstance(values[position].get("id"), str):
        return [header, *before] if before else []
    parents = {v["id"]: v.get("parentId") for v in before if isinstance(v.get("id"), str)}
    chain: set[str] = set()
    parent = values[position].get("parentId")
    while isinstance(parent, str) and parent in parents and parent not in chain:
        chain.add(parent)
        parent = parents[parent]
    kept = [v for v in before if v.get("id") in chain]
    return [header, *kept] if kept else []


def _is_pi_prompt(value: dict[str, Any], first: Turn) -> bool:
    message = value.get("message")
    if value.get("type", "message") != "message" or not isinstance(message, dict):
        return False
    if message.get("role") != "user":
        return False
    content = message.get("content")
    if isinstance(content, list):
        content = "\n".join(
            b["text"] for b in content if isinstance(b, dict) and isinstance(b.get("text"), str)
        )
    return (
        isinstance(content, str)
        and content.strip() == first.request.strip()
        and _same_time(value.get("timestamp"), first)
    )


def _payload(value: dict[str, Any]) -> dict[str, Any]:
    payload = value.get("payload")
    return payload if isinstance(payload, dict) else {}


def _turn_id(value: dict[str, Any]) -> str | None:
    payload = _payload(value)
    turn_id = payload.get("turn_id")
    if not isinstance(turn_id, str):
        item = payload.get("item")
        turn_id = item.get("turn_id") if isinstance(item, dict) else None
    return turn_id if isinstance(turn_id, str) and turn_id else None


def _is_codex_prompt(value: dict[str, Any], first: Turn) -> bool:
    payload = _payload(value)
    texts: list[str] = []
    if value.get("type") == "event_msg" and payload.get("type") == "user_message":
        texts.append(str(payload.get("message") or ""))
    elif value.get("type") == "response_item" and payload.get("role") == "user":
        for part in payload.get("content") or []:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
    return "\n".join(texts).strip() == first.request.strip() and bool(texts)


def _opens_turn(value: dict[str, Any]) -> bool:
    """A line written as a turn begins, before its prompt (its context, its settings)."""
    payload = _payload(value)
    kind = value.get("type")
    if kind in ("turn_context", "world_state"):
        return True
    if kind == "event_msg":
        return payload.get("type") in _CODEX_TURN_OPENERS
    if kind == "response_item" and payload.get("role") in ("user", "developer"):
        texts = [p.get("text", "") for p in payload.get("content") or [] if isinstance(p, dict)]
        return all(str(text).lstrip().startswith("<") for text in texts)
    return False


def _codex_totals(values: list[dict[str, Any]]) -> dict[str, int]:
    """The thread's token totals at the cut, as Codex wrote them (input includes cached):
    a forked session's turn.completed counts on from them."""
    for value in reversed(values):
        payload = _payload(value)
        if value.get("type") == "event_msg" and payload.get("type") == "token_count":
            info = payload.get("info")
            totals = info.get("total_token_usage") if isinstance(info, dict) else None
            if isinstance(totals, dict):
                return {
                    key: number
                    for key, number in totals.items()
                    if isinstance(number, int) and not isinstance(number, bool) and number >= 0
                }
    return {}


def _rollout_place(thread: Thread) -> tuple[str, str]:
    """The copy's file name and its sessions folder (YYYY/MM/DD), as Codex names rollouts."""
    name = Path(thread.source_path).name
    match = _ROLLOUT_RE.match(name)
    if match and match.group(4) == thread.session_id:
        return name, f"{match.group(1)}/{match.group(2)}/{match.group(3)}"
    started = thread.started_at
    stamp = started.strftime("%Y-%m-%dT%H-%M-%S") if started else "1970-01-01T00-00-00"
    day = started.strftime("%Y/%m/%d") if started else "1970/01/01"
    return f"rollout-{stamp}-{thread.session_id}.jsonl", day


def rewrite_folder(value: Any, old: str, new: str) -> Any:
    """`value` (a JSON value) with the folder `old` replaced by `new` in every string where
    it stands as a whole path or the start of one: `old/x`, `cd old && ...`, but not
    `old-2` (another folder) nor `/home/u/old` (another path ending the same way).
    Containers are rewritten in place."""
    old = old.rstrip("/")
    # Not inside a longer name: `.` ends a sentence, `.git` or `-old` another folder.
    pattern = re.compile(r"(?<![\w.-])" + re.escape(old) + r"(?![\w-]|\.\w)")

    def fix(text: str) -> str:
        return pattern.sub(lambda _: new, text) if old in text else text

    if isinstance(value, str):
        return fix(value)
    pending = [value] if isinstance(value, (dict, list)) else []
    while pending:
        container = pending.pop()
        if isinstance(container, dict):
            # Keys name paths too (Codex's FileChange: {path: change}).
            items = [(fix(key), item) for key, item in container.items()]
            container.clear()
            container.update(items)
        keys = range(len(container)) if isinstance(container, list) else list(container)
        for key in keys:
            item = container[key]
            if isinstance(item, str):
                container[key] = fix(item)
            elif isinstance(item, (dict, list)):
                pending.append(item)
    return value
