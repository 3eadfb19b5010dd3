"""The codex agent kind: its settings entry, its reading of `codex exec --json`, and real
runs of the Codex CLI (tests/node, `make node`) against the scripted OpenAI server.

The end-to-end tests go the user's way: `manage.py replay ... --yes --wait` with an
agents file that points codex at the fake server on loopback, so dispatch, the real
coordinator process, the worktree, the diff and the final write are all real.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import psutil
import pytest

from replays import agents, processes
from replays.agents.base import AgentSetupError, RunContext
from replays.agents.codex import CodexAgent
from replays.models import FailureCode, Run, RunStatus
from replays.runspec import RunSpec
from replays.transcripts.base import TokenUsage
from tests.conftest import NODE_BIN, require_tool
from tests.fakes.openai_server import OpenAIServer, last_user_text
from tests.fakes.scripting import Hang, HttpError, Script, Text, Usage, shell

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
HOW_TO_GET_CODEX = "make node"

# What codex 0.169.0 wrote for a run that ran one command and answered (stdout and
# stderr interleaved, as in agent.log), trimmed to one line per event.
RECORDED = "\n".join(
    [
        '{"type":"thread.started","thread_id":"01a22933-dae1-7c40-b414-82a7baf89b1d"}',
        'WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries under temporary dir "/tmp"',  # noqa: E501
        '{"type":"turn.started"}',
        '{"type":"item.completed","item":{"id":"item_0","type":"reasoning","text":"**Appending a line**"}}',  # noqa: E501
        '{"type":"item.started","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc \\"printf \'x\\\\\\\\n\' >> a.txt && cat a.txt\\"","aggregated_output":"","exit_code":null,"status":"in_progress"}}',  # noqa: E501
        '{"type":"item.completed","item":{"id":"item_1","type":"command_execution","command":"/bin/bash -lc \\"printf \'x\\\\\\\\n\' >> a.txt && cat a.txt\\"","aggregated_output":"hi\\nx\\n","exit_code":0,"status":"completed"}}',  # noqa: E501
        '{"type":"item.completed","item":{"id":"item_2","type":"file_change","changes":[{"path":"textstats/core.py","kind":"update"},{"path":"NOTES.md","kind":"add"}],"status":"completed"}}',  # noqa: E501
        '{"type":"thread.something_new","x":1}',
        '{"type":"item.completed","item":{"id":"item_3","type":"brand_new_item","x":1}}',
        '{"type":"item.completed","item":{"id":"item_4","type":"agent_message","text":"Done.\\nAppended x."}}',  # noqa: E501
        '{"type":"turn.completed","usage":{"input_tokens":2500,"cached_input_tokens":1000,"cache_write_input_tokens":0,"output_tokens":80,"reasoning_output_tokens":10}}',  # noqa: E501
    ]
)
RENDERED = [
    "codex session 01a22933-dae1-7c40-b414-82a7baf89b1d",
    'WARNING: proceeding, even though we could not create PATH aliases: Refusing to create helper binaries under temporary dir "/tmp"',  # noqa: E501
    "thinking: **Appending a line**",
    "$ printf 'x\\n' >> a.txt && cat a.txt",
    "  exit 0",
    "    hi",
    "    x",
    "edited textstats/core.py",
    "added NOTES.md",
    "assistant: Done.",
    "  Appended x.",
    "tokens: 2,500 input (1,000 cached), 80 output",
]

# The generation before `type`: items said `item_type`, the answer was `assistant_message`.
OLDER = "\n".join(
    [
        '{"type":"session.created","session_id":"s-1"}',
        '{"type":"item.started","item":{"id":"item_0","item_type":"command_execution","command":"ls","aggregated_output":"","exit_code":null,"status":"in_progress"}}',  # noqa: E501
        '{"type":"item.completed","item":{"id":"item_0","item_type":"command_execution","command":"ls","aggregated_output":"a.txt\\n","exit_code":0,"status":"completed"}}',  # noqa: E501
        '{"type":"item.completed","item":{"id":"item_1","item_type":"assistant_message","text":"Listed."}}',  # noqa: E501
        '{"type":"turn.completed","usage":{"input_tokens":300,"cached_input_tokens":100,"output_tokens":7}}',  # noqa: E501
    ]
)

FAILED_400 = "\n".join(
    [
        '{"type":"thread.started","thread_id":"t-2"}',
        '{"type":"turn.started"}',
        '{"type":"error","message":"{\\"error\\": {\\"message\\": \\"bad model thing\\", \\"type\\": \\"invalid_request_error\\", \\"param\\": null, \\"code\\": \\"invalid_request_error\\"}}"}',  # noqa: E501
        '{"type":"turn.failed","error":{"message":"{\\"error\\": {\\"message\\": \\"bad model thing\\", \\"type\\": \\"invalid_request_error\\", \\"param\\": null, \\"code\\": \\"invalid_request_error\\"}}"}}',  # noqa: E501
    ]
)

RETRIED = "\n".join(
    [
        '{"type":"turn.started"}',
        '{"type":"error","message":"Reconnecting... 1/5 (unexpected status 500 Internal Server Error: boom)"}',  # noqa: E501
        '{"type":"item.completed","item":{"id":"item_0","type":"agent_message","text":"Fine."}}',
        '{"type":"turn.completed","usage":{"input_tokens":10,"cached_input_tokens":0,"output_tokens":2}}',  # noqa: E501
    ]
)


def entry(**extra: Any) -> dict[str, Any]:
    return {"kind": "codex", "models": ["gpt-5.5"], **extra}


def context_for(tmp_path: Path, log: str, *, model: str = "gpt-5.5") -> RunContext:
    run_dir = tmp_path / "run-1"
    (run_dir / "workspace").mkdir(parents=True, exist_ok=True)
    (run_dir / "request.md").write_text("Append x to a.txt\n")
    (run_dir / "agent.log").write_text(log)
    return RunContext(
        run_id=1,
        model=model,
        spec=RunSpec(),
        run_dir=run_dir,
        workspace=run_dir / "workspace",
        request_file=run_dir / "request.md",
        log_path=run_dir / "agent.log",
    )


def adapter(model: str = "gpt-5.5", **options: Any) -> CodexAgent:
    return CodexAgent.from_entry("codex", entry(**options), model)


# --- reading the event stream (no process) -------------------------------------------------


def test_the_log_tail_reads_as_lines_a_person_follows() -> None:
    assert adapter().render_log(RECORDED).split("\n") == RENDERED


def test_the_older_field_names_read_the_same_way(tmp_path: Path) -> None:
    assert adapter().render_log(OLDER).split("\n") == [
        "codex session s-1",
        "$ ls",
        "  exit 0",
        "    a.txt",
        "assistant: Listed.",
        "tokens: 300 input (100 cached), 7 output",
    ]
    outcome = adapter().outcome(context_for(tmp_path, OLDER), exit_code=0)
    assert outcome.final_message == "Listed."
    assert outcome.usage == TokenUsage(input_tokens=200, cache_read_tokens=100, output_tokens=7)
    assert not outcome.failed


def test_a_tail_cut_mid_line_skips_the_broken_first_line_and_a_line_still_being_written() -> None:
    cut = RECORDED[RECORDED.index("dae1-7c40-b414") :] + '\n{"type":"item.started","item":{"id":"it'
    assert adapter().render_log(cut).split("\n") == RENDERED[1:]
    # A command whose start was cut off still shows what ran.
    completed_only = RECORDED[RECORDED.index('{"type":"item.completed","item":{"id":"item_1"') :]
    assert adapter().render_log(completed_only).split("\n")[:2] == [
        "$ printf 'x\\n' >> a.txt && cat a.txt",
        "  exit 0",
    ]


def test_long_output_and_control_characters_are_kept_readable() -> None:
    output = "".join(f"line {n}\n" for n in range(1, 21))
    event = {
        "type": "item.completed",
        "item": {
            "id": "i",
            "type": "command_execution",
            "command": "pytest -q",
            "aggregated_output": "\x1b[31mred\x1b[0m\x00\n" + output,
            "exit_code": 1,
            "status": "failed",
        },
    }
    lines = adapter().render_log(json.dumps(event)).split("\n")
    assert lines[:4] == ["$ pytest -q", "  exit 1", "    red", "    line 1"]
    assert lines[-1] == "    … 16 more lines"


def test_other_items_have_a_line_each() -> None:
    events = [
        {
            "type": "item.started",
            "item": {
                "id": "t",
                "type": "todo_list",
                "items": [{"text": "read", "completed": True}, {"text": "fix", "completed": False}],
            },
        },
        {
            "type": "item.completed",
            "item": {
                "id": "m",
                "type": "mcp_tool_call",
                "server": "docs",
                "tool": "search",
                "status": "failed",
                "error": {"message": "no such tool"},
            },
        },
        {"type": "item.completed", "item": {"id": "w", "type": "web_search", "query": "ruff"}},
        {
            "type": "item.completed",
            "item": {"id": "e", "type": "error", "message": "model rerouted"},
        },
        {
            "type": "item.completed",
            "item": {
                "id": "f",
                "type": "file_change",
                "status": "failed",
                "changes": [{"path": "a.py", "kind": "update"}],
            },
        },
        {"type": "turn.failed", "error": {"message": "quota exceeded"}},
    ]
    text = "\n".join(json.dumps(event) for event in events)
    assert adapter().render_log(text).split("\n") == [
        "plan: 1/2 done",
        "  [x] read",
        "  [ ] fix",
        "tool docs.search: failed: no such tool",
        "web search: ruff",
        "warning: model rerouted",
        "could not edit a.py",
        "turn failed: quota exceeded",
    ]


def test_the_outcome_has_the_final_message_the_thread_usage_and_the_price_table_cost(
    tmp_path: Path,
) -> None:
    outcome = adapter().outcome(context_for(tmp_path, RECORDED), exit_code=0)
    assert outcome.final_message == "Done.\nAppended x."
    # input includes the cached reads; ours does not.
    assert outcome.usage == TokenUsage(input_tokens=1500, cache_read_tokens=1000, output_tokens=80)
    # gpt-5.5: $5 in, $0.50 cached, $30 out per million.
    assert (
        outcome.cost_usd
        == (Decimal(1500) * 5 + Decimal(1000) * Decimal("0.5") + Decimal(80) * 30) / 1_000_000
    )
    assert outcome.model_seconds is None
    assert (outcome.failed, outcome.error, outcome.notes) == (False, "", [])


def test_the_last_cumulative_usage_counts_and_an_unknown_model_has_an_unknown_cost(
    tmp_path: Path,
) -> None:
    earlier = '{"type":"turn.completed","usage":{"input_tokens":5,"cached_input_tokens":0,"output_tokens":1}}'  # noqa: E501
    outcome = adapter("no-such-model").outcome(
        context_for(tmp_path, earlier + "\n" + RECORDED), exit_code=0
    )
    assert outcome.usage.input_tokens == 1500
    assert outcome.cost_usd is None


def test_no_usage_reported_means_unknown_tokens_and_cost_with_a_note(tmp_path: Path) -> None:
    log = '{"type":"thread.started","thread_id":"t"}\n{"type":"turn.started"}\n'
    outcome = adapter().outcome(context_for(tmp_path, log), exit_code=0)
    assert outcome.usage == TokenUsage() and outcome.cost_usd is None
    assert outcome.notes == ["Codex reported no token usage: tokens and cost are unknown."]


def test_a_failed_turn_fails_the_run_with_the_api_message_even_on_exit_0(tmp_path: Path) -> None:
    outcome = adapter().outcome(context_for(tmp_path, FAILED_400), exit_code=0)
    assert outcome.failed is True
    assert outcome.error == "bad model thing"
    assert adapter().render_log(FAILED_400).split("\n")[-2:] == [
        "error: bad model thing",
        "turn failed: bad model thing",
    ]


def test_an_error_event_without_a_completed_turn_fails_the_run(tmp_path: Path) -> None:
    log = '{"type":"turn.started"}\n{"type":"error","message":"stream disconnected"}\n'
    outcome = adapter().outcome(context_for(tmp_path, log), exit_code=0)
    assert (outcome.failed, outcome.error) == (True, "stream disconnected")


def test_a_retry_codex_recovered_from_is_not_a_failure(tmp_path: Path) -> None:
    outcome = adapter().outcome(context_for(tmp_path, RETRIED), exit_code=0)
    assert (outcome.failed, outcome.error, outcome.final_message) == (False, "", "Fine.")
    assert "error: Reconnecting... 1/5" in adapter().render_log(RETRIED)


def test_a_failed_exit_without_an_error_event_quotes_the_readable_log(tmp_path: Path) -> None:
    log = '{"type":"thread.started","thread_id":"t"}\nError: config.toml: invalid key\n'
    outcome = adapter().outcome(context_for(tmp_path, log), exit_code=1)
    assert outcome.error == "codex session t\nError: config.toml: invalid key"
    assert outcome.failed is False  # the exit code already fails the run


# --- the settings entry and the invocation --------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"binary": ""}, "'binary' must be a program name or path"),
        ({"binary": ["codex"]}, "'binary' must be a program name or path"),
        ({"args": "-c x=1"}, "'args' must be a list of strings"),
        ({"args": ["-c", 1]}, "'args' must be a list of strings"),
        ({"env": {"K": 1}}, "'env' must map names to strings"),
        ({"env": {"CODEX_HOME": "/x"}}, "'env' must not set CODEX_HOME"),
        ({"sandbox": "yolo"}, "'sandbox' must be one of read-only, workspace-write"),
        ({"seed_files": ["auth.json"]}, "'seed_files' must map file names"),
        ({"seed_files": {"/etc/auth.json": "~/a"}}, "must be a relative path inside CODEX_HOME"),
        ({"seed_files": {"../auth.json": "~/a"}}, "must be a relative path inside CODEX_HOME"),
        ({"seed_files": {".": "~/a"}}, "must be a relative path inside CODEX_HOME"),
        ({"seed_files": {"auth.json": ""}}, "the source of 'auth.json' must be a path"),
        ({"config_toml": {"model": "x"}}, "'config_toml' must be the text of a config.toml"),
        (
            {"config_toml": "x = 1", "seed_files": {"config.toml": "~/c"}},
            "either in 'seed_files' or as 'config_toml'",
        ),
    ],
)
def test_a_malformed_entry_is_refused_with_a_readable_reason(
    extra: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError) as refused:
        CodexAgent.check_entry(entry(**extra))
    assert message in str(refused.value)


def test_a_complete_entry_is_accepted() -> None:
    CodexAgent.check_entry(
        entry(
            label="Codex",
            binary="codex",
            args=["-c", "model_provider=fake"],
            env={"FAKE_KEY": "x"},
            sandbox="read-only",
            seed_files={"auth.json": "~/.codex/auth.json"},
            config_toml='model_reasoning_effort = "high"\n',
        )
    )
    CodexAgent.check_entry(entry())


def test_the_invocation_feeds_the_request_on_stdin_to_codex_exec_in_its_own_home(
    tmp_path: Path,
) -> None:
    auth = tmp_path / "auth.json"
    auth.write_text('{"OPENAI_API_KEY": "sk-test"}')
    codex = adapter(
        binary="/opt/codex/bin/codex",
        args=["-c", "model_provider=fake"],
        env={"FAKE_KEY": "x"},
        seed_files={"auth.json": str(auth)},
        config_toml='model_reasoning_effort = "high"\n',
    )
    context = context_for(tmp_path, "")
    invocation = codex.invocation(context)
    home = context.run_dir / "codex-home"
    assert invocation.argv == [
        "/opt/codex/bin/codex", "exec", "-c", "model_provider=fake", "--json",
        "-C", str(context.workspace), "-s", "workspace-write", "--skip-git-repo-check",
        "-m", "gpt-5.5", "-",
    ]  # fmt: skip
    assert "Append x" not in " ".join(invocation.argv)
    assert invocation.stdin_path == context.request_file
    # Its own temporary folder: CODEX_HOME is never under it, so Codex's sandbox helper
    # can be linked there wherever the run root is (FACTS.md, "bubblewrap changes Codex").
    assert invocation.env == {
        "FAKE_KEY": "x",
        "CODEX_HOME": str(home),
        "TMPDIR": str(context.run_dir / "tmp"),
    }
    assert not home.is_relative_to(context.run_dir / "tmp")
    assert sorted(path.name for path in home.iterdir()) == ["auth.json", "config.toml"]
    assert (home / "auth.json").read_text() == auth.read_text()
    assert (home / "auth.json").stat().st_mode & 0o777 == 0o600
    assert (home / "config.toml").read_text() == 'model_reasoning_effort = "high"\n'
    assert home.stat().st_mode & 0o777 == 0o700
    # Once codex has finished, the copied login is gone; config.toml and the home stay.
    codex.cleanup(context)
    assert sorted(path.name for path in home.iterdir()) == ["config.toml"]


def test_a_model_that_looks_like_an_option_is_refused(tmp_path: Path) -> None:
    with pytest.raises(AgentSetupError, match="is not a model name"):
        adapter("--dangerously-bypass-approvals-and-sandbox").invocation(context_for(tmp_path, ""))


def test_a_missing_seed_file_stops_the_run_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "auth.json"
    codex = adapter(seed_files={"auth.json": str(missing)})
    with pytest.raises(AgentSetupError) as refused:
        codex.invocation(context_for(tmp_path, ""))
    assert str(missing) in str(refused.value) and "does not exist" in str(refused.value)
    assert CodexAgent.unavailable_reason(
        entry(binary=sys.executable, seed_files={"auth.json": str(missing)})
    ) == (f"The seed file {missing} (for CODEX_HOME/auth.json) does not exist.")


# --- discovery -----------------------------------------------------------------------------


def test_a_missing_binary_makes_the_models_unavailable_and_blocks_a_plan(
    settings: Any, tmp_path: Path, api_client: Any, make_thread: Callable[..., Any]
) -> None:
    missing = tmp_path / "no-codex-here"
    settings.REPLAYS_AGENTS = {"codex": entry(binary=str(missing), label="Codex")}
    info = {model.id: model for model in agents.discover_models()}["codex:gpt-5.5"]
    assert (info.available, info.reason, info.version) == (
        False, f"{missing} does not exist.", ""
    )  # fmt: skip
    assert agents.resolve_model("codex:gpt-5.2").reason == info.reason  # typed by hand

    thread = make_thread(cwd=str(tmp_path))
    response = api_client.post(
        "/api/plans/",
        {"configurations": [{"thread_id": thread.pk}], "models": ["codex:gpt-5.5"]},
        format="json",
    )
    assert response.status_code == 201, response.content
    plan = response.json()
    assert plan["status"] == "blocked"
    assert f"Model codex:gpt-5.5 cannot run here: {missing} does not exist." in plan["blockers"]


def test_a_binary_not_on_path_is_named(settings: Any) -> None:
    settings.REPLAYS_AGENTS = {"codex": entry(binary="replays-no-such-codex")}
    [info] = [model for model in agents.discover_models() if model.agent == "codex"]
    assert info.reason == "'replays-no-such-codex' was not found on PATH."


@pytest.mark.cli
def test_the_installed_codex_is_available_with_its_version(settings: Any) -> None:
    codex = require_tool(NODE_BIN / "codex", HOW_TO_GET_CODEX)
    settings.REPLAYS_AGENTS = {"codex": entry(binary=str(codex), label="Codex")}
    info = {model.id: model for model in agents.discover_models()}["codex:gpt-5.5"]
    assert (info.available, info.reason, info.label) == (True, "", "Codex gpt-5.5")
    assert info.version == "codex-cli 0.169.0"


# --- real runs: manage.py replay with the real codex against the scripted server -----------

FIRST_USAGE = Usage(input_tokens=1200, output_tokens=60, cache_read_tokens=200, reasoning_tokens=9)
LAST_USAGE = Usage(input_tokens=1500, output_tokens=40, cache_read_tokens=1000)
APPENDED = "# appended by codex\\n"
APPEND_COMMAND = f"printf '{APPENDED}' >> textstats/core.py && tail -n 1 textstats/core.py"


class Replay:
    """A replay of the first request of a real thread with codex:gpt-5.5 against `server`."""

    def __init__(
        self, env: dict[str, str], tmp_path: Path, server: OpenAIServer, thread: Any, repo: Path
    ) -> None:
        codex = require_tool(NODE_BIN / "codex", HOW_TO_GET_CODEX)
        self.server = server
        provider = [
            "model_provider=fake",
            'model_providers.fake.name="fake"',
            f'model_providers.fake.base_url="{server.api_url}"',
            'model_providers.fake.wire_api="responses"',
            'model_providers.fake.env_key="FAKE_KEY"',
        ]
        agents_file = tmp_path / "agents.json"
        self.codex, self.provider, self.agents_file = codex, provider, agents_file
        self.configure()
        self.home = tmp_path / "home"
        self.home.mkdir()
        self.env = {
            **env,
            "REPLAYS_AGENTS_FILE": str(agents_file),
            "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
            "REPLAYS_HEARTBEAT_SECONDS": "0.5",
            # The user's own ~/.codex must stay untouched: runs have their own CODEX_HOME.
            "HOME": str(self.home),
        }
        first = thread.turns.get(index=0)
        self.argv = [
            sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
            "--from", first.message_uuid, "--to", first.message_uuid,
            "--model", "codex:gpt-5.5", "--repository", str(repo), "--user", "alice",
            # The agent is under test: the offline evaluator keeps the scripted server to
            # the agent's own requests.
            "--evaluator", "tests", "--verify-command", "true", "--yes", "--wait",
        ]  # fmt: skip
        self.process: subprocess.Popen[str] | None = None

    def configure(self, *, env: dict[str, str] | None = None, more: list[str] = ()) -> None:  # type: ignore[assignment]
        """The agents file: codex against the server, FAKE_KEY given unless `env` says."""
        self.agents_file.write_text(
            json.dumps(
                {
                    "codex": {
                        "kind": "codex",
                        "label": "Codex",
                        "binary": str(self.codex),
                        "args": [arg for pair in [*self.provider, *more] for arg in ("-c", pair)],
                        "env": {"FAKE_KEY": "x"} if env is None else env,
                        "models": ["gpt-5.5"],
                    }
                }
            )
        )

    def run(self, *extra: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.argv, *extra], env=self.env, text=True, capture_output=True,
            timeout=timeout, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def start(self, *extra: str) -> subprocess.Popen[str]:
        self.process = subprocess.Popen(
            [*self.argv, *extra], env=self.env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        return self.process

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, str(MANAGE), *args], env=self.env, text=True,
            capture_output=True, timeout=30, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return done.stdout


@pytest.fixture
def codex_replay(
    process_env: dict[str, str], tmp_path: Path, user: Any, real_threads: Any, sample_repo: Path
) -> Iterator[Callable[[Script], Replay]]:
    servers: list[OpenAIServer] = []
    replays: list[Replay] = []

    def make(script: Script) -> Replay:
        server = OpenAIServer(script).start()
        servers.append(server)
        replay = Replay(
            process_env, tmp_path, server, real_threads["claude-line-count"], sample_repo
        )
        replays.append(replay)
        return replay

    yield make
    for replay in replays:
        if replay.process is not None and replay.process.poll() is None:
            replay.process.kill()
            replay.process.communicate()
    # A failed test must not leave a coordinator or codex running (both run detached).
    for run in Run.objects.all():
        for pid, create_time in (
            (run.agent_pid, run.agent_pid_create_time),
            (run.pid, run.pid_create_time),
        ):
            if processes.is_alive(pid, create_time):
                processes.kill_tree(pid, create_time, grace_seconds=1)
    for server in servers:
        server.close()


def wait_for(condition: Callable[[], object], what: str, seconds: float = 30) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def agent_tree() -> list[psutil.Process]:
    """The running agent's process and its descendants, once the coordinator recorded it."""
    run = Run.objects.filter(agent_pid__isnull=False).first()
    if run is None:
        return []
    try:
        root = psutil.Process(run.agent_pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def running_command(name: str) -> list[psutil.Process]:
    """Processes of the agent's tree running `name` (a process may end while we look)."""
    found = []
    for process in agent_tree():
        try:
            if process.name() == name:
                found.append(process)
        except psutil.NoSuchProcess:
            pass
    return found


def alive(processes: list[psutil.Process]) -> list[psutil.Process]:
    living = []
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                living.append(process)
        except psutil.NoSuchProcess:
            pass
    return living


def the_run() -> Run:
    [run] = Run.objects.all()
    return run


@pytest.mark.cli
def test_codex_runs_a_real_command_and_the_run_completes_with_its_diff_tokens_and_cost(
    codex_replay: Callable[[Script], Replay],
) -> None:
    replay = codex_replay(
        [shell(APPEND_COMMAND, usage=FIRST_USAGE), Text("Appended the line.", usage=LAST_USAGE)]
    )
    result = replay.run()
    assert result.returncode == 0, result.stdout + result.stderr
    run = the_run()
    assert (run.status, run.failure_code, run.exit_code) == (RunStatus.COMPLETED, "", 0)
    assert "+# appended by codex" in run.diff and "textstats/core.py" in run.diff
    assert run.files_changed == 1
    # Codex reports the thread's cumulative usage: both responses, cached reads out of input.
    cached = FIRST_USAGE.cache_read_tokens + LAST_USAGE.cache_read_tokens
    total_input = FIRST_USAGE.input_tokens + LAST_USAGE.input_tokens
    output = FIRST_USAGE.output_tokens + LAST_USAGE.output_tokens
    assert (run.input_tokens, run.cache_read_tokens, run.output_tokens) == (
        total_input - cached, cached, output
    )  # fmt: skip
    assert (run.cache_write_5m_tokens, run.cache_write_1h_tokens) == (0, 0)
    expected = (
        Decimal(total_input - cached) * 5 + Decimal(cached) * Decimal("0.5") + Decimal(output) * 30
    ) / 1_000_000
    assert run.cost_usd == expected == Decimal("0.0111")
    assert run.model_seconds is None
    # The log tail reads as lines: the command, its exit and output, the answer; no raw JSON.
    tail = run.log_tail.split("\n")
    assert f"$ {APPEND_COMMAND}" in tail
    assert "  exit 0" in tail and "    # appended by codex" in tail
    assert "assistant: Appended the line." in tail
    assert not [line for line in tail if line.lstrip().startswith("{")]
    # The request went in on stdin and reached the model as the prompt.
    assert last_user_text(replay.server.model_requests[0]) == run.configuration["request"].strip()
    # Isolation: the session file is in the run's own CODEX_HOME, nothing in the user's HOME.
    home = Path(run.run_dir) / "codex-home"
    thread_id = next(
        json.loads(line)["thread_id"]
        for line in (Path(run.run_dir) / "agent.log").read_text().splitlines()
        if line.startswith('{"type":"thread.started"')
    )
    [rollout] = list((home / "sessions").rglob("rollout-*.jsonl"))
    assert thread_id in rollout.name
    assert not (replay.home / ".codex").exists()


@pytest.mark.cli
def test_an_api_error_fails_the_run_as_an_agent_error_with_its_message(
    codex_replay: Callable[[Script], Replay],
) -> None:
    replay = codex_replay([HttpError(400, "The model gpt-5.5 is not available to you.")])
    result = replay.run()
    assert result.returncode == 1
    assert "did not complete" in result.stderr
    run = the_run()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.AGENT_ERROR)
    assert run.failure_message == (
        "The agent exited with code 1:\nThe model gpt-5.5 is not available to you."
    )
    assert "turn failed: The model gpt-5.5 is not available to you." in run.log_tail
    assert run.cost_usd is None and run.input_tokens == 0


