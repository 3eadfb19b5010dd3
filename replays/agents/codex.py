"""The Codex CLI as an agent: `codex exec --json` in the run's worktree.

settings.REPLAYS_AGENTS entry (every key but "kind" and "models" optional):
    {"kind": "codex", "label": "Codex", "binary": "codex", "models": ["gpt-5.5"],
     "args": ["-c", "model_provider=fake"], "env": {"FAKE_KEY": "x"},
     "sandbox": "workspace-write", "seed_files": {"auth.json": "~/.codex/auth.json"},
     "config_toml": "model_reasoning_effort = \"high\"\n"}

The process: `binary exec *args --json -C WORKSPACE -s SANDBOX --skip-git-repo-check
-m MODEL -` with the request on stdin (never in argv, never through a shell). Each
run gets its own CODEX_HOME in the run folder, holding only the seed files and
config.toml given here: runs never read or add to the user's own sessions, and
the session file Codex writes (CODEX_HOME/sessions/...) stays with the run.

Sessions (the `fork` context and ranges turn by turn): a fork's first turn is `binary exec
... -m MODEL fork SESSION -`, the cut historical rollout copied first to
CODEX_HOME/sessions/YYYY/MM/DD/rollout-...-SESSION.jsonl (Codex finds it by id), with -C
the thread's folder in the worktree; each later turn of a range is `... resume THREAD -`,
the thread the first turn's `thread.started` named. turn.completed counts the whole
thread (a fork's history too): a turn's usage is what it added to the totals before it.

With --json Codex writes one JSON event a line on stdout; the run's log also holds
its stderr, so lines that are not JSON are kept as plain text. The last
turn.completed carries the thread's cumulative usage (input includes cached
reads); Codex reports no cost, so it comes from the price table.

Judge mode (an evaluator's one structured answer), in the call's own empty FOLDER:
`binary exec *args --json -C FOLDER -s read-only --skip-git-repo-check -m MODEL
--output-schema FOLDER/answer-schema.json -o FOLDER/answer.txt -` with the prompt on
stdin and CODEX_HOME at FOLDER/codex-home, prepared as for a run. Codex sends the schema
as the Responses API's strict `text.format` (json_schema) and writes its last message,
the JSON answer, to the -o file (left empty when the turn failed); the last
agent_message of the event stream stands in when the file is empty.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from django.conf import settings

from replays import pricing
from replays.agents import problems
from replays.agents.base import (
    AgentOutcome,
    AgentSetupError,
    Invocation,
    JudgeAnswer,
    JudgeTask,
    ProgramAgent,
    RunContext,
    absurd_usage,
    check_program_entry,
    check_seed_files,
    copy_seed_files,
    fail_if_sandbox_refused,
    first_lines,
    json_event,
    judge_answer_from,
    judge_context,
    log_lines,
    open_untrusted,
    plain_text,
    program_unavailable_reason,
    read_tail,
    readable_tail,
    remove_seed_files,
    render_event_stream,
    run_environment,
    seed_files_unavailable_reason,
    task_json,
    write_private,
)
from replays.agents.problems import (
    MISSING,
    READY,
    UNKNOWN,
    Login,
    SetupKind,
    SetupProblem,
    first_set,
)
from replays.processes import read_untrusted_end
from replays.transcripts.base import TokenUsage

DEFAULT_BINARY = "codex"
DEFAULT_SANDBOX = "workspace-write"
SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")
# The run's own Codex home, inside the run folder.
CODEX_HOME_DIR = "codex-home"
# Codex's temporary folder (TMPDIR), inside the run folder.
TMP_DIR = "tmp"
CONFIG_TOML = "config.toml"
# Judge mode's files in the call's folder: the answer's schema, and Codex's last message.
SCHEMA_FILE = "answer-schema.json"
ANSWER_FILE = "answer.txt"
# What the log tail shows of a command's output, and of any one line.
OUTPUT_LINES = 5
LINE_CHARS = 300
MESSAGE_LINES = 12
# Codex retries a dropped stream or a 5xx itself and says so with an `error` event;
# only an error it does not recover from fails the run.
_RETRY_PREFIX = "Reconnecting..."
_SHELLS = frozenset({"bash", "sh", "zsh", "dash"})


class CodexAgent(ProgramAgent):
    default_binary: ClassVar[str] = DEFAULT_BINARY
    kind: ClassVar[str] = "codex"
    can_judge: ClassVar[bool] = True
    keeps_session: ClassVar[bool] = True

    def __init__(
        self,
        *,
        name: str,
        model: str,
        binary: str = DEFAULT_BINARY,
        args: list[str] | None = None,
        env: dict[str, str] | None = None,
        sandbox: str = DEFAULT_SANDBOX,
        seed_files: dict[str, str] | None = None,
        config_toml: str | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.binary = binary
        self.args = list(args or [])
        self.env = dict(env or {})
        self.sandbox = sandbox
        self.seed_files = dict(seed_files or {})
        self.config_toml = config_toml

    # --- configuration --------------------------------------------------------------

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        check_program_entry(entry, default_binary=DEFAULT_BINARY)
        if "CODEX_HOME" in entry.get("env", {}):
            raise ValueError(
                "'env' must not set CODEX_HOME: each run gets its own "
                "(give what it needs in 'seed_files' or 'config_toml')"
            )
        sandbox = entry.get("sandbox", DEFAULT_SANDBOX)
        if sandbox not in SANDBOX_MODES:
            raise ValueError(f"'sandbox' must be one of {', '.join(SANDBOX_MODES)}")
        seeds = check_seed_files(entry, home="CODEX_HOME")
        config_toml = entry.get("config_toml")
        if config_toml is not None and not isinstance(config_toml, str):
            raise ValueError("'config_toml' must be the text of a config.toml")
        if config_toml is not None and any(
            PurePosixPath(target) == PurePosixPath(CONFIG_TOML) for target in seeds
        ):
            raise ValueError("give config.toml either in 'seed_files' or as 'config_toml'")

    @classmethod
    def unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        env = entry.get("env", {})
        reason = program_unavailable_reason(entry.get("binary", DEFAULT_BINARY), env)
        return reason or seed_files_unavailable_reason(
            entry.get("seed_files", {}), home="CODEX_HOME"
        )

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """The key its provider reads (a custom provider's `env_key`), or a seeded auth.json."""
        env = run_environment(entry)
        if entry.get("config_toml"):
            return Login(UNKNOWN, "Its config.toml may choose a provider and its login.")
        if "auth.json" in set(entry.get("seed_files") or {}):
            return Login(READY, "auth.json is among its seed files.")
        provider_keys = _provider_env_keys(entry.get("args") or [])
        if provider_keys is None:
            return Login(UNKNOWN, "Its provider is chosen in a way we cannot read.")
        wanted = provider_keys or OPENAI_KEYS
        given = first_set(env, wanted)
        if given:
            return Login(READY, f"{given} is set.")
        return Login(
            MISSING,
            f"Codex will find no login: a run gets a CODEX_HOME of its own, and "
            f"{' or '.join(wanted)} is not set. Add "
            '"seed_files": {"auth.json": "~/.codex/auth.json"} or the key in "env" to the '
            "agent in REPLAYS_AGENTS_FILE.",
        )

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> CodexAgent:
        return cls(
            name=name,
            model=model,
            binary=entry.get("binary", DEFAULT_BINARY),
            args=list(entry.get("args", [])),
            env=dict(entry.get("env", {})),
            sandbox=entry.get("sandbox", DEFAULT_SANDBOX),
            seed_files=dict(entry.get("seed_files", {})),
            config_toml=entry.get("config_toml"),
        )

    # --- one run --------------------------------------------------------------------

    def invocation(self, context: RunContext) -> Invocation:
        if context.resume_session:
            # A later turn of the range: the thread turn 1 made goes on.
            session = ["resume", _session_argument(context.resume_session)]
        elif context.fork is not None:
            self._place_fork(context)
            session = ["fork", _session_argument(context.fork.session_id)]
        else:
            session = []
        return self._exec(context, sandbox=self.sandbox, session=session)

    def _place_fork(self, context: RunContext) -> None:
        """Copy the cut historical rollout where `codex exec fork` finds it by id: the run's
        own CODEX_HOME/sessions/YYYY/MM/DD/rollout-...-<session>.jsonl."""
        fork = context.fork
        assert fork is not None
        target = context.run_dir / CODEX_HOME_DIR / "sessions" / fork.day_folder / fork.file_name
        fork.copy_to(target, tool="codex")

    def session_id(self, context: RunContext) -> str:
        return self._events(context).thread_id

    def _exec(
        self,
        context: RunContext,
        *,
        sandbox: str,
        extra: list[str] | None = None,
        session: list[str] | None = None,
    ) -> Invocation:
        """`codex exec` in the context's workspace (a fork: the thread's folder in it) and own
        CODEX_HOME, the request on stdin; `session` resumes or forks one (`resume ID`)."""
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of codex.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        home = self.prepare_home(context.run_dir)
        binary = str(Path(self.binary).expanduser()) if os.sep in self.binary else self.binary
        folder = context.fork.cwd if context.fork is not None else context.workspace
        argv = [
            binary,
            "exec",
            *self.args,
            "--json",
            "-C",
            str(folder),
            "-s",
            sandbox,
            "--skip-git-repo-check",
            "-m",
            self.model,
            *(extra or []),
            *(session or []),
            "-",  # the prompt is stdin
        ]
        # Codex links its sandbox helper (codex-linux-sandbox) into CODEX_HOME and refuses
        # to when CODEX_HOME lies under the temporary folder; then, with bwrap installed,
        # every command fails (FACTS.md). Its temporary folder is therefore the run's own:
        # CODEX_HOME is never under it, wherever the run root is (/tmp included).
        temporary = context.run_dir / TMP_DIR
        temporary.mkdir(mode=0o700, exist_ok=True)
        return Invocation(
            argv=argv,
            env={**self.env, "CODEX_HOME": str(home), "TMPDIR": str(temporary)},
            stdin_path=context.request_file,
        )

    def cleanup(self, context: RunContext) -> None:
        remove_seed_files(context.run_dir / CODEX_HOME_DIR, self.seed_files)

    def prepare_home(self, run_dir: Path) -> Path:
        """The run's own CODEX_HOME, holding only the seed files and config.toml."""
        home = run_dir / CODEX_HOME_DIR
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        copy_seed_files(home, self.seed_files, home="CODEX_HOME")
        if self.config_toml is not None:
            write_private(home / CONFIG_TOML, self.config_toml.encode("utf-8"))
        return home

    def _events(self, context: RunContext) -> EventSummary:
        """This turn's events; OSError when the log cannot be read."""
        events = EventSummary()
        for line in log_lines(context):
            event = json_event(line)
            if event is not None:
                events.add(event)
        return events

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        try:
            events = self._events(context)
            before = _totals_before(context)
        except OSError as exc:
            return AgentOutcome(
                error=f"The agent's log could not be read: {exc}",
                failed=True,
                notes=[f"The agent's log could not be read: {exc}"],
            )
        outcome = AgentOutcome(final_message=events.final_message)
        # turn.completed counts the whole thread (a fork's history, earlier turns):
        # this turn's usage is what it added.
        usage = _usage(_minus(events.totals, before)) if events.totals is not None else None
        if usage is not None:
            outcome.usage = usage
            table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
            outcome.cost_usd = pricing.cost_usd(self.model, usage, table)
        else:
            outcome.notes.append("Codex reported no token usage: tokens and cost are unknown.")
        absurd = absurd_usage(outcome)
        if absurd:
            message = f"Codex's token counts {absurd}: its figures were not kept."
            return AgentOutcome(
                final_message=outcome.final_message, failed=True, error=message, notes=[message]
            )
        outcome.failed = bool(events.failure)
        outcome.error = events.failure
        if exit_code != 0 and not outcome.error:
            outcome.error = events.last_retry or readable_tail(
                self.render_log(read_tail(context.log_path))
            )
        if outcome.failed or exit_code != 0:
            outcome.setup = setup_problem(outcome.error, events)
        outputs = _turn_tool_outputs(context, events.thread_id) or events.command_outputs
        fail_if_sandbox_refused(outcome, outputs, tool="Codex")
        return outcome

    def render_log(self, text: str) -> str:
        return render_events(text)

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        schema_file = task.folder / SCHEMA_FILE
        # An evaluator only reads: it answers in its last message, it changes nothing.
        invocation = self._exec(
            judge_context(task, self.model),
            sandbox="read-only",
            extra=["--output-schema", str(schema_file), "-o", str(task.folder / ANSWER_FILE)],
        )
        write_private(schema_file, task_json(task.schema).encode("utf-8"))
        return invocation

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome = self.outcome(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome,
            exit_code=exit_code,
            answer_file=task.folder / ANSWER_FILE,
            reply=outcome.final_message,
        )


# --- the event stream ------------------------------------------------------------------


@dataclass
class EventSummary:
    """What a run's events add up to, fed one event at a time."""

    thread_id: str = ""
    final_message: str = ""
    usage: TokenUsage | None = None
    # The last turn.completed usage as Codex wrote it (the thread's running totals).
    totals: dict[str, Any] | None = None
    # Why the turn failed ("" while it did not): turn.failed, or an error it did not survive.
    failure: str = ""
    last_retry: str = ""
    # What each command Codex ran printed (its sandbox's refusal, when it refused).
    command_outputs: list[str] = field(default_factory=list)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("thread.started", "session.created"):
            self.thread_id = _text(event.get("thread_id") or event.get("session_id"))
        elif kind == "turn.completed":
            usage = _usage(event.get("usage"))
            if usage is not None:
                self.usage = usage
                self.totals = dict(event["usage"])
            # Errors reported before the turn completed were survived.
            self.failure = ""
        elif kind == "turn.failed":
            error = event.get("error")
            message = _text(error.get("message")) if isinstance(error, Mapping) else _text(error)
            self.failure = readable_error(message) or "Codex reported that the turn failed."
        elif kind == "error":
            message = readable_error(_text(event.get("message")))
            if event.get("will_retry") is True or message.startswith(_RETRY_PREFIX):
                self.last_retry = message
            else:
                self.failure = message or "Codex reported an error."
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = event.get("item")
            if (
                kind == "item.completed"
                and isinstance(item, Mapping)
                and _item_type(item) == "agent_message"
            ):
                self.final_message = _text(item.get("text"))
            elif (
                kind == "item.completed"
                and isinstance(item, Mapping)
                and _item_type(item) == "command_execution"
            ):
                self.command_outputs.append(_text(item.get("aggregated_output")))
        # Anything else (turn.started, events of newer builds) changes nothing here.


def render_events(text: str) -> str:
    """Codex's JSON event stream (with stderr lines between) as lines a person reads.

    `text` may start in the middle of a line (a broken first line is skipped) and
    end in one (a JSON line still being written is skipped).
    """
    return render_event_stream(text, _Renderer())


class _Renderer:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.last_command = ""  # id of the command whose `$ ...` line was written last

    def emit(self, line: str) -> None:
        for part in plain_text(line).split("\n"):
            part = part.rstrip()
            if len(part) > LINE_CHARS:
                part = part[: LINE_CHARS - 1] + "…"
            self.lines.append(part)
        self.last_command = ""

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("thread.started", "session.created"):
            thread = _text(event.get("thread_id") or event.get("session_id"))
            self.emit(f"codex session {thread}" if thread else "codex session started")
        elif kind == "turn.completed":
            usage = _usage(event.get("usage"))
            if usage is not None:
                total_input = usage.input_tokens + usage.cache_read_tokens
                total_input += usage.cache_write_5m_tokens
                self.emit(
                    f"tokens: {total_input:,} input ({usage.cache_read_tokens:,} cached), "
                    f"{usage.output_tokens:,} output"
                )
            else:
                self.emit("turn completed")
        elif kind == "turn.failed":
            error = event.get("error")
            message = _text(error.get("message")) if isinstance(error, Mapping) else _text(error)
            self.emit(f"turn failed: {readable_error(message)}")
        elif kind == "error":
            self.emit(f"error: {readable_error(_text(event.get('message')))}")
        elif kind in ("item.started", "item.updated", "item.completed"):
            item = event.get("item")
            if isinstance(item, Mapping):
                self.item(kind, item)
        # turn.started and unknown events add nothing a reader needs.

    def item(self, kind: str, item: Mapping[str, Any]) -> None:
        item_type = _item_type(item)
        item_id = _text(item.get("id"))
        done = kind == "item.completed"
        if item_type == "command_execution":
            command = _command_text(item.get("command"))
            if kind == "item.started":
                self.emit(f"$ {first_lines(command, 3)}")
                self.last_command = item_id
            elif done:
                if not item_id or self.last_command != item_id:
                    self.emit(f"$ {first_lines(command, 3)}")
                self.command_result(item)
        elif not done:
            if item_type == "todo_list" and kind == "item.started":
                self.todo_list(item)
            return  # the rest is shown once, when complete
        elif item_type == "agent_message":
            self.emit(f"assistant: {first_lines(_text(item.get('text')), MESSAGE_LINES)}")
        elif item_type == "reasoning":
            self.emit(f"thinking: {first_lines(_text(item.get('text')), 2)}")
        elif item_type == "plan":
            self.emit(f"plan: {first_lines(_text(item.get('text')), MESSAGE_LINES)}")
        elif item_type == "file_change":
            failed = item.get("status") == "failed"
            for change in item.get("changes") or []:
                if isinstance(change, Mapping):
                    verb = {"add": "added", "delete": "deleted"}.get(
                        _text(change.get("kind")), "edited"
                    )
                    path = _text(change.get("path"))
                    self.emit(f"could not edit {path}" if failed else f"{verb} {path}")
        elif item_type == "mcp_tool_call":
            name = ".".join(p for p in (_text(item.get("server")), _text(item.get("tool"))) if p)
            error = item.get("error")
            if isinstance(error, Mapping) and error.get("message"):
                self.emit(f"tool {name}: failed: {_text(error.get('message'))}")
            else:
                self.emit(f"tool {name}: {_text(item.get('status')) or 'done'}")
        elif item_type == "web_search":
            self.emit(f"web search: {_text(item.get('query'))}")
        elif item_type == "todo_list":
            self.todo_list(item)
        elif item_type == "error":
            self.emit(f"warning: {_text(item.get('message'))}")

    def command_result(self, item: Mapping[str, Any]) -> None:
        exit_code = item.get("exit_code")
        status = _text(item.get("status"))
        if isinstance(exit_code, int) and not isinstance(exit_code, bool):
            summary = f"exit {exit_code}"
        else:
            summary = status or "ended"
        if status == "declined":
            summary = "declined"
        output = plain_text(_text(item.get("aggregated_output"))).rstrip("\n")
        self.emit(f"  {summary}")
        if output:
            output_lines = output.split("\n")
            for line in output_lines[:OUTPUT_LINES]:
                self.emit(f"    {line}")
            if len(output_lines) > OUTPUT_LINES:
                self.emit(f"    … {len(output_lines) - OUTPUT_LINES} more lines")

    def todo_list(self, item: Mapping[str, Any]) -> None:
        entries = [entry for entry in item.get("items") or [] if isinstance(entry, Mapping)]
        done = sum(1 for entry in entries if entry.get("completed") is True)
        self.emit(f"plan: {done}/{len(entries)} done")
        for entry in entries:
            mark = "x" if entry.get("completed") is True else " "
            self.emit(f"  [{mark}] {_text(entry.get('text'))}")


# --- helpers ---------------------------------------------------------------------------


OPENAI_KEYS = ("OPENAI_API_KEY", "CODEX_API_KEY")
_PROVIDER_RE = re.compile(r"^model_provider\s*=\s*\"?([A-Za-z0-9_-]+)\"?$")
_ENV_KEY_RE = re.compile(
    r"^model_providers\.([A-Za-z0-9_-]+)\.env_key\s*=\s*\"?([A-Za-z0-9_]*)\"?$"
)


def _provider_env_keys(args: list[str]) -> tuple[str, ...] | None:
    """The variables the chosen provider reads its key from, from `-c` overrides: () for
    OpenAI's own, None when a provider is chosen whose key we cannot read (its env_key is
    not among the overrides: it may need none, like a local server)."""
    overrides = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg in ("-c", "--config")]
    provider = next((m.group(1) for o in overrides if (m := _PROVIDER_RE.match(o))), "openai")
    if provider == "openai":
        return ()
    keys = {m.group(1): m.group(2) for o in overrides if (m := _ENV_KEY_RE.match(o))}
    if provider not in keys:
        return None
    return (keys[provider],) if keys[provider] else None


