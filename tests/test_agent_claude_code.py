"""The claude_code agent kind: parsing Claude Code's stream-json, and real runs of the
real `claude` binary (2.1.197) against the scripted Anthropic server on loopback.

The recorded lines below are trimmed copies of what that binary wrote against the
fake server (only fields the adapter does not read were dropped).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.utils import timezone

from replays import agents, pricing, repos
from replays.agents.base import AgentSetupError, RunContext
from replays.agents.claude_code import ClaudeCodeAgent, render_events
from replays.evaluation import leaderboard
from replays.models import FailureCode, FailureOwner, Run, RunStatus
from replays.runspec import RunSpec
from replays.transcripts.base import TokenUsage
from tests.conftest import NODE_BIN, REAL_TRANSCRIPTS, manifest_session, require_tool
from tests.fakes import anthropic_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.scripting import Hang, HttpError, Text, ToolCall, Usage, shell

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
MODEL_ID = "claude:claude-sonnet-4-5"
SESSION = "b108da75-e3a3-4cca-b066-597d5009ce5a"
CWD = "/tmp/ccexp/work"


# --- recorded stream-json lines --------------------------------------------------------


def line(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


INIT = {
    "type": "system",
    "subtype": "init",
    "cwd": CWD,
    "session_id": SESSION,
    "tools": ["Task", "Bash", "Edit", "Read", "Write"],
    "mcp_servers": [],
    "model": "claude-sonnet-4-5",
    "permissionMode": "acceptEdits",
    "apiKeySource": "ANTHROPIC_API_KEY",
    "claude_code_version": "2.1.197",
    "uuid": "ec0579e3-8643-4f5e-83e9-a03b60ba7dc0",
}


def assistant(*content: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "type": "assistant",
        "message": {
            "id": "msg_fake_559c91344ba345b69192c291",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": list(content),
            "stop_reason": None,
            "usage": {"input_tokens": 11, "output_tokens": 1, "cache_read_input_tokens": 100},
        },
        "parent_tool_use_id": None,
        "session_id": SESSION,
        "request_id": "req_fake_28c7852171be4471ac242781",
        **extra,
    }


def tool_use(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_fake_d47f", "name": name, "input": arguments}


def tool_result(content: Any, *, is_error: bool = False) -> dict[str, Any]:
    return {
        "type": "user",
        "message": {
            "role": "user",
            "content": [
                {
                    "tool_use_id": "toolu_fake_d47f",
                    "type": "tool_result",
                    "content": content,
                    "is_error": is_error,
                }
            ],
        },
        "parent_tool_use_id": None,
        "session_id": SESSION,
    }


RESULT_SUCCESS = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "api_error_status": None,
    "duration_ms": 405,
    "duration_api_ms": 122,
    "num_turns": 3,
    "result": "All done.",
    "stop_reason": "end_turn",
    "session_id": SESSION,
    "total_cost_usd": 0.000621,
    "usage": {
        "input_tokens": 41,
        "cache_creation_input_tokens": 23,
        "cache_read_input_tokens": 300,
        "output_tokens": 21,
        "server_tool_use": {"web_search_requests": 0, "web_fetch_requests": 0},
        "service_tier": "standard",
        "cache_creation": {"ephemeral_1h_input_tokens": 3, "ephemeral_5m_input_tokens": 20},
    },
    "modelUsage": {
        "claude-sonnet-4-5": {
            "inputTokens": 41,
            "outputTokens": 21,
            "cacheReadInputTokens": 300,
            "cacheCreationInputTokens": 23,
            "costUSD": 0.000621,
        }
    },
    "permission_denials": [],
    "terminal_reason": "completed",
}

# A 400 from the API: is_error true although the subtype says success.
RESULT_API_ERROR = {
    "type": "result",
    "subtype": "success",
    "is_error": True,
    "api_error_status": 400,
    "duration_ms": 168,
    "duration_api_ms": 0,
    "num_turns": 1,
    "result": "API Error: 400 messages.0.content: bad block type",
    "stop_reason": "stop_sequence",
    "session_id": SESSION,
    "total_cost_usd": 0,
    "usage": {
        "input_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 0,
        "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
    },
    "modelUsage": {},
    "permission_denials": [],
    "terminal_reason": "completed",
}

RESULT_MAX_TURNS = {
    "type": "result",
    "subtype": "error_max_turns",
    "duration_ms": 213,
    "duration_api_ms": 57,
    "is_error": True,
    "num_turns": 3,
    "stop_reason": "tool_use",
    "session_id": SESSION,
    "total_cost_usd": 0.0012000000000000001,
    "usage": {
        "input_tokens": 200,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
        "output_tokens": 40,
    },
    "modelUsage": {
        "claude-sonnet-4-5": {
            "inputTokens": 200,
            "outputTokens": 40,
            "cacheReadInputTokens": 0,
            "cacheCreationInputTokens": 0,
            "costUSD": 0.0012000000000000001,
        }
    },
    "permission_denials": [],
    "terminal_reason": "max_turns",
    "errors": ["Reached maximum number of turns (2)"],
}

API_RETRY = {
    "type": "system",
    "subtype": "api_retry",
    "attempt": 2,
    "max_retries": 10,
    "retry_delay_ms": 1012.4789094672922,
    "error_status": 401,
    "error": "authentication_failed",
    "session_id": SESSION,
}

SUCCESSFUL_STREAM = [
    line(INIT),
    line(assistant(tool_use("Write", file_path=f"{CWD}/b.txt", content="written\n"))),
    line(tool_result(f"File created successfully at: {CWD}/b.txt")),
    "npm WARN something on stderr",
    line(assistant(tool_use("Bash", command="pytest -q", description="Run the tests"))),
    line(tool_result("....\n4 passed in 0.01s\nline 3\nline 4\nline 5\nline 6\nline 7")),
    line(assistant(tool_use("Edit", file_path=f"{CWD}/textstats/core.py", old_string="a"))),
    line(tool_result("The file has been updated.")),
    line(assistant({"type": "text", "text": "All done."})),
    line(RESULT_SUCCESS),
]


def context_for(
    tmp_path: Path, log_lines: list[str], model: str = "claude-sonnet-4-5"
) -> RunContext:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    log = run_dir / "agent.log"
    log.write_text("\n".join(log_lines) + "\n")
    request = run_dir / "request.md"
    request.write_text("Add a line_count function.\n")
    return RunContext(
        run_id=1,
        model=model,
        spec=RunSpec(),
        run_dir=run_dir,
        workspace=run_dir / "workspace",
        request_file=request,
        log_path=log,
    )


def adapter(**entry: Any) -> ClaudeCodeAgent:
    return ClaudeCodeAgent.from_entry(
        "claude",
        {"kind": "claude_code", "models": ["claude-sonnet-4-5"], **entry},
        "claude-sonnet-4-5",
    )


# --- render_log ------------------------------------------------------------------------


def test_render_log_turns_the_stream_into_readable_lines() -> None:
    rendered = render_events("\n".join(SUCCESSFUL_STREAM) + "\n")
    assert rendered.split("\n") == [
        "Claude Code 2.1.197 started: model claude-sonnet-4-5, permission mode acceptEdits",
        "Write b.txt",
        f"tool result: File created successfully at: {CWD}/b.txt",
        "npm WARN something on stderr",
        "Bash: pytest -q",
        "tool result: ....",
        "  4 passed in 0.01s",
        "  line 3",
        "  line 4",
        "  line 5",
        "  … 2 more lines",
        "Edit textstats/core.py",
        "tool result: The file has been updated.",
        "assistant: All done.",
        "result: success, 3 turns, $0.000621",
    ]


def test_render_log_shows_errors_retries_and_the_failed_result() -> None:
    stream = [
        line(INIT),
        line(API_RETRY),
        line(assistant(tool_use("Bash", command="python3 x.py"))),
        line(tool_result("This command requires approval", is_error=True)),
        line(RESULT_MAX_TURNS),
        line(RESULT_API_ERROR),
    ]
    rendered = render_events("\n".join(stream)).split("\n")
    assert rendered[1:] == [
        "API error 401 (authentication_failed): retry 2/10 in 1.0s",
        "Bash: python3 x.py",
        "tool error: This command requires approval",
        "result: error_max_turns, 3 turns, $0.0012: Reached maximum number of turns (2) "
        "(error_max_turns)",
        "result: error, 1 turn, $0.0000: API Error: 400 messages.0.content: bad block type",
    ]


def test_render_log_skips_a_cut_first_line_and_a_line_still_being_written() -> None:
    text = "\n".join(SUCCESSFUL_STREAM)
    cut = text[len(SUCCESSFUL_STREAM[0]) // 2 :]  # starts in the middle of the init line
    unfinished = line(assistant({"type": "text", "text": "Half"}))[:40]
    rendered = render_events(cut + "\n" + unfinished).split("\n")
    assert rendered[0] == f"Write {CWD}/b.txt"  # no init seen: the path stays absolute
    assert rendered[-1] == "result: success, 3 turns, $0.000621"
    assert not any(part.startswith("{") or '":' in part for part in rendered)


def test_render_log_keeps_plain_text_and_strips_terminal_escapes() -> None:
    rendered = render_events("Error: \x1b[31mboom\x1b[0m\n[replays] a note\n")
    assert rendered == "Error: boom\n[replays] a note"


def test_render_log_indents_a_sub_agents_messages() -> None:
    stream = [
        line(assistant(tool_use("Agent", description="Sub job", prompt="sub task"))),
        line({**assistant({"type": "text", "text": "sub done"}), "parent_tool_use_id": "t1"}),
        line(
            {
                "type": "system",
                "subtype": "task_notification",
                "status": "completed",
                "summary": "Sub job",
            }
        ),
        line(tool_result([{"type": "text", "text": "sub done"}, {"type": "text", "text": "id"}])),
    ]
    assert render_events("\n".join(stream)).split("\n") == [
        "Agent: Sub job",
        "  assistant: sub done",
        "  Sub job: completed",
        "tool result: sub done",
        "  id",
    ]


# --- outcome ---------------------------------------------------------------------------


def test_outcome_takes_usage_cost_and_time_from_the_result_line(tmp_path: Path) -> None:
    context = context_for(tmp_path, SUCCESSFUL_STREAM)
    outcome = adapter().outcome(context, exit_code=0)
    assert outcome.final_message == "All done."
    assert outcome.usage == TokenUsage(
        input_tokens=41,
        output_tokens=21,
        cache_read_tokens=300,
        cache_write_5m_tokens=20,
        cache_write_1h_tokens=3,
    )
    assert outcome.cost_usd == Decimal("0.000621")
    assert outcome.model_seconds == 0.122
    assert (outcome.failed, outcome.error) == (False, "")
    assert outcome.notes == [f"Claude Code session {SESSION}: 3 turns."]


def test_a_result_without_cost_is_priced_from_the_table(tmp_path: Path) -> None:
    result = {**RESULT_SUCCESS, "modelUsage": {}}
    del result["total_cost_usd"]
    outcome = adapter().outcome(context_for(tmp_path, [line(result)]), exit_code=0)
    table = pricing.load_price_table()
    assert outcome.cost_usd == pricing.cost_usd("claude-sonnet-4-5", outcome.usage, table)
    assert outcome.cost_usd is not None and outcome.cost_usd > 0


def test_is_error_with_subtype_success_fails_even_when_claude_exits_0(tmp_path: Path) -> None:
    context = context_for(tmp_path, [line(INIT), line(RESULT_API_ERROR)])
    outcome = adapter().outcome(context, exit_code=0)
    assert outcome.failed is True
    assert outcome.error == "API Error: 400 messages.0.content: bad block type"
    assert outcome.cost_usd == Decimal(0) and outcome.usage.total == 0


def test_error_max_turns_fails_with_claudes_own_words(tmp_path: Path) -> None:
    outcome = adapter().outcome(context_for(tmp_path, [line(RESULT_MAX_TURNS)]), exit_code=1)
    assert outcome.failed is True
    assert outcome.error == "Reached maximum number of turns (2) (error_max_turns)"
    assert outcome.usage == TokenUsage(input_tokens=200, output_tokens=40)
    assert outcome.cost_usd == Decimal("0.0012000000000000001")


def test_no_result_line_fails_with_the_logs_last_lines(tmp_path: Path) -> None:
    lines = [
        line(INIT),
        line(assistant(tool_use("Bash", command="ls"))),
        "Error: something went badly wrong",
        "    at main (cli.js:1:1)",
    ]
    outcome = adapter().outcome(context_for(tmp_path, lines), exit_code=0)
    assert outcome.failed is True
    assert outcome.error.startswith("Claude Code ended without a result.\n")
    assert "Bash: ls" in outcome.error
    assert outcome.error.endswith("Error: something went badly wrong\n    at main (cli.js:1:1)")
    assert outcome.usage.total == 0 and outcome.cost_usd is None
    assert outcome.notes == ["Claude Code reported no usage: tokens and cost are unknown."]


@pytest.mark.parametrize("said_its_session", [True, False])
def test_no_result_line_takes_usage_from_the_runs_own_transcript(
    tmp_path: Path, said_its_session: bool
) -> None:
    session = manifest_session("claude-cli")
    source = REAL_TRANSCRIPTS / session["path"]
    init = [line({**INIT, "session_id": session["session_id"]})] if said_its_session else []
    context = context_for(tmp_path, [*init, "Killed"])
    target = context.run_dir / "claude-home" / ".claude" / "projects" / "-work" / source.name
    target.parent.mkdir(parents=True)
    shutil.copy(source, target)
    outcome = adapter().outcome(context, exit_code=1)
    expected = sum((TokenUsage(**turn["usage"]) for turn in session["turns"]), TokenUsage())
    assert outcome.failed is True
    assert outcome.usage == expected
    assert outcome.cost_usd == pricing.cost_usd("claude-sonnet-4-5", expected)
    assert "session transcript" in outcome.notes[0]


def test_sub_agent_tokens_missing_from_usage_come_from_model_usage(tmp_path: Path) -> None:
    # Recorded: the main loop used 30/30, a sub-agent 1000/1000; `usage` shows only the
    # main loop while modelUsage and total_cost_usd cover both.
    result = {
        **RESULT_SUCCESS,
        "total_cost_usd": 0.018539999999999997,
        "usage": {"input_tokens": 30, "output_tokens": 30, "cache_creation_input_tokens": 0},
        "modelUsage": {
            "claude-sonnet-4-5": {
                "inputTokens": 1030,
                "outputTokens": 1030,
                "cacheReadInputTokens": 0,
                "cacheCreationInputTokens": 0,
                "costUSD": 0.018539999999999997,
            }
        },
    }
    outcome = adapter().outcome(context_for(tmp_path, [line(result)]), exit_code=0)
    assert outcome.usage == TokenUsage(input_tokens=1030, output_tokens=1030)
    # Claude's own figure, which agrees with the price table for all 2,060 tokens.
    assert outcome.cost_usd == Decimal("0.018539999999999997")
    expected = pricing.cost_usd("claude-sonnet-4-5", outcome.usage)
    assert expected is not None and pricing.round_usd(outcome.cost_usd) == expected
    assert "sub-agents: 2,000 tokens" in outcome.notes[0]


def test_a_resumed_sessions_result_counts_this_invocation_only(tmp_path: Path) -> None:
    # Claude Code 2.1.3xx, the second invocation of a resumed session: `usage` and
    # model_usage_since_last_result are this invocation's (20 in, 5 out, 200 read);
    # modelUsage and total_cost_usd are the whole session's, the first invocation included.
    result = {
        **RESULT_SUCCESS,
        "total_cost_usd": 0.0003,
        "usage": {"input_tokens": 20, "output_tokens": 5, "cache_read_input_tokens": 200},
        "modelUsage": {
            "claude-sonnet-4-5": {
                "inputTokens": 30, "outputTokens": 8, "cacheReadInputTokens": 300,
                "cacheCreationInputTokens": 0, "costUSD": 0.0003,
            }
        },
        "model_usage_since_last_result": {
            "claude-sonnet-4-5": {
                "inputTokens": 20, "outputTokens": 5, "cacheReadInputTokens": 200,
                "cacheCreationInputTokens": 0, "costUSD": 0.000195,
            }
        },
    }  # fmt: skip
    outcome = adapter().outcome(context_for(tmp_path, [line(result)]), exit_code=0)

    assert outcome.usage == TokenUsage(input_tokens=20, output_tokens=5, cache_read_tokens=200)
    assert outcome.cost_usd == Decimal("0.000195")
    assert not any("sub-agents" in note for note in outcome.notes)


def test_permission_denials_are_noted(tmp_path: Path) -> None:
    denial = {
        "tool_name": "Bash",
        "tool_use_id": "toolu_fake_4eea",
        "tool_input": {"command": "python3 -c 'print(1)'", "description": "Run a command"},
    }
    result = {**RESULT_SUCCESS, "permission_denials": [denial]}
    outcome = adapter().outcome(context_for(tmp_path, [line(result)]), exit_code=0)
    assert outcome.failed is False
    assert "refused 1 tool call(s)" in outcome.notes[0]
    assert "Bash (python3 -c 'print(1)')" in outcome.notes[0]


def test_a_nonzero_exit_after_a_clean_result_quotes_the_readable_tail(tmp_path: Path) -> None:
    lines = [line(RESULT_SUCCESS), "Segmentation fault"]
    outcome = adapter().outcome(context_for(tmp_path, lines), exit_code=139)
    assert outcome.failed is False
    assert outcome.error.endswith("result: success, 3 turns, $0.000621\nSegmentation fault")


# --- configuration and invocation ------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "fragment"),
    [
        ({"binary": ""}, "'binary' must be a program name or path"),
        ({"args": "--verbose"}, "'args' must be a list of strings"),
        ({"args": ["--model", "x"]}, "must not give --model"),
        ({"args": ["--output-format=text"]}, "must not give --output-format"),
        ({"env": {"A": 1}}, "'env' must map names to strings"),
        ({"env": {"HOME": "/root"}}, "'env' must not set HOME"),
        ({"env": {"CLAUDE_CONFIG_DIR": "/x"}}, "'env' must not set CLAUDE_CONFIG_DIR"),
        ({"permission_mode": "yolo"}, "'permission_mode' must be one of acceptEdits, auto"),
        ({"max_turns": 0}, "'max_turns' must be a whole number of at least 1"),
        ({"max_turns": True}, "'max_turns'"),
        ({"max_turns": 2.5}, "'max_turns'"),
        ({"max_budget_usd": -1}, "'max_budget_usd' must be a positive number"),
        ({"max_budget_usd": "5"}, "'max_budget_usd'"),
        ({"seed_files": ["a"]}, "'seed_files' must map"),
        ({"seed_files": {"/etc/x": "~/x"}}, "must be a relative path inside the run's HOME"),
        ({"seed_files": {"../x": "~/x"}}, "must be a relative path"),
        ({"seed_files": {".claude/x": ""}}, "the source of '.claude/x' must be a path"),
    ],
)
def test_check_entry_explains_what_is_wrong(entry: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ValueError) as raised:
        ClaudeCodeAgent.check_entry({"kind": "claude_code", "models": ["m"], **entry})
    assert fragment in str(raised.value)


def test_a_complete_entry_is_accepted() -> None:
    ClaudeCodeAgent.check_entry(
        {
            "kind": "claude_code",
            "label": "Claude Code",
            "binary": "claude",
            "args": ["--effort", "high"],
            "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:1"},
            "models": ["claude-sonnet-4-5"],
            "permission_mode": "bypassPermissions",
            "max_turns": 30,
            "max_budget_usd": 2.5,
            "seed_files": {".claude/.credentials.json": "~/.claude/.credentials.json"},
        }
    )


def test_invocation_gives_the_request_on_stdin_and_an_own_home(tmp_path: Path) -> None:
    secret = tmp_path / "credentials.json"
    secret.write_text('{"token": "t"}')
    agent = adapter(
        binary="~/bin/claude",
        args=["--effort", "high"],
        env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
        max_turns=5,
        max_budget_usd=1.5,
        seed_files={".claude/.credentials.json": str(secret)},
    )
    context = context_for(tmp_path, [])
    invocation = agent.invocation(context)
    home = context.run_dir / "claude-home"
    assert invocation.argv == [
        str(Path("~/bin/claude").expanduser()),
        "-p",
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "claude-sonnet-4-5",
        "--permission-mode",
        "acceptEdits",
        "--max-turns",
        "5",
        "--max-budget-usd",
        "1.5",
        "--effort",
        "high",
    ]
    assert invocation.stdin_path == context.request_file
    assert invocation.env == {
        "ANTHROPIC_BASE_URL": "http://127.0.0.1:9",
        "HOME": str(home),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
    }
    seeded = home / ".claude" / ".credentials.json"
    assert seeded.read_text() == '{"token": "t"}'
    assert stat.S_IMODE(seeded.stat().st_mode) == 0o600
    assert sorted(str(p.relative_to(home)) for p in home.rglob("*")) == [
        ".claude",
        ".claude/.credentials.json",
    ]
    # Once the agent has finished, the copied login is gone; the home stays with the run.
    agent.cleanup(context)
    assert not seeded.exists() and (home / ".claude").is_dir()


def test_bypass_permissions_as_root_sets_is_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    context = context_for(tmp_path, [])
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    env = adapter(permission_mode="bypassPermissions").invocation(context).env
    assert env["IS_SANDBOX"] == "1"
    assert "IS_SANDBOX" not in adapter().invocation(context).env
    kept = adapter(permission_mode="bypassPermissions", env={"IS_SANDBOX": "0"})
    assert kept.invocation(context).env["IS_SANDBOX"] == "0"
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "IS_SANDBOX" not in adapter(permission_mode="bypassPermissions").invocation(context).env


def test_a_missing_seed_file_stops_the_run_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / ".credentials.json"
    agent = adapter(seed_files={".claude/.credentials.json": str(missing)})
    with pytest.raises(AgentSetupError) as raised:
        agent.invocation(context_for(tmp_path, []))
    assert str(missing) in str(raised.value)


# --- discovery -------------------------------------------------------------------------


def claude_entry(binary: Path | str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "claude_code",
        "label": "Claude Code",
        "binary": str(binary),
        "models": ["claude-sonnet-4-5"],
        **extra,
    }


def test_a_missing_binary_is_unavailable_and_blocks_a_plan(
    settings: Any, api_client: Any, real_threads: dict[str, Any], sample_repo: Path
) -> None:
    settings.REPLAYS_AGENTS = {"claude": claude_entry("replays-no-such-claude")}
    [info] = [info for info in agents.discover_models() if info.agent == "claude"]
    assert (info.id, info.available) == (MODEL_ID, False)
    assert info.reason == "'replays-no-such-claude' was not found on PATH."
    thread = real_threads["claude-line-count"]
    response = api_client.post(
        "/api/plans/",
        {
            "configurations": [
                {
                    "thread_id": thread.pk,
                    "start_message_uuid": thread.turns.get(index=0).message_uuid,
                    "repository": str(sample_repo),
                }
            ],
            "models": [MODEL_ID],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    plan = response.json()
    assert plan["status"] == "blocked"
    assert plan["blockers"] == [
        f"Model {MODEL_ID} cannot run here: 'replays-no-such-claude' was not found on PATH."
    ]


def test_a_missing_seed_file_makes_the_agent_unavailable(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_AGENTS = {
        "claude": claude_entry(
            sys.executable, seed_files={".claude/.credentials.json": str(tmp_path / "none")}
        )
    }
    info = agents.resolve_model(MODEL_ID)
    assert not info.available and str(tmp_path / "none") in info.reason


@pytest.mark.cli
def test_the_real_binary_is_available_with_its_version(settings: Any) -> None:
    claude = require_tool(NODE_BIN / "claude", "make node")
    settings.REPLAYS_AGENTS = {"claude": claude_entry(claude)}
    info = agents.resolve_model(MODEL_ID)
    assert info.available and info.reason == ""
    assert info.version == "2.1.332 (Claude Code)"
    typed = agents.resolve_model("claude:claude-opus-4-5")  # typed by hand, not listed
    assert typed.available and typed.model == "claude-opus-4-5"


# --- real runs: `manage.py replay --wait` with the real claude ---------------------------

REQUEST_KEY = "line_count function"  # in the first request of the claude-line-count thread


@dataclass
class Replay:
    env: dict[str, str]
    thread_id: int
    first_uuid: str
    repo: Path
    home: Path  # the HOME the test gives the replay (and so its coordinator)
    agents_file: Path
    claude: Path

    def configure(
        self, server: AnthropicServer, *, env_extra: dict[str, str] | None = None, **entry: Any
    ) -> None:
        env = {
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "fake-key",
            **(env_extra or {}),
        }
        self.agents_file.write_text(
            json.dumps({"claude": claude_entry(self.claude, env=env, **entry)})
        )

    def argv(self, *, timeout: int = 60) -> list[str]:
        return [
            sys.executable,
            str(MANAGE),
            "replay",
            "--thread",
            str(self.thread_id),
            "--from",
            self.first_uuid,
            "--to",
            self.first_uuid,
            "--model",
            MODEL_ID,
            "--repository",
            str(self.repo),
            "--user",
            "alice",
            "--timeout",
            str(timeout),
            # The agent is under test: the offline evaluator keeps the scripted server to
            # the agent's own requests.
            "--evaluator",
            "tests",
            "--verify-command",
            "true",
            "--yes",
            "--wait",
        ]

    def run(self, *, timeout: int = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.argv(timeout=timeout),
            env=self.env,
            text=True,
            capture_output=True,
            timeout=timeout + 60,
            stdin=subprocess.DEVNULL,
        )

    def start(self, *, timeout: int = 60) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(timeout=timeout),
            env=self.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture
def replay(
    process_env: dict[str, str],
    tmp_path: Path,
    user: Any,
    real_threads: dict[str, Any],
    sample_repo: Path,
) -> Replay:
    claude = require_tool(NODE_BIN / "claude", "make node")
    home = tmp_path / "test-home"
    home.mkdir()
    agents_file = tmp_path / "agents.json"
    thread = real_threads["claude-line-count"]
    env = {
        **process_env,
        "HOME": str(home),
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        "REPLAYS_AGENTS_FILE": str(agents_file),
    }
    return Replay(
        env=env,
        thread_id=thread.pk,
        first_uuid=thread.turns.get(index=0).message_uuid,
        repo=sample_repo,
        home=home,
        agents_file=agents_file,
        claude=claude,
    )


def result_line(run: Run) -> dict[str, Any]:
    log = Path(run.run_dir) / "agent.log"
    # Each line is one JSON event (2.1.3xx writes "type" last in the result line).
    events = [json.loads(text) for text in log.read_text().splitlines() if text.startswith("{")]
    results = [event for event in events if event.get("type") == "result"]
    assert len(results) == 1, log.read_text()[-3000:]
    return results[0]


def scripted_usage(server: AnthropicServer) -> TokenUsage:
    """What the server reported, summed over its answers (Anthropic semantics: disjoint)."""
    total = TokenUsage()
    for response in server.responses:
        usage = response.step.usage  # type: ignore[union-attr]
        total = total + TokenUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read_tokens,
            cache_write_5m_tokens=usage.cache_write_5m_tokens,
            cache_write_1h_tokens=usage.cache_write_1h_tokens,
        )
    return total


def tree_of(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {root.pid, *(child.pid for child in root.children(recursive=True))}
    except psutil.NoSuchProcess:
        return set()


def still_running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_for(condition: Callable[[], object], what: str, seconds: float = 20) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture
def reaper() -> Iterator[set[int]]:
    """Pids a test saw; whatever is left of them is killed, so a failure leaks nothing."""
    pids: set[int] = set()
    yield pids
    for pid in pids:
        if still_running(pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass


@pytest.mark.cli
def test_a_replay_with_claude_edits_the_worktree_and_reports_its_own_usage(
    replay: Replay,
) -> None:
    core = "textstats/core.py"
    old = "def word_count(text: str) -> int:"
    new = (
        "def line_count(text: str) -> int:\n"
        '    """Number of lines."""\n'
        "    return len(text.splitlines())\n\n\n" + old
    )
    steps = [
        ToolCall(
            "read",
            {"file_path": core},
            Usage(
                input_tokens=11,
                output_tokens=7,
                cache_read_tokens=100,
                cache_write_5m_tokens=20,
                cache_write_1h_tokens=3,
            ),
        ),
        ToolCall(
            "edit",
            {"file_path": core, "old_string": old, "new_string": new},
            Usage(
                input_tokens=13, output_tokens=40, cache_read_tokens=200, cache_write_5m_tokens=50
            ),
        ),
        shell(
            "echo 'line_count added' > CHANGES.txt && cat CHANGES.txt",
            usage=Usage(
                input_tokens=17, output_tokens=9, cache_read_tokens=300, cache_write_1h_tokens=30
            ),
        ),
        Text("Added line_count.", Usage(input_tokens=19, output_tokens=5, cache_read_tokens=400)),
    ]

    # Claude's file tools take paths relative to its working folder (the worktree).
    script = anthropic_server.by_prompt({REQUEST_KEY: steps})

    with AnthropicServer(script) as server:
        replay.configure(server)
        started = time.monotonic()
        result = replay.run()
        elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert not server.unscripted
    run = Run.objects.get()
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert run.exit_code == 0

    # The diff holds Claude's edit and the file its shell command wrote.
    changed = repos.changed_files(run.diff)
    assert sorted(changed) == ["CHANGES.txt", core], run.diff
    assert "+def line_count(text: str) -> int:" in run.diff
    assert "+line_count added" in run.diff

    # Tokens as the server reported them, summed over its four answers.
    assert len(server.responses) == 4
    expected = scripted_usage(server)
    assert run.tokens == expected.as_dict()
    assert expected == TokenUsage(60, 61, 1000, 70, 33)
    # The cost is Claude's own figure from its result line.
    final = result_line(run)
    assert run.cost_usd == pricing.round_usd(Decimal(str(final["total_cost_usd"])))
    assert run.cost_usd > 0
    assert run.model_seconds == round(final["duration_api_ms"] / 1000, 3)

    # The log tail reads like a log.
    tail = run.log_tail.split("\n")
    assert (
        "Claude Code 2.1.332 started: model claude-sonnet-4-5, permission mode acceptEdits" in tail
    )
    assert f"Read {core}" in tail and f"Edit {core}" in tail
    assert "Bash: echo 'line_count added' > CHANGES.txt && cat CHANGES.txt" in tail
    assert "tool result: line_count added" in tail
    assert "assistant: Added line_count." in tail
    assert any(entry.startswith("result: success, 4 turns, $") for entry in tail)
    assert not any(entry.startswith("{") for entry in tail)

    # The session was written under the run's own HOME, nothing under the test's.
    home = Path(run.run_dir) / "claude-home"
    transcripts = list((home / ".claude" / "projects").glob(f"*/{final['session_id']}.jsonl"))
    assert len(transcripts) == 1
    assert not (replay.home / ".claude").exists() and not (replay.home / ".claude.json").exists()
    # The request went in on stdin, verbatim.
    prompt = anthropic_server.conversation_position(server.model_requests[0])[0]
    assert prompt.strip() == manifest_session("claude-line-count")["turns"][0]["request"]
    assert elapsed < 30


@pytest.mark.cli
@pytest.mark.parametrize(
    ("status", "message", "expected"),
    [
        (
            400,
            "messages.0.content: text blocks must be non-empty",
            "API Error: 400 messages.0.content: text blocks must be non-empty",
        ),
    ],
)
def test_an_api_error_fails_the_run_with_claudes_message(
    replay: Replay, status: int, message: str, expected: str
) -> None:
    with AnthropicServer(lambda body: HttpError(status, message)) as server:
        replay.configure(server)
        result = replay.run()
    assert result.returncode == 1, result.stdout + result.stderr
    run = Run.objects.get()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.AGENT_ERROR)
    assert expected in run.failure_message
    assert run.exit_code == 1
    assert run.cost_usd == Decimal(0) and run.total_tokens == 0
    assert any(entry.startswith("result: error, 1 turn") for entry in run.log_tail.split("\n"))


@pytest.mark.cli
@pytest.mark.parametrize(
    ("status", "message", "title"),
    [
        (401, "invalid x-api-key", "credentials refused or missing"),
        (403, "Your organization has been disabled.", "credentials refused or missing"),
        (429, "Number of request tokens has exceeded your rate limit", "rate limited"),
        (404, "model: claude-sonnet-4-5", "the provider does not know this model"),
        (400, "Your credit balance is too low to access the Anthropic API.", "quota or credit"),
        (529, "Overloaded", "the provider is unavailable"),
    ],
)
def test_a_provider_refusal_is_a_setup_failure_not_the_models(
    replay: Replay, settings: Any, status: int, message: str, title: str
) -> None:
    """The real claude, refused by its provider: failed as `setup` with claude's own words
    and the fix, and the leaderboard does not count it against the model."""
    with AnthropicServer(lambda body: HttpError(status, message)) as server:
        replay.configure(server, env_extra={"CLAUDE_CODE_MAX_RETRIES": "0"})
        result = replay.run(timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    run = Run.objects.get()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP)
    assert run.failure_owner == FailureOwner.SETUP
    assert run.failure_message.startswith(f"Setup problem ({title}")
    assert "Fix: " in run.failure_message
    row = leaderboard.leaderboard(
        user=run.batch.owner, filters=leaderboard.Filters(), with_choices=False
    ).rows[0]
    assert (row.n, row.failed, row.setup) == (0, 0, 1)


@pytest.mark.cli
def test_claude_not_logged_in_is_a_setup_failure_with_its_own_words(replay: Replay) -> None:
    """No key and an empty home: claude says "Not logged in · Please run /login" at once."""
    replay.agents_file.write_text(json.dumps({"claude": claude_entry(replay.claude)}))
    result = replay.run()
    assert result.returncode == 1, result.stdout + result.stderr
    run = Run.objects.get()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP)
    assert run.failure_message.startswith("Setup problem (not logged in): Not logged in")
    assert "seed_files" in run.failure_message
    # The command shows the reason whole under its table.
    assert "Not logged in · Please run /login" in result.stdout


@pytest.mark.cli
def test_a_model_that_never_answers_times_out_and_the_tree_is_gone(
    replay: Replay, reaper: set[int]
) -> None:
    with AnthropicServer(anthropic_server.by_prompt({REQUEST_KEY: [Hang()]})) as server:
        replay.configure(server)
        process = replay.start(timeout=10)
        try:
            agent_pid = wait_for(
                lambda: (
                    Run.objects.filter(agent_pid__isnull=False)
                    .values_list("agent_pid", flat=True)
                    .first()
                ),
                "the agent to start",
            )
            wait_for(lambda: server.responses, "Claude to ask the model")
            while process.poll() is None:
                reaper.update(tree_of(agent_pid))
                time.sleep(0.1)
            output = process.communicate(timeout=10)[0]
        finally:
            if process.poll() is None:
                process.kill()
    run = Run.objects.get()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.TIMEOUT), output
    assert run.failure_message == "The agent did not finish within 10s."
    assert agent_pid in reaper
    assert not [pid for pid in reaper if still_running(pid)]
    assert isinstance(server.responses[0].step, Hang)
    assert "Claude Code 2.1.332 started" in run.log_tail


@pytest.mark.cli
def test_cancel_during_a_tool_call_stops_claude_and_its_command(
    replay: Replay, reaper: set[int]
) -> None:
    script = anthropic_server.by_prompt(
        # 2.1.3xx refuses a sleep that starts a command ("Blocked: standalone sleep 30").
        {REQUEST_KEY: [shell("echo waiting && sleep 30"), Text("Slept.")]},
        fallback=Text("ok"),
    )
    with AnthropicServer(script) as server:
        replay.configure(server)
        process = replay.start()
        try:
            agent_pid = wait_for(
                lambda: (
                    Run.objects.filter(agent_pid__isnull=False)
                    .values_list("agent_pid", flat=True)
                    .first()
                ),
                "the agent to start",
            )

            def sleeping() -> bool:
                reaper.update(tree_of(agent_pid))
                for pid in tree_of(agent_pid):
                    try:
                        if psutil.Process(pid).cmdline()[:2] == ["sleep", "30"]:
                            return True
                    except psutil.NoSuchProcess:
                        continue
                return False

            wait_for(sleeping, "Claude to run `sleep 30`")
            Run.objects.filter(pk=Run.objects.get().pk).update(cancel_requested_at=timezone.now())
            output = process.communicate(timeout=20)[0]
        finally:
            if process.poll() is None:
                process.kill()
    run = Run.objects.get()
    assert run.status == RunStatus.CANCELLED, output
    assert run.failure_code == ""
    assert len(reaper) >= 3  # claude, the shell it started, sleep
    assert not [pid for pid in reaper if still_running(pid)]
    assert "Bash: echo waiting && sleep 30" in run.log_tail


@pytest.mark.cli
def test_claude_refusing_its_arguments_fails_with_its_own_words(replay: Replay) -> None:
    with AnthropicServer(lambda body: Text("never asked")) as server:
        replay.configure(server, args=["--no-such-flag"])
        result = replay.run()
    assert result.returncode == 1, result.stdout + result.stderr
    run = Run.objects.get()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.AGENT_ERROR)
    assert run.failure_message == (
        "The agent exited with code 1:\n"
        "Claude Code ended without a result.\n"
        "error: unknown option '--no-such-flag'"
    )
    assert run.log_tail.startswith("error: unknown option '--no-such-flag'")
    assert not server.responses


def test_a_model_that_looks_like_an_option_is_refused(tmp_path: Path) -> None:
    agent = ClaudeCodeAgent.from_entry(
        "claude", claude_entry("claude"), "--dangerously-skip-permissions"
    )
    with pytest.raises(AgentSetupError, match="is not a model name"):
        agent.invocation(context_for(tmp_path, []))


# --- a campaign's cost cap -----------------------------------------------------------------


def test_a_campaign_runs_cap_is_given_to_claude_when_lower_than_its_own(tmp_path: Path) -> None:
    from dataclasses import replace

    context = context_for(tmp_path, [])
    argv = (
        adapter(max_budget_usd=1.5).invocation(replace(context, cost_cap_usd=Decimal("0.25"))).argv
    )
    assert argv[argv.index("--max-budget-usd") + 1] == "0.25"
    argv = (
        adapter(max_budget_usd=0.1).invocation(replace(context, cost_cap_usd=Decimal("0.25"))).argv
    )
    assert argv[argv.index("--max-budget-usd") + 1] == "0.1"
    argv = adapter().invocation(replace(context, cost_cap_usd=Decimal("10"))).argv
    assert argv[argv.index("--max-budget-usd") + 1] == "10"
    assert "--max-budget-usd" not in adapter().invocation(context).argv


def test_claude_stopping_at_a_campaigns_cap_is_budget_exhausted_not_the_models(
    tmp_path: Path,
) -> None:
    from dataclasses import replace

    from replays.coordinator.supervisor import Exited
    from replays.coordinator.turns import Turns, conclude

    stopped = {**RESULT_SUCCESS, "subtype": "error_max_budget_usd", "is_error": True,
               "result": "", "total_cost_usd": 0.31}  # fmt: skip
    context = replace(context_for(tmp_path, [line(stopped)]), cost_cap_usd=Decimal("0.25"))
    outcome = adapter().outcome(context, exit_code=1)
    assert outcome.stopped_at_cap
    turns = Turns(count=1)
    turns.add(outcome, ending=Exited(1), seconds=3.0, session="s")
    result = conclude(
        turns, wall_seconds=3.0, timeout="1m", error_words="", cost_cap=Decimal("0.25")
    )
    assert (result.status, result.failure_code) == (RunStatus.FAILED, FailureCode.BUDGET_EXHAUSTED)
    assert "it spent $0.3100" in result.failure_message
    # Without a campaign's cap (the entry's own max_budget_usd), it is claude's error.
    plain = adapter(max_budget_usd=0.25).outcome(
        context_for(tmp_path, [line(stopped)]), exit_code=1
    )
    assert not plain.stopped_at_cap


@pytest.mark.cli
def test_the_real_claude_stops_itself_at_its_budget(replay: Replay) -> None:
    """claude 2.1.332 with --max-budget-usd below what its first answer costs ends with
    the subtype error_max_budget_usd, which a campaign's run maps to budget_exhausted."""
    steps = iter([ToolCall("read", {"file_path": "README.md"}, Usage(input_tokens=50_000,
                                                                    output_tokens=2_000)),
                  Text("Done.", Usage(input_tokens=10, output_tokens=5))])  # fmt: skip
    with AnthropicServer(lambda body: next(steps)) as server:
        replay.configure(server, max_budget_usd=0.01)
        done = replay.run(timeout=120)
    run = Run.objects.get()
    assert result_line(run)["subtype"] == "error_max_budget_usd", done.stdout + done.stderr
    # Not a campaign's run: the entry's own cap is claude's error, the model's to own.
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.AGENT_ERROR)
