"""Whether an agent's runs will have a login, known before anything is spent: a run's agent
gets a home of its own holding only its seed files, so what it is given is all it has.
A missing login shows on GET /api/models/, the replay form, the plan (a warning with the
fix) and the doctor."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command

from replays import planning
from replays.agents.claude_code import ClaudeCodeAgent
from replays.agents.codex import CodexAgent
from replays.agents.problems import MISSING, READY, UNKNOWN
from replays.factories.runs import make_git_repo

FAKE_PROVIDER = [
    "-c", "model_provider=fake",
    "-c", 'model_providers.fake.env_key="FAKE_KEY"',
]  # fmt: skip


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "CLAUDE_CODE_OAUTH_TOKEN",
                 "CLAUDE_CODE_USE_BEDROCK", "CLAUDE_CODE_USE_VERTEX", "OPENAI_API_KEY",
                 "CODEX_API_KEY", "FAKE_KEY"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({}, MISSING),
        ({"env": {"ANTHROPIC_API_KEY": "sk-ant"}}, READY),
        ({"env": {"ANTHROPIC_API_KEY": "  "}}, MISSING),
        ({"seed_files": {".claude/.credentials.json": "~/.claude/.credentials.json"}}, READY),
        ({"seed_files": {".claude/settings.json": "/etc/x.json"}}, UNKNOWN),
        ({"env": {"CLAUDE_CODE_USE_BEDROCK": "1"}}, READY),
    ],
)
def test_claude_codes_login_is_read_from_what_its_runs_are_given(
    clean_environment: None, entry: dict[str, Any], state: str
) -> None:
    login = ClaudeCodeAgent.login({"kind": "claude_code", "models": ["m"], **entry})
    assert login.state == state
    if state == MISSING:
        assert "Not logged in" in login.message and "seed_files" in login.message


def test_the_services_own_key_reaches_the_runs(
    clean_environment: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant")
    assert ClaudeCodeAgent.login({"kind": "claude_code", "models": ["m"]}).state == READY


@pytest.mark.parametrize(
    ("entry", "state"),
    [
        ({}, MISSING),
        ({"env": {"OPENAI_API_KEY": "sk"}}, READY),
        ({"seed_files": {"auth.json": "~/.codex/auth.json"}}, READY),
        ({"args": FAKE_PROVIDER}, MISSING),
        ({"args": FAKE_PROVIDER, "env": {"FAKE_KEY": "x"}}, READY),
        # A provider chosen without an env_key (a local server) may need none.
        ({"args": ["-c", "model_provider=local"]}, UNKNOWN),
        ({"config_toml": 'model_provider = "x"\n'}, UNKNOWN),
    ],
)
def test_codexs_login_follows_its_provider(
    clean_environment: None, entry: dict[str, Any], state: str
) -> None:
    login = CodexAgent.login({"kind": "codex", "models": ["m"], **entry})
    assert login.state == state
    if state == MISSING:
        assert "auth.json" in login.message


@pytest.fixture
def loginless_claude(settings: Any, tmp_path: Path, clean_environment: None) -> str:
    """A claude agent whose program exists (a stand-in) and that is given no login."""
    program = tmp_path / "claude"
    program.write_text("#!/bin/sh\necho 'claude 0.0.0'\n")
    program.chmod(0o755)
    settings.REPLAYS_AGENTS = {
        "claude": {"kind": "claude_code", "binary": str(program), "models": ["sonnet"]}
    }
    return "claude:sonnet"


@pytest.mark.django_db
def test_the_models_api_says_which_models_have_no_login(
    api_client: Any, loginless_claude: str
) -> None:
    models = {item["id"]: item for item in api_client.get("/api/models/").json()}
    assert models[loginless_claude]["login"] == MISSING
    assert "seed_files" in models[loginless_claude]["login_message"]
    assert models["historical"]["login"] == READY


@pytest.mark.django_db
def test_a_plan_with_a_loginless_model_warns_with_the_fix(
    user: User, tmp_path: Path, loginless_claude: str, make_thread: Any
) -> None:
    repo, _, _ = make_git_repo(tmp_path / "repo")
    thread = make_thread(owner=user, cwd=str(repo))
    prepared = planning.prepare_plan(
        owner=user,
        raw_configuration={
            "configurations": [{"thread_id": thread.pk, "repository": str(repo)}],
            "models": [loginless_claude, "historical"],
            "evaluator": "tests",
            "verify_command": "true",
        },
    )
    [warning] = [w for w in prepared.plan.warnings if "no login" in w]
    assert warning.startswith(f"Model {loginless_claude} has no login, so its run will fail")
    assert "seed_files" in warning


@pytest.mark.django_db
def test_the_doctor_warns_about_an_agent_without_a_login(
    loginless_claude: str, settings: Any, tmp_path: Path
) -> None:
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    out = io.StringIO()
    with contextlib.suppress(CommandError):  # exit 1 for errors elsewhere (no cluster)
        call_command("replays_doctor", "--json", stdout=out)
    checks = [c for c in json.loads(out.getvalue())["checks"] if c["name"] == "agent login"]
    assert [(c["severity"], c["message"].split(":")[0]) for c in checks] == [
        ("warning", "Agent claude")
    ]