NO_RETRIES = [
    "model_providers.fake.request_max_retries=0",
    "model_providers.fake.stream_max_retries=0",
]


@pytest.mark.cli
@pytest.mark.parametrize(
    ("status", "message", "title"),
    [
        (401, "Incorrect API key provided", "credentials refused or missing"),
        # Codex quotes no body for a 429 ("last status: 429 Too Many Requests"): a quota
        # and a rate limit read the same.
        (429, "You exceeded your current quota", "rate limited by the provider"),
        (404, "The model `gpt-5.5` does not exist or you do not have access to it.",
         "the provider does not know this model"),
    ],
)  # fmt: skip
def test_a_provider_refusal_is_a_setup_failure_of_codex(
    codex_replay: Callable[[Script], Replay], status: int, message: str, title: str
) -> None:
    replay = codex_replay(lambda body: HttpError(status, message))
    replay.configure(more=NO_RETRIES)
    result = replay.run(timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    run = the_run()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP)
    assert run.failure_message.startswith(f"Setup problem ({title})"), run.failure_message
    assert "Fix: " in run.failure_message


@pytest.mark.cli
def test_codex_without_its_key_is_a_setup_failure(
    codex_replay: Callable[[Script], Replay],
) -> None:
    replay = codex_replay([Text("never asked")])
    replay.configure(env={})
    result = replay.run()
    assert result.returncode == 1, result.stdout + result.stderr
    run = the_run()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP)
    assert run.failure_message.startswith(
        "Setup problem (credentials refused or missing): Missing environment variable"
    )
    assert replay.server.model_requests == []


