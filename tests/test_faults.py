"""Randomised fault injection: REPLAYS_FAULT_TRIALS trials (default 100) on the database
of this pass (SQLite with the ORM broker; PostgreSQL with Redis), each killing a real
process with SIGKILL at a random step, then checking every promise (tests/faults.py).

A failing trial names its seed: REPLAYS_FAULT_SEED=<seed> REPLAYS_FAULT_TRIALS=1 runs it
again. The summary line (and var/fault-summary-<database>.json) gives the README figures.
"""

from __future__ import annotations

import json
import os
import random
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection

from replays.models import Thread
from tests.faults import MARKS, ROUND, FaultLab, InvariantBroken, agents_config

pytestmark = pytest.mark.faults


def redis_url_for_this_pass() -> str:
    """PostgreSQL passes run with Redis as the broker (a database of its own on the test
    server, so no other test's queue is shared); SQLite with the ORM broker."""
    if connection.vendor != "postgresql":
        return ""
    url = os.environ.get("REPLAYS_TEST_REDIS_URL", "")
    if not url:
        message = "REPLAYS_TEST_REDIS_URL is not set: the PostgreSQL pass runs with Redis"
        if os.environ.get("REPLAYS_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return url.rsplit("/", 1)[0] + "/7"


@pytest.fixture
def fault_lab(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    user: User,
    real_threads: dict[str, Thread],
    sample_repo: Path,
) -> Any:
    agents = agents_config(tmp_path)
    (tmp_path / MARKS).mkdir()
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps(agents))
    values = {
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_MAX_PARALLEL_RUNS": "4",
        "REPLAYS_MAX_RUNS_PER_HOST": "4",
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        "REPLAYS_HEARTBEAT_STALE_SECONDS": "6",
        "REPLAYS_LAUNCH_GRACE_SECONDS": "10",
        "REPLAYS_TEST_PAUSE_AT": "",
        "REPLAYS_TEST_SANDBOX_WRITABLE": str(tmp_path / MARKS),
    }
    redis_url = redis_url_for_this_pass()
    if redis_url:
        values["REDIS_URL"] = redis_url
        # This process enqueues too (approval asks for a dispatch): through the same broker.
        from django_q.conf import Conf

        monkeypatch.setattr(Conf, "ORM", None)
        monkeypatch.setattr(Conf, "REDIS", redis_url)
        import redis

        redis.Redis.from_url(redis_url).flushdb()
    env = {**process_env, **values}
    for name in ("DATABASE_URL", "REPLAYS_VAR_DIR", *values):
        monkeypatch.setenv(name, env[name])
    settings.REPLAYS_AGENTS = agents
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    settings.REPLAYS_MAX_PARALLEL_RUNS = 4
    settings.REPLAYS_MAX_RUNS_PER_HOST = 4
    settings.REPLAYS_HEARTBEAT_SECONDS = 0.5
    settings.REPLAYS_HEARTBEAT_STALE_SECONDS = 6.0
    settings.REPLAYS_LAUNCH_GRACE_SECONDS = 10.0
    settings.REPLAYS_TEST_SANDBOX_WRITABLE = [tmp_path / MARKS]
    thread = real_threads["claude-line-count"]
    lab = FaultLab(
        env=env,
        root=tmp_path,
        user=user,
        thread_id=thread.pk,
        start_uuid=thread.turns.get(index=0).message_uuid,
        repo=sample_repo,
    )
    yield lab
    lab.stop_cluster()


def test_random_kills_at_every_step_lose_nothing_and_start_nothing_twice(
    fault_lab: FaultLab, settings: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    replay = os.environ.get("REPLAYS_FAULT_SEED")
    trials = int(os.environ.get("REPLAYS_FAULT_TRIALS", "100"))
    base = int(replay) if replay else random.SystemRandom().randrange(10**9)
    started = time.monotonic()
    for first in range(0, trials, ROUND):
        seeds = [(number, base + number) for number in range(first, min(first + ROUND, trials))]
        try:
            fault_lab.run_round(seeds)
        except (InvariantBroken, AssertionError) as exc:
            done = {trial.seed: f"{trial.kind}@{trial.step}" for trial in fault_lab.trials}
            pytest.fail(
                f"the round of trials {seeds[0][0]}..{seeds[-1][0]} broke a promise: {exc}\n"
                f"Its trials (seed: fault): {done and {s: done.get(s) for _, s in seeds}}\n"
                f"Replay it: REPLAYS_FAULT_SEED={seeds[0][1]} REPLAYS_FAULT_TRIALS={len(seeds)} "
                "pytest tests/test_faults.py"
            )
    summary = fault_lab.summary(connection.vendor, time.monotonic() - started)
    (Path(settings.REPLAYS_VAR_DIR) / f"fault-summary-{connection.vendor}.json").write_text(
        json.dumps(summary, indent=2) + "\n"
    )
    with capsys.disabled():
        print(
            f"\nfault injection on {summary['database']}: {summary['trials']} trials in "
            f"{summary['seconds']} s, faults {summary['faults']}, steps {summary['steps']}, "
            f"members {summary['members']} {summary['statuses']}, duplicates "
            f"{summary['duplicates']}, lost {summary['lost']}, orphans {summary['orphans']}, "
            f"wedged clusters restarted {summary['wedged_clusters_restarted']}, "
            f"seconds by part {summary['seconds_by_part']} "
            f"(seeds {base}..{base + trials - 1})"
        )
    assert summary["trials"] == trials
    assert (summary["duplicates"], summary["lost"], summary["orphans"]) == (0, 0, 0)
