"""pi (npm @mariozechner/pi-coding-agent) as an agent: `pi -p --mode json` in the worktree.

settings.REPLAYS_AGENTS entry (every key but "kind" and "models" optional):
    {"kind": "pi", "label": "pi", "binary": "pi",
     "models": ["anthropic/claude-sonnet-4-5", "openai/gpt-5"], "args": ["--thinking", "low"],
     "env": {"ANTHROPIC_API_KEY": "..."},
     "models_json": {"providers": {"openai": {"baseUrl": "http://..."}}},
     "discover_models": false,
     "seed_files": {".pi/agent/auth.json": "~/.pi/agent/auth.json"}}

Models are pi's `provider/model`. The process: `binary -p --mode json --model MODEL *args`
with the request on stdin (pi reads a prompt piped to it). Each run gets its own HOME in the
run folder (`pi-home`), pi's folder `.pi/agent` in it (PI_CODING_AGENT_DIR) holding only
the seed files and `models.json` (`models_json`: custom providers, a provider's baseUrl);
no startup network operations (PI_OFFLINE), no telemetry. The session pi writes there
(`.pi/agent/sessions/--<folder>--/<time>_<id>.jsonl`) stays with the run.

Sessions (the `fork` context and ranges turn by turn): `pi --fork FILE` starts a new
session from a session file, `pi --session ID` continues one of its own. A fork's cut
historical session is written to the run folder and forked; each later turn of a range
continues the session the first turn's header named.

With --mode json pi writes the session's header (`type: session`, id, cwd) and then one
event a line: `message_start` / `message_update` / `message_end` (message: the user's,
then each assistant message, one per model call, with its `usage` {input, output,
cacheRead, cacheWrite, totalTokens, cost {total}} and `stopReason` stop | toolUse | length
| error | aborted with `errorMessage`), `tool_execution_start` / `_end` (toolName, result,
isError), `turn_end`, `agent_end`. The cost is pi's own (from its model table; 0 for a
model it has no price for, priced here from the table instead); the four counts are
disjoint, and what totalTokens counts beyond them is output. pi ends with 0 even when the
model call failed: the last assistant message's stopReason says so.

Judge mode: pi has no structured answer, and its JSON mode is the event stream: `binary -p
--mode json --model MODEL --no-tools` in the call's own empty folder, the prompt (which
asks for the JSON object alone) on stdin. The last assistant text is the answer; a code
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
    plain_text,
    read_tail,
    readable_tail,
    remove_seed_files,
    render_event_stream,
    run_environment,
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

DEFAULT_BINARY = "pi"
HOME_DIR = "pi-home"
AGENT_DIR = ".pi/agent"
MODELS_FILE = ".pi/agent/models.json"
AUTH_FILE = ".pi/agent/auth.json"
# A fork's cut session file, in the run folder.
FORK_DIR = "pi-fork"
_OWN_FLAGS = {
    "-p": "it always runs with -p",
    "--print": "it always runs with -p",
    "--mode": "the log is parsed as its JSON events",
    "--model": "the model comes from the model id",
    "--provider": "the model id names the provider",
    "--models": "the model comes from the model id",
    "-c": "the run continues the sessions its context and turns need",
    "--continue": "the run continues the sessions its context and turns need",
    "-r": "the run continues the sessions its context and turns need",
    "--resume": "the run continues the sessions its context and turns need",
    "--session": "the run continues the sessions its context and turns need",
    "--fork": "the run forks the historical session when its context is fork",
    "--session-dir": "each run keeps its sessions in its own home",
    "--no-session": "the run's turns continue its session",
    "--api-key": "give the key in 'env' (it would show in the process list)",
}
_OWN_ENV = {
    "HOME": "each run gets its own HOME (copy what it needs with 'seed_files')",
    "PI_CODING_AGENT_DIR": "each run gets its own (copy what it needs with 'seed_files')",
    "PI_CODING_AGENT_SESSION_DIR": "each run keeps its sessions in its own home",
}
# The keys pi reads for each provider (its --help lists them).
PROVIDER_KEYS: dict[str, tuple[str, ...]] = {
    "anthropic": ("ANTHROPIC_API_KEY", "ANTHROPIC_OAUTH_TOKEN"),
    "openai": ("OPENAI_API_KEY",),
    "azure-openai-responses": ("AZURE_OPENAI_API_KEY",),
    "google": ("GEMINI_API_KEY",),
    "deepseek": ("DEEPSEEK_API_KEY",),
    "groq": ("GROQ_API_KEY",),
    "cerebras": ("CEREBRAS_API_KEY",),
    "xai": ("XAI_API_KEY",),
    "fireworks": ("FIREWORKS_API_KEY",),
    "openrouter": ("OPENROUTER_API_KEY",),
    "vercel-ai-gateway": ("AI_GATEWAY_API_KEY",),
    "zai": ("ZAI_API_KEY",),
    "mistral": ("MISTRAL_API_KEY",),
    "minimax": ("MINIMAX_API_KEY",),
    "moonshotai": ("MOONSHOT_API_KEY",),
    "opencode": ("OPENCODE_API_KEY",),
    "kimi-coding": ("KIMI_API_KEY",),
    "amazon-bedrock": ("AWS_BEARER_TOKEN_BEDROCK", "AWS_ACCESS_KEY_ID", "AWS_PROFILE"),
}
OUTPUT_LINES = 5
MESSAGE_LINES = 12
LINE_CHARS = 300


class PiAgent(ProgramAgent):
    default_binary: ClassVar[str] = DEFAULT_BINARY
    kind: ClassVar[str] = "pi"
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
        models_json: dict[str, Any] | None = None,
        seed_files: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.binary = binary
        self.args = list(args or [])
        self.env = dict(env or {})
        self.models_json = models_json
        self.seed_files = dict(seed_files or {})

    # --- configuration --------------------------------------------------------------

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        check_program_entry(entry, default_binary=DEFAULT_BINARY)
        check_own_flags(entry.get("args", []), _OWN_FLAGS, cls.kind)
        check_own_env(entry.get("env", {}), _OWN_ENV)
        models_json = entry.get("models_json")
        if models_json is not None and not isinstance(models_json, Mapping):
            raise ValueError("'models_json' must be a JSON object: pi's models.json")
        if not isinstance(entry.get("discover_models", False), bool):
            raise ValueError("'discover_models' must be true or false")
        seeds = check_seed_files(entry, home="the run's HOME")
        if models_json is not None and MODELS_FILE in seeds:
            raise ValueError(f"give {MODELS_FILE} either in 'seed_files' or as 'models_json'")

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """Each of its models' provider's key in its environment, a seeded auth.json, or a
        key its models.json gives."""
        env = run_environment(entry)
        seeds = set(entry.get("seed_files") or {})
        if AUTH_FILE in seeds:
            return Login(READY, f"{AUTH_FILE} is among its seed files.")
        models_json = (
            entry.get("models_json") if isinstance(entry.get("models_json"), Mapping) else {}
        )
        providers = (
            models_json.get("providers")
            if isinstance(models_json.get("providers"), Mapping)
            else {}
        )
        missing: list[str] = []
        for model in entry.get("models") or []:
            model_id = model.get("id") if isinstance(model, Mapping) else model
            provider = (
                str(model_id).split("/", 1)[0]
                if isinstance(model_id, str) and "/" in model_id
                else ""
            )
            given = providers.get(provider) if isinstance(providers.get(provider), Mapping) else {}
            if given.get("apiKey"):
                continue
            keys = PROVIDER_KEYS.get(provider)
            if keys is None:
                return Login(
                    UNKNOWN,
                    f"Its provider {provider or '(none named)'} reads a login we cannot tell.",
                )
            if not first_set(env, keys):
                missing.append(f"{' or '.join(keys)} (for {provider})")
        if missing:
            return Login(
                MISSING,
                f"pi will say 'No API key found': a run gets a home of its own, and "
                f'{"; ".join(dict.fromkeys(missing))} is not set. Add the key in "env" or '
                f'"seed_files": {{"{AUTH_FILE}": "~/{AUTH_FILE}"}} to the agent in REPLAYS_AGENTS_FILE.',
            )
        return Login(READY, "Each of its providers has a key.")

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> PiAgent:
        models_json = entry.get("models_json")
        return cls(
            name=name,
            model=model,
            binary=entry.get("binary", DEFAULT_BINARY),
            args=list(entry.get("args", [])),
            env=dict(entry.get("env", {})),
            models_json=dict(models_json) if isinstance(models_json, Mapping) else None,
            seed_files=dict(entry.get("seed_files", {})),
        )

    @classmethod
    def discovered_models(cls, entry: Mapping[str, Any]) -> list[str]:
        """The models pi offers with this entry's logins (`pi --list-models`), when the entry
        asks for them (`discover_models`); [] when it cannot say."""
        if not entry.get("discover_models"):
            return []
        models_json = json.dumps(entry.get("models_json") or {}, sort_keys=True)
        binary = entry.get("binary", DEFAULT_BINARY)
        return list(
            _listed_models(binary, models_json, tuple(sorted((entry.get("env") or {}).items())))
        )

    # --- one run --------------------------------------------------------------------

    def invocation(self, context: RunContext) -> Invocation:
        flags: list[str] = []
        if context.resume_session:
            flags = ["--session", _session_argument(context.resume_session)]
        elif context.fork is not None:
            path = context.run_dir / FORK_DIR / context.fork.file_name
            context.fork.copy_to(path, tool="pi")
            flags = ["--fork", str(path)]
        return self._run(context, flags)

    def _run(self, context: RunContext, flags: list[str]) -> Invocation:
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of pi.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        home = self.prepare_home(context.run_dir)
        binary = str(Path(self.binary).expanduser()) if os.sep in self.binary else self.binary
        argv = [binary, "-p", "--mode", "json", "--model", self.model, *flags, *self.args]
        return Invocation(
            argv=argv, env={**self.env, **_home_environment(home)}, stdin_path=context.request_file
        )

    def prepare_home(self, run_dir: Path) -> Path:
        """The run's own HOME: pi's folder holding only the seed files and models.json."""
        home = run_dir / HOME_DIR
        (home / AGENT_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
        copy_seed_files(home, self.seed_files, home="HOME")
        if self.models_json is not None:
            write_private(
                home / MODELS_FILE, json.dumps(self.models_json, indent=2).encode("utf-8")
            )
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
        if events.calls:
            outcome.usage, outcome.cost_usd, priced = _usage_and_cost(events.calls)
            if priced:
                outcome.notes.append(
                    f"pi recorded no cost for {priced} of its model calls: their cost is the "
                    "price table's."
                )
        else:
            outcome.notes.append("pi reported no model call: tokens and cost are unknown.")
        absurd = absurd_usage(outcome)
        if absurd:
            message = f"pi's events {absurd}: its figures were not kept."
            return AgentOutcome(
                final_message=outcome.final_message, failed=True, error=message, notes=[message]
            )
        if events.session_id:
            outcome.notes.append(f"pi session {events.session_id}.")
        tail = read_tail(context.log_path, max_bytes=16 * 1024)
        if events.error:
            outcome.failed = True
            outcome.error = events.error
        elif not events.ended:
            outcome.failed = True
            outcome.error = readable_tail(self.render_log(tail)) or "pi ended without finishing."
        if exit_code != 0 and not outcome.error:
            outcome.failed = True
            outcome.error = readable_tail(self.render_log(tail))
        if outcome.failed or exit_code != 0:
            outcome.setup = setup_problem(outcome.error, tail)
        fail_if_sandbox_refused(outcome, events.shell_outputs, tool="pi")
        return outcome

    def render_log(self, text: str) -> str:
        return render_events(text)

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        return self._run(judge_context(task, self.model), ["--no-tools"])

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome = self.outcome(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome, exit_code=exit_code, reply=answer_text(outcome.final_message)
        )


def _home_environment(home: Path) -> dict[str, str]:
    return {
        "HOME": str(home),
        "PI_CODING_AGENT_DIR": str(home / AGENT_DIR),
        "PI_OFFLINE": "1",
        "PI_TELEMETRY": "0",
    }


def _session_argument(session_id: str) -> str:
    """A session id as the value of --session (never an option, never a path of pi's)."""
    if not re.match(r"^[0-9A-Za-z][0-9A-Za-z-]{7,99}$", session_id or ""):
        raise AgentSetupError(f"{session_id[:60]!r} is not a session pi can continue.")
    return session_id


_MODEL_ROW_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9_.-]*)\s+(\S+)\s+\d")


