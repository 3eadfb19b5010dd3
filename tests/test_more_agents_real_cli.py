"""Gemini CLI, OpenCode and pi as agents and evaluators, with the pinned real CLIs (tests/node:
gemini 0.61.0, opencode 1.18.33, pi 0.73.1) against scripted model servers on loopback,
through `manage.py replay --wait`, sandboxed as every run is.

Gemini CLI talks to the fake Gemini API; OpenCode to the fake Anthropic API (its own
`anthropic` provider, pointed there by its configuration); pi to the fake OpenAI Responses
API (its own `openai` provider, pointed there by its models.json). The threads are the
sessions the same CLIs wrote (tests/fixtures/transcripts/real/), copied with their folder
pointed at this test's clone of the repository.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from replays import agents, importing, pricing, repos
from replays.evaluation import leaderboard
from replays.models import FailureCode, Run, RunStatus, Thread
from replays.transcripts.base import TokenUsage
from tests.conftest import NODE_BIN, REAL_TRANSCRIPTS, manifest_session, require_tool
from tests.fakes import anthropic_server, gemini_server, openai_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.gemini_server import GeminiServer
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import JSON, HttpError, Step, Text, ToolCall, Usage

pytestmark = pytest.mark.cli

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
FIXTURE_FOLDER = "/var/tmp/replays-fixtures/textstats"
GEMINI = "gemini:gemini-2.5-flash"
OPENCODE = "opencode:anthropic/claude-sonnet-4-5"
PI = "pi:openai/gpt-5"
CLAUDE = "claude:claude-sonnet-4-5"
CODEX = "codex:gpt-5.5"
# Usage per answer, distinct so sums show each counted once (the cached part is inside
# OpenAI's input; apart from Anthropic's and from Gemini's non-cached input).
U1 = Usage(input_tokens=1200, output_tokens=30, cache_read_tokens=100, reasoning_tokens=7)
U2 = Usage(input_tokens=1400, output_tokens=20, cache_read_tokens=300)
U3 = Usage(input_tokens=900, output_tokens=40, cache_read_tokens=200, cache_write_5m_tokens=60)


def agents_file(
    path: Path, gemini: GeminiServer, anthropic: AnthropicServer, openai: OpenAIServer, **env: str
) -> Path:
    """The five agents, each at its fake server; `env` adds to every agent's (or, when a
    value is "", takes a key away: a missing login)."""

    def with_env(given: dict[str, str]) -> dict[str, str]:
        merged = {**given, **env}
        return {key: value for key, value in merged.items() if value}

    agents = {
        "gemini": {
            "kind": "gemini", "binary": str(require_tool(NODE_BIN / "gemini", "make node")),
            "env": with_env({"GEMINI_API_KEY": "fake-key", "GOOGLE_GEMINI_BASE_URL": gemini.url}),
            "models": ["gemini-2.5-flash"],
        },
        "opencode": {
            "kind": "opencode", "binary": str(require_tool(NODE_BIN / "opencode", "make node")),
            "env": with_env({}),
            "config": {"provider": {"anthropic": {"options": {
                "baseURL": anthropic.api_url, **({} if env.get("ANTHROPIC_API_KEY") == "" else {"apiKey": "fake-key"})
            }}}},
            "models": ["anthropic/claude-sonnet-4-5"],
        },
        "pi": {
            "kind": "pi", "binary": str(require_tool(NODE_BIN / "pi", "make node")),
            "env": with_env({"OPENAI_API_KEY": "fake-key"}),
            "models_json": {"providers": {"openai": {"baseUrl": openai.api_url}}},
            "models": ["openai/gpt-5"],
        },
        "claude": {
            "kind": "claude_code", "binary": str(require_tool(NODE_BIN / "claude", "make node")),
            "env": {"ANTHROPIC_BASE_URL": anthropic.url, "ANTHROPIC_API_KEY": "fake-key"},
            "permission_mode": "bypassPermissions", "models": ["claude-sonnet-4-5"],
        },
    }  # fmt: skip
    path.write_text(json.dumps(agents))
    return path


@pytest.fixture
def scene(process_env: dict[str, str], tmp_path: Path, user: Any, sample_repo: Path) -> Any:
    class Scene:
        checkout = sample_repo

        def env(
            self, gemini: GeminiServer, anthropic: AnthropicServer, openai: OpenAIServer, **env: str
        ) -> dict[str, str]:
            (tmp_path / "home").mkdir(exist_ok=True)
            return {
                **process_env,
                "HOME": str(tmp_path / "home"),
                "REPLAYS_AGENTS_FILE": str(agents_file(tmp_path / "agents.json", gemini, anthropic, openai, **env)),
                "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
                "REPLAYS_HEARTBEAT_SECONDS": "0.5",
                "REPLAYS_MAX_PARALLEL_RUNS": "4",
            }  # fmt: skip

        def thread(self, name: str) -> Thread:
            """The fixture session `name` as if it had run in the checkout (OpenCode's: its
            `opencode export` document), imported for the user."""
            session = manifest_session(name)
            source = REAL_TRANSCRIPTS / session.get("export_path", session["path"])
            copy = tmp_path / "history" / source.name
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(source.read_text().replace(FIXTURE_FOLDER, str(sample_repo)))
            result = importing.import_transcript_file(path=copy, user=user)
            assert result.thread is not None, result.error
            return result.thread

        def untouched(self) -> None:
            status = subprocess.run(
                ["git", "-C", str(sample_repo), "status", "--porcelain"],
                capture_output=True, text=True, check=True,
            ).stdout  # fmt: skip
            assert status == "", status

    return Scene()


def replay(
    env: dict[str, str],
    thread: Thread,
    first: int,
    last: int,
    *models: str,
    extra: tuple[str, ...] = (),
    repository: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`manage.py replay --wait` of requests first..last. Gemini CLI, OpenCode and pi record
    no commit and no branch, and in this repository more than one commit could be the
    baseline: the fixture's manifest answers the question a user would be asked."""
    turns = {turn.index + 1: turn.message_uuid for turn in thread.turns.all()}
    evaluator = () if "--evaluator" in extra else ("--evaluator", "tests")
    argv = [
        sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
        "--from", turns[first], "--to", turns[last],
        *[arg for model in models for arg in ("--model", model)], *evaluator, *extra,
        *_commits(thread, first, last), "--user", "alice",
        *(("--repository", str(repository)) if repository is not None else ()),
        "--verify-command", "true", "--yes", "--wait",
    ]  # fmt: skip
    return subprocess.run(
        argv, env=env, text=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL
    )


