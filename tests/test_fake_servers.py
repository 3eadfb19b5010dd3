"""The scripted model servers speak the wire formats the real CLIs expect."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import NODE_BIN, require_tool
from tests.fakes import anthropic_server, gemini_server, openai_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.gemini_server import GeminiServer
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import Hang, HttpError, Text, ToolCall, Usage, shell

ROOT = Path(__file__).resolve().parents[1]

BASH_TOOL = {
    "name": "Bash",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
EXEC_TOOL = {
    "type": "function",
    "name": "exec_command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
}


def post(url: str, body: dict[str, Any], timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers.items()), error.read()


def sse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for chunk in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in chunk.splitlines() if ": " in line)
        if "event" in lines:
            events.append((lines["event"], json.loads(lines["data"])))
    return events


def claude_request(messages: list[dict[str, Any]], *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "claude-sonnet-4-5",
        "max_tokens": 100,
        "stream": stream,
        "tools": [BASH_TOOL],
        "messages": messages,
    }


def test_anthropic_stream_has_message_events_usage_and_unique_ids() -> None:
    usage = Usage(
        input_tokens=3,
        output_tokens=42,
        cache_read_tokens=1000,
        cache_write_5m_tokens=200,
        cache_write_1h_tokens=50,
    )
    with AnthropicServer([Text("hello", usage), Text("again")]) as srv:
        status, headers, raw = post(
            srv.url + "/v1/messages?beta=true", claude_request([{"role": "user", "content": "hi"}])
        )
        _, second_headers, second_raw = post(
            srv.url + "/v1/messages", claude_request([{"role": "user", "content": "hi"}])
        )

    events = sse(raw)
    assert status == 200
    assert [name for name, _ in events] == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["usage"]["cache_creation_input_tokens"] == 250
    assert start["usage"]["cache_creation"] == {
        "ephemeral_5m_input_tokens": 200,
        "ephemeral_1h_input_tokens": 50,
    }
    assert start["usage"]["cache_read_input_tokens"] == 1000
    assert events[2][1]["delta"] == {"type": "text_delta", "text": "hello"}
    assert events[4][1]["delta"]["stop_reason"] == "end_turn"
    assert events[4][1]["usage"]["output_tokens"] == 42
    second_start = sse(second_raw)[0][1]["message"]
    assert second_start["id"] != start["id"]
    assert headers["request-id"] != second_headers["request-id"]
    assert [r.response_id for r in srv.responses] == [start["id"], second_start["id"]]


def test_anthropic_tool_call_resolves_the_shell_and_streams_its_input_as_json_deltas() -> None:
    with AnthropicServer([shell("ls -la", text="Looking.")]) as srv:
        _, _, raw = post(
            srv.url + "/v1/messages", claude_request([{"role": "user", "content": "list files"}])
        )

    events = sse(raw)
    tool_start = next(
        e
        for name, e in events
        if name == "content_block_start" and e["content_block"]["type"] == "tool_use"
    )
    assert tool_start["content_block"]["name"] == "Bash"
    partial = "".join(
        e["delta"]["partial_json"]
        for name, e in events
        if name == "content_block_delta" and e["index"] == tool_start["index"]
    )
    assert json.loads(partial)["command"] == "ls -la"
    assert (
        next(e for name, e in events if name == "message_delta")["delta"]["stop_reason"]
        == "tool_use"
    )
    assert srv.responses[0].tool_name == "Bash"
    assert (
        srv.requests[0].body is not None
        and srv.requests[0].body["messages"][0]["content"] == "list files"
    )


def test_anthropic_non_streaming_errors_and_side_endpoints() -> None:
    with AnthropicServer([HttpError(529, "busy"), Text("plain")]) as srv:
        status, headers, raw = post(
            srv.url + "/v1/messages",
            claude_request([{"role": "user", "content": "x"}], stream=False),
        )
        assert status == 529
        assert json.loads(raw)["error"] == {"type": "overloaded_error", "message": "busy"}
        assert headers["request-id"].startswith("req_")

        status, _, raw = post(
            srv.url + "/v1/messages",
            claude_request([{"role": "user", "content": "x"}], stream=False),
        )
        message = json.loads(raw)
        assert (status, message["content"], message["stop_reason"]) == (
            200,
            [{"type": "text", "text": "plain"}],
            "end_turn",
        )

        status, _, raw = post(
            srv.url + "/v1/messages/count_tokens",
            claude_request([{"role": "user", "content": "x"}]),
        )
        assert status == 200 and json.loads(raw)["input_tokens"] > 0

        status, _, raw = post(
            srv.url + "/v1/messages", claude_request([{"role": "user", "content": "x"}])
        )
        assert status == 400 and "script exhausted" in json.loads(raw)["error"]["message"]
        assert len(srv.unscripted) == 1


def test_by_prompt_reacts_to_tool_results() -> None:
    script = anthropic_server.by_prompt({"build": [shell("make"), Text("built")]})
    first = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
                {"type": "text", "text": "please build"},
            ],
        }
    ]
    second = first + [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "make"}}
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}],
        },
    ]
    assert isinstance(script({"messages": first}), ToolCall)
    assert anthropic_server.last_is_tool_result({"messages": second})
    assert script({"messages": second}) == Text("built")
    assert isinstance(
        script({"messages": [{"role": "user", "content": "something else"}]}), HttpError
    )


def test_hang_never_answers_and_the_server_still_closes() -> None:
    with AnthropicServer([Hang()]) as srv:
        with pytest.raises((TimeoutError, socket.timeout, urllib.error.URLError)):
            post(
                srv.url + "/v1/messages",
                claude_request([{"role": "user", "content": "x"}]),
                timeout=0.5,
            )
    assert len(srv.requests) == 1


def codex_request(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": "gpt-5.5", "stream": True, "tools": [EXEC_TOOL], "input": items}


def test_openai_stream_has_output_items_and_usage() -> None:
    usage = Usage(
        input_tokens=5000, output_tokens=300, cache_read_tokens=4096, reasoning_tokens=200
    )
    prompt = {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_text", "text": "list files"}],
    }
    with OpenAIServer(
        openai_server.by_prompt(
            {"list": [shell("ls", usage=usage, reasoning="look"), Text("done")]}
        )
    ) as srv:
        status, headers, raw = post(srv.api_url + "/responses", codex_request([prompt]))
        call = next(
            e["item"]
            for name, e in sse(raw)
            if name == "response.output_item.done" and e["item"]["type"] == "function_call"
        )
        output = {"type": "function_call_output", "call_id": call["call_id"], "output": "a b"}
        _, _, second_raw = post(srv.api_url + "/responses", codex_request([prompt, call, output]))

    events = sse(raw)
    assert status == 200 and headers["x-request-id"]
    # Each item as the API streams it: added (empty), its pieces, done (whole).
    assert [name for name, _ in events] == [
        "response.created",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[5][1]["item"]["type"] == "reasoning"
    assert events[6][1]["item"]["arguments"] == ""
    assert events[7][1]["delta"] == call["arguments"]
    assert (call["name"], json.loads(call["arguments"])) == ("exec_command", {"cmd": "ls"})
    assert events[-1][1]["response"]["usage"] == {
        "input_tokens": 5000,
        "input_tokens_details": {"cached_tokens": 4096},
        "output_tokens": 300,
        "output_tokens_details": {"reasoning_tokens": 200},
        "total_tokens": 5300,
    }
    second = sse(second_raw)
    message = next(e["item"] for name, e in second if name == "response.output_item.done")
    assert message["type"] == "message" and message["content"][0] == {
        "type": "output_text",
        "text": "done",
        "annotations": [],
    }
    assert second[0][1]["response"]["id"] != events[0][1]["response"]["id"]
    assert openai_server.last_is_tool_result(srv.model_requests[1])


def test_openai_errors_use_the_openai_shape_and_unknown_tools_are_refused() -> None:
    with OpenAIServer([HttpError(429, "slow down"), ToolCall("Write", {"x": 1})]) as srv:
        status, _, raw = post(srv.api_url + "/responses", codex_request([]))
        assert (status, json.loads(raw)["error"]["message"]) == (429, "slow down")
        status, _, raw = post(srv.api_url + "/responses", codex_request([]))
        assert status == 400 and "no tool for 'Write'" in json.loads(raw)["error"]["message"]


def gemini_request(contents: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "contents": contents,
        "tools": [{"functionDeclarations": [
            {"name": "run_shell_command", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
            {"name": "read_file", "parameters": {"type": "object", "properties": {"file_path": {"type": "string"}}}},
        ]}],
        "generationConfig": {"temperature": 1},
    }  # fmt: skip


def test_gemini_stream_is_sse_data_chunks_with_the_usage_on_the_last() -> None:
    usage = Usage(input_tokens=700, output_tokens=40, cache_read_tokens=300, reasoning_tokens=25)
    prompt = {
        "role": "user",
        "parts": [
            {"text": "<session_context>\nThis is the Gemini CLI.\n</session_context>"},
            {"text": "list files"},
        ],
    }
    with GeminiServer(
        gemini_server.by_prompt(
            {"list": [shell("ls", usage=usage, reasoning="look"), Text("done")]}
        )
    ) as srv:
        url = srv.api_url + "/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        status, headers, raw = post(url, gemini_request([prompt]))
        chunks = [
            json.loads(line[len("data: ") :])
            for line in raw.decode().splitlines()
            if line.startswith("data: ")
        ]
        call = chunks[-1]["candidates"][0]["content"]["parts"][0]["functionCall"]
        answer = {
            "role": "user",
            "parts": [{"functionResponse": {"name": call["name"], "response": {"output": "a b"}}}],
        }
        model_turn = {"role": "model", "parts": [{"functionCall": call}]}
        _, _, whole = post(
            srv.api_url + "/models/gemini-2.5-flash:generateContent",
            gemini_request([prompt, model_turn, answer]),
        )

    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    # The thought first, then the call; the usage with the last chunk: the prompt counts the
    # cached part, the thoughts are apart from the candidates.
    assert chunks[0]["candidates"][0]["content"]["parts"] == [{"text": "look", "thought": True}]
    assert (call["name"], call["args"]) == (
        "run_shell_command",
        {"description": "Run a command", "command": "ls"},
    )
    assert "usageMetadata" not in chunks[0]
    assert chunks[-1]["usageMetadata"] == {
        "promptTokenCount": 1000, "candidatesTokenCount": 40, "totalTokenCount": 1065,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": 1000}],
        "cachedContentTokenCount": 300, "thoughtsTokenCount": 25,
    }  # fmt: skip
    assert chunks[-1]["modelVersion"] == "gemini-2.5-flash"
    body = json.loads(whole)
    assert body["candidates"][0]["content"]["parts"] == [{"text": "done"}]
    assert gemini_server.conversation_position(srv.model_requests[1]) == ("list files", 1)


def test_gemini_errors_use_the_google_shape_and_unknown_tools_are_refused() -> None:
    with GeminiServer([HttpError(429, "quota exceeded"), ToolCall("write", {"x": 1})]) as srv:
        url = srv.api_url + "/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        status, _, raw = post(url, gemini_request([]))
        assert (status, json.loads(raw)["error"]) == (
            429, {"code": 429, "message": "quota exceeded", "status": "RESOURCE_EXHAUSTED"}
        )  # fmt: skip
        status, _, raw = post(url, gemini_request([]))
        assert status == 400 and "no tool for 'write'" in json.loads(raw)["error"]["message"]


def test_servers_run_as_modules_and_print_their_url() -> None:
    for module in (
        "tests.fakes.anthropic_server",
        "tests.fakes.openai_server",
        "tests.fakes.gemini_server",
    ):
        process = subprocess.Popen(
            [sys.executable, "-m", module], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        try:
            assert process.stdout is not None
            url = process.stdout.readline().strip()
            assert url.startswith("http://127.0.0.1:")
            with urllib.request.urlopen(url + "/v1/models", timeout=5) as response:
                assert response.status == 200
        finally:
            process.terminate()
            process.wait(timeout=10)


# -- the real CLIs, offline against the fakes ------------------------------------------------


def cli(name: str) -> str:
    """The pinned CLI `name`; skipped when missing, a failure in CI (REPLAYS_REQUIRE_TOOLS=1)."""
    return str(require_tool(NODE_BIN / name, "make node"))


def test_claude_code_runs_a_shell_command_against_the_fake_server(tmp_path: Path) -> None:
    claude = cli("claude")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    script = anthropic_server.by_prompt(
        {"make a file": [shell("echo made > made.txt"), Text("Made it.")]}, fallback=Text("ok")
    )
    with AnthropicServer(script) as srv:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "ANTHROPIC_BASE_URL": srv.url,
            "ANTHROPIC_API_KEY": "fake",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "IS_SANDBOX": "1",
        }
        argv = [
            claude,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            "claude-sonnet-4-5",
            "--permission-mode",
            "bypassPermissions",
            "make a file",
        ]
        result = subprocess.run(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert result.returncode == 0, result.stderr
    final = json.loads(result.stdout.strip().splitlines()[-1])
    assert (final["type"], final["subtype"], final["result"]) == ("result", "success", "Made it.")
    assert (work / "made.txt").read_text() == "made\n"
    assert anthropic_server.last_is_tool_result(srv.model_requests[-1])
    assert list((home / ".claude" / "projects").glob(f"*/{final['session_id']}.jsonl"))


def test_codex_runs_a_shell_command_against_the_fake_server(tmp_path: Path) -> None:
    codex = cli("codex")
    work, codex_home = tmp_path / "work", tmp_path / "codex"
    work.mkdir()
    codex_home.mkdir()
    script = openai_server.by_prompt(
        {"make a file": [shell("echo made > made.txt"), Text("Made it.")]}
    )
    with OpenAIServer(script) as srv:
        config = [
            "model_provider=fake",
            'model_providers.fake.name="fake"',
            f'model_providers.fake.base_url="{srv.api_url}"',
            'model_providers.fake.wire_api="responses"',
            'model_providers.fake.env_key="FAKE_KEY"',
        ]
        argv = [
            codex,
            "exec",
            "--json",
            "--skip-git-repo-check",
            "-s",
            "workspace-write",
            "-m",
            "gpt-5.5",
        ]
        argv += [arg for pair in config for arg in ("-c", pair)] + ["make a file"]
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(tmp_path),
            "CODEX_HOME": str(codex_home),
            # Not the temporary folder CODEX_HOME lies in: with bwrap installed, Codex links
            # its sandbox helper there only then (FACTS.md), or no command runs.
            "TMPDIR": str(work),
            "FAKE_KEY": "fake",
        }
        result = subprocess.run(
            argv,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    commands = [
        e["item"]
        for e in events
        if e["type"] == "item.completed" and e["item"]["type"] == "command_execution"
    ]
    assert commands and commands[0]["exit_code"] == 0
    assert events[-1]["type"] == "turn.completed"
    assert (work / "made.txt").read_text() == "made\n"
    assert openai_server.last_is_tool_result(srv.model_requests[-1])
    assert list((codex_home / "sessions").rglob("rollout-*.jsonl"))


def test_gemini_cli_runs_a_shell_command_against_the_fake_server(tmp_path: Path) -> None:
    gemini = cli("gemini")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".gemini").mkdir(parents=True)
    # 0.61.0: with GOOGLE_GEMINI_BASE_URL alone it picks a "gateway" auth and refuses it
    # ("Invalid auth method selected."); naming the key's auth type in settings works.
    (home / ".gemini" / "settings.json").write_text(
        json.dumps({"security": {"auth": {"selectedType": "gemini-api-key"}}})
    )
    script = gemini_server.by_prompt(
        {"make a file": [shell("echo made > made.txt"), Text("Made it.")]}
    )
    with GeminiServer(script) as srv:
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "GEMINI_API_KEY": "fake",
            "GOOGLE_GEMINI_BASE_URL": srv.url,
        }
        argv = [gemini, "-m", "gemini-2.5-flash", "--output-format", "stream-json",
                "--approval-mode", "yolo", "--skip-trust", "-p", "make a file"]  # fmt: skip
        result = subprocess.run(
            argv, cwd=work, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
            timeout=180,
        )  # fmt: skip

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert (events[-1]["type"], events[-1]["status"]) == ("result", "success")
    assert (work / "made.txt").read_text() == "made\n"
    init = next(e for e in events if e["type"] == "init")
    assert list(
        (home / ".gemini" / "tmp").glob(f"*/chats/session-*-{init['session_id'][:8]}.jsonl")
    )


def test_opencode_runs_a_shell_command_against_the_fake_anthropic_server(tmp_path: Path) -> None:
    opencode = cli("opencode")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()

    def script(body: dict[str, Any]) -> Any:
        if not body.get("tools"):
            return Text("A title")  # OpenCode asks its small model for the session's title
        return anthropic_server.by_prompt(
            {"make a file": [shell("echo made > made.txt"), Text("Made it.")]}
        )(body)

    with AnthropicServer(script) as srv:
        config = {
            "provider": {"anthropic": {"options": {"baseURL": srv.api_url, "apiKey": "fake"}}}
        }
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "OPENCODE_CONFIG_CONTENT": json.dumps(config),
        }
        result = subprocess.run(
            [opencode, "run", "--format", "json", "-m", "anthropic/claude-sonnet-4-5", "--auto"],
            cwd=work, env=env, input="make a file", capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    finished = [e["part"] for e in events if e["type"] == "step_finish"]
    assert [step["reason"] for step in finished] == ["tool-calls", "stop"]
    assert all(step["cost"] > 0 for step in finished)  # OpenCode prices claude-sonnet-4-5 itself
    assert (work / "made.txt").read_text() == "made\n"
    assert (home / ".local" / "share" / "opencode" / "opencode.db").is_file()


def test_pi_runs_a_shell_command_against_the_fake_openai_server(tmp_path: Path) -> None:
    pi = cli("pi")
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    (home / ".pi" / "agent").mkdir(parents=True)
    script = openai_server.by_prompt(
        {"make a file": [shell("echo made > made.txt"), Text("Made it.")]}
    )
    with OpenAIServer(script) as srv:
        # pi's own OpenAI provider, sent to the fake Responses API.
        (home / ".pi" / "agent" / "models.json").write_text(
            json.dumps({"providers": {"openai": {"baseUrl": srv.api_url}}})
        )
        env = {
            "PATH": os.environ["PATH"],
            "HOME": str(home),
            "OPENAI_API_KEY": "fake",
            "PI_OFFLINE": "1",
        }
        result = subprocess.run(
            [pi, "-p", "--mode", "json", "--model", "openai/gpt-5"],
            cwd=work, env=env, input="make a file", capture_output=True, text=True, timeout=180,
        )  # fmt: skip

    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    ends = [
        e["message"]
        for e in events
        if e["type"] == "message_end" and e["message"]["role"] == "assistant"
    ]
    assert [m["stopReason"] for m in ends] == ["toolUse", "stop"]
    assert all(m["usage"]["cost"]["total"] > 0 for m in ends)  # pi prices gpt-5 itself
    assert (work / "made.txt").read_text() == "made\n"
    assert list((home / ".pi" / "agent" / "sessions").glob("*/*.jsonl"))
