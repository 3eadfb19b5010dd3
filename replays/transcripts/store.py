"""How a transcript file is kept compressed in the database (replays.models.Transcript).

No ORM here: the importer compresses in its worker processes and writes the row; the
reader (replays.importing.read_transcript) hands the row's codec and bytes back here.
Zstandard at level 1 compresses code-heavy transcripts about as well as zlib's default
at several times zlib's speed, so storing a copy adds little to an import; zlib is read
too, for rows written where zstandard was missing.
"""

from __future__ import annotations

import zlib

try:
    import zstandard
except ImportError:  # pragma: no cover - a dependency; zlib keeps an install working without it
    zstandard = None

ZSTD = "zstd"
ZLIB = "zlib"
CODECS = (ZSTD, ZLIB)


class StoredTranscriptError(Exception):
    """A stored copy that cannot be read back (an unknown codec, damaged bytes)."""


def compress(data: bytes) -> tuple[str, bytes]:
    """(codec, compressed bytes) of a transcript file's bytes."""
    if zstandard is not None:
        return ZSTD, zstandard.ZstdCompressor(level=1).compress(data)
    return ZLIB, zlib.compress(data, 1)


def decompress(codec: str, blob: bytes) -> bytes:
    """The file's bytes back; StoredTranscriptError when they cannot be."""
    if codec == ZSTD:
        if zstandard is None:
            raise StoredTranscriptError("the stored copy needs the zstandard package")
        try:
            return zstandard.ZstdDecompressor().decompress(blob)
        except zstandard.ZstdError as exc:
            raise StoredTranscriptError(f"the stored copy is damaged ({exc})") from exc
    if codec == ZLIB:
        try:
            return zlib.decompress(blob)
        except zlib.error as exc:
            raise StoredTranscriptError(f"the stored copy is damaged ({exc})") from exc
    raise StoredTranscriptError(f"the stored copy uses an unknown codec {codec[:20]!r}")
