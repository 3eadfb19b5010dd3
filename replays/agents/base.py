"""What every agent adapter looks like.

An adapter turns one run (request file, model, workspace, run folder, approved
configuration) into an invocation (argv, extra environment, stdin), and after
the process ended parses what it wrote into an outcome (final message, usage,
cost, model time, error). The coordinator does the rest the same way for every
agent: spawn, heartbeat, timeout, cancel, diff.

In judge mode an adapter does the same for one evaluator call (a JudgeTask: a prompt
and the schema of its answer) and reads back one JSON object (a JudgeAnswer); the
helpers at the end let each kind do so with its run code.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, ClassVar, Protocol

from replays.agents.problems import UNKNOWN, Login, SetupKind, SetupProblem

# Text helpers live with the processes whose output they clean (plain Python, no Django).
from replays.processes import (
    UnsafeFile,
    open_untrusted,
    plain_text,
    read_tail,
    read_untrusted,
    without_secrets,
)
from replays.runspec import RunSpec
from replays.sandbox import sandbox_failure
from replays.transcripts.base import MAX_THREAD_COST_USD, MAX_THREAD_TOKENS, TokenUsage

# `agent --version` answers at once; a hung binary must not hold up a page.
VERSION_TIMEOUT_SECONDS = 10
# How much of an agent's log an error message quotes.
ERROR_LINES = 20
ERROR_CHARS = 4000
# An evaluator's answer is a small JSON object: anything larger is refused unread.
MAX_ANSWER_BYTES = 1024 * 1024
# How much of one turn's log its outcome is read from, and the longest line read (an
# event stream's line is a few KiB; a tool's output quoted whole can reach MiBs).
MAX_LOG_READ_BYTES = 1024 * 1024 * 1024
MAX_LOG_LINE_BYTES = 32 * 1024 * 1024
# How much of an unreadable answer its error message quotes.
ANSWER_QUOTE_CHARS = 200


class AgentSetupError(Exception):
    """The run cannot start the agent (our side: inputs changed, files missing)."""


class AgentNotReady(AgentSetupError):
    """The agent cannot start for a setup reason of the user's (its program missing, a
    model no agent offers): the run fails as `setup`, not as ours."""

    def __init__(self, problem: SetupProblem) -> None:
        super().__init__(problem.message())
        self.problem = problem


@dataclass(frozen=True)
class ForkedSession:
    """The historical session cut just before the range (replays.context makes it), for
    the run's own CLI to fork: the copy goes into the run's own home under the name the
    CLI looks for, and the agent runs in `cwd`, the thread's folder in the worktree."""

    tool: str  # the thread's tool: "claude_code", "codex", "gemini", "opencode" or "pi"
    session_id: str  # the id the CLI resumes (the historical session's own)
    text: str  # the cut transcript, the thread's folder rewritten to the worktree
    # "<session>.jsonl" (Claude Code), "rollout-...-<session>.jsonl" (Codex),
    # "session-...-<id8>.json[l]" (Gemini CLI), "<session>.json" (OpenCode's export
    # document), "<time>_<session>.jsonl" (pi)
    file_name: str
    cwd: Path
    day_folder: str = ""  # Codex: the copy goes in sessions/YYYY/MM/DD
    # Codex: the thread's token totals at the cut (input including cached), as Codex wrote
    # them; a forked thread's turn.completed counts on from them.
    base_usage: Mapping[str, int] = field(default_factory=dict)

    def copy_to(self, target: Path, *, tool: str) -> None:
        """Write the cut transcript where `tool`'s CLI looks for it (a private file);
        AgentSetupError when this session is another tool's or the copy fails."""
        if self.tool != tool:
            name = {"claude_code": "Claude Code", "codex": "Codex", "gemini": "Gemini CLI",
                    "opencode": "OpenCode", "pi": "pi"}.get(tool, tool)  # fmt: skip
            raise AgentSetupError(f"{name} cannot fork a {self.tool} session.")
        try:
            write_private(target, self.text.encode("utf-8", errors="surrogateescape"))
        except OSError as exc:
            raise AgentSetupError(
                f"The historical session cannot be copied for the fork: {exc.strerror or exc}"
            ) from None


