"""OpenCode sessions read right from its database, its JSON storage of 0.6 to 1.1, the 0.5
layout and `opencode export` files; the database is only ever read.

Our own files (tests/fixtures/transcripts/edge/opencode_home) in the shapes real ones have;
OpenCode 1.18.33's own database and export are in real/opencode*.
"""

from __future__ import annotations

import shutil
import sqlite3
from decimal import Decimal
from pathlib import Path

import pytest

from replays import importing, pricing
from replays.transcripts import TranscriptError, opencode, parse_transcript
from replays.transcripts.base import TokenUsage
from tests.conftest import EDGE_TRANSCRIPTS, REAL_TRANSCRIPTS, importer, manifest_session

pytestmark = pytest.mark.django_db

HOME = EDGE_TRANSCRIPTS / "opencode_home"
PARENT = (
    HOME
    / "storage"
    / "session"
    / "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678"
    / "ses_2aa1parent0001.json"
)
OLD = HOME / "project" / "global" / "storage" / "session" / "info" / "ses_3bb0oldlayout01.json"
DATABASE = REAL_TRANSCRIPTS / "opencode" / "opencode.db"


def test_storage_sessions_read_their_requests_calls_and_sub_agents() -> None:
    thread = parse_transcript(PARENT)

    assert (thread.kind, thread.cwd, thread.cli_version) == ("opencode", "/home/ada/shop", "1.1.40")
    # OpenCode's own context (synthetic text) and a compaction are no requests.
    assert [turn.request for turn in thread.turns] == [
        "Add a total() to the basket",
        "Now round the total to cents",
    ]
    first, second = thread.turns
    assert first.request_as_sent.endswith("<system-reminder>Plan mode is off.</system-reminder>")
    # Two model calls (one step-finish each); the sub-agent's session, read with it, in the
    # turn its time falls in.
    assert first.usage_by_model == {
        "gpt-5-nano": TokenUsage(input_tokens=2000, output_tokens=120),  # reasoning is output
        "claude-sonnet-4-5": TokenUsage(
            input_tokens=10, output_tokens=300, cache_read_tokens=4000, cache_write_5m_tokens=2000
        ),
    }
    assert str(first.recorded_costs["claude-sonnet-4-5"].usd) == "0.0252"
    assert "gpt-5-nano" not in first.recorded_costs  # recorded 0: priced from the table
    assert [item["kind"] for item in first.evidence.items] == ["other", "edit", "patch"]
    assert first.final_answer == "Added Basket.total()."
    assert second.evidence.items[0] == {
        "kind": "read", "tool": "read", "path": "basket.py", "text": None, "match": "whole"
    }  # fmt: skip
    assert [p.message for p in thread.problems] == ["prt_005broken.json: not a JSON object"]


def test_the_0_5_layout_is_read_too() -> None:
    thread = parse_transcript(OLD)

    assert [turn.request for turn in thread.turns] == ["What does this repository do?"]
    assert thread.cwd == "/home/ada/old"  # 0.5 kept it on the assistant's message
    assert thread.turns[0].final_answer == "It prints text statistics."


def test_a_home_lists_each_session_once_a_sub_agent_with_its_parent() -> None:
    found = list(importing.find_transcript_files([HOME]))

    assert sorted(path.name for path in found) == [
        "ses_2aa1parent0001.json",
        "ses_3bb0oldlayout01.json",
    ]


def test_a_database_gives_one_path_per_session_and_is_never_written(tmp_path: Path) -> None:
    home = tmp_path / "opencode"
    shutil.copytree(DATABASE.parent, home)
    database = home / "opencode.db"
    database.chmod(0o444)
    home.chmod(0o555)  # read-only, as a copy from someone's home may be
    try:
        before = database.read_bytes()
        (path,) = importing.find_transcript_files([home])
        session = manifest_session("opencode-contributing")
        assert path == database / session["session_id"]
        thread = parse_transcript(path)
        assert [turn.request for turn in thread.turns] == [t["request"] for t in session["turns"]]
        assert database.read_bytes() == before
        assert sorted(p.name for p in home.iterdir()) == ["opencode.db"]  # no -wal, no -shm
    finally:
        home.chmod(0o755)


