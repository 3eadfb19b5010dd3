"""Import transcripts into Thread and Turn rows: the one write path for the
command, the upload page and the API.

A file is parsed outside any transaction, then written in one: a file that
fails leaves nothing half-imported behind.

One session, one file: a thread keeps the file it was imported from while that
file still exists. Another file carrying the same session (a copy in a backup
folder, an older version) is refused as a duplicate naming both paths, or, when
its content is the same, reported unchanged; so two copies never take turns
overwriting the thread on every import. Uploads are the exception: they are our
own snapshots of a user's file, so any later import of the session replaces one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import re
import shutil
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import IO, Any, Literal

import orjson
from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connections, router, transaction
from django.utils import timezone

from replays import pricing
from replays.models import TOKEN_FIELDS, Thread, Transcript, Turn
from replays.transcripts import (
    LineProblem,
    ParsedThread,
    ParsedTurn,
    TokenUsage,
    TranscriptError,
    gemini,
    opencode,
    parse_transcript,
    read_source,
    store,
)
from replays.transcripts.base import LongContextUsage, RecordedCost

logger = logging.getLogger(__name__)

Outcome = Literal["new", "updated", "unchanged", "failed"]


@dataclass
class ImportResult:
    path: Path
    outcome: Outcome
    thread: Thread | None = None
    turns: int = 0
    problems: list[LineProblem] = field(default_factory=list)
    error: str = ""


@dataclass
class ImportSummary:
    files: int = 0
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    failed: int = 0
    turns: int = 0
    lines_skipped: int = 0
    results: list[ImportResult] = field(default_factory=list)

    def add(self, result: ImportResult) -> None:
        self.files += 1
        setattr(self, result.outcome, getattr(self, result.outcome) + 1)
        self.turns += result.turns
        self.lines_skipped += len(result.problems)
        self.results.append(result)


def max_transcript_bytes() -> int:
    return settings.REPLAYS_MAX_TRANSCRIPT_BYTES


def price_table() -> pricing.PriceTable:
    return pricing.load_price_table(settings.REPLAYS_PRICES_FILE)


def default_transcript_roots() -> list[Path]:
    """Where the agents keep their sessions on this machine, each tool's environment
    overrides first (comma lists, as ccusage reads them): Claude Code ($CLAUDE_CONFIG_DIR,
    ~/.claude, ~/.config/claude), Codex ($CODEX_HOME, ~/.codex), Gemini CLI
    ($GEMINI_DATA_DIR, ~/.gemini/tmp), OpenCode ($OPENCODE_DATA_DIR, $XDG_DATA_HOME/opencode,
    ~/.local/share/opencode) and pi ($PI_AGENT_DIR, $PI_CODING_AGENT_DIR/sessions,
    ~/.pi/agent/sessions)."""
    home = Path.home()
    roots: list[Path] = []

    def listed(name: str, below: str = "") -> list[Path]:
        folders = [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]
        return [
            Path(folder).expanduser() / below if below else Path(folder).expanduser()
            for folder in folders
        ]

    roots += listed("CLAUDE_CONFIG_DIR", "projects")
    roots += [home / ".claude" / "projects", home / ".config" / "claude" / "projects"]
    roots += listed("CODEX_HOME", "sessions")
    roots.append(home / ".codex" / "sessions")
    roots += listed("GEMINI_DATA_DIR")
    roots.append(home / ".gemini" / "tmp")
    roots += listed("OPENCODE_DATA_DIR")
    roots += listed("XDG_DATA_HOME", "opencode")
    roots.append(home / ".local" / "share" / "opencode")
    roots += listed("PI_AGENT_DIR")
    roots += listed("PI_CODING_AGENT_DIR", "sessions")
    roots.append(home / ".pi" / "agent" / "sessions")
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def find_transcript_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Sessions under the given files and folders, in a stable order: a path each.

    Sub-agents' files (Claude Code's `<session>/subagents/*.jsonl`, Gemini CLI's
    `chats/<session id>/*.json`) are read together with their main session file, so they
    are not listed on their own. An OpenCode database gives one path per session in it
    (`opencode.db/<session id>`); its JSON storage one per session file, unless the
    database beside it holds the same session (OpenCode copies its storage into it).
    """
    seen: set[Path] = set()
    for path in paths:
        if opencode.database_session(path) is not None:
            candidates = [path]
        elif path.is_file():
            candidates = _database_sessions(path) if opencode.is_database(path) else [path]
        elif path.is_dir():
            candidates = _sessions_in(path)
        else:
            continue
        for candidate in candidates:
            resolved = candidate.parent.resolve() / candidate.name
            if resolved not in seen:
                seen.add(resolved)
                yield candidate


