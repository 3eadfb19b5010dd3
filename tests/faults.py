"""The fault-injection driver: trials that SIGKILL a real process at a random step, then
check that the promises still hold.

One trial prepares and approves a tiny batch (one or two members of a command agent
that marks its start, naps and edits; judged by a scripted evaluator, with a Review of
its own), and kills one of: the web process doing prepare and approve, the whole
cluster, one of the cluster's workers, or a member's coordinator, at a random moment
(a seed per trial). Then it restarts what died, lets the system settle (as the
schedule would, only sooner), reconciles and checks the invariants over everything
done so far:

- every member of every approved batch is accounted for: ended (a failure with its
  reason) or still queued;
- no member's agent started twice (the agent's own start marker);
- no approval produced two batches, and an approval retried after a kill returned the
  batch it had already made;
- after reconcile, no run is launching or running without a live owner;
- no agent or evaluator process outlives its run (psutil);
- no Review derived twice: every derivation but the last of a review was made by a
  coordinator this driver killed.

The cluster is reused across trials whose target is not the cluster, and trials run in
rounds of ROUND: each starts while the ones before it still run, then the round settles
and the invariants are checked.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from django.contrib.auth.models import User
from django.db.models import Count

from replays import approval, dispatch, planning, processes, wakeups
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import (
    ACTIVE_RUN_STATUSES,
    FINISHED_RUN_STATUSES,
    Batch,
    Plan,
    Review,
    Run,
    RunStatus,
)

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
AGENT_SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"
KINDS = ("web", "cluster", "worker", "coordinator")
# How often each target is drawn: coordinators die at the most steps; a cluster restart
# costs seconds.
WEIGHTS = (1.5, 1, 2, 5.5)
# What a kill at each run phase interrupts.
STEP_OF_PHASE = {
    "queued": "dispatch",
    "workspace": "spawn",
    "implementing": "run",
    "collecting": "collect",
    "reviewing": "review",
    "done": "after",
}
SETTLE_SECONDS = 60
ROUND = 6
# A django-q2 cluster whose worker, pusher or monitor was SIGKILLed while it held the lock
# of one of the cluster's multiprocessing queues takes no task again (the lock is never
# released; the replacement process waits on it for ever), though every process looks
# alive. Queued members then wait: they are not lost (still queued), and a restarted
# cluster dispatches them. When no active member moved (claim, step or heartbeat) for this
# long, the driver restarts the cluster as a watchdog would, and counts it with what the
# cluster's processes were doing. A hung coordinator is not helped by that: it still
# fails the trial when the settle time runs out.
WEDGED_SECONDS = 5.0

# The web process: prepare, say the plan and its token, approve, say the batch.
WEB = """
import json, os
from django.contrib.auth.models import User
from replays import approval, planning, wakeups
user = User.objects.get(username=os.environ["FAULT_USER"])
prepared = planning.prepare_plan(owner=user, raw_configuration=json.loads(os.environ["FAULT_PLAN"]))
plan = prepared.plan
print(json.dumps({"plan": plan.pk, "token": prepared.prepare_token}), flush=True)
result = approval.approve_plan(plan_id=plan.pk, user=user, approved=True,
                               prepare_token=prepared.prepare_token, run_config=plan.configuration)
