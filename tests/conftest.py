from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from replays.accounts import create_api_token
from replays.models import SourceKind, Thread, Turn

FIXTURES = Path(__file__).parent / "fixtures"
REAL_TRANSCRIPTS = FIXTURES / "transcripts" / "real"
EDGE_TRANSCRIPTS = FIXTURES / "transcripts" / "edge"

_sequence = itertools.count(1)


@pytest.fixture(autouse=True)
def fast_password_hashing(settings: Any) -> None:
    # The real hasher costs ~0.25 s per user; tests create many.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


NO_AGENTS_FILE = FIXTURES / "agents-none.json"


@pytest.fixture(autouse=True)
def no_agents_unless_configured(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reaches a real model: without this, a codex or claude on the machine's PATH
    would be a default agent and evaluator. A test that needs agents configures them
    (settings.REPLAYS_AGENTS here, REPLAYS_AGENTS_FILE for the processes it starts)."""
    settings.REPLAYS_AGENTS = {}
    monkeypatch.setenv("REPLAYS_AGENTS_FILE", str(NO_AGENTS_FILE))
    monkeypatch.delenv("REPLAYS_DEFAULT_EVALUATOR", raising=False)


@pytest.fixture
def user(db: None) -> User:
    return importer()


@pytest.fixture
def other_user(db: None) -> User:
    return User.objects.create_user("bob", "bob@example.com", "correct-horse-battery")


@pytest.fixture
def staff_user(db: None) -> User:
    return User.objects.create_user(
        "carol", "carol@example.com", "correct-horse-battery", is_staff=True, is_superuser=True
    )


@pytest.fixture
def logged_in_client(client: Any, user: User) -> Any:
    client.force_login(user)
    return client


@pytest.fixture
def api_client(user: User) -> APIClient:
    _, key = create_api_token(user=user)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return api


@pytest.fixture
def make_thread(db: None) -> Callable[..., Thread]:
    """A thread with `turns` turns, written directly (for page and API tests)."""

    def make(
        *,
        title: str = "",
        turns: int = 2,
        cwd: str = "/home/alice/project",
        kind: str = SourceKind.CLAUDE_CODE,
        cost: Decimal | None = Decimal("0.25"),
        requests: list[str] | None = None,
        started_at: datetime | None = None,
        owner: User | None = None,
    ) -> Thread:
        number = next(_sequence)
        start = started_at or datetime(2026, 11, 1, 9, 0, tzinfo=UTC) + timedelta(hours=number)
        thread = Thread.objects.create(
            owner=owner or importer(),
            source_kind=kind,
            session_id=f"session-{number}",
            title=title or f"Thread {number}",
            cwd=cwd,
            git_branch="main",
            started_at=start,
            ended_at=start + timedelta(minutes=10),
            source_path=f"/tmp/session-{number}.jsonl",
            source_sha256=f"{number:064x}",
            source_size=1000,
            turn_count=turns,
            input_tokens=100 * turns,
            output_tokens=50 * turns,
            cost_usd=None if cost is None else cost * turns,
            seconds=30.0 * turns,
            models_used=["claude-sonnet-4-5"],
        )
        for index in range(turns):
            request = requests[index] if requests else f"Request {index + 1} of thread {number}"
            Turn.objects.create(
                thread=thread,
                index=index,
                message_uuid=f"uuid-{number}-{index}",
                timestamp=start + timedelta(minutes=index),
                request=request,
                models_used=["claude-sonnet-4-5"],
                usage_by_model={"claude-sonnet-4-5": {"input_tokens": 100, "output_tokens": 50}},
                input_tokens=100,
                output_tokens=50,
                cost_usd=cost,
                seconds=30.0,
                last_answer_at=start + timedelta(minutes=index, seconds=30),
            )
        return thread

    return make


NODE_BIN = Path(__file__).parent / "node" / "node_modules" / ".bin"


def require_tool(path: Path | str, how_to_get: str) -> Path:
    """The tool at `path`, or skip the test; in CI (REPLAYS_REQUIRE_TOOLS=1) a missing tool fails."""
    tool = Path(path)
    if tool.exists():
        return tool
    message = f"{tool} is not installed ({how_to_get})"
    if os.environ.get("REPLAYS_REQUIRE_TOOLS") == "1":
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture
def process_env(transactional_db: None, settings: Any) -> Iterator[dict[str, str]]:
    """Environment for a child process (manage.py, qcluster) that uses this test's database."""
    from django.db import connection

    db = connection.settings_dict
    if connection.vendor == "sqlite":
        url = f"sqlite:///{db['NAME']}"
    else:
        url = f"postgres://{db['USER']}:{db['PASSWORD']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}/{db['NAME']}"
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "REPLAYS_VAR_DIR": str(settings.REPLAYS_VAR_DIR),
        "PYTHONUNBUFFERED": "1",
    }
    env.pop("REDIS_URL", None)
    yield env
    _wait_for_coordinators(url)


