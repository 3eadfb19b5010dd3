"""Every cluster reports its host and reconciles what it can judge, on every host.

Real clusters run with different REPLAYS_HOST_NAMEs against one database: each fails its
own host's runs whose coordinator is gone by pid and create time within seconds, leaves
another host's live-looking runs alone, and fails any host's run by a stale heartbeat.
The agents' versions come from real binaries (small scripts) run with `--version`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from replays import hosts
from replays.models import FailureCode, Host, Run, RunStatus
from tests.test_cluster import start_cluster, stop_cluster
from tests.test_dispatch import wait_until
from tests.test_reconcile import dead_identity, one_run


@pytest.fixture(autouse=True)
def fresh_version_cache() -> Iterator[None]:
    hosts._version_cache.clear()
    yield
    hosts._version_cache.clear()


def version_script(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def test_a_host_reports_itself_with_its_agents_versions_read_once_per_few_minutes(
    db: None, tmp_path: Path, settings: Any
) -> None:
    calls = tmp_path / "calls"
    codex = version_script(tmp_path, "codex", f'echo called >> {calls}\necho "codex-cli 0.169.0"')
    broken = version_script(tmp_path, "claude", "echo 'no licence' >&2\nexit 3")
    settings.REPLAYS_AGENTS = {
        "codex": {"kind": "codex", "binary": str(codex), "models": ["gpt-5.5"]},
        "claude": {"kind": "claude_code", "binary": str(broken), "models": ["claude-sonnet-4-5"]},
        "gone": {"kind": "codex", "binary": str(tmp_path / "missing"), "models": ["m"]},
        "aider": {"kind": "command", "command": ["aider", "{request_file}"], "models": ["m"]},
    }
    settings.REPLAYS_HOST_NAME = "worker-1"
    settings.REPLAYS_MAX_RUNS_PER_HOST = 3

    first = hosts.report_host()
    second = hosts.report_host()

    assert Host.objects.count() == 1
    assert (second.name, second.capacity) == ("worker-1", 3)
    assert second.agent_versions == {
        "codex": "codex-cli 0.169.0",
        "claude": {
            "binary": str(broken),
            "error": f"{broken} --version exited with status 3: no licence",
        },
        "gone": {
            "binary": str(tmp_path / "missing"),
            "error": f"{tmp_path / 'missing'} does not exist.",
        },
    }
    assert calls.read_text() == "called\n"  # cached: the second report ran nothing
    assert second.first_seen_at == first.first_seen_at
    assert second.last_seen_at >= first.last_seen_at
    assert abs(hosts.clock_skew(second)) < timedelta(seconds=2)  # one machine, one clock
    assert second.details["pid"] == os.getpid()
    assert second.details["run_root"] == str(settings.REPLAYS_RUN_ROOT)
    assert second.details["django_q2"].startswith("1.11")


def test_a_binary_that_hangs_on_version_is_reported_not_waited_for(
    db: None, tmp_path: Path, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    hung = version_script(tmp_path, "codex", "sleep 30")
    settings.REPLAYS_AGENTS = {"codex": {"kind": "codex", "binary": str(hung), "models": ["m"]}}
    monkeypatch.setattr(hosts, "AGENT_VERSION_TIMEOUT_SECONDS", 1)
    started = time.monotonic()
    versions = hosts.agent_versions()
    assert time.monotonic() - started < 10
    assert versions == {
        "codex": {"binary": str(hung), "error": f"{hung} --version did not answer within 1 s."}
    }


def cluster_env(process_env: dict[str, str], host: str) -> dict[str, str]:
    return {
        **process_env,
        "REPLAYS_HOST_NAME": host,
        "REPLAYS_HEARTBEAT_SECONDS": "1",
        # Only a pid check (or a heartbeat an hour old) can fail a run in these tests.
        "REPLAYS_HEARTBEAT_STALE_SECONDS": "600",
    }


def running(owner: User, *, host: str, heartbeat_age: float = 0.0) -> Run:
    dead = dead_identity()
    beat = timezone.now() - timedelta(seconds=heartbeat_age)
    return one_run(
        owner,
        status=RunStatus.RUNNING,
        host=host,
        pid=dead.pid,
        pid_create_time=dead.create_time,
        started_at=beat,
        heartbeat_at=beat,
    )


def descendants(process: subprocess.Popen[bytes]) -> set[int]:
    return {child.pid for child in psutil.Process(process.pid).children(recursive=True)}


def seen(name: str) -> Host | None:
    return Host.objects.filter(name=name).first()


def with_broker(process_env: dict[str, str], broker: str) -> dict[str, str]:
    if broker == "orm":
        return process_env
    url = os.environ.get("REPLAYS_TEST_REDIS_URL", "")
    if not url:
        if os.environ.get("REPLAYS_REQUIRE_TOOLS") == "1":
            pytest.fail("REPLAYS_TEST_REDIS_URL is not set")
        pytest.skip("no Redis server for tests (set REPLAYS_TEST_REDIS_URL)")
    return {**process_env, "REDIS_URL": url}


@pytest.mark.parametrize("broker", ["orm", "redis"])
def test_each_cluster_reconciles_its_own_hosts_runs_by_pid_and_others_by_heartbeat(
    process_env: dict[str, str], user: User, broker: str
) -> None:
    process_env = with_broker(process_env, broker)
    on_beta = running(user, host="beta")  # its coordinator is gone; its heartbeat is fresh
    on_gamma = running(user, host="gamma", heartbeat_age=3600)  # no cluster there at all

    alpha = start_cluster(cluster_env(process_env, "alpha"))
    beta = None
    try:
        wait_until(
            lambda: Run.objects.get(pk=on_gamma.pk).status == RunStatus.FAILED,
            seconds=30,
            what="alpha to fail gamma's run by its heartbeat",
        )
        gamma_run = Run.objects.get(pk=on_gamma.pk)
        assert gamma_run.failure_code == FailureCode.COORDINATOR_LOST
        assert "on gamma sent no heartbeat for 36" in gamma_run.failure_message
        # The same reconcile looked at beta's run: alpha cannot judge beta's pids.
        assert Run.objects.get(pk=on_beta.pk).status == RunStatus.RUNNING

        beta = start_cluster(cluster_env(process_env, "beta"))
        started = time.monotonic()
        wait_until(
            lambda: Run.objects.get(pk=on_beta.pk).status == RunStatus.FAILED,
            seconds=30,
            what="beta to fail its own run by pid",
        )
        took = time.monotonic() - started
        beta_run = Run.objects.get(pk=on_beta.pk)
        assert beta_run.failure_code == FailureCode.COORDINATOR_LOST
        assert f"(pid {on_beta.pid} on beta) stopped" in beta_run.failure_message
        assert took < 30  # seconds after beta's cluster came up, not the 600 s stale limit

        wait_until(lambda: seen("alpha") and seen("beta"), what="both hosts' rows")
        for name, cluster in (("alpha", alpha), ("beta", beta)):
            host = Host.objects.get(name=name)
            assert host.details["pid"] in descendants(cluster), f"{name}'s row from elsewhere"
            assert abs(hosts.clock_skew(host)) < timedelta(seconds=2)
        assert not Host.objects.filter(name="gamma").exists()
    finally:
        stop_cluster(alpha)
        if beta is not None:
            stop_cluster(beta)


def test_one_worker_per_host_reports_and_a_sibling_takes_over_when_it_dies(
    process_env: dict[str, str],
) -> None:
    cluster = start_cluster({**cluster_env(process_env, "alpha"), "REPLAYS_Q_WORKERS": "2"})
    try:
        first = wait_until(lambda: seen("alpha"), seconds=30, what="alpha's row")
        reporter = first.details["pid"]
        # Several turns later the same worker still reports: one loop per host, not per worker.
        wait_until(
            lambda: (
                Host.objects.get(name="alpha").last_seen_at
                > first.last_seen_at + timedelta(seconds=2)
            ),
            what="later reports",
        )
        assert Host.objects.get(name="alpha").details["pid"] == reporter

        os.kill(reporter, signal.SIGKILL)
        taken_over = wait_until(
            lambda: (host := Host.objects.get(name="alpha")).details["pid"] != reporter and host,
            seconds=30,
            what="a sibling worker to report",
        )
        assert taken_over.details["pid"] in descendants(cluster)
        assert cluster.poll() is None
    finally:
        # Not a clean stop: the killed worker may have held the task queue's lock, which
        # would leave a SIGTERM waiting for it (django-q2's own queue, not ours).
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()


def test_caches_shared_between_processes_are_never_process_memory(tmp_path: Path) -> None:
    """The throttle counts in the default cache: Redis with REDIS_URL, else the database;
    the one process-memory cache holds the ORM broker's cluster statistics alone."""
    code = (
        "import json; from django.conf import settings; "
        "print(json.dumps({'caches': settings.CACHES, 'q': settings.Q_CLUSTER}, default=str))"
    )
    shared = {
        "django.core.cache.backends.redis.RedisCache",
        "django.core.cache.backends.db.DatabaseCache",
    }
    for extra in ({}, {"REDIS_URL": "redis://127.0.0.1:6390/0"}):
        env = {
            **{k: v for k, v in os.environ.items() if k != "REDIS_URL"},
            **extra,
            "DJANGO_SETTINGS_MODULE": "replaysite.settings",
            "REPLAYS_VAR_DIR": str(tmp_path),
        }
        completed = subprocess.run(
            [sys.executable, str(Path(__file__).resolve().parent.parent / "manage.py"), "shell", "-c", code],
            env=env, capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        loaded = json.loads(completed.stdout.strip().splitlines()[-1])
        assert loaded["caches"]["default"]["BACKEND"] in shared
        local = {
            alias for alias, cache in loaded["caches"].items() if cache["BACKEND"] not in shared
        }
        # Only the cluster's statistics (django-q2's Stat, half-second writes) stay local.
        assert local <= {loaded["q"]["cache"]}


def test_the_admin_lists_hosts_read_only_with_their_skew_and_agents(
    client: Any, staff_user: User
) -> None:
    from django.urls import reverse

    seen = timezone.now()
    host = Host.objects.create(
        name="worker-<1>",
        last_seen_at=seen,
        clock_at=seen + timedelta(seconds=4.25),
        capacity=4,
        agent_versions={"codex": "codex-cli 0.169.0", "claude": {"error": "not found"}},
    )
    client.force_login(staff_user)

    listing = client.get(reverse("admin:replays_host_changelist")).content.decode()
    assert "worker-&lt;1&gt;" in listing and "worker-<1>" not in listing
    assert "+4.2 s" in listing
    assert "claude: not runnable, codex codex-cli 0.169.0" in listing
    change = client.get(reverse("admin:replays_host_change", args=[host.pk]))
    assert change.context["adminform"].form.fields == {}  # every field read-only
    assert client.get(reverse("admin:replays_host_add")).status_code == 403
    # A removed machine's row can go.
    client.post(reverse("admin:replays_host_delete", args=[host.pk]), {"post": "yes"})
    assert not Host.objects.exists()