print(json.dumps({"batch": result.batch.pk}), flush=True)
"""


# The folder the agents' and judges' marker files go in: writable in their sandboxes
# (REPLAYS_TEST_SANDBOX_WRITABLE), which show them nothing else of the test's folder.
MARKS = "marks"


def below_sentinel(cluster_pid: int) -> list[psutil.Process]:
    """The cluster's processes below its sentinel (workers, pusher, monitor), in the
    cluster's own session: not a coordinator, which has a session of its own.

    Processes come and go while this looks (a killed worker is reaped, its replacement
    forked): one that is gone by the time it is asked about is not listed."""
    try:
        main = psutil.Process(cluster_pid)
        session = os.getsid(cluster_pid)
        sentinels = main.children()
    except (psutil.NoSuchProcess, ProcessLookupError):
        return []
    found = []
    for sentinel in sentinels:
        try:
            children = sentinel.children()
        except psutil.NoSuchProcess:
            continue
        for child in children:
            try:
                if os.getsid(child.pid) == session:
                    found.append(child)
            except ProcessLookupError:
                continue
    return found


class InvariantBroken(AssertionError):
    pass


def agents_config(root: Path) -> dict[str, Any]:
    """A napping agent (models s<ms>) and a scripted judge whose calls name their caller."""
    return {
        "nap": {
            "kind": "command",
            "models": [f"s{ms}" for ms in range(50, 3000)],
            "command": [sys.executable, str(AGENT_SCRIPTS / "mark_and_sleep.py"), "{model}"],
            "env": {"MARKER_FILE": str(root / MARKS / "starts.txt")},
        },
        "judge": {
            "kind": "command",
            "models": ["fair"],
            "command": [sys.executable, "-c", "pass"],
            "judge_command": [sys.executable, str(AGENT_SCRIPTS / "mark_parent.py"),
                              str(AGENT_SCRIPTS / "judge.py"), "{task_file}", "{answer_file}"],
            "env": {"CALLS_FILE": str(root / MARKS / "judge-calls.txt"), "CALLS_LABEL": "judge"},
        },
    }  # fmt: skip


@dataclass
class Trial:
    number: int
    seed: int
    kind: str
    step: str = ""
    batches: list[int] = field(default_factory=list)


@dataclass
class FaultLab:
    env: dict[str, str]
    root: Path
    user: User
    thread_id: int
    start_uuid: str
    repo: Path
    cluster: subprocess.Popen[bytes] | None = None
    killed: set[int] = field(default_factory=set)
    faults: Counter[str] = field(default_factory=Counter)
    steps: Counter[str] = field(default_factory=Counter)
    trials: list[Trial] = field(default_factory=list)
    retried_approvals: int = 0
    wedges: list[str] = field(default_factory=list)
    timings: Counter[str] = field(default_factory=Counter)
    small_repo: tuple[Path, str, str] | None = None

    @property
    def marker(self) -> Path:
        return self.root / MARKS / "starts.txt"

    @property
    def judge_calls(self) -> Path:
        return self.root / MARKS / "judge-calls.txt"

    # --- processes ---------------------------------------------------------------

    def start_cluster(self) -> None:
        log = (self.root / "cluster.log").open("ab")
        self.cluster = subprocess.Popen(
            [sys.executable, str(MANAGE), "qcluster"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def kill_cluster(self) -> None:
        """SIGKILL the cluster's whole process group (main, sentinel, workers); detached
        coordinators live on, as they do when a cluster crashes."""
        assert self.cluster is not None
        try:
            os.killpg(self.cluster.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.cluster.wait()

    def stop_cluster(self) -> None:
        """At the end: every run has ended, nothing is left to stop gracefully."""
        if self.cluster is not None and self.cluster.poll() is None:
            self.kill_cluster()

    def cluster_workers(self) -> list[psutil.Process]:
        assert self.cluster is not None
        return below_sentinel(self.cluster.pid)

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
            self.killed.add(pid)
        except ProcessLookupError:
            pass

    # --- one trial ---------------------------------------------------------------

    def plan_configuration(self, rng: random.Random, number: int) -> dict[str, Any]:
        naps = rng.sample(range(50, 600), rng.choice((1, 2)))
        return {
            "configurations": [
                {
                    "thread_id": self.thread_id,
                    "start_message_uuid": self.start_uuid,
                    "end_message_uuid": self.start_uuid,
                    "repository": str(self.repo),
                }
            ],
            "models": [f"nap:s{ms}" for ms in naps],
            "evaluator": "judge:fair",
            # Its own test paths: a Review of its own (the key includes them).
            "test_paths": [f"fault-{number}/**"],
            "timeout_seconds": 60,
        }

    def queue_batch(self, configuration: dict[str, Any]) -> Batch:
        """The batch as approval leaves it, written directly (a new thread on the lab's
        small repository each time, so a Review of its own), and a dispatch asked for.
        Real prepare and approve take a second or more on the fixture thread: the web
        trials go through them, the others start where approval ends."""
        if self.small_repo is None:
            self.small_repo = make_git_repo(self.root / "small")
        repo, baseline, ending = self.small_repo
        batch, _ = make_run_graph(
            owner=self.user,
            repo=repo,
            baseline=baseline,
            ending=ending,
            models=configuration["models"],
            evaluator=configuration["evaluator"],
            timeout_seconds=configuration["timeout_seconds"],
        )
        wakeups.request_dispatch()
        return batch

    def approve_here(self, configuration: dict[str, Any]) -> Batch:
        prepared = planning.prepare_plan(owner=self.user, raw_configuration=configuration)
        plan = prepared.plan
        assert plan.status == "ready_for_approval", (plan.blockers, plan.questions)
        return approval.approve_plan(
            plan_id=plan.pk,
            user=self.user,
            approved=True,
            prepare_token=prepared.prepare_token,
            run_config=plan.configuration,
        ).batch

    def run_round(self, seeds: list[tuple[int, int]]) -> list[Trial]:
        """Trials one after the other without waiting for the earlier ones to end (so a
        kill also hits the members of the trials before it, and members queue behind the
        cap), then settle and check everything."""
        began = time.monotonic()
        trials = [self.start_trial(number, seed) for number, seed in seeds]
        faulted = time.monotonic()
        self.settle()
        settled = time.monotonic()
        self.check_invariants()
        self.timings["faults"] += faulted - began
        self.timings["settle"] += settled - faulted
        self.timings["checks"] += time.monotonic() - settled
        return trials

    def start_trial(self, number: int, seed: int) -> Trial:
        """Approve the trial's batch and inject its fault; its members may still run."""
        rng = random.Random(seed)
        kind = rng.choices(KINDS, weights=WEIGHTS)[0]
        trial = Trial(number=number, seed=seed, kind=kind)
        self.trials.append(trial)
        if self.cluster is None or self.cluster.poll() is not None:
            self.start_cluster()
        configuration = self.plan_configuration(rng, number)
        began = time.monotonic()
        if kind == "web":
            trial.batches.append(self._web_trial(trial, rng, configuration))
        else:
            batch = self.queue_batch(configuration)
            self.timings["approve"] += time.monotonic() - began
            trial.batches.append(batch.pk)
            self._process_fault(trial, rng, batch)
        self.timings[kind] += time.monotonic() - began
        self.faults[kind] += 1
        self.steps[f"{kind}@{trial.step}"] += 1
        return trial

    def _web_trial(self, trial: Trial, rng: random.Random, configuration: dict[str, Any]) -> int:
        """Kill the web process somewhere in prepare or approve; the user then retries:
        approves the plan again when its token was shown, else prepares anew."""
        out = self.root / f"web-{trial.number}.out"
        env = {**self.env, "FAULT_PLAN": json.dumps(configuration),
               "FAULT_USER": self.user.username}  # fmt: skip
        with out.open("wb") as stdout:
            web = subprocess.Popen(
                [sys.executable, str(MANAGE), "shell", "-c", WEB],
                env=env,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Half the kills come at a random moment of start-up and prepare (Django starts in
        # half a second to a second, prepare takes a fraction of one more), half just after
        # the plan was shown, inside approve.
        in_approve = rng.random() < 0.5
        delay = rng.uniform(0.0, 0.3) if in_approve else rng.uniform(0.4, 1.6)
        deadline = time.monotonic() + (30 if in_approve else delay)
        while time.monotonic() < deadline and web.poll() is None:
            if in_approve and '"plan"' in out.read_text():
                deadline = min(deadline, time.monotonic() + delay)
                in_approve = False
            time.sleep(0.005)
        self.kill(web.pid)
        web.wait()
        said = [json.loads(line) for line in out.read_text().splitlines() if line.startswith("{")]
        plan = next((line for line in said if "plan" in line), None)
        made = next((line["batch"] for line in said if "batch" in line), None)
        trial.step = "after" if made else "approve" if plan else "prepare"
        if plan is None:
            return self.approve_here(configuration).pk
        self.retried_approvals += 1
        again = approval.approve_plan(
            plan_id=plan["plan"],
            user=self.user,
            approved=True,
            prepare_token=plan["token"],
            run_config=Plan.objects.get(pk=plan["plan"]).configuration,
        )
        if made is not None and (again.batch.pk != made or not again.idempotent):
            raise InvariantBroken(
                f"the approval retried after the kill made batch {again.batch.pk}, "
                f"not the batch {made} it had made already"
            )
        return again.batch.pk

    def _process_fault(self, trial: Trial, rng: random.Random, batch: Batch) -> None:
        """Kill the cluster, a worker or a coordinator after a random delay; the step is
        where the trial's members were at that moment."""
        if trial.kind in ("cluster", "worker"):
            time.sleep(rng.uniform(0.0, 1.5))
            trial.step = _step_of(list(Run.objects.filter(batch=batch).order_by("id")))
        if trial.kind == "cluster":
            self.kill_cluster()
            time.sleep(rng.uniform(0.0, 0.5))
            self.start_cluster()
        elif trial.kind == "worker":
            workers = self.cluster_workers()
            if workers:
                self.kill(rng.choice(workers).pid)
            else:
                trial.step = "none"
        else:
            target = self._coordinator_to_kill(batch, rng)
            if target is None:
                trial.step = "none"
            else:
                pid, phase = target
                trial.step = STEP_OF_PHASE.get(phase, phase)
                self.kill(pid)

    def _coordinator_to_kill(self, batch: Batch, rng: random.Random) -> tuple[int, str] | None:
        """A live coordinator of the batch once it reached a step drawn at random (the
        first one past it when the step went by between two looks)."""
        order = list(STEP_OF_PHASE)
        wanted = order.index(rng.choice(("workspace", "implementing", "collecting", "reviewing")))
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            runs = list(
                Run.objects.filter(batch=batch, status__in=ACTIVE_RUN_STATUSES).order_by("id")
            )
            if not runs:
                return None
            for run in runs:
                phase = run.phase if run.status == RunStatus.RUNNING else "workspace"
                if order.index(phase) >= wanted and processes.is_alive(
                    run.pid, run.pid_create_time
                ):
                    return run.pid, phase
            time.sleep(0.005)
        return None

    # --- settling and checking -----------------------------------------------------

    def settle(self) -> None:
        """Until every member has ended: ask for a dispatch now and then (as the schedule
        does every minute), restart a cluster that died, and restart one that stopped
        taking tasks (see WEDGED_SECONDS) as a watchdog would."""
        deadline = time.monotonic() + SETTLE_SECONDS
        next_dispatch = time.monotonic() + 1
        last_active = time.monotonic()
        last_state: list[Any] = []
        while Run.objects.filter(status__in=ACTIVE_RUN_STATUSES).exists():
            if time.monotonic() > deadline:
                left = list(
                    Run.objects.filter(status__in=ACTIVE_RUN_STATUSES).values(
                        "id", "status", "phase", "pid", "host"
                    )
                )
                raise InvariantBroken(
                    f"members still active after {SETTLE_SECONDS}s: {left}; {self.diagnosis()}"
                )
            if self.cluster is None or self.cluster.poll() is not None:
                self.start_cluster()
                last_active = time.monotonic()
            state = list(
                Run.objects.filter(status__in=ACTIVE_RUN_STATUSES).values_list(
                    "id", "status", "phase", "heartbeat_at"
                )
            )
            if state != last_state:
                last_state = state
                last_active = time.monotonic()
            elif time.monotonic() - last_active > WEDGED_SECONDS:
                # Nothing moved (no claim, no step, no heartbeat) with dispatches asked for.
                self.wedges.append(self.diagnosis())
                self.kill_cluster()
                self.start_cluster()
                last_active = time.monotonic()
            if time.monotonic() > next_dispatch:
                wakeups.request_dispatch()
                next_dispatch = time.monotonic() + 1
            time.sleep(0.05)

    def diagnosis(self) -> str:
        """What the cluster was doing, for a trial that did not settle."""
        from django_q.models import OrmQ

        tree = []
        if self.cluster is not None:
            try:
                main = psutil.Process(self.cluster.pid)
                for process in (main, *main.children(recursive=True)):
                    wchan = Path(f"/proc/{process.pid}/wchan").read_text()
                    tree.append(f"{process.pid}:{process.status()}:{wchan}")
            except (psutil.NoSuchProcess, OSError):
                pass
        return (
            f"queued tasks {OrmQ.objects.count()}, cluster {tree}, wedged before {len(self.wedges)}"
        )

    def check_invariants(self) -> None:
        report = dispatch.reconcile_runs()
        if report.launch_failed or report.coordinator_lost:
            # Everything had ended before this reconcile: it must find nothing to do.
            raise InvariantBroken(f"reconcile after settling still acted: {report.lines}")
        for run in Run.objects.filter(batch_id__in=self.batch_ids()):
            if run.status == RunStatus.QUEUED:
                continue
            if run.status not in FINISHED_RUN_STATUSES:
                raise InvariantBroken(f"run {run.pk} is {run.status} after settling")
            if run.status == RunStatus.FAILED and not run.failure_message.strip():
                raise InvariantBroken(f"run {run.pk} failed without a reason")
        duplicates = self.duplicate_starts()
        if duplicates:
            raise InvariantBroken(f"agents started twice: {duplicates}")
        doubled = list(
            Batch.objects.values("plan_id").annotate(count=Count("id")).filter(count__gt=1)
        )
        if doubled:
            raise InvariantBroken(f"approvals with two batches: {doubled}")
        lost = self.lost_members()
        if lost:
            raise InvariantBroken(f"members lost: {lost}")
        orphans = self.orphans()
        if orphans:
            raise InvariantBroken(f"processes outlived their runs: {orphans}")
        derived = self.reviews_derived_twice()
        if derived:
            raise InvariantBroken(f"reviews derived twice: {derived}")

    def batch_ids(self) -> list[int]:
        return [batch for trial in self.trials for batch in trial.batches]

    def duplicate_starts(self) -> dict[int, int]:
        return {run: count for run, count in self.starts().items() if count > 1}

    def starts(self) -> Counter[int]:
        if not self.marker.exists():
            return Counter()
        return Counter(int(line.split()[0]) for line in self.marker.read_text().splitlines())

    def lost_members(self) -> list[str]:
        """Approved members that are missing: a batch without its runs, a model without
        its member."""
        lost = []
        for batch in Batch.objects.filter(pk__in=self.batch_ids()):
            models = sorted(batch.runs.values_list("model", flat=True))
            if models != sorted(batch.models_list):
                lost.append(f"batch {batch.pk}: members {models}, approved {batch.models_list}")
        return lost

    def orphans(self, grace_seconds: float = 5.0) -> list[str]:
        """Our agents and evaluators still running once every run has ended."""
        deadline = time.monotonic() + grace_seconds
        while True:
            found = []
            for process in psutil.process_iter(["cmdline"]):
                try:
                    cmdline = " ".join(process.info["cmdline"] or [])
                    if "agent_scripts" not in cmdline:
                        continue
                    environ = process.environ()
                    if environ.get("MARKER_FILE") == str(self.marker) or environ.get(
                        "CALLS_FILE"
                    ) == str(self.judge_calls):
                        if process.status() != psutil.STATUS_ZOMBIE:
                            found.append(f"pid {process.pid}: {cmdline}")
                except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                    continue
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def reviews_derived_twice(self) -> list[str]:
        """A review derived more than once, where the earlier deriver was not killed."""
        if not self.judge_calls.exists():
            return []
        callers: dict[int, list[int]] = {}
        for line in self.judge_calls.read_text().splitlines():
            _, parent, folder = line.split(" ", 2)
            found = re.search(r"/reviews/review-(\d+)", folder)
            if found:
                callers.setdefault(int(found.group(1)), []).append(int(parent))
        twice = []
        for review, parents in callers.items():
            earlier = [pid for pid in parents[:-1] if pid not in self.killed]
            if earlier:
                twice.append(f"review {review}: derived by {parents}")
        return twice

    def summary(self, vendor: str, seconds: float) -> dict[str, Any]:
        reviews = Review.objects.count()
        return {
            "database": vendor,
            "trials": len(self.trials),
            "faults": dict(sorted(self.faults.items())),
            "steps": dict(sorted(self.steps.items())),
            "members": Run.objects.filter(batch_id__in=self.batch_ids()).count(),
            "statuses": dict(
                Counter(
                    Run.objects.filter(batch_id__in=self.batch_ids()).values_list(
                        "status", flat=True
                    )
                )
            ),
            "approvals_retried": self.retried_approvals,
            "wedged_clusters_restarted": len(self.wedges),
            "wedges": self.wedges[:5],
            "reviews": reviews,
            "duplicates": len(self.duplicate_starts()),
            "lost": len(self.lost_members()),
            "orphans": len(self.orphans(grace_seconds=0)),
            "seconds": round(seconds, 1),
            "seconds_by_part": {part: round(value, 1) for part, value in self.timings.items()},
        }


def _step_of(runs: list[Run]) -> str:
    """Where the trial's members were when the fault came (the least advanced one)."""
    if not runs:
        return "approve"
    order = list(STEP_OF_PHASE)
    phases = []
    for run in runs:
        if run.status == RunStatus.LAUNCHING:
            phases.append("workspace")
        else:
            phases.append(run.phase)
    least = min(phases, key=lambda phase: order.index(phase) if phase in order else 0)
    return STEP_OF_PHASE.get(least, least)