def _database_sessions(database: Path) -> list[Path]:
    try:
        return opencode.database_sessions(database)
    except TranscriptError:
        return [database]  # imported as it is, it fails saying why


def _sessions_in(folder: Path) -> list[Path]:
    """The sessions of every tool under ``folder`` (see find_transcript_files)."""
    found: list[Path] = []
    in_databases: set[str] = set()
    storage_folders: set[Path] = set()
    for file in sorted(folder.rglob("*")):
        name = file.name
        if name.endswith(".jsonl"):
            if "subagents" in file.parts or gemini.is_nested_subagent_file(file):
                continue
            if file.is_file():
                found.append(file)
        elif name.endswith(".json"):
            if "chats" in file.parts and not gemini.is_nested_subagent_file(file):
                if file.is_file():
                    found.append(file)
            if name.startswith("ses_") and opencode.storage_session(file):
                storage_folders.add(file.parent)
        elif opencode.is_database(file) and file.is_file():
            sessions = _database_sessions(file)
            in_databases.update(session.name for session in sessions)
            found += sessions
    for storage in sorted(storage_folders):
        for session in opencode.storage_sessions(storage):
            if session.stem not in in_databases:
                found.append(session)
    return found


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass
class PreparedFile:
    """One session file read, hashed, parsed and compressed (in a worker process, or in
    this one): all the writer needs, so no database work waits on parsing."""

    path: Path
    size: int = 0
    # The file's mtime, or None when it was too recent to vouch for the content (below).
    mtime_ns: int | None = None
    sha256: str = ""
    # None: the file is the one already imported (same digest), or it failed (`error`).
    parsed: ParsedThread | None = None  # its turns handed over as turn_rows instead
    turn_rows: list[tuple[Any, ...]] = field(default_factory=list)  # TURN_COLUMNS
    totals: dict[str, object] = field(default_factory=dict)  # the thread's sums of them
    codec: str = ""
    compressed: bytes = b""
    error: str = ""


# A file modified this recently may still change within the same mtime tick, so its mtime
# is not recorded and the next import hashes it (git's "racily clean" entries).
RACY_MTIME_NS = 2 * 10**9


def prepare_file(
    path: Path, *, max_bytes: int, known_sha256: str = "", copy_if_known: bool = False
) -> PreparedFile:
    """Read `path` once: its digest, then (unless it is `known_sha256`, the file already
    imported) its parsed thread and its compressed copy. Runs in the import's worker
    processes: no database here. Every failure becomes `error`, never an exception."""
    prepared = PreparedFile(path=path)
    unstorable = _unstorable_path(path)
    if unstorable:
        prepared.error = unstorable
        return prepared
    try:
        assembled = opencode.is_assembled(path)
        if not assembled:
            stat = path.stat()
            prepared.size = stat.st_size
            if prepared.size > max_bytes:
                prepared.error = f"{path}: {_megabytes(prepared.size)} is larger than the transcript limit of {_megabytes(max_bytes)}."
                return prepared
        # An OpenCode session in a database or a storage folder is assembled from many
        # records: its bytes are that document, and no one file's mtime vouches for it.
        data, assembled = read_source(path, max_bytes=max_bytes)
    except TranscriptError as exc:
        prepared.error = str(exc) if str(path) in str(exc) else f"{path}: {exc}"
        return prepared
    except OSError as exc:
        prepared.error = f"{path}: cannot read ({exc.strerror})."
        return prepared
    if not assembled and time.time_ns() - stat.st_mtime_ns > RACY_MTIME_NS:
        prepared.mtime_ns = stat.st_mtime_ns
    prepared.size = len(data)
    prepared.sha256 = hashlib.sha256(data).hexdigest()
    if prepared.sha256 == known_sha256:
        if copy_if_known:
            prepared.codec, prepared.compressed = store.compress(data)
        return prepared
    try:
        parsed = parse_transcript(path, max_bytes=max_bytes, data=data)
        _check_lengths(parsed, path=path)
    except TranscriptError as exc:
        prepared.error = str(exc)
        return prepared
    except OSError as exc:
        prepared.error = f"{path}: cannot read ({exc.strerror})."
        return prepared
    table = price_table()
    prices: dict[str, pricing.PriceMatch | None] = {}
    values = [_turn_values(turn, table, prices) for turn in parsed.turns]
    prepared.totals = _totals(values, _pre_turn_values(parsed, table, prices))
    prepared.turn_rows = _turn_rows(values)
    parsed.turns = []  # not sent twice from the worker
    prepared.parsed = parsed
    prepared.codec, prepared.compressed = store.compress(data)
    return prepared