@dataclass(frozen=True)
class RunContext:
    """What an adapter knows about the run (and the turn of it) it is asked to start.

    A range of several requests runs turn by turn: turn 1 starts the candidate's session
    (or forks the historical one), each later turn resumes the session turn 1 made.
    """

    run_id: int
    model: str  # the model as the agent names it ("gpt-5"); "" for the baselines
    spec: RunSpec  # the run's exact approved configuration
    run_dir: Path
    workspace: Path
    request_file: Path  # this turn's request
    log_path: Path
    turn: int = 1  # 1-based
    turns: int = 1
    # Turn 2 on: the candidate's own session, as session_id() read it after turn 1.
    resume_session: str = ""
    # The historical session to fork at turn 1 (None: the run starts a new session).
    fork: ForkedSession | None = None
    # Where this turn's output starts in the log (earlier turns wrote what comes before).
    log_offset: int = 0
    # The historical diff, read once by the coordinator and checked against the approved
    # sha256 (the historical baseline applies it).
    historical_diff: str = ""
    # The most this turn may spend (a campaign's budget left, less earlier turns' costs);
    # None: no cap. An agent that can cap itself is given it (claude's --max-budget-usd);
    # for every agent the coordinator stops it when its reported cost passes the cap.
    cost_cap_usd: Decimal | None = None


@dataclass(frozen=True)
class Invocation:
    """How to start the agent: argv (never a shell), environment additions, stdin."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    stdin_path: Path | None = None
    # Files the configured command names besides its program (a `command` agent's script):
    # the sandbox shows them read-only. Never from anything but the operator's settings.
    shown: tuple[Path, ...] = ()
    # Commands of the agent's own program to run first, one after the other, in the same
    # sandbox, environment and folder, without stdin (OpenCode imports the forked session
    # into its database before it resumes it); the turn fails when one of them fails.
    before: tuple[list[str], ...] = ()


@dataclass
class AgentOutcome:
    final_message: str = ""
    usage: TokenUsage = field(default_factory=TokenUsage)
    # None means "unknown price", never $0.
    cost_usd: Decimal | None = None
    model_seconds: float | None = None
    # Why the agent failed, in its own words ("" when it did not say).
    error: str = ""
    # The agent reported failure itself (Claude's is_error, Codex's turn.failed), even if
    # its process exited 0.
    failed: bool = False
    # Lines for the run's log about what we ignored (a malformed usage file, ...).
    notes: list[str] = field(default_factory=list)
    # Why it failed, when that is a setup problem (not logged in, a quota, ...) rather
    # than the model's doing: such a run is not counted against the model.
    setup: SetupProblem | None = None
    # The agent stopped itself at the cost cap it was given (claude's --max-budget-usd).
    stopped_at_cap: bool = False


@dataclass(frozen=True)
class JudgeTask:
    """One call of an agent in judge mode: a prompt in, one structured answer out.

    The evaluation layer builds it (replays.evaluation); the adapter turns it into an
    invocation and reads the answer back. `folder` is a private, empty folder for this
    call alone: the evaluator runs there (cwd), with no repository, and every file the
    adapter writes (prompt, schema, answer, its own home) goes there too.
    """

    name: str  # "checks", "verdict-1", "verdict-2": unique within the folder's parent
    prompt: str  # the whole prompt text
    # JSON schema of the answer, strict-compatible (every object has
    # additionalProperties: false and lists every property in required).
    schema: Mapping[str, Any]
    # The same task as data, for command judges that read it themselves.
    inputs: Mapping[str, Any]
    folder: Path
    log_path: Path  # where the process's stdout and stderr go
    prompt_file: Path  # the prompt, written (mode 0600) before judge_invocation is called


@dataclass
class JudgeAnswer:
    """What one judge call gave back. A reply that cannot be read is not an exception:
    `answer` is None and `error` says why, so the caller records it as a failed review."""

    answer: dict[str, Any] | None = None
    error: str = ""
    raw: str = ""  # the reply as the evaluator wrote it (kept for audit)
    usage: TokenUsage = field(default_factory=TokenUsage)
    cost_usd: Decimal | None = None  # None means unknown, never $0
    model_seconds: float | None = None
    notes: list[str] = field(default_factory=list)


class Agent(ABC):
    """One model of one agent, ready to run."""

    kind: ClassVar[str]
    # Agents that can also act as an evaluator (judge mode) say so and implement
    # judge_invocation and judge_answer.
    can_judge: ClassVar[bool] = False
    # Agents whose turns go on in one session (session_id() says which, the next turn's
    # invocation resumes it); the others run each turn as a process of its own.
    keeps_session: ClassVar[bool] = False

    @abstractmethod
    def invocation(self, context: RunContext) -> Invocation:
        """argv, env and stdin for this run; raises AgentSetupError when it cannot start."""

    @abstractmethod
    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        """Parse what the finished process left behind (this turn's part of the log, files
        in the run folder): this turn's own usage, cost and model time."""

    def session_id(self, context: RunContext) -> str:
        """The session this turn ran in, which the next turn resumes ("" when the agent
        keeps none: each turn is then a process of its own)."""
        return ""

    def cleanup(self, context: RunContext) -> None:  # noqa: B027 (most agents copy nothing)
        """Remove what must not outlive the agent's process (copied credentials)."""

    def render_log(self, text: str) -> str:
        """The agent's output made readable for the run's log tail (JSON event streams
        become lines a person reads). `text` may start in the middle of a line."""
        return text

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        """argv, env and stdin that ask this model for one structured answer to `task`
        (read-only, in task.folder); raises AgentSetupError when it cannot start."""
        raise AgentSetupError(f"The {self.kind} agent cannot act as an evaluator.")

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        """Read the structured answer the finished judge process left (log, files in
        task.folder): the object, or None with the reason; usage, cost, model time."""
        return JudgeAnswer(error=f"The {self.kind} agent cannot act as an evaluator.")

    def judge_cleanup(self, task: JudgeTask) -> None:  # noqa: B027 (most copy nothing)
        """Remove what must not outlive the judge process (copied credentials)."""


