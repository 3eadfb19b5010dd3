"""Context modes with the real CLIs (claude 2.1.197, codex 0.169.0) against the scripted
servers, through `manage.py replay --wait`: what each candidate saw before the request.

The threads are the real fixture sessions, copied with their folder pointed at this
test's clone of the repository (the user's checkout, as far as the session knows): a
fork must edit the run's worktree, never that checkout, although its history names it.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replays import importing, repos
from replays.models import Run, RunStatus, Thread
from replays.transcripts.base import TokenUsage
from tests.conftest import REAL_TRANSCRIPTS, manifest_session
from tests.fakes import anthropic_server, openai_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import JSON, HttpError, Step, Text, ToolCall, Usage, shell
from tests.test_agent_claude_code import scripted_usage
from tests.test_replay_real_agents import agents_file

pytestmark = pytest.mark.cli

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
CODEX = "codex:gpt-5.5"
CLAUDE = "claude:claude-sonnet-4-5"
FIXTURE_FOLDER = "/var/tmp/replays-fixtures/textstats"
# Distinct usage per answer, so sums show every answer counted once (input at least the
# cached reads: Codex's input includes them).
U1 = Usage(input_tokens=1100, output_tokens=3, cache_read_tokens=100, cache_write_5m_tokens=7)
U2 = Usage(input_tokens=1300, output_tokens=5, cache_read_tokens=200)
U3 = Usage(input_tokens=1700, output_tokens=7, cache_read_tokens=300, cache_write_1h_tokens=9)
U4 = Usage(input_tokens=1900, output_tokens=11, cache_read_tokens=400)


# --- the scene ----------------------------------------------------------------------------


def historical_thread(name: str, checkout: Path, folder: Path, user: Any) -> Thread:
    """The fixture session `name` as if it had run in `checkout`, imported for `user`."""
    session = manifest_session(name)
    source = REAL_TRANSCRIPTS / session["path"]
    copy = folder / source.name
    copy.parent.mkdir(parents=True, exist_ok=True)
    copy.write_text(source.read_text().replace(FIXTURE_FOLDER, str(checkout)))
    result = importing.import_transcript_file(path=copy, user=user)
    assert result.thread is not None, result.error
    return result.thread


def replay(
    env: dict[str, str], thread: Thread, first: int, last: int, *models: str, extra: tuple = ()
) -> subprocess.CompletedProcess[str]:
    turns = {turn.index + 1: turn.message_uuid for turn in thread.turns.all()}
    argv = [
        sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
        "--from", turns[first], "--to", turns[last],
        *[arg for model in models for arg in ("--model", model)], *extra,
        "--user", "alice", "--evaluator", "tests", "--verify-command", "true", "--yes", "--wait",
    ]  # fmt: skip
    return subprocess.run(
        argv, env=env, text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL
    )


@pytest.fixture
def scene(process_env: dict[str, str], tmp_path: Path, user: Any, sample_repo: Path) -> Any:
    """Servers are made by each test; this gives the environment for them."""

    class Scene:
        checkout = sample_repo

        def env(self, openai: OpenAIServer, anthropic: AnthropicServer) -> dict[str, str]:
            (tmp_path / "home").mkdir(exist_ok=True)
            return {
                **process_env,
                "HOME": str(tmp_path / "home"),
                "REPLAYS_AGENTS_FILE": str(agents_file(tmp_path / "agents.json", openai, anthropic)),
                "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
                "REPLAYS_HEARTBEAT_SECONDS": "0.5",
            }  # fmt: skip

        def thread(self, name: str) -> Thread:
            return historical_thread(name, sample_repo, tmp_path / "history", user)

        def untouched(self) -> None:
            """The user's checkout is as it was: no file changed or added."""
            status = subprocess.run(
                ["git", "-C", str(sample_repo), "status", "--porcelain"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert status == "", status

    return Scene()


def runs() -> dict[str, Run]:
    return {run.model: run for run in Run.objects.all()}


def completed(result: subprocess.CompletedProcess[str]) -> dict[str, Run]:
    found = runs()
    assert result.returncode == 0, result.stdout + result.stderr
    assert {run.status for run in found.values()} == {RunStatus.COMPLETED}, {
        model: run.failure_message for model, run in found.items()
    }
    return found


# --- what a server saw --------------------------------------------------------------------


def claude_requests(server: AnthropicServer, key: str) -> list[JSON]:
    """The model requests whose latest prompt holds `key`."""
    return [
        body
        for body in server.model_requests
        if key in anthropic_server.conversation_position(body)[0]
    ]


def claude_history(body: JSON) -> list[tuple[str, str]]:
    """(role, block type) of every block before the request's own prompt."""
    return [
        (message["role"], block.get("type", "text") if isinstance(block, dict) else "text")
        for message in body["messages"][:-1]
        for block in (
            message["content"] if isinstance(message["content"], list) else [message["content"]]
        )
    ]


def codex_requests(server: OpenAIServer, key: str) -> list[JSON]:
    return [
        body
        for body in server.model_requests
        if key in openai_server.conversation_position(body)[0]
    ]


def codex_history(body: JSON) -> list[str]:
    """The type of every input item before the request's own prompt (messages by role)."""
    items = body["input"]
    last = max(
        index
        for index, item in enumerate(items)
        if item.get("role") == "user" and not openai_server.user_texts({"input": [item]})[0].startswith("<")
    )  # fmt: skip
    return [item.get("role") or item["type"] for item in items[:last]]


def codex_usage(steps: list[Usage]) -> TokenUsage:
    """OpenAI semantics (input includes cached) as disjoint kinds."""
    cached = sum(step.cache_read_tokens for step in steps)
    return TokenUsage(
        input_tokens=sum(step.input_tokens for step in steps) - cached,
        cache_read_tokens=cached,
        output_tokens=sum(step.output_tokens for step in steps),
    )


def by_key(plans: dict[str, list[Any]], position: Any) -> Any:
    """A script: the steps of the first plan whose key is in the latest prompt, by how many
    answers follow it; a step may be a callable of the request (it reads the history)."""

    def script(body: JSON) -> Step:
        prompt, index = position(body)
        for key, steps in plans.items():
            if key in prompt and index < len(steps):
                step = steps[index]
                return step(body) if callable(step) else step
        return HttpError(400, f"no scripted step for {prompt[:100]!r} at {index}")

    return script


# --- fork and digest, both ways -----------------------------------------------------------


def test_a_later_claude_request_forks_for_claude_and_is_a_digest_for_codex(scene: Any) -> None:
    """Request #2 of a Claude Code thread: claude forks the historical session (its tool
    calls and results arrive before the request, and the path its history names is the
    worktree's), codex gets the digest of request #1 (its request and answer)."""
    thread = scene.thread("claude-cli")
    history = manifest_session("claude-cli")["turns"]

    def write_beside_the_history(body: JSON) -> Step:
        # The file the historical turn wrote, as the forked history names it.
        written = next(
            block["input"]["file_path"]
            for message in body["messages"]
            if isinstance(message["content"], list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_use"
            and block["name"] == "Write"
        )  # fmt: skip
        target = str(Path(written).parent / "lines_flag.txt")
        return ToolCall("write", {"file_path": target, "content": "--lines\n"}, U1)

    claude_script = by_key(
        {"--lines": [write_beside_the_history, Text("Added the flag.", U2)]},
        anthropic_server.conversation_position,
    )
    codex_script = by_key({"--lines": [Text("Noted.", U3)]}, openai_server.conversation_position)
    with OpenAIServer(codex_script) as openai, AnthropicServer(claude_script) as anthropic:
        result = replay(scene.env(openai, anthropic), thread, 2, 2, CLAUDE, CODEX)
    found = completed(result)
    # The plan said which context each model had, and why.
    assert f"context of {CLAUDE}: fork (a later request of a Claude Code session)" in result.stdout
    assert f"context of {CODEX}: digest (a later request; no fork:" in result.stdout

    # Claude: the historical turn's tool calls and results, then the request.
    [first_call, _] = claude_requests(anthropic, "--lines")
    assert claude_history(first_call)[-6:] == [
        ("assistant", "thinking"), ("assistant", "tool_use"), ("user", "tool_result"),
        ("assistant", "tool_use"), ("user", "tool_result"), ("assistant", "text"),
    ]  # fmt: skip
    assert history[0]["request"] in json.dumps(first_call["messages"][0])
    assert anthropic_server.last_user_text(first_call).strip() == history[1]["request"]
    # The history names the worktree, never the user's checkout.
    assert str(scene.checkout) not in json.dumps(first_call["messages"])
    claude = found[CLAUDE]
    assert json.dumps(first_call["messages"]).count(claude.workspace_path) >= 2
    assert repos.changed_files(claude.diff) == ["textstats/lines_flag.txt"]
    assert not (scene.checkout / "textstats" / "lines_flag.txt").exists()
    scene.untouched()
    assert claude.configuration["context"] == "fork"
    assert claude.tokens == scripted_usage(anthropic).as_dict()

    # Codex: the preamble (request #1 and the agent's answer), then the request.
    [codex_call] = codex_requests(openai, "--lines")
    assert codex_history(codex_call).count("assistant") == 0
    prompt = openai_server.last_user_text(codex_call)
    assert prompt.index("## Request #1") < prompt.index(history[0]["request"])
    assert "`python3 -m textstats` prints the word count." in prompt
    assert prompt.rstrip().endswith(history[1]["request"])
    assert found[CODEX].configuration["context"] == "digest"
    # The report says which context each side had.
    report = found[CODEX].current_report
    assert report is not None and report.context == "digest"
    assert (report.data["historical"]["context"], report.data["replay"]["context"]) == (
        "session",
        "digest",
    )


def test_a_later_codex_request_forks_for_codex_and_is_a_digest_for_claude(scene: Any) -> None:
    """Request #2 of a Codex thread: codex forks its rollout (turn 1's calls and outputs
    arrive before the request; the folder it names is the worktree), claude gets the
    digest, chosen explicitly here."""
    thread = scene.thread("codex-char-count")
    history = manifest_session("codex-char-count")["turns"]

    def write_in_the_historical_folder(body: JSON) -> Step:
        # The folder of the historical turn, as its environment context names it.
        first_context = next(t for t in openai_server.user_texts(body) if "<cwd>" in t)
        folder = re.search(r"<cwd>(.*?)</cwd>", first_context).group(1)  # type: ignore[union-attr]
        return shell(f"printf 'forked\\n' > {folder}/FORKED.md", usage=U1)

    codex_script = by_key(
        {"Document word_count": [write_in_the_historical_folder, Text("Documented.", U2)]},
        openai_server.conversation_position,
    )
    claude_script = by_key(
        {"Document word_count": [Text("Noted.", U3)]}, anthropic_server.conversation_position
    )
    with OpenAIServer(codex_script) as openai, AnthropicServer(claude_script) as anthropic:
        result = replay(
            scene.env(openai, anthropic), thread, 2, 2, CODEX, CLAUDE,
            extra=("--context", f"{CODEX}=fork", "--context", f"{CLAUDE}=digest"),
        )  # fmt: skip
    found = completed(result)
    assert f"context of {CODEX}: fork (chosen)" in result.stdout

    # Codex: turn 1's messages, reasoning, calls and their outputs, then the request.
    first_call = codex_requests(openai, "Document word_count")[0]
    before = codex_history(first_call)
    for kind in ("function_call", "function_call_output", "custom_tool_call", "assistant"):
        assert kind in before, before
    assert history[0]["request"] in openai_server.user_texts(first_call)
    assert str(scene.checkout) not in json.dumps(first_call["input"])
    codex = found[CODEX]
    assert repos.changed_files(codex.diff) == ["FORKED.md"]
    assert not (scene.checkout / "FORKED.md").exists()
    scene.untouched()
    # Only what this run added counts (the forked thread's totals are the history's).
    assert codex.tokens == codex_usage([U1, U2]).as_dict()

    # Claude: the preamble with request #1 and Codex's answer to it.
    [claude_call] = claude_requests(anthropic, "Document word_count")
    assert [message["role"] for message in claude_call["messages"]] == ["user"]
    prompt = anthropic_server.last_user_text(claude_call)
    assert history[0]["request"] in prompt and "Added `char_count`; the tests still pass." in prompt
    assert prompt.rstrip().endswith(history[1]["request"])
    assert found[CLAUDE].current_report.data["replay"]["context"] == "digest"  # type: ignore[union-attr]


# --- a range, turn by turn, starting cold -------------------------------------------------


def test_a_two_request_range_is_two_turns_of_one_session_from_a_cold_start(scene: Any) -> None:
    thread = scene.thread("claude-cli")
    first_key, second_key = "command-line entry point", "--lines"
    steps = {
        first_key: [shell("echo one > ONE.txt", usage=U1), Text("One.", U2)],
        second_key: [shell("echo two > TWO.txt", usage=U3), Text("Two.", U4)],
    }
    claude_script = by_key(steps, anthropic_server.conversation_position)
    codex_script = by_key(steps, openai_server.conversation_position)
    with OpenAIServer(codex_script) as openai, AnthropicServer(claude_script) as anthropic:
        result = replay(scene.env(openai, anthropic), thread, 1, 2, CLAUDE, CODEX)
    found = completed(result)
    requests = [turn["request"] for turn in manifest_session("claude-cli")["turns"]]

    for model, run in found.items():
        assert run.configuration["context"] == "cold"
        assert run.configuration["requests"] == requests
        assert [turn["turn"] for turn in run.turns] == [1, 2], model
        # One session: turn 2 resumed the session turn 1 started.
        sessions = {turn["session_id"] for turn in run.turns}
        assert len(sessions) == 1 and "" not in sessions, (model, run.turns)
        # The diff after each turn, and the run's at the end.
        assert repos.changed_files(run.turns[0]["diff"]) == ["ONE.txt"]
        assert repos.changed_files(run.turns[1]["diff"]) == ["ONE.txt", "TWO.txt"]
        assert repos.changed_files(run.diff) == ["ONE.txt", "TWO.txt"]
        # Usage summed over the turns is the run's.
        summed = sum(
            (TokenUsage(**turn["tokens"]) for turn in run.turns), TokenUsage()
        )  # fmt: skip
        assert summed.as_dict() == run.tokens, model
        assert run.current_report.data["replay"]["turns"] == 2  # type: ignore[union-attr]

    # Claude: cold (the request alone), then the second request after the first's work.
    [start, _] = claude_requests(anthropic, first_key)
    assert [message["role"] for message in start["messages"]] == ["user"]
    assert anthropic_server.last_user_text(start).strip() == requests[0]
    [resumed, _] = claude_requests(anthropic, second_key)
    assert claude_history(resumed).count(("assistant", "tool_use")) == 1
    assert requests[0] in json.dumps(resumed["messages"])
    assert found[CLAUDE].tokens == scripted_usage(anthropic).as_dict()

    # Codex: the same, and each turn's usage is what that turn added to the thread's totals.
    [start, _] = codex_requests(openai, first_key)
    assert "function_call" not in codex_history(start)
    assert openai_server.last_user_text(start) == requests[0]
    [resumed, _] = codex_requests(openai, second_key)
    assert codex_history(resumed).count("function_call") == 1
    codex = found[CODEX]
    assert [TokenUsage(**turn["tokens"]) for turn in codex.turns] == [
        codex_usage([U1, U2]),
        codex_usage([U3, U4]),
    ]