def import_transcript_file(
    *,
    path: Path,
    user: AbstractBaseUser,
    max_bytes: int | None = None,
    sha256: str | None = None,
) -> ImportResult:
    """Import one session file for `user` (the thread is theirs): new, updated in place,
    unchanged (skipped), or failed with the reason (a bad file, a duplicate of the
    thread's own file). Another user's threads are never looked at or touched.

    `sha256` is the file's digest when the caller computed it while writing the file
    (the bytes read are hashed again: they are what is parsed and stored)."""
    limit = max_bytes if max_bytes is not None else max_transcript_bytes()
    known = Thread.objects.filter(owner=user, source_path=str(path)).first()
    prepared = prepare_file(
        path,
        max_bytes=limit,
        known_sha256=known.source_sha256 if known is not None else "",
        copy_if_known=known is not None and not _has_copy(known),
    )
    return write_prepared(prepared, user=user, known=known)


def import_files(
    *,
    paths: Iterable[Path],
    user: AbstractBaseUser,
    max_bytes: int | None = None,
    workers: int | None = None,
) -> Iterator[ImportResult]:
    """Import many session files for `user`, yielding one result per file in order.

    A file whose size and mtime are those recorded at its last import is unchanged without
    being read; the others are read, hashed, parsed and compressed by `workers` processes
    (default: one per core) while this process writes what they hand back, one file per
    transaction. At most a few files are in flight at once, so memory does not grow with
    the number of files."""
    limit = max_bytes if max_bytes is not None else max_transcript_bytes()
    known: dict[str, Thread] = {}
    for thread in Thread.objects.filter(owner=user).order_by("pk"):
        known.setdefault(thread.source_path, thread)
    copied = set(Transcript.objects.filter(thread__owner=user).values_list("thread_id", flat=True))
    planned: list[ImportResult | tuple[Path, Thread | None]] = []
    for path in paths:
        thread = known.get(str(path))
        if thread is not None and thread.pk in copied and _same_stat(path, thread):
            planned.append(
                ImportResult(path=path, outcome="unchanged", thread=thread, turns=thread.turn_count)
            )
        else:
            planned.append((path, thread))
    jobs = sum(1 for item in planned if isinstance(item, tuple))
    count = min(workers or os.cpu_count() or 1, jobs)
    context = _fork_context()
    if count > 1 and context:
        price_table()  # read once, before the workers fork: each inherits it
    pool = ProcessPoolExecutor(count, mp_context=context) if count > 1 and context else None
    synchronous = _relaxed_sqlite_sync()
    try:
        window: deque[
            tuple[ImportResult | Future[PreparedFile] | PreparedFile, Thread | None, Path]
        ]
        window = deque()
        for item in planned:
            if isinstance(item, ImportResult):
                window.append((item, None, item.path))
            else:
                path, thread = item
                arguments = {
                    "max_bytes": limit,
                    "known_sha256": thread.source_sha256 if thread is not None else "",
                    "copy_if_known": thread is not None and thread.pk not in copied,
                }
                if pool is not None:
                    window.append((pool.submit(prepare_file, path, **arguments), thread, path))
                else:
                    window.append((prepare_file(path, **arguments), thread, path))
            while len(window) > 2 * count + 1:
                yield _finish(*window.popleft(), user=user)
        while window:
            yield _finish(*window.popleft(), user=user)
    finally:
        if pool is not None:
            pool.shutdown(cancel_futures=True)
        if synchronous is not None:
            _set_sqlite_sync(synchronous)


def _relaxed_sqlite_sync() -> int | None:
    """On SQLite (in WAL mode), commit without waiting for the disk while importing: one
    transaction per file made the wait for fsync a quarter of the writer's time. A crash of
    the machine can then lose the last files imported, never corrupt the database, and a
    new import brings them back. Returns the setting to restore (None: left as it was)."""
    connection = connections[router.db_for_write(Thread)]
    if connection.vendor != "sqlite" or connection.in_atomic_block:
        return None
    with connection.cursor() as cursor:
        if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
            return None
        previous = cursor.execute("PRAGMA synchronous").fetchone()[0]
    _set_sqlite_sync(1)  # NORMAL
    return int(previous)


def _commit_without_waiting() -> None:
    """PostgreSQL's counterpart of _relaxed_sqlite_sync, for the current transaction only:
    its commit does not wait for the WAL to reach the disk (a crash of the server can lose
    it, never corrupt anything; the next import brings the file back)."""
    connection = connections[router.db_for_write(Thread)]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL synchronous_commit TO OFF")


def _set_sqlite_sync(level: int) -> None:
    with connections[router.db_for_write(Thread)].cursor() as cursor:
        cursor.execute(f"PRAGMA synchronous = {int(level)}")