def _wait_for_coordinators(database_url: str, seconds: float = 15) -> None:
    """Let the coordinators a test started (on its database) end before the next test
    flushes the tables, so none writes into another test; kill what is left."""
    import time

    import psutil

    def ours() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline"]):
            try:
                if "run_coordinator" in (process.info["cmdline"] or []) and (
                    process.environ().get("DATABASE_URL") == database_url
                ):
                    found.append(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    deadline = time.monotonic() + seconds
    while (left := ours()) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass


MANIFEST_PATH = REAL_TRANSCRIPTS / "manifest.json"
SAMPLE_BUNDLE = FIXTURES / "repos" / "sample.bundle"


@pytest.fixture
def sample_repo(tmp_path: Path) -> Path:
    """A clone of the repository the fixture sessions worked in (all their branches)."""
    import subprocess

    repo = tmp_path / "textstats"
    subprocess.run(["git", "clone", "-q", str(SAMPLE_BUNDLE), str(repo)], check=True)
    for branch in ("main", "feature/cli", "feature/gemini", "feature/opencode", "feature/pi"):
        subprocess.run(
            ["git", "-C", str(repo), "branch", "-q", "-f", branch, f"origin/{branch}"],
            check=False,
            capture_output=True,
        )
    return repo


def importer() -> User:
    """Whoever imports in a test that does not care who: the user `alice` (the `user`
    fixture's), made when missing."""
    found, _ = User.objects.get_or_create(username="alice", defaults={"email": "alice@example.com"})
    if not found.password:
        found.set_password("correct-horse-battery")
        found.save()
    return found


@pytest.fixture
def real_threads(db: None, user: User) -> dict[str, Thread]:
    """The real fixture sessions imported by `user` (alice), by their manifest name."""
    import json

    from replays import importing

    manifest = json.loads(MANIFEST_PATH.read_text())
    threads = {}
    for session in manifest["sessions"]:
        result = importing.import_transcript_file(
            path=REAL_TRANSCRIPTS / session["path"], user=user
        )
        assert result.thread is not None, result.error
        threads[session["name"]] = result.thread
    return threads


def manifest_session(name: str) -> dict[str, Any]:
    import json

    manifest = json.loads(MANIFEST_PATH.read_text())
    return next(session for session in manifest["sessions"] if session["name"] == name)


def host_pids(variable: str, value: str, *, running: str = "") -> list[int]:
    """The pids, as this machine sees them, of the test agents' processes started with
    `variable`=`value` in their environment (and `running` in their command line), oldest
    first (the sandbox's own bwrap processes left out). An agent in the sandbox has its own
    PID namespace, so the pids it writes itself are not this machine's."""
    import psutil

    found = []
    for process in psutil.process_iter(["name", "create_time", "cmdline"]):
        try:
            if process.info["name"] == "bwrap" or process.status() == psutil.STATUS_ZOMBIE:
                continue
            if running and running not in " ".join(process.info["cmdline"] or []):
                continue
            if process.environ().get(variable) == value:
                found.append((process.info["create_time"], process.pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return [pid for _, pid in sorted(found)]


def is_within(pid: int, ancestor: int | None) -> bool:
    """`pid` is `ancestor` or one of its descendants (a sandboxed agent runs under bwrap)."""
    import psutil

    if not ancestor:
        return False
    try:
        return pid == ancestor or pid in {c.pid for c in psutil.Process(ancestor).children(True)}
    except psutil.NoSuchProcess:
        return False
