"""Other people's real sessions (../shared/realdata, never copied here) read right, and agree
with ccusage on every session but the ones tests/realdata.py explains (docs/realdata.md).

Skipped, with the reason, on a machine without that folder; `python tests/realdata.py`
prints the same comparison by hand.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from replays import importing, pricing
from replays.models import Thread, Turn
from tests import realdata
from tests.conftest import NODE_BIN, importer, require_tool

pytestmark = [pytest.mark.django_db, pytest.mark.cli]


@pytest.fixture
def folder() -> Path:
    if not realdata.REALDATA.is_dir():
        pytest.skip(
            f"{realdata.REALDATA} is not there: this cross-check reads other people's real "
            "sessions, which are not part of the repository (docs/realdata.md)"
        )
    require_tool(NODE_BIN / "ccusage", "make node")
    return realdata.REALDATA


def claude_files(root: Path) -> Iterator[Path]:
    return (p for p in realdata.transcript_files(root) if "claude" in p.relative_to(root).parts[0])


def lines_of(path: Path) -> list[dict[str, Any]]:
    values = []
    for raw in path.read_bytes().splitlines():
        try:
            value = json.loads(raw)
        except ValueError:
            continue
        if isinstance(value, dict):
            values.append(value)
    return values


def user_text(line: dict[str, Any]) -> str:
    content = (
        line.get("message", {}).get("content") if isinstance(line.get("message"), dict) else None
    )
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def typed_commands(path: Path) -> int:
    """Commands that went to the model: a command line not answered by Claude Code's own
    output (counted from the raw lines, apart from the parser)."""
    users = [line for line in lines_of(path) if line.get("type") == "user"]
    count = 0
    for position, line in enumerate(users):
        if "<command-name>" not in user_text(line) or line.get("isMeta"):
            continue
        following = users[position + 1] if position + 1 < len(users) else {}
        if not user_text(following).lstrip().startswith("<local-command-std"):
            count += 1
    return count


def usage_in_file(path: Path) -> int:
    """Every token the file and its sub-agent files record, each response counted once with
    its final figures (counted from the raw lines, apart from the parser)."""
    files = [path, *sorted((path.parent / path.stem / "subagents").glob("*.jsonl"))]
    responses: dict[Any, dict[str, Any]] = {}
    for file in files:
        for number, line in enumerate(lines_of(file)):
            message = line.get("message")
            if line.get("type") != "assistant" or not isinstance(message, dict):
                continue
            usage = message.get("usage")
            if not isinstance(usage, dict) or message.get("model") == "<synthetic>":
                continue
            key = (
                (message["id"], line.get("requestId") or "")
                if message.get("id")
                else (file, number)
            )
            known = responses.get(key)
            if known is None or (usage.get("output_tokens") or 0) >= (
                known.get("output_tokens") or 0
            ):
                responses[key] = usage
    return sum(map(tokens_of, responses.values()))


def tokens_of(usage: dict[str, Any]) -> int:
    total = sum(usage.get(kind) or 0 for kind in ("input_tokens", "output_tokens",
                                                  "cache_read_input_tokens"))  # fmt: skip
    written = usage.get("cache_creation_input_tokens") or 0
    split = usage.get("cache_creation")
    if isinstance(split, dict):
        # The split by lifetime, when given (one real line says 0 in all and 2505 for 1h:
        # ccusage counts the split too).
        parts = sum(
            split.get(k) or 0 for k in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
        )
        written = max(written, parts)
    return total + written


def test_real_sessions_import_read_right_and_agree_with_ccusage(
    folder: Path, tmp_path: Path
) -> None:
    user = importer()
    outcome = realdata.cross_check(folder, user)
    print("\n".join(realdata.report(outcome)))  # the comparison, in the test's output

    # Every transcript imports; every file that is not one is refused, saying why.
    assert outcome.failed == []
    assert outcome.imported == len(realdata.transcript_files(folder))
    assert outcome.accepted_others == []
    assert outcome.refused and all(
        "is not UTF-8 text" in line
        or "is not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi" in line
        for line in outcome.refused
    )

    # ccusage agrees on every session but the explained ones, and each of those still
    # differs (an explanation that no longer applies must go).
    unexplained = [row for row in outcome.rows if row.differences and not row.known]
    assert unexplained == [], [(row.short, row.differences) for row in unexplained]
    stale = [row.short for row in outcome.rows if row.known and not row.differences]
    assert stale == []
    assert len(outcome.rows) == outcome.imported

    threads = Thread.objects.filter(owner=user)
    turns = Turn.objects.filter(thread__owner=user)
    # No background-task notification is a turn; no title or request carries an IDE block.
    assert not turns.filter(request__startswith="<task-notification>").exists()
    for text in [
        *threads.values_list("title", flat=True),
        *turns.values_list("request", flat=True),
    ]:
        assert not re.search(r"<(ide_[a-z_]+|system-reminder)>", text), text[:80]
    for path in claude_files(folder):
        thread = threads.get(source_path=str(path))
        # Every typed command is a turn, as typed.
        commands = thread.turns.filter(request__startswith="/").count()
        assert commands == typed_commands(path), path.name
        # No usage is lost: the thread holds every response's final figures.
        assert thread.total_tokens == usage_in_file(path), path.name

    # Re-importing changes nothing.
    again = list(importing.import_files(paths=realdata.transcript_files(folder), user=user))
    assert {result.outcome for result in again} == {"unchanged"}


def test_the_file_ccusage_cannot_read_gives_our_figures_once_written_compactly(
    folder: Path, tmp_path: Path
) -> None:
    # The explanation of 88a8d761 in tests/realdata.py, checked: the same lines, written
    # compactly as Claude Code writes them, and ccusage finds what we find.
    (source,) = (folder / "claude" / "projects").glob("*/88a8d761-*.jsonl")
    compact = tmp_path / "claude" / "projects" / source.parent.name / source.name
    compact.parent.mkdir(parents=True)
    compact.write_text(
        "".join(
            json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n"
            for line in lines_of(source)
        )  # fmt: skip
    )
    result = importing.import_transcript_file(path=source, user=importer())
    assert result.thread is not None

    theirs = realdata.ccusage_figures(tmp_path)[("claude_code", result.thread.session_id)]

    assert theirs.tokens == realdata.our_figures(result.thread).tokens
    assert abs(theirs.cost - result.thread.cost_usd) <= realdata.COST_TOLERANCE


def test_a_grown_real_file_is_updated_in_place(folder: Path, tmp_path: Path) -> None:
    (older,) = (folder / "extra" / "grown-file").glob("*.jsonl")
    newer = next((folder / "claude" / "projects").glob(f"*/{older.name.split('.')[0]}.jsonl"))
    path = tmp_path / newer.name
    shutil.copy(older, path)
    first = importing.import_transcript_file(path=path, user=importer())
    shutil.copy(newer, path)

    grown = importing.import_transcript_file(path=path, user=importer())

    assert (first.outcome, grown.outcome) == ("new", "updated")
    assert grown.thread is not None and first.thread is not None
    assert grown.thread.pk == first.thread.pk
    fresh = importing.prepare_file(newer, max_bytes=importing.max_transcript_bytes())
    assert grown.thread.turn_count == len(fresh.turn_rows) > first.turns
    stored = Thread.objects.get(pk=grown.thread.pk)
    assert stored.cost_usd == pricing.round_usd(fresh.totals["cost_usd"])  # as a fresh import
    assert grown.thread.total_tokens == sum(
        fresh.totals[name] for name in ("input_tokens", "output_tokens", "cache_read_tokens",
                                        "cache_write_5m_tokens", "cache_write_1h_tokens")
    )  # fmt: skip


@pytest.fixture
def more(folder: Path) -> Path:
    found = folder / "more"
    if not found.is_dir():
        pytest.skip(
            f"{found} is not there (Gemini CLI, OpenCode and pi sessions, docs/realdata.md)"
        )
    return found


def test_gemini_opencode_and_pi_sessions_import_and_agree_with_ccusage(more: Path) -> None:
    user = importer()
    outcome = realdata.cross_check_more(more, user)
    print("\n".join(realdata.report(outcome)))

    # Every session of the three homes imports (a prompt log and sub-agents' own files are
    # not sessions of their own), none with a skipped line.
    assert outcome.failed == []
    assert outcome.imported == len(realdata.more_files(more)) == 42
    assert "0 lines skipped" in outcome.summary
    assert set(Thread.objects.filter(owner=user).values_list("source_kind", flat=True)) == {
        "gemini", "opencode", "pi"
    }  # fmt: skip

    unexplained = [row for row in outcome.rows if row.differences and not row.known]
    assert unexplained == [], [(row.short, row.differences) for row in unexplained]
    stale = [row.short for row in outcome.rows if row.known and not row.differences]
    assert stale == []
    agreeing = [row for row in outcome.rows if row.theirs is not None and row.agrees]
    assert len(agreeing) == 27

    # What ccusage does not check: OpenCode's and pi's own costs are kept as theirs, and the
    # Gemini CLI session continued in a second file is two threads of one session.
    threads = Thread.objects.filter(owner=user)
    for thread in threads.filter(source_kind="pi"):
        assert set(thread.priced_as.values()) <= {pricing.RECORDED_ENTRY}, thread.session_id
    assert threads.filter(source_kind="gemini", session_id__startswith="b0c89930").count() == 2

    # Re-importing changes nothing.
    again = list(importing.import_files(paths=realdata.more_files(more), user=user))
    assert {result.outcome for result in again} == {"unchanged"}
