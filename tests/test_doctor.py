"""`manage.py replays_doctor` says what is wrong with a deployment in plain words.

Real conditions: a run root under a regular file (unwritable even for root), an agent
binary that is not there, a Redis port nobody listens on, a database nobody serves, an
unmigrated database, a host whose clock runs ahead, a host whose cluster stopped.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db.models import F
from django.utils import timezone

from replays.models import Host, Run, RunStatus
from tests.test_reconcile import one_run

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
# Port 1 (tcpmux) is never served here: a connection is refused at once.
NOBODY = "127.0.0.1:1"


@pytest.fixture
def healthy(settings: Any, tmp_path: Path) -> Path:
    """A machine whose folders are fine: the run root and one repository root in tmp_path."""
    (tmp_path / "repos").mkdir()
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    settings.REPLAYS_REPOSITORY_ROOTS = [tmp_path / "repos"]
    settings.REPLAYS_HOST_NAME = "here"
    return tmp_path


def doctor(*args: str) -> tuple[dict[str, Any], int]:
    """The doctor's JSON answer and its exit status, through call_command."""
    out = io.StringIO()
    status = 0
    try:
        call_command("replays_doctor", "--json", *args, stdout=out)
    except CommandError as exc:
        status = exc.returncode
    return json.loads(out.getvalue()), status


def found(answer: dict[str, Any], name: str, host: str | None = None) -> list[dict[str, Any]]:
    return [
        c for c in answer["checks"] if c["name"] == name and (host is None or c["host"] == host)
    ]


def one(answer: dict[str, Any], name: str, host: str | None = None) -> dict[str, Any]:
    [check] = found(answer, name, host)
    return check


def report(name: str, *, age: float = 0.0, skew: float = 0.0, **values: Any) -> Host:
    seen = timezone.now() - timedelta(seconds=age)
    return Host.objects.create(
        name=name,
        last_seen_at=seen,
        clock_at=seen + timedelta(seconds=skew),
        capacity=2,
        **values,
    )


def test_a_fresh_single_machine_is_ok_with_a_warning_that_no_cluster_was_seen(
    db: None, healthy: Path
) -> None:
    answer, status = doctor()

    assert (answer["ok"], status) == (True, 0)
    assert one(answer, "database")["message"].startswith(("The SQLite at ", "The PostgreSQL "))
    assert one(answer, "database")["message"].endswith(" answers.")
    assert one(answer, "migrations")["message"] == "Every migration is applied."
    assert one(answer, "broker")["message"].startswith("The database broker (table django_q_ormq)")
    assert one(answer, "shared cache")["severity"] == "ok"
    clusters = one(answer, "clusters")
    assert (clusters["severity"], clusters["ok"]) == ("warning", False)
    assert "No django-q2 cluster has ever reported" in clusters["message"]
    assert (
        one(answer, "run root", "here")["message"]
        == f"The run root {healthy / 'runs'} is writable."
    )
    assert one(answer, "repository roots", "here")["severity"] == "ok"
    assert {c["severity"] for c in answer["checks"]} == {"ok", "warning"}
    assert all(set(c) == {"name", "host", "ok", "severity", "message"} for c in answer["checks"])

    # The same in words, and still exit status 0.
    out = io.StringIO()
    call_command("replays_doctor", stdout=out)
    text = out.getvalue()
    assert "warning  clusters: No django-q2 cluster has ever reported" in text
    assert text.rstrip().endswith("0 errors, 1 warning.")


def test_a_run_root_nobody_can_write_is_an_error(db: None, healthy: Path, settings: Any) -> None:
    blocker = healthy / "a-file"
    blocker.write_text("not a folder")
    settings.REPLAYS_RUN_ROOT = blocker / "runs"

    answer, status = doctor()

    assert (answer["ok"], status) == (False, 1)
    check = one(answer, "run root", "here")
    assert check["severity"] == "error"
    assert check["message"] == (
        f"The run root {blocker / 'runs'} (REPLAYS_RUN_ROOT) cannot be written: Not a directory. "
        "Runs on this machine fail to launch."
    )


def test_a_missing_repository_root_is_an_error_and_another_hosts_roots_a_warning(
    db: None, healthy: Path, settings: Any
) -> None:
    settings.REPLAYS_REPOSITORY_ROOTS = [healthy / "repos", healthy / "nowhere"]
    report("beta", details={"repository_roots": [str(healthy / "elsewhere")]})

    answer, status = doctor()

    assert status == 1
    mine = one(answer, "repository roots", "here")
    assert mine["severity"] == "error"
    assert f"{healthy / 'nowhere'} does not exist or is not a folder" in mine["message"]
    theirs = one(answer, "repository roots", "beta")
    assert theirs["severity"] == "warning"
    assert (
        "must be at the same path on the machines that prepare and those that run"
        in (theirs["message"])
    )