def _commits(thread: Thread, first: int, last: int) -> list[str]:
    manifest = json.loads((REAL_TRANSCRIPTS / "manifest.json").read_text())
    session = next((s for s in manifest["sessions"] if s["session_id"] == thread.session_id), None)
    if session is None or session["kind"] in ("claude_code", "codex"):
        return []
    turns = session["turns"][first - 1 : last]
    # A range that committed nothing ends where it began: no change.
    ending = next((t["commit_after"] for t in reversed(turns) if t["commit_after"]), None)
    return ["--baseline", turns[0]["head_before"], "--ending", ending or turns[0]["head_before"]]


def runs() -> dict[str, Run]:
    return {run.model: run for run in Run.objects.all()}


def completed(result: subprocess.CompletedProcess[str]) -> dict[str, Run]:
    found = runs()
    assert result.returncode == 0, result.stdout + result.stderr
    assert {run.status for run in found.values()} == {RunStatus.COMPLETED}, {
        model: run.failure_message for model, run in found.items()
    }
    return found


def by_key(plans: dict[str, list[Any]], position: Any, fallback: Step | None = None) -> Any:
    """A script: the steps of the first plan whose key is in the latest prompt, by how many
    answers follow it (a step may be a callable of the request); requests without tools
    (OpenCode's title) get `fallback`."""

    def script(body: JSON) -> Step:
        if fallback is not None and not body.get("tools"):
            return fallback
        prompt, index = position(body)
        for key, steps in plans.items():
            if key in prompt and index < len(steps):
                step = steps[index]
                return step(body) if callable(step) else step
        return HttpError(400, f"no scripted step for {prompt[:100]!r} at {index}")

    return script


TITLE = Text("A title", Usage(input_tokens=40, output_tokens=4))


