"""`manage.py campaign` end to end with real processes: a history of several repositories
imported as Claude Code sessions, prepared, approved, run and judged by tests."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from replays import budgets
from replays.models import Campaign, CampaignStatus, FailureCode, Run, RunStatus
from tests.campaign_fixtures import build_history

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
AGENT_SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"


def campaign(
    env: dict[str, str], *args: str, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
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


def test_a_budget_holds_against_an_agent_that_reports_its_cost(
    campaign_env: dict[str, str], tmp_path: Path, user
) -> None:
    """Budget $0.90, one member at a time, each agent reporting $0.60 at once and then
    working for 3 s: the first completes ($0.60); the second starts with $0.30 left (its
    estimate fits), passes its cap and is stopped (budget_exhausted, $0.60 spent); the
    third never starts (budget_exhausted). Spent $1.20: past the budget by one run's
    overshoot past its cap, never more; neither failure counts against the model."""
    build_history(tmp_path / "work", user)
    agents = tmp_path / "agents.json"
    agents.write_text(json.dumps({"spender": {
        "kind": "command", "models": ["claude-sonnet-4-5"],
        "command": [sys.executable, str(AGENT_SCRIPTS / "spend.py"), "0.60", "3"],
    }}))  # fmt: skip
    env = {**campaign_env, "REPLAYS_AGENTS_FILE": str(agents), "REPLAYS_MAX_PARALLEL_RUNS": "1"}
    done = campaign(
        env, "--last", "3", "--model", "spender:claude-sonnet-4-5", "--evaluator", "tests",
        "--budget", "0.90", "--user", "alice", "--yes", "--wait",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = Campaign.objects.get()
    runs = list(Run.objects.order_by("created_at", "id"))
    assert [(run.status, run.failure_code) for run in runs] == [
        (RunStatus.COMPLETED, ""),
        (RunStatus.FAILED, FailureCode.BUDGET_EXHAUSTED),
        (RunStatus.FAILED, FailureCode.BUDGET_EXHAUSTED),
    ], [run.failure_message for run in runs]
    first, stopped, never = runs
    assert first.cost_cap_usd == Decimal("0.90")
    assert stopped.cost_cap_usd == Decimal("0.30")
    assert "cost cap" in stopped.failure_message and stopped.cost_usd == Decimal("0.60")
    assert never.started_at is None and never.cost_usd is None
    money = budgets.money_of(found)
    assert money.spent == Decimal("1.20")
    assert money.spent - found.budget_usd <= stopped.cost_usd - stopped.cost_cap_usd
    row = found.results["models"][0]
    assert (row["n"], row["failed"]) == (1, 0)
    assert row["not_counted_reasons"] == {"budget exhausted": 2}
    assert "Spent $1.20 of a $0.9000 budget" in done.stdout


@pytest.mark.cli
def test_a_campaign_with_the_real_codex_and_claude_within_a_budget(
    campaign_env: dict[str, str], tmp_path: Path, user
) -> None:
    """The issue's own command, with the real CLIs against scripted servers: codex writes
    what each request asked for, claude writes a note; judged by the tests the historical
    agent ran, with the calibration baselines, within the budget."""
    from tests.fakes import anthropic_server, openai_server
    from tests.fakes.anthropic_server import AnthropicServer
    from tests.fakes.openai_server import OpenAIServer
    from tests.fakes.scripting import Text, Usage, shell
    from tests.test_replay_real_agents import agents_file

    build_history(tmp_path / "work", user)
    usage = Usage(input_tokens=3000, output_tokens=200)
    codex_script = openai_server.by_prompt({
        f"Add a {name} function": [
            shell(f"printf '\\n\\ndef {name}({arguments}):\\n    return {body}\\n' >> calc/ops.py",
                  usage=usage),
            Text("Done.", usage=usage),
        ]
        for name, arguments, body in (("neg", "a", "-a"), ("mul", "a, b", "a * b"))
    })  # fmt: skip
    claude_script = anthropic_server.by_prompt({
        f"Add a {name} function": [shell("echo 'a note' > NOTE.txt", usage=usage),
                                   Text("Done.", usage)]
        for name in ("neg", "mul")
    })  # fmt: skip
    with OpenAIServer(codex_script) as openai, AnthropicServer(claude_script) as anthropic:
        (tmp_path / "home").mkdir()
        env = {
            **campaign_env,
            "HOME": str(tmp_path / "home"),
            "REPLAYS_AGENTS_FILE": str(agents_file(tmp_path / "agents.json", openai, anthropic)),
        }
        done = campaign(
            env, "--last", "2", "--model", "codex:gpt-5.5", "--model", "claude:claude-sonnet-4-5",
            "--model", "historical", "--model", "empty", "--evaluator", "tests",
            "--budget", "10", "--user", "alice", "--yes", "--wait",
        )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    found = Campaign.objects.get()
    assert found.status == CampaignStatus.FINISHED
    rows = {row["model"]: row for row in found.results["models"]}
    assert (rows["codex:gpt-5.5"]["n"], rows["codex:gpt-5.5"]["losses"]) == (2, 0)
    assert (rows["claude:claude-sonnet-4-5"]["n"], rows["claude:claude-sonnet-4-5"]["losses"]) == (
        2,
        2,
    )
    assert found.results["calibration"]["trusted"] is True
    pair = next(p for p in found.results["head_to_head"]
                if {p["a"], p["b"]} == {"codex:gpt-5.5", "claude:claude-sonnet-4-5"})  # fmt: skip
    assert pair["n"] == 2
    money = budgets.money_of(found)
    assert Decimal(0) < money.spent <= found.budget_usd
    for model in ("codex:gpt-5.5", "claude:claude-sonnet-4-5", "historical", "empty"):
        assert model in done.stdout
    assert "Head to head" in done.stdout and "Calibration" in done.stdout