# Codex quotes the provider's HTTP status in its error ("unexpected status 401
# Unauthorized: ...", "exceeded retry limit, last status: 429 Too Many Requests").
_HTTP_STATUS_RE = re.compile(r"(?:unexpected status|last status:?)\s+(\d{3})\b")
_NOT_LOGGED_IN_RE = re.compile(r"not logged in|codex login|please log ?in", re.IGNORECASE)
_NO_KEY_RE = re.compile(r"missing environment variable|api key|no credentials", re.IGNORECASE)


def setup_problem(error: str, events: EventSummary) -> SetupProblem | None:
    """The setup problem a failed (or stopped) Codex run met, from what Codex said."""
    status = _HTTP_STATUS_RE.search(error)
    if status:
        return problems.from_http_status(int(status.group(1)), error)
    if _NOT_LOGGED_IN_RE.search(error):
        return SetupProblem(SetupKind.NOT_LOGGED_IN, error)
    if "usage limit" in error.lower():
        return SetupProblem(SetupKind.QUOTA, error)
    if _NO_KEY_RE.search(error):
        return SetupProblem(SetupKind.CREDENTIALS, error)
    # It waits for the network for ever (until the run's timeout) when the provider
    # cannot be reached: a run that never got one answer met the network, not the task.
    if events.totals is None and "waiting for network" in events.last_retry:
        return SetupProblem(SetupKind.NETWORK, events.last_retry)
    return None


