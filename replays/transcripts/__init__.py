"""Transcripts of agent sessions -> ParsedThread, whichever tool wrote them.

``parse_transcript`` is the entry point: it sniffs the format and refuses files
that are not transcripts at all; within a transcript, bad lines are reported
as LineProblems and skipped. Claude Code, Codex, pi and Gemini CLI (from v0.39) write
JSONL, one value a line; Gemini CLI's older sessions and OpenCode's sessions (as
``opencode export`` prints them, or assembled from its database or storage folder by
``read_source``) are one JSON document.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from replays.transcripts.base import (
    LineProblem,
    ParsedThread,
    ParsedTurn,
    TokenUsage,
    TranscriptError,
)
from replays.transcripts.claude_code import check_size, looks_like_claude_line, parse_claude_code
from replays.transcripts.codex import LINE_TYPES as CODEX_LINE_TYPES
from replays.transcripts.codex import parse_codex
from replays.transcripts.gemini import (
    looks_like_gemini_document,
    looks_like_gemini_line,
    parse_gemini,
)
from replays.transcripts.opencode import (
    is_assembled,
    looks_like_opencode_document,
    parse_opencode,
    session_document,
)
from replays.transcripts.pi import looks_like_pi_line, parse_pi

__all__ = [
    "CLAUDE_CODE",
    "CODEX",
    "GEMINI",
    "KINDS",
    "OPENCODE",
    "PI",
    "DEFAULT_MAX_BYTES",
    "LineProblem",
    "ParsedThread",
    "ParsedTurn",
    "TokenUsage",
    "TranscriptError",
    "detect_kind",
    "parse_claude_code",
    "parse_codex",
    "parse_transcript",
    "read_source",
]

CLAUDE_CODE = "claude_code"
CODEX = "codex"
GEMINI = "gemini"
OPENCODE = "opencode"
PI = "pi"
KINDS = (CLAUDE_CODE, CODEX, GEMINI, OPENCODE, PI)
DEFAULT_MAX_BYTES = 50 * 1024 * 1024
# What a file that is none of them is told.
NOT_A_TRANSCRIPT = "is not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi"
# A whole JSON document is sniffed only up to this size (larger ones are JSONL or refused).
_DOCUMENT_SNIFF_BYTES = DEFAULT_MAX_BYTES


def read_source(path: Path, *, max_bytes: int) -> tuple[bytes, bool]:
    """The bytes of the session at ``path`` and whether they were assembled (an OpenCode
    session in a database or in its storage folder, whose document is built from many
    records) rather than read from the file. TranscriptError saying why not; OSError when a
    plain file cannot be read."""
    if is_assembled(path):
        return session_document(path, max_bytes=max_bytes), True
    with path.open("rb") as handle:
        return handle.read(max_bytes + 1), False


def detect_kind(path: Path, data: bytes | None = None) -> str:
    """The tool that wrote the file (one of KINDS), from the first line that looks like one
    of theirs, or from the whole document for the one-document formats (of ``data``, the
    file's bytes, when given).

    Reads only as far as it must (usually the first line). Raises
    TranscriptError when the file is unreadable, binary, or holds no line of
    any format.
    """
    document = _document_kind(path, data)
    if document is not None:
        return document
    try:
        with path.open("rb") if data is None else io.BytesIO(data) as handle:
            first_line = True  # no non-blank line decoded yet
            for raw in handle:
                if first_line:
                    raw = raw.removeprefix(b"\xef\xbb\xbf")
                if not raw.strip():
                    continue
                try:
                    if b"\x00" in raw:
                        raise UnicodeDecodeError("utf-8", raw, 0, 1, "NUL byte")
                    text = raw.decode("utf-8")
                except UnicodeDecodeError:
                    if first_line:
                        raise TranscriptError(f"{path.name} is not UTF-8 text") from None
                    continue
                first_line = False
                try:
                    value = json.loads(text)
                except (ValueError, RecursionError):  # a number of 4301 digits is a ValueError
                    continue
                kind = _line_kind(value)
                if kind is not None:
                    return kind
    except OSError as exc:
        raise TranscriptError(f"{path.name} cannot be read: {exc.strerror or exc}") from exc
    if first_line:
        raise TranscriptError(f"{path.name} is empty")
    raise TranscriptError(f"{path.name} {NOT_A_TRANSCRIPT}")


def _document_kind(path: Path, data: bytes | None) -> str | None:
    """GEMINI or OPENCODE when the file is one JSON document of theirs; None otherwise (a
    file whose first line is a whole JSON value with more lines after it is JSONL)."""
    try:
        if data is None:
            with path.open("rb") as handle:
                head = handle.read(_HEAD_BYTES)
            if _is_jsonl(head) or not head.lstrip(_BLANK).startswith(b"{"):
                return None
            if path.stat().st_size > _DOCUMENT_SNIFF_BYTES:
                return None
            data = path.read_bytes()
    except OSError:
        return None
    if _is_jsonl(data[:_HEAD_BYTES]) or not data.lstrip(_BLANK).startswith(b"{"):
        return None
    try:
        value = json.loads(data.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    if looks_like_opencode_document(value):
        return OPENCODE
    if looks_like_gemini_document(value):
        return GEMINI
    return None


_BLANK = b"\xef\xbb\xbf \t\r\n"
_HEAD_BYTES = 64 * 1024


def _is_jsonl(head: bytes) -> bool:
    """Whether the file's start is a first line that is a whole JSON value, more after it."""
    text = head.lstrip(_BLANK)
    first, newline, rest = text.partition(b"\n")
    if not newline or not rest.strip():
        return False
    try:
        json.loads(first)
    except (ValueError, RecursionError):
        return False
    return True


def _line_kind(value: Any) -> str | None:
    if not isinstance(value, dict):
        return None
    line_type = value.get("type")
    if (
        isinstance(line_type, str)
        and line_type in CODEX_LINE_TYPES
        and isinstance(value.get("payload"), dict)
    ):
        return CODEX
    if looks_like_claude_line(value):
        return CLAUDE_CODE
    if looks_like_pi_line(value):
        return PI
    if looks_like_gemini_line(value):
        return GEMINI
    return None


def parse_transcript(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, data: bytes | None = None
) -> ParsedThread:
    """Parse a session file of any of KINDS, refusing files that are none.

    ``data``: the file's bytes, when the caller read them (at most ``max_bytes + 1``);
    sub-agent files are still read from beside ``path``.

    Raises TranscriptError (naming the file) when it is larger than
    ``max_bytes``, empty, not UTF-8 text, or not a transcript.
    """
    if data is None and is_assembled(path):
        data = session_document(path, max_bytes=max_bytes)
    if data is None:
        # Checked before sniffing so a huge file is refused without reading it.
        check_size(path, max_bytes=max_bytes)
    elif len(data) > max_bytes:
        raise TranscriptError(
            f"{path.name} is {len(data)} bytes, larger than the limit of {max_bytes} bytes"
        )
    kind = detect_kind(path, data)
    if kind == CODEX:
        return parse_codex(path, max_bytes=max_bytes, data=data)
    if kind == PI:
        return parse_pi(path, max_bytes=max_bytes, data=data)
    if kind == GEMINI:
        return parse_gemini(path, max_bytes=max_bytes, data=data)
    if kind == OPENCODE:
        return parse_opencode(path, max_bytes=max_bytes, data=data)
    return parse_claude_code(path, max_bytes=max_bytes, data=data)
