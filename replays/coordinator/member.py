"""The steps of one started run, in order: prepare (the agent, the run folder, the
worktree, the historical diff, a fork), the turns (one agent process per request of the
range, supervised), collect (the diff), review (the tests on the run's tree, then the
judgment), finish (one conditional write). Every write is conditional on the run still
running (rows.RunRow)."""

from __future__ import annotations

import json
import logging
import time
import traceback
from dataclasses import dataclass, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from replays import access, agents, context, processes, repos, runfolder, runlogs, sandbox
from replays.agents.base import (
    Agent,
    AgentNotReady,
    AgentOutcome,
    AgentSetupError,
    ForkedSession,
    Invocation,
    RunContext,
    error_from_log,
    plain_text,
    read_tail,
    readable_tail,
    write_private,
)
from replays.agents.problems import SetupKind, SetupProblem
from replays.coordinator.rows import RunGone, RunRow, heartbeat_in_background
from replays.coordinator.supervisor import (
    CANCELLED,
    OVER_CAP,
    AgentProcess,
    Ending,
    Exited,
    Stop,
)
from replays.coordinator.turns import Result, Turns, bounded, conclude, rounded
from replays.evaluation import campaign_results, report, treetests
from replays.models import FailureCode, Run, RunPhase, RunStatus
from replays.processes import pause_point
from replays.runfolder import AGENT_LOG, CONFIGURATION_FILE, FULL_DIFF_FILE, REQUEST_FILE

logger = logging.getLogger(__name__)

# A failure message quotes this much of the agent's words at most.
MAX_MESSAGE_CHARS = 4000


class CoordinatorStopped(processes.StopRequested):
    """This process was asked to stop (SIGTERM/SIGINT)."""


class CancelledWhileReviewing(processes.StopRequested):
    """A cancel arrived while the run's result was being tested or judged."""

    def __str__(self) -> str:
        return "the run was cancelled"


@dataclass
class Prepared:
    """What the steps before the first turn made."""

    adapter: Agent
    is_baseline: bool
    requests: list[str]
    first: RunContext  # the first turn's context
    invocation: Invocation  # the first turn's