def test_a_configured_agent_binary_that_is_missing_is_an_error_a_default_one_a_warning(
    db: None, healthy: Path, settings: Any
) -> None:
    missing = healthy / "bin" / "codex"
    settings.REPLAYS_AGENTS = {"codex": {"kind": "codex", "binary": str(missing), "models": ["m"]}}
    settings.REPLAYS_AGENTS_FILE = str(healthy / "agents.json")

    answer, status = doctor()

    assert status == 1
    check = one(answer, "agent", "here")
    assert check["severity"] == "error"
    assert check["message"] == (
        f"Agent codex cannot run: {missing} does not exist. Its models are unavailable on this host."
    )

    settings.REPLAYS_AGENTS_FILE = ""  # the built-in defaults: not installed is not broken
    answer, status = doctor()
    assert (one(answer, "agent", "here")["severity"], status) == ("warning", 0)


def test_another_hosts_agents_come_from_its_row_and_differing_versions_are_named(
    db: None, healthy: Path, settings: Any
) -> None:
    script = healthy / "codex"
    script.write_text('#!/bin/sh\necho "codex-cli 0.169.0"\n')
    script.chmod(0o755)
    settings.REPLAYS_AGENTS = {"codex": {"kind": "codex", "binary": str(script), "models": ["m"]}}
    report("beta", agent_versions={"codex": "codex-cli 0.170.0"})
    report(
        "gamma",
        agent_versions={"codex": {"binary": "codex", "error": "'codex' was not found on PATH."}},
        details={"agents_configured": True},
    )

    answer, status = doctor()

    assert one(answer, "agent", "here")["message"] == "Agent codex: codex-cli 0.169.0."
    assert one(answer, "agent", "beta")["message"] == "Agent codex: codex-cli 0.170.0."
    gamma = one(answer, "agent", "gamma")
    assert gamma["severity"] == "error" and "'codex' was not found on PATH." in gamma["message"]
    assert one(answer, "agent versions")["message"] == (
        "Agent codex differs between hosts (beta codex-cli 0.170.0, here codex-cli 0.169.0): "
        "replays of one batch may run different versions."
    )
    assert status == 1


def test_a_redis_broker_nobody_listens_on_is_an_error(
    db: None, healthy: Path, settings: Any
) -> None:
    settings.Q_CLUSTER = {**settings.Q_CLUSTER, "redis": f"redis://:secret@{NOBODY}/0"}
    settings.Q_CLUSTER.pop("orm", None)

    answer, status = doctor()

    assert status == 1
    check = one(answer, "broker")
    assert check["severity"] == "error"
    assert check["message"].startswith(
        f"The Redis broker at redis://***@{NOBODY}/0 does not answer:"
    )
    assert "secret" not in json.dumps(answer)
    assert check["message"].endswith("Nothing is dispatched until it does (runs wait queued).")


def test_a_host_whose_clock_runs_ahead_is_named_with_what_it_does_to_heartbeats_and_tokens(
    db: None, healthy: Path, settings: Any
) -> None:
    settings.REPLAYS_HEARTBEAT_STALE_SECONDS = 60
    settings.REPLAYS_PREPARE_TOKEN_SECONDS = 300
    report("alpha")
    report("beta", skew=90)

    answer, status = doctor()

    assert status == 1
    assert one(answer, "clock", "alpha")["severity"] == "ok"
    beta = one(answer, "clock", "beta")
    assert beta["severity"] == "error"
    assert beta["message"].startswith(
        "Its clock was 90.0 s ahead of the database's at its last report. Heartbeats from "
        "there look 90 s newer to other hosts, against a stale limit of 60 s"
    )
    tokens = one(answer, "prepare tokens")
    assert tokens["severity"] == "warning"
    assert tokens["message"].startswith("Clocks differ by up to 90.0 s between hosts (beta and ")
    assert (
        "lives 210 to 390 s when it is prepared on one and approved on another"
        in (tokens["message"])
    )

    # Measured against its own report's database time, as report_host writes both.
    Host.objects.filter(name="beta").update(clock_at=F("last_seen_at") - timedelta(seconds=200))
    answer, _ = doctor()
    assert "200.0 s behind the database's" in one(answer, "clock", "beta")["message"]
    assert one(answer, "prepare tokens")["severity"] == "error"  # 200 s of a 300 s lifetime