def readable_error(message: str) -> str:
    """An API error body that Codex quotes as it came ({"error": {"message": ...}}) as its message."""
    message = message.strip()
    if message.startswith("{"):
        try:
            body = json.loads(message)
        except ValueError:
            return message
        if isinstance(body, Mapping):
            error = body.get("error", body)
            if isinstance(error, Mapping) and isinstance(error.get("message"), str):
                return error["message"].strip() or message
            if isinstance(error, str) and error.strip():
                return error.strip()
            if isinstance(body.get("detail"), str):
                return body["detail"]
    return message


def _totals_before(context: RunContext) -> Mapping[str, Any]:
    """The thread's totals before this turn: the last turn.completed of the earlier turns
    in the log, else the forked history's totals (nothing for a new thread)."""
    before: Mapping[str, Any] = context.fork.base_usage if context.fork is not None else {}
    if context.log_offset:
        with open_untrusted(context.log_path) as log:
            for raw in log.read(context.log_offset).split(b"\n"):
                event = json_event(raw.decode("utf-8", errors="replace"))
                if event and event["type"] == "turn.completed" and _usage(event.get("usage")):
                    before = event["usage"]
    return before


# The end of a session's rollout that holds the turn just ended (a fork's history before it
# can be long).
_ROLLOUT_TAIL_BYTES = 16 * 1024 * 1024
_TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output", "local_shell_call_output")