def _finish(
    item: ImportResult | Future[PreparedFile] | PreparedFile,
    thread: Thread | None,
    path: Path,
    *,
    user: AbstractBaseUser,
) -> ImportResult:
    """The result of one planned file: a file that breaks the importer is a failed file,
    not the end of the run."""
    if isinstance(item, ImportResult):
        return item
    try:
        prepared = item.result() if isinstance(item, Future) else item
        return write_prepared(prepared, user=user, known=thread, durable=False)
    except Exception as exc:
        logger.exception("importing %s failed", path)
        return ImportResult(
            path=path,
            outcome="failed",
            error=f"{path}: could not be imported ({type(exc).__name__}: {exc}).",
        )


def _fork_context() -> multiprocessing.context.BaseContext | None:
    """Workers are forked: they start at once with the code already loaded (they never
    touch the database connection they inherit). None where fork does not exist."""
    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _same_stat(path: Path, thread: Thread) -> bool:
    if thread.source_mtime_ns is None or opencode.is_assembled(path):
        return False
    try:
        stat = path.stat()
    except OSError:
        return False
    return stat.st_size == thread.source_size and stat.st_mtime_ns == thread.source_mtime_ns


def _has_copy(thread: Thread) -> bool:
    return Transcript.objects.filter(thread=thread).exists()


def write_prepared(
    prepared: PreparedFile, *, user: AbstractBaseUser, known: Thread | None, durable: bool = True
) -> ImportResult:
    """Write one prepared file: `known` is the user's thread recorded at the same path.
    Not `durable`: a bulk import, whose commits need not wait for the disk (a crash loses
    at most the last files, which the next import brings back); an upload's must."""
    path = prepared.path
    if prepared.error:
        return ImportResult(path=path, outcome="failed", error=prepared.error)
    if prepared.parsed is None:
        # The file already imported: remember its mtime (and keep a copy if it had none).
        assert known is not None
        with transaction.atomic():
            if not durable:
                _commit_without_waiting()
            if known.source_mtime_ns != prepared.mtime_ns:
                Thread.objects.filter(pk=known.pk).update(source_mtime_ns=prepared.mtime_ns)
                known.source_mtime_ns = prepared.mtime_ns
            if prepared.compressed:
                _store_copy(known, prepared)
        return ImportResult(path=path, outcome="unchanged", thread=known, turns=known.turn_count)
    parsed = prepared.parsed
    try:
        thread, outcome = _save_thread(parsed, prepared=prepared, user=user, durable=durable)
    except TranscriptError as exc:
        return ImportResult(path=path, outcome="failed", error=str(exc))
    return ImportResult(
        path=path,
        outcome=outcome,
        thread=thread,
        turns=len(prepared.turn_rows),
        problems=parsed.problems,
    )


def _store_copy(thread: Thread, prepared: PreparedFile, *, new: bool = False) -> None:
    """Keep the file's compressed bytes as the thread's transcript (replacing any older copy;
    a `new` thread has none, so the row is only inserted)."""
    values = {
        "codec": prepared.codec,
        "data": prepared.compressed,
        "size": prepared.size,
        "sha256": prepared.sha256,
        "stored_at": timezone.now(),
    }
    if new:
        Transcript.objects.create(thread=thread, **values)
    else:
        Transcript.objects.update_or_create(thread=thread, defaults=values)


class TranscriptUnavailable(Exception):
    """The thread's transcript can be read neither from the database nor from its file."""


def read_transcript(thread: Thread) -> bytes:
    """The thread's transcript as it was imported: the copy kept in the database, so it
    reads the same on any machine; for a thread imported before copies were kept, its
    file (if it is still there and not over the transcript limit). TranscriptUnavailable
    saying why not."""
    row = Transcript.objects.filter(thread=thread).first()
    if row is not None:
        try:
            return store.decompress(row.codec, bytes(row.data))
        except store.StoredTranscriptError as exc:
            raise TranscriptUnavailable(f"the transcript of thread {thread.pk}: {exc}") from None
    path = Path(thread.source_path)
    limit = max_transcript_bytes()
    try:
        with path.open("rb") as handle:
            data = handle.read(limit + 1)
    except FileNotFoundError:
        raise TranscriptUnavailable(f"the transcript {path} is gone") from None
    except OSError as exc:
        raise TranscriptUnavailable(
            f"the transcript {path} cannot be read: {exc.strerror or exc}"
        ) from None
    if len(data) > limit:
        raise TranscriptUnavailable(f"the transcript {path} is larger than {limit:,} bytes")
    return data


def transcript_copy_sha256(thread: Thread) -> str | None:
    """The sha256 of the thread's stored copy (None: no copy is kept)."""
    return Transcript.objects.filter(thread=thread).values_list("sha256", flat=True).first()


