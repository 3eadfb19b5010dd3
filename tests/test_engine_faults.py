"""The engines fail under running work: PostgreSQL stopped for 30 s and started again,
Redis restarted (its queue lost), a heartbeat that could not be written for longer than
the stale limit. On the private servers of tests/engines.py (the shared ones cannot be
stopped by a test).

Coordinators keep their agents running through an outage and catch their heartbeats up
after it; a result that arrives while the database is down is written once it is back;
queued work is dispatched again by the schedule; nothing needs a hand to recover. A run
whose heartbeat was missing for longer than the stale limit is what reconcile acts on
(the design): it fails as coordinator_lost with its agent stopped, unless its coordinator
wrote a heartbeat first, and either way its agent started once.
"""

from __future__ import annotations

import time
from collections import Counter

import psutil
import pytest

# The same private servers and simulated machines as the two-machine tests.
from tests.conftest import host_pids
from tests.test_two_machines import (  # noqa: F401 - fixtures
    Machine,
    Site,
    engines_fixture,
    machines_fixture,
    naps,
    site_fixture,
    wait_until,
)

pytestmark = pytest.mark.multihost

OUTAGE_SECONDS = 30


def running_agents(site: Site) -> dict[int, int | None]:
    """Run id -> the pid of its agent as this machine numbers it (None once it ended), for
    every agent that marked its start (it writes the pid its sandbox's namespace gives it)."""
    if not site.marker.exists():
        return {}
    found: dict[int, int | None] = {}
    for line in site.marker.read_text().splitlines():
        run = int(line.split()[0])
        pids = host_pids("REPLAYS_RUN_ID", str(run), running="mark_and_sleep")
        found[run] = pids[0] if pids else None
    return found


def alive(pid: int | None) -> bool:
    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def coordinator_pids(site: Site, ids: list[int]) -> dict[int, int]:
    rows = site.engines.postgres.sql("SELECT id, pid FROM replays_run WHERE id = ANY(%s)", ids)
    return {run_id: pid for run_id, pid in rows}


def database_now(site: Site) -> object:
    return site.engines.postgres.sql("SELECT now()")[0][0]


def test_postgresql_down_for_30_seconds_loses_nothing_and_recovers_by_itself(
    site: Site, machines: list[Machine]
) -> None:
    # The stale limit is above the outage: the runs must survive it.
    alpha = site.machine(
        "alpha",
        REPLAYS_MAX_PARALLEL_RUNS="2",
        REPLAYS_MAX_RUNS_PER_HOST="2",
        REPLAYS_HEARTBEAT_STALE_SECONDS="60",
    )
    machines.append(alpha)
    alpha.start()
    # One agent ends during the outage, one after it; the third member waits for a slot.
    ids = site.batch([naps(12000, 1)[0], naps(40000, 1)[0], naps(300, 1)[0]])
    during, after, queued = ids
    wait_until(lambda: set(running_agents(site)) == {during, after}, seconds=40,
               what="two agents to start")  # fmt: skip
    agents = running_agents(site)
    coordinators = coordinator_pids(site, [during, after])
    assert site.runs([queued])[queued]["status"] == "queued"

    site.engines.postgres.stop("fast")
    stopped_at = time.monotonic()
    while time.monotonic() - stopped_at < OUTAGE_SECONDS:
        assert all(alive(pid) for pid in coordinators.values()), "a coordinator died"
        assert alive(agents[after]), "the agent was stopped while the database was down"
        time.sleep(1)
    assert not alive(agents[during]), "the first agent should have ended during the outage"
    site.engines.postgres.start()
    back = database_now(site)

    # Heartbeats catch up within a few of them.
    wait_until(
        lambda: site.runs([after])[after]["heartbeat_at"] > back,
        seconds=5,
        what="the heartbeat to catch up",
    )
    wait_until(
        lambda: all(run["finished_at"] for run in site.runs(ids).values()),
        seconds=60,
        what="every member to end",
    )
    runs = site.runs(ids)
    assert [runs[run_id]["status"] for run_id in ids] == ["completed"] * 3, runs
    # The result that came in during the outage was written when the database came back.
    diffs = dict(site.engines.postgres.sql(
        "SELECT id, diff FROM replays_run WHERE id = ANY(%s)", ids))  # fmt: skip
    assert all("CHANGES.md" in diffs[run_id] for run_id in ids)
    assert site.starts() == Counter({run_id: 1 for run_id in ids})


