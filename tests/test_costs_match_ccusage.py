"""Our per-session costs agree with ccusage (the npm package, run offline) within 1%."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from django.core.management import call_command

from replays.models import Thread
from tests.conftest import NODE_BIN, REAL_TRANSCRIPTS, importer, require_tool

pytestmark = [pytest.mark.django_db, pytest.mark.cli]


def ccusage(args: list[str], env: dict[str, str]) -> dict:
    binary = require_tool(NODE_BIN / "ccusage", "make node")
    completed = subprocess.run(
        [str(binary), *args, "--json", "--offline"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(completed.stdout)


@pytest.fixture
def imported() -> None:
    call_command(
        "import_threads",
        "--user",
        importer().username,
        str(REAL_TRANSCRIPTS),
        stdout=open(os.devnull, "w"),
    )


def test_claude_code_session_costs_match_ccusage(imported: None, tmp_path: Path) -> None:
    report = ccusage(
        ["session"], {"CLAUDE_CONFIG_DIR": str(REAL_TRANSCRIPTS / "claude"), "HOME": str(tmp_path)}
    )
    sessions = {row["period"]: row for row in report["session"]}
    assert sessions, "ccusage found no Claude Code sessions"
    for session_id, row in sessions.items():
        thread = Thread.objects.get(source_kind="claude_code", session_id=session_id)
        assert thread.cost_usd is not None
        assert float(thread.cost_usd) == pytest.approx(row["totalCost"], rel=0.01), session_id


def test_codex_session_costs_match_ccusage(imported: None, tmp_path: Path) -> None:
    report = ccusage(
        ["codex", "session"], {"CODEX_HOME": str(REAL_TRANSCRIPTS / "codex"), "HOME": str(tmp_path)}
    )
    assert report["sessions"], "ccusage found no Codex sessions"
    for row in report["sessions"]:
        thread = Thread.objects.get(
            source_kind="codex", source_path__endswith=row["sessionFile"] + ".jsonl"
        )
        assert thread.cost_usd is not None
        assert float(thread.cost_usd) == pytest.approx(row["costUSD"], rel=0.01), row["sessionFile"]
        assert thread.cache_read_tokens == row["cacheReadTokens"]
        assert thread.input_tokens == row["inputTokens"]
        assert thread.output_tokens == row["outputTokens"]
