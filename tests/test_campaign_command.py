"""`manage.py campaign` end to end with real processes: a history of several repositories
imported as Claude Code sessions, prepared, approved, run and judged by tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from replays.models import Campaign, CampaignStatus, Run, RunStatus
from tests.campaign_fixtures import build_history

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def campaign(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "campaign", *args],
        env=env, text=True, capture_output=True, timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture
def campaign_env(process_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {
        **process_env,
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
    }


def test_the_calibration_baselines_judged_by_tests_across_a_campaign(
    campaign_env: dict[str, str], tmp_path: Path, user
) -> None:
    history = build_history(tmp_path / "work", user)
    done = campaign(
        campaign_env, "--last", "5", "--model", "historical", "--model", "empty",
        "--evaluator", "tests", "--user", "alice", "--yes", "--wait",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    print(done.stdout)
    found = Campaign.objects.get()
    assert found.status == CampaignStatus.FINISHED
    # The test command is the one the historical agent ran in calc.
    origin = found.test_commands[str(history.calc)]["origin"]
    assert "pytest" in origin["typed"]
    rows = {row["model"]: row for row in found.results["models"]}
    assert rows["historical"]["losses"] == 0
    assert rows["empty"]["wins"] + rows["empty"]["ties"] == 0
    assert found.results["calibration"]["trusted"] is True