def import_uploaded_transcript(
    *, upload: IO[bytes], filename: str, user: AbstractBaseUser
) -> ImportResult:
    """Keep an uploaded file under the var folder (approvals re-check its digest later), then import it."""
    uploads = _uploads_dir()
    staging = uploads / "incoming"
    staging.mkdir(parents=True, exist_ok=True)
    safe_name = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(filename).name)[:120] or "transcript.jsonl"
    limit = max_transcript_bytes()
    digest = hashlib.sha256()
    written = 0
    temporary = staging / f"{os.getpid()}-{os.urandom(6).hex()}-{safe_name}"
    try:
        with temporary.open("wb") as out:
            for chunk in iter(lambda: upload.read(1024 * 1024), b""):
                written += len(chunk)
                if written > limit:
                    return ImportResult(
                        path=Path(safe_name),
                        outcome="failed",
                        error=f"{safe_name}: the file is larger than the transcript limit of {_megabytes(limit)}.",
                    )
                digest.update(chunk)
                out.write(chunk)
        final_dir = uploads / digest.hexdigest()
        final_dir.mkdir(parents=True, exist_ok=True)
        final = final_dir / safe_name
        shutil.move(temporary, final)
    finally:
        temporary.unlink(missing_ok=True)
    try:
        result = import_transcript_file(
            path=final, user=user, max_bytes=limit, sha256=digest.hexdigest()
        )
    except BaseException:
        _discard_upload(final)
        raise
    if result.outcome == "failed":
        # Name the file as the user knows it, not our storage path.
        result.error = result.error.replace(str(final), safe_name)
        _discard_upload(final)
    return result


def _discard_upload(final: Path) -> None:
    """Remove an upload that did not become a thread's file, and its folder once empty.

    Only the file itself: the folder (named by the digest) may hold the same content
    under another name, which a thread does use."""
    final.unlink(missing_ok=True)
    try:
        final.parent.rmdir()
    except OSError:
        pass  # not empty, or already gone


def _uploads_dir() -> Path:
    return settings.REPLAYS_VAR_DIR / "uploads"