class Member:
    """One started run, from its run folder to its final write."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.spec = run.spec
        self.row = RunRow(run.pk)
        self.run_dir = Path(run.run_dir)
        self.workspace = Path(run.workspace_path)
        self.log_path = self.run_dir / AGENT_LOG
        self.repo = Path(self.spec.repository)
        self.worktree_added = False
        self.agent = AgentProcess(run_id=run.pk, log_path=self.log_path)
        self.adapter: Agent | None = None
        self.historical_diff = ""
        self._next_review_beat = 0.0
        # The turn the agent is running and what earlier turns spent (its cost cap's check).
        self._running: tuple[RunContext, Decimal] | None = None

    def execute(self) -> str:
        """Every step, then the final write; what happened, for the command's output."""
        try:
            result = self._steps()
        except RunGone:
            logger.warning("Run %s is no longer running here; stopping.", self.run.pk)
            self.agent.stop()
            self._remove_worktree()
            return "stopped: the run was finished elsewhere"
        except CoordinatorStopped as exc:
            result = Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, str(exc))
        except AgentNotReady as exc:
            result = Result(RunStatus.FAILED, FailureCode.SETUP, exc.problem.message())
        except AgentSetupError as exc:
            result = Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, str(exc))
        except Exception as exc:  # noqa: BLE001 - every failure on our side is written on the run
            logger.error("Run %s failed:\n%s", self.run.pk, traceback.format_exc())
            result = Result(RunStatus.FAILED, FailureCode.INFRASTRUCTURE, describe(exc))
        finally:
            # Whatever happened, no agent process outlives its coordinator's decision.
            self.agent.stop()
        self._remove_worktree()
        self._finish(result)
        return result.status if not result.failure_code else f"failed: {result.failure_code}"

    def _steps(self) -> Result:
        prepared = self._prepare()
        self.row.update(phase=RunPhase.IMPLEMENTING)
        if self.row.cancel_requested():
            return Result(RunStatus.CANCELLED)
        pause_point("coordinator_before_agent")
        started = time.monotonic()
        turns = self._run_turns(prepared, deadline=started + self.spec.timeout())
        wall_seconds = round(time.monotonic() - started, 3)
        try:
            prepared.adapter.cleanup(prepared.first)
        except OSError as exc:
            self._note([f"Could not remove the agent's copied files: {describe(exc)}"])
        result = conclude(
            turns,
            wall_seconds=wall_seconds,
            timeout=duration(self.spec.timeout()),
            error_words=error_from_log(self.log_path),
            cost_cap=self.run.cost_cap_usd,
        )
        if result.status == RunStatus.CANCELLED:
            return result
        self.row.update(phase=RunPhase.COLLECTING)
        self._collect_diff(result)
        if result.status == RunStatus.COMPLETED:
            self._review(result)
        return result

    # --- before the first turn ---------------------------------------------------------

    def _prepare(self) -> Prepared:
        """The agent, the run folder, the worktree at the baseline, the historical diff
        (once, checked against the approved hash) and, for a fork, the cut session."""
        info = self._model_info()
        adapter = agents.adapter_for(info.id)
        self.adapter = adapter
        # A baseline is one process whatever the range; an agent gets one turn per request.
        requests = self.spec.turn_requests(one_turn=info.is_baseline)
        self._write_run_folder(context.with_preamble(self.spec.preamble, requests[0]))
        if not access.under_roots(self.repo):
            # Checked at prepare and approval too; the roots may have changed since.
            raise AgentSetupError(f"The repository {self.repo} {access.OUTSIDE_ROOTS}.")
        first = RunContext(
            run_id=self.run.pk,
            model=info.model,
            spec=self.spec,
            run_dir=self.run_dir,
            workspace=self.workspace,
            request_file=self.run_dir / REQUEST_FILE,
            log_path=self.log_path,
            turns=len(requests),
            cost_cap_usd=self.run.cost_cap_usd,
        )
        with heartbeat_in_background(self.run.pk):
            # Set first: a worktree add that fails halfway still leaves something to remove.
            self.worktree_added = True
            repos.add_worktree(self.repo, self.workspace, self.spec.baseline_commit)
            self.historical_diff = self._approved_historical_diff()
            first = replace(first, historical_diff=self.historical_diff)
            if not info.is_baseline:
                first = replace(first, fork=self._fork())
            invocation = adapter.invocation(first)
        return Prepared(adapter, info.is_baseline, requests, first, invocation)

    def _model_info(self) -> agents.ModelInfo:
        try:
            info = agents.resolve_model(self.spec.model or self.run.model)
        except agents.UnknownModel as exc:
            raise AgentNotReady(SetupProblem(SetupKind.UNKNOWN_MODEL, str(exc))) from None
        if not info.available:
            raise AgentNotReady(
                SetupProblem(
                    SetupKind.PROGRAM_MISSING,
                    f"The agent for {info.id} cannot run on this machine: {info.reason}",
                )
            )
        return info

    def _approved_historical_diff(self) -> str:
        try:
            return repos.approved_historical_diff(
                self.repo,
                self.spec.baseline_commit,
                self.spec.ending_commit,
                self.spec.historical_result_sha256,
            )
        except repos.HistoricalResultChanged as exc:
            raise AgentSetupError(str(exc)) from None

    def _write_run_folder(self, first_request: str) -> None:
        """The approved configuration and the first turn's request (later turns' requests
        are written as they start: request-2.md, ...)."""
        try:
            runfolder.create_run_folder(self.run.pk)
        except runfolder.UnsafeRunFolder as exc:
            raise AgentSetupError(str(exc)) from None
        # The configuration as approval stored it (the spec is read from it).
        configuration = {**self.run.configuration, "run_id": self.run.pk}
        # Both hold the request, which may quote private code or logs: owner only.
        write_text(
            self.run_dir / CONFIGURATION_FILE,
            json.dumps(configuration, indent=2, ensure_ascii=False) + "\n",
        )
        write_text(self.run_dir / REQUEST_FILE, first_request)

    def _fork(self) -> ForkedSession | None:
        """The historical session cut before the range, for a run whose context is fork."""
        if self.spec.context != context.FORK:
            return None
        thread = self.run.thread
        if context.transcript_digest(thread) != self.spec.transcript_sha256:
            raise AgentSetupError(
                f"The transcript of thread {thread.pk} changed since approval: the session "
                "cannot be forked as approved."
            )
        first = thread.turns.filter(message_uuid=self.spec.start_message_uuid).first()
        if first is None:
            raise AgentSetupError("The range's first request is no longer in the thread.")
        try:
            return context.fork_session(
                thread, first, workspace=self.workspace, repository=self.repo
            )
        except context.CannotFork as exc:
            raise AgentSetupError(f"The historical session cannot be forked: {exc}") from None

    # --- the turns ---------------------------------------------------------------------

    def _run_turns(self, prepared: Prepared, *, deadline: float) -> Turns:
        """One agent process per request, in order, within the run's one deadline: the
        first starts the candidate's session, each next one resumes it. Stops at the
        first turn that is stopped, fails or errs, or at a cancel between turns."""
        turns = Turns(count=len(prepared.requests))
        turn, invocation = prepared.first, prepared.invocation
        for number, text in enumerate(prepared.requests, start=1):
            if number > 1:
                if self.row.cancel_requested():
                    turns.last_ending = CANCELLED
                    break
                turn, invocation = self._next_turn(prepared, turns, number, text)
            if turns.several:
                resuming = turn.resume_session
                self._note(
                    [f"Request {number} of {turns.count}"
                     + (f", resuming session {resuming}." if resuming else ".")]
                )  # fmt: skip
            turn = replace(turn, log_offset=file_size(self.log_path))
            spent = turns.spent()
            self._running = (turn, spent) if spent is not None else None
            ending, outcome, seconds = self._run_turn(prepared, turn, invocation, deadline)
            self._running = None
            turns.add(outcome, ending=ending, seconds=seconds, session=self._session(turn))
            if turns.several:
                turns.diff_after(*self._tree_diff())
            self.row.update(turns=turns.records)
            if turns.stops_here():
                break
        return turns

    def _next_turn(
        self, prepared: Prepared, turns: Turns, number: int, text: str
    ) -> tuple[RunContext, Invocation]:
        """The context and invocation of request `number`, resuming turn 1's session."""
        session = turns.last_session
        if prepared.adapter.keeps_session and not session:
            raise AgentSetupError(
                f"The agent did not say which session request 1 ran in: request "
                f"{number} cannot resume it."
            )
        request_file = self.run_dir / f"request-{number}.md"
        write_text(request_file, text)
        cap, spent = prepared.first.cost_cap_usd, turns.spent()
        turn = replace(
            prepared.first,
            turn=number,
            request_file=request_file,
            resume_session=session,
            # What is left of the run's cap after the earlier turns.
            cost_cap_usd=None if cap is None or spent is None else max(Decimal(0), cap - spent),
        )
        with heartbeat_in_background(self.run.pk):
            return turn, prepared.adapter.invocation(turn)

    def _run_turn(
        self, prepared: Prepared, turn: RunContext, invocation: Invocation, deadline: float
    ) -> tuple[Ending, AgentOutcome, float]:
        """One process (after the steps it needs first, Invocation.before): start it in its
        sandbox, wait (the run's one deadline), and read what it did: how it ended, its
        outcome, its seconds. A stopped agent's outcome keeps only what it spent (its
        usage, cost, model time)."""
        env = runfolder.agent_environment(invocation.env, run_id=self.run.pk)
        cwd = turn.fork.cwd if turn.fork is not None else self.workspace
        started = time.monotonic()
        for step in invocation.before:
            first = replace(invocation, argv=step, stdin_path=None)
            ending, not_started = self._run_process(prepared, first, env, cwd, deadline)
            seconds = round(time.monotonic() - started, 3)
            if not isinstance(ending, Exited):
                return ending, AgentOutcome(), seconds
            if not_started:
                return ending, _sandbox_refused(not_started), seconds
            if ending.code != 0:
                return ending, _step_failed(prepared.adapter, step, ending, self.log_path), seconds
        ending, not_started = self._run_process(prepared, invocation, env, cwd, deadline)
        seconds = round(time.monotonic() - started, 3)
        if not isinstance(ending, Exited):
            return ending, self._partial_outcome(prepared.adapter, turn), seconds
        if not_started:
            return ending, _sandbox_refused(not_started), seconds
        outcome = bounded(prepared.adapter.outcome(turn, exit_code=ending.code))
        self._note(outcome.notes)
        return ending, outcome, seconds

    def _run_process(
        self,
        prepared: Prepared,
        invocation: Invocation,
        env: dict[str, str],
        cwd: Path,
        deadline: float,
    ) -> tuple[Ending, str]:
        """Start one of the agent's processes in its sandbox and wait for it: how it ended,
        and why the sandbox could not start it ("" when it ran)."""
        with heartbeat_in_background(self.run.pk):  # git runs to prepare the sandbox
            sandboxed = self._sandboxed(prepared, invocation, env, cwd=cwd)
        try:
            self.agent.start(sandboxed, cwd=cwd, stdin_path=invocation.stdin_path)
            assert self.agent.identity is not None
            # Recorded at once: a reconcile after a lost coordinator kills this tree.
            self.row.update(
                agent_pid=self.agent.identity.pid,
                agent_pid_create_time=self.agent.identity.create_time,
            )
            ending = self.agent.wait(deadline, self._beat)
            if not isinstance(ending, Exited):
                return ending, ""
            return ending, sandboxed.failure(read_tail(self.log_path, max_bytes=16 * 1024))
        finally:
            sandboxed.close()

    def _sandboxed(
        self, prepared: Prepared, invocation: Invocation, env: dict[str, str], *, cwd: Path
    ) -> sandbox.Prepared:
        """The agent's start in its sandbox: its run folder (worktree and homes) writable,
        its program and the system read-only, what git needs for the worktree. A baseline
        runs only our own commands (git apply of the historical diff) and is not
        sandboxed."""
        if prepared.is_baseline:
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

    def _beat(self) -> Stop | None:
        """The heartbeat while an agent runs: whether to stop it (a cancel asked for, or
        the cost it reported so far past the run's cap)."""
        if self.row.heartbeat(self._log_tail()):
            return CANCELLED
        return OVER_CAP if self._over_cap() else None

    def _over_cap(self) -> bool:
        """The running agent's cost so far (earlier turns' and this one's, as its log tells
        it) is past the run's cap. Unknown costs never stop it."""
        cap = self.run.cost_cap_usd
        if cap is None or self._running is None or self.adapter is None:
            return False
        turn, before = self._running
        try:
            now = self.adapter.outcome(turn, exit_code=-1).cost_usd
        except Exception as exc:  # a half-written log: try again at the next beat
            logger.info("Run %s: cost so far not read: %s", self.run.pk, exc)
            return False
        return now is not None and before + now > cap

    def _session(self, turn: RunContext) -> str:
        """The session a finished turn ran in ("" when the agent keeps none or did not say)."""
        assert self.adapter is not None
        if not self.adapter.keeps_session:
            return ""
        try:
            return self.adapter.session_id(turn)
        except OSError as exc:
            self._note([f"The agent's session could not be read from its log: {describe(exc)}"])
            return ""

    def _partial_outcome(self, adapter: Agent, turn: RunContext) -> AgentOutcome:
        """What a stopped agent used before it was stopped (its tokens were spent anyway);
        only usage, cost and model time count, the stopped run keeps its own status."""
        try:
            outcome = adapter.outcome(turn, exit_code=-1)
        except Exception as exc:  # a half-written log must not hide why the run stopped
            self._note([f"Usage of the stopped agent could not be read: {describe(exc)}"])
            return AgentOutcome()
        return bounded(
            AgentOutcome(
                usage=outcome.usage,
                cost_usd=outcome.cost_usd,
                model_seconds=outcome.model_seconds,
                setup=outcome.setup,
            )
        )

    # --- after the turns ---------------------------------------------------------------

    def _workspace_diff(self) -> tuple[repos.BoundedDiff, int]:
        """The worktree against the baseline, bounded as a row keeps it (the whole diff goes
        to the run folder when it had to be cut), and how many files it changes (counted
        on the whole diff)."""
        with heartbeat_in_background(self.run.pk):
            diff = repos.workspace_diff(
                self.repo,
                self.workspace,
                self.spec.baseline_commit,
                private_objects=runfolder.collected_objects(self.workspace),
            )
        bounded_diff = repos.bound_diff(diff, settings.REPLAYS_MAX_DIFF_BYTES)
        if bounded_diff.cut:
            # An agent that wrote a huge tree must not fill the database: the run folder
            # keeps the whole diff, the row its beginning and the fact that it was cut.
            write_text(self.run_dir / FULL_DIFF_FILE, diff)
        return bounded_diff, len(repos.changed_files(diff))

    def _tree_diff(self) -> tuple[repos.BoundedDiff, int]:
        """The worktree's diff after one turn of several."""
        try:
            return self._workspace_diff()
        except repos.GitError as exc:
            self._note([f"The diff after this request could not be taken: {describe(exc)}"])
            return repos.BoundedDiff(""), 0

    def _collect_diff(self, result: Result) -> None:
        try:
            diff, files_changed = self._workspace_diff()
        except Exception as exc:
            if result.status == RunStatus.COMPLETED:
                raise
            # The run already failed for its own reason; that reason is what the user needs.
            self._note([f"The workspace diff could not be collected: {describe(exc)}"])
            return
        result.diff, result.diff_cut, result.files_changed = diff.text, diff.cut, files_changed

    def _review(self, result: Result) -> None:
        """Test the run's tree, then judge it against history (phase `reviewing`).

        The run's own results are stored first, so a coordinator lost while reviewing
        leaves them. A cancel meanwhile stops the review and cancels the run (its
        results kept); problems of the review itself end in a `review_failed` report,
        never in a failed run.
        """
        self.row.update(phase=RunPhase.REVIEWING, **_result_values(result))
        try:
            with heartbeat_in_background(self.run.pk):
                self._test_and_judge()
        except CancelledWhileReviewing:
            logger.info("Run %s: cancel requested while reviewing.", self.run.pk)
            result.status = RunStatus.CANCELLED
        except report.JudgmentGone:
            self._note(["The judgment of this run was marked lost by a reconcile."])

    def _test_and_judge(self) -> None:
        """The verify command on the run's own worktree (then removed), and the judgment,
        both handed the historical diff this run already read."""
        self.run.refresh_from_db()
        tests = treetests.verify_run_tree(
            self.run, tree=self.workspace, historical_diff=self.historical_diff,
            tick=self._review_tick,
        )  # fmt: skip
        if tests is not None:
            self.row.update(tree_tests=tests.as_dict())
            self.run.tree_tests = tests.as_dict()
        # The worktree is not needed any more: the diff and the tests are stored.
        self._remove_worktree()
        self.worktree_added = False
        judgment = report.start_judgment(
            run=self.run,
            evaluator=self.spec.evaluator or self.run.batch.evaluator,
            holder=processes.own_identity(),
        )
        report.judge_report(
            report_id=judgment.pk,
            requested_at=self.run.batch.approved_at,
            tick=self._review_tick,
            historical_diff=self.historical_diff,
        )

    def _review_tick(self) -> None:
        """Heartbeat and cancel check while testing and judging (called often; beats rarely)."""
        now = time.monotonic()
        if now < self._next_review_beat:
            return
        self._next_review_beat = now + float(settings.REPLAYS_HEARTBEAT_SECONDS)
        if self._beat() is CANCELLED:
            raise CancelledWhileReviewing()

    def _finish(self, result: Result) -> None:
        """The final row, in one write conditional on the run still running; then the
        whole log, stored apart."""
        values: dict[str, Any] = {
            "status": result.status,
            "phase": RunPhase.DONE,
            "finished_at": timezone.now(),
            "heartbeat_at": timezone.now(),
            "failure_code": result.failure_code if result.status == RunStatus.FAILED else "",
            "failure_message": _message(result.failure_message),
            "log_tail": self._log_tail(),
            **_result_values(result),
        }
        if not self.row.finish(values):
            logger.warning(
                "Run %s was finished elsewhere; its result was not written.", self.run.pk
            )
            return
        runlogs.store_log(self.run.pk, self.log_path)
        logger.info("Run %s ended: %s %s", self.run.pk, result.status, result.failure_code or "")
        if self.run.batch.campaign_id is not None:
            # Its campaign's results and progress are kept, not computed per view.
            campaign_results.refresh_for_run(self.run.pk)

    # --- helpers -----------------------------------------------------------------------

    def _log_tail(self) -> str:
        tail = read_tail(self.log_path)
        return self.adapter.render_log(tail) if self.adapter is not None else tail

    def _remove_worktree(self) -> None:
        if not self.worktree_added or settings.REPLAYS_KEEP_WORKSPACES:
            return
        try:
            with heartbeat_in_background(self.run.pk):
                repos.remove_worktree(self.repo, self.workspace)
        except Exception as exc:  # noqa: BLE001 - a leftover folder must not hide the result
            logger.warning(
                "Run %s: the workspace %s was not removed: %s", self.run.pk, self.workspace, exc
            )
            self._note([f"The workspace could not be removed: {describe(exc)}"])

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


