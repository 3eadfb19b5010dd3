"""The real `codex` and `claude` binaries as evaluators, against scripted model servers that
answer through the structured-answer channel (codex: a JSON `output_text` under the strict
json_schema text format; claude: a `StructuredOutput` tool call). The replays are the two
calibration baselines, so only the evaluator calls a (scripted) model."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replays.models import ReportStatus, Review, Run, RunStatus
from tests.conftest import NODE_BIN, require_tool
from tests.fakes import anthropic_server, openai_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.openai_server import OpenAIServer, codex_provider_args
from tests.fakes.scripting import JSON, Step, Text, ToolCall, Usage

pytestmark = pytest.mark.cli

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
CHECKS_KEY = "write down what the request required"
VERDICT_KEY = "You are judging two attempts"


def answer_for(prompt: str, mode: str) -> dict[str, Any] | None:
    """What a scripted evaluator answers: checks, or a verdict preferring the attempt that
    changed something ("fair") or always attempt A ("biased"); None for anything else."""
    if CHECKS_KEY in prompt:
        return {"checks": [{"text": "line_count counts lines"}, {"text": "it has a unit test"}]}
    if VERDICT_KEY not in prompt:
        return None
    attempt_a, _, attempt_b = prompt.partition("## Attempt B")
    has_a = "(no changes)" not in attempt_a.partition("## Attempt A")[2]
    has_b = "(no changes)" not in attempt_b
    if mode == "biased":
        preferred = "A"
    else:
        preferred = "tie" if has_a == has_b else ("A" if has_a else "B")
    return {
        "checks": [
            {"id": "c1", "a": has_a, "b": has_b, "reason": "the diff adds line_count"},
            {"id": "c2", "a": has_a, "b": has_b, "reason": "the diff adds a test"},
        ],
        "score_a": 0.95 if has_a else 0.05,
        "score_b": 0.95 if has_b else 0.05,
        "preferred": preferred,
        "reason": "Only one attempt does the work.",
    }


def scripted(prompt_of: Callable[[JSON], str], reply: Callable[[dict], Step], mode: str) -> Any:
    def script(body: JSON) -> Step:
        if mode == "malformed":
            return Text("Attempt A looks better to me.", Usage(input_tokens=500, output_tokens=9))
        answer = answer_for(prompt_of(body), mode)
        return Text("ok") if answer is None else reply(answer)

    return script


def codex_script(mode: str) -> Any:
    usage = Usage(input_tokens=2000, output_tokens=120, cache_read_tokens=500)
    return scripted(
        openai_server.last_user_text, lambda answer: Text(json.dumps(answer), usage), mode
    )


def claude_script(mode: str) -> Any:
    usage = Usage(input_tokens=30, output_tokens=80, cache_read_tokens=1500)
    return scripted(
        anthropic_server.last_user_text,
        lambda answer: ToolCall("StructuredOutput", answer, usage),
        mode,
    )


@pytest.fixture
def judged_replay(
    process_env: dict[str, str], tmp_path: Path, user: Any, real_threads: Any, sample_repo: Path
) -> Callable[..., tuple[dict[str, Run], subprocess.CompletedProcess[str], Any]]:
    """replay (historical, empty) --evaluator EVALUATOR --wait, with the CLIs pointed at
    the scripted servers; the runs by model, the command's result and the server."""

    def run(evaluator: str, mode: str) -> tuple[dict[str, Run], Any, Any]:
        codex = require_tool(NODE_BIN / "codex", "make node")
        claude = require_tool(NODE_BIN / "claude", "make node")
        server = (
            OpenAIServer(codex_script(mode))
            if evaluator.startswith("codex")
            else AnthropicServer(claude_script(mode))
        ).start()
        agents: dict[str, Any] = {}
        if isinstance(server, OpenAIServer):
            agents["codex"] = {
                "kind": "codex", "binary": str(codex), "models": ["gpt-5.5"], "env": {"FAKE_KEY": "x"},
                "args": codex_provider_args(server, request_max_retries="0", stream_max_retries="0"),
            }  # fmt: skip
        else:
            agents["claude"] = {
                "kind": "claude_code", "binary": str(claude), "models": ["claude-sonnet-4-5"],
                "env": {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "fake-key",
                        "CLAUDE_CODE_MAX_RETRIES": "0"},
            }  # fmt: skip
        agents_file = tmp_path / "agents.json"
        agents_file.write_text(json.dumps(agents))
        (tmp_path / "home").mkdir(exist_ok=True)
        env = {
            **process_env,
            "HOME": str(tmp_path / "home"),
            "REPLAYS_AGENTS_FILE": str(agents_file),
            "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
            "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        }
        thread = real_threads["claude-line-count"]
        first = thread.turns.get(index=0)
        try:
            result = subprocess.run(
                [sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
                 "--from", first.message_uuid, "--model", "historical", "--model", "empty",
                 "--repository", str(sample_repo), "--evaluator", evaluator,
                 "--user", "alice", "--yes", "--wait"],
                env=env, text=True, capture_output=True, timeout=240, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            server.close()
        runs = {run.model: run for run in Run.objects.all()}
        return runs, result, server

    return run


@pytest.mark.parametrize("evaluator", ["codex:gpt-5.5", "claude:claude-sonnet-4-5"])
def test_a_real_cli_judges_history_a_tie_with_itself_and_no_change_a_loss(
    judged_replay: Any, evaluator: str
) -> None:
    runs, result, server = judged_replay(evaluator, "fair")
    assert result.returncode == 0, result.stdout + result.stderr
    historical = runs["historical"].current_report
    empty = runs["empty"].current_report
    assert (historical.winner, historical.consistent) == ("tie", True), historical.reason
    assert (empty.winner, empty.consistent) == ("historical", True), empty.reason
    assert empty.score_historical == 0.95 and empty.score_replay == 0.05
    assert [check["text"] for check in Review.objects.get().checks] == [
        "line_count counts lines",
        "it has a unit test",
    ]
    # One checks call for both runs, then two verdicts per run, the orders swapped.
    prompts = [
        (openai_server.last_user_text if isinstance(server, OpenAIServer)
         else anthropic_server.last_user_text)(body)
        for body in server.model_requests
    ]  # fmt: skip
    assert sum(CHECKS_KEY in prompt for prompt in prompts) == 1
    assert sum(VERDICT_KEY in prompt for prompt in prompts) == 4
    mapping = empty.data["mapping"]
    assert mapping["first_order"] == {
        "A": mapping["second_order"]["B"],
        "B": mapping["second_order"]["A"],
    }
    # The evaluator's cost is its own (priced from the table, or Claude's own figure).
    assert empty.evaluator_cost_usd is not None and empty.evaluator_cost_usd > 0
    assert runs["empty"].cost_usd == 0
    assert "historical" in result.stdout.splitlines()[-1]  # the table's winner column


def test_a_real_claude_that_prefers_whatever_comes_first_gives_an_inconsistent_tie(
    judged_replay: Any,
) -> None:
    runs, result, _ = judged_replay("claude:claude-sonnet-4-5", "biased")
    assert result.returncode == 0, result.stdout + result.stderr
    for run in runs.values():
        report = run.current_report
        assert (report.winner, report.consistent) == ("tie", False)
    assert "tie (split)" in result.stdout


def test_a_real_codex_answering_malformed_json_fails_the_review_and_keeps_the_diff(
    judged_replay: Any,
) -> None:
    runs, result, _ = judged_replay("codex:gpt-5.5", "malformed")
    assert result.returncode == 0, result.stdout + result.stderr
    historical = runs["historical"]
    assert historical.status == RunStatus.COMPLETED and "diff --git" in historical.diff
    report = historical.current_report
    assert report.status == ReportStatus.REVIEW_FAILED and report.winner is None
    assert "gave no usable checks" in report.reason and "not JSON" in report.reason
    assert historical.batch.results_ready
    assert "not judged" in result.stdout