def _unstorable_path(path: Path) -> str:
    """Why ``path`` cannot be a thread's source_path ("" when it can)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        # A name in another encoding (Python keeps its bytes as surrogates).
        shown = text.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        return f"{shown}: the file's path is not UTF-8 text."
    limit = Thread._meta.get_field("source_path").max_length
    if len(text) > limit:
        return f"{text[:200]}…: the file's path is longer than {limit} characters."
    return ""


def _check_lengths(parsed: ParsedThread, *, path: Path) -> None:
    """Refuse what no column can hold before the database sees it (fields that are only
    descriptive are cut to fit instead, in _save_thread)."""
    limit = Thread._meta.get_field("session_id").max_length
    if len(parsed.session_id) > limit:
        raise TranscriptError(
            f"{path}: its session id is {len(parsed.session_id)} characters long, "
            f"longer than the {limit} a thread can keep."
        )


def _recorded_elsewhere(thread: Thread, path: Path) -> bool:
    """Whether the thread keeps another file than ``path`` that still exists (uploads,
    our own snapshots, never hold a thread against a newer import)."""
    recorded = Path(thread.source_path)
    if thread.source_path == str(path) or recorded.is_relative_to(_uploads_dir()):
        return False
    try:
        return recorded.is_file() and not os.path.samefile(recorded, path)
    except OSError:
        return False


def _save_thread(
    parsed: ParsedThread, *, prepared: PreparedFile, user: AbstractBaseUser, durable: bool
) -> tuple[Thread, Outcome]:
    path, sha256, size = prepared.path, prepared.sha256, prepared.size
    values = {
        "title": (parsed.title or parsed.session_id)[:500],
        "cwd": parsed.cwd[:4096],
        "git_branch": parsed.git_branch[:255],
        "git_commit": parsed.git_commit[:40],
        "repository_url": parsed.repository_url[:2000],
        "cli_version": parsed.cli_version[:100],
        "started_at": parsed.started_at,
        "ended_at": parsed.ended_at,
        "source_path": str(path),
        "source_sha256": sha256,
        "source_size": size,
        "source_mtime_ns": prepared.mtime_ns,
        **prepared.totals,
    }
    with transaction.atomic():
        if not durable:
            _commit_without_waiting()
        thread = Thread.objects.filter(
            owner=user, source_kind=parsed.kind, session_id=parsed.session_id
        ).first()
        if thread is not None and _recorded_elsewhere(thread, path):
            if thread.source_sha256 == sha256:
                return thread, "unchanged"  # a copy of the thread's own file
            raise TranscriptError(
                f"{path}: duplicate of {thread.source_path}: both hold session "
                f"{parsed.session_id}, and the thread keeps the file it was imported from."
            )
        if thread is not None and thread.source_sha256 == sha256:
            # Same content seen under another path: remember where it lives now.
            if thread.source_path != str(path):
                Thread.objects.filter(pk=thread.pk).update(
                    source_path=str(path), source_mtime_ns=prepared.mtime_ns
                )
                thread.source_path = str(path)
                thread.source_mtime_ns = prepared.mtime_ns
            if not _has_copy(thread):
                _store_copy(thread, prepared)
            return thread, "unchanged"
        if thread is None:
            thread = Thread.objects.create(
                source_kind=parsed.kind, session_id=parsed.session_id, owner=user, **values
            )
            outcome: Outcome = "new"
        else:
            for name, value in values.items():
                setattr(thread, name, value)
            thread.save()
            thread.turns.all().delete()
            outcome = "updated"
        _insert_turns(thread, prepared.turn_rows)
        _store_copy(thread, prepared, new=outcome == "new")
    return thread, outcome


# Turn's columns as the workers hand them over, the JSON ones already serialised.
TURN_COLUMNS = (
    "index", "message_uuid", "timestamp", "request", "request_as_sent", "rolled_back",
    "models_used", "usage_by_model", "long_context_usage", "priced_as", "recorded_costs",
    *TOKEN_FIELDS, "cost_usd", "seconds", "model_seconds", "last_answer_at", "evidence",
    "final_answer",
)  # fmt: skip
JSON_COLUMNS = frozenset(
    {"models_used", "usage_by_model", "long_context_usage", "priced_as", "recorded_costs",
     "evidence"}
)  # fmt: skip


def usage_json(usage_by_model: dict[str, TokenUsage]) -> dict[str, dict[str, int]]:
    return {model: usage.as_dict() for model, usage in usage_by_model.items()}


def long_context_json(long_context: LongContextUsage) -> dict[str, dict[str, dict[str, int]]]:
    """LongContextUsage as JSON: the sizes become keys ("200000")."""
    return {
        model: {str(size): usage.as_dict() for size, usage in by_size.items()}
        for model, by_size in long_context.items()
    }


def usage_from_json(raw: dict[str, dict[str, int]]) -> dict[str, TokenUsage]:
    return {model: TokenUsage(**usage) for model, usage in raw.items()}


def recorded_json(recorded: dict[str, RecordedCost]) -> dict[str, dict[str, Any]]:
    """RecordedCost per model as JSON: the dollars as exact decimal text."""
    return {
        model: {"usd": str(cost.usd), "usage": cost.usage.as_dict()}
        for model, cost in recorded.items()
    }


def recorded_from_json(raw: dict[str, dict[str, Any]]) -> dict[str, RecordedCost]:
    return {
        model: RecordedCost(Decimal(entry["usd"]), TokenUsage(**entry["usage"]))
        for model, entry in raw.items()
    }


def long_context_from_json(raw: dict[str, dict[str, dict[str, int]]]) -> LongContextUsage:
    return {
        model: {int(size): TokenUsage(**usage) for size, usage in by_size.items()}
        for model, by_size in raw.items()
    }


def _turn_values(
    turn: ParsedTurn, table: pricing.PriceTable, prices: dict[str, pricing.PriceMatch | None]
) -> dict[str, Any]:
    usage = turn.usage
    cost, priced_as = _turn_cost(
        turn.usage_by_model, turn.long_context_usage, table, prices, turn.recorded_costs
    )
    return {
        "index": turn.index,
        "message_uuid": turn.message_uuid,  # unique and within the column (the parsers see to it)
        "timestamp": turn.timestamp,
        "request": turn.request,
        "request_as_sent": turn.request_as_sent,
        "rolled_back": turn.rolled_back,
        "models_used": turn.models,
        "usage_by_model": usage_json(turn.usage_by_model),
        "long_context_usage": long_context_json(turn.long_context_usage),
        "priced_as": priced_as,
        "recorded_costs": recorded_json(turn.recorded_costs),
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_5m_tokens": usage.cache_write_5m_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "cost_usd": cost,
        "seconds": turn.seconds,
        "model_seconds": turn.model_seconds,
        "last_answer_at": turn.last_answer_at,
        "evidence": turn.evidence.as_json(),
        "final_answer": turn.final_answer,
    }


def _json_text(value: Any) -> str:
    """JSON for a JSONField column; orjson, several times faster than json on evidence."""
    try:
        return orjson.dumps(value).decode()
    except (TypeError, orjson.JSONEncodeError):  # an integer past 64 bits, for one
        return json.dumps(value)


def _turn_rows(values: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The turns as the rows _insert_turns writes (TURN_COLUMNS): JSON serialised, dates and
    decimals converted by their fields for this database (no connection needed), so that
    the workers, not the one writer, do that work."""
    connection = connections[router.db_for_write(Turn)]
    converters: list[tuple[str, Callable[[Any], Any] | None]] = []
    for column in TURN_COLUMNS:
        f = Turn._meta.get_field(column)
        kind = f.get_internal_type()
        if column in JSON_COLUMNS:
            converters.append((column, _json_text))
        elif kind == "DateTimeField":
            converters.append((column, _datetime_converter(f, connection)))
        elif kind == "DecimalField":
            converters.append((column, partial(f.get_db_prep_save, connection=connection)))
        else:
            converters.append((column, None))
    return [
        tuple(
            row[column] if convert is None else convert(row[column])
            for column, convert in converters
        )
        for row in values
    ]