def _turn_tool_outputs(context: RunContext, thread_id: str) -> list[str]:
    """What each tool call of the turn just ended gave back to the model, read from the
    session's rollout in the run's CODEX_HOME (its --json stream leaves out a command its
    sandbox never started). [] when there is no such file."""
    if not thread_id or "/" in thread_id or thread_id.startswith("."):
        return []
    sessions = context.run_dir / CODEX_HOME_DIR / "sessions"
    try:
        found = sorted(sessions.glob(f"*/*/*/rollout-*-{thread_id}.jsonl"))
    except OSError:
        return []
    if len(found) != 1:
        return []
    try:
        data, _ = read_untrusted_end(found[0], max_bytes=_ROLLOUT_TAIL_BYTES)
    except OSError:
        return []
    outputs: list[str] = []
    for raw in data.split(b"\n"):
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        payload = line.get("payload") if isinstance(line, dict) else None
        if not isinstance(payload, Mapping):
            continue
        if line.get("type") == "event_msg" and payload.get("type") == "task_started":
            outputs = []  # a new turn: only the last one's calls count
        elif line.get("type") == "response_item" and payload.get("type") in _TOOL_OUTPUTS:
            output = payload.get("output")
            if isinstance(output, Mapping):
                output = output.get("output") or output.get("content")
            outputs.append(_text(output) if isinstance(output, str) else json.dumps(output))
    return outputs