def gemini_usage(steps: list[Usage]) -> TokenUsage:
    """Gemini's usage as disjoint kinds: its thoughts are output."""
    return TokenUsage(
        input_tokens=sum(s.input_tokens for s in steps),
        output_tokens=sum(s.output_tokens + s.reasoning_tokens for s in steps),
        cache_read_tokens=sum(s.cache_read_tokens for s in steps),
    )


def openai_usage(steps: list[Usage]) -> TokenUsage:
    cached = sum(s.cache_read_tokens for s in steps)
    return TokenUsage(
        input_tokens=sum(s.input_tokens for s in steps) - cached,
        output_tokens=sum(s.output_tokens for s in steps),
        cache_read_tokens=cached,
    )


def anthropic_usage(steps: list[Usage]) -> TokenUsage:
    return TokenUsage(
        input_tokens=sum(s.input_tokens for s in steps),
        output_tokens=sum(s.output_tokens for s in steps),
        cache_read_tokens=sum(s.cache_read_tokens for s in steps),
        cache_write_5m_tokens=sum(s.cache_write_5m_tokens for s in steps),
    )


# --- each tool replays its own request: the historical change, its usage and cost ---------


LONGEST_WORD = '''

def longest_word(text: str) -> str:
    """The longest word ("" for text without words)."""
    return max(text.split(), key=len, default="")
'''
WORD_RETURN = "    return len(text.split())\n"
VOWEL_COUNT = '''

def vowel_count(text: str) -> int:
    """Number of vowels (a, e, i, o, u; either case)."""
    return sum(1 for char in text.lower() if char in "aeiou")
'''
CONTRIBUTING = "# Contributing\n\nRun the tests with `python3 -m unittest`.\n"


def test_each_tool_replays_its_own_request_to_the_historical_change(scene: Any) -> None:
    """Request #1 of each tool's own session, replayed by that tool (the first request: cold)
    with the edits its historical turn made: the run's diff is the historical one, its
    tokens are what the server reported, its cost the tool's own (OpenCode, pi) or the
    price table's (Gemini CLI, which reports none)."""
    threads = {
        name: scene.thread(name)
        for name in ("gemini-longest-word", "opencode-contributing", "pi-vowel-count")
    }
    gemini_steps = [
        ToolCall("edit", {"file_path": "textstats/core.py", "instruction": "Add longest_word.",
                          "old_string": WORD_RETURN, "new_string": WORD_RETURN + LONGEST_WORD}, U1),
        Text("Added longest_word.", U2),
    ]  # fmt: skip
    opencode_steps = [
        ToolCall("write", {"filePath": "CONTRIBUTING.md", "content": CONTRIBUTING}, U3),
        Text("Added CONTRIBUTING.md.", U2),
    ]
    pi_steps = [
        ToolCall("edit", {"path": "textstats/core.py", "edits": [{"oldText": WORD_RETURN, "newText": WORD_RETURN + VOWEL_COUNT}]}, U1),
        Text("Added vowel_count.", U2),
    ]  # fmt: skip
    with (
        GeminiServer(by_key({"longest_word": gemini_steps}, gemini_server.conversation_position)) as gemini,
        AnthropicServer(by_key({"CONTRIBUTING": opencode_steps}, anthropic_server.conversation_position, TITLE)) as anthropic,
        OpenAIServer(by_key({"vowel_count": pi_steps}, openai_server.conversation_position)) as openai,
    ):  # fmt: skip
        env = scene.env(gemini, anthropic, openai)
        results = {
            model: replay(env, threads[name], 1, 1, model)
            for name, model in (("gemini-longest-word", GEMINI), ("opencode-contributing", OPENCODE), ("pi-vowel-count", PI))
        }  # fmt: skip
    for model, result in results.items():
        assert result.returncode == 0, (model, result.stdout + result.stderr)
    found = runs()
    assert {model: run.status for model, run in found.items()} == dict.fromkeys(
        (GEMINI, OPENCODE, PI), RunStatus.COMPLETED
    ), {model: run.failure_message for model, run in found.items()}

    for name, model in (
        ("gemini-longest-word", GEMINI),
        ("opencode-contributing", OPENCODE),
        ("pi-vowel-count", PI),
    ):
        turn = manifest_session(name)["turns"][0]
        assert found[model].diff == repos.historical_diff(
            scene.checkout, turn["head_before"], turn["commit_after"]
        ), model
    scene.untouched()

    gemini_run, opencode_run, pi_run = found[GEMINI], found[OPENCODE], found[PI]
    # Gemini CLI: the tokens the server reported (thoughts are output), priced from the table.
    assert gemini_run.tokens == gemini_usage([U1, U2]).as_dict()
    table = pricing.load_price_table()
    assert gemini_run.cost_usd == pricing.round_usd(
        pricing.cost_usd("gemini-2.5-flash", gemini_usage([U1, U2]), table)
    )
    # OpenCode: its own cost, the sum of its steps' (Sonnet 4.5 at 3 / 15 / 0.30 / 3.75).
    assert opencode_run.tokens == anthropic_usage([U3, U2]).as_dict()
    assert opencode_run.cost_usd == pricing.round_usd(
        pricing.cost_usd("claude-sonnet-4-5", anthropic_usage([U3, U2]), table)
    )
    # pi: its own cost too (gpt-5 in its table); OpenAI's input holds the cached part.
    assert pi_run.tokens == openai_usage([U1, U2]).as_dict()
    assert pi_run.cost_usd == pricing.round_usd(
        pricing.cost_usd("gpt-5", openai_usage([U1, U2]), table)
    )
    # The logs read as lines, not JSON.
    for run in (gemini_run, opencode_run, pi_run):
        assert not [line for line in run.log_tail.splitlines() if line.lstrip().startswith("{")], (
            run.log_tail
        )
    assert "replace textstats/core.py" in gemini_run.log_tail
    assert "write CONTRIBUTING.md" in opencode_run.log_tail
    assert "edit textstats/core.py" in pi_run.log_tail