def log_lines(context: RunContext) -> Iterator[str]:
    """This turn's lines of the log (from context.log_offset); OSError when it cannot be read.

    The log lies in the run's folder, where the agent could put a link, a FIFO or a huge
    file in its place: it is read as processes.open_untrusted reads (a regular file, never
    through a link, never waiting), at most MAX_LOG_READ_BYTES, and a line longer than
    MAX_LOG_LINE_BYTES is skipped."""
    with open_untrusted(context.log_path) as log:
        log.seek(context.log_offset)
        left = MAX_LOG_READ_BYTES
        while left > 0:
            raw = log.readline(min(left, MAX_LOG_LINE_BYTES + 1))
            if not raw:
                return
            left -= len(raw)
            if len(raw) > MAX_LOG_LINE_BYTES and not raw.endswith(b"\n"):
                _skip_rest_of_line(log)
                continue
            yield raw.decode("utf-8", errors="replace")


def _skip_rest_of_line(log: BinaryIO) -> None:
    while True:
        chunk = log.readline(MAX_LOG_LINE_BYTES)
        if not chunk or chunk.endswith(b"\n"):
            return


# A model's time beyond this (three years) is no real run's.
MAX_MODEL_SECONDS = 10**8


def absurd_usage(outcome: AgentOutcome | JudgeAnswer) -> str:
    """What is absurd about the figures an agent reported ("" when nothing is): a cost or
    a token count no run could reach (transcripts.base's bounds for a whole session, which
    every money and token column holds), or a model time of years. Said as "reports ..."
    for the caller to name the source ("The usage file usage.json reports ...")."""
    cost = outcome.cost_usd
    if cost is not None and cost > MAX_THREAD_COST_USD:
        return (
            f"reports a cost of {float(cost):g} dollars, more than any run can cost (at most "
            f"{MAX_THREAD_COST_USD:.0e})"
        )
    for kind, count in outcome.usage.as_dict().items():
        if count > MAX_THREAD_TOKENS:
            name = kind.replace("_", " ")
            return (
                f"reports {count:.3g} {name}, more than any run can use (at most "
                f"{MAX_THREAD_TOKENS:.0e})"
            )
    seconds = outcome.model_seconds
    if seconds is not None and seconds > MAX_MODEL_SECONDS:
        return f"reports {seconds:.3g} seconds of model time, more than any run can take"
    return ""


