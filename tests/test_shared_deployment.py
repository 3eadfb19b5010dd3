"""A deployment shared by several users holds (issue 17's smaller holes, each reproduced):
the pages' writes are throttled like the API's, sign-ins lock out, what Replays keeps under
its var folder is private to its account, API tokens are kept hashed, logs are served with
their escapes made visible, and an agent's absurd figures fail its run with the reason."""

from __future__ import annotations

import importlib
import io
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client

from replays import accounts, runlogs
from replays.factories.runs import make_git_repo, make_run_graph, mark_launching
from replays.models import ApiToken, FailureCode, RunLog, RunStatus
from replays.transcripts import store
from tests.conftest import REAL_TRANSCRIPTS

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"


# --- the pages share the API's write limit ------------------------------------------------


def test_page_uploads_past_the_write_limit_are_refused_and_share_the_apis_count(
    settings: Any, logged_in_client: Client, api_client: Any
) -> None:
    """The attack: 130 uploads in a minute through the upload page all succeeded while the
    API stopped at 120. Now every page write counts against the same limit."""
    settings.REPLAYS_API_WRITE_RATE = "3/minute"
    for number in range(3):
        upload = io.BytesIO(b'{"not": "a transcript"}\n')
        upload.name = f"notes-{number}.jsonl"
        response = logged_in_client.post("/threads/upload/", {"file": upload})
        assert response.status_code != 429, number
    upload = io.BytesIO(b"{}\n")
    upload.name = "one-too-many.jsonl"
    refused = logged_in_client.post("/threads/upload/", {"file": upload})
    assert refused.status_code == 429
    assert int(refused["Retry-After"]) > 0
    assert "Too many changes in a short time" in refused.content.decode()
    # Prepare, approve, judge and cancel go the same way (here a cancel of nothing)...
    assert logged_in_client.post("/batches/999999/cancel/").status_code == 429
    # ...and the API's writes count in the same place.
    assert api_client.post("/api/plans/", {}, format="json").status_code == 429
    # Reading is never limited.
    assert logged_in_client.get("/threads/upload/").status_code == 200


# --- sign-ins lock out ----------------------------------------------------------------------


def sign_in(client: Client, username: str, password: str, address: str) -> Any:
    return client.post(
        "/accounts/login/", {"username": username, "password": password}, REMOTE_ADDR=address
    )


def test_repeated_bad_passwords_lock_the_account_out_with_a_clear_message(
    client: Client, user: User, other_user: User
) -> None:
    """The attack: 30 wrong passwords in 20 s, none refused. Now an account whose password
    was guessed wrong five times (from anywhere) cannot sign in, even with the right one."""
    for number in range(4):
        assert sign_in(client, "alice", "guess", f"10.0.0.{number}").status_code == 200
    # The fifth wrong one is refused already, and so is the right one after it.
    assert sign_in(client, "alice", "guess", "10.0.0.4").status_code == 429
    locked = sign_in(client, "alice", "correct-horse-battery", "10.0.1.1")
    assert locked.status_code == 429
    body = locked.content.decode()
    assert "5 wrong passwords were tried for the account alice" in body
    assert "refused for 15" in body
    # Another account is not locked.
    assert sign_in(client, "bob", "correct-horse-battery", "10.0.1.2").status_code == 302


def test_one_address_guessing_many_accounts_is_locked_out_and_others_are_not(
    client: Client, user: User
) -> None:
    for number in range(5):
        sign_in(client, f"nobody-{number}", "guess", "10.9.9.9")
    assert sign_in(client, "alice", "correct-horse-battery", "10.9.9.9").status_code == 429
    assert sign_in(client, "alice", "correct-horse-battery", "10.9.9.10").status_code == 302


def test_behind_the_proxy_the_lockout_counts_the_clients_address_not_the_proxys(
    client: Client, user: User, settings: Any
) -> None:
    settings.REPLAYS_BEHIND_HTTPS_PROXY = True
    for number in range(5):
        client.post(
            "/accounts/login/",
            {"username": f"nobody-{number}", "password": "x"},
            REMOTE_ADDR="127.0.0.1",
            HTTP_X_FORWARDED_FOR="203.0.113.7",
        )
    response = client.post(
        "/accounts/login/",
        {"username": "alice", "password": "correct-horse-battery"},
        REMOTE_ADDR="127.0.0.1",
        HTTP_X_FORWARDED_FOR="198.51.100.1",
    )
    assert response.status_code == 302  # another client behind the same proxy


