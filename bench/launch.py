"""Launch overhead: from a batch's approval to every member's agent started, against the
floor of spawning the same agents directly; and how fast a freed slot is taken.

    python bench/launch.py                       # SQLite, the ORM broker, 64 members
    DATABASE_URL=postgres://u:p@host/replays REDIS_URL=redis://127.0.0.1:6390/7 \\
        python bench/launch.py                   # PostgreSQL and Redis

The agent is a `command` agent running a two-line shell script that writes its start
time and exits. The floor starts the same script the same number of times from this
process (its own session, output to a file, as Replays starts an agent), in the same
run, alternating with the launches; every figure is a median over the rounds. A real
django-q2 cluster (`manage.py qcluster`) does the dispatching, with the capacity set to
the batch size. On PostgreSQL the bench makes and uses its own database
(replays_bench_launch on the server of DATABASE_URL), never the one named there.
The freed-slot figure runs a second cluster with capacity 1 and two members: from the
first run's end (its finished_at) to the second agent's start.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "manage.py"
BENCH_DATABASE = "replays_bench_launch"
AGENT_SCRIPT = '#!/bin/sh\ndate +%s.%N > "$1/started"\n'


def bench_database_url(url: str) -> str:
    """The bench's own PostgreSQL database on the server of `url` (made when missing)."""
    import psycopg

    parts = urlsplit(url)
    with psycopg.connect(url, autocommit=True) as connection:
        exists = connection.execute(
            "SELECT 1 FROM pg_database WHERE datname = %s", [BENCH_DATABASE]
        ).fetchone()
        if not exists:
            connection.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    return urlunsplit(parts._replace(path=f"/{BENCH_DATABASE}"))


def environment(folder: Path, members: int, fork: bool) -> dict[str, str]:
    database_url = os.environ.get("DATABASE_URL", "")
    database_url = (
        bench_database_url(database_url)
        if database_url.startswith("postgres")
        else f"sqlite:///{folder / 'bench.sqlite3'}"
    )
    script = folder / "agent.sh"
    script.write_text(AGENT_SCRIPT)
    agents = {
        "bench": {
            "kind": "command",
            "command": ["/bin/sh", str(script), "{run_dir}"],
            "models": [f"m{index}" for index in range(members)],
        }
    }
    agents_file = folder / "agents.json"
    agents_file.write_text(json.dumps(agents))
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "replaysite.settings",
        "DATABASE_URL": database_url,
        "REPLAYS_VAR_DIR": str(folder / "var"),
        "REPLAYS_RUN_ROOT": str(folder / "runs"),
        "REPLAYS_REPOSITORY_ROOTS": str(folder),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_MAX_PARALLEL_RUNS": str(members),
        "REPLAYS_MAX_RUNS_PER_HOST": str(members),
        "REPLAYS_FORK_COORDINATORS": "1" if fork else "0",
        "PYTHONUNBUFFERED": "1",
    }
    if not os.environ.get("REDIS_URL"):
        env.pop("REDIS_URL", None)
    return env


def start_cluster(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            [sys.executable, str(MANAGE), "qcluster"],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop_cluster(cluster: subprocess.Popen[bytes]) -> None:
    cluster.send_signal(signal.SIGTERM)
    try:
        cluster.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(cluster.pid, signal.SIGKILL)
        cluster.wait()


def wait_until(condition, *, seconds: float, what: str, poll: float = 0.01):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll)
    raise SystemExit(f"timed out waiting for {what}")


def wait_for_cluster(cluster: subprocess.Popen[bytes]) -> None:
    """Until the cluster has run one task (its workers are up and polling)."""
    from django_q.models import Success
    from django_q.tasks import async_task

    task_id = async_task("math.floor", 1.5)

    def done() -> bool:
        if cluster.poll() is not None:
            raise SystemExit("the cluster exited; see its log")
        return Success.objects.filter(id=task_id).exists()

    wait_until(done, seconds=120, what="the cluster to run a task", poll=0.1)