def sandbox_refusal(outputs: list[str]) -> str:
    """Why every command an agent ran failed in a sandbox (its own, or ours), as the first
    refusal said it; "" when it ran none, or when one of them got past a sandbox. The
    adapters make it a SetupProblem (SetupKind.SANDBOX): the run fails as `setup` saying
    so, never completes as if the agent had chosen to change nothing."""
    reasons = [sandbox_failure(output) for output in outputs]
    if not reasons or not all(reasons):
        return ""
    count = len(reasons)
    return (
        f"{'its one command' if count == 1 else f'all {count} commands'} failed in a "
        f"sandbox before running: {reasons[0]}"
    )


def fail_if_sandbox_refused(outcome: AgentOutcome, outputs: list[str], *, tool: str) -> None:
    """Fail the outcome as setup (SetupKind.SANDBOX) when every command the agent ran was
    refused by a sandbox (`sandbox_refusal`); an error it already had stays first."""
    refused = sandbox_refusal(outputs)
    if refused:
        outcome.failed = True
        outcome.setup = SetupProblem(
            SetupKind.SANDBOX, f"{tool} could not run any command: {refused}"
        )
        outcome.error = outcome.error or outcome.setup.words


def error_from_log(path: Path) -> str:
    """The last non-blank lines of a log, for a failure message."""
    lines = [line for line in read_tail(path, max_bytes=16 * 1024).split("\n") if line.strip()]
    message = "\n".join(lines[-ERROR_LINES:])
    return message[-ERROR_CHARS:]


class ConfiguredAgent(Agent):
    """An agent kind configured in settings.REPLAYS_AGENTS ({"kind": ..., "models": [...]}).

    Each kind checks its own part of an entry, says whether it can run on this
    machine, and builds the adapter for one of its models.
    """

    @classmethod
    @abstractmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        """Raise ValueError when the entry is malformed for this kind."""

    @classmethod
    @abstractmethod
    def unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        """Why this agent cannot run here ("" when it can)."""

    @classmethod
    @abstractmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> ConfiguredAgent:
        """The adapter for `model` of the agent configured as `name`."""

    @classmethod
    def version(cls, entry: Mapping[str, Any]) -> str:
        """The installed agent's version ("" when unknown)."""
        return ""

    @classmethod
    def discovered_models(cls, entry: Mapping[str, Any]) -> list[str]:
        """The models the agent's own program lists for this entry, when the entry asks
        for them ("discover_models": true) and the kind can list them; [] otherwise."""
        return []

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """Whether this agent's runs will have a login (checked before anything runs)."""
        return Login(UNKNOWN)

    @classmethod
    def judge_unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        """Why this agent cannot act as an evaluator here ("" when it can); the program
        being missing is said by unavailable_reason."""
        return "" if cls.can_judge else f"The {cls.kind} kind has no judge mode."


def run_environment(entry: Mapping[str, Any]) -> dict[str, str]:
    """The environment a run's agent gets from us: ours without our secrets, plus the
    entry's `env` (replays.runfolder.agent_environment does the same when it runs)."""
    env = without_secrets(os.environ)
    given = entry.get("env")
    if isinstance(given, Mapping):
        env.update({str(key): str(value) for key, value in given.items()})
    return env


class ProgramAgent(ConfiguredAgent):
    """An agent kind that is one installed program (the entry's `binary`, else the kind's
    `default_binary`) whose runs get the entry's seed files in a HOME of their own."""

    default_binary: ClassVar[str]
    model: str

    @classmethod
    def unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        binary = entry.get("binary", cls.default_binary)
        reason = program_unavailable_reason(binary, entry.get("env"))
        return reason or seed_files_unavailable_reason(entry.get("seed_files", {}), home="HOME")

    @classmethod
    def version(cls, entry: Mapping[str, Any]) -> str:
        return program_version(entry.get("binary", cls.default_binary), entry.get("env"))

    def judge_cleanup(self, task: JudgeTask) -> None:
        self.cleanup(judge_context(task, self.model))


def program_unavailable_reason(program: str, env: Mapping[str, str] | None = None) -> str:
    """Why `program` (a path, or a name looked up on PATH) cannot be started ("" when it can)."""
    search_path = (env or {}).get("PATH") or os.environ.get("PATH", os.defpath)
    if os.sep in program:
        path = Path(program).expanduser()
        if not path.is_file():
            return f"{program} does not exist."
        if not os.access(path, os.X_OK):
            return f"{program} is not executable."
        return ""
    if shutil.which(program, path=search_path) is None:
        return f"'{program}' was not found on PATH."
    return ""