# --- private data at rest -------------------------------------------------------------------


def test_what_replays_makes_under_its_var_folder_is_private_to_its_account(
    tmp_path: Path,
) -> None:
    """The attack: the SQLite database and its WAL were 0644, uploads 0644 in 0755 folders:
    every local account could read them. A fresh var folder, as `migrate`, an upload and a
    run folder make it."""
    var = tmp_path / "var"
    code = (
        "import io, os, stat\n"
        "from django.db import connection\n"
        "from django.contrib.auth.models import User\n"
        "from replays import importing, runfolder\n"
        "user = User.objects.create_user('u')\n"
        "with open(os.environ['SAMPLE'], 'rb') as source:\n"
        "    importing.import_uploaded_transcript(upload=source, filename='s.jsonl', user=user)\n"
        "runfolder.create_run_folder(1)\n"
        "var = os.environ['REPLAYS_VAR_DIR']\n"
        "for folder, names, files in os.walk(var):\n"
        "    for name in names + files:\n"
        "        path = os.path.join(folder, name)\n"
        "        print(oct(stat.S_IMODE(os.lstat(path).st_mode)), os.path.relpath(path, var))\n"
        "print(oct(stat.S_IMODE(os.stat(var).st_mode)), '.')\n"
    )
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REPLAYS_RUN_ROOT")
    }
    env.update(
        REPLAYS_VAR_DIR=str(var),
        DJANGO_SETTINGS_MODULE="replaysite.settings",
        SAMPLE=str(next(REAL_TRANSCRIPTS.rglob("*.jsonl"))),
    )
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "-v0"], env=env, check=True, timeout=300
    )
    shell = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shell.returncode == 0, shell.stderr
    modes = dict(
        line.split(" ", 1)[::-1] for line in shell.stdout.splitlines() if line.startswith("0o")
    )
    for name in ("replays.sqlite3", "replays.sqlite3-wal", "secret_key", "runs/run-1"):
        assert name in modes, sorted(modes)
    assert modes["."] == "0o700"
    assert modes["secret_key"] == modes["replays.sqlite3"] == modes["replays.sqlite3-wal"] == "0o600"
    uploads = [name for name in modes if name.startswith("uploads/")]
    assert any(name.endswith(".jsonl") for name in uploads)
    for name, mode in modes.items():
        # Nothing in it is readable, writable or enterable by another account.
        assert int(mode, 8) & 0o077 == 0, (name, mode)


def test_the_systemd_units_make_everything_private() -> None:
    for unit in ("replays-web.service", "replays-worker.service"):
        text = (MANAGE.parent / "deploy" / "systemd" / unit).read_text()
        assert "\nUMask=0077\n" in text, unit


# --- API tokens kept hashed -----------------------------------------------------------------


def test_api_tokens_are_kept_hashed_and_shown_once(user: User, api_client: Any) -> None:
    """The attack: every user's API token, staff's included, sat in the database in the
    clear; whoever read it (a verify command, before the sandbox) used them."""
    out, err = io.StringIO(), io.StringIO()
    from django.core.management import call_command

    call_command("api_token", "--user", "alice", stdout=out, stderr=err)
    key = out.getvalue().strip()
    assert len(key) == 40 and "not shown again" in err.getvalue()
    # Nothing the database holds is the key.
    with connection.cursor() as cursor:
        cursor.execute("SELECT key_sha256, prefix FROM replays_apitoken")
        stored = cursor.fetchall()
    assert all(key not in value for row in stored for value in row)
    assert {row[0] for row in stored} >= {accounts.key_sha256(key)}
    client = Client(HTTP_AUTHORIZATION=f"Token {key}")
    assert client.get("/api/threads/").status_code == 200
    wrong = Client(HTTP_AUTHORIZATION=f"Token {key[:-1]}{'x'}")
    assert wrong.get("/api/threads/").status_code == 401
    stolen = Client(HTTP_AUTHORIZATION=f"Token {accounts.key_sha256(key)}")
    assert stolen.get("/api/threads/").status_code == 401  # the stored value opens nothing