def _datetime_converter(f: Any, connection: Any) -> Callable[[Any], Any]:
    """f.get_db_prep_save for a DateTimeField, in one step for an aware datetime (the
    field's own steps only check that it is one, then hand it to the backend)."""
    adapt: Callable[[datetime], Any] = connection.ops.adapt_datetimefield_value
    if connection.vendor == "sqlite" and settings.USE_TZ:
        # SQLite's adapt_datetimefield_value: the time in the connection's zone, naive, as
        # text (its steps for expressions and naive values do not apply here).
        zone = connection.timezone
        adapt = lambda value: str(value.astimezone(zone).replace(tzinfo=None))  # noqa: E731

    def convert(value: Any) -> Any:
        if type(value) is datetime and value.utcoffset() is not None:
            return adapt(value)
        return f.get_db_prep_save(value, connection)

    return convert


def _insert_turns(thread: Thread, rows: list[tuple[Any, ...]]) -> None:
    """Insert a thread's turns (rows from _turn_rows) in a few statements.

    bulk_create compiles every value of every row through the ORM, which made most of the
    writer's time; here the workers have already converted the values."""
    connection = connections[router.db_for_write(Turn)]
    fields = [Turn._meta.get_field(column) for column in TURN_COLUMNS]
    json_positions = [position for position, f in enumerate(fields) if f.name in JSON_COLUMNS]
    if connection.vendor not in ("sqlite", "postgresql"):
        objects = []
        for row in rows:
            data = {f.attname: value for f, value in zip(fields, row, strict=True)}
            for position in json_positions:
                data[fields[position].attname] = json.loads(row[position])
            objects.append(Turn(thread=thread, **data))
        Turn.objects.bulk_create(objects, batch_size=500)
        return
    quote = connection.ops.quote_name
    columns = ", ".join(quote(f.column) for f in [Turn._meta.get_field("thread"), *fields])
    sql = (
        f"INSERT INTO {quote(Turn._meta.db_table)} ({columns}) "
        f"VALUES ({', '.join(['%s'] * (len(fields) + 1))})"
    )
    if connection.vendor == "sqlite":
        params = [(thread.pk, *row) for row in rows]
    else:
        params = []
        for row in rows:
            values = [thread.pk, *row]
            for position in json_positions:
                values[position + 1] = _jsonb(values[position + 1])
            params.append(values)
    with connection.cursor() as cursor:
        for start in range(0, len(params), 1000):
            cursor.executemany(sql, params[start : start + 1000])


def _jsonb(text: str) -> Any:
    """A JSON text as PostgreSQL's jsonb parameter (psycopg sends it as it is)."""
    from psycopg.types.json import Jsonb

    return Jsonb(text, dumps=_as_is)


def _as_is(text: str) -> str:
    return text


def _turn_cost(
    usage_by_model: dict[str, TokenUsage],
    long_context: LongContextUsage,
    table: pricing.PriceTable,
    prices: dict[str, pricing.PriceMatch | None] | None = None,
    recorded: dict[str, RecordedCost] | None = None,
) -> tuple[Decimal | None, dict[str, str | None]]:
    """pricing.turn_cost_usd and pricing.priced_as in one pass, with each model matched once
    per file (`prices` keeps the matches: a match tries several spellings of the name).

    The cost a tool recorded itself (`recorded`: OpenCode's, pi's) is the cost of the usage
    it covers; a model's usage it does not cover is priced from the table. A model all of
    whose usage the tool priced shows pricing.RECORDED_ENTRY."""
    # From the price table, not an old Claude transcript's own costUSD, so that update_prices
    # can re-price every turn the same way; a figure OpenCode or pi recorded stays theirs.
    prices = {} if prices is None else prices
    recorded = recorded or {}
    total: Decimal | None = Decimal(0)
    entries: dict[str, str | None] = {}
    for model, usage in usage_by_model.items():
        if usage.total == 0:
            continue
        own = recorded.get(model)
        rest = usage - own.usage if own is not None else usage
        if own is not None and total is not None:
            total += own.usd
        if own is not None and rest.total <= 0:
            entries[model] = pricing.RECORDED_ENTRY
            continue
        if model not in prices:
            prices[model] = table.match(model)
        found = prices[model]
        entries[model] = found.entry if found is not None else None
        if found is None:
            total = None  # one unknown model makes the turn's cost unknown
        elif total is not None:
            total += found.price.cost_usd(rest, long_context.get(model))
    return total, entries


