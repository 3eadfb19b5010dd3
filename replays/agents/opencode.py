"""OpenCode as an agent: `opencode run --format json` in the run's worktree.

settings.REPLAYS_AGENTS entry (every key but "kind" and "models" optional):
    {"kind": "opencode", "label": "OpenCode", "binary": "opencode",
     "models": ["anthropic/claude-sonnet-4-5", "openai/gpt-5"], "args": [],
     "env": {"ANTHROPIC_API_KEY": "..."},
     "config": {"provider": {"anthropic": {"options": {"baseURL": "http://..."}}}},
     "auto_approve": true, "discover_models": false,
     "seed_files": {".local/share/opencode/auth.json": "~/.local/share/opencode/auth.json"}}

Models are OpenCode's own ids, `provider/model`. The process: `binary run --format json -m
MODEL --print-logs --log-level ERROR [--auto] *args` with the request on stdin (OpenCode
reads a prompt piped to it; in argv it would quote a prompt with spaces). Each run gets its
own HOME in the run folder (`opencode-home`), its data, config, cache and state folders
(XDG_*) inside it, holding only the seed files; `config` is OpenCode's configuration
(OPENCODE_CONFIG_CONTENT), with no auto-update, no sharing and no session title asked of a
small model (a call OpenCode's events never count). `--auto` approves what
OpenCode would ask about (the run is sandboxed and its worktree its own). Its database
(`opencode-home/.local/share/opencode/opencode.db`) stays with the run.

Sessions (the `fork` context and ranges turn by turn): `opencode run --session ID`
continues a session of its database, with `--fork` in a copy of it. A fork's cut
historical session (the document `opencode export` prints, the thread's folder rewritten to
the worktree) is first imported into the run's own database: `binary import FILE`, run before
the turn in the same sandbox (Invocation.before). Each later turn of a range continues the
session the first turn's events named.

With --format json OpenCode writes one JSON event a line on stdout, each with its
`sessionID` and a `part`: `step_start`, `text` (part.text), `tool_use` (part.tool,
part.state: status, input, output), `step_finish` (one per model call: part.tokens {input,
output, reasoning, cache {read, write}, total} and part.cost, OpenCode's own figure from
its model list), and `error` (error.name, error.data.message, error.data.statusCode). The
cost is OpenCode's; a call it priced at 0 (a model it has no price for) is priced from
the table. What `total` counts beyond the four kinds (reasoning) is output.

Judge mode: `opencode run` has no structured answer (OpenCode's server API has one, the
StructuredOutput tool of a message's `format`, which `run` does not offer), so the judge
is an agent of its own in `config`, `replays-judge`, with every tool turned off: `binary run
--format json -m MODEL --agent replays-judge` in the call's own empty folder, the prompt
(which asks for the JSON object alone) on stdin. Its last text is the answer; a code
block around it is taken off.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from replays import pricing
from replays.agents import problems
from replays.agents.base import (
    VERSION_TIMEOUT_SECONDS,
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

DEFAULT_BINARY = "opencode"
HOME_DIR = "opencode-home"
# A fork's cut session, imported before the turn.
FORK_FILE = "opencode-fork.json"
JUDGE_AGENT = "replays-judge"
AUTH_FILE = ".local/share/opencode/auth.json"
_OWN_FLAGS = {
    "-m": "the model comes from the model id",
    "--model": "the model comes from the model id",
    "--format": "the log is parsed as its JSON events",
    "-s": "the run continues the sessions its context and turns need",
    "--session": "the run continues the sessions its context and turns need",
    "-c": "the run continues the sessions its context and turns need",
    "--continue": "the run continues the sessions its context and turns need",
    "--fork": "the run forks the historical session when its context is fork",
    "--agent": "judge mode chooses its own agent",
    "--attach": "each run starts its own OpenCode",
    "--dir": "the run works in its worktree",
    "--auto": "use 'auto_approve'",
    "-i": "a run is not interactive",
    "--interactive": "a run is not interactive",
}
_OWN_ENV = {
    "HOME": "each run gets its own HOME (copy what it needs with 'seed_files')",
    "XDG_DATA_HOME": "each run keeps OpenCode's data in its own HOME",
    "XDG_CONFIG_HOME": "each run keeps OpenCode's data in its own HOME",
    "OPENCODE_CONFIG_CONTENT": "use 'config'",
    "OPENCODE_DB": "each run has its own database",
}
# The keys OpenCode reads for each provider (models.dev's lists, the common ones).
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "anthropic": ("ANTHROPIC_API_KEY",),
    "openai": ("OPENAI_API_KEY",),
    "google": ("GOOGLE_GENERATIVE_AI_API_KEY", "GEMINI_API_KEY"),
    "openrouter": ("OPENROUTER_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "opencode": ("OPENCODE_API_KEY",),
    "zai": ("ZHIPU_API_KEY",),
    "amazon-bedrock": ("AWS_BEARER_TOKEN_BEDROCK", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"),
}
OUTPUT_LINES = 5
MESSAGE_LINES = 12
LINE_CHARS = 300


class OpenCodeAgent(ProgramAgent):
    default_binary: ClassVar[str] = DEFAULT_BINARY
    kind: ClassVar[str] = "opencode"
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
        config: dict[str, Any] | None = None,
        auto_approve: bool = True,
        seed_files: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.binary = binary
        self.args = list(args or [])
        self.env = dict(env or {})
        self.config = dict(config or {})
        self.auto_approve = auto_approve
        self.seed_files = dict(seed_files or {})

    # --- configuration --------------------------------------------------------------

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        check_program_entry(entry, default_binary=DEFAULT_BINARY)
        check_own_flags(entry.get("args", []), _OWN_FLAGS, cls.kind)
        check_own_env(entry.get("env", {}), _OWN_ENV)
        if not isinstance(entry.get("config", {}), Mapping):
            raise ValueError("'config' must be a JSON object: OpenCode's configuration")
        if not isinstance(entry.get("auto_approve", True), bool):
            raise ValueError("'auto_approve' must be true or false")
        if not isinstance(entry.get("discover_models", False), bool):
            raise ValueError("'discover_models' must be true or false")
        check_seed_files(entry, home="the run's HOME")

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """Each of its models' provider's key: in its environment, its configuration, or its
        seeded auth.json."""
        env = run_environment(entry)
        if AUTH_FILE in set(entry.get("seed_files") or {}):
            return Login(READY, f"{AUTH_FILE} is among its seed files.")
        if env.get("OPENCODE_AUTH_CONTENT", "").strip():
            return Login(READY, "OPENCODE_AUTH_CONTENT is set.")
        providers = (
            entry.get("config", {}).get("provider")
            if isinstance(entry.get("config"), Mapping)
            else None
        )
        configured = providers if isinstance(providers, Mapping) else {}
        missing: list[str] = []
        for model in entry.get("models") or []:
            model_id = model.get("id") if isinstance(model, Mapping) else model
            provider = str(model_id).split("/", 1)[0] if isinstance(model_id, str) else ""
            options = (
                configured.get(provider, {}).get("options")
                if isinstance(configured.get(provider), Mapping)
                else None
            )
            if isinstance(options, Mapping) and options.get("apiKey"):
                continue
            keys = PROVIDER_KEYS.get(provider)
            if keys is None:
                return Login(
                    UNKNOWN, f"Its provider {provider or '?'} reads a login we cannot tell."
                )
            if not first_set(env, keys):
                missing.append(f"{' or '.join(keys)} (for {provider})")
        if missing:
            return Login(
                MISSING,
                "OpenCode will say the API key is missing: a run gets a home of its own, and "
                f'{"; ".join(dict.fromkeys(missing))} is not set. Add the key in "env", the '
                f'provider\'s apiKey in "config", or "seed_files": {{"{AUTH_FILE}": "~/{AUTH_FILE}"}} '
                "to the agent in REPLAYS_AGENTS_FILE.",
            )
        return Login(READY, "Each of its providers has a key.")

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> OpenCodeAgent:
        return cls(
            name=name,
            model=model,
            binary=entry.get("binary", DEFAULT_BINARY),
            args=list(entry.get("args", [])),
            env=dict(entry.get("env", {})),
            config=dict(entry.get("config", {})),
            auto_approve=entry.get("auto_approve", True),
            seed_files=dict(entry.get("seed_files", {})),
        )

    @classmethod
    def discovered_models(cls, entry: Mapping[str, Any]) -> list[str]:
        """The models OpenCode offers with this entry's logins (`opencode models`), when the
        entry asks for them (`discover_models`); [] when it cannot say."""
        if not entry.get("discover_models"):
            return []
        binary = entry.get("binary", DEFAULT_BINARY)
        config = json.dumps(_with_defaults(entry.get("config") or {}), sort_keys=True)
        return list(_listed_models(binary, config, tuple(sorted((entry.get("env") or {}).items()))))

    # --- one run --------------------------------------------------------------------

    def invocation(self, context: RunContext) -> Invocation:
        flags: list[str] = []
        before: tuple[list[str], ...] = ()
        if context.resume_session:
            flags = ["--session", _session_argument(context.resume_session)]
        elif context.fork is not None:
            path = context.run_dir / FORK_FILE
            context.fork.copy_to(path, tool="opencode")
            before = ([self._program(), "import", str(path)],)
            flags = ["--session", _session_argument(context.fork.session_id), "--fork"]
        if self.auto_approve:
            flags.append("--auto")
        invocation = self._run(context, flags, self.config)
        return Invocation(
            argv=invocation.argv,
            env=invocation.env,
            stdin_path=invocation.stdin_path,
            before=before,
        )

    def _program(self) -> str:
        return str(Path(self.binary).expanduser()) if os.sep in self.binary else self.binary

    def _run(self, context: RunContext, flags: list[str], config: Mapping[str, Any]) -> Invocation:
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of opencode.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        home = self.prepare_home(context.run_dir)
        argv = [
            self._program(), "run", "--format", "json", "-m", self.model,
            # Its own errors (a model it does not know) said on stderr, into the log.
            "--print-logs", "--log-level", "ERROR",
            *flags, *self.args,
        ]  # fmt: skip
        env = {
            **self.env,
            **_home_environment(home),
            "OPENCODE_CONFIG_CONTENT": json.dumps(_with_defaults(config)),
        }
        return Invocation(argv=argv, env=env, stdin_path=context.request_file)

    def prepare_home(self, run_dir: Path) -> Path:
        """The run's own HOME, holding only the seed files."""
        home = run_dir / HOME_DIR
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
        copy_seed_files(home, self.seed_files, home="HOME")
        return home

    def session_id(self, context: RunContext) -> str:
        return self._events(context).session_id

    def cleanup(self, context: RunContext) -> None:
        remove_seed_files(context.run_dir / HOME_DIR, self.seed_files)

    def _events(self, context: RunContext) -> EventSummary:
        summary = EventSummary()
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
        if events.steps:
            outcome.usage, outcome.cost_usd, priced = _usage_and_cost(events.steps, self.model)
            if priced:
                outcome.notes.append(
                    f"OpenCode priced {priced} of its model calls at $0 (a model it has no "
                    "price for): their cost is the price table's."
                )
        else:
            outcome.notes.append("OpenCode reported no model call: tokens and cost are unknown.")
        absurd = absurd_usage(outcome)
        if absurd:
            message = f"OpenCode's events {absurd}: its figures were not kept."
            return AgentOutcome(
                final_message=outcome.final_message, failed=True, error=message, notes=[message]
            )
        if events.session_id:
            outcome.notes.append(f"OpenCode session {events.session_id}.")
        tail = read_tail(context.log_path, max_bytes=16 * 1024)
        if events.error:
            outcome.failed = True
            outcome.error = events.error
        if exit_code != 0 and not outcome.error:
            outcome.failed = True
            outcome.error = readable_tail(self.render_log(tail))
        if outcome.failed or exit_code != 0:
            outcome.setup = setup_problem(events, tail)
            if outcome.setup is not None and events.error_name == "UnknownError":
                outcome.error = outcome.setup.words  # its own words say no more than "Unexpected"
        fail_if_sandbox_refused(outcome, events.shell_outputs, tool="OpenCode")
        return outcome

    def render_log(self, text: str) -> str:
        return render_events(text)

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        judge = {
            "agent": {
                JUDGE_AGENT: {
                    "mode": "primary",
                    "description": "Answers with one JSON object; uses no tool.",
                    "tools": {"*": False},
                    "permission": {"edit": "deny", "bash": "deny", "webfetch": "deny"},
                }
            }
        }
        return self._run(
            judge_context(task, self.model),
            ["--agent", JUDGE_AGENT],
            merged_json(self.config, judge),
        )

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome = self.outcome(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome, exit_code=exit_code, reply=answer_text(outcome.final_message)
        )