@functools.lru_cache(maxsize=16)
def _listed_models(
    binary: str, models_json: str, env: tuple[tuple[str, str], ...]
) -> tuple[str, ...]:
    """`pi --list-models` in a throwaway home with the entry's environment and models.json:
    the `provider/model` ids it lists (those of the providers it has a key for)."""
    with tempfile.TemporaryDirectory() as folder:
        home = Path(folder)
        (home / AGENT_DIR).mkdir(parents=True)
        if models_json != "{}":
            (home / MODELS_FILE).write_text(models_json)
        environment = {**run_environment({"env": dict(env)}), **_home_environment(home)}
        try:
            completed = subprocess.run(
                [binary, "--list-models"], capture_output=True, text=True, env=environment, cwd=home,
                timeout=VERSION_TIMEOUT_SECONDS * 3, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return ()
    if completed.returncode != 0:
        return ()
    found = []
    # pi 0.73.1 prints the table on stderr.
    for line in (completed.stdout or completed.stderr).splitlines()[1:]:  # under the header
        match = _MODEL_ROW_RE.match(line.strip())
        if match:
            found.append(f"{match.group(1)}/{match.group(2)}")
    return tuple(found)


# --- the event stream ------------------------------------------------------------------------


@dataclass
class Call:
    """One model call: its usage as pi wrote it, and the model (as its provider names it)."""

    usage: dict[str, Any]
    model: str


@dataclass
class EventSummary:
    session_id: str = ""
    calls: list[Call] = field(default_factory=list)
    final_message: str = ""
    error: str = ""
    ended: bool = False  # agent_end came
    shell_outputs: list[str] = field(default_factory=list)
    _started: dict[str, float] = field(default_factory=dict)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session" and not self.session_id:
            self.session_id = _text(event.get("id"))
        elif kind == "message_end":
            message = event.get("message") if isinstance(event.get("message"), Mapping) else {}
            if message.get("role") == "assistant":
                self._assistant(message)
        elif kind == "tool_execution_end" and event.get("toolName") == "bash":
            self.shell_outputs.append(_result_text(event.get("result")))
        elif kind == "agent_end":
            self.ended = True

    def _assistant(self, message: Mapping[str, Any]) -> None:
        usage = message.get("usage")
        if isinstance(usage, Mapping):
            self.calls.append(Call(dict(usage), _text(message.get("model"))))
        texts = [
            _text(block.get("text"))
            for block in message.get("content") or []
            if isinstance(block, Mapping) and block.get("type") == "text"
        ]
        if any(texts):
            self.final_message = "\n".join(text for text in texts if text)
        reason = message.get("stopReason")
        if reason in ("error", "aborted"):
            self.error = plain_text(
                _text(message.get("errorMessage")) or f"pi's model call ended: {reason}."
            )
        elif reason in ("stop", "toolUse", "length"):
            self.error = ""  # a later call went through


def _result_text(result: object) -> str:
    if isinstance(result, Mapping):
        content = result.get("content")
        if isinstance(content, list):
            return "\n".join(_text(b.get("text")) for b in content if isinstance(b, Mapping))
    return _text(result)


def _usage_and_cost(calls: list[Call]) -> tuple[TokenUsage, Decimal | None, int]:
    """The calls' usage as disjoint kinds and their cost (pi's own figure; one pi recorded
    as 0 or not at all from the price table, None when that model's price is unknown), and
    how many the table priced."""
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    usage, cost, priced = TokenUsage(), Decimal(0), 0
    unknown = False
    for call in calls:
        numbers = call.usage
        input_tokens, output, read, write, total = (
            _count(numbers.get(key))
            for key in ("input", "output", "cacheRead", "cacheWrite", "totalTokens")
        )
        one = TokenUsage(
            input_tokens=input_tokens,
            output_tokens=output + max(0, total - (input_tokens + output + read + write)),
            cache_read_tokens=read,
            cache_write_5m_tokens=write,
        )
        usage = usage + one
        recorded = (
            numbers.get("cost", {}).get("total")
            if isinstance(numbers.get("cost"), Mapping)
            else None
        )
        if isinstance(recorded, (int, float)) and not isinstance(recorded, bool) and recorded > 0:
            cost += Decimal(repr(float(recorded)))
        elif one.total:
            priced += 1
            price = pricing.cost_usd(call.model, one, table) if call.model else None
            if price is None:
                unknown = True
            else:
                cost += price
    return usage, None if unknown else cost, priced


def _count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


# pi starts an API error's message with its HTTP status ("401 Incorrect API key provided").
_STATUS_RE = re.compile(r"^\s*(\d{3})\b")
_NO_KEY_RE = re.compile(r"No API key found for ([\w-]+(?:\.[\w-]+)*)")


def setup_problem(error: str, log: str) -> SetupProblem | None:
    """The setup problem a failed pi run met, from what it said."""
    found = _NO_KEY_RE.search(f"{error}\n{log}")
    if found:
        return SetupProblem(SetupKind.NOT_LOGGED_IN, found.group(0) + ".")
    status = _STATUS_RE.match(error)
    if status:
        return problems.from_http_status(int(status.group(1)), error)
    lowered = error.lower()
    if "model" in lowered and "not found" in lowered:
        return SetupProblem(SetupKind.UNKNOWN_MODEL, error)
    if "econnrefused" in lowered or "fetch failed" in lowered or "connection error" in lowered:
        return SetupProblem(SetupKind.NETWORK, error)
    return None


# --- the log, readable ------------------------------------------------------------------------


def render_events(text: str) -> str:
    """pi's JSON events (with stderr lines between) as lines a person reads."""
    return render_event_stream(text, _Renderer())


@dataclass
class _Renderer:
    lines: list[str] = field(default_factory=list)

    def emit(self, line: str) -> None:
        for part in plain_text(line).split("\n"):
            part = part.rstrip()
            if len(part) > LINE_CHARS:
                part = part[: LINE_CHARS - 1] + "…"
            self.lines.append(part)

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind == "session":
            self.emit(f"pi session {_text(event.get('id'))}")
        elif kind == "message_end":
            message = event.get("message") if isinstance(event.get("message"), Mapping) else {}
            if message.get("role") == "assistant":
                self.assistant(message)
        elif kind == "tool_execution_start":
            arguments = event.get("args") if isinstance(event.get("args"), Mapping) else {}
            name = _text(event.get("toolName")) or "tool"
            if name == "bash":
                self.emit(f"$ {first_lines(_text(arguments.get('command')), 3)}")
            else:
                path = _text(arguments.get("path"))
                self.emit(f"{name} {path}" if path else name)
        elif kind == "tool_execution_end":
            output = plain_text(_result_text(event.get("result"))).strip("\n")
            lines = output.split("\n") if output else ["(no output)"]
            label = "error" if event.get("isError") is True else "ok"
            self.emit(f"  {label}: {lines[0]}")
            for line in lines[1:OUTPUT_LINES]:
                self.emit(f"    {line}")
            if len(lines) > OUTPUT_LINES:
                self.emit(f"    … {len(lines) - OUTPUT_LINES} more lines")
        elif kind == "auto_retry_start":
            self.emit(
                f"retry {event.get('attempt', '?')}/{event.get('maxAttempts', '?')}: {_text(event.get('errorMessage'))}"
            )
        elif kind == "agent_end":
            self.emit("done")

    def assistant(self, message: Mapping[str, Any]) -> None:
        for block in message.get("content") or []:
            if isinstance(block, Mapping) and block.get("type") == "text":
                self.emit(f"assistant: {first_lines(_text(block.get('text')), MESSAGE_LINES)}")
            elif isinstance(block, Mapping) and block.get("type") == "thinking":
                self.emit(f"thinking: {first_lines(_text(block.get('thinking')), 2)}")
        usage = message.get("usage") if isinstance(message.get("usage"), Mapping) else {}
        cost = (
            usage.get("cost", {}).get("total") if isinstance(usage.get("cost"), Mapping) else None
        )
        shown = (
            f", ${cost:.6f}"
            if isinstance(cost, (int, float)) and not isinstance(cost, bool)
            else ""
        )
        reason = _text(message.get("stopReason"))
        line = (
            f"model call ({reason or '?'}): {_count(usage.get('input')):,} input, "
            f"{_count(usage.get('cacheRead')):,} cached, {_count(usage.get('output')):,} output tokens{shown}"
        )
        if reason in ("error", "aborted"):
            line += f": {_text(message.get('errorMessage'))}"
        self.emit(line)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