# --- forks of each tool's own session, and ranges turn by turn --------------------------


NOTES = "# Notes\n\n`longest_word` returns an empty string for text without words.\n"
VERBOSE = "For every test's name, run `python3 -m unittest -v`.\n"
RUN_LINE = "Run the tests with `python3 -m unittest`.\n"


def gemini_history(body: JSON) -> list[str]:
    """What came before the request's own prompt: each part's kind (text, functionCall...)."""
    contents = body["contents"]
    last = max(
        i
        for i, c in enumerate(contents)
        if c["role"] == "user" and any("text" in p for p in c["parts"])
    )
    return [next(iter(part)) for content in contents[:last] for part in content["parts"]]


def anthropic_history(body: JSON) -> list[str]:
    return [
        block.get("type", "text") if isinstance(block, dict) else "text"
        for message in body["messages"][:-1]
        for block in (
            message["content"] if isinstance(message["content"], list) else [message["content"]]
        )
    ]


def openai_history(body: JSON) -> list[str]:
    items = body["input"]
    last = max(i for i, item in enumerate(items) if item.get("role") == "user")
    return [item.get("role") or item["type"] for item in items[:last]]


def test_a_later_request_forks_each_tools_own_session(scene: Any) -> None:
    """Request #2 of each tool's session, forked by the same tool: its turn 1 (request, tool
    calls and results, answer) reaches the model before request #2, the history names the
    run's worktree, and the change is the historical one, made in the worktree."""
    names = {GEMINI: "gemini-longest-word", OPENCODE: "opencode-contributing", PI: "pi-vowel-count"}
    threads = {model: scene.thread(name) for model, name in names.items()}
    gemini_steps = [
        ToolCall("write", {"file_path": "NOTES.md", "content": NOTES}, U1),
        Text("Wrote NOTES.md.", U2),
    ]
    opencode_steps = [
        ToolCall("edit", {"filePath": "CONTRIBUTING.md", "oldString": RUN_LINE, "newString": RUN_LINE + VERBOSE}, U3),
        Text("Mentioned it.", U2),
    ]  # fmt: skip
    pi_steps = [Text("It defines 2 functions.", U2)]
    with (
        GeminiServer(by_key({"NOTES.md": gemini_steps}, gemini_server.conversation_position)) as gemini,
        AnthropicServer(by_key({"unittest -v": opencode_steps}, anthropic_server.conversation_position, TITLE)) as anthropic,
        OpenAIServer(by_key({"How many functions": pi_steps}, openai_server.conversation_position)) as openai,
    ):  # fmt: skip
        env = scene.env(gemini, anthropic, openai)
        results = {
            model: replay(env, threads[model], 2, 2, model, extra=("--context", "fork"))
            for model in names
        }
    for model, result in results.items():
        assert result.returncode == 0, (model, result.stdout + result.stderr)
        assert f"context of {model}: fork" in result.stdout
    found = runs()
    assert {model: run.status for model, run in found.items()} == dict.fromkeys(
        names, RunStatus.COMPLETED
    ), {model: run.failure_message for model, run in found.items()}
    for model, name in names.items():
        turns = manifest_session(name)["turns"]
        end = turns[1]["commit_after"] or turns[1]["head_before"]
        assert found[model].diff == repos.historical_diff(
            scene.checkout, turns[1]["head_before"], end
        ), model
        assert found[model].configuration["context"] == "fork"
    scene.untouched()

    # What each model was sent first for request #2: turn 1, whole, then the request.
    first_gemini = next(
        b for b in gemini.model_requests if "NOTES.md" in gemini_server.conversation_position(b)[0]
    )
    assert gemini_history(first_gemini).count("functionCall") == 3  # read, replace, shell
    assert "Add a longest_word function" in json.dumps(first_gemini["contents"])
    first_opencode = next(
        b
        for b in anthropic.model_requests
        if b.get("tools") and "unittest -v" in anthropic_server.conversation_position(b)[0]
    )
    assert anthropic_history(first_opencode).count("tool_use") == 2  # write, bash
    assert "Add a CONTRIBUTING.md" in json.dumps(first_opencode["messages"])
    first_pi = next(
        b
        for b in openai.model_requests
        if "How many functions" in openai_server.conversation_position(b)[0]
    )
    assert openai_history(first_pi).count("function_call") == 3  # read, edit, bash
    assert "Add a vowel_count function" in json.dumps(first_pi["input"])
    # The history names the run's worktree, never the user's checkout.
    for model, sent in ((GEMINI, first_gemini), (OPENCODE, first_opencode), (PI, first_pi)):
        text = json.dumps(sent)
        assert str(scene.checkout) not in text, model
        assert found[model].workspace_path in text, model
    # Each model's usage is this request's alone (not the forked history's).
    assert found[GEMINI].tokens == gemini_usage([U1, U2]).as_dict()
    assert found[OPENCODE].tokens == anthropic_usage([U3, U2]).as_dict()
    assert found[PI].tokens == openai_usage([U2]).as_dict()


