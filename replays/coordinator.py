"""One run end to end, in its own process (`manage.py run_coordinator RUN_ID`).

Dispatch claims a run (queued -> launching) and starts this process. The first
write here is a compare-and-set launching -> running: only the process that wins
it ever starts the agent, so a member starts at most once however often a
coordinator is started for it. Every later write is conditional on the run still
being running: a reconcile may have failed it meanwhile, and then this process
stops its agent and leaves the row alone.

Steps: run folder with the approved configuration and the request (mode 0600),
a git worktree at the baseline, the agent in its own session with the run's
timeout, a heartbeat that also checks for cancel, then the diff, usage and cost,
and one final conditional write. Anything that goes wrong on our side fails the
run as `infrastructure` with the reason; nothing ends in a silent crash.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from types import FrameType
from typing import Any

from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connections,
)
from django.utils import timezone

from replays import (
    access,
    agents,
    context,
    pricing,
    processes,
    repos,
    runfolder,
    runlogs,
    sandbox,
)
from replays.agents.base import (
    Agent,
    AgentNotReady,
    AgentOutcome,
    AgentSetupError,
    ForkedSession,
    Invocation,
    RunContext,
    absurd_usage,
    error_from_log,
    plain_text,
    read_tail,
    write_private,
)
from replays.agents.problems import SetupKind, SetupProblem
from replays.evaluation import report
from replays.models import FailureCode, Run, RunPhase, RunStatus
from replays.processes import ProcessIdentity, pause_point
from replays.runfolder import (
    AGENT_LOG,
    CONFIGURATION_FILE,
    FULL_DIFF_FILE,
    REQUEST_FILE,
    WORKSPACE,
)
from replays.transcripts.base import TokenUsage

logger = logging.getLogger(__name__)

# How often the wait loop looks at the agent; heartbeats are much rarer.
POLL_SECONDS = 0.1
# A failure message quotes this much of the agent's words at most.
MAX_MESSAGE_CHARS = 4000
# A write that meets a database outage is tried again after this long, doubling up to 5 s.
OUTAGE_RETRY_SECONDS = 0.5


class RunGone(processes.StopRequested):
    """The run is no longer ours: a reconcile or someone else finished it while we worked."""


class CoordinatorStopped(processes.StopRequested):
    """This process was asked to stop (SIGTERM/SIGINT)."""


class CancelledWhileReviewing(processes.StopRequested):
    """A cancel arrived while the run's result was being tested or judged."""

    def __str__(self) -> str:
        return "the run was cancelled"


@dataclass
class _Result:
    """What the final write records."""

    status: RunStatus
    failure_code: FailureCode = FailureCode.NONE
    failure_message: str = ""
    exit_code: int | None = None
    wall_seconds: float | None = None
    outcome: AgentOutcome = field(default_factory=AgentOutcome)
    diff: str = ""
    files_changed: int = 0
    turns: _Turns | None = None

    @property
    def turn_records(self) -> list[dict[str, Any]]:
        return self.turns.records if self.turns is not None else []


class _Turns:
    """The turns of one run as they end: each one's own figures (Run.turns), and their sum."""

    def __init__(self, *, several: bool) -> None:
        self.several = several
        self.records: list[dict[str, Any]] = []
        self.outcomes: list[AgentOutcome] = []

    def add(self, outcome: AgentOutcome, *, ending: str, seconds: float, session: str) -> None:
        self.outcomes.append(outcome)
        self.records.append(
            {
                "turn": len(self.records) + 1,
                "ending": ending if ending in ("timeout", "cancelled") else "exited",
                "exit_code": int(ending) if ending not in ("timeout", "cancelled") else None,
                "seconds": seconds,
                "model_seconds": outcome.model_seconds,
                "cost_usd": None if outcome.cost_usd is None else str(_rounded(outcome.cost_usd)),
                "tokens": outcome.usage.as_dict(),
                "session_id": session,
                "failed": outcome.failed,
            }
        )

    def diff_after(self, diff: str) -> None:
        """The tree's diff once the latest turn ended (several turns only: one turn's is the
        run's own)."""
        self.records[-1]["diff"] = diff
        self.records[-1]["files_changed"] = len(repos.changed_files(diff))

    def total(self) -> AgentOutcome:
        """The run's outcome: usage, cost and model time summed (a cost unknown for one turn
        is unknown for the run), the last turn's message and error."""
        if not self.outcomes:
            return AgentOutcome()
        last = self.outcomes[-1]
        costs = [outcome.cost_usd for outcome in self.outcomes]
        seconds = [o.model_seconds for o in self.outcomes if o.model_seconds is not None]
        return AgentOutcome(
            final_message=last.final_message,
            usage=sum((o.usage for o in self.outcomes), TokenUsage()),
            cost_usd=None if None in costs else sum(costs, Decimal(0)),  # type: ignore[arg-type]
            model_seconds=round(sum(seconds), 3) if seconds else None,
            error=last.error,
            failed=last.failed,
            setup=last.setup,
        )


