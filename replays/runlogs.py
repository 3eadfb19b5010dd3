"""A run's whole agent log in the database (replays.models.RunLog).

The coordinator stores it as the run ends, and reconcile when it finds a coordinator of
its own machine lost; both read the run folder's agent log, which is only a cache of
the machine the run ran on. Pages and the API read the stored copy, so any machine
shows the whole log, also after the run folder is gone. A log longer than
REPLAYS_MAX_LOG_BYTES keeps its end, where an agent's failure is.
"""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings
from django.db import DatabaseError
from django.utils import timezone

from replays import processes
from replays.models import Run, RunLog
from replays.runfolder import AGENT_LOG, run_folder
from replays.transcripts import store

logger = logging.getLogger(__name__)


def store_log(run_id: int, path: Path | None = None) -> RunLog | None:
    """Keep the run's agent log (default: its run folder's) compressed in the database,
    replacing an earlier copy; None when there is no log file or it cannot be read. Never
    raises for a database error either: the log is kept in the run folder anyway."""
    try:
        data, cut = _read_end(path or run_folder(run_id) / AGENT_LOG)
    except OSError:
        return None
    codec, blob = store.compress(data)
    try:
        log, _ = RunLog.objects.update_or_create(
            run_id=run_id,
            defaults={
                "codec": codec,
                "data": blob,
                "size": cut + len(data),
                "cut": cut,
                "stored_at": timezone.now(),
            },
        )
    except DatabaseError as exc:
        logger.warning("Run %s: its log could not be stored: %s", run_id, exc)
        return None
    return log


def log_text(run: Run) -> str | None:
    """The run's whole agent log as text: the stored copy, else (a run still going) its
    run folder's file on this machine; None when neither exists. A cut log says so first."""
    stored = RunLog.objects.filter(run=run).first()
    if stored is not None:
        try:
            data = store.decompress(stored.codec, bytes(stored.data))
        except store.StoredTranscriptError as exc:
            return f"[replays] The stored log cannot be read: {exc}.\n"
        return _with_cut(data, stored.cut)
    try:
        return _with_cut(*_read_end(run_folder(run.pk) / AGENT_LOG))
    except OSError:
        return None


def _read_end(path: Path) -> tuple[bytes, int]:
    """The last REPLAYS_MAX_LOG_BYTES of the file, and how many bytes come before them.
    The agent could have put a link or a FIFO in the log's place: refused (OSError), never
    followed or waited on (processes.read_untrusted_end)."""
    return processes.read_untrusted_end(path, max_bytes=int(settings.REPLAYS_MAX_LOG_BYTES))


def _with_cut(data: bytes, cut: int) -> str:
    # Served as text to browsers and terminals: escapes written out, never sent raw.
    text = processes.visible_controls(data.decode("utf-8", errors="replace"))
    if cut:
        kept = settings.REPLAYS_MAX_LOG_BYTES
        return (
            f"[replays] The first {cut:,} bytes of this log are left out "
            f"(kept: the last {kept:,}).\n{text}"
        )
    return text