def test_a_two_request_range_is_two_turns_of_each_tools_own_session(scene: Any) -> None:
    """Requests #1 and #2 from a cold start, each its own turn: the second process resumes
    the session the first one made (its history arrives with request #2)."""
    names = {GEMINI: "gemini-longest-word", OPENCODE: "opencode-contributing", PI: "pi-vowel-count"}
    threads = {model: scene.thread(name) for model, name in names.items()}
    gemini_script = by_key(
        {"longest_word function": [Text("Looked at it.", U1)], "NOTES.md": [Text("Done too.", U2)]},
        gemini_server.conversation_position,
    )
    opencode_script = by_key(
        {"Add a CONTRIBUTING": [Text("Looked at it.", U3)], "unittest -v": [Text("Done too.", U2)]},
        anthropic_server.conversation_position, TITLE,
    )  # fmt: skip
    pi_script = by_key(
        {
            "vowel_count function": [Text("Looked at it.", U1)],
            "How many functions": [Text("Two.", U2)],
        },
        openai_server.conversation_position,
    )
    with (
        GeminiServer(gemini_script) as gemini,
        AnthropicServer(opencode_script) as anthropic,
        OpenAIServer(pi_script) as openai,
    ):
        env = scene.env(gemini, anthropic, openai)
        results = {model: replay(env, threads[model], 1, 2, model) for model in names}
    for model, result in results.items():
        assert result.returncode == 0, (model, result.stdout + result.stderr)
    found = runs()
    for model in names:
        run = found[model]
        assert run.status == RunStatus.COMPLETED, run.failure_message
        assert len(run.turns) == 2 and run.turns[0]["session_id"] == run.turns[1]["session_id"], (
            run.turns
        )
    # The second request arrived after the first one's exchange, in the same conversation.
    second_gemini = next(
        b for b in gemini.model_requests if "NOTES.md" in gemini_server.conversation_position(b)[0]
    )
    assert "Looked at it." in json.dumps(second_gemini["contents"])
    second_opencode = next(
        b
        for b in anthropic.model_requests
        if b.get("tools") and "unittest -v" in anthropic_server.conversation_position(b)[0]
    )
    assert "Looked at it." in json.dumps(second_opencode["messages"])
    second_pi = next(
        b
        for b in openai.model_requests
        if "How many functions" in openai_server.conversation_position(b)[0]
    )
    assert "Looked at it." in json.dumps(second_pi["input"])
    # Each turn's usage is its own; the run's is their sum.
    assert found[GEMINI].tokens == gemini_usage([U1, U2]).as_dict()
    assert found[OPENCODE].tokens == anthropic_usage([U3, U2]).as_dict()
    assert found[PI].tokens == openai_usage([U1, U2]).as_dict()