def _minus(totals: Mapping[str, Any], before: Mapping[str, Any]) -> dict[str, Any]:
    """Running totals less those of before (a count that did not grow adds nothing)."""
    result = dict(totals)
    for key, value in totals.items():
        earlier = before.get(key, 0)
        if isinstance(value, int) and isinstance(earlier, int) and not isinstance(value, bool):
            result[key] = max(0, value - earlier)
    return result


def _session_argument(session_id: str) -> str:
    """A session id as the argument of `exec resume` / `exec fork` (never an option)."""
    if not session_id or session_id.startswith("-") or any(c.isspace() for c in session_id):
        raise AgentSetupError(f"{session_id[:60]!r} is not a session Codex can resume.")
    return session_id


def _item_type(item: Mapping[str, Any]) -> str:
    # Older builds wrote `item_type` and called the agent's message `assistant_message`.
    kind = _text(item.get("type") or item.get("item_type"))
    return "agent_message" if kind == "assistant_message" else kind


def _usage(value: object) -> TokenUsage | None:
    """Codex's usage (input includes cached reads and, as read here, cache writes) as
    disjoint kinds, the way replays.transcripts.codex reads session files."""
    if not isinstance(value, Mapping):
        return None
    numbers = {}
    for key in ("input_tokens", "cached_input_tokens", "cache_write_input_tokens", "output_tokens"):
        number = value.get(key, 0)
        if key == "cached_input_tokens" and key not in value:
            number = value.get("cache_read_input_tokens", 0)
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            return None
        numbers[key] = number
    input_tokens = numbers["input_tokens"]
    cached = min(numbers["cached_input_tokens"], input_tokens)
    written = min(numbers["cache_write_input_tokens"], input_tokens - cached)
    return TokenUsage(
        input_tokens=input_tokens - cached - written,
        cache_read_tokens=cached,
        cache_write_5m_tokens=written,
        output_tokens=numbers["output_tokens"],
    )


def _command_text(command: object) -> str:
    """The command as the model wrote it, without the `bash -lc` wrapper Codex reports."""
    if isinstance(command, list):
        command = shlex.join(str(part) for part in command)
    text = _text(command)
    try:
        parts = shlex.split(text)
    except ValueError:
        return text
    if len(parts) == 3 and Path(parts[0]).name in _SHELLS and parts[1] in ("-c", "-lc"):
        return parts[2]
    return text


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
