"""Our per-session costs agree with ccusage (the npm package, run offline): within 1% for
Claude Code and Codex, to the micro-dollar for Gemini CLI, OpenCode and pi."""

from __future__ import annotations

import json
import os
import subprocess
from decimal import Decimal
from pathlib import Path

import pytest
from django.core.management import call_command

from replays import importing, pricing
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


# Gemini CLI, OpenCode and pi: ccusage's `<tool> session` on the same homes. Equal to the
# micro-dollar, and token for token: what ccusage counts beyond its four kinds (Gemini's
# thoughts, OpenCode's reasoning, the rest of pi's totalTokens) it prices as output, and we
# count it as output.
MORE_SOURCES = {
    "gemini": ("GEMINI_DATA_DIR", "gemini/tmp"),
    "opencode": ("OPENCODE_DATA_DIR", "opencode"),
    "pi": ("PI_AGENT_DIR", "pi/agent/sessions"),
}


@pytest.mark.parametrize("kind", sorted(MORE_SOURCES))
def test_gemini_opencode_and_pi_session_costs_match_ccusage(
    imported: None, tmp_path: Path, kind: str
) -> None:
    variable, folder = MORE_SOURCES[kind]
    report = ccusage(
        [kind, "session"], {variable: str(REAL_TRANSCRIPTS / folder), "HOME": str(tmp_path)}
    )
    assert report["sessions"], f"ccusage found no {kind} sessions"
    for row in report["sessions"]:
        thread = Thread.objects.get(source_kind=kind, session_id=row["sessionId"])
        assert thread.cost_usd == pricing.round_usd(Decimal(repr(row["totalCost"]))), row[
            "sessionId"
        ]
        beyond = row["totalTokens"] - sum(
            row[key]
            for key in ("inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens")
        )
        assert (thread.input_tokens, thread.cache_read_tokens, thread.output_tokens) == (
            row["inputTokens"], row["cacheReadTokens"], row["outputTokens"] + beyond
        )  # fmt: skip
        assert (
            thread.cache_write_5m_tokens + thread.cache_write_1h_tokens
            == row["cacheCreationTokens"]
        )


def test_opencode_and_pi_costs_are_the_tools_own_figures(imported: None) -> None:
    # Both record what each request cost: that figure is the thread's, shown as such, and
    # re-pricing from the table leaves it alone.
    for kind in ("opencode", "pi"):
        thread = Thread.objects.get(source_kind=kind)
        assert set(thread.priced_as.values()) == {pricing.RECORDED_ENTRY}, kind
        turn = thread.turns.order_by("index").first()
        assert turn is not None and turn.recorded_costs
        recorded = sum(Decimal(entry["usd"]) for entry in turn.recorded_costs.values())
        assert turn.cost_usd == pricing.round_usd(recorded)
    before = {t.pk: t.cost_usd for t in Thread.objects.filter(source_kind__in=["opencode", "pi"])}
    importing.recompute_costs()
    after = {t.pk: t.cost_usd for t in Thread.objects.filter(source_kind__in=["opencode", "pi"])}
    assert after == before