# --- judging ---------------------------------------------------------------------------------


CHECKS_KEY = "write down what the request required"
VERDICT_KEY = "You are judging two attempts"


def judge_answer(prompt: str) -> dict[str, Any] | None:
    """What a fair evaluator answers: the checks, or a verdict for the attempt that changed
    something (a tie when both or neither did)."""
    if CHECKS_KEY in prompt:
        return {"checks": [{"text": "line_count counts lines"}, {"text": "it has a unit test"}]}
    if VERDICT_KEY not in prompt:
        return None
    attempt_a, _, attempt_b = prompt.partition("## Attempt B")
    has_a = "(no changes)" not in attempt_a.partition("## Attempt A")[2]
    has_b = "(no changes)" not in attempt_b
    return {
        "checks": [
            {"id": "c1", "a": has_a, "b": has_b, "reason": "the diff adds line_count"},
            {"id": "c2", "a": has_a, "b": has_b, "reason": "the diff adds a test"},
        ],
        "score_a": 0.95 if has_a else 0.05,
        "score_b": 0.95 if has_b else 0.05,
        "preferred": "tie" if has_a == has_b else ("A" if has_a else "B"),
        "reason": "Only one attempt does the work.",
    }


def judging(last_text: Any, wrap: Any) -> Any:
    usage = Usage(input_tokens=2000, output_tokens=120, cache_read_tokens=500)

    def script(body: JSON) -> Step:
        answer = judge_answer(last_text(body))
        return TITLE if answer is None else Text(wrap(json.dumps(answer)), usage)

    return script