def _home_environment(home: Path) -> dict[str, str]:
    """HOME and every folder OpenCode keeps things in, inside the run's own home; no
    update, no download of language servers, no fetch of the model list (it has one)."""
    return {
        "HOME": str(home),
        "XDG_DATA_HOME": str(home / ".local" / "share"),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "XDG_STATE_HOME": str(home / ".local" / "state"),
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
    }


def _with_defaults(config: Mapping[str, Any]) -> dict[str, Any]:
    """The entry's configuration over ours: no update, no sharing, and no title asked of the
    small model (OpenCode's events never count that call: a run's cost would leave it out)."""
    defaults = {"autoupdate": False, "share": "disabled", "agent": {"title": {"disable": True}}}
    return merged_json(defaults, config)


def _session_argument(session_id: str) -> str:
    """A session id as the value of --session (never an option of opencode)."""
    if not re.match(r"^ses_[A-Za-z0-9]{1,100}$", session_id or ""):
        raise AgentSetupError(f"{session_id[:60]!r} is not a session OpenCode can continue.")
    return session_id


_MODEL_LINE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/\S+$")


@functools.lru_cache(maxsize=16)
def _listed_models(binary: str, config: str, env: tuple[tuple[str, str], ...]) -> tuple[str, ...]:
    """`opencode models` in a throwaway home with the entry's environment and configuration:
    the `provider/model` ids it lists (those of the providers it has a login for)."""
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        environment = {
            **run_environment({"env": dict(env)}),
            **_home_environment(home),
            "OPENCODE_CONFIG_CONTENT": config,
        }
        try:
            completed = subprocess.run(
                [binary, "models"], capture_output=True, text=True, env=environment, cwd=home,
                timeout=VERSION_TIMEOUT_SECONDS * 3, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return ()
    if completed.returncode != 0:
        return ()
    return tuple(
        line.strip() for line in completed.stdout.splitlines() if _MODEL_LINE_RE.match(line.strip())
    )


# --- the event stream ------------------------------------------------------------------------


@dataclass
class Step:
    """One model call (a step_finish part): its usage as written, and OpenCode's cost."""

    tokens: dict[str, Any]
    cost: Any


@dataclass
class EventSummary:
    session_id: str = ""
    steps: list[Step] = field(default_factory=list)
    final_message: str = ""
    error: str = ""
    error_name: str = ""
    status_code: int | None = None
    shell_outputs: list[str] = field(default_factory=list)
    _texts: list[str] = field(default_factory=list)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if not self.session_id:
            self.session_id = _text(event.get("sessionID"))
        part = event.get("part") if isinstance(event.get("part"), Mapping) else {}
        if kind == "step_start":
            self._texts = []
        elif kind == "text":
            self._texts.append(_text(part.get("text")))
            self.final_message = "\n".join(text for text in self._texts if text)
        elif kind == "tool_use":
            state = part.get("state") if isinstance(part.get("state"), Mapping) else {}
            if part.get("tool") == "bash":
                output = state.get("output")
                metadata = (
                    state.get("metadata") if isinstance(state.get("metadata"), Mapping) else {}
                )
                self.shell_outputs.append(
                    _text(output) or _text(metadata.get("output")) or _text(state.get("error"))
                )
        elif kind == "step_finish":
            tokens = part.get("tokens")
            if isinstance(tokens, Mapping):
                self.steps.append(Step(dict(tokens), part.get("cost")))
        elif kind == "error":
            error = event.get("error") if isinstance(event.get("error"), Mapping) else {}
            data = error.get("data") if isinstance(error.get("data"), Mapping) else {}
            self.error_name = _text(error.get("name"))
            self.error = plain_text(
                _text(data.get("message")) or self.error_name or "OpenCode reported an error."
            )
            code = data.get("statusCode")
            self.status_code = (
                code if isinstance(code, int) and not isinstance(code, bool) else None
            )


def _usage_and_cost(steps: list[Step], model: str) -> tuple[TokenUsage, Decimal | None, int]:
    """The steps' usage as disjoint kinds, their cost (OpenCode's figure; a step it priced
    at 0 from the table, None when that model's price is unknown), and how many steps the
    table priced."""
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    usage, cost, priced = TokenUsage(), Decimal(0), 0
    unknown = False
    for step in steps:
        one = _step_usage(step.tokens)
        usage = usage + one
        recorded = (
            step.cost
            if isinstance(step.cost, (int, float)) and not isinstance(step.cost, bool)
            else 0
        )
        if recorded > 0:
            cost += Decimal(repr(float(recorded)))
        elif one.total:
            priced += 1
            price = pricing.cost_usd(model, one, table)
            if price is None:
                unknown = True
            else:
                cost += price
    return usage, None if unknown else cost, priced


def _step_usage(tokens: Mapping[str, Any]) -> TokenUsage:
    cache = tokens.get("cache") if isinstance(tokens.get("cache"), Mapping) else {}
    counts = [_count(tokens.get(k)) for k in ("input", "output", "total")]
    read, write = _count(cache.get("read")), _count(cache.get("write"))
    input_tokens, output, total = counts
    rest = total - (input_tokens + output + read + write) if "total" in tokens else 0
    return TokenUsage(
        input_tokens=input_tokens,
        output_tokens=output + max(rest, 0),
        cache_read_tokens=read,
        cache_write_5m_tokens=write,
    )


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


_MODEL_NOT_FOUND_RE = re.compile(r"ProviderModelNotFoundError: ([^\n\"]+)")


def setup_problem(events: EventSummary, log: str) -> SetupProblem | None:
    """The setup problem a failed OpenCode run met: its typed error (ProviderAuthError: no
    key), the HTTP status of the API's answer, or what its own log (stderr) says."""
    if events.error_name == "ProviderAuthError":
        return SetupProblem(SetupKind.NOT_LOGGED_IN, events.error)
    if events.status_code is not None:
        return problems.from_http_status(events.status_code, events.error)
    found = _MODEL_NOT_FOUND_RE.search(log)
    if found:
        return SetupProblem(SetupKind.UNKNOWN_MODEL, found.group(1).strip())
    lowered = events.error.lower()
    if "cannot connect to api" in lowered or "unable to connect" in lowered:
        return SetupProblem(SetupKind.NETWORK, events.error)
    if "api key" in lowered and "missing" in lowered:
        return SetupProblem(SetupKind.NOT_LOGGED_IN, events.error)
    return None


# --- the log, readable ------------------------------------------------------------------------


def render_events(text: str) -> str:
    """OpenCode's JSON events (with stderr lines between) as lines a person reads."""
    return render_event_stream(text, _Renderer())


@dataclass
class _Renderer:
    lines: list[str] = field(default_factory=list)
    started: bool = False

    def emit(self, line: str) -> None:
        for part in plain_text(line).split("\n"):
            part = part.rstrip()
            if len(part) > LINE_CHARS:
                part = part[: LINE_CHARS - 1] + "…"
            self.lines.append(part)

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        part = event.get("part") if isinstance(event.get("part"), Mapping) else {}
        if not self.started and event.get("sessionID"):
            self.started = True
            self.emit(f"opencode session {_text(event.get('sessionID'))}")
        if kind == "text":
            self.emit(f"assistant: {first_lines(_text(part.get('text')), MESSAGE_LINES)}")
        elif kind == "reasoning":
            self.emit(f"thinking: {first_lines(_text(part.get('text')), 2)}")
        elif kind == "tool_use":
            state = part.get("state") if isinstance(part.get("state"), Mapping) else {}
            arguments = state.get("input") if isinstance(state.get("input"), Mapping) else {}
            name = _text(part.get("tool")) or "tool"
            if name == "bash":
                self.emit(f"$ {first_lines(_text(arguments.get('command')), 3)}")
            else:
                path = _text(arguments.get("filePath"))
                self.emit(f"{name} {path}" if path else name)
            output = plain_text(_text(state.get("output")) or _text(state.get("error"))).strip("\n")
            lines = output.split("\n") if output else ["(no output)"]
            self.emit(f"  {_text(state.get('status')) or 'done'}: {lines[0]}")
            for line in lines[1:OUTPUT_LINES]:
                self.emit(f"    {line}")
            if len(lines) > OUTPUT_LINES:
                self.emit(f"    … {len(lines) - OUTPUT_LINES} more lines")
        elif kind == "step_finish":
            tokens = part.get("tokens") if isinstance(part.get("tokens"), Mapping) else {}
            usage = _step_usage(tokens)
            cost = part.get("cost")
            shown = (
                f", ${cost:.6f}"
                if isinstance(cost, (int, float)) and not isinstance(cost, bool)
                else ""
            )
            self.emit(
                f"step done ({_text(part.get('reason')) or '?'}): {usage.input_size:,} input "
                f"({usage.cache_read_tokens:,} cached), {usage.output_tokens:,} output tokens{shown}"
            )
        elif kind == "error":
            error = event.get("error") if isinstance(event.get("error"), Mapping) else {}
            data = error.get("data") if isinstance(error.get("data"), Mapping) else {}
            self.emit(f"error: {_text(error.get('name'))}: {_text(data.get('message'))}")


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
