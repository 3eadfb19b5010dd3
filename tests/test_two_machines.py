"""Two machines, simulated: two django-q2 clusters with their own host names (two process
trees, two run folders) against one PostgreSQL and one Redis, both private to this module.

Capacity, claims, heartbeats and cancels go through the database alone: the global cap
holds across both machines and each machine's own cap holds (sampled continuously), a
machine that dies (its cluster, coordinators and agents all SIGKILLed) has its runs
failed by heartbeat age from the other machine, and a cancel issued on one machine
reaches a run on the other within a heartbeat.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from replays.factories.runs import make_git_repo
from tests.conftest import host_pids
from tests.engines import Engines, private_engines, skip_on_the_shared_postgres_pass
from tests.test_dispatch import wait_until

pytestmark = pytest.mark.multihost

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
AGENT_SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
HEARTBEAT_SECONDS = 0.5
STALE_SECONDS = 5.0
# Every process of a simulated machine carries its name in this variable.
MACHINE_TAG = "TESTS_SIMULATED_MACHINE"

# Queues a batch of `models` (as approval leaves it) and asks a cluster to dispatch.
CREATE_BATCH = """
import json, os
from django.contrib.auth.models import User
from replays import wakeups
from replays.factories.runs import make_run_graph
spec = json.loads(os.environ["BATCH"])
owner, _ = User.objects.get_or_create(username="alice")
batch, runs = make_run_graph(owner=owner, repo=__import__("pathlib").Path(spec["repo"]),
                             baseline=spec["baseline"], ending=spec["ending"],
                             models=spec["models"], timeout_seconds=120)
wakeups.request_dispatch()
print(json.dumps([run.pk for run in runs]))
"""
RECONCILE = "from django_q.tasks import async_task; async_task('replays.tasks.reconcile_runs_task')"


# Fixtures named apart from their functions, so other modules import them without
# shadowing (tests/test_engine_faults.py).
@pytest.fixture(scope="module", name="engines")
def engines_fixture() -> Iterator[Engines]:
    skip_on_the_shared_postgres_pass()
    yield from private_engines()


@dataclass
class Machine:
    """One simulated worker machine: a cluster under its own host name and run root."""

    name: str
    env: dict[str, str]
    cluster: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        log = Path(self.env["REPLAYS_RUN_ROOT"]).parent / "cluster.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            self.cluster = subprocess.Popen(
                [sys.executable, str(MANAGE), "qcluster"],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def processes(self) -> list[psutil.Process]:
        """Everything this machine runs: the cluster, its workers, their coordinators and
        the agents. Coordinators may be detached (forked twice, reparented away from the
        worker), so the parent links do not reach every one: the machine's tag in each
        process's environment (inherited by all, agents included) does."""
        found: dict[int, psutil.Process] = {}
        for process in psutil.process_iter():
            try:
                if process.environ().get(MACHINE_TAG) == self.tag:
                    for member in (process, *process.children(recursive=True)):
                        found[member.pid] = member
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        return list(found.values())

    @property
    def tag(self) -> str:
        return self.env[MACHINE_TAG]

    def power_off(self) -> None:
        """SIGKILL every process of the machine, as a machine that loses power loses them
        (again until none is left: a worker may have forked one meanwhile)."""
        for _ in range(5):
            found = self.processes()
            if not found:
                break
            for process in found:
                try:
                    process.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(found, timeout=10)
        if self.cluster is not None:
            self.cluster.wait()

    def stop(self) -> None:
        if self.cluster is None or self.cluster.poll() is not None:
            return
        self.cluster.send_signal(signal.SIGTERM)
        try:
            self.cluster.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.power_off()


@dataclass
class Sampler:
    """Counts the runs holding a slot (launching or running), overall and per host, every
    few milliseconds while the test works, straight from the database."""

    engines: Engines
    most: int = 0
    most_by_host: Counter[str] = field(default_factory=Counter)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Sampler:
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()

    def _loop(self) -> None:
        import psycopg

        with psycopg.connect(self.engines.postgres.url, autocommit=True) as connection:
            while not self._stop.is_set():
                rows = connection.execute(
                    "SELECT host, count(*) FROM replays_run "
                    "WHERE status IN ('launching', 'running') GROUP BY host"
                ).fetchall()
                self.samples += 1
                self.most = max(self.most, sum(count for _, count in rows))
                for host, count in rows:
                    self.most_by_host[host] = max(self.most_by_host[host], count)
                time.sleep(0.01)