@pytest.mark.parametrize("evaluator", [GEMINI, OPENCODE, PI])
def test_each_tool_judges_history_a_tie_with_itself_and_no_change_a_loss(
    scene: Any, real_threads: Any, evaluator: str
) -> None:
    """The calibration baselines of a Claude Code request, judged by each tool: Gemini CLI
    answers through the Gemini API's structured output (the schema sent, no tool offered),
    OpenCode as an agent with no tool (its answer in a code block, taken out), pi with no
    tool; history ties with itself, no change loses, both orders agree."""
    gemini_judge = judging(gemini_server.last_user_text, lambda text: text)
    opencode_judge = judging(
        anthropic_server.last_user_text, lambda text: f"Here it is:\n```json\n{text}\n```"
    )
    pi_judge = judging(openai_server.last_user_text, lambda text: text)
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    with (
        GeminiServer(gemini_judge) as gemini,
        AnthropicServer(opencode_judge) as anthropic,
        OpenAIServer(pi_judge) as openai,
    ):
        env = scene.env(gemini, anthropic, openai)
        result = subprocess.run(
            [sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
             "--from", first.message_uuid, "--model", "historical", "--model", "empty",
             "--repository", str(scene.checkout), "--evaluator", evaluator,
             "--user", "alice", "--yes", "--wait"],
            env=env, text=True, capture_output=True, timeout=600, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    found = runs()
    historical, empty = found["historical"].current_report, found["empty"].current_report
    assert (historical.winner, historical.consistent) == ("tie", True), historical.reason
    assert (empty.winner, empty.consistent) == ("historical", True), empty.reason
    assert empty.evaluator == evaluator
    assert empty.evaluator_cost_usd is not None and empty.evaluator_cost_usd > 0
    # One checks call for both runs, then two verdicts per run; the model was offered no tool.
    if evaluator == GEMINI:
        judged = gemini.model_requests
        assert all(gemini_server.declared_tools(body) == [] for body in judged)
        # The answer's schema went to the API as its structured output.
        config = judged[0]["generationConfig"]
        assert config["responseMimeType"] == "application/json"
        assert config["responseJsonSchema"]["required"] == ["checks"]
    elif evaluator == OPENCODE:
        # (OpenCode asks its small model for each session's title as well.)
        judged = [body for body in anthropic.model_requests if body["model"] == "claude-sonnet-4-5"]
        assert all(not body.get("tools") for body in judged)
    else:
        judged = openai.model_requests
        assert all(not body.get("tools") for body in judged)
    assert len(judged) == 5


# --- across agents: one agent's request replayed by the others, judged, on one leaderboard ---


def combined(candidate: Any, last_text: Any) -> Any:
    """A script that judges (checks and verdicts, in JSON) and otherwise answers as the
    candidate's script says."""
    usage = Usage(input_tokens=2000, output_tokens=120, cache_read_tokens=500)

    def script(body: JSON) -> Step:
        answer = judge_answer(last_text(body))
        return candidate(body) if answer is None else Text(json.dumps(answer), usage)

    return script


def test_requests_cross_agents_with_the_digest_and_one_leaderboard_ranks_them_all(
    scene: Any, real_threads: Any, user: Any
) -> None:
    """A Claude Code request replayed by Gemini CLI, OpenCode and pi (each gets the digest of
    request #1: none of them resumes a Claude Code session), judged by Gemini CLI; and a
    Gemini CLI request replayed by Claude Code (the digest too), judged by pi. The
    leaderboard lists every agent's model."""
    claude_thread = real_threads["claude-cli"]
    gemini_thread = real_threads["gemini-longest-word"]
    flag = ToolCall("write", {"file_path": "lines_flag.txt", "content": "--lines\n"}, U1)
    gemini_script = combined(
        by_key(
            {"--lines": [flag, Text("Added the flag.", U2)]}, gemini_server.conversation_position
        ),
        gemini_server.last_user_text,
    )
    anthropic_script = by_key(
        {
            "--lines": [ToolCall("write", {"filePath": "lines_flag.txt", "content": "--lines\n"}, U3), Text("Added it.", U2)],
            "NOTES.md": [ToolCall("write", {"file_path": "NOTES.md", "content": NOTES}, U3), Text("Wrote NOTES.md.", U2)],
        },
        anthropic_server.conversation_position, TITLE,
    )  # fmt: skip
    pi_script = combined(
        by_key({"--lines": [ToolCall("write", {"path": "lines_flag.txt", "content": "--lines\n"}, U1), Text("Added.", U2)]},
               openai_server.conversation_position),
        openai_server.last_user_text,
    )  # fmt: skip
    with (
        GeminiServer(gemini_script) as gemini,
        AnthropicServer(anthropic_script) as anthropic,
        OpenAIServer(pi_script) as openai,
    ):
        env = scene.env(gemini, anthropic, openai)
        forward = replay(
            env,
            claude_thread,
            2,
            2,
            GEMINI,
            OPENCODE,
            PI,
            "historical",
            extra=("--evaluator", GEMINI),
            repository=scene.checkout,
        )
        backward = replay(
            env, gemini_thread, 2, 2, CLAUDE, extra=("--evaluator", PI), repository=scene.checkout
        )
    for result in (forward, backward):
        assert result.returncode == 0, result.stdout + result.stderr
    found = runs()
    assert {model: run.status for model, run in found.items()} == dict.fromkeys(
        (GEMINI, OPENCODE, PI, "historical", CLAUDE), RunStatus.COMPLETED
    ), {model: run.failure_message for model, run in found.items()}
    for model in (GEMINI, OPENCODE, PI):
        assert (
            f"context of {model}: digest (a later request; no fork: the thread is a Claude Code session"
            in forward.stdout
        )
        run = found[model]
        assert run.configuration["context"] == "digest"
        assert repos.changed_files(run.diff) == ["lines_flag.txt"]  # in the worktree's top
        report = run.current_report
        assert report is not None and report.evaluator == GEMINI and report.winner is not None
    assert (
        f"context of {CLAUDE}: digest (a later request; no fork: the thread is a Gemini CLI session"
        in backward.stdout
    )
    # The digest: request #1 and the agent's answer to it, then the request. Gemini CLI is
    # the evaluator too, and the batch's runs go side by side: the judge's prompts (which
    # quote the request) may reach the server before the Gemini run's first one.
    prompt = next(
        text
        for text, _ in map(gemini_server.conversation_position, gemini.model_requests)
        if "--lines" in text and CHECKS_KEY not in text and VERDICT_KEY not in text
    )
    assert prompt.index("## Request #1") < prompt.index("python3 -m textstats")
    claude_sent = next(
        b
        for b in anthropic.model_requests
        if "NOTES.md" in anthropic_server.conversation_position(b)[0]
        and "## Request #1" in anthropic_server.conversation_position(b)[0]
    )
    assert "Add a longest_word function" in anthropic_server.conversation_position(claude_sent)[0]
    claude_report = found[CLAUDE].current_report
    assert (
        claude_report is not None
        and claude_report.evaluator == PI
        and claude_report.winner is not None
    )

    # One leaderboard: a row for each agent's model, the agents to filter by.
    board = leaderboard.leaderboard(
        user=user, filters=leaderboard.parse_filters({"evaluator": GEMINI})
    )
    assert {GEMINI, OPENCODE, PI} <= set(board.models)
    assert board.choices is not None
    agents = {choice.value for choice in board.choices.agents}
    assert {"gemini", "opencode", "pi", "claude"} <= agents
    board = leaderboard.leaderboard(
        user=user, filters=leaderboard.parse_filters({"evaluator": GEMINI, "agent": "pi"})
    )
    assert [row.model for row in board.rows if not row.baseline] == [PI]


# --- setup failures: no login ------------------------------------------------------------


def test_a_tool_given_no_key_fails_as_setup_in_its_own_words(scene: Any) -> None:
    """Each tool run without a key (its own home has none): the run fails as `setup`, not
    the model's failure, saying what the tool said, and the model was never asked."""
    names = {GEMINI: "gemini-longest-word", OPENCODE: "opencode-contributing", PI: "pi-vowel-count"}
    threads = {model: scene.thread(name) for model, name in names.items()}
    never = HttpError(500, "no model may be asked without a key")
    with (
        GeminiServer([never]) as gemini,
        AnthropicServer([never]) as anthropic,
        OpenAIServer([never]) as openai,
    ):
        env = scene.env(
            gemini, anthropic, openai, GEMINI_API_KEY="", OPENAI_API_KEY="", ANTHROPIC_API_KEY=""
        )
        for model in names:
            replay(env, threads[model], 1, 1, model)
        asked = gemini.model_requests + anthropic.model_requests + openai.model_requests
    found = runs()
    for model in names:
        run = found[model]
        assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP), (
            model,
            run.failure_message,
        )
    assert "must specify the GEMINI_API_KEY" in found[GEMINI].failure_message
    assert "Anthropic API key is missing" in found[OPENCODE].failure_message
    assert "No API key found for openai." in found[PI].failure_message
    for run in found.values():
        assert "Setup problem (not logged in)" in run.failure_message  # with its fix
    assert asked == []


def test_opencode_and_pi_list_the_models_their_logins_reach(settings: Any) -> None:
    """With "discover_models", the models the tool itself lists for the entry's key come
    after those the entry names (Gemini CLI lists none: it refuses the key)."""
    settings.REPLAYS_AGENTS = {
        "opencode": {
            "kind": "opencode", "binary": str(require_tool(NODE_BIN / "opencode", "make node")),
            "models": ["anthropic/claude-sonnet-4-5"], "env": {"ANTHROPIC_API_KEY": "fake"},
            "discover_models": True,
        },
        "pi": {
            "kind": "pi", "binary": str(require_tool(NODE_BIN / "pi", "make node")),
            "models": [], "env": {"OPENAI_API_KEY": "fake"}, "discover_models": True,
        },
    }  # fmt: skip
    found = [info.id for info in agents.discover_models()]
    assert found.index("opencode:anthropic/claude-sonnet-4-5") < found.index(
        "opencode:anthropic/claude-opus-4-5"
    )
    assert "pi:openai/gpt-5" in found
    assert not any(model.startswith("pi:anthropic/") for model in found)  # no key for it