def _result_values(result: Result) -> dict[str, Any]:
    """The run's own results, as written when reviewing starts and again at the end."""
    outcome = result.outcome
    values: dict[str, Any] = {
        "diff": result.diff,
        "diff_cut": result.diff_cut,
        "files_changed": result.files_changed,
        "exit_code": result.exit_code,
        "wall_seconds": result.wall_seconds,
        "model_seconds": outcome.model_seconds,
        "cost_usd": rounded(outcome.cost_usd),
        **outcome.usage.as_dict(),
    }
    if result.turns is not None:
        values["turns"] = result.turn_records
    return values


def _step_failed(adapter: Agent, step: list[str], ending: Exited, log_path: Path) -> AgentOutcome:
    """A step the agent needed before its turn (OpenCode importing the forked session)
    failed: the run fails saying which and what it wrote."""
    words = (
        f"The agent could not prepare its session ({Path(step[0]).name} "
        f"{' '.join(step[1:2])} exited with code {ending.code}):\n"
        + readable_tail(adapter.render_log(read_tail(log_path)))
    )
    return AgentOutcome(failed=True, error=words)


def _sandbox_refused(not_started: str) -> AgentOutcome:
    """bwrap never ran the program: missing in the sandbox (execvp), or the sandbox itself
    could not be made. Not the model's doing either way."""
    kind = SetupKind.PROGRAM_MISSING if "execvp" in not_started else SetupKind.SANDBOX
    words = f"The sandbox could not start the agent: {not_started}"
    return AgentOutcome(failed=True, error=words, setup=SetupProblem(kind, words))


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return text if text else type(exc).__name__


def _message(text: str) -> str:
    text = plain_text(text).strip()
    if len(text) > MAX_MESSAGE_CHARS:
        text = "…" + text[-MAX_MESSAGE_CHARS:]
    return text


def write_text(path: Path, text: str) -> None:
    write_private(path, text.encode("utf-8", errors="surrogateescape"))


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def duration(seconds: float) -> str:
    """20m 0s, 1h 5m 0s, 45s."""
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {secs}s"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s"