def program_version(program: str, env: Mapping[str, str] | None = None) -> str:
    """The first line `program --version` prints ("" when it cannot say), cached per binary."""
    search_path = (env or {}).get("PATH") or os.environ.get("PATH", os.defpath)
    resolved = (
        str(Path(program).expanduser())
        if os.sep in program
        else shutil.which(program, path=search_path)
    )
    if not resolved:
        return ""
    try:
        stamp = os.stat(resolved).st_mtime
    except OSError:
        return ""
    return _version_of(resolved, stamp)


@functools.lru_cache(maxsize=64)
def _version_of(path: str, stamp: float) -> str:
    try:
        completed = subprocess.run(
            [path, "--version"],
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = (completed.stdout or completed.stderr).strip().splitlines()
    return plain_text(lines[0])[:100] if completed.returncode == 0 and lines else ""


def json_event(line: str) -> dict[str, Any] | None:
    """One line of an agent's JSON event stream, or None for anything else (stderr text)."""
    line = line.strip()
    if not line.startswith("{"):
        return None
    try:
        event = json.loads(line)
    except ValueError:
        return None
    return event if isinstance(event, dict) and isinstance(event.get("type"), str) else None


def is_cut_line(line: str) -> bool:
    """A log tail's first line that is the end of a JSON event cut off at its start."""
    stripped = line.strip()
    if not stripped or stripped.startswith("{"):
        return False
    return stripped.endswith("}") or '":' in stripped


class EventRenderer(Protocol):
    lines: list[str]

    def event(self, event: dict[str, Any]) -> None: ...

    def emit(self, line: str) -> None: ...


def render_event_stream(text: str, renderer: EventRenderer) -> str:
    """A log tail of JSON events with stderr lines between, as the renderer writes it.

    `text` may start in the middle of a line (a broken first line is skipped) and end in
    one (a JSON line still being written is skipped); other text lines pass through.
    """
    lines = text.split("\n")
    if lines and is_cut_line(lines[0]):
        lines = lines[1:]
    for index, line in enumerate(lines):
        if not line.strip():
            continue
        event = json_event(line)
        if event is not None:
            renderer.event(event)
        elif line.lstrip().startswith("{") and index == len(lines) - 1:
            continue  # still being written
        else:
            renderer.emit(line)
    return "\n".join(renderer.lines)


def first_lines(text: str, count: int) -> str:
    """The first `count` lines of a tool's output, indented, with how many were left out."""
    lines = text.strip().split("\n")
    shown = "\n  ".join(lines[:count])
    return shown + (f"\n  … {len(lines) - count} more lines" if len(lines) > count else "")


def readable_tail(rendered: str) -> str:
    """The last lines of a rendered log, for an error message."""
    lines = [line for line in rendered.split("\n") if line.strip()]
    return "\n".join(lines[-ERROR_LINES:])[-ERROR_CHARS:]


def remove_seed_files(home: Path, seed_files: Mapping[str, str]) -> None:
    """Delete the copies of the user's files (logins, keys) from a finished run's home;
    what the agent wrote there itself (its session file) stays with the run."""
    for target in seed_files:
        (home / target).unlink(missing_ok=True)


# --- Judge mode: one structured answer ---------------------------------------------


def judge_context(task: JudgeTask, model: str) -> RunContext:
    """A judge call as the run code sees a run: task.folder is both its run folder and its
    workspace (the agent's own home and usage file go there), the prompt its request. The
    adapters thereby prepare, read and clean up a judge call with their run code."""
    return RunContext(
        run_id=0,
        model=model,
        spec=RunSpec(),
        run_dir=task.folder,
        workspace=task.folder,
        request_file=task.prompt_file,
        log_path=task.log_path,
    )


def task_json(value: object) -> str:
    """Compact JSON of a task's schema or inputs: Mappings of any kind become objects, and
    values JSON has no type for (Decimal, Path, datetime) their text."""
    return json.dumps(
        value,
        ensure_ascii=False,
        separators=(",", ":"),
        default=lambda item: dict(item) if isinstance(item, Mapping) else str(item),
    )


def judge_answer_from(
    outcome: AgentOutcome, *, exit_code: int, reply: str = "", answer_file: Path | None = None
) -> JudgeAnswer:
    """What a finished judge process gave: its answer (the answer file's text when it wrote
    one, else `reply`) read as a JSON object, unless the agent failed; usage, cost, model
    time and notes from the outcome the adapter's run code read."""
    judged = _judged_reply(outcome, exit_code=exit_code, reply=reply, answer_file=answer_file)
    judged.usage = outcome.usage
    judged.cost_usd = outcome.cost_usd
    judged.model_seconds = outcome.model_seconds
    judged.notes = [*outcome.notes, *judged.notes]
    return judged


def _judged_reply(
    outcome: AgentOutcome, *, exit_code: int, reply: str, answer_file: Path | None
) -> JudgeAnswer:
    # A failed call's reply is not its verdict, even when it wrote one.
    if exit_code != 0 or outcome.failed or outcome.error:
        return JudgeAnswer(error=_judge_failure(outcome.error, exit_code))
    try:
        written = read_answer_file(answer_file) if answer_file is not None else ""
    except ValueError as exc:
        return JudgeAnswer(error=plain_text(str(exc)))
    return parse_answer(written if written.strip() else reply)


def _judge_failure(error: str, exit_code: int) -> str:
    error = error.strip()
    if exit_code != 0:
        head = f"The evaluator exited with code {exit_code}"
        error = f"{head}:\n{error}" if error else f"{head}."
    return plain_text(error or "The evaluator reported a failure.")


def read_answer_file(path: Path) -> str:
    """The text of the answer file an evaluator wrote ("" when it wrote none), read no
    further than MAX_ANSWER_BYTES; ValueError saying why it cannot be used."""
    try:
        # Never through a link (to a file of ours), never waiting on a FIFO.
        data = read_untrusted(path, max_bytes=MAX_ANSWER_BYTES)
    except FileNotFoundError:
        return ""
    except UnsafeFile:
        raise ValueError(f"The evaluator's answer {path.name} is not a regular file.") from None
    except OSError as exc:
        raise ValueError(
            f"The evaluator's answer file {path.name} cannot be read: {exc.strerror or exc}"
        ) from None
    if len(data) > MAX_ANSWER_BYTES:
        raise ValueError(
            f"The evaluator's answer file {path.name} is larger than 1 MiB: it was not read."
        )
    return data.decode("utf-8", errors="replace")


def parse_answer(reply: str) -> JudgeAnswer:
    """The evaluator's reply read as the JSON object it must be; answer None and why not
    otherwise (the reply itself is kept in `raw` for audit)."""
    if len(reply.encode("utf-8", errors="replace")) > MAX_ANSWER_BYTES:
        return JudgeAnswer(error="The evaluator's answer is larger than 1 MiB: it was not read.")
    raw = plain_text(reply)
    text = reply.strip()
    if not text:
        return JudgeAnswer(error="The evaluator gave no answer.", raw=raw)
    quoted = plain_text(text[:ANSWER_QUOTE_CHARS])
    try:
        # NaN and Infinity are not JSON, and no database stores them in a JSON column.
        value = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return JudgeAnswer(error=f"The evaluator's answer is not JSON: {quoted}", raw=raw)
    if not isinstance(value, dict):
        return JudgeAnswer(
            error=f"The evaluator's answer is {_json_kind(value)}, not an object: {quoted}",
            raw=raw,
        )
    return JudgeAnswer(answer=value, raw=raw)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _json_kind(value: object) -> str:
    if isinstance(value, list):
        return "a JSON list"
    if isinstance(value, str):
        return "a JSON string"
    if isinstance(value, bool):
        return "JSON true/false"
    return "JSON null" if value is None else "a JSON number"


# --- Settings entries of agents that run a CLI (codex, claude_code) -----------------


def check_program_entry(entry: Mapping[str, Any], *, default_binary: str) -> None:
    """The keys every CLI agent has: `binary`, `args`, `env`; ValueError when malformed."""
    binary = entry.get("binary", default_binary)
    if not isinstance(binary, str) or not binary.strip():
        raise ValueError("'binary' must be a program name or path")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) for arg in args):
        raise ValueError("'args' must be a list of strings")
    env = entry.get("env", {})
    if not isinstance(env, Mapping) or not all(
        isinstance(key, str) and key and isinstance(value, str) for key, value in env.items()
    ):
        raise ValueError("'env' must map names to strings")


