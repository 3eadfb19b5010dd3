"""One replay, one batch: a Codex model, a Claude Code model and the historical baseline side
by side, with the real CLIs against scripted model servers on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from replays import pricing, repos
from replays.models import Run, RunStatus
from tests.conftest import NODE_BIN, manifest_session, require_tool
from tests.fakes import anthropic_server
from tests.fakes.anthropic_server import AnthropicServer
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import Text, Usage, shell
from tests.test_agent_claude_code import scripted_usage

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
CODEX_MODEL = "codex:gpt-5.5"
CLAUDE_MODEL = "claude:claude-sonnet-4-5"
CODEX_FIRST = Usage(input_tokens=1000, output_tokens=50, cache_read_tokens=400, reasoning_tokens=10)
CODEX_LAST = Usage(input_tokens=1300, output_tokens=30, cache_read_tokens=900)
CLAUDE_FIRST = Usage(
    input_tokens=20, output_tokens=30, cache_read_tokens=500, cache_write_5m_tokens=40
)
CLAUDE_LAST = Usage(input_tokens=25, output_tokens=12, cache_read_tokens=600)

pytestmark = pytest.mark.cli


def agents_file(path: Path, openai: OpenAIServer, anthropic: AnthropicServer) -> Path:
    provider = [
        "model_provider=fake",
        'model_providers.fake.name="fake"',
        f'model_providers.fake.base_url="{openai.api_url}"',
        'model_providers.fake.wire_api="responses"',
        'model_providers.fake.env_key="FAKE_KEY"',
    ]
    path.write_text(json.dumps({
        "codex": {
            "kind": "codex", "binary": str(require_tool(NODE_BIN / "codex", "make node")),
            "args": [arg for pair in provider for arg in ("-c", pair)],
            "env": {"FAKE_KEY": "x"}, "models": ["gpt-5.5"],
        },
        "claude": {
            "kind": "claude_code", "binary": str(require_tool(NODE_BIN / "claude", "make node")),
            "env": {"ANTHROPIC_BASE_URL": anthropic.url, "ANTHROPIC_API_KEY": "fake-key"},
            "models": ["claude-sonnet-4-5"],
        },
    }))  # fmt: skip
    return path


def test_codex_claude_and_the_historical_result_side_by_side(
    process_env: dict[str, str], tmp_path: Path, user: Any, real_threads: Any, sample_repo: Path
) -> None:
    thread = real_threads["claude-line-count"]
    first = thread.turns.get(index=0)
    codex_script = [
        shell("printf '\\n# codex was here\\n' >> textstats/core.py", usage=CODEX_FIRST),
        Text("Done.", usage=CODEX_LAST),
    ]
    claude_script = anthropic_server.by_prompt({
        "line_count function": [
            shell("echo 'claude was here' > CLAUDE.txt", usage=CLAUDE_FIRST),
            Text("Done.", CLAUDE_LAST),
        ]
    })  # fmt: skip
    with OpenAIServer(codex_script) as openai, AnthropicServer(claude_script) as anthropic:
        env = {
            **process_env,
            "HOME": str(tmp_path / "home"),
            "REPLAYS_AGENTS_FILE": str(agents_file(tmp_path / "agents.json", openai, anthropic)),
            "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
            "REPLAYS_HEARTBEAT_SECONDS": "0.5",
            "REPLAYS_MAX_PARALLEL_RUNS": "3",
        }
        (tmp_path / "home").mkdir()
        result = subprocess.run(
            [sys.executable, str(MANAGE), "replay", "--thread", str(thread.pk),
             "--from", first.message_uuid, "--to", first.message_uuid,
             "--model", CODEX_MODEL, "--model", CLAUDE_MODEL, "--model", "historical",
             "--repository", str(sample_repo), "--user", "alice",
             "--evaluator", "tests", "--verify-command", "true", "--yes", "--wait"],
            env=env, text=True, capture_output=True, timeout=120, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    runs = {run.model: run for run in Run.objects.all()}
    assert {model: run.status for model, run in runs.items()} == {
        CODEX_MODEL: RunStatus.COMPLETED,
        CLAUDE_MODEL: RunStatus.COMPLETED,
        "historical": RunStatus.COMPLETED,
    }
    # The final table names every member with its status.
    for model in (CODEX_MODEL, CLAUDE_MODEL, "historical"):
        assert model in result.stdout

    codex, claude, historical = runs[CODEX_MODEL], runs[CLAUDE_MODEL], runs["historical"]
    assert "+# codex was here" in codex.diff and repos.changed_files(codex.diff) == [
        "textstats/core.py"
    ]
    assert "+claude was here" in claude.diff and repos.changed_files(claude.diff) == ["CLAUDE.txt"]
    turn = manifest_session("claude-line-count")["turns"][0]
    assert historical.diff == repos.historical_diff(
        sample_repo, turn["head_before"], turn["commit_after"]
    )

    # Codex: the tokens the server reported; the cost from the price table (gpt-5.5).
    cached = CODEX_FIRST.cache_read_tokens + CODEX_LAST.cache_read_tokens
    fresh = CODEX_FIRST.input_tokens + CODEX_LAST.input_tokens - cached
    output = CODEX_FIRST.output_tokens + CODEX_LAST.output_tokens
    assert (codex.input_tokens, codex.cache_read_tokens, codex.output_tokens) == (
        fresh,
        cached,
        output,
    )
    assert (
        codex.cost_usd
        == (Decimal(fresh) * 5 + Decimal(cached) * Decimal("0.5") + Decimal(output) * 30)
        / 1_000_000
    )

    # Claude Code: the tokens the server reported; the cost and model time are Claude's own.
    assert claude.tokens == scripted_usage(anthropic).as_dict()
    # Its result line (2.1.332 writes the keys in another order than 2.1.197 did).
    final = next(
        event
        for line in (Path(claude.run_dir) / "agent.log").read_text().splitlines()
        if line.startswith("{") and (event := json.loads(line)).get("type") == "result"
    )
    assert claude.cost_usd == pricing.round_usd(Decimal(str(final["total_cost_usd"])))
    assert claude.model_seconds is not None

    # Both logs read as lines, not JSON.
    assert "$ printf" in codex.log_tail and "Bash: echo 'claude was here'" in claude.log_tail
    for run in (codex, claude):
        assert not [line for line in run.log_tail.splitlines() if line.lstrip().startswith("{")]