@pytest.mark.django_db(transaction=True)
def test_tokens_kept_in_the_clear_are_hashed_by_the_migration_and_go_on_working(
    user: User,
) -> None:
    """DRF's authtoken table, as a deployment before this change has it."""
    key = "0123456789abcdef0123456789abcdef01234567"
    with connection.cursor() as cursor:
        cursor.execute(
            'CREATE TABLE "authtoken_token" ("key" varchar(40) PRIMARY KEY, '
            '"created" timestamp NOT NULL, "user_id" integer NOT NULL)'
        )
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [key, "2026-11-01 10:00:00", user.pk],
        )
    try:
        migration = importlib.import_module("replays.migrations.0015_api_tokens")
        from django.apps import apps

        with connection.schema_editor() as editor:
            migration.hash_the_tokens_kept_in_the_clear(apps, editor)
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone()[0] == 0
        token = ApiToken.objects.get(user=user)
        assert token.key_sha256 == accounts.key_sha256(key) and token.prefix == key[:6]
        assert token.created_at.year == 2026
        assert Client(HTTP_AUTHORIZATION=f"Token {key}").get("/api/threads/").status_code == 200
    finally:
        with connection.cursor() as cursor:
            cursor.execute('DROP TABLE "authtoken_token"')


# --- logs served as text ----------------------------------------------------------------------


def test_a_logs_terminal_escapes_are_shown_not_sent(
    logged_in_client: Client, user: User, tmp_path: Path
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"]
    )
    hostile = b"before \x1b]0;owned\x07\x1b[2J\x1b[31mred\x1b[0m \xe2\x80\xaeevil after\n"
    codec, blob = store.compress(hostile)
    RunLog.objects.create(run=run, codec=codec, data=blob, size=len(hostile))
    for path in (f"/runs/{run.pk}/log/", f"/api/runs/{run.pk}/log"):
        response = logged_in_client.get(path)
        assert response.status_code == 200
        assert response["Content-Type"] == "text/plain; charset=utf-8"
        body = response.content.decode()
        assert "\x1b" not in body and "\x07" not in body and "\u202e" not in body
        assert "before \\x1b]0;owned\\x07\\x1b[2J\\x1b[31mred\\x1b[0m \\u202eevil after" in body
    assert runlogs.log_text(run).count("\\x1b") == 4


# --- absurd figures ---------------------------------------------------------------------------


def test_an_absurd_cost_in_the_usage_file_fails_the_run_as_the_agents_error_with_its_diff(
    tmp_path: Path, process_env: dict[str, str], user: User
) -> None:
    """The attack: a usage file reporting a cost of 1e15 failed the run as an
    infrastructure error, `[<class 'decimal.InvalidOperation'>]`, and its diff was lost."""
    repo, baseline, ending = make_git_repo(tmp_path)
    marks = tmp_path / "marks"
    marks.mkdir()
    agents = {
        "liar": {
            "kind": "command",
            "command": [sys.executable, str(SCRIPTS / "edit_files.py"), "--model", "{model}",
                        "--request-file", "{request_file}", "--cost", "1e15"],
            "env": {"MARKER_FILE": str(marks / "starts.txt")},
            "models": ["gpt-5"],
        }
    }  # fmt: skip
    (tmp_path / "agents.json").write_text(json.dumps(agents))
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["liar:gpt-5"]
    )
    run = mark_launching(run)
    env = {
        **process_env,
        "REPLAYS_AGENTS_FILE": str(tmp_path / "agents.json"),
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_TEST_SANDBOX_WRITABLE": str(marks),
    }
    completed = subprocess.run(
        [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    run.refresh_from_db()
    assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.AGENT_ERROR)
    assert run.failure_message == (
        "The usage file usage.json reports a cost of 1e+15 dollars, more than any run can "
        "cost (at most 5e+11): its figures were not kept."
    )
    assert "+CHANGES" in run.diff or "CHANGES.md" in run.diff  # the diff is kept
    assert run.cost_usd is None and run.input_tokens == 0


def test_file_modes_of_new_folders_follow_the_umask(tmp_path: Path) -> None:
    """The test process itself has the settings' umask: what it makes is private too."""
    folder = tmp_path / "made"
    folder.mkdir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_the_doctor_warns_about_a_database_or_redis_without_a_password(settings: Any) -> None:
    from replays import doctor

    settings.REDIS_URL = "redis://127.0.0.1:6390/0"
    checks: list[Any] = []
    doctor._check_passwords(checks)
    [check] = checks
    assert check.severity == doctor.WARNING and check.message.startswith(
        "REDIS_URL names no password: a run has the network"
    )
    settings.REDIS_URL = "redis://:s3cret@127.0.0.1:6390/0"
    checks = []
    doctor._check_passwords(checks)
    assert checks == [] or "REDIS_URL" not in checks[0].message