def check_seed_files(entry: Mapping[str, Any], *, home: str) -> Mapping[str, Any]:
    """`seed_files`: {relative path inside the agent's home: source path}; `home` names it."""
    seeds = entry.get("seed_files", {})
    if not isinstance(seeds, Mapping):
        raise ValueError(f"'seed_files' must map file names in {home} to source paths")
    for target, source in seeds.items():
        if not isinstance(target, str) or not target.strip():
            raise ValueError(f"'seed_files': each key is a path inside {home}")
        path = PurePosixPath(target)
        if path.is_absolute() or not path.parts or ".." in path.parts or target.startswith("~"):
            raise ValueError(
                f"'seed_files': {target!r} must be a relative path inside {home} "
                "(the source path is the value)"
            )
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"'seed_files': the source of {target!r} must be a path")
    return seeds


def seed_files_unavailable_reason(seed_files: Mapping[str, str], *, home: str) -> str:
    """Why the seed files cannot be copied ("" when they can); checked at discovery, so a
    plan is blocked rather than a run failing later."""
    for target, source in seed_files.items():
        path = Path(source).expanduser()
        if not path.exists():
            return f"The seed file {source} (for {home}/{target}) does not exist."
        if not path.is_file():
            return f"The seed file {source} (for {home}/{target}) is not a file."
    return ""


