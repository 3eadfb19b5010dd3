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
import logging
import os
import re
import shutil
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Literal

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from replays import pricing
from replays.models import TOKEN_FIELDS, Thread, Turn
from replays.transcripts import (
    LineProblem,
    ParsedThread,
    ParsedTurn,
    TokenUsage,
    TranscriptError,
    parse_transcript,
)

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
    """Where Claude Code and Codex keep their session files on this machine."""
    home = Path.home()
    roots: list[Path] = []
    for config_dir in os.environ.get("CLAUDE_CONFIG_DIR", "").split(","):
        if config_dir.strip():
            roots.append(Path(config_dir.strip()).expanduser() / "projects")
    roots += [home / ".claude" / "projects", home / ".config" / "claude" / "projects"]
    codex_home = os.environ.get("CODEX_HOME", "").strip()
    if codex_home:
        roots.append(Path(codex_home).expanduser() / "sessions")
    roots.append(home / ".codex" / "sessions")
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def find_transcript_files(paths: Iterable[Path]) -> Iterator[Path]:
    """Session files under the given files and folders, in a stable order.

    Sub-agent transcripts (`<session>/subagents/*.jsonl`) are read together with
    their main session file, so they are not listed on their own.
    """
    seen: set[Path] = set()
    for path in paths:
        if path.is_file():
            candidates = [path]
        elif path.is_dir():
            candidates = sorted(
                p for p in path.rglob("*.jsonl") if p.is_file() and "subagents" not in p.parts
            )
        else:
            continue
        for candidate in candidates:
            resolved = candidate.resolve()
            if resolved not in seen:
                seen.add(resolved)
                yield candidate


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1024 * 1024), b""):
            digest.update(chunk)
    return digest.hexdigest()


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

    `sha256` is the file's digest when the caller computed it while writing the file."""
    limit = max_bytes if max_bytes is not None else max_transcript_bytes()
    unstorable = _unstorable_path(path)
    if unstorable:
        return ImportResult(path=path, outcome="failed", error=unstorable)
    try:
        size = path.stat().st_size
    except OSError as exc:
        return ImportResult(
            path=path, outcome="failed", error=f"{path}: cannot read ({exc.strerror})."
        )
    if size > limit:
        return ImportResult(
            path=path,
            outcome="failed",
            error=f"{path}: {_megabytes(size)} is larger than the transcript limit of {_megabytes(limit)}.",
        )
    sha256 = sha256 or file_sha256(path)
    known = Thread.objects.filter(
        owner=user, source_path=str(path), source_sha256=sha256, source_size=size
    ).first()
    if known is not None:
        return ImportResult(path=path, outcome="unchanged", thread=known, turns=known.turn_count)
    try:
        parsed = parse_transcript(path, max_bytes=limit)
        _check_lengths(parsed, path=path)
        thread, outcome = _save_thread(parsed, path=path, sha256=sha256, size=size, user=user)
    except TranscriptError as exc:
        return ImportResult(path=path, outcome="failed", error=str(exc))
    except OSError as exc:
        return ImportResult(
            path=path, outcome="failed", error=f"{path}: cannot read ({exc.strerror})."
        )
    return ImportResult(
        path=path, outcome=outcome, thread=thread, turns=len(parsed.turns), problems=parsed.problems
    )


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
    parsed: ParsedThread, *, path: Path, sha256: str, size: int, user: AbstractBaseUser
) -> tuple[Thread, Outcome]:
    table = price_table()
    turns = [_turn_row(turn, table) for turn in parsed.turns]
    totals = _totals(turns)
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
        **totals,
    }
    with transaction.atomic():
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
                Thread.objects.filter(pk=thread.pk).update(source_path=str(path))
                thread.source_path = str(path)
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
        for turn in turns:
            turn.thread = thread
        Turn.objects.bulk_create(turns)
    return thread, outcome


def _turn_row(turn: ParsedTurn, table: pricing.PriceTable) -> Turn:
    usage = turn.usage
    return Turn(
        index=turn.index,
        message_uuid=turn.message_uuid,  # unique and within the column (the parsers see to it)
        timestamp=turn.timestamp,
        request=turn.request,
        models_used=turn.models,
        usage_by_model={model: u.as_dict() for model, u in turn.usage_by_model.items()},
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        cache_read_tokens=usage.cache_read_tokens,
        cache_write_5m_tokens=usage.cache_write_5m_tokens,
        cache_write_1h_tokens=usage.cache_write_1h_tokens,
        cost_usd=_turn_cost(turn.usage_by_model, table),
        seconds=turn.seconds,
        model_seconds=turn.model_seconds,
        last_answer_at=turn.last_answer_at,
        evidence=turn.evidence.as_json(),
        final_answer=turn.final_answer,
    )


def _turn_cost(usage_by_model: dict[str, TokenUsage], table: pricing.PriceTable) -> Decimal | None:
    # Always from the price table (not an old transcript's own costUSD), so that
    # update_prices can re-price every turn the same way.
    if not any(usage.total for usage in usage_by_model.values()):
        return Decimal(0)
    return pricing.turn_cost_usd(usage_by_model, table)


def _totals(turns: list[Turn]) -> dict[str, object]:
    costs = [turn.cost_usd for turn in turns]
    seconds = [turn.seconds for turn in turns if turn.seconds is not None]
    model_seconds = [turn.model_seconds for turn in turns if turn.model_seconds is not None]
    models: list[str] = []
    for turn in turns:
        models += [m for m in turn.models_used if m not in models]
    return {
        **{name: sum(getattr(turn, name) for turn in turns) for name in TOKEN_FIELDS},
        # One unknown price makes the total unknown: never a silent $0.
        "cost_usd": None if any(c is None for c in costs) else sum(costs, Decimal(0)),
        "seconds": sum(seconds) if seconds else None,
        "model_seconds": sum(model_seconds) if model_seconds else None,
        "turn_count": len(turns),
        "models_used": models,
    }


def recompute_costs() -> int:
    """Re-price every turn and thread with the current price table; returns threads changed."""
    table = price_table()
    changed = 0
    for thread in Thread.objects.all().iterator():
        with transaction.atomic():
            turns = list(thread.turns.all())
            for turn in turns:
                usage_by_model = {m: TokenUsage(**u) for m, u in turn.usage_by_model.items()}
                turn.cost_usd = _turn_cost(usage_by_model, table)
            Turn.objects.bulk_update(turns, ["cost_usd"])
            cost = _totals(turns)["cost_usd"]
            if cost != thread.cost_usd:
                Thread.objects.filter(pk=thread.pk).update(cost_usd=cost)
                changed += 1
    return changed


def _megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"
