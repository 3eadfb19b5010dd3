"""Gemini CLI as an agent: `gemini --output-format stream-json` in the run's worktree.

settings.REPLAYS_AGENTS entry (every key but "kind" and "models" optional):
    {"kind": "gemini", "label": "Gemini CLI", "binary": "gemini",
     "models": ["gemini-2.5-pro", "gemini-2.5-flash"], "args": [],
     "env": {"GEMINI_API_KEY": "..."}, "approval_mode": "yolo",
     "settings": {"general": {"vimMode": false}},
     "seed_files": {".gemini/oauth_creds.json": "~/.gemini/oauth_creds.json"}}

The process: `binary -m MODEL --output-format stream-json --approval-mode MODE --skip-trust
*args` with the request on stdin (Gemini CLI reads a prompt piped to it; never in argv,
never through a shell). Each run gets its own HOME in the run folder (`gemini-home`)
holding only the seed files and `.gemini/settings.json`: the entry's `settings`, the
authentication its key needs (0.61.0 refuses GOOGLE_GEMINI_BASE_URL alone: "Invalid auth
method selected"), no usage statistics. The session Gemini CLI writes there
(`.gemini/tmp/<project>/chats/session-*.jsonl`) stays with the run. "yolo" approves every
tool call (the run is sandboxed and its worktree its own); "auto_edit" only edits,
"default" refuses what would need asking in a headless run.

Sessions (the `fork` context and ranges turn by turn): Gemini CLI resumes a session of
the current project by id (`--resume ID`), the project being the folder it runs in as
`.gemini/projects.json` names it. A fork's cut historical session is copied to
`.gemini/tmp/replays/chats/` with the worktree's folder registered as that project, and
resumed; each later turn of a range resumes the session the first turn's `init` event
named. The stream's `result` counts this process alone.

With stream-json Gemini CLI writes one JSON event a line on stdout: `init` (session_id,
model), `message` (the user's, then the assistant's text in pieces, `delta`), `tool_use`,
`tool_result` (status, output), `error` (a warning it survived), and last `result`:
status success | error (error.type, error.message) and stats per model (input_tokens: the
prompts with their cached part, cached, output_tokens: the answers, total_tokens: also
thoughts and tool-use prompts). It reports no cost: the price table's, per model. The
stream says nothing of the time spent waiting on the model.

Judge mode: Gemini CLI sends a generation config its settings give for a model as it is
(`modelConfigs.overrides`), and with `tools.core: []` it offers the model no tool. The
judge's home has both: `responseMimeType: application/json` with the answer's schema as
`responseJsonSchema` (the Gemini API's structured output), so the answer is the JSON
object; `binary -m MODEL --output-format stream-json --approval-mode default --skip-trust`
in the call's own empty folder, the prompt on stdin.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
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
    answer_text,
    check_own_env,
    check_own_flags,
    check_program_entry,
    check_seed_files,
    copy_seed_files,
    fail_if_sandbox_refused,
    first_lines,
    json_event,
    judge_answer_from,
    judge_context,
    log_lines,
    merged_json,
    plain_text,
    read_tail,
    readable_tail,
    remove_seed_files,
    render_event_stream,
    run_environment,
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
from replays.transcripts.base import TokenUsage

DEFAULT_BINARY = "gemini"
DEFAULT_APPROVAL_MODE = "yolo"
APPROVAL_MODES = ("default", "auto_edit", "yolo", "plan")
# The run's own HOME, inside the run folder, and Gemini CLI's folder inside it.
HOME_DIR = "gemini-home"
CONFIG_DIR = ".gemini"
SETTINGS_FILE = ".gemini/settings.json"
# The project a fork's copied session is kept under (projects.json names the worktree so).
FORK_PROJECT = "replays"
_OWN_FLAGS = {
    "-m": "the model comes from the model id",
    "--model": "the model comes from the model id",
    "-o": "the log is parsed as stream-json",
    "--output-format": "the log is parsed as stream-json",
    "-p": "the request is given on stdin",
    "--prompt": "the request is given on stdin",
    "-i": "a run is not interactive",
    "--prompt-interactive": "a run is not interactive",
    "-r": "the run resumes the sessions its context and turns need",
    "--resume": "the run resumes the sessions its context and turns need",
    "--approval-mode": "use 'approval_mode'",
    "-y": "use 'approval_mode'",
    "--yolo": "use 'approval_mode'",
}
_OWN_ENV = {
    "HOME": "each run gets its own HOME (copy what it needs with 'seed_files')",
    "GEMINI_CLI_HOME": "each run gets its own HOME (copy what it needs with 'seed_files')",
}
# What gives Gemini CLI a login (besides the files a seeded home holds).
LOGIN_VARIABLES = (
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_GENAI_USE_VERTEXAI",
    "GOOGLE_GENAI_USE_GCA",
    "GOOGLE_CLOUD_PROJECT",
)
OAUTH_FILE = ".gemini/oauth_creds.json"
# What the log tail shows of a tool's output, of an assistant message, and of any line.
OUTPUT_LINES = 5
MESSAGE_LINES = 12
LINE_CHARS = 300


class GeminiAgent(ProgramAgent):
    default_binary: ClassVar[str] = DEFAULT_BINARY
    kind: ClassVar[str] = "gemini"
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
        approval_mode: str = DEFAULT_APPROVAL_MODE,
        seed_files: dict[str, str] | None = None,
        settings_json: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.binary = binary
        self.args = list(args or [])
        self.env = dict(env or {})
        self.approval_mode = approval_mode
        self.seed_files = dict(seed_files or {})
        self.settings_json = dict(settings_json or {})

    # --- configuration --------------------------------------------------------------

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        check_program_entry(entry, default_binary=DEFAULT_BINARY)
        check_own_flags(entry.get("args", []), _OWN_FLAGS, cls.kind)
        check_own_env(entry.get("env", {}), _OWN_ENV)
        mode = entry.get("approval_mode", DEFAULT_APPROVAL_MODE)
        if mode not in APPROVAL_MODES:
            raise ValueError(
                f"'approval_mode' must be one of {', '.join(APPROVAL_MODES)}, not {mode!r}"
            )
        if not isinstance(entry.get("settings", {}), Mapping):
            raise ValueError("'settings' must be a JSON object (merged into .gemini/settings.json)")
        if entry.get("discover_models"):
            raise ValueError(
                "'discover_models': Gemini CLI does not list its models (name them in 'models')"
            )
        seeds = check_seed_files(entry, home="the run's HOME")
        if SETTINGS_FILE in seeds:
            raise ValueError(f"give {SETTINGS_FILE} as 'settings', not in 'seed_files'")

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """A key in its environment, or Google's login among its seed files."""
        given = first_set(run_environment(entry), LOGIN_VARIABLES)
        if given:
            return Login(READY, f"{given} is set.")
        seeds = set(entry.get("seed_files") or {})
        if OAUTH_FILE in seeds:
            return Login(READY, f"{OAUTH_FILE} is among its seed files.")
        if ".gemini/.env" in seeds or ".env" in seeds:
            return Login(UNKNOWN, "Its .env is seeded; it may give a key.")
        return Login(
            MISSING,
            "Gemini CLI will say 'When using Gemini API, you must specify the GEMINI_API_KEY "
            "environment variable': a run gets a home of its own, and no key (GEMINI_API_KEY, "
            f'GOOGLE_API_KEY) or login file is given to it. Add "seed_files": '
            f'{{"{OAUTH_FILE}": "~/{OAUTH_FILE}"}} or a key in "env" to the agent in '
            "REPLAYS_AGENTS_FILE.",
        )

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> GeminiAgent:
        return cls(
            name=name,
            model=model,
            binary=entry.get("binary", DEFAULT_BINARY),
            args=list(entry.get("args", [])),
            env=dict(entry.get("env", {})),
            approval_mode=entry.get("approval_mode", DEFAULT_APPROVAL_MODE),
            seed_files=dict(entry.get("seed_files", {})),
            settings_json=dict(entry.get("settings", {})),
        )

    # --- one run --------------------------------------------------------------------

    def invocation(self, context: RunContext) -> Invocation:
        flags = ["--approval-mode", self.approval_mode]
        if context.resume_session:
            flags += ["--resume", _session_argument(context.resume_session)]
        elif context.fork is not None:
            self._place_fork(context)
            flags += ["--resume", _session_argument(context.fork.session_id)]
        return self._run(context, flags)

    def _place_fork(self, context: RunContext) -> None:
        """The cut historical session where `gemini --resume` finds it: the run's own
        .gemini/tmp/<project>/chats/, the folder the agent runs in registered as that
        project (projects.json, .project_root)."""
        fork = context.fork
        assert fork is not None
        config = context.run_dir / HOME_DIR / CONFIG_DIR
        folder = str(fork.cwd)
        project = config / "tmp" / FORK_PROJECT
        try:
            write_private(
                config / "projects.json", json.dumps({"projects": {folder: FORK_PROJECT}}).encode()
            )
            write_private(project / ".project_root", folder.encode("utf-8", "surrogateescape"))
        except OSError as exc:
            raise AgentSetupError(
                f"The forked session's project cannot be made: {exc.strerror or exc}"
            ) from None
        fork.copy_to(project / "chats" / fork.file_name, tool="gemini")

    def session_id(self, context: RunContext) -> str:
        return self._events(context).session_id

    def _run(
        self, context: RunContext, flags: list[str], settings_json: dict[str, Any] | None = None
    ) -> Invocation:
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of gemini.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        home = self.prepare_home(context.run_dir, settings_json)
        binary = str(Path(self.binary).expanduser()) if os.sep in self.binary else self.binary
        argv = [
            binary,
            "-m",
            self.model,
            "--output-format",
            "stream-json",
            *flags,
            "--skip-trust",
            *self.args,
        ]
        return Invocation(
            argv=argv, env={**self.env, "HOME": str(home)}, stdin_path=context.request_file
        )

    def prepare_home(self, run_dir: Path, settings_json: dict[str, Any] | None = None) -> Path:
        """The run's own HOME, holding only the seed files and the settings."""
        home = run_dir / HOME_DIR
        (home / CONFIG_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
        copy_seed_files(home, self.seed_files, home="HOME")
        values = merged_json(self.settings_json, settings_json or {})
        auth = values.setdefault("security", {}).setdefault("auth", {})
        if isinstance(auth, dict) and "selectedType" not in auth:
            # A key's type, named: with GOOGLE_GEMINI_BASE_URL alone 0.61.0 takes a gateway
            # and refuses it. A seeded Google login is the other one it knows.
            oauth = OAUTH_FILE in self.seed_files and not first_set(
                {**os.environ, **self.env}, ("GEMINI_API_KEY",)
            )
            auth["selectedType"] = "oauth-personal" if oauth else "gemini-api-key"
        values.setdefault("privacy", {}).setdefault("usageStatisticsEnabled", False)
        values.setdefault("general", {}).setdefault("disableAutoUpdate", True)
        write_private(home / SETTINGS_FILE, json.dumps(values, indent=2).encode("utf-8"))
        return home

    def cleanup(self, context: RunContext) -> None:
        remove_seed_files(context.run_dir / HOME_DIR, self.seed_files)

    def _events(self, context: RunContext) -> StreamSummary:
        summary = StreamSummary()
        for line in log_lines(context):
            event = json_event(line)
            if event is not None:
                summary.add(event)
        return summary

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        try:
            events = self._events(context)
        except OSError as exc:
            return AgentOutcome(error=f"The agent's log could not be read: {exc}", failed=True)
        outcome = AgentOutcome(final_message=events.final_message)
        if events.stats is not None:
            outcome.usage, outcome.cost_usd = _usage_and_cost(events.stats)
        else:
            outcome.notes.append("Gemini CLI reported no token usage: tokens and cost are unknown.")
        absurd = absurd_usage(outcome)
        if absurd:
            message = f"Gemini CLI's result {absurd}: its figures were not kept."
            return AgentOutcome(
                final_message=outcome.final_message, failed=True, error=message, notes=[message]
            )
        if events.session_id:
            outcome.notes.append(f"Gemini CLI session {events.session_id}.")
        if events.status == "error" or events.status is None:
            outcome.failed = True
            outcome.error = events.error or (
                "Gemini CLI ended without a result."
                if events.status is None
                else "Gemini CLI reported an error."
            )
        if exit_code != 0 and not outcome.error:
            outcome.failed = True
            outcome.error = readable_tail(self.render_log(read_tail(context.log_path)))
        if outcome.failed or exit_code != 0:
            tail = read_tail(context.log_path, max_bytes=16 * 1024)
            outcome.setup = setup_problem(outcome.error, tail)
            if not events.error and outcome.setup is not None:
                outcome.error = outcome.setup.words
        fail_if_sandbox_refused(outcome, events.shell_outputs, tool="Gemini CLI")
        return outcome

    def render_log(self, text: str) -> str:
        return render_events(text)

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        schema = json.loads(task_json(task.schema))
        structured = {
            # No tool at all, and the answer the schema's JSON: the Gemini API's own
            # structured output, which Gemini CLI passes on from its settings.
            "tools": {"core": []},
            "modelConfigs": {
                "overrides": [
                    {
                        "match": {"model": self.model},
                        "modelConfig": {
                            "generateContentConfig": {
                                "responseMimeType": "application/json",
                                "responseJsonSchema": schema,
                            }
                        },
                    }
                ]
            },
        }
        return self._run(
            judge_context(task, self.model), ["--approval-mode", "default"], structured
        )

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome = self.outcome(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome, exit_code=exit_code, reply=answer_text(outcome.final_message)
        )


def _session_argument(session_id: str) -> str:
    """A session id as the value of --resume (never an option of gemini)."""
    if not session_id or session_id.startswith("-") or any(c.isspace() for c in session_id):
        raise AgentSetupError(f"{session_id[:60]!r} is not a session Gemini CLI can resume.")
    return session_id


# --- the event stream ----------------------------------------------------------------------


@dataclass
class StreamSummary:
    """What a run's stream-json events add up to, fed one event at a time."""

    session_id: str = ""
    status: str | None = None  # the result's: "success" | "error"; None without a result
    error: str = ""
    stats: dict[str, Any] | None = None
    # The assistant's text since the last tool call: its final answer.
    final_message: str = ""
    shell_outputs: list[str] = field(default_factory=list)
    _answer: list[str] = field(default_factory=list)
    _shell_calls: set[str] = field(default_factory=set)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "init" and not self.session_id:
            self.session_id = _text(event.get("session_id"))
        elif kind == "message" and event.get("role") == "assistant":
            piece = _text(event.get("content"))
            if event.get("delta") is True:
                self._answer.append(piece)
            else:
                self._answer = [piece]
            self.final_message = "".join(self._answer)
        elif kind == "tool_use":
            self._answer = []
            if event.get("tool_name") == "run_shell_command":
                self._shell_calls.add(_text(event.get("tool_id")))
        elif kind == "tool_result":
            self._answer = []
            if event.get("tool_id") in self._shell_calls:
                self.shell_outputs.append(
                    _text(event.get("output")) or _error_text(event.get("error"))
                )
        elif kind == "result":
            self.status = _text(event.get("status")) or None
            self.error = plain_text(_error_text(event.get("error")))
            stats = event.get("stats")
            self.stats = dict(stats) if isinstance(stats, Mapping) else None


def _usage_and_cost(stats: Mapping[str, Any]) -> tuple[TokenUsage, Decimal | None]:
    """The result's per-model stats as disjoint kinds, and their cost from the price table
    (None when a model's price is unknown). input_tokens counts the prompts whole (their
    cached part too); what total_tokens counts beyond prompts and answers (thoughts, and
    tool-use prompts, which Gemini CLI does not tell apart here) is output."""
    models = stats.get("models")
    per_model = models if isinstance(models, Mapping) and models else {"": stats}
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    usage, cost = TokenUsage(), Decimal(0)
    unknown = False
    for model, numbers in per_model.items():
        if not isinstance(numbers, Mapping):
            continue
        prompt, answers, cached, total = (
            _count(numbers.get(k))
            for k in ("input_tokens", "output_tokens", "cached", "total_tokens")
        )
        cached = min(cached, prompt)
        one = TokenUsage(
            input_tokens=prompt - cached,
            output_tokens=answers + max(0, total - prompt - answers),
            cache_read_tokens=cached,
        )
        usage = usage + one
        price = pricing.cost_usd(model, one, table) if model and one.total else Decimal(0)
        if price is None:
            unknown = True
        else:
            cost += price
    return usage, None if unknown else cost


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _error_text(error: object) -> str:
    if isinstance(error, Mapping):
        return _text(error.get("message"))
    return _text(error)


# Gemini CLI quotes the API's error as it came ("[API Error: {"error":{"code":401,...}}]")
# or its message alone, and names the error's class on stderr.
_CODE_RE = re.compile(r'"code"\s*:\s*(\d{3})')
_NO_AUTH_RE = re.compile(
    r"must specify the GEMINI_API_KEY|Please set an Auth method|Invalid auth method", re.IGNORECASE
)


def setup_problem(error: str, log: str) -> SetupProblem | None:
    """The setup problem a failed Gemini CLI run met, from what it said (its result's error
    and its stderr)."""
    said = f"{error}\n{log}"
    if _NO_AUTH_RE.search(said):
        line = next((ln for ln in log.splitlines() if _NO_AUTH_RE.search(ln)), error)
        return SetupProblem(SetupKind.NOT_LOGGED_IN, line.strip() or error)
    code = _CODE_RE.search(error)
    if code:
        return problems.from_http_status(int(code.group(1)), _api_message(error))
    lowered = said.lower()
    if "modelnotfounderror" in lowered or "is not found for api version" in lowered:
        return SetupProblem(SetupKind.UNKNOWN_MODEL, _api_message(error))
    if (
        "api key not valid" in lowered
        or "permission denied" in lowered
        or "unauthenticated" in lowered
    ):
        return SetupProblem(SetupKind.CREDENTIALS, _api_message(error))
    if "quota" in lowered:
        return SetupProblem(SetupKind.QUOTA, _api_message(error))
    if "resource_exhausted" in lowered or "rate limit" in lowered:
        return SetupProblem(SetupKind.RATE_LIMIT, _api_message(error))
    if "overloaded" in lowered or "unavailable" in lowered:
        return SetupProblem(SetupKind.PROVIDER, _api_message(error))
    if "econnrefused" in lowered or "fetch failed" in lowered or "enotfound" in lowered:
        return SetupProblem(SetupKind.NETWORK, _api_message(error))
    return None


def _api_message(error: str) -> str:
    """The API's own message out of Gemini CLI's "[API Error: ...]" wrapping."""
    found = re.search(r"\[API Error: (.*?)\](?:\n|$)", error, re.DOTALL)
    inner = found.group(1) if found else error
    if inner.startswith("{"):
        try:
            body = json.loads(inner)
        except ValueError:
            return inner
        if isinstance(body, Mapping) and isinstance(body.get("error"), Mapping):
            return _text(body["error"].get("message")) or inner
    return inner.strip()


# --- the log, readable ------------------------------------------------------------------------


def render_events(text: str) -> str:
    """Gemini CLI's stream-json events (with stderr lines between) as lines a person reads:
    the assistant's text, streamed in pieces, as one line."""
    renderer = _Renderer()
    render_event_stream(text, renderer)
    renderer.finish()
    return "\n".join(renderer.lines)


@dataclass
class _Renderer:
    lines: list[str] = field(default_factory=list)
    answer: list[str] = field(default_factory=list)

    def emit(self, line: str) -> None:
        self._flush()
        self._emit(line)

    def _emit(self, line: str) -> None:
        for part in plain_text(line).split("\n"):
            part = part.rstrip()
            if len(part) > LINE_CHARS:
                part = part[: LINE_CHARS - 1] + "…"
            self.lines.append(part)

    def _flush(self) -> None:
        if self.answer:
            self._emit(f"assistant: {first_lines(''.join(self.answer), MESSAGE_LINES)}")
            self.answer = []

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "message" and event.get("role") == "assistant":
            self.answer.append(_text(event.get("content")))
            return
        self._flush()
        if kind == "init":
            self._emit(
                f"gemini session {_text(event.get('session_id'))}: model {_text(event.get('model')) or '?'}"
            )
        elif kind == "tool_use":
            self._emit(_tool_line(_text(event.get("tool_name")), event.get("parameters")))
        elif kind == "tool_result":
            status = _text(event.get("status")) or "done"
            output = plain_text(
                _text(event.get("output")) or _error_text(event.get("error"))
            ).strip("\n")
            lines = output.split("\n") if output else ["(no output)"]
            self._emit(f"  {status}: {lines[0]}")
            for line in lines[1:OUTPUT_LINES]:
                self._emit(f"    {line}")
            if len(lines) > OUTPUT_LINES:
                self._emit(f"    … {len(lines) - OUTPUT_LINES} more lines")
        elif kind == "error":
            self._emit(f"warning: {_error_text(event) or _text(event.get('message'))}")
        elif kind == "result":
            status = _text(event.get("status")) or "ended"
            stats = event.get("stats") if isinstance(event.get("stats"), Mapping) else {}
            line = f"result: {status}"
            if stats:
                line += (
                    f", {_count(stats.get('input_tokens')):,} input ({_count(stats.get('cached')):,} cached), "
                    f"{_count(stats.get('output_tokens')):,} output tokens"
                )
            if status == "error":
                line += f": {first_lines(_error_text(event.get('error')), 3)}"
            self._emit(line)
        # message events of the user, and newer events, add nothing a reader needs.

    def finish(self) -> None:
        self._flush()


def _tool_line(name: str, parameters: object) -> str:
    arguments = parameters if isinstance(parameters, Mapping) else {}
    if name == "run_shell_command":
        return f"$ {first_lines(_text(arguments.get('command')), 3)}"
    path = _text(arguments.get("file_path") or arguments.get("dir_path"))
    if path:
        return f"{name} {path}"
    shown = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
    return f"{name} {shown[:200]}" if arguments else name


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