def copy_seed_files(home_dir: Path, seed_files: Mapping[str, str], *, home: str) -> None:
    """Copy the seed files into a run's own home, readable by the owner only."""
    for target, source in seed_files.items():
        try:
            data = Path(source).expanduser().read_bytes()
        except FileNotFoundError:
            raise AgentSetupError(
                f"The seed file {source} (for {home}/{target}) does not exist."
            ) from None
        except OSError as exc:
            raise AgentSetupError(
                f"The seed file {source} (for {home}/{target}) cannot be read: "
                f"{exc.strerror or exc}"
            ) from None
        try:
            write_private(home_dir / target, data)
        except OSError as exc:
            raise AgentSetupError(
                f"The seed file {source} cannot be copied to {home}/{target}: {exc.strerror or exc}"
            ) from None


def write_private(path: Path, data: bytes) -> None:
    """Write a file only the owner reads (credentials, requests, settings)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # Never through a link planted where the file goes.
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    # O_CREAT's mode applies only to a new file.
    os.fchmod(descriptor, 0o600)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)


# --- What the Gemini CLI, OpenCode and pi kinds share --------------------------------


def check_own_flags(args: list[str], own: Mapping[str, str], kind: str) -> None:
    """Refuse `args` that give a flag the kind sets itself (`own`: flag -> why)."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in own:
            raise ValueError(f"'args' must not give {flag}: the {kind} kind sets it ({own[flag]})")


def check_own_env(env: Mapping[str, Any], own: Mapping[str, str]) -> None:
    """Refuse an `env` that sets a variable the run's isolation depends on (`own`: name -> why)."""
    for name, why in own.items():
        if name in env:
            raise ValueError(f"'env' must not set {name}: {why}")


def merged_json(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the JSON object `base` with `extra` laid over it, objects merged key by key
    (an agent's settings with what a run needs)."""
    merged: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = merged_json(merged[key], value)
        else:
            merged[key] = json.loads(json.dumps(value))
    return merged


def answer_text(reply: str) -> str:
    """An evaluator's reply as the JSON text it should be: its one JSON object, also when
    the model put it in a Markdown code block or said a word before it (an agent without a
    schema-bound answer does that now and then). The reply itself when no object is found."""
    text = reply.strip()
    if text.startswith("{") and text.endswith("}"):
        return text
    fenced = _FENCED_JSON_RE.search(text)
    if fenced:
        return fenced.group(1).strip()
    start, end = text.find("{"), text.rfind("}")
    return text[start : end + 1] if 0 <= start < end else reply


_FENCED_JSON_RE = re.compile(r"```(?:json)?\s*\n(\{.*\})\s*\n```", re.DOTALL)