def started_at(folder: Path) -> float | None:
    try:
        return float((folder / "started").read_text())
    except (OSError, ValueError):
        return None


def approve_and_wait(setup: Setup, members: int) -> list[float]:
    """Queue one batch of `members` runs and ask for a dispatch in one transaction, as
    approval does; each agent's start, in seconds after the commit."""
    from django.db import transaction

    from replays import runfolder, wakeups
    from replays.factories.runs import make_run_graph
    from replays.models import FINISHED_RUN_STATUSES, Run

    with transaction.atomic():
        _, runs = make_run_graph(
            owner=setup.owner,
            repo=setup.repo,
            baseline=setup.baseline,
            ending=setup.ending,
            models=[f"bench:m{index}" for index in range(members)],
            result_sha256=setup.result_sha256,
        )
        wakeups.request_dispatch()
        approved = time.time()
    folders = [runfolder.run_folder(run.pk) for run in runs]
    ids = [run.pk for run in runs]

    def every_start() -> list[float] | None:
        found = [started_at(folder) for folder in folders]
        if None not in found:
            return found  # type: ignore[return-value]
        failed = Run.objects.filter(pk__in=ids, status="failed").first()
        if failed is not None:
            raise SystemExit(f"run {failed.pk} failed: {failed.failure_message}")
        return None

    times = wait_until(every_start, seconds=600, what="every agent to start", poll=0.02)
    wait_until(
        lambda: (
            Run.objects.filter(pk__in=ids).exclude(status__in=FINISHED_RUN_STATUSES).count() == 0
        ),
        seconds=600,
        what="every run to end",
        poll=0.1,
    )
    failed = Run.objects.filter(pk__in=ids).exclude(status="completed")
    if failed.exists():
        run = failed.first()
        raise SystemExit(f"run {run.pk} {run.status}: {run.failure_message}")
    return sorted(value - approved for value in times)


def spawn_floor(setup: Setup, members: int, round_number: int) -> list[float]:
    """The same script started `members` times from here; each start after the first spawn."""
    folders = []
    for index in range(members):
        folder = setup.folder / "floor" / f"round-{round_number}" / f"p{index}"
        folder.mkdir(parents=True)
        folders.append(folder)
    begun = time.time()
    children = []
    for folder in folders:
        with (folder / "agent.log").open("ab") as log:
            children.append(
                subprocess.Popen(
                    ["/bin/sh", str(setup.folder / "agent.sh"), str(folder)],
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                )
            )
    times = wait_until(
        lambda: (lambda found: found if None not in found else None)(
            [started_at(folder) for folder in folders]
        ),
        seconds=120,
        what="the floor's processes to start",
    )
    for child in children:
        child.wait()
    return sorted(value - begun for value in times)


def freed_slot_gap(setup: Setup) -> float:
    """Capacity 1, two members: the first run's end to the second agent's start."""
    from django.db import transaction

    from replays import runfolder, wakeups
    from replays.factories.runs import make_run_graph
    from replays.models import FINISHED_RUN_STATUSES, Run

    with transaction.atomic():
        _, runs = make_run_graph(
            owner=setup.owner,
            repo=setup.repo,
            baseline=setup.baseline,
            ending=setup.ending,
            models=["bench:m0", "bench:m1"],
            result_sha256=setup.result_sha256,
        )
        wakeups.request_dispatch()
    ids = [run.pk for run in runs]
    wait_until(
        lambda: (
            Run.objects.filter(pk__in=ids).exclude(status__in=FINISHED_RUN_STATUSES).count() == 0
        ),
        seconds=120,
        what="both runs to end",
        poll=0.05,
    )
    first, second = (Run.objects.get(pk=pk) for pk in ids)
    if first.status != "completed" or second.status != "completed":
        raise SystemExit(f"a run failed: {first.failure_message or second.failure_message}")
    second_start = started_at(runfolder.run_folder(second.pk))
    assert second_start is not None and first.finished_at is not None
    return second_start - first.finished_at.timestamp()


