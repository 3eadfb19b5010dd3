"""Judge mode of the agent kinds: one structured answer (a JSON object matching a schema)
to a prompt, in a private empty folder, read back as a JudgeAnswer.

Recorded lines first (no process), then the real `codex` (0.169.0) and `claude`
(2.1.197) against the scripted servers on loopback, driven the way the evaluation
layer drives them: prompt file, judge_invocation, processes.spawn, wait, judge_answer,
judge_cleanup. Then the command kind with small Python judges.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from replays import processes, runfolder
from replays.agents.base import (
    MAX_ANSWER_BYTES,
    Agent,
    AgentSetupError,
    JudgeAnswer,
    JudgeTask,
    judge_context,
    parse_answer,
    write_private,
)
from replays.agents.baselines import EmptyAgent, HistoricalAgent
from replays.agents.claude_code import ClaudeCodeAgent
from replays.agents.codex import CodexAgent
from replays.agents.command import CommandAgent
from replays.transcripts.base import TokenUsage
from tests.conftest import NODE_BIN, require_tool
from tests.fakes import anthropic_server, openai_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import HttpError, Text, ToolCall, Usage

PYTHON = sys.executable
HOW_TO_GET = "make node"
# Strict-compatible, as the evaluation layer writes its schemas.
SCHEMA = {
    "type": "object",
    "properties": {
        "verdict": {"type": "string", "enum": ["better", "worse", "same"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["verdict", "reasons"],
    "additionalProperties": False,
}
VERDICT = {"verdict": "better", "reasons": ["the tests pass", "smaller diff"]}
PROMPT_KEY = "JUDGE-7F3A"
PROMPT = f"Compare the two replays and give your verdict. {PROMPT_KEY}\n"
CODEX_MODEL = "gpt-5.5"
CLAUDE_MODEL = "claude-sonnet-4-5"


def make_task(tmp_path: Path, name: str = "verdict-1") -> JudgeTask:
    """A judge call as the caller prepares it: an empty private folder, the prompt written."""
    folder = tmp_path / "judging" / name
    folder.mkdir(mode=0o700, parents=True)
    task = JudgeTask(
        name=name,
        prompt=PROMPT,
        schema=SCHEMA,
        inputs={"candidates": ["run-1", "run-2"], "cost_usd": Decimal("0.25")},
        folder=folder,
        log_path=tmp_path / "judging" / f"{name}.log",
        prompt_file=folder / "prompt.md",
    )
    write_private(task.prompt_file, PROMPT.encode("utf-8"))
    return task


def with_log(task: JudgeTask, lines: list[str]) -> JudgeTask:
    task.log_path.write_text("\n".join(lines) + "\n")
    return task


def line(event: dict[str, Any]) -> str:
    return json.dumps(event, separators=(",", ":"))


def no_answer(judged: JudgeAnswer) -> str:
    """The error of a judge call that must have given no answer."""
    assert judged.answer is None, judged
    return judged.error


def login_file(tmp_path: Path) -> str:
    """A copy of the user's login, to seed the agent's own home with."""
    path = tmp_path / "login.json"
    path.write_text('{"token": "t"}')
    return str(path)


def home_files(home: Path) -> list[str]:
    return sorted(path.relative_to(home).as_posix() for path in home.rglob("*") if path.is_file())


def codex(**entry: Any) -> CodexAgent:
    return CodexAgent.from_entry(
        "codex", {"kind": "codex", "models": [CODEX_MODEL], **entry}, CODEX_MODEL
    )


def claude(**entry: Any) -> ClaudeCodeAgent:
    return ClaudeCodeAgent.from_entry(
        "claude", {"kind": "claude_code", "models": [CLAUDE_MODEL], **entry}, CLAUDE_MODEL
    )


def judge(agent: Agent, task: JudgeTask, *, timeout: float = 90) -> JudgeAnswer:
    """Run one judge call the way the evaluation layer does, and read its answer."""
    invocation = agent.judge_invocation(task)
    process, identity = processes.spawn(
        invocation.argv,
        cwd=task.folder,
        env=runfolder.agent_environment(invocation.env),
        log_path=task.log_path,
        stdin_path=invocation.stdin_path,
    )
    try:
        exit_code = process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            processes.kill_tree(identity.pid, identity.create_time, grace_seconds=1)
            process.wait()
    try:
        return agent.judge_answer(task, exit_code=exit_code)
    finally:
        agent.judge_cleanup(task)


# --- reading an answer (shared by every kind) ------------------------------------------


@pytest.mark.parametrize(
    ("reply", "error"),
    [
        ("", "The evaluator gave no answer."),
        ("  \n", "The evaluator gave no answer."),
        ("not json", "The evaluator's answer is not JSON: not json"),
        ('{"verdict": NaN}', 'The evaluator\'s answer is not JSON: {"verdict": NaN}'),
        ("[1, 2]", "The evaluator's answer is a JSON list, not an object: [1, 2]"),
        ('"better"', 'The evaluator\'s answer is a JSON string, not an object: "better"'),
        ("null", "The evaluator's answer is JSON null, not an object: null"),
        ("true", "The evaluator's answer is JSON true/false, not an object: true"),
        ("3.5", "The evaluator's answer is a JSON number, not an object: 3.5"),
        ("[" * 100_000, "The evaluator's answer is not JSON: " + "[" * 200),
        ("\x1b[31mred\x00 text", "The evaluator's answer is not JSON: red text"),
    ],
)
def test_a_reply_that_is_not_a_json_object_gives_no_answer_and_says_why(
    reply: str, error: str
) -> None:
    judged = parse_answer(reply)
    assert (judged.answer, judged.error) == (None, error)


def test_a_json_object_is_the_answer_and_the_reply_is_kept() -> None:
    reply = json.dumps(VERDICT)
    assert parse_answer(reply) == JudgeAnswer(answer=VERDICT, raw=reply)


def test_a_reply_over_a_mebibyte_is_refused_unread() -> None:
    judged = parse_answer('{"x": "' + "a" * MAX_ANSWER_BYTES + '"}')
    assert no_answer(judged) == "The evaluator's answer is larger than 1 MiB: it was not read."


def test_the_baselines_do_not_judge(tmp_path: Path) -> None:
    for baseline in (HistoricalAgent(), EmptyAgent()):
        assert baseline.can_judge is False
        with pytest.raises(AgentSetupError, match="cannot act as an evaluator"):
            baseline.judge_invocation(make_task(tmp_path, baseline.kind))
    assert CodexAgent.can_judge and ClaudeCodeAgent.can_judge and CommandAgent.can_judge


# --- codex: recorded lines -------------------------------------------------------------

# What codex 0.169.0 wrote in judge mode against the fake server (stdout and stderr
# interleaved, as in the log); the answer is the agent_message.
CODEX_THREAD = '{"type":"thread.started","thread_id":"01a230c9-d736-7772-9883-7fe2f84b31af"}'
CODEX_WARNING = (
    "WARNING: proceeding, even though we could not create PATH aliases: Refusing to create "
    'helper binaries under temporary dir "/tmp"'
)
CODEX_USAGE = (
    '{"type":"turn.completed","usage":{"input_tokens":1000,"cached_input_tokens":200,'
    '"cache_write_input_tokens":0,"output_tokens":50,"reasoning_output_tokens":0}}'
)


def codex_message(text: str, item: int = 0) -> str:
    return line(
        {
            "type": "item.completed",
            "item": {"id": f"item_{item}", "type": "agent_message", "text": text},
        }
    )


def codex_lines(*messages: str) -> list[str]:
    return [
        CODEX_THREAD,
        CODEX_WARNING,
        '{"type":"turn.started"}',
        *(codex_message(text, index) for index, text in enumerate(messages)),
        CODEX_USAGE,
    ]


def gpt55_cost(usage: TokenUsage) -> Decimal:
    # gpt-5.5: $5 in, $0.50 cached, $30 out per million.
    return (
        Decimal(usage.input_tokens) * 5
        + Decimal(usage.cache_read_tokens) * Decimal("0.5")
        + Decimal(usage.output_tokens) * 30
    ) / 1_000_000


def test_codex_answers_from_its_o_file_with_the_turns_usage_and_the_price_table_cost(
    tmp_path: Path,
) -> None:
    task = with_log(make_task(tmp_path), codex_lines("something else"))
    (task.folder / "answer.txt").write_text(json.dumps(VERDICT))
    judged = codex().judge_answer(task, exit_code=0)
    assert (judged.answer, judged.error) == (VERDICT, "")
    assert judged.raw == json.dumps(VERDICT)
    # Codex's input includes the cached reads; ours does not.
    assert judged.usage == TokenUsage(input_tokens=800, cache_read_tokens=200, output_tokens=50)
    assert judged.cost_usd == gpt55_cost(judged.usage) == Decimal("0.0056")
    assert judged.model_seconds is None


def test_codex_answers_from_the_last_agent_message_when_the_o_file_is_empty(
    tmp_path: Path,
) -> None:
    task = with_log(make_task(tmp_path), codex_lines("Thinking aloud.", json.dumps(VERDICT)))
    (task.folder / "answer.txt").write_text("")  # as codex leaves it when it wrote nothing
    assert codex().judge_answer(task, exit_code=0).answer == VERDICT
    (task.folder / "answer.txt").unlink()
    assert codex().judge_answer(task, exit_code=0).answer == VERDICT


@pytest.mark.parametrize(
    ("message", "error"),
    [
        ("not json", "The evaluator's answer is not JSON: not json"),
        ('["better"]', 'The evaluator\'s answer is a JSON list, not an object: ["better"]'),
        ("", "The evaluator gave no answer."),
    ],
)
def test_codex_without_a_json_object_gives_no_answer_and_says_why(
    tmp_path: Path, message: str, error: str
) -> None:
    task = with_log(make_task(tmp_path), codex_lines(message) if message else codex_lines())
    judged = codex().judge_answer(task, exit_code=0)
    assert (judged.answer, judged.error, judged.raw) == (None, error, message)
    assert judged.cost_usd == Decimal("0.0056")  # the call was still paid for


def test_codex_failed_turn_gives_no_answer_with_the_apis_message(tmp_path: Path) -> None:
    body = {"error": {"message": "The judge model is overloaded.", "type": "server_error"}}
    failed = line({"type": "turn.failed", "error": {"message": json.dumps(body)}})
    task = with_log(make_task(tmp_path), [CODEX_THREAD, '{"type":"turn.started"}', failed])
    (task.folder / "answer.txt").write_text("")
    judged = codex().judge_answer(task, exit_code=0)
    assert (judged.answer, judged.error) == (None, "The judge model is overloaded.")
    assert judged.usage == TokenUsage() and judged.cost_usd is None
    assert judged.notes == ["Codex reported no token usage: tokens and cost are unknown."]
    # Exiting 1 as codex does, the message is the same, after the exit code.
    assert codex().judge_answer(task, exit_code=1).error == (
        "The evaluator exited with code 1:\nThe judge model is overloaded."
    )


def test_codex_exiting_non_zero_gives_no_answer_even_with_one_written(tmp_path: Path) -> None:
    task = with_log(
        make_task(tmp_path), [CODEX_THREAD, "Error: config.toml: invalid key \x1b[1mmodel\x1b[0m"]
    )
    (task.folder / "answer.txt").write_text(json.dumps(VERDICT))
    judged = codex().judge_answer(task, exit_code=2)
    assert no_answer(judged) == (
        "The evaluator exited with code 2:\n"
        "codex session 01a230c9-d736-7772-9883-7fe2f84b31af\n"
        "Error: config.toml: invalid key model"
    )


def test_codex_answer_file_over_a_mebibyte_is_refused(tmp_path: Path) -> None:
    task = with_log(make_task(tmp_path), codex_lines(json.dumps(VERDICT)))
    (task.folder / "answer.txt").write_bytes(b" " * (MAX_ANSWER_BYTES + 1))
    judged = codex().judge_answer(task, exit_code=0)
    assert no_answer(judged) == (
        "The evaluator's answer file answer.txt is larger than 1 MiB: it was not read."
    )


def test_codex_judge_invocation_is_read_only_in_the_folder_with_the_schema_and_its_own_home(
    tmp_path: Path,
) -> None:
    agent = codex(
        binary="/opt/codex/bin/codex",
        sandbox="danger-full-access",  # the runs' sandbox; an evaluator only reads
        args=["-c", "model_provider=fake"],
        seed_files={"auth.json": login_file(tmp_path)},
        env={"FAKE_KEY": "x"},
        config_toml='model_verbosity = "low"\n',
    )
    task = make_task(tmp_path)
    invocation = agent.judge_invocation(task)
    folder, home = task.folder, task.folder / "codex-home"
    assert invocation.argv == [
        "/opt/codex/bin/codex", "exec", "-c", "model_provider=fake", "--json",
        "-C", str(folder), "-s", "read-only", "--skip-git-repo-check", "-m", CODEX_MODEL,
        "--output-schema", str(folder / "answer-schema.json"), "-o", str(folder / "answer.txt"),
        "-",
    ]  # fmt: skip
    assert PROMPT_KEY not in " ".join(invocation.argv)
    assert (invocation.stdin_path, invocation.env) == (
        task.prompt_file, {"FAKE_KEY": "x", "CODEX_HOME": str(home), "TMPDIR": str(folder / "tmp")}
    )  # fmt: skip
    schema_file = folder / "answer-schema.json"
    assert json.loads(schema_file.read_text()) == SCHEMA
    assert stat.S_IMODE(schema_file.stat().st_mode) == 0o600
    # The home is prepared as for a run; the copied login goes once the call is over.
    assert home_files(home) == ["auth.json", "config.toml"]
    agent.judge_cleanup(task)
    assert home_files(home) == ["config.toml"]
    assert CodexAgent.judge_unavailable_reason({"kind": "codex", "models": []}) == ""


def test_codex_judge_refuses_a_model_that_looks_like_an_option(tmp_path: Path) -> None:
    agent = CodexAgent.from_entry("codex", {"kind": "codex", "models": []}, "--yolo")
    task = make_task(tmp_path)
    with pytest.raises(AgentSetupError, match="is not a model name"):
        agent.judge_invocation(task)
    assert not (task.folder / "answer-schema.json").exists()


# --- claude: recorded lines ------------------------------------------------------------

CLAUDE_SESSION = "7ee0463d-210c-41db-94b4-07f07ce4da84"
CLAUDE_INIT = {
    "type": "system",
    "subtype": "init",
    "cwd": "/tmp/judging/verdict-1",
    "session_id": CLAUDE_SESSION,
    "tools": ["StructuredOutput"],
    "mcp_servers": [],
    "model": CLAUDE_MODEL,
    "permissionMode": "dontAsk",
    "claude_code_version": "2.1.197",
}
CLAUDE_USAGE = {
    "input_tokens": 100,
    "cache_creation_input_tokens": 0,
    "cache_read_input_tokens": 0,
    "output_tokens": 20,
    "cache_creation": {"ephemeral_1h_input_tokens": 0, "ephemeral_5m_input_tokens": 0},
}
# The result line of claude 2.1.197 after one StructuredOutput call (fields not read dropped).
CLAUDE_RESULT = {
    "type": "result",
    "subtype": "success",
    "is_error": False,
    "duration_ms": 1830,
    "duration_api_ms": 67,
    "num_turns": 2,
    "result": json.dumps(VERDICT, separators=(",", ":")),
    "structured_output": VERDICT,
    "session_id": CLAUDE_SESSION,
    "total_cost_usd": 0.0006000000000000001,
    "usage": CLAUDE_USAGE,
    "modelUsage": {
        CLAUDE_MODEL: {
            "inputTokens": 100,
            "outputTokens": 20,
            "cacheReadInputTokens": 0,
            "cacheCreationInputTokens": 0,
            "costUSD": 0.0006000000000000001,
        }
    },
    "permission_denials": [],
}


def claude_lines(**result: Any) -> list[str]:
    tool_call = {
        "type": "assistant",
        "message": {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_1", "name": "StructuredOutput", "input": VERDICT}
            ],
        },
        "session_id": CLAUDE_SESSION,
    }
    return [line(CLAUDE_INIT), line(tool_call), line({**CLAUDE_RESULT, **result})]


def test_claude_answers_with_its_structured_output_and_its_own_cost_and_api_time(
    tmp_path: Path,
) -> None:
    task = with_log(make_task(tmp_path), claude_lines(result="ignored when structured"))
    judged = claude().judge_answer(task, exit_code=0)
    assert (judged.answer, judged.error) == (VERDICT, "")
    assert json.loads(judged.raw) == VERDICT
    assert judged.usage == TokenUsage(input_tokens=100, output_tokens=20)
    assert judged.cost_usd == Decimal("0.0006000000000000001")
    assert judged.model_seconds == 0.067
    assert judged.notes == [f"Claude Code session {CLAUDE_SESSION}: 2 turns."]


def test_claude_without_structured_output_answers_from_its_result_text(tmp_path: Path) -> None:
    task = with_log(
        make_task(tmp_path), claude_lines(structured_output=None, result=json.dumps(VERDICT))
    )
    assert claude().judge_answer(task, exit_code=0).answer == VERDICT


@pytest.mark.parametrize(
    ("result", "error"),
    [
        # Claude asked for StructuredOutput once more, the model answered in text again.
        ({"structured_output": None, "result": "not json"}, "is not JSON: not json"),
        ({"structured_output": ["better"]}, "is a JSON list, not an object"),
        ({"structured_output": None, "result": ""}, "The evaluator gave no answer."),
    ],
)
def test_claude_without_a_json_object_gives_no_answer_and_says_why(
    tmp_path: Path, result: dict[str, Any], error: str
) -> None:
    judged = claude().judge_answer(
        with_log(make_task(tmp_path), claude_lines(**result)), exit_code=0
    )
    assert error in no_answer(judged)
    assert judged.cost_usd == Decimal("0.0006000000000000001")


def test_claude_is_error_gives_no_answer_with_claudes_words_even_on_exit_0(
    tmp_path: Path,
) -> None:
    api_error = {
        "structured_output": None,
        "is_error": True,
        "result": "API Error: 500 the judge server broke.",
        "total_cost_usd": 0,
        "duration_api_ms": 0,
        "num_turns": 1,
    }
    task = with_log(make_task(tmp_path), claude_lines(**api_error))
    assert (
        claude().judge_answer(task, exit_code=0).error == "API Error: 500 the judge server broke."
    )
    judged = claude().judge_answer(task, exit_code=1)
    assert (
        no_answer(judged)
        == "The evaluator exited with code 1:\nAPI Error: 500 the judge server broke."
    )
    assert judged.cost_usd == Decimal(0)


def test_claude_giving_up_on_the_schema_gives_no_answer(tmp_path: Path) -> None:
    retries = {
        "subtype": "error_max_structured_output_retries",
        "is_error": True,
        "result": None,
        "structured_output": None,
        "errors": ["Failed to provide valid structured output after 5 attempts"],
    }
    judged = claude().judge_answer(
        with_log(make_task(tmp_path), claude_lines(**retries)), exit_code=1
    )
    assert no_answer(judged) == (
        "The evaluator exited with code 1:\n"
        "Failed to provide valid structured output after 5 attempts "
        "(error_max_structured_output_retries)"
    )


def test_claude_without_a_result_line_gives_no_answer(tmp_path: Path) -> None:
    task = with_log(make_task(tmp_path), ["error: unknown option '--no-such-flag'"])
    judged = claude().judge_answer(task, exit_code=1)
    assert no_answer(judged) == (
        "The evaluator exited with code 1:\n"
        "Claude Code ended without a result.\n"
        "error: unknown option '--no-such-flag'"
    )
    assert judged.notes == ["Claude Code reported no usage: tokens and cost are unknown."]


def test_claude_judge_invocation_offers_no_tool_but_structured_output(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)  # as root, where a bypass needs IS_SANDBOX
    agent = claude(
        binary="~/bin/claude",
        permission_mode="bypassPermissions",  # the runs' mode; an evaluator gets dontAsk
        max_turns=50,
        max_budget_usd=0.5,
        args=["--effort", "low"],
        seed_files={".claude/.credentials.json": login_file(tmp_path)},
        env={"ANTHROPIC_BASE_URL": "http://127.0.0.1:9"},
    )
    task = make_task(tmp_path)
    invocation = agent.judge_invocation(task)
    home = task.folder / "claude-home"
    assert invocation.argv == [
        str(Path("~/bin/claude").expanduser()), "-p", "--output-format", "stream-json",
        "--verbose", "--model", CLAUDE_MODEL,
        "--json-schema", json.dumps(SCHEMA, separators=(",", ":")),
        "--tools", "", "--strict-mcp-config", "--permission-mode", "dontAsk",
        "--max-budget-usd", "0.5", "--effort", "low",
    ]  # fmt: skip
    assert invocation.stdin_path == task.prompt_file
    # A run's environment (its own HOME and configuration folder), but no IS_SANDBOX:
    # in judge mode nothing bypasses permissions.
    run_env = agent.invocation(judge_context(task, CLAUDE_MODEL)).env
    assert run_env.pop("IS_SANDBOX") == "1"
    assert invocation.env == run_env
    assert (run_env["HOME"], run_env["CLAUDE_CONFIG_DIR"]) == (str(home), str(home / ".claude"))
    assert home_files(home) == [".claude/.credentials.json"]
    agent.judge_cleanup(task)
    assert home_files(home) == []


@pytest.mark.parametrize("flag", ["--tools", "--mcp-config", "--json-schema"])
def test_claude_args_that_would_add_tools_or_a_schema_keep_it_from_judging(
    tmp_path: Path, flag: str
) -> None:
    entry = {"kind": "claude_code", "models": [CLAUDE_MODEL], "args": [f"{flag}=x"]}
    ClaudeCodeAgent.check_entry(entry)  # fine for runs
    reason = ClaudeCodeAgent.judge_unavailable_reason(entry)
    assert reason.startswith(f"This agent's 'args' give {flag}, which judge mode cannot take")
    with pytest.raises(AgentSetupError) as refused:
        claude(args=[f"{flag}=x"]).judge_invocation(make_task(tmp_path))
    assert str(refused.value) == reason
    assert ClaudeCodeAgent.judge_unavailable_reason({**entry, "args": ["--effort", "low"]}) == ""


# --- the real codex against the scripted OpenAI server ---------------------------------


@pytest.fixture
def codex_judge(tmp_path: Path) -> Iterator[Any]:
    """codex:gpt-5.5 in judge mode against a scripted server: make(script) -> (agent, server)."""
    binary = require_tool(NODE_BIN / "codex", HOW_TO_GET)
    servers: list[OpenAIServer] = []
    home = tmp_path / "user-home"  # the user's ~/.codex must stay untouched
    home.mkdir()

    def make(script: Any, *, model: str = CODEX_MODEL) -> tuple[CodexAgent, OpenAIServer]:
        server = OpenAIServer(script).start()
        servers.append(server)
        # Codex retries a failed request itself; once is enough here.
        args = openai_server.codex_provider_args(
            server, request_max_retries="0", stream_max_retries="0"
        )
        entry = {
            "kind": "codex",
            "models": [model],
            "binary": str(binary),
            "args": args,
            "env": {"FAKE_KEY": "x", "HOME": str(home)},
        }
        CodexAgent.check_entry(entry)
        return CodexAgent.from_entry("codex", entry, model), server

    yield make
    for server in servers:
        server.close()
    assert not (home / ".codex").exists()


@pytest.mark.cli
def test_real_codex_answers_with_the_object_the_model_sent_priced_from_its_usage(
    codex_judge: Any, tmp_path: Path
) -> None:
    usage = Usage(input_tokens=1200, output_tokens=60, cache_read_tokens=300, reasoning_tokens=9)
    agent, server = codex_judge(
        openai_server.by_prompt({PROMPT_KEY: [Text(json.dumps(VERDICT), usage=usage)]})
    )
    task = make_task(tmp_path)
    judged = judge(agent, task)
    assert (judged.answer, judged.error) == (VERDICT, ""), task.log_path.read_text()
    assert not server.unscripted
    [request] = server.model_requests
    # The prompt went in on stdin, the schema as the strict json_schema text format.
    assert openai_server.last_user_text(request).strip() == PROMPT.strip()
    text_format = request["text"]["format"]
    assert (text_format["type"], text_format["strict"]) == ("json_schema", True)
    assert text_format["schema"] == SCHEMA
    assert json.loads((task.folder / "answer.txt").read_text()) == VERDICT
    # Usage as the server reported it (cached reads out of input), priced from the table.
    assert judged.usage == TokenUsage(input_tokens=900, cache_read_tokens=300, output_tokens=60)
    assert judged.cost_usd == gpt55_cost(judged.usage) > 0
    # Codex wrote its session in the call's own CODEX_HOME.
    assert list((task.folder / "codex-home" / "sessions").rglob("rollout-*.jsonl"))


@pytest.mark.cli
def test_real_codex_replying_in_plain_text_gives_no_answer(
    codex_judge: Any, tmp_path: Path
) -> None:
    agent, server = codex_judge(openai_server.by_prompt({PROMPT_KEY: [Text("not json")]}))
    judged = judge(agent, make_task(tmp_path))
    assert (judged.answer, judged.error) == (None, "The evaluator's answer is not JSON: not json")
    assert judged.raw == "not json"
    assert judged.cost_usd is not None and judged.cost_usd > 0


@pytest.mark.cli
def test_real_codex_api_error_gives_no_answer_with_the_servers_message(
    codex_judge: Any, tmp_path: Path
) -> None:
    message = "The model gpt-5.5 is not available to you."
    agent, server = codex_judge(lambda body: HttpError(400, message))
    judged = judge(agent, make_task(tmp_path))
    assert no_answer(judged) == f"The evaluator exited with code 1:\n{message}"
    assert judged.cost_usd is None and judged.usage == TokenUsage()


# --- the real claude against the scripted Anthropic server -----------------------------


@pytest.fixture
def claude_judge(tmp_path: Path) -> Iterator[Any]:
    """claude in judge mode against a scripted server: make(script) -> (agent, server)."""
    binary = require_tool(NODE_BIN / "claude", HOW_TO_GET)
    servers: list[AnthropicServer] = []

    def make(script: Any) -> tuple[ClaudeCodeAgent, AnthropicServer]:
        server = AnthropicServer(script).start()
        servers.append(server)
        env = {
            "ANTHROPIC_BASE_URL": server.url,
            "ANTHROPIC_API_KEY": "fake-key",
            # Claude retries a 5xx itself, with back-off; once is enough here.
            "CLAUDE_CODE_MAX_RETRIES": "0",
        }
        entry = {"kind": "claude_code", "models": [CLAUDE_MODEL], "binary": str(binary), "env": env}
        ClaudeCodeAgent.check_entry(entry)
        return ClaudeCodeAgent.from_entry("claude", entry, CLAUDE_MODEL), server

    yield make
    for server in servers:
        server.close()


@pytest.mark.cli
def test_real_claude_answers_with_the_structured_output_call_in_one_request(
    claude_judge: Any, tmp_path: Path
) -> None:
    usage = Usage(
        input_tokens=40, output_tokens=30, cache_read_tokens=500, cache_write_5m_tokens=60
    )
    agent, server = claude_judge(
        anthropic_server.by_prompt({PROMPT_KEY: [ToolCall("StructuredOutput", VERDICT, usage)]})
    )
    task = make_task(tmp_path)
    judged = judge(agent, task)
    assert (judged.answer, judged.error) == (VERDICT, ""), task.log_path.read_text()
    assert not server.unscripted
    # One model request: the tool call ends the session, nothing is asked after it.
    [request] = server.model_requests
    assert [tool["name"] for tool in request["tools"]] == ["StructuredOutput"]
    assert request["tools"][0]["input_schema"]["properties"] == SCHEMA["properties"]
    assert anthropic_server.conversation_position(request)[0].strip() == PROMPT.strip()
    # Usage as the server reported it; the cost is Claude's own, the time its API time.
    assert judged.usage == TokenUsage(
        input_tokens=40, output_tokens=30, cache_read_tokens=500, cache_write_5m_tokens=60
    )
    # One JSON event a line (2.1.3xx writes "type" last in the result line).
    events = [json.loads(t) for t in task.log_path.read_text().splitlines() if t.startswith("{")]
    [result] = [event for event in events if event.get("type") == "result"]
    assert judged.cost_usd == Decimal(str(result["total_cost_usd"])) > 0
    assert judged.model_seconds == round(result["duration_api_ms"] / 1000, 3)
    assert result["structured_output"] == VERDICT
    # Claude's session stayed in the call's own HOME.
    assert list((task.folder / "claude-home" / ".claude" / "projects").glob("*/*.jsonl"))


@pytest.mark.cli
def test_real_claude_replying_in_plain_text_gives_no_answer(
    claude_judge: Any, tmp_path: Path
) -> None:
    # Claude asks once more for the StructuredOutput call (a new prompt), then gives up.
    agent, server = claude_judge(
        anthropic_server.by_prompt({PROMPT_KEY: [Text("not json")]}, fallback=Text("not json"))
    )
    judged = judge(agent, make_task(tmp_path))
    assert (judged.answer, judged.error) == (None, "The evaluator's answer is not JSON: not json")
    assert len(server.model_requests) == 2
    nudge = anthropic_server.conversation_position(server.model_requests[1])[0]
    assert "StructuredOutput" in nudge
    assert judged.cost_usd is not None and judged.cost_usd > 0


@pytest.mark.cli
@pytest.mark.parametrize(
    ("status", "message"),
    [(500, "The judge server broke."), (400, "messages.0.content: bad block type")],
)
def test_real_claude_api_error_gives_no_answer_with_the_servers_message(
    claude_judge: Any, tmp_path: Path, status: int, message: str
) -> None:
    agent, server = claude_judge(lambda body: HttpError(status, message))
    judged = judge(agent, make_task(tmp_path))
    assert no_answer(judged).startswith(
        f"The evaluator exited with code 1:\nAPI Error: {status} {message}"
    )
    assert judged.cost_usd == Decimal(0)


# --- command: small Python judges --------------------------------------------------------

GOOD_JUDGE = """
import json, os, sys
task_file, answer_file, model, folder = sys.argv[1:5]
task = json.load(open(task_file))
assert task_file == os.environ["REPLAYS_TASK_FILE"] and folder == os.getcwd()
assert sys.stdin.read() == task["prompt"]
answer = {"verdict": "better", "reasons": [model, task["task"], str(len(task["inputs"]))]}
json.dump(answer, open(os.environ["REPLAYS_ANSWER_FILE"], "w"))
json.dump({"input_tokens": 1000, "output_tokens": 100}, open(os.environ["REPLAYS_USAGE_FILE"], "w"))
print("judged", task["task"])
"""


def command_entry(tmp_path: Path, source: str | None, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "kind": "command",
        "command": [PYTHON, "agent.py"],
        "models": ["gpt-5"],
    }
    if source is not None:
        script = tmp_path / "judge.py"
        script.write_text(source)
        entry["judge_command"] = [
            PYTHON, str(script), "{task_file}", "{answer_file}", "{model}", "{folder}"
        ]  # fmt: skip
    entry.update(extra)
    CommandAgent.check_entry(entry)
    return entry


def command(entry: dict[str, Any]) -> CommandAgent:
    return CommandAgent.from_entry("judge", entry, "gpt-5")


def test_a_command_judge_reads_the_task_file_and_writes_its_answer(tmp_path: Path) -> None:
    entry = command_entry(tmp_path, GOOD_JUDGE)
    assert CommandAgent.judge_unavailable_reason(entry) == ""
    task = make_task(tmp_path)
    judged = judge(command(entry), task)
    assert judged.error == "", task.log_path.read_text()
    assert judged.answer == {"verdict": "better", "reasons": ["gpt-5", "verdict-1", "2"]}
    # Usage reported as for runs; gpt-5 priced from the table.
    assert judged.usage == TokenUsage(input_tokens=1000, output_tokens=100)
    assert judged.cost_usd is not None and judged.cost_usd > 0
    task_file = task.folder / "task.json"
    assert json.loads(task_file.read_text()) == {
        "task": "verdict-1",
        "prompt": PROMPT,
        "schema": SCHEMA,
        "inputs": {"candidates": ["run-1", "run-2"], "cost_usd": "0.25"},
    }
    assert stat.S_IMODE(task_file.stat().st_mode) == 0o600
    assert "judged verdict-1" in task.log_path.read_text()


def test_a_command_judges_invocation_names_its_files(tmp_path: Path) -> None:
    entry = command_entry(tmp_path, GOOD_JUDGE, env={"JUDGE_MODEL": "{model}", "K": "v"})
    task = make_task(tmp_path)
    invocation = command(entry).judge_invocation(task)
    folder = task.folder
    assert invocation.argv[2:] == [
        str(folder / "task.json"), str(folder / "answer.json"), "gpt-5", str(folder)
    ]  # fmt: skip
    assert invocation.env == {
        "JUDGE_MODEL": "gpt-5",
        "K": "v",
        "REPLAYS_TASK_FILE": str(folder / "task.json"),
        "REPLAYS_ANSWER_FILE": str(folder / "answer.json"),
        "REPLAYS_USAGE_FILE": str(folder / "usage.json"),
    }
    assert invocation.stdin_path == task.prompt_file


@pytest.mark.parametrize(
    ("source", "error"),
    [
        (
            "import os; open(os.environ['REPLAYS_ANSWER_FILE'], 'w').write('verdict: better')",
            "The evaluator's answer is not JSON: verdict: better",
        ),
        (
            "import os; open(os.environ['REPLAYS_ANSWER_FILE'], 'w').write('[\"better\"]')",
            'The evaluator\'s answer is a JSON list, not an object: ["better"]',
        ),
        ("print('thinking...')", "The evaluator gave no answer."),
        (
            "import os; open(os.environ['REPLAYS_ANSWER_FILE'], 'w').write(' ' * (1024 * 1024 + 1))",
            "The evaluator's answer file answer.json is larger than 1 MiB: it was not read.",
        ),
        (
            "import os; os.mkfifo(os.environ['REPLAYS_ANSWER_FILE'])",
            "The evaluator's answer answer.json is not a regular file.",
        ),
        (
            "import sys; print('no key for the judge'); sys.exit(3)",
            "The evaluator exited with code 3:\nno key for the judge",
        ),
    ],
)
def test_a_command_judge_without_a_usable_answer_gives_none_and_says_why(
    tmp_path: Path, source: str, error: str
) -> None:
    judged = judge(command(command_entry(tmp_path, source)), make_task(tmp_path))
    assert (judged.answer, judged.error) == (None, error)


def test_a_command_agent_without_judge_command_cannot_judge(tmp_path: Path) -> None:
    entry = command_entry(tmp_path, None)
    assert CommandAgent.judge_unavailable_reason(entry) == "This agent has no judge_command."
    with pytest.raises(AgentSetupError, match="This agent has no judge_command."):
        command(entry).judge_invocation(make_task(tmp_path))
    missing = {**entry, "judge_command": [str(tmp_path / "no-judge-here"), "{task_file}"]}
    CommandAgent.check_entry(missing)
    assert CommandAgent.judge_unavailable_reason(missing) == (
        f"{tmp_path / 'no-judge-here'} does not exist."
    )


@pytest.mark.parametrize(
    "judge_command", ["python judge.py", [], [""], ["python", 1], None, {"argv": ["python"]}]
)
def test_a_malformed_judge_command_is_refused(tmp_path: Path, judge_command: Any) -> None:
    entry = {**command_entry(tmp_path, None), "judge_command": judge_command}
    with pytest.raises(ValueError, match="'judge_command' must be a non-empty list of strings"):
        CommandAgent.check_entry(entry)