def test_redis_restarted_loses_its_queue_and_the_schedule_dispatches_again(
    site: Site, machines: list[Machine]
) -> None:
    alpha = site.machine("alpha", REPLAYS_MAX_PARALLEL_RUNS="2", REPLAYS_MAX_RUNS_PER_HOST="2")
    machines.append(alpha)
    alpha.start()
    ids = site.batch([*naps(3000, 2), naps(300, 1)[0]])
    first, second, queued = ids
    wait_until(lambda: set(running_agents(site)) == {first, second}, seconds=40,
               what="two agents to start")  # fmt: skip

    # Redis goes away while they run: the dispatch each asks for as it ends is lost.
    site.engines.redis.stop()
    wait_until(
        lambda: all(site.runs([r])[r]["status"] == "completed" for r in (first, second)),
        seconds=30,
        what="the running members to end without Redis",
    )
    time.sleep(2)
    assert site.runs([queued])[queued]["status"] == "queued"
    site.engines.redis.start()  # empty: every queued task is gone
    assert alpha.cluster is not None and alpha.cluster.poll() is None, "the cluster died"

    # The every-minute schedule dispatches it (made due now rather than waited for).
    site.engines.postgres.sql(
        "UPDATE django_q_schedule SET next_run = now() WHERE func = %s",
        "replays.tasks.dispatch_runs_task",
    )
    wait_until(
        lambda: site.runs([queued])[queued]["status"] == "completed",
        seconds=60,
        what="the queued member to be dispatched by the schedule",
    )
    assert site.starts() == Counter({run_id: 1 for run_id in ids})


def test_a_heartbeat_missing_longer_than_the_stale_limit_is_handled_once(
    site: Site, machines: list[Machine]
) -> None:
    stale = 4
    alpha = site.machine(
        "alpha",
        REPLAYS_MAX_PARALLEL_RUNS="3",
        REPLAYS_MAX_RUNS_PER_HOST="3",
        REPLAYS_HEARTBEAT_STALE_SECONDS=str(stale),
    )
    machines.append(alpha)
    alpha.start()
    # One agent ends early in the outage: its coordinator cannot write the result for
    # longer than the stale limit and gives up. The others outlive the outage.
    ids = site.batch([naps(3000, 1)[0], *naps(20000, 2)])
    ended_early = ids[0]
    wait_until(lambda: set(running_agents(site)) == set(ids), seconds=40,
               what="three agents to start")  # fmt: skip
    agents = running_agents(site)
    coordinators = coordinator_pids(site, ids)

    site.engines.postgres.stop("fast")
    # Long enough for its step write and its final write each to give up (stale limit).
    time.sleep(stale + 10)
    assert not alive(coordinators[ended_early]), "it should have given up"
    site.engines.postgres.start()

    wait_until(
        lambda: all(run["finished_at"] for run in site.runs(ids).values()),
        seconds=60,
        what="every member to end",
    )
    runs = site.runs(ids)
    early = runs[ended_early]
    assert (early["status"], early["failure_code"]) == ("failed", "coordinator_lost"), early
    assert (
        f"The coordinator (pid {coordinators[ended_early]} on alpha) stopped"
        in (early["failure_message"])
    )
    outcomes = Counter()
    for run_id in ids[1:]:
        run = runs[run_id]
        if run["status"] == "failed":
            # Reconcile saw the stale heartbeat before the coordinator wrote one.
            assert run["failure_code"] == "coordinator_lost", run
            assert "sent no heartbeat for" in run["failure_message"]
            silent = (run["finished_at"] - run["heartbeat_at"]).total_seconds()
            assert silent >= stale, run
            outcomes["lost"] += 1
        else:
            # Its coordinator wrote first: the run went on and ended normally.
            assert run["status"] == "completed", run
            outcomes["caught up"] += 1
    for run_id in ids:
        wait_until(lambda run_id=run_id: not alive(agents[run_id]), seconds=10,
                   what=f"the agent of run {run_id} to be gone")  # fmt: skip
    # Nothing ran twice and no row was written over once it had ended.
    ended = site.runs(ids)
    time.sleep(2)
    assert site.starts() == Counter({run_id: 1 for run_id in ids})
    assert site.runs(ids) == ended
    print(f"stale-heartbeat outcomes of the runs that outlived the outage: {dict(outcomes)}")
