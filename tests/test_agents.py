"""Agent discovery, model resolution and the command adapter, in process."""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from replays import agents
from replays.agents.base import RunContext, plain_text, read_tail
from replays.agents.baselines import EmptyAgent, HistoricalAgent
from replays.agents.command import CommandAgent, read_usage_file
from replays.runspec import RunSpec
from replays.transcripts.base import TokenUsage

PYTHON = sys.executable


def command_agent(models: list[Any], **extra: Any) -> dict[str, Any]:
    return {
        "kind": "command",
        "command": [PYTHON, "agent.py", "{model}"],
        "models": models,
        **extra,
    }


def ids() -> list[str]:
    return [info.id for info in agents.discover_models()]


def test_baselines_come_first_then_agents_in_settings_order(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {
        "zed": command_agent(["b-model", "a-model"], label="Zed"),
        "aider": command_agent(["gpt-5"], label="Aider"),
    }
    models = agents.discover_models()
    assert [info.id for info in models] == [
        "historical",
        "empty",
        "zed:b-model",
        "zed:a-model",
        "aider:gpt-5",
    ]
    assert models[0].is_baseline and models[1].is_baseline
    assert all(info.available for info in models)
    aider = models[-1]
    assert (aider.agent, aider.model, aider.label) == ("aider", "gpt-5", "Aider gpt-5")


def test_duplicate_models_keep_their_first_place_and_the_last_label(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {
        "aider": command_agent(
            ["gpt-5", "o3", {"id": "gpt-5", "label": "GPT-5 via Aider"}], label="Aider"
        ),
    }
    models = agents.discover_models()
    assert [info.id for info in models] == ["historical", "empty", "aider:gpt-5", "aider:o3"]
    assert models[2].label == "GPT-5 via Aider"


def test_blank_and_malformed_entries_are_ignored(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {
        "": command_agent(["blank-name"]),
        "has space": command_agent(["spaced-name"]),
        "baseline": command_agent(["reserved"]),
        "not-an-object": ["aider"],
        "no-kind": {"command": [PYTHON], "models": ["x"]},
        "unknown-kind": {"kind": "teleport", "command": [PYTHON], "models": ["x"]},
        "no-command": {"kind": "command", "models": ["x"]},
        "empty-command": {"kind": "command", "command": [], "models": ["x"]},
        "shell-string": {"kind": "command", "command": "aider --yes", "models": ["x"]},
        "bad-env": command_agent(["x"], env={"KEY": 1}),
        "models-not-list": command_agent("gpt-5"),  # type: ignore[arg-type]
        "good": command_agent(
            ["", "   ", None, 42, {"label": "no id"}, {"id": ""}, "two words", "ok"]
        ),
    }
    assert ids() == ["historical", "empty", "good:ok"]


def test_an_agent_whose_program_is_missing_is_listed_as_unavailable(
    settings: Any, tmp_path: Path
) -> None:
    not_executable = tmp_path / "agent.sh"
    not_executable.write_text("#!/bin/sh\n")
    not_executable.chmod(0o644)
    settings.REPLAYS_AGENTS = {
        "ghost": {"kind": "command", "command": ["replays-no-such-agent-cli"], "models": ["m"]},
        "gone": {"kind": "command", "command": [str(tmp_path / "missing")], "models": ["m"]},
        "locked": {"kind": "command", "command": [str(not_executable)], "models": ["m"]},
        "python": command_agent(["m"]),
    }
    by_id = {info.id: info for info in agents.discover_models()}
    assert not by_id["ghost:m"].available
    assert by_id["ghost:m"].reason == "'replays-no-such-agent-cli' was not found on PATH."
    assert by_id["gone:m"].reason == f"{tmp_path / 'missing'} does not exist."
    assert by_id["locked:m"].reason == f"{not_executable} is not executable."
    assert by_id["python:m"].available and by_id["python:m"].reason == ""


def test_a_bare_model_name_resolves_when_exactly_one_agent_offers_it(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {
        "aider": command_agent(["gpt-5", "o3"]),
        "other": command_agent(["o3"]),
    }
    assert agents.resolve_model("gpt-5").id == "aider:gpt-5"
    assert agents.resolve_model("other:o3").id == "other:o3"
    assert agents.resolve_model("historical").is_baseline
    with pytest.raises(agents.UnknownModel, match="offered by several agents"):
        agents.resolve_model("o3")


def test_an_unknown_model_names_the_known_ones(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {"aider": command_agent(["gpt-5"])}
    with pytest.raises(agents.UnknownModel) as raised:
        agents.resolve_model("x")
    assert str(raised.value) == "Unknown model 'x'. Known: historical, empty, aider:gpt-5"
    assert isinstance(raised.value, ValueError)


def test_adapter_for_gives_the_baselines_and_command_agents(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {"aider": command_agent(["gpt-5"])}
    assert isinstance(agents.adapter_for("historical"), HistoricalAgent)
    assert isinstance(agents.adapter_for("empty"), EmptyAgent)
    adapter = agents.adapter_for("gpt-5")
    assert isinstance(adapter, CommandAgent)
    assert (adapter.name, adapter.model) == ("aider", "gpt-5")


def context(tmp_path: Path) -> RunContext:
    return RunContext(
        run_id=7,
        model="gpt-5",
        spec=RunSpec(),
        run_dir=tmp_path / "run-7",
        workspace=tmp_path / "run-7" / "workspace",
        request_file=tmp_path / "run-7" / "request.md",
        log_path=tmp_path / "run-7" / "agent.log",
    )


def test_command_placeholders_are_replaced_inside_each_argument(tmp_path: Path) -> None:
    agent = CommandAgent(
        name="aider",
        model="gpt-5",
        command=[
            "aider",
            "--model={model}",
            "--message-file",
            "{request_file}",
            "{workspace}",
            "--out",
            "{run_dir}/out.txt",
            "{not_a_placeholder}",
            "{model",
        ],
        env={"AIDER_HOME": "{run_dir}/home", "PLAIN": "{x}"},
    )
    run = context(tmp_path)
    invocation = agent.invocation(run)
    assert invocation.argv == [
        "aider",
        "--model=gpt-5",
        "--message-file",
        str(run.request_file),
        str(run.workspace),
        "--out",
        f"{run.run_dir}/out.txt",
        "{not_a_placeholder}",
        "{model",
    ]
    assert invocation.env == {
        "AIDER_HOME": f"{run.run_dir}/home",
        "PLAIN": "{x}",
        "REPLAYS_USAGE_FILE": str(run.run_dir / "usage.json"),
        "REPLAYS_TURN": "1",
        "REPLAYS_TURNS": "1",
    }
    assert invocation.stdin_path is None


def test_usage_file_cost_comes_from_the_price_table_when_not_reported(tmp_path: Path) -> None:
    usage_file = tmp_path / "usage.json"
    usage_file.write_text(
        json.dumps(
            {
                "input_tokens": 1000,
                "output_tokens": 200,
                "cache_read_tokens": 500,
                "model_seconds": 2.5,
            }
        )
    )
    outcome = read_usage_file(usage_file, model="gpt-5")
    assert outcome.usage == TokenUsage(input_tokens=1000, output_tokens=200, cache_read_tokens=500)
    # gpt-5: 1.25 in, 0.125 cached, 10 out per million tokens.
    assert outcome.cost_usd == Decimal("0.0033125")
    assert outcome.model_seconds == 2.5
    assert outcome.notes == []


def test_usage_file_reported_cost_wins_and_unknown_models_cost_nothing_known(
    tmp_path: Path,
) -> None:
    usage_file = tmp_path / "usage.json"
    usage_file.write_text(json.dumps({"output_tokens": 10, "cost_usd": 0.42}))
    assert read_usage_file(usage_file, model="gpt-5").cost_usd == Decimal("0.42")
    usage_file.write_text(json.dumps({"output_tokens": 10, "model": "no-such-model-anywhere"}))
    assert read_usage_file(usage_file, model="gpt-5").cost_usd is None
    assert read_usage_file(tmp_path / "absent.json", model="gpt-5").cost_usd is None


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[1, 2]",
        '{"input_tokens": -5}',
        '{"input_tokens": "many"}',
        '{"cost_usd": "free"}',
        '{"model_seconds": true}',
        '{"model": 5}',
    ],
)
def test_a_malformed_usage_file_is_ignored_with_a_note(tmp_path: Path, content: str) -> None:
    usage_file = tmp_path / "usage.json"
    usage_file.write_text(content)
    outcome = read_usage_file(usage_file, model="gpt-5")
    assert outcome.usage == TokenUsage() and outcome.cost_usd is None
    assert len(outcome.notes) == 1 and "usage.json was ignored" in outcome.notes[0]


def test_log_text_keeps_markup_but_drops_control_characters(tmp_path: Path) -> None:
    assert plain_text("\x1b[31mred\x1b[0m <b>bold</b>\x00 & done\r\n") == "red <b>bold</b> & done\n"
    log = tmp_path / "agent.log"
    log.write_bytes(b"".join(b"line %d\n" % number for number in range(500)) + b"\xff<i>\n")
    tail = read_tail(log, max_lines=3)
    assert tail.split("\n") == ["line 499", "\ufffd<i>", ""]
    small = read_tail(log, max_bytes=30)
    assert small.startswith("line 49") and "\n" in small
    assert read_tail(tmp_path / "missing.log") == ""


def test_the_agent_environment_hides_our_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    from replays.runfolder import agent_environment

    monkeypatch.setenv("DATABASE_URL", "postgres://secret")
    monkeypatch.setenv("SECRET_KEY", "secret")
    monkeypatch.setenv("REPLAYS_TEST_PAUSE_AT", "coordinator_agent_running")
    env = agent_environment({"EXTRA": "1"}, run_id=12)
    assert env["REPLAYS_RUN_ID"] == "12" and env["EXTRA"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    assert not {"DATABASE_URL", "SECRET_KEY", "REPLAYS_TEST_PAUSE_AT"} & set(env)


def test_durations_read_like_a_clock() -> None:
    from replays.coordinator.member import duration as _duration

    assert _duration(1200) == "20m 0s"
    assert _duration(45) == "45s"
    assert _duration(3900) == "1h 5m 0s"
