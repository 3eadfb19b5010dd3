"""Dispatch claims queued runs up to the capacity, once, however many dispatchers race."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.utils import timezone
from django_q.models import OrmQ, Schedule

from replays import dispatch, processes, repos, runfolder, supervision, tasks, wakeups
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import (
    FINISHED_RUN_STATUSES,
    Batch,
    FailureCode,
    LaunchError,
    LaunchErrorCode,
    Run,
    RunPhase,
    RunStatus,
)
from tests.conftest import host_pids
from tests.test_cluster import start_cluster, stop_cluster

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
AGENT_SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
# Wraps an agent: appends "<run id>" to $MARKER_FILE, then becomes the agent (same pid).
MARK_START = (
    "import os, sys\n"
    "with open(os.environ['MARKER_FILE'], 'a') as marker:\n"
    "    marker.write(os.environ['REPLAYS_RUN_ID'] + '\\n')\n"
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])\n"
)
DISPATCH_ONCE = "from replays import supervision; print('DISPATCHED', supervision.dispatch_runs())"


def wait_until(condition: Callable[[], Any], *, seconds: float = 15, what: str = "") -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"waited {seconds}s for {what or condition}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@dataclass
class Lab:
    """Real coordinators and command agents for one test, on the test's database.

    Agents: `sleeper:mN` (sleeps for ever with a child and a grandchild; pids in the run
    folder's agent.pids) and `editor:mN` (edits the workspace and exits 0). Every agent
    start appends its run id to the marker file.
    """

    env: dict[str, str]
    root: Path
    marker: Path
    repo: Path
    baseline: str
    ending: str
    _pids: dict[int, list[int]] = field(default_factory=dict)

    def batch(self, owner: User, models: list[str]) -> tuple[Batch, list[Run]]:
        return make_run_graph(
            owner=owner,
            repo=self.repo,
            baseline=self.baseline,
            ending=self.ending,
            models=models,
            timeout_seconds=60,
        )

    def starts(self) -> Counter[int]:
        if not self.marker.exists():
            return Counter()
        return Counter(
            int(line.split()[0]) for line in self.marker.read_text().splitlines() if line.strip()
        )

    def run_dir(self, run: Run) -> Path:
        return self.root / "runs" / f"run-{run.pk}"

    def agent_pids(self, run: Run) -> list[int]:
        """The sleeper's three processes as this machine numbers them ([] until all three
        run), kept once seen: a later call gives the same pids, alive or not."""
        if run.pk in self._pids:
            return self._pids[run.pk]
        path = self.run_dir(run) / "agent.pids"
        if not path.exists():
            return []
        pids = host_pids("PIDS_FILE", str(path))
        if len(pids) == 3:
            self._pids[run.pk] = pids
            return pids
        return []

    def coordinator_done(self, run: Run) -> bool:
        """The coordinator process for this run printed its last line (won or lost)."""
        log = self.run_dir(run) / runfolder.COORDINATOR_LOG
        return log.exists() and f"Run {run.pk}:" in log.read_text(errors="replace")

    def start_dispatcher(self, *, pause_at: str = "") -> subprocess.Popen[bytes]:
        """`dispatch_runs()` in its own process (optionally stopping at a pause point)."""
        env = {
            **self.env,
            "REPLAYS_TEST_PAUSE_AT": pause_at,
            "REPLAYS_TEST_PAUSE_FILE": str(self.pause_file),
        }
        with (self.root / "dispatcher.log").open("ab") as log:
            return subprocess.Popen(
                [sys.executable, str(MANAGE), "shell", "-c", DISPATCH_ONCE],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pause_file(self) -> Path:
        return self.root / "paused"

    def paused_pid(self, step: str, *, seconds: float = 20) -> int:
        """Wait for a process to stop at `step`; its pid."""

        def reached() -> int:
            if not self.pause_file.exists():
                return 0
            name, _, pid = self.pause_file.read_text().strip().partition(" ")
            return int(pid) if name == step and pid else 0

        return wait_until(reached, seconds=seconds, what=f"a pause at {step}")


def make_lab(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    *,
    capacity: int = 2,
) -> Lab:
    # The agents' marker file, in a folder their sandboxes may write.
    marks = tmp_path / "marks"
    marks.mkdir()
    marker = marks / "starts.txt"
    models = [f"m{number}" for number in range(1, 9)]
    agents = {
        "sleeper": {
            "kind": "command",
            "models": models,
            "command": [sys.executable, "-c", MARK_START, str(AGENT_SCRIPTS / "sleep_tree.py")],
            "env": {"MARKER_FILE": str(marker), "PIDS_FILE": "{run_dir}/agent.pids"},
        },
        "editor": {
            "kind": "command",
            "models": models,
            "command": [
                sys.executable,
                str(AGENT_SCRIPTS / "edit_files.py"),
                "--model",
                "{model}",
                "--request-file",
                "{request_file}",
            ],
            "env": {"MARKER_FILE": str(marker)},
        },
    }
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps(agents))
    values = {
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_MAX_PARALLEL_RUNS": str(capacity),
        "REPLAYS_MAX_RUNS_PER_HOST": str(capacity),
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        "REPLAYS_HEARTBEAT_STALE_SECONDS": "3",
        "REPLAYS_LAUNCH_GRACE_SECONDS": "5",
        "REPLAYS_TEST_PAUSE_AT": "",
        "REPLAYS_TEST_SANDBOX_WRITABLE": str(marks),
    }
    env = {**process_env, **values}
    # Coordinators started from this process (in-process dispatch) inherit its environment.
    for name in ("DATABASE_URL", "REPLAYS_VAR_DIR", *values):
        monkeypatch.setenv(name, env[name])
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    settings.REPLAYS_TEST_SANDBOX_WRITABLE = [marks]
    settings.REPLAYS_MAX_PARALLEL_RUNS = capacity
    settings.REPLAYS_MAX_RUNS_PER_HOST = capacity
    settings.REPLAYS_HEARTBEAT_SECONDS = 0.5
    settings.REPLAYS_HEARTBEAT_STALE_SECONDS = 3.0
    settings.REPLAYS_LAUNCH_GRACE_SECONDS = 5.0
    repo, baseline, ending = make_git_repo(tmp_path)
    return Lab(env=env, root=tmp_path, marker=marker, repo=repo, baseline=baseline, ending=ending)


@pytest.fixture
def lab(
    process_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Lab:
    return make_lab(process_env, tmp_path, monkeypatch, settings)


def finished(run: Run) -> bool:
    run.refresh_from_db()
    return run.status in FINISHED_RUN_STATUSES


def queued_runs(owner: User, count: int) -> list[Run]:
    """`count` queued members of one new batch, in queue order (rows only: no repo behind)."""
    _, runs = make_run_graph(
        owner=owner,
        repo=Path("/nonexistent/repo"),
        baseline="0" * 40,
        ending="1" * 40,
        models=[f"empty-{index}" for index in range(count)],
        result_sha256="0" * 64,
    )
    return runs


def statuses(runs: list[Run]) -> list[str]:
    return [Run.objects.get(pk=run.pk).status for run in runs]


def test_claims_the_oldest_queued_runs_up_to_the_capacity(
    transactional_db: None, user: User, settings: Any
) -> None:
    settings.REPLAYS_MAX_PARALLEL_RUNS = 2
    runs = queued_runs(user, 4)

    claimed = dispatch.claim_queued_runs()

    assert [run.pk for run in claimed] == [runs[0].pk, runs[1].pk]
    first = Run.objects.get(pk=runs[0].pk)
    assert first.status == RunStatus.LAUNCHING
    assert first.host == settings.REPLAYS_HOST_NAME
    assert first.launcher == f"{settings.REPLAYS_HOST_NAME}:{processes.own_identity()}"
    assert first.claimed_at is not None
    assert statuses(runs[2:]) == [RunStatus.QUEUED, RunStatus.QUEUED]
    assert {Run.objects.get(pk=run.pk).phase for run in runs[2:]} == {RunPhase.QUEUED}
    # Full: a second (duplicate, late) claim takes nothing.
    assert dispatch.claim_queued_runs() == []
    # A slot frees: the next one in queue order is claimed.
    Run.objects.filter(pk=runs[0].pk).update(status=RunStatus.COMPLETED, finished_at=timezone.now())
    assert [run.pk for run in dispatch.claim_queued_runs()] == [runs[2].pk]


def test_capacity_is_also_kept_per_host(transactional_db: None, user: User, settings: Any) -> None:
    settings.REPLAYS_MAX_PARALLEL_RUNS = 3
    settings.REPLAYS_MAX_RUNS_PER_HOST = 2
    runs = queued_runs(user, 5)

    assert len(dispatch.claim_queued_runs(host="alpha")) == 2
    assert dispatch.claim_queued_runs(host="alpha") == []
    assert len(dispatch.claim_queued_runs(host="beta")) == 1  # global limit 3 reached
    assert dispatch.claim_queued_runs(host="gamma") == []
    assert Counter(statuses(runs)) == {RunStatus.LAUNCHING: 3, RunStatus.QUEUED: 2}
    assert dispatch.claim_queued_runs(host="gamma", limit=0) == []

    snapshot = dispatch.capacity_snapshot()
    assert snapshot["active"] == 3
    assert snapshot["active_by_host"] == {"alpha": 2, "beta": 1}
    assert snapshot["queued"] == 2
    assert snapshot["free"] == 0
    assert snapshot["max_parallel_runs"] == 3 and snapshot["max_runs_per_host"] == 2


def test_a_cancelled_queued_run_is_never_claimed(
    transactional_db: None, user: User, settings: Any
) -> None:
    settings.REPLAYS_MAX_PARALLEL_RUNS = 5
    settings.REPLAYS_MAX_RUNS_PER_HOST = 5
    runs = queued_runs(user, 3)
    dispatch.cancel_run(run=runs[1])

    claimed = dispatch.claim_queued_runs()

    assert [run.pk for run in claimed] == [runs[0].pk, runs[2].pk]
    assert Run.objects.get(pk=runs[1].pk).status == RunStatus.CANCELLED


def test_dispatcher_threads_racing_never_claim_a_run_twice_or_exceed_capacity(
    transactional_db: None, user: User, settings: Any
) -> None:
    settings.REPLAYS_MAX_PARALLEL_RUNS = 5
    settings.REPLAYS_MAX_RUNS_PER_HOST = 5
    runs = queued_runs(user, 12)
    claims: list[int] = []
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def dispatcher(host: str) -> None:
        try:
            start.wait()
            for _ in range(5):
                claims.extend(run.pk for run in dispatch.claim_queued_runs(host=host))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    workers = [threading.Thread(target=dispatcher, args=(f"host-{n % 2}",)) for n in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert errors == []
    assert len(claims) == len(set(claims)) == 5
    assert Counter(statuses(runs)) == {RunStatus.LAUNCHING: 5, RunStatus.QUEUED: 7}
    # Queue order: the five oldest.
    assert sorted(claims) == [run.pk for run in runs[:5]]


CLAIM_LOOP = """
import time
from replays import dispatch, supervision, wakeups
claimed = []
deadline = time.monotonic() + 4
while time.monotonic() < deadline:
    claimed += [run.pk for run in dispatch.claim_queued_runs()]
    time.sleep(0.01)