def test_the_database_session_reads_as_the_server_answered_with_opencodes_costs() -> None:
    session = manifest_session("opencode-contributing")
    thread = parse_transcript(REAL_TRANSCRIPTS / session["path"])

    assert (thread.session_id, thread.cwd, thread.cli_version) == (
        session["session_id"], session["cwd"], "1.18.33"
    )  # fmt: skip
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        usage = expected["usage"]
        assert turn.usage == TokenUsage(
            input_tokens=usage["input_tokens"],
            output_tokens=usage["output_tokens"],
            cache_read_tokens=usage["cache_read_tokens"],
            cache_write_5m_tokens=usage["cache_write_5m_tokens"],
        )
        assert set(turn.recorded_costs) == {"claude-sonnet-4-5"}
    assert [item["kind"] for item in thread.turns[0].evidence.items] == ["write", "shell"]


def test_an_export_file_reads_as_the_database_session_it_came_from() -> None:
    session = manifest_session("opencode-contributing")
    exported = parse_transcript(REAL_TRANSCRIPTS / session["export_path"])
    stored = parse_transcript(REAL_TRANSCRIPTS / session["path"])

    assert exported.session_id == stored.session_id
    assert [(t.request, t.usage, t.final_answer) for t in exported.turns] == [
        (t.request, t.usage, t.final_answer) for t in stored.turns
    ]


def test_an_uploaded_export_imports_with_opencodes_costs(tmp_path: Path) -> None:
    session = manifest_session("opencode-contributing")
    with (REAL_TRANSCRIPTS / session["export_path"]).open("rb") as upload:
        result = importing.import_uploaded_transcript(
            upload=upload, filename="export.json", user=importer()
        )

    assert result.outcome == "new", result.error
    thread = result.thread
    assert thread is not None and thread.get_source_kind_display() == "OpenCode"
    assert thread.cost_usd == pricing.round_usd(Decimal(repr(session["ccusage_cost_usd"])))


def test_a_session_gone_from_its_database_fails_saying_so(tmp_path: Path) -> None:
    database = tmp_path / "opencode.db"
    shutil.copy(DATABASE, database)
    with sqlite3.connect(database) as connection:
        connection.execute("PRAGMA foreign_keys = ON")
        connection.execute("DELETE FROM session")

    with pytest.raises(TranscriptError, match="no such session"):
        opencode.session_document(database / "ses_gone000000001", max_bytes=10**6)
    result = importing.import_transcript_file(path=database / "ses_gone000000001", user=importer())
    assert result.outcome == "failed" and "no such session" in result.error


def test_a_session_over_the_limit_is_refused_whole() -> None:
    with pytest.raises(TranscriptError, match="larger than"):
        opencode.session_document(PARENT, max_bytes=2000)


def test_a_changed_storage_session_is_imported_again(tmp_path: Path) -> None:
    # Its info file need not change when a message is added: the assembled session is
    # hashed every time, never skipped for the info file's size and time.
    home = tmp_path / "opencode"
    shutil.copytree(HOME, home)
    parent = home / PARENT.relative_to(HOME)
    first = importing.import_transcript_file(path=parent, user=importer())
    (home / "storage" / "part" / "msg_005user" / "prt_005broken.json").write_text(
        '{"id": "prt_005broken", "type": "text", "text": "and keep two decimals"}'
    )
    again = list(importing.import_files(paths=[parent], user=importer(), workers=1))

    assert first.outcome == "new" and [r.outcome for r in again] == ["updated"]
    assert again[0].thread is not None
    assert "and keep two decimals" in again[0].thread.turns.get(index=1).request