def _pre_turn_values(
    parsed: ParsedThread, table: pricing.PriceTable, prices: dict[str, pricing.PriceMatch | None]
) -> dict[str, Any]:
    """The usage no turn served, as the Thread's pre_turn_* fields and its sums."""
    cost, priced_as = _turn_cost(
        parsed.pre_turn_usage_by_model, parsed.pre_turn_long_context_usage, table, prices,
        parsed.pre_turn_recorded_costs,
    )  # fmt: skip
    usage = sum(parsed.pre_turn_usage_by_model.values(), TokenUsage())
    return {
        "pre_turn_usage_by_model": usage_json(parsed.pre_turn_usage_by_model),
        "pre_turn_long_context_usage": long_context_json(parsed.pre_turn_long_context_usage),
        "pre_turn_recorded_costs": recorded_json(parsed.pre_turn_recorded_costs),
        "cost_usd": cost,
        "priced_as": priced_as,
        "models_used": list(parsed.pre_turn_usage_by_model),
        **usage.as_dict(),
    }


def _totals(turns: list[dict[str, Any]], pre_turn: dict[str, Any]) -> dict[str, object]:
    """The thread's fields summed from its turns and the usage before them."""
    seconds = [turn["seconds"] for turn in turns if turn["seconds"] is not None]
    model_seconds = [turn["model_seconds"] for turn in turns if turn["model_seconds"] is not None]
    models: list[str] = list(pre_turn["models_used"])
    priced_as = dict(pre_turn["priced_as"])
    for turn in turns:
        models += [m for m in turn["models_used"] if m not in models]
        for model, entry in turn["priced_as"].items():
            priced_as.setdefault(model, entry)
    return {
        **{name: sum(turn[name] for turn in turns) + pre_turn[name] for name in TOKEN_FIELDS},
        "cost_usd": _total_cost([turn["cost_usd"] for turn in turns] + [pre_turn["cost_usd"]]),
        "seconds": sum(seconds) if seconds else None,
        "model_seconds": sum(model_seconds) if model_seconds else None,
        "turn_count": len(turns),
        "models_used": models,
        "priced_as": priced_as,
        "pre_turn_usage_by_model": pre_turn["pre_turn_usage_by_model"],
        "pre_turn_long_context_usage": pre_turn["pre_turn_long_context_usage"],
        "pre_turn_recorded_costs": pre_turn["pre_turn_recorded_costs"],
        "pre_turn_cost_usd": pre_turn["cost_usd"],
    }


def _total_cost(costs: list[Decimal | None]) -> Decimal | None:
    # One unknown price makes the total unknown: never a silent $0.
    return None if any(c is None for c in costs) else sum(costs, Decimal(0))  # type: ignore[arg-type]


def recompute_costs() -> int:
    """Re-price every turn and thread with the current price table (each request by its own
    input size, as at import); returns the threads whose cost changed."""
    table = price_table()
    changed = 0
    prices: dict[str, pricing.PriceMatch | None] = {}
    for thread in Thread.objects.all().iterator():
        with transaction.atomic():
            turns = list(thread.turns.all())
            for turn in turns:
                turn.cost_usd, turn.priced_as = _turn_cost(
                    usage_from_json(turn.usage_by_model),
                    long_context_from_json(turn.long_context_usage),
                    table,
                    prices,
                    recorded_from_json(turn.recorded_costs),
                )
            Turn.objects.bulk_update(turns, ["cost_usd", "priced_as"])
            pre_turn_cost, priced_as = _turn_cost(
                usage_from_json(thread.pre_turn_usage_by_model),
                long_context_from_json(thread.pre_turn_long_context_usage),
                table,
                prices,
                recorded_from_json(thread.pre_turn_recorded_costs),
            )
            for turn in turns:
                for model, entry in turn.priced_as.items():
                    priced_as.setdefault(model, entry)
            cost = _total_cost([turn.cost_usd for turn in turns] + [pre_turn_cost])
            if cost != thread.cost_usd:
                changed += 1
            Thread.objects.filter(pk=thread.pk).update(
                cost_usd=cost, pre_turn_cost_usd=pre_turn_cost, priced_as=priced_as
            )
    return changed


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"