print("CLAIMED", " ".join(map(str, claimed)))
"""


def test_dispatcher_processes_on_two_hosts_never_claim_a_run_twice_or_exceed_capacity(
    process_env: dict[str, str], user: User, settings: Any
) -> None:
    runs = queued_runs(user, 10)
    env = {**process_env, "REPLAYS_MAX_PARALLEL_RUNS": "4", "REPLAYS_MAX_RUNS_PER_HOST": "3"}
    dispatchers = [
        subprocess.Popen(
            [sys.executable, str(MANAGE), "shell", "-c", CLAIM_LOOP],
            env={**env, "REPLAYS_HOST_NAME": f"host-{n % 2}"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    claims: list[int] = []
    for process in dispatchers:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err[-2000:]
        line = next(line for line in out.splitlines() if line.startswith("CLAIMED"))
        claims += [int(pk) for pk in line.split()[1:]]

    assert len(claims) == len(set(claims)) == 4
    claimed = Run.objects.filter(status=RunStatus.LAUNCHING)
    assert set(claimed.values_list("pk", flat=True)) == {run.pk for run in runs[:4]}
    per_host = Counter(claimed.values_list("host", flat=True))
    assert max(per_host.values()) <= 3
    assert Run.objects.filter(status=RunStatus.QUEUED).count() == 6


def test_a_coordinator_that_cannot_be_spawned_fails_the_launch_once_and_is_never_retried(
    transactional_db: None, user: User, settings: Any, tmp_path: Path
) -> None:
    # The run root lies under a regular file: creating the coordinator's log folder fails,
    # even for root.
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    settings.REPLAYS_RUN_ROOT = blocker / "runs"
    settings.REPLAYS_MAX_PARALLEL_RUNS = 1
    runs = queued_runs(user, 2)

    assert supervision.dispatch_runs() == []

    for run in runs:  # each failed spawn frees its slot for the next one
        run.refresh_from_db()
        assert run.status == RunStatus.FAILED
        assert run.failure_code == FailureCode.LAUNCH_FAILED
        assert "Could not start the coordinator" in run.failure_message
        assert run.phase == RunPhase.DONE and run.finished_at is not None
        assert run.pid is None
        error = LaunchError.objects.get(run=run)
        assert error.code == LaunchErrorCode.SPAWN_ERROR
        assert "Not a directory" in error.message
        assert error.host == settings.REPLAYS_HOST_NAME

    # Never retried: dispatch, reconcile, dispatch again change nothing.
    assert supervision.dispatch_runs() == []
    dispatch.reconcile_runs()
    assert tasks.dispatch_runs_task() == []
    assert LaunchError.objects.count() == 2
    assert statuses(runs) == [RunStatus.FAILED, RunStatus.FAILED]


def test_a_launch_fails_at_most_once(transactional_db: None, user: User) -> None:
    [run] = queued_runs(user, 1)
    dispatch.claim_queued_runs()
    first = dispatch.fail_launch(
        run_id=run.pk, code=LaunchErrorCode.SPAWN_ERROR, message="boom", host="h"
    )
    again = dispatch.fail_launch(
        run_id=run.pk, code=LaunchErrorCode.LAUNCHER_LOST, message="boom", host="h"
    )
    assert (first, again) == (True, False)
    assert list(LaunchError.objects.values_list("code", flat=True)) == ["spawn_error"]


def test_dispatch_refuses_to_start_processes_inside_a_transaction(
    transactional_db: None, user: User
) -> None:
    [run] = queued_runs(user, 1)
    with transaction.atomic(), pytest.raises(RuntimeError, match="outside a transaction"):
        supervision.dispatch_runs()
    assert Run.objects.get(pk=run.pk).status == RunStatus.QUEUED


def test_request_dispatch_enqueues_a_dispatch_task_when_the_transaction_commits(
    transactional_db: None,
) -> None:
    with transaction.atomic():
        wakeups.request_dispatch()
        assert OrmQ.objects.count() == 0
    [queued] = OrmQ.objects.all()
    assert queued.func() == "replays.tasks.dispatch_runs_task"

    wakeups.request_dispatch()  # outside a transaction: at once
    assert OrmQ.objects.count() == 2


def test_a_broken_broker_does_not_break_request_dispatch(
    transactional_db: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # The broker is the edge here: the schedule dispatches anyway, so the caller goes on.
    def refuse(*args: object, **kwargs: object) -> None:
        raise ConnectionError("broker down")

    monkeypatch.setattr("django_q.tasks.async_task", refuse)
    wakeups.request_dispatch()
    assert "Could not enqueue a dispatch" in caplog.text


def test_dispatch_is_scheduled_every_minute_idempotently(
    transactional_db: None,
) -> None:
    # post_migrate created them when the test database was migrated (and after each flush).
    tasks.ensure_schedules(using=connection.alias)
    tasks.ensure_schedules(using=connection.alias)
    schedules = {s.name: s for s in Schedule.objects.all()}
    assert set(schedules) >= set(tasks.SCHEDULES)
    for name, func in tasks.SCHEDULES.items():
        assert schedules[name].func == func
        assert schedules[name].schedule_type == Schedule.MINUTES
        assert schedules[name].minutes == 1
        assert schedules[name].repeats == -1
    assert Schedule.objects.filter(name__in=tasks.SCHEDULES).count() == len(tasks.SCHEDULES)
    # Reconcile runs on every host (supervision.host_loop), not on one schedule.
    assert not Schedule.objects.filter(name__in=tasks.RETIRED_SCHEDULES).exists()


def test_a_duplicate_or_late_dispatch_delivery_changes_nothing(lab: Lab, user: User) -> None:
    _, runs = lab.batch(user, ["sleeper:m1", "sleeper:m2", "sleeper:m3"])

    spawned = tasks.dispatch_runs_task()

    assert spawned == [runs[0].pk, runs[1].pk]
    wait_until(lambda: all(lab.agent_pids(run) for run in runs[:2]), what="two agents")
    before = [
        (run.status, run.pid, run.claimed_at, run.launcher)
        for run in Run.objects.filter(pk__in=[r.pk for r in runs]).order_by("id")
    ]
    # The same task delivered again, and late: the claims say there is nothing to do.
    assert tasks.dispatch_runs_task() == []
    assert tasks.dispatch_runs_task() == []
    after = [
        (run.status, run.pid, run.claimed_at, run.launcher)
        for run in Run.objects.filter(pk__in=[r.pk for r in runs]).order_by("id")
    ]
    assert after == before
    assert [status for status, *_ in after] == [
        RunStatus.RUNNING,
        RunStatus.RUNNING,
        RunStatus.QUEUED,
    ]
    assert lab.starts() == {runs[0].pk: 1, runs[1].pk: 1}

    dispatch.cancel_batch(batch=runs[0].batch)
    wait_until(lambda: all(finished(run) for run in runs), what="the batch to stop")
    pids = [pid for run in runs[:2] for pid in lab.agent_pids(run)]
    wait_until(lambda: all(gone(pid) for pid in pids), what="the agents to stop")


def test_a_cluster_runs_a_historical_and_an_empty_member_to_their_diffs(
    lab: Lab, user: User
) -> None:
    _, runs = lab.batch(user, ["historical", "empty"])
    wakeups.request_dispatch()
    # At least this dispatch is queued (a coordinator of an earlier test, still ending,
    # may have asked for one too).
    assert OrmQ.objects.count() >= 1

    cluster = start_cluster(lab.env)
    try:
        wait_until(
            lambda: all(finished(run) for run in runs), seconds=40, what="both members to finish"
        )
    finally:
        stop_cluster(cluster)

    historical, empty = (Run.objects.get(pk=run.pk) for run in runs)
    assert (historical.status, historical.failure_message) == (RunStatus.COMPLETED, "")
    assert (empty.status, empty.failure_message) == (RunStatus.COMPLETED, "")
    assert historical.diff == repos.historical_diff(lab.repo, lab.baseline, lab.ending)
    assert historical.diff and historical.files_changed == 4
    assert empty.diff == ""
    assert not LaunchError.objects.exists()
    for run in (historical, empty):
        assert run.host == dispatch.settings.REPLAYS_HOST_NAME
        assert run.launcher.startswith(f"{run.host}:")
        assert run.claimed_at <= run.started_at <= run.finished_at