def run_member(*, run_id: int) -> str:
    """Run one launching member to its end. Returns what happened, for the command's output.

    Does nothing (and returns "not started") when the run is not launching: another
    coordinator owns it, a reconcile failed it, or it was cancelled before it started.
    """
    try:
        pause_point("coordinator_before_start")
        if not _start(run_id):
            if _cancel_before_start(run_id):
                _request_dispatch()
                return "cancelled before start"
            return "not started"
        run = Run.objects.get(pk=run_id)
        previous = _stop_on_signals()
        try:
            result = _Member(run).execute()
        finally:
            _restore_signals(previous)
        _request_dispatch()
        return result
    finally:
        connections.close_all()


def _start(run_id: int) -> bool:
    """The compare-and-set that makes a member start at most once."""
    me = processes.own_identity()
    now = timezone.now()
    run_dir = runfolder.run_folder(run_id)
    started = Run.objects.filter(
        pk=run_id, status=RunStatus.LAUNCHING, cancel_requested_at__isnull=True
    ).update(
        status=RunStatus.RUNNING,
        phase=RunPhase.WORKSPACE,
        pid=me.pid,
        pid_create_time=me.create_time,
        host=settings.REPLAYS_HOST_NAME,
        started_at=now,
        heartbeat_at=now,
        run_dir=str(run_dir),
        workspace_path=str(run_dir / WORKSPACE),
    )
    return started == 1


def _cancel_before_start(run_id: int) -> bool:
    now = timezone.now()
    cancelled = Run.objects.filter(
        pk=run_id, status=RunStatus.LAUNCHING, cancel_requested_at__isnull=False
    ).update(status=RunStatus.CANCELLED, phase=RunPhase.DONE, finished_at=now, heartbeat_at=now)
    return cancelled == 1


