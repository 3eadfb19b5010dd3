"""The gemini, opencode and pi agent kinds: their settings entries, the logins they can
tell, the processes they start, and their reading of what the CLIs wrote (the lines below
are what gemini 0.61.0, opencode 1.18.33 and pi 0.73.1 wrote against the scripted servers,
trimmed). Real runs of the three are in tests/test_more_agents_real_cli.py.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from replays import agents, pricing
from replays.agents.base import AgentSetupError, ForkedSession, JudgeTask, RunContext, answer_text
from replays.agents.gemini import GeminiAgent
from replays.agents.opencode import OpenCodeAgent
from replays.agents.pi import PiAgent
from replays.agents.problems import MISSING, READY, UNKNOWN, SetupKind
from replays.runspec import RunSpec
from replays.transcripts.base import TokenUsage

GEMINI_OK = "\n".join(
    [
        "YOLO mode is enabled. All tool calls will be automatically approved.",
        '{"type":"init","timestamp":"2026-12-01T22:56:37.258Z","session_id":"5bbc0923-5715-4b98-8888-aaef43907243","model":"gemini-2.5-pro"}',  # noqa: E501
        '{"type":"message","timestamp":"2026-12-01T22:56:37.260Z","role":"user","content":"make hello"}',  # noqa: E501
        '{"type":"message","timestamp":"2026-12-01T22:56:37.300Z","role":"assistant","content":"Let me ","delta":true}',  # noqa: E501
        '{"type":"message","timestamp":"2026-12-01T22:56:37.301Z","role":"assistant","content":"write it.","delta":true}',  # noqa: E501
        '{"type":"tool_use","timestamp":"2026-12-01T22:56:37.406Z","tool_name":"run_shell_command","tool_id":"run_shell_command_1","parameters":{"description":"Run a command","command":"echo hi > hello.txt && cat hello.txt"}}',  # noqa: E501
        '{"type":"tool_result","timestamp":"2026-12-01T22:56:37.611Z","tool_id":"run_shell_command_1","status":"success","output":"hi"}',  # noqa: E501
        '{"type":"message","timestamp":"2026-12-01T22:56:37.650Z","role":"assistant","content":"All done: ","delta":true}',  # noqa: E501
        '{"type":"message","timestamp":"2026-12-01T22:56:37.651Z","role":"assistant","content":"wrote hello.txt","delta":true}',  # noqa: E501
        '{"type":"result","timestamp":"2026-12-01T22:56:37.657Z","status":"success","stats":{"total_tokens":3400,"input_tokens":3300,"output_tokens":70,"cached":1100,"input":2200,"duration_ms":399,"tool_calls":1,"models":{"gemini-2.5-pro":{"total_tokens":3400,"input_tokens":3300,"output_tokens":70,"cached":1100,"input":2200}}}}',  # noqa: E501
    ]
)
GEMINI_401 = "\n".join(
    [
        '{"type":"init","timestamp":"2026-12-01T23:21:28.045Z","session_id":"319e1c8b-44fd-43f7-83ae-e8874b9d3425","model":"gemini-2.5-flash"}',  # noqa: E501
        '{"type":"result","timestamp":"2026-12-01T23:21:28.130Z","status":"error","error":{"type":"unknown","message":"[API Error: {\\"error\\":{\\"code\\":401,\\"message\\":\\"API key not valid. Please pass a valid API key.\\",\\"status\\":\\"UNAUTHENTICATED\\"}}]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{"gemini-2.5-flash":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0}}}}',  # noqa: E501
        "Error when talking to Gemini API Full report available at: /tmp/gemini-client-error.json _ApiError: {...}",  # noqa: E501
    ]
)
GEMINI_QUOTA = '{"type":"result","timestamp":"2026-12-01T23:25:10.444Z","status":"error","error":{"type":"unknown","message":"[API Error: You exceeded your current quota]\\nPlease wait and try again later."},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}'  # noqa: E501
GEMINI_UNKNOWN_MODEL = "\n".join(
    [
        '{"type":"result","timestamp":"2026-12-01T23:25:16.179Z","status":"error","error":{"type":"unknown","message":"[API Error: models/gemini-9 is not found for API version v1beta]"},"stats":{"total_tokens":0,"input_tokens":0,"output_tokens":0,"cached":0,"input":0,"duration_ms":0,"tool_calls":0,"models":{}}}',  # noqa: E501
        "Error when talking to Gemini API ModelNotFoundError: models/gemini-9 is not found for API version v1beta",  # noqa: E501
    ]
)
GEMINI_NO_KEY = "\n".join(
    [
        "YOLO mode is enabled. All tool calls will be automatically approved.",
        "When using Gemini API, you must specify the GEMINI_API_KEY environment variable.",
        "Update your environment and try again (no reload needed if using .env)!",
    ]
)
OPENCODE_OK = "\n".join(
    [
        '{"type":"step_start","timestamp":1796165838410,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"type":"step-start"}}',  # noqa: E501
        '{"type":"tool_use","timestamp":1796165838589,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"type":"tool","tool":"bash","callID":"toolu_1","state":{"status":"completed","input":{"command":"echo hi > hello.txt && cat hello.txt"},"output":"hi\\n","metadata":{"output":"hi\\n","exit":0},"title":"echo hi"}}}',  # noqa: E501
        '{"type":"step_finish","timestamp":1796165838699,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"reason":"tool-calls","type":"step-finish","tokens":{"total":1550,"input":1000,"output":50,"reasoning":0,"cache":{"write":300,"read":200}},"cost":0.004935}}',  # noqa: E501
        '{"type":"step_start","timestamp":1796165838953,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"type":"step-start"}}',  # noqa: E501
        '{"type":"text","timestamp":1796165838953,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"type":"text","text":"All done: wrote hello.txt"}}',  # noqa: E501
        '{"type":"step_finish","timestamp":1796165839192,"sessionID":"ses_dcc2c669effeZojjdf45X3jQCe","part":{"reason":"stop","type":"step-finish","tokens":{"total":2140,"input":1200,"output":20,"reasoning":20,"cache":{"write":0,"read":900}},"cost":0}}',  # noqa: E501
    ]
)
OPENCODE_NO_KEY = '{"type":"error","timestamp":1796167762919,"sessionID":"ses_dcc0f06e5ffeT9FIgSzDwVcwI8","error":{"name":"ProviderAuthError","data":{"providerID":"anthropic","message":"Anthropic API key is missing. Pass it using the \'apiKey\' parameter or the ANTHROPIC_API_KEY environment variable."}}}'  # noqa: E501
OPENCODE_401 = '{"type":"error","timestamp":1796167769083,"sessionID":"ses_dcc0ef004ffemFnIVg1XNBjUXX","error":{"name":"APIError","data":{"message":"invalid x-api-key","statusCode":401,"isRetryable":false}}}'  # noqa: E501
OPENCODE_UNKNOWN_MODEL = "\n".join(
    [
        'timestamp=2026-12-01T23:37:43.248Z level=ERROR run=1a5d7cce message=failed ref=err_80161ded error="ProviderModelNotFoundError: Model not found: anthropic/claude-nonexistent-9. Did you mean: claude-haiku-4-5?"',  # noqa: E501
        '{"type":"error","timestamp":1796168263249,"sessionID":"ses_dcc075d13ffesWSd6tNpgFOb5Q","error":{"name":"UnknownError","data":{"message":"Unexpected server error. Check server logs for details.","ref":"err_80161ded"}}}',  # noqa: E501
    ]
)
PI_OK = "\n".join(
    [
        '{"type":"session","version":3,"id":"01a233d4-69a0-708f-adde-67f9b6a96470","timestamp":"2026-12-01T22:58:08.417Z","cwd":"/tmp/w"}',  # noqa: E501
        '{"type":"agent_start"}',
        '{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"make hello"}],"timestamp":1796165888452}}',  # noqa: E501
        '{"type":"message_end","message":{"role":"assistant","content":[{"type":"toolCall","id":"call_1","name":"bash","arguments":{"command":"echo hi > hello.txt && cat hello.txt"}}],"api":"openai-responses","provider":"openai","model":"gpt-5","usage":{"input":800,"output":50,"cacheRead":200,"cacheWrite":0,"totalTokens":1050,"cost":{"input":0.001,"output":0.0005,"cacheRead":0.000025,"cacheWrite":0,"total":0.001525}},"stopReason":"toolUse","timestamp":1796165888574}}',  # noqa: E501
        '{"type":"tool_execution_start","toolCallId":"call_1","toolName":"bash","args":{"command":"echo hi > hello.txt && cat hello.txt"}}',  # noqa: E501
        '{"type":"tool_execution_end","toolCallId":"call_1","toolName":"bash","result":{"content":[{"type":"text","text":"hi\\n"}]},"isError":false}',  # noqa: E501
        '{"type":"message_end","message":{"role":"assistant","content":[{"type":"text","text":"All done: wrote hello.txt"}],"api":"openai-responses","provider":"openai","model":"gpt-5","usage":{"input":300,"output":20,"cacheRead":900,"cacheWrite":0,"totalTokens":1230,"cost":{"total":0}},"stopReason":"stop","timestamp":1796165888645}}',  # noqa: E501
        '{"type":"agent_end","messages":[]}',
    ]
)
PI_401 = "\n".join(
    [
        '{"type":"session","version":3,"id":"01a233d4-0000-7000-8000-000000000001","timestamp":"2026-12-01T23:29:43.000Z","cwd":"/tmp/w"}',  # noqa: E501
        '{"type":"message_end","message":{"role":"assistant","content":[],"api":"openai-responses","provider":"openai","model":"gpt-5","usage":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"totalTokens":0,"cost":{"total":0}},"stopReason":"error","timestamp":1796167783287,"errorMessage":"401 Incorrect API key provided"}}',  # noqa: E501
        '{"type":"agent_end","messages":[]}',
    ]
)
PI_NO_KEY = (
    "No API key found for openai.\n\nUse /login to log into a provider via OAuth or API key."
)


def context(tmp_path: Path, log: str, **extra: Any) -> RunContext:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    log_path = run_dir / "agent.log"
    log_path.write_text(log + "\n")
    request = run_dir / "request.md"
    request.write_text("make hello")
    return RunContext(
        run_id=1, model="m", spec=RunSpec(), run_dir=run_dir, workspace=tmp_path / "work",
        request_file=request, log_path=log_path, **extra,
    )  # fmt: skip


def gemini(**entry: Any) -> GeminiAgent:
    return GeminiAgent.from_entry(
        "gemini", {"kind": "gemini", "models": [], **entry}, "gemini-2.5-pro"
    )


def opencode(**entry: Any) -> OpenCodeAgent:
    return OpenCodeAgent.from_entry(
        "opencode", {"kind": "opencode", "models": [], **entry}, "anthropic/claude-sonnet-4-5"
    )


def pi(**entry: Any) -> PiAgent:
    return PiAgent.from_entry("pi", {"kind": "pi", "models": [], **entry}, "openai/gpt-5")


# --- the settings entries ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "entry", "message"),
    [
        (GeminiAgent, {"args": ["--model", "x"]}, "must not give --model"),
        (GeminiAgent, {"args": ["-p", "x"]}, "must not give -p"),
        (GeminiAgent, {"env": {"HOME": "/x"}}, "must not set HOME"),
        (GeminiAgent, {"approval_mode": "whatever"}, "'approval_mode' must be one of"),
        (GeminiAgent, {"settings": []}, "'settings' must be a JSON object"),
        (GeminiAgent, {"seed_files": {".gemini/settings.json": "/x"}}, "as 'settings'"),
        (GeminiAgent, {"discover_models": True}, "does not list its models"),
        (OpenCodeAgent, {"args": ["--session=ses_x"]}, "must not give --session"),
        (OpenCodeAgent, {"env": {"XDG_DATA_HOME": "/x"}}, "must not set XDG_DATA_HOME"),
        (OpenCodeAgent, {"config": "x"}, "'config' must be a JSON object"),
        (OpenCodeAgent, {"auto_approve": "yes"}, "'auto_approve' must be true or false"),
        (PiAgent, {"args": ["--fork", "x"]}, "must not give --fork"),
        (PiAgent, {"args": ["--api-key", "x"]}, "must not give --api-key"),
        (PiAgent, {"env": {"PI_CODING_AGENT_DIR": "/x"}}, "must not set PI_CODING_AGENT_DIR"),
        (PiAgent, {"models_json": [1]}, "'models_json' must be a JSON object"),
        (PiAgent, {"models_json": {}, "seed_files": {".pi/agent/models.json": "/x"}}, "either in"),
    ],
)
def test_entries_that_would_break_a_run_are_refused_saying_why(
    kind: Any, entry: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        kind.check_entry({"kind": kind.kind, "models": ["m"], **entry})


def test_the_three_kinds_are_offered_with_their_models(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_AGENTS = {
        "g": {"kind": "gemini", "binary": "/bin/true", "models": ["gemini-2.5-pro"]},
        "o": {"kind": "opencode", "binary": "/bin/true", "models": ["anthropic/claude-sonnet-4-5"]},
        "p": {
            "kind": "pi",
            "binary": "/bin/true",
            "models": [{"id": "openai/gpt-5", "label": "GPT-5 in pi"}],
        },
    }
    found = {info.id: info for info in agents.discover_models()}
    assert (found["g:gemini-2.5-pro"].kind, found["o:anthropic/claude-sonnet-4-5"].kind) == (
        "gemini",
        "opencode",
    )
    assert found["p:openai/gpt-5"].label == "GPT-5 in pi"
    for model_id in ("g:gemini-2.5-pro", "o:anthropic/claude-sonnet-4-5", "p:openai/gpt-5"):
        assert agents.judge_unavailable_reason(found[model_id]) == ""


@pytest.mark.parametrize(
    ("kind", "entry", "state"),
    [
        (GeminiAgent, {"env": {"GEMINI_API_KEY": "k"}}, READY),
        (GeminiAgent, {"seed_files": {".gemini/oauth_creds.json": "/x"}}, READY),
        (GeminiAgent, {}, MISSING),
        (
            OpenCodeAgent,
            {"models": ["anthropic/claude-sonnet-4-5"], "env": {"ANTHROPIC_API_KEY": "k"}},
            READY,
        ),
        (
            OpenCodeAgent,
            {
                "models": ["anthropic/x"],
                "config": {"provider": {"anthropic": {"options": {"apiKey": "k"}}}},
            },
            READY,
        ),
        (
            OpenCodeAgent,
            {"models": ["anthropic/x"], "seed_files": {".local/share/opencode/auth.json": "/x"}},
            READY,
        ),
        (
            OpenCodeAgent,
            {"models": ["anthropic/x", "openai/gpt-5"], "env": {"ANTHROPIC_API_KEY": "k"}},
            MISSING,
        ),
        (OpenCodeAgent, {"models": ["packyapi/gpt-5.6-sol"]}, UNKNOWN),
        (PiAgent, {"models": ["openai/gpt-5"], "env": {"OPENAI_API_KEY": "k"}}, READY),
        (
            PiAgent,
            {"models": ["openai/gpt-5"], "models_json": {"providers": {"openai": {"apiKey": "k"}}}},
            READY,
        ),
        (PiAgent, {"models": ["anthropic/claude-sonnet-4-5"]}, MISSING),
        (PiAgent, {"models": ["ollama/mistral"]}, UNKNOWN),
    ],
)
def test_each_kind_tells_whether_its_runs_will_have_a_login(
    kind: Any, entry: dict[str, Any], state: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("GEMINI_API_KEY", "GOOGLE_API_KEY", "GOOGLE_GENAI_USE_VERTEXAI", "GOOGLE_GENAI_USE_GCA",
                 "GOOGLE_CLOUD_PROJECT", "ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN", "OPENAI_API_KEY",
                 "OPENCODE_AUTH_CONTENT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    login = kind.login({"kind": kind.kind, "models": ["m"], **entry})
    assert login.state == state, login.message
    if state == MISSING:
        assert "REPLAYS_AGENTS_FILE" in login.message


# --- the processes ------------------------------------------------------------------------


def test_gemini_runs_headless_in_its_own_home_with_the_request_on_stdin(tmp_path: Path) -> None:
    agent = gemini(
        env={"GEMINI_API_KEY": "k"}, args=["--debug"], settings={"general": {"vimMode": True}}
    )
    run = context(tmp_path, "")

    invocation = agent.invocation(run)

    home = run.run_dir / "gemini-home"
    assert invocation.argv == [
        "gemini", "-m", "gemini-2.5-pro", "--output-format", "stream-json",
        "--approval-mode", "yolo", "--skip-trust", "--debug",
    ]  # fmt: skip
    assert invocation.stdin_path == run.request_file and "make hello" not in invocation.argv
    assert invocation.env == {"GEMINI_API_KEY": "k", "HOME": str(home)}
    written = json.loads((home / ".gemini" / "settings.json").read_text())
    assert written["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert written["general"] == {"vimMode": True, "disableAutoUpdate": True}
    assert written["privacy"]["usageStatisticsEnabled"] is False
    assert oct((home / ".gemini" / "settings.json").stat().st_mode & 0o777) == "0o600"


def test_gemini_resumes_its_session_and_finds_a_forked_one_as_its_project(tmp_path: Path) -> None:
    run = context(tmp_path, "", resume_session="5bbc0923-5715-4b98-8888-aaef43907243")
    assert gemini().invocation(run).argv[-3:] == [
        "--resume",
        "5bbc0923-5715-4b98-8888-aaef43907243",
        "--skip-trust",
    ]

    cwd = tmp_path / "work" / "pkg"
    fork = ForkedSession(tool="gemini", session_id="d9a6efd8", text='{"sessionId":"d9a6efd8"}\n', file_name="session-x-d9a6efd8.jsonl", cwd=cwd)  # fmt: skip
    forked = context(tmp_path, "", fork=fork)
    argv = gemini().invocation(forked).argv
    config = forked.run_dir / "gemini-home" / ".gemini"
    assert argv[argv.index("--resume") + 1] == "d9a6efd8"
    assert json.loads((config / "projects.json").read_text()) == {"projects": {str(cwd): "replays"}}
    assert (config / "tmp" / "replays" / ".project_root").read_text() == str(cwd)
    assert (
        config / "tmp" / "replays" / "chats" / "session-x-d9a6efd8.jsonl"
    ).read_text() == fork.text
    with pytest.raises(AgentSetupError, match="not a session"):
        gemini().invocation(context(tmp_path, "", resume_session="--help"))
    with pytest.raises(AgentSetupError, match="Gemini CLI cannot fork a pi session"):
        gemini().invocation(
            context(tmp_path, "", fork=ForkedSession("pi", "x", "", "x.jsonl", cwd))
        )


def test_opencode_keeps_everything_in_its_own_home_and_imports_a_fork_first(tmp_path: Path) -> None:
    agent = opencode(
        env={"ANTHROPIC_API_KEY": "k"},
        config={"provider": {"anthropic": {"options": {"baseURL": "http://x"}}}},
    )
    cwd = tmp_path / "work"
    fork = ForkedSession(
        tool="opencode",
        session_id="ses_abc",
        text='{"info":{}}\n',
        file_name="ses_abc.json",
        cwd=cwd,
    )
    run = context(tmp_path, "", fork=fork)

    invocation = agent.invocation(run)

    home = run.run_dir / "opencode-home"
    assert invocation.argv == [
        "opencode", "run", "--format", "json", "-m", "anthropic/claude-sonnet-4-5",
        "--print-logs", "--log-level", "ERROR", "--session", "ses_abc", "--fork", "--auto",
    ]  # fmt: skip
    assert invocation.before == (["opencode", "import", str(run.run_dir / "opencode-fork.json")],)
    assert (run.run_dir / "opencode-fork.json").read_text() == fork.text
    assert invocation.env["HOME"] == str(home)
    assert invocation.env["XDG_DATA_HOME"] == str(home / ".local" / "share")
    assert invocation.env["OPENCODE_DISABLE_MODELS_FETCH"] == "1"
    config = json.loads(invocation.env["OPENCODE_CONFIG_CONTENT"])
    assert config["provider"]["anthropic"]["options"]["baseURL"] == "http://x"
    assert (config["autoupdate"], config["share"], config["agent"]["title"]) == (
        False,
        "disabled",
        {"disable": True},
    )
    resumed = agent.invocation(context(tmp_path, "", resume_session="ses_def"))
    assert resumed.argv[-3:] == ["--session", "ses_def", "--auto"] and resumed.before == ()


def test_pi_keeps_its_folder_in_its_own_home_and_forks_a_copied_file(tmp_path: Path) -> None:
    agent = pi(
        env={"OPENAI_API_KEY": "k"},
        models_json={"providers": {"openai": {"baseUrl": "http://x/v1"}}},
        args=["--thinking", "low"],
    )
    cwd = tmp_path / "work"
    fork = ForkedSession(
        tool="pi", session_id="01a2", text='{"type":"session"}\n', file_name="t_01a2.jsonl", cwd=cwd
    )
    run = context(tmp_path, "", fork=fork)

    invocation = agent.invocation(run)

    home = run.run_dir / "pi-home"
    copy = run.run_dir / "pi-fork" / "t_01a2.jsonl"
    assert invocation.argv == [
        "pi",
        "-p",
        "--mode",
        "json",
        "--model",
        "openai/gpt-5",
        "--fork",
        str(copy),
        "--thinking",
        "low",
    ]
    assert copy.read_text() == fork.text
    assert invocation.env == {
        "OPENAI_API_KEY": "k", "HOME": str(home), "PI_CODING_AGENT_DIR": str(home / ".pi" / "agent"),
        "PI_OFFLINE": "1", "PI_TELEMETRY": "0",
    }  # fmt: skip
    assert (
        json.loads((home / ".pi" / "agent" / "models.json").read_text())["providers"]["openai"][
            "baseUrl"
        ]
        == "http://x/v1"
    )
    resumed = agent.invocation(
        context(tmp_path, "", resume_session="01a233d4-69a0-708f-adde-67f9b6a96470")
    )
    assert resumed.argv[6:8] == ["--session", "01a233d4-69a0-708f-adde-67f9b6a96470"]
    with pytest.raises(AgentSetupError, match="not a session"):
        agent.invocation(context(tmp_path, "", resume_session="../../etc/passwd"))


# --- what they wrote ------------------------------------------------------------------------


def test_gemini_outcome_is_its_last_answer_its_tokens_and_the_price_tables_cost(
    tmp_path: Path,
) -> None:
    agent = gemini()
    run = context(tmp_path, GEMINI_OK)

    outcome = agent.outcome(run, exit_code=0)

    assert outcome.final_message == "All done: wrote hello.txt"  # after the last tool call
    usage = TokenUsage(input_tokens=2200, output_tokens=100, cache_read_tokens=1100)  # 30 thoughts
    assert (outcome.usage, outcome.failed, outcome.setup) == (usage, False, None)
    assert outcome.cost_usd == pricing.cost_usd("gemini-2.5-pro", usage, pricing.load_price_table())
    assert agent.session_id(run) == "5bbc0923-5715-4b98-8888-aaef43907243"
    assert agent.render_log(GEMINI_OK).splitlines() == [
        "YOLO mode is enabled. All tool calls will be automatically approved.",
        "gemini session 5bbc0923-5715-4b98-8888-aaef43907243: model gemini-2.5-pro",
        "assistant: Let me write it.",
        "$ echo hi > hello.txt && cat hello.txt",
        "  success: hi",
        "assistant: All done: wrote hello.txt",
        "result: success, 3,300 input (1,100 cached), 70 output tokens",
    ]


@pytest.mark.parametrize(
    ("log", "exit_code", "kind", "words"),
    [
        (GEMINI_401, 145, SetupKind.CREDENTIALS, "API key not valid"),
        (GEMINI_QUOTA, 173, SetupKind.QUOTA, "You exceeded your current quota"),
        (GEMINI_UNKNOWN_MODEL, 1, SetupKind.UNKNOWN_MODEL, "models/gemini-9 is not found"),
        (GEMINI_NO_KEY, 41, SetupKind.NOT_LOGGED_IN, "must specify the GEMINI_API_KEY"),
    ],
)
def test_gemini_failures_that_are_setup_say_so(
    tmp_path: Path, log: str, exit_code: int, kind: SetupKind, words: str
) -> None:
    outcome = gemini().outcome(context(tmp_path, log), exit_code=exit_code)
    assert outcome.failed
    assert outcome.setup is not None and outcome.setup.kind == kind
    assert words in outcome.setup.words and words in outcome.error


def test_opencode_outcome_keeps_its_own_costs_and_prices_the_steps_it_did_not(
    tmp_path: Path,
) -> None:
    agent = opencode()
    run = context(tmp_path, OPENCODE_OK)

    outcome = agent.outcome(run, exit_code=0)

    first = TokenUsage(
        input_tokens=1000, output_tokens=50, cache_read_tokens=200, cache_write_5m_tokens=300
    )
    second = TokenUsage(
        input_tokens=1200, output_tokens=40, cache_read_tokens=900
    )  # reasoning is output
    assert outcome.usage == first + second
    table = pricing.load_price_table()
    assert outcome.cost_usd == Decimal("0.004935") + pricing.cost_usd(
        "anthropic/claude-sonnet-4-5", second, table
    )
    assert any("priced 1 of its model calls at $0" in note for note in outcome.notes)
    assert outcome.final_message == "All done: wrote hello.txt"
    assert agent.session_id(run) == "ses_dcc2c669effeZojjdf45X3jQCe"
    assert "$ echo hi > hello.txt && cat hello.txt" in agent.render_log(OPENCODE_OK)


@pytest.mark.parametrize(
    ("log", "kind", "words"),
    [
        (OPENCODE_NO_KEY, SetupKind.NOT_LOGGED_IN, "Anthropic API key is missing"),
        (OPENCODE_401, SetupKind.CREDENTIALS, "invalid x-api-key"),
        (
            OPENCODE_UNKNOWN_MODEL,
            SetupKind.UNKNOWN_MODEL,
            "Model not found: anthropic/claude-nonexistent-9",
        ),
    ],
)
def test_opencode_failures_that_are_setup_say_so(
    tmp_path: Path, log: str, kind: SetupKind, words: str
) -> None:
    outcome = opencode().outcome(context(tmp_path, log), exit_code=1)
    assert outcome.failed
    assert outcome.setup is not None and outcome.setup.kind == kind
    assert words in outcome.error  # its "Unexpected server error" says nothing: the log does


def test_pi_outcome_keeps_its_own_costs_and_a_failed_call_fails_though_it_exits_0(
    tmp_path: Path,
) -> None:
    agent = pi()
    run = context(tmp_path, PI_OK)

    outcome = agent.outcome(run, exit_code=0)

    first = TokenUsage(input_tokens=800, output_tokens=50, cache_read_tokens=200)
    second = TokenUsage(
        input_tokens=300, output_tokens=30, cache_read_tokens=900
    )  # 10 beyond: output
    assert outcome.usage == first + second
    table = pricing.load_price_table()
    assert outcome.cost_usd == Decimal("0.001525") + pricing.cost_usd("gpt-5", second, table)
    assert (outcome.final_message, outcome.failed) == ("All done: wrote hello.txt", False)
    assert agent.session_id(run) == "01a233d4-69a0-708f-adde-67f9b6a96470"
    assert agent.render_log(PI_OK).splitlines()[:4] == [
        "pi session 01a233d4-69a0-708f-adde-67f9b6a96470",
        "model call (toolUse): 800 input, 200 cached, 50 output tokens, $0.001525",
        "$ echo hi > hello.txt && cat hello.txt",
        "  ok: hi",
    ]

    failed = agent.outcome(context(tmp_path, PI_401), exit_code=0)
    assert failed.failed and failed.error == "401 Incorrect API key provided"
    assert failed.setup is not None and failed.setup.kind == SetupKind.CREDENTIALS
    no_key = agent.outcome(context(tmp_path, PI_NO_KEY), exit_code=1)
    assert no_key.setup is not None and no_key.setup.kind == SetupKind.NOT_LOGGED_IN
    assert no_key.setup.words == "No API key found for openai."


# --- judge mode ---------------------------------------------------------------------------------


def test_a_judge_answer_is_read_from_a_code_block_or_after_a_word() -> None:
    answer = '{"preferred": "A"}'
    assert answer_text(answer) == answer
    assert answer_text(f"```json\n{answer}\n```") == answer
    assert answer_text(f"Here is my verdict:\n{answer}\nThanks.") == answer
    assert answer_text("no object here") == "no object here"


def test_gemini_judges_with_the_schema_as_structured_output_and_no_tool(tmp_path: Path) -> None:
    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / "prompt.md").write_text("judge")
    schema = {
        "type": "object",
        "properties": {"preferred": {"type": "string"}},
        "required": ["preferred"],
        "additionalProperties": False,
    }
    task = JudgeTask(name="verdict-1", prompt="judge", schema=schema, inputs={}, folder=folder,
                     log_path=folder / "judge.log", prompt_file=folder / "prompt.md")  # fmt: skip

    invocation = gemini().judge_invocation(task)

    assert invocation.argv[invocation.argv.index("--approval-mode") + 1] == "default"
    written = json.loads((folder / "gemini-home" / ".gemini" / "settings.json").read_text())
    assert written["tools"] == {"core": []}
    [override] = written["modelConfigs"]["overrides"]
    assert override["match"] == {"model": "gemini-2.5-pro"}
    assert override["modelConfig"]["generateContentConfig"] == {
        "responseMimeType": "application/json", "responseJsonSchema": schema
    }  # fmt: skip
    (folder / "judge.log").write_text(
        '{"type":"init","session_id":"s"}\n'
        '{"type":"message","role":"assistant","content":"{\\"preferred\\": \\"B\\"}","delta":true}\n'
        '{"type":"result","status":"success","stats":{"models":{"gemini-2.5-pro":{"total_tokens":120,"input_tokens":100,"output_tokens":20,"cached":0,"input":100}}}}\n'
    )
    judged = gemini().judge_answer(task, exit_code=0)
    assert judged.answer == {"preferred": "B"} and judged.cost_usd is not None


def test_opencode_and_pi_judge_with_no_tool(tmp_path: Path) -> None:
    folder = tmp_path / "judge"
    folder.mkdir()
    (folder / "prompt.md").write_text("judge")
    task = JudgeTask(name="checks", prompt="judge", schema={}, inputs={}, folder=folder,
                     log_path=folder / "judge.log", prompt_file=folder / "prompt.md")  # fmt: skip
    opencode_call = opencode().judge_invocation(task)
    assert opencode_call.argv[opencode_call.argv.index("--agent") + 1] == "replays-judge"
    config = json.loads(opencode_call.env["OPENCODE_CONFIG_CONTENT"])
    assert config["agent"]["replays-judge"]["tools"] == {"*": False}
    assert "--auto" not in opencode_call.argv
    assert "--no-tools" in pi().judge_invocation(task).argv