@dataclass
class Site:
    """The shared database and broker, the repository, and the machines on them."""

    engines: Engines
    root: Path
    marker: Path
    repo: Path
    baseline: str
    ending: str
    base_env: dict[str, str]

    def machine(self, name: str, **settings: str) -> Machine:
        env = {
            **self.base_env,
            "REPLAYS_HOST_NAME": name,
            MACHINE_TAG: f"{name}-{os.getpid()}-{id(self)}",
            "REPLAYS_RUN_ROOT": str(self.root / name / "runs"),
            **settings,
        }
        return Machine(name=name, env=env)

    def manage(self, code: str, *, host: str = "web", **env: str) -> str:
        done = subprocess.run(
            [sys.executable, str(MANAGE), "shell", "-c", code],
            env={**self.base_env, "REPLAYS_HOST_NAME": host, **env},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    def command(self, *args: str, host: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(MANAGE), *args],
            env={**self.base_env, "REPLAYS_HOST_NAME": host},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def batch(self, models: list[str]) -> list[int]:
        spec = {"repo": str(self.repo), "baseline": self.baseline, "ending": self.ending,
                "models": models}  # fmt: skip
        out = self.manage(CREATE_BATCH, BATCH=json.dumps(spec))
        return json.loads(out.strip().splitlines()[-1])

    def runs(self, ids: list[int]) -> dict[int, dict[str, Any]]:
        rows = self.engines.postgres.sql(
            "SELECT id, status, host, failure_code, failure_message, heartbeat_at, "
            "cancel_requested_at, finished_at FROM replays_run WHERE id = ANY(%s)",
            ids,
        )
        names = ("id", "status", "host", "failure_code", "failure_message", "heartbeat_at",
                 "cancel_requested_at", "finished_at")  # fmt: skip
        return {row[0]: dict(zip(names, row, strict=True)) for row in rows}

    def starts(self) -> Counter[int]:
        if not self.marker.exists():
            return Counter()
        return Counter(int(line.split()[0]) for line in self.marker.read_text().splitlines())


def naps(milliseconds: int, count: int) -> list[str]:
    """`count` models of the nap agent that sleep about `milliseconds` each."""
    return [f"nap:s{milliseconds + index}" for index in range(count)]


@pytest.fixture(name="site")
def site_fixture(engines: Engines, tmp_path: Path) -> Iterator[Site]:
    # The agents' start marks, in a folder their sandboxes may write (and nothing else here).
    (tmp_path / "marks").mkdir()
    marker = tmp_path / "marks" / "starts.txt"
    # One batch has each model once: s1000, s1001, ... all sleep about a second.
    starts = (300, 1000, 3000, 12000, 20000, 40000, 60000)
    models = [f"s{ms}" for start in starts for ms in range(start, start + 20)]
    agents = {
        "nap": {
            "kind": "command",
            "models": models,
            "command": [sys.executable, str(AGENT_SCRIPTS / "mark_and_sleep.py"), "{model}"],
            "env": {"MARKER_FILE": str(marker)},
        }
    }
    agents_file = tmp_path / "agents.json"
    agents_file.write_text(json.dumps(agents))
    repo, baseline, ending = make_git_repo(tmp_path)
    base_env = {
        **os.environ,
        "DATABASE_URL": engines.postgres.url,
        "REDIS_URL": engines.redis.url,
        "REPLAYS_VAR_DIR": str(engines.folder / "var"),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_HEARTBEAT_SECONDS": str(HEARTBEAT_SECONDS),
        "REPLAYS_HEARTBEAT_STALE_SECONDS": str(STALE_SECONDS),
        "REPLAYS_LAUNCH_GRACE_SECONDS": "10",
        "REPLAYS_TEST_PAUSE_AT": "",
        "REPLAYS_TEST_SANDBOX_WRITABLE": str(tmp_path / "marks"),
        "PYTHONUNBUFFERED": "1",
    }
    yield Site(engines=engines, root=tmp_path, marker=marker, repo=repo, baseline=baseline,
               ending=ending, base_env=base_env)  # fmt: skip


@pytest.fixture(name="machines")
def machines_fixture(site: Site) -> Iterator[list[Machine]]:
    started: list[Machine] = []
    yield started
    for machine in started:
        machine.stop()
    # Nothing of this test may hold a slot in the next one.
    site.engines.postgres.sql(
        "UPDATE replays_run SET status = 'cancelled', phase = 'done', finished_at = now() "
        "WHERE status IN ('queued', 'launching', 'running')"
    )


def test_both_machines_share_the_global_cap_and_keep_their_own(
    site: Site, machines: list[Machine]
) -> None:
    caps = {"REPLAYS_MAX_PARALLEL_RUNS": "3", "REPLAYS_MAX_RUNS_PER_HOST": "2"}
    machines += [site.machine("alpha", **caps), site.machine("beta", **caps)]
    ids = site.batch(naps(1000, 8))
    with Sampler(site.engines) as sampler:
        for machine in machines:
            machine.start()

        # Each cluster dispatches as it starts and each coordinator asks for the next
        # dispatch as it ends; the schedule's every-minute dispatch is not waited for.
        wait_until(
            lambda: all(run["finished_at"] for run in site.runs(ids).values()),
            seconds=90,
            what="the runs to finish",
        )

    runs = site.runs(ids)
    assert {run["status"] for run in runs.values()} == {"completed"}, runs
    assert site.starts() == Counter({run_id: 1 for run_id in ids})
    assert sampler.samples > 50
    assert sampler.most == 3, "the global cap (3) held and was used"
    assert set(sampler.most_by_host) == {"alpha", "beta"}
    assert max(sampler.most_by_host.values()) == 2, sampler.most_by_host
    assert Counter(run["host"] for run in runs.values()).keys() == {"alpha", "beta"}


def test_a_dead_machine_has_its_runs_failed_by_heartbeat_from_the_other(
    site: Site, machines: list[Machine]
) -> None:
    alpha = site.machine("alpha", REPLAYS_MAX_RUNS_PER_HOST="1", REPLAYS_MAX_PARALLEL_RUNS="4")
    beta = site.machine("beta", REPLAYS_MAX_RUNS_PER_HOST="2", REPLAYS_MAX_PARALLEL_RUNS="4")
    machines += [alpha, beta]
    beta.start()
    doomed = site.batch(naps(60000, 2))
    wait_until(
        lambda: all(run["status"] == "running" for run in site.runs(doomed).values()),
        seconds=40,
        what="two runs running on beta",
    )
    assert {run["host"] for run in site.runs(doomed).values()} == {"beta"}
    wait_until(lambda: len(site.starts()) == 2, seconds=20, what="both agents to start")
    alpha.start()
    beta_processes = beta.processes()
    assert len(beta_processes) >= 2 + 2 + 2  # cluster, workers, coordinators, agents

    beta.power_off()
    assert not any(process.is_running() for process in beta_processes)
    # Alpha cannot see beta's processes: it goes by the heartbeats, still fresh.
    assert {run["status"] for run in site.runs(doomed).values()} == {"running"}

    def failed() -> bool:
        site.manage(RECONCILE)  # as the schedule would on alpha, only sooner
        return all(run["status"] == "failed" for run in site.runs(doomed).values())

    wait_until(failed, seconds=30, what="alpha to fail beta's runs")
    for run in site.runs(doomed).values():
        assert run["failure_code"] == "coordinator_lost"
        assert "The coordinator on beta sent no heartbeat for" in run["failure_message"]
        # Failed by heartbeat age, never sooner than the stale limit.
        silent = (run["finished_at"] - run["heartbeat_at"]).total_seconds()
        assert STALE_SECONDS <= silent < STALE_SECONDS + 5, silent
    # Its slots are free again: alpha takes the next run, once.
    [later] = site.batch(naps(300, 1))
    wait_until(
        lambda: site.runs([later])[later]["status"] == "completed",
        seconds=40,
        what="alpha to run the next member",
    )
    assert site.runs([later])[later]["host"] == "alpha"
    assert site.starts() == Counter({doomed[0]: 1, doomed[1]: 1, later: 1})


def test_a_cancel_from_one_machine_reaches_a_run_on_the_other_within_a_heartbeat(
    site: Site, machines: list[Machine]
) -> None:
    beta = site.machine("beta", REPLAYS_MAX_RUNS_PER_HOST="2", REPLAYS_MAX_PARALLEL_RUNS="2")
    machines.append(beta)
    beta.start()
    [run_id] = site.batch(naps(60000, 1))
    wait_until(lambda: site.starts()[run_id] == 1, seconds=40, what="the agent on beta")
    [agent_pid] = host_pids("REPLAYS_RUN_ID", str(run_id), running="mark_and_sleep")
    assert site.runs([run_id])[run_id]["host"] == "beta"

    # The web machine (alpha) cancels; it shares nothing with beta but the database.
    cancelled = site.command("cancel_runs", "--run", str(run_id), host="alpha")
    asked_at = time.monotonic()
    assert cancelled.returncode == 0, cancelled.stderr

    wait_until(
        lambda: site.runs([run_id])[run_id]["status"] == "cancelled",
        seconds=10,
        what="the run to be cancelled on beta",
    )
    took = time.monotonic() - asked_at
    assert took < HEARTBEAT_SECONDS + 2.5, f"the cancel took {took:.1f} s"
    wait_until(lambda: not psutil.pid_exists(agent_pid) or _zombie(agent_pid), seconds=10,
               what="the agent to be stopped")  # fmt: skip


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