class _Member:
    """The steps of one started run. Every write is conditional on status=running."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.configuration: dict[str, Any] = dict(run.configuration or {})
        self.run_dir = Path(run.run_dir)
        self.workspace = Path(run.workspace_path)
        self.log_path = self.run_dir / AGENT_LOG
        self.repo: Path | None = None
        self.worktree_added = False
        self.agent: subprocess.Popen[bytes] | None = None
        self.agent_identity: ProcessIdentity | None = None
        self.adapter: Agent | None = None
        self.is_baseline = False
        self.agent_finished = False
        self._next_review_beat = 0.0

    def execute(self) -> str:
        try:
            result = self._steps()
        except RunGone:
            logger.warning("Run %s is no longer running here; stopping.", self.run.pk)
            self._stop_agent()
            self._remove_worktree()
            return "stopped: the run was finished elsewhere"
        except CoordinatorStopped as exc:
            result = _Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, str(exc))
        except AgentNotReady as exc:
            result = _Result(RunStatus.FAILED, FailureCode.SETUP, exc.problem.message())
        except AgentSetupError as exc:
            result = _Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, str(exc))
        except Exception as exc:  # noqa: BLE001 - every failure on our side is written on the run
            logger.error("Run %s failed:\n%s", self.run.pk, traceback.format_exc())
            result = _Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, _describe(exc))
        finally:
            # Whatever happened, no agent process outlives its coordinator's decision.
            self._stop_agent()
        self._remove_worktree()
        self._finish(result)
        return result.status if not result.failure_code else f"failed: {result.failure_code}"

    # --- steps ---------------------------------------------------------------------

    def _steps(self) -> _Result:
        model_id = str(self.configuration.get("model") or self.run.model)
        try:
            info = agents.resolve_model(model_id)
        except agents.UnknownModel as exc:
            raise AgentNotReady(SetupProblem(SetupKind.UNKNOWN_MODEL, str(exc))) from None
        if not info.available:
            raise AgentNotReady(
                SetupProblem(
                    SetupKind.PROGRAM_MISSING,
                    f"The agent for {info.id} cannot run on this machine: {info.reason}",
                )
            )
        adapter = agents.adapter_for(info.id)
        self.adapter = adapter
        self.is_baseline = info.is_baseline
        # A baseline is one process whatever the range; an agent gets one turn per request.
        requests = [str(self.configuration.get("request", ""))]
        if not info.is_baseline and self.configuration.get("requests"):
            requests = [str(text) for text in self.configuration["requests"]]
        preamble = str(self.configuration.get("preamble") or "")
        self._write_run_folder(context.with_preamble(preamble, requests[0]))
        self.repo = Path(self.configuration["repository"])
        if not access.under_roots(self.repo):
            # Checked at prepare and approval too; the roots may have changed since.
            raise AgentSetupError(f"The repository {self.repo} {access.OUTSIDE_ROOTS}.")
        baseline = self.configuration["baseline_commit"]
        first = RunContext(
            run_id=self.run.pk,
            model=info.model,
            configuration=self.configuration,
            run_dir=self.run_dir,
            workspace=self.workspace,
            request_file=self.run_dir / REQUEST_FILE,
            log_path=self.log_path,
            turns=len(requests),
        )
        with _heartbeat_in_background(self.run.pk):
            # Set first: a worktree add that fails halfway still leaves something to remove.
            self.worktree_added = True
            repos.add_worktree(self.repo, self.workspace, baseline)
            if not info.is_baseline:
                first = replace(first, fork=self._fork())
            invocation = adapter.invocation(first)

        self._update(phase=RunPhase.IMPLEMENTING)
        if self._cancel_requested():
            return _Result(RunStatus.CANCELLED)
        pause_point("coordinator_before_agent")
        started = time.monotonic()
        deadline = started + self._timeout_seconds()
        turns = _Turns(several=len(requests) > 1)
        turn_context = first
        ending = ""
        for number, text in enumerate(requests, start=1):
            if number > 1:
                if self._cancel_requested():
                    ending = "cancelled"
                    break
                session = turns.records[-1]["session_id"]
                if adapter.keeps_session and not session:
                    raise AgentSetupError(
                        f"The agent did not say which session request 1 ran in: request "
                        f"{number} cannot resume it."
                    )
                request_file = self.run_dir / f"request-{number}.md"
                _write_private(request_file, text)
                turn_context = replace(
                    first, turn=number, request_file=request_file, resume_session=session
                )
                with _heartbeat_in_background(self.run.pk):
                    invocation = adapter.invocation(turn_context)
            if turns.several:
                resuming = turn_context.resume_session
                self._note(
                    [f"Request {number} of {len(requests)}"
                     + (f", resuming session {resuming}." if resuming else ".")]
                )  # fmt: skip
            turn_context = replace(turn_context, log_offset=_size(self.log_path))
            ending, outcome, seconds = self._run_turn(adapter, turn_context, invocation, deadline)
            turns.add(outcome, ending=ending, seconds=seconds, session=self._session(turn_context))
            if turns.several:
                turns.diff_after(self._tree_diff(baseline))
            self._update(turns=turns.records)
            if ending in ("cancelled", "timeout") or int(ending) != 0 or outcome.failed:
                break
        wall_seconds = round(time.monotonic() - started, 3)
        try:
            adapter.cleanup(first)
        except OSError as exc:
            self._note([f"Could not remove the agent's copied files: {_describe(exc)}"])
        outcome = _bounded(turns.total())

        if ending == "cancelled":
            return _Result(
                RunStatus.CANCELLED, wall_seconds=wall_seconds, outcome=outcome, turns=turns
            )

        self._update(phase=RunPhase.COLLECTING)
        if ending == "timeout" and outcome.setup is not None:
            # It waited for the network until the deadline: the setup's, not the model's.
            result = _Result(
                RunStatus.FAILED,
                FailureCode.SETUP,
                outcome.setup.message(),
                wall_seconds=wall_seconds,
                outcome=outcome,
                turns=turns,
            )
        elif ending == "timeout":
            result = _Result(
                RunStatus.FAILED,
                FailureCode.TIMEOUT,
                f"The agent did not finish within {_duration(self._timeout_seconds())}.",
                wall_seconds=wall_seconds,
                outcome=outcome,
                turns=turns,
            )
        else:
            exit_code = int(ending)
            result = _Result(
                RunStatus.COMPLETED,
                exit_code=exit_code,
                wall_seconds=wall_seconds,
                outcome=outcome,
                turns=turns,
            )
            stopped = (
                f" at request {len(turns.records)} of {len(requests)}" if turns.several else ""
            )
            if exit_code != 0:
                result.status = RunStatus.FAILED
                result.failure_code = FailureCode.AGENT_ERROR
                words = outcome.error or error_from_log(self.log_path)
                result.failure_message = f"The agent exited with code {exit_code}{stopped}" + (
                    f":\n{words}" if words else "."
                )
            elif outcome.failed:
                result.status = RunStatus.FAILED
                result.failure_code = FailureCode.AGENT_ERROR
                result.failure_message = f"{outcome.error or 'The agent reported an error.'}" + (
                    f"\n(It stopped{stopped}.)" if stopped else ""
                )
            if result.status == RunStatus.FAILED and outcome.setup is not None:
                # Not the model's doing: not logged in, a quota, an unknown model id...
                result.failure_code = FailureCode.SETUP
                result.failure_message = outcome.setup.message() + (
                    f"\n(It stopped{stopped}.)" if stopped else ""
                )
        self._collect_diff(result, baseline)
        if result.status == RunStatus.COMPLETED:
            self._review(result)
        return result

    def _run_turn(
        self, adapter: Agent, turn: RunContext, invocation: Invocation, deadline: float
    ) -> tuple[str, AgentOutcome, float]:
        """One process: spawn it, wait (the run's one deadline), and read what it did: how
        it ended, its outcome, its seconds. A stopped agent's outcome keeps only what it
        spent (its usage, cost, model time)."""
        env = runfolder.agent_environment(invocation.env, run_id=self.run.pk)
        cwd = turn.fork.cwd if turn.fork is not None else self.workspace
        assert self.repo is not None
        started = time.monotonic()
        self.agent_finished = False
        with _heartbeat_in_background(self.run.pk):  # git runs to prepare the sandbox
            prepared = self._sandboxed(invocation, env, cwd=cwd)
        try:
            try:
                self.agent, self.agent_identity = prepared.spawn(
                    cwd=cwd, log_path=self.log_path, stdin_path=invocation.stdin_path
                )
            except (FileNotFoundError, PermissionError) as exc:
                if exc.filename not in (None, prepared.argv[0]):
                    raise  # the working folder or the log, not the program: ours
                raise AgentNotReady(
                    SetupProblem(
                        SetupKind.PROGRAM_MISSING,
                        f"{prepared.argv[0]} cannot start: {exc.strerror or exc}.",
                    )
                ) from None
            # Recorded at once: a reconcile after a lost coordinator kills this tree.
            self._update(
                agent_pid=self.agent_identity.pid,
                agent_pid_create_time=self.agent_identity.create_time,
            )
            ending = self._wait_for_agent(deadline)
            seconds = round(time.monotonic() - started, 3)
            if ending in ("cancelled", "timeout"):
                return ending, self._partial_outcome(adapter, turn), seconds
            not_started = prepared.failure(read_tail(self.log_path, max_bytes=16 * 1024))
        finally:
            prepared.close()
        if not_started:
            # bwrap never ran the program: missing in the sandbox (execvp), or the sandbox
            # itself could not be made. Not the model's doing either way.
            kind = SetupKind.PROGRAM_MISSING if "execvp" in not_started else SetupKind.SANDBOX
            words = f"The sandbox could not start the agent: {not_started}"
            outcome = AgentOutcome(failed=True, error=words, setup=SetupProblem(kind, words))
            return ending, outcome, seconds
        outcome = _bounded(adapter.outcome(turn, exit_code=int(ending)))
        self._note(outcome.notes)
        return ending, outcome, seconds

    def _sandboxed(
        self, invocation: Invocation, env: dict[str, str], *, cwd: Path
    ) -> sandbox.Prepared:
        """The agent's start in its sandbox: its run folder (worktree and homes) writable,
        its program and the system read-only, what git needs for the worktree. A baseline
        runs only our own commands (git apply of the historical diff) and is not
        sandboxed."""
        assert self.adapter is not None and self.repo is not None
        if self.is_baseline:
            return sandbox.unsandboxed(invocation.argv, env)
        try:
            return runfolder.start_sandboxed(
                invocation.argv,
                env,
                cwd=cwd,
                writable=[self.run_dir],
                home=self.run_dir / runfolder.AGENT_HOME,
                files=invocation.shown,
                git=(self.repo, self.workspace),
            )
        except sandbox.SandboxUnavailable as exc:
            # No bwrap that works here: the deployment's setup, said with its fix.
            raise AgentNotReady(SetupProblem(SetupKind.SANDBOX, str(exc))) from None

    def _session(self, turn: RunContext) -> str:
        """The session a finished turn ran in ("" when the agent keeps none or did not say)."""
        assert self.adapter is not None
        if not self.adapter.keeps_session:
            return ""
        try:
            return self.adapter.session_id(turn)
        except OSError as exc:
            self._note([f"The agent's session could not be read from its log: {_describe(exc)}"])
            return ""

    def _fork(self) -> ForkedSession | None:
        """The historical session cut before the range, for a run whose context is fork."""
        if self.configuration.get("context") != context.FORK:
            return None
        run = Run.objects.select_related("thread").get(pk=self.run.pk)
        thread = run.thread
        if context.transcript_digest(thread) != self.configuration.get("transcript_sha256"):
            raise AgentSetupError(
                f"The transcript of thread {thread.pk} changed since approval: the session "
                "cannot be forked as approved."
            )
        first = thread.turns.filter(message_uuid=self.configuration["start_message_uuid"]).first()
        if first is None:
            raise AgentSetupError("The range's first request is no longer in the thread.")
        assert self.repo is not None
        try:
            return context.fork_session(
                thread, first, workspace=self.workspace, repository=self.repo
            )
        except context.CannotFork as exc:
            raise AgentSetupError(f"The historical session cannot be forked: {exc}") from None

    def _tree_diff(self, baseline: str) -> str:
        """The worktree's diff after a turn (bounded like the run's own)."""
        assert self.repo is not None
        try:
            with _heartbeat_in_background(self.run.pk):
                diff = repos.workspace_diff(
                    self.repo, self.workspace, baseline, private_objects=self._private_objects()
                )
        except repos.GitError as exc:
            self._note([f"The diff after this request could not be taken: {_describe(exc)}"])
            return ""
        limit = settings.REPLAYS_MAX_DIFF_BYTES
        if len(diff.encode("utf-8", errors="surrogateescape")) > limit:
            diff = diff[:limit] + f"\n[replays] The diff is larger than {limit:,} bytes.\n"
        return _storable(diff)

    def _review(self, result: _Result) -> None:
        """Test the run's tree, then judge it against history (phase `reviewing`).

        The run's own results are stored first, so a coordinator lost while reviewing
        leaves them. A cancel meanwhile stops the review and cancels the run (its
        results kept); problems of the review itself end in a `review_failed` report,
        never in a failed run.
        """
        outcome = result.outcome
        self._update(
            phase=RunPhase.REVIEWING,
            diff=result.diff,
            files_changed=result.files_changed,
            exit_code=result.exit_code,
            wall_seconds=result.wall_seconds,
            model_seconds=outcome.model_seconds,
            cost_usd=_rounded(outcome.cost_usd),
            turns=result.turn_records,
            **outcome.usage.as_dict(),
        )
        try:
            with _heartbeat_in_background(self.run.pk):
                self._test_and_judge()
        except CancelledWhileReviewing:
            logger.info("Run %s: cancel requested while reviewing.", self.run.pk)
            result.status = RunStatus.CANCELLED
        except report.JudgmentGone:
            self._note(["The judgment of this run was marked lost by a reconcile."])

    def _test_and_judge(self) -> None:
        configuration = self.configuration
        run = Run.objects.select_related("thread", "batch").get(pk=self.run.pk)
        try:
            historical_diff = repos.historical_diff(
                Path(configuration["repository"]),
                configuration["baseline_commit"],
                configuration["ending_commit"],
            )
            tests = report.verify_run_tree(
                run, tree=self.workspace, historical_diff=historical_diff, tick=self._review_tick
            )
        except repos.GitError as exc:
            # The judgment meets the same problem and says so in its report.
            self._note([f"The run's tree could not be tested: {_describe(exc)}"])
            tests = None
        if tests is not None:
            self._update(tree_tests=tests.as_dict())
        # The worktree is not needed any more: the diff and the tests are stored.
        self._remove_worktree()
        self.worktree_added = False
        evaluator = str(configuration.get("evaluator") or run.batch.evaluator)
        judgment = report.start_judgment(
            run=run, evaluator=evaluator, holder=processes.own_identity()
        )
        report.judge_report(
            report_id=judgment.pk, requested_at=run.batch.approved_at, tick=self._review_tick
        )

    def _review_tick(self) -> None:
        """Heartbeat and cancel check while testing and judging (called often; beats rarely)."""
        now = time.monotonic()
        if now < self._next_review_beat:
            return
        self._next_review_beat = now + float(settings.REPLAYS_HEARTBEAT_SECONDS)
        if self._heartbeat():
            raise CancelledWhileReviewing()

    def _partial_outcome(self, adapter: Agent, turn: RunContext) -> AgentOutcome:
        """What a stopped agent used before it was stopped (its tokens were spent anyway);
        only usage, cost and model time count, the stopped run keeps its own status."""
        try:
            outcome = adapter.outcome(turn, exit_code=-1)
        except Exception as exc:  # a half-written log must not hide why the run stopped
            self._note([f"Usage of the stopped agent could not be read: {_describe(exc)}"])
            return AgentOutcome()
        return _bounded(
            AgentOutcome(
                usage=outcome.usage,
                cost_usd=outcome.cost_usd,
                model_seconds=outcome.model_seconds,
                setup=outcome.setup,
            )
        )

    def _write_run_folder(self, first_request: str) -> None:
        """The approved configuration and the first turn's request (later turns' requests
        are written as they start: request-2.md, ...)."""
        try:
            runfolder.create_run_folder(self.run.pk)
        except runfolder.UnsafeRunFolder as exc:
            raise AgentSetupError(str(exc)) from None
        configuration = {**self.configuration, "run_id": self.run.pk}
        # Both hold the request, which may quote private code or logs: owner only.
        _write_private(
            self.run_dir / CONFIGURATION_FILE,
            json.dumps(configuration, indent=2, ensure_ascii=False) + "\n",
        )
        _write_private(self.run_dir / REQUEST_FILE, first_request)

    def _wait_for_agent(self, deadline: float) -> str:
        """Poll the agent until it ends or the run's deadline passes; heartbeat and check
        for cancel when due.

        Returns the exit code as text, "timeout" or "cancelled".
        """
        assert self.agent is not None and self.agent_identity is not None
        heartbeat_every = float(settings.REPLAYS_HEARTBEAT_SECONDS)
        next_heartbeat = time.monotonic() + heartbeat_every
        paused = False
        while True:
            exit_code = processes.exit_status(self.agent)
            if exit_code is not None:
                self._finish_agent()
                return str(exit_code)
            if not paused:
                paused = True
                pause_point("coordinator_agent_running")
            now = time.monotonic()
            if now >= deadline:
                logger.info("Run %s: the agent timed out; stopping it.", self.run.pk)
                self._stop_agent()
                return "timeout"
            if now >= next_heartbeat:
                next_heartbeat = now + heartbeat_every
                if self._heartbeat():
                    logger.info("Run %s: cancel requested; stopping the agent.", self.run.pk)
                    self._stop_agent()
                    return "cancelled"
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - now)))

    def _log_tail(self) -> str:
        tail = read_tail(self.log_path)
        return self.adapter.render_log(tail) if self.adapter is not None else tail

    def _heartbeat(self) -> bool:
        """Write the heartbeat and the log tail; True when a cancel was requested.

        A database hiccup skips one heartbeat (a stale one is what reconcile
        acts on); a run that is no longer running raises RunGone.
        """
        try:
            # Never waits: the agent is watched meanwhile, and the next beat tries again.
            self._update(
                wait_out_outage=False, heartbeat_at=timezone.now(), log_tail=self._log_tail()
            )
            return self._cancel_requested()
        except DatabaseError as exc:
            logger.warning("Run %s: heartbeat skipped: %s", self.run.pk, exc)
            return False
        finally:
            # Between heartbeats the database owes us nothing: give the connection back
            # (and drop a broken one) rather than hold it for the whole run.
            close_old_connections()

    def _cancel_requested(self) -> bool:
        return Run.objects.filter(pk=self.run.pk, cancel_requested_at__isnull=False).exists()

    def _collect_diff(self, result: _Result, baseline: str) -> None:
        try:
            with _heartbeat_in_background(self.run.pk):
                diff = repos.workspace_diff(
                    self.repo, self.workspace, baseline, private_objects=self._private_objects()
                )
            result.files_changed = len(repos.changed_files(diff))
            limit = settings.REPLAYS_MAX_DIFF_BYTES
            if len(diff.encode("utf-8", errors="surrogateescape")) > limit:
                # An agent that wrote a huge tree must not fill the database: the run folder
                # keeps the whole diff, the row its beginning and a note saying so.
                _write_private(self.run_dir / FULL_DIFF_FILE, diff)
                diff = diff[:limit] + (
                    f"\n[replays] The diff is larger than {limit:,} bytes; "
                    f"the whole diff is in {self.run_dir / FULL_DIFF_FILE}.\n"
                )
            result.diff = _storable(diff)
        except Exception as exc:
            if result.status == RunStatus.COMPLETED:
                raise
            # The run already failed for its own reason; that reason is what the user needs.
            self._note([f"The workspace diff could not be collected: {_describe(exc)}"])

    def _finish(self, result: _Result) -> None:
        """The final row, in one write conditional on the run still running."""
        outcome = result.outcome
        cost = outcome.cost_usd
        values: dict[str, Any] = {
            "status": result.status,
            "phase": RunPhase.DONE,
            "finished_at": timezone.now(),
            "heartbeat_at": timezone.now(),
            "failure_code": result.failure_code if result.status == RunStatus.FAILED else "",
            "failure_message": _message(result.failure_message),
            "exit_code": result.exit_code,
            "wall_seconds": result.wall_seconds,
            "model_seconds": outcome.model_seconds,
            "cost_usd": _rounded(cost),
            "diff": result.diff,
            "files_changed": result.files_changed,
            "log_tail": self._log_tail(),
            **outcome.usage.as_dict(),
        }
        if result.turns is not None:
            values["turns"] = result.turn_records
        written = _through_an_outage(
            lambda: Run.objects.filter(pk=self.run.pk, status=RunStatus.RUNNING).update(**values)
        )
        if not written:
            logger.warning(
                "Run %s was finished elsewhere; its result was not written.", self.run.pk
            )
        else:
            runlogs.store_log(self.run.pk, self.log_path)
            logger.info(
                "Run %s ended: %s %s", self.run.pk, result.status, result.failure_code or ""
            )

    # --- helpers -------------------------------------------------------------------

    def _update(self, *, wait_out_outage: bool = True, **values: Any) -> None:
        def write() -> int:
            return Run.objects.filter(pk=self.run.pk, status=RunStatus.RUNNING).update(**values)

        if not (_through_an_outage(write) if wait_out_outage else write()):
            raise RunGone()

    def _timeout_seconds(self) -> float:
        value = self.configuration.get("timeout_seconds")
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
        return float(settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS)

    def _finish_agent(self) -> None:
        """The agent exited (still a zombie): stop what it left running in its group, reap it."""
        assert self.agent is not None and self.agent_identity is not None
        processes.kill_tree(
            self.agent_identity.pid, self.agent_identity.create_time, grace_seconds=1.0
        )
        self.agent.poll()
        self.agent_finished = True

    def _stop_agent(self) -> None:
        if self.agent is None or self.agent_finished or self.agent_identity is None:
            return
        processes.kill_tree(self.agent_identity.pid, self.agent_identity.create_time)
        self.agent.poll()
        self.agent_finished = True

    def _private_objects(self) -> Path | None:
        """The object store the sandboxed agent's git wrote to (its commits), for our own
        git to read the worktree with; None when the agent was not sandboxed."""
        return runfolder.collected_objects(self.workspace)

    def _remove_worktree(self) -> None:
        if not self.worktree_added or self.repo is None or settings.REPLAYS_KEEP_WORKSPACES:
            return
        try:
            with _heartbeat_in_background(self.run.pk):
                repos.remove_worktree(self.repo, self.workspace)
        except Exception as exc:  # noqa: BLE001 - a leftover folder must not hide the result
            logger.warning(
                "Run %s: the workspace %s was not removed: %s", self.run.pk, self.workspace, exc
            )
            self._note([f"The workspace could not be removed: {_describe(exc)}"])

    def _note(self, lines: list[str]) -> None:
        if not lines:
            return
        try:
            # Never through a link or into a FIFO the agent left in the log's place.
            with processes.open_log_for_append(self.log_path) as log:
                for line in lines:
                    log.write(f"[replays] {line}\n".encode("utf-8", errors="replace"))
        except OSError as exc:
            logger.warning("Run %s: cannot write to %s: %s", self.run.pk, self.log_path, exc)


# --- process helpers ---------------------------------------------------------------


@contextmanager
def _heartbeat_in_background(run_id: int) -> Iterator[None]:
    """Keep the heartbeat going while the main thread waits on slow git work.

    Creating a worktree or diffing a large repository can take longer than the stale
    limit; without this a reconcile would take the coordinator for lost. The agent
    wait loop beats in the main thread and needs no helper.
    """
    stop = threading.Event()

    def beat() -> None:
        try:
            while not stop.wait(float(settings.REPLAYS_HEARTBEAT_SECONDS)):
                try:
                    Run.objects.filter(pk=run_id, status=RunStatus.RUNNING).update(
                        heartbeat_at=timezone.now()
                    )
                except DatabaseError as exc:
                    logger.warning("Run %s: heartbeat skipped: %s", run_id, exc)
                finally:
                    close_old_connections()
        finally:
            # Connections are per thread: this one's dies with it.
            connections.close_all()

    thread = threading.Thread(target=beat, name=f"heartbeat-run-{run_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _through_an_outage(write: Callable[[], int]) -> int:
    """Run a conditional write, waiting out a database that cannot be reached: an agent
    that ended while the database was down keeps its result. Tried again (on a fresh
    connection) until the stale limit has passed; by then a reconcile counts the run as
    lost anyway (the design), and the coordinator gives up with the error."""
    give_up = time.monotonic() + float(settings.REPLAYS_HEARTBEAT_STALE_SECONDS)
    pause = OUTAGE_RETRY_SECONDS
    while True:
        try:
            return write()
        except (OperationalError, InterfaceError) as exc:
            close_old_connections()
            if time.monotonic() >= give_up:
                raise
            logger.warning("The database cannot be reached (%s); trying again.", exc)
            time.sleep(max(0.0, min(pause, give_up - time.monotonic())))
            pause = min(pause * 2, 5.0)


def _stop_on_signals() -> dict[int, Any]:
    """SIGTERM/SIGINT become an exception, so the agent is stopped and the run failed cleanly."""

    stopping = False

    def stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        if stopping:
            return  # already stopping the agent and writing the result: let that finish
        stopping = True
        raise CoordinatorStopped(
            f"The coordinator was stopped ({signal.Signals(signum).name}) while the run was active."
        )

    previous = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        previous[signum] = signal.signal(signum, stop)
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def _write_private(path: Path, text: str) -> None:
    write_private(path, text.encode("utf-8", errors="surrogateescape"))


def _request_dispatch() -> None:
    """A run ended (capacity freed): ask for the next dispatch. Never fails the coordinator."""
    try:
        from replays import dispatch

        dispatch.request_dispatch_if_waiting()
    except Exception as exc:  # noqa: BLE001 - the schedule dispatches later anyway
        logger.warning("Could not request a dispatch: %s", _describe(exc))


# --- text helpers --------------------------------------------------------------------


def _bounded(outcome: AgentOutcome) -> AgentOutcome:
    """The outcome, unless its figures are beyond any run's (the adapters say so for what
    they read; this holds for every agent and for the sum of a range's turns): then a
    failure of the agent saying which figure, its usage unknown, so the run fails as the
    agent's error with its diff kept instead of breaking the money and token columns."""
    absurd = absurd_usage(outcome)
    if not absurd:
        return outcome
    message = f"The agent {absurd}: its figures were not kept."
    return AgentOutcome(
        final_message=outcome.final_message,
        failed=True,
        error=message,
        setup=outcome.setup,
        notes=[*outcome.notes, message],
    )


def _describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _message(text: str) -> str:
    text = plain_text(text).strip()
    if len(text) > MAX_MESSAGE_CHARS:
        text = "…" + text[-MAX_MESSAGE_CHARS:]
    return text


def _storable(diff: str) -> str:
    """The diff as the database can hold it (repos keeps diffs valid UTF-8; this is a backstop)."""
    try:
        diff.encode("utf-8")
        return diff
    except UnicodeEncodeError:
        return diff.encode("utf-8", errors="surrogateescape").decode("utf-8", errors="replace")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _rounded(cost: Decimal | None) -> Decimal | None:
    return pricing.round_usd(cost) if isinstance(cost, Decimal) else None


def _duration(seconds: float) -> str:
    """20m 0s, 1h 5m 0s, 45s."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