class Setup:
    def __init__(self, folder: Path) -> None:
        from django.contrib.auth.models import User

        from replays.factories.runs import historical_result_sha256, make_git_repo

        self.folder = folder
        self.owner, _ = User.objects.get_or_create(username="bench")
        self.repo, self.baseline, self.ending = make_git_repo(folder)
        # Computed once; each batch records it, and each coordinator checks the diff it
        # reads against it (as approval and the coordinator do).
        self.result_sha256 = historical_result_sha256(self.repo, self.baseline, self.ending)


def milliseconds(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slot-rounds", type=int, default=5, help="0 skips the freed-slot part")
    parser.add_argument(
        "--spawn",
        action="store_true",
        help="start coordinators as new interpreters (REPLAYS_FORK_COORDINATORS=0), as before",
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    arguments = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="replays-bench-launch-"))
    env = environment(folder, arguments.members, fork=not arguments.spawn)
    os.environ.clear()
    os.environ.update(env)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection

    call_command("migrate", verbosity=0)
    from replays.models import Run

    Run.objects.all().delete()  # A reused PostgreSQL database: start from no runs.
    setup = Setup(folder)
    broker = "Redis" if settings.Q_CLUSTER.get("redis") else "ORM"
    print(
        f"launch: {arguments.members} members, {arguments.rounds} rounds, "
        f"{connection.vendor} + {broker} broker, coordinators "
        f"{'spawned' if arguments.spawn else 'forked'}, {os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}, Django {django.__version__}",
        flush=True,
    )
    floors: list[list[float]] = []
    launches: list[list[float]] = []
    gaps: list[float] = []
    single_floors: list[float] = []
    cluster = start_cluster(env, folder / "cluster.log")
    try:
        wait_for_cluster(cluster)
        for round_number in range(arguments.rounds):
            floors.append(spawn_floor(setup, arguments.members, round_number))
            launches.append(approve_and_wait(setup, arguments.members))
            print(
                f"  round {round_number + 1}: floor last {milliseconds(floors[-1][-1])}, "
                f"launch first {milliseconds(launches[-1][0])} last "
                f"{milliseconds(launches[-1][-1])}",
                flush=True,
            )
    finally:
        stop_cluster(cluster)
    if arguments.slot_rounds:
        env_one = {**env, "REPLAYS_MAX_PARALLEL_RUNS": "1", "REPLAYS_MAX_RUNS_PER_HOST": "1"}
        cluster = start_cluster(env_one, folder / "cluster-capacity-1.log")
        try:
            wait_for_cluster(cluster)
            for round_number in range(arguments.slot_rounds):
                single_floors.append(spawn_floor(setup, 1, 1000 + round_number)[0])
                gaps.append(freed_slot_gap(setup))
        finally:
            stop_cluster(cluster)

    members = arguments.members
    floor_last = statistics.median(times[-1] for times in floors)
    launch_first = statistics.median(times[0] for times in launches)
    launch_last = statistics.median(times[-1] for times in launches)
    per_member = statistics.median(
        (launch[-1] - floor[-1]) / members for launch, floor in zip(launches, floors, strict=True)
    )
    print()
    print("| figure | baseline (spawn floor) | Replays | ratio |")
    print("|---|---|---|---|")
    print(
        f"| all {members} agents started | {milliseconds(floor_last)} | "
        f"{milliseconds(launch_last)} (first {milliseconds(launch_first)}) | "
        f"{launch_last / floor_last:.2f}x |"
    )
    print(f"| per member above the floor | 0 ms | {per_member * 1000:.1f} ms | |")
    if gaps:
        gap = statistics.median(gaps)
        single = statistics.median(single_floors)
        print(
            f"| freed slot taken (run end to next agent start) | {milliseconds(single)} "
            f"(one spawn) | {milliseconds(gap)} | {gap / single:.1f}x |"
        )
    if arguments.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
