"""The django-q2 cluster starts from our settings and runs tasks, with each broker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from django_q.models import Success

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def start_cluster(env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, str(MANAGE), "qcluster"],
        env=env,
        # A file, not a pipe: nobody reads the log while the cluster runs.
        stdout=subprocess.DEVNULL,
        stderr=tempfile.TemporaryFile(),
        start_new_session=True,
    )


def stop_cluster(cluster: subprocess.Popen[bytes]) -> None:
    # SIGTERM to the cluster's main process only: it stops its workers itself. Signalling
    # the whole group at once leaves its sentinel waiting for workers that are already gone.
    cluster.send_signal(signal.SIGTERM)
    try:
        cluster.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()


def enqueue(env: dict[str, str], function: str, *args: object) -> str:
    code = f"from django_q.tasks import async_task; print(async_task({function!r}, *{args!r}))"
    completed = subprocess.run(
        [sys.executable, str(MANAGE), "shell", "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return completed.stdout.strip().splitlines()[-1]


def wait_for_success(
    task_id: str, cluster: subprocess.Popen[bytes], seconds: float = 60
) -> Success:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done = Success.objects.filter(id=task_id).first()
        if done is not None:
            return done
        if cluster.poll() is not None:
            cluster.stderr.seek(0)
            pytest.fail(f"the cluster exited: {cluster.stderr.read().decode()[-2000:]}")
        time.sleep(0.5)
    pytest.fail(f"task {task_id} did not run within {seconds}s")


def test_cluster_runs_a_task_with_the_orm_broker(process_env: dict[str, str]) -> None:
    cluster = start_cluster(process_env)
    try:
        task_id = enqueue(process_env, "math.floor", 2.5)
        assert wait_for_success(task_id, cluster).result == 2
    finally:
        stop_cluster(cluster)


def test_cluster_runs_a_task_with_the_redis_broker(process_env: dict[str, str]) -> None:
    url = os.environ.get("REPLAYS_TEST_REDIS_URL", "")
    if not url:
        if os.environ.get("REPLAYS_REQUIRE_TOOLS") == "1":
            pytest.fail("REPLAYS_TEST_REDIS_URL is not set")
        pytest.skip("no Redis server for tests (set REPLAYS_TEST_REDIS_URL)")
    env = {**process_env, "REDIS_URL": url}
    cluster = start_cluster(env)
    try:
        task_id = enqueue(env, "math.floor", 7.9)
        # Results land in the database whichever broker carried the task.
        assert wait_for_success(task_id, cluster).result == 7
    finally:
        stop_cluster(cluster)