def test_a_host_whose_cluster_stopped_is_an_error_naming_its_runs(
    db: None, healthy: Path, user: User
) -> None:
    report("alive", age=3)
    report("gone", age=3 * 3600)
    one_run(user, status=RunStatus.RUNNING, host="gone", heartbeat_at=timezone.now())

    answer, status = doctor()

    assert status == 1
    assert one(answer, "cluster", "alive")["message"] == (
        "Its cluster reported 3 s ago; capacity 2, 0 runs active."
    )
    gone = one(answer, "cluster", "gone")
    assert gone["severity"] == "error"
    assert gone["message"] == (
        "Its cluster was last seen 3.0 h ago: it is stopped or cannot reach the database. "
        "1 run is still marked active there; other clusters fail them once their heartbeats "
        "are stale. If the machine was removed, delete its host row in the admin."
    )
    assert not found(answer, "clusters")  # one cluster still runs

    Host.objects.filter(name="alive").delete()
    answer, _ = doctor()
    assert one(answer, "clusters")["message"] == (
        "No cluster is running anywhere: approved runs wait queued until one starts."
    )


def test_runs_queued_for_minutes_beside_free_slots_say_no_cluster_takes_tasks(
    db: None, healthy: Path, user: User
) -> None:
    """A cluster whose host loop still reports but that takes no task (django-q2 after one
    of its processes was killed) leaves approved runs queued: the doctor says so."""
    report("here", age=2)
    waiting = one_run(user, status=RunStatus.QUEUED)
    answer, status = doctor()
    assert one(answer, "queue")["message"] == "No run has been waiting in the queue."

    Run.objects.filter(pk=waiting.pk).update(created_at=timezone.now() - timedelta(minutes=10))
    answer, status = doctor()
    queue = one(answer, "queue")
    assert (queue["severity"], status) == ("error", 1)
    assert queue["message"].startswith("1 run has waited in the queue since 10 min ago although ")
    assert "(here has room): no cluster is taking tasks. Restart the cluster" in queue["message"]

    # The host is full: waiting is what the queue is for.
    for _ in range(2):
        one_run(user, status=RunStatus.RUNNING, host="here", heartbeat_at=timezone.now())
    answer, _ = doctor()
    assert (
        one(answer, "queue")["message"]
        == "1 run waits in the queue for a free slot: every slot is taken."
    )


def run_doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(MANAGE), "replays_doctor", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_exits_1_on_errors_and_0_on_warnings(
    process_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "repos").mkdir()
    env = {
        **process_env,
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_REPOSITORY_ROOTS": str(tmp_path / "repos"),
    }
    fine = run_doctor(env)
    assert fine.returncode == 0, fine.stdout + fine.stderr
    assert "warning  clusters: No django-q2 cluster has ever reported" in fine.stdout
    assert "0 errors, 1 warning." in fine.stdout

    broken = run_doctor({**env, "REDIS_URL": f"redis://{NOBODY}/0"}, "--json")
    assert broken.returncode == 1
    answer = json.loads(broken.stdout)
    assert answer["ok"] is False
    assert one(answer, "broker")["severity"] == "error"
    assert "The doctor found errors" in broken.stderr

    unmigrated = run_doctor({**env, "DATABASE_URL": f"sqlite:///{tmp_path / 'empty.sqlite3'}"})
    assert unmigrated.returncode == 1
    assert "migrations are not applied (contenttypes.0001_initial" in unmigrated.stdout
    assert "run `manage.py migrate`." in unmigrated.stdout

    nobody = run_doctor({**env, "DATABASE_URL": f"postgres://replays:x@{NOBODY}/replays"})
    assert nobody.returncode == 1
    assert f"ERROR    database: The PostgreSQL database replays on {NOBODY} cannot be reached" in (
        nobody.stdout
    )
    assert "ERROR    broker: The database broker (table django_q_ormq) is down" in nobody.stdout


def test_a_run_root_inside_a_project_is_flagged(db: None, healthy: Path, settings: Any) -> None:
    """A worktree under a project's folder lets the verify command take that project's
    configuration (the demo's pytest found Replays' own pyproject.toml)."""
    project = healthy / "checkout"
    (project / "var").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    settings.REPLAYS_RUN_ROOT = project / "var" / "runs"

    answer, status = doctor()

    check = one(answer, "run root location", "here")
    assert check["severity"] == "warning"
    assert f"inside the project {project}" in check["message"]
    assert status == 0  # a warning: runs still start

    settings.REPLAYS_RUN_ROOT = healthy / "runs"
    answer, _ = doctor()
    assert found(answer, "run root location") == []
