"""Transcripts of agent sessions -> ParsedThread, whichever tool wrote them.

``parse_transcript`` is the entry point: it sniffs the format and refuses files
that are not transcripts at all; within a transcript, bad lines are reported
as LineProblems and skipped.
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

__all__ = [
    "CLAUDE_CODE",
    "CODEX",
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
]

CLAUDE_CODE = "claude_code"
CODEX = "codex"
DEFAULT_MAX_BYTES = 50 * 1024 * 1024


def detect_kind(path: Path, data: bytes | None = None) -> str:
    """``"claude_code"`` or ``"codex"``, from the first line that looks like either
    (of ``data``, the file's bytes, when given).

    Reads only as far as it must (usually the first line). Raises
    TranscriptError when the file is unreadable, binary, or holds no line of
    either format.
    """
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
    raise TranscriptError(f"{path.name} is not a Claude Code or Codex transcript")


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
    return None


def parse_transcript(
    path: Path, *, max_bytes: int = DEFAULT_MAX_BYTES, data: bytes | None = None
) -> ParsedThread:
    """Parse a Claude Code or Codex transcript, refusing files that are neither.

    ``data``: the file's bytes, when the caller read them (at most ``max_bytes + 1``);
    sub-agent files are still read from beside ``path``.

    Raises TranscriptError (naming the file) when it is larger than
    ``max_bytes``, empty, not UTF-8 text, or not a transcript.
    """
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
    return parse_claude_code(path, max_bytes=max_bytes, data=data)