@pytest.mark.cli
def test_a_model_that_never_answers_times_out_and_the_codex_tree_is_gone(
    codex_replay: Callable[[Script], Replay],
) -> None:
    replay = codex_replay([Hang()])
    started = time.monotonic()
    replay.start("--timeout", "10")
    wait_for(lambda: replay.server.requests, "codex to ask the model")
    tree = agent_tree()  # node running codex.js, and the native codex it started
    assert len(tree) >= 2
    replay.process.communicate(timeout=40)
    assert time.monotonic() - started < 30
    run = the_run()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.TIMEOUT)
    assert run.failure_message == "The agent did not finish within 10s."
    assert alive(tree) == []


@pytest.mark.cli
def test_cancel_during_a_tool_call_stops_codex_and_the_command(
    codex_replay: Callable[[Script], Replay],
) -> None:
    replay = codex_replay([shell("sleep 30"), Text("Slept.")])
    replay.start()
    # The model asked for the command and codex is running it.
    [sleeper] = wait_for(lambda: running_command("sleep"), "the sleep command to run")
    tree = agent_tree()  # node, codex, its sandbox helpers, the shell's sleep
    assert sleeper in tree
    run = the_run()
    replay.manage("cancel_runs", "--run", str(run.pk))
    replay.process.communicate(timeout=30)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED
    assert "$ sleep 30" in run.log_tail
    assert alive(tree) == []
    assert not Path(run.workspace_path).exists()
