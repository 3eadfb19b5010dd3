"""Claude Code as an agent: `claude -p --output-format stream-json` in the run's worktree.

settings.REPLAYS_AGENTS entry (every key but "kind" and "models" optional):
    {"kind": "claude_code", "label": "Claude Code", "binary": "claude",
     "models": ["claude-sonnet-4-5"], "args": ["--effort", "high"],
     "env": {"ANTHROPIC_BASE_URL": "http://127.0.0.1:8080", "ANTHROPIC_API_KEY": "..."},
     "permission_mode": "acceptEdits", "max_turns": 50, "max_budget_usd": 5,
     "seed_files": {".claude/.credentials.json": "~/.claude/.credentials.json"}}

The process: `binary -p --output-format stream-json --verbose --model MODEL
--permission-mode MODE [--max-turns N] [--max-budget-usd X] *args` with the request
on stdin (never in argv, never through a shell). Each run gets its own HOME in the
run folder (`claude-home`, CLAUDE_CONFIG_DIR its `.claude`), holding only the seed
files: runs never read or add to the user's ~/.claude, and the session transcript
Claude Code writes (`claude-home/.claude/projects/<slug>/<session>.jsonl`) stays with
the run. Seed paths are relative to that HOME; since CLAUDE_CONFIG_DIR is HOME/.claude,
Claude reads everything there, its `.claude.json` included (seed it as `.claude/.claude.json`).
"acceptEdits" lets Claude edit files in the worktree and run simple commands (in 2.1.197:
echo, ls, sleep, redirections into the worktree; not python) and refuses the rest;
"bypassPermissions" lets it run anything (as root Claude then needs IS_SANDBOX=1,
which is set unless the entry's env says otherwise).

Sessions (the `fork` context and ranges turn by turn): a fork's first turn adds `--resume
SESSION --fork-session`, the cut historical transcript copied first to
`claude-home/.claude/projects/<slug of the folder claude runs in>/SESSION.jsonl` (Claude
looks there, by the file's name); each later turn of a range adds `--resume ID`, the
session the first turn's result line named. Each result line counts its own process
(2.1.3xx: its `model_usage_since_last_result`; its modelUsage and total_cost_usd are then
the whole session's).

With stream-json Claude writes one JSON event a line on stdout; the run's log also
holds its stderr, so lines that are not JSON are kept as plain text. The last event
is `result`: the final text, is_error, the main conversation's usage (sub-agents appear
only in its per-model modelUsage, added here), Claude's own cost for everything
(total_cost_usd) and the time spent waiting on the API (duration_api_ms).

Judge mode (an evaluator's one structured answer), in the call's own empty FOLDER with
HOME at FOLDER/claude-home as for a run: `binary -p --output-format stream-json
--verbose --model MODEL --json-schema SCHEMA --tools "" --strict-mcp-config
--permission-mode dontAsk [--max-budget-usd X] *args`, SCHEMA the compact JSON of the
answer's schema, the prompt on stdin. Claude Code (2.1.197) then offers the model one
tool, StructuredOutput: `--tools ""` takes away every built-in tool but that one,
--strict-mcp-config every MCP server a seeded configuration names, and dontAsk refuses
any tool not approved beforehand. The answer is one StructuredOutput call (the model
is asked once more when it answers in text; an input that does not match the schema is
refused and retried, up to 5 attempts, then the result is
error_max_structured_output_retries), so no --max-turns is given. The result line then
carries the object as `structured_output` (and as JSON text in `result`).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterator, Mapping
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
    read_untrusted,
    readable_tail,
    remove_seed_files,
    render_event_stream,
    run_environment,
    task_json,
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
from replays.transcripts.base import TokenUsage, TranscriptError
from replays.transcripts.claude_code import anthropic_usage, parse_claude_code

DEFAULT_BINARY = "claude"
DEFAULT_PERMISSION_MODE = "acceptEdits"
# What `claude --help` (2.1.197) accepts for --permission-mode.
PERMISSION_MODES = ("acceptEdits", "auto", "bypassPermissions", "default", "dontAsk", "plan")
# The run's own HOME, inside the run folder; Claude's configuration folder inside it.
HOME_DIR = "claude-home"
CONFIG_DIR = ".claude"
# Flags this kind sets itself: 'args' giving them again would break the parsing or
# contradict the entry's own keys.
_OWN_FLAGS = {
    "-p": "it always runs with -p",
    "--print": "it always runs with -p",
    "--output-format": "the log is parsed as stream-json",
    "--input-format": "the request is given as text on stdin",
    "--model": "the model comes from the model id",
    "--permission-mode": "use 'permission_mode'",
    "--max-turns": "use 'max_turns'",
    "--max-budget-usd": "use 'max_budget_usd'",
    "--resume": "the run resumes the sessions its context and turns need",
    "-r": "the run resumes the sessions its context and turns need",
    "--continue": "the run resumes the sessions its context and turns need",
    "-c": "the run resumes the sessions its context and turns need",
    "--fork-session": "the run forks the historical session when its context is fork",
    "--session-id": "each turn's session is Claude's own (or the one it resumes)",
}
# Flags of 'args' that would hand an evaluator tools or another schema: judge mode
# offers it StructuredOutput alone (repeated, --tools adds to the list instead of replacing it).
_JUDGE_CONFLICTS = {
    "--tools": "it would add tools",
    "--mcp-config": "it would add MCP servers' tools",
    "--json-schema": "judge mode gives the answer's schema",
}
# Judge mode's permission mode: nothing that needs asking runs.
JUDGE_PERMISSION_MODE = "dontAsk"
# Environment the run's isolation depends on.
_OWN_ENV = {
    "HOME": "each run gets its own HOME (copy what it needs with 'seed_files')",
    "CLAUDE_CONFIG_DIR": "each run gets its own (copy what it needs with 'seed_files')",
}
# Claude Code names a project folder after its path; a longer name is cut and hashed.
_CLAUDE_SLUG_CHARS = 200
# What the log tail shows of a tool's output, of an assistant message, and of any line.
OUTPUT_LINES = 5
MESSAGE_LINES = 12
LINE_CHARS = 300
# Tools whose input names a file: shown as `Edit textstats/core.py`.
_FILE_TOOLS = {
    "Read": "file_path",
    "Edit": "file_path",
    "MultiEdit": "file_path",
    "Write": "file_path",
    "NotebookEdit": "notebook_path",
}
# Tools shown with one argument: `Grep: line_count`.
_ONE_ARGUMENT_TOOLS = {
    "Glob": "pattern",
    "Grep": "pattern",
    "Task": "description",
    "Agent": "description",
    "WebFetch": "url",
    "WebSearch": "query",
    "Skill": "skill",
}


class ClaudeCodeAgent(ProgramAgent):
    default_binary: ClassVar[str] = DEFAULT_BINARY
    kind: ClassVar[str] = "claude_code"
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
        permission_mode: str = DEFAULT_PERMISSION_MODE,
        max_turns: int | None = None,
        max_budget_usd: float | int | None = None,
        seed_files: dict[str, str] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.binary = binary
        self.args = list(args or [])
        self.env = dict(env or {})
        self.permission_mode = permission_mode
        self.max_turns = max_turns
        self.max_budget_usd = max_budget_usd
        self.seed_files = dict(seed_files or {})

    # --- configuration --------------------------------------------------------------

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        check_program_entry(entry, default_binary=DEFAULT_BINARY)
        for arg in entry.get("args", []):
            flag = arg.split("=", 1)[0]
            if flag in _OWN_FLAGS:
                raise ValueError(
                    f"'args' must not give {flag}: the claude_code kind sets it "
                    f"({_OWN_FLAGS[flag]})"
                )
        for name, why in _OWN_ENV.items():
            if name in entry.get("env", {}):
                raise ValueError(f"'env' must not set {name}: {why}")
        mode = entry.get("permission_mode", DEFAULT_PERMISSION_MODE)
        if mode not in PERMISSION_MODES:
            raise ValueError(
                f"'permission_mode' must be one of {', '.join(PERMISSION_MODES)}, not {mode!r}"
            )
        max_turns = entry.get("max_turns")
        if max_turns is not None and (
            isinstance(max_turns, bool) or not isinstance(max_turns, int) or max_turns < 1
        ):
            raise ValueError(f"'max_turns' must be a whole number of at least 1, not {max_turns!r}")
        budget = entry.get("max_budget_usd")
        if budget is not None and (
            isinstance(budget, bool)
            or not isinstance(budget, (int, float))
            or not math.isfinite(budget)
            or budget <= 0
        ):
            raise ValueError(
                f"'max_budget_usd' must be a positive number of dollars, not {budget!r}"
            )
        check_seed_files(entry, home="the run's HOME")

    @classmethod
    def login(cls, entry: Mapping[str, Any]) -> Login:
        """A key or token in its environment, or a login file among its seed files."""
        env = run_environment(entry)
        given = first_set(env, LOGIN_VARIABLES)
        if given:
            return Login(READY, f"{given} is set.")
        seeds = set(entry.get("seed_files") or {})
        if CREDENTIALS_FILE in seeds:
            return Login(READY, f"{CREDENTIALS_FILE} is among its seed files.")
        if seeds & SETTINGS_FILES:
            # Its settings may name an apiKeyHelper: only a run can tell.
            return Login(UNKNOWN, "Its settings are seeded; they may give a login.")
        return Login(
            MISSING,
            "Claude Code will say 'Not logged in': a run gets a home of its own, and no key "
            f"({', '.join(LOGIN_VARIABLES[:2])}) or login file is given to it. Add "
            f'"seed_files": {{"{CREDENTIALS_FILE}": "~/{CREDENTIALS_FILE}"}} or an API key '
            'in "env" to the agent in REPLAYS_AGENTS_FILE.',
        )

    @classmethod
    def judge_unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        return judge_conflict(entry.get("args", []))

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> ClaudeCodeAgent:
        return cls(
            name=name,
            model=model,
            binary=entry.get("binary", DEFAULT_BINARY),
            args=list(entry.get("args", [])),
            env=dict(entry.get("env", {})),
            permission_mode=entry.get("permission_mode", DEFAULT_PERMISSION_MODE),
            max_turns=entry.get("max_turns"),
            max_budget_usd=entry.get("max_budget_usd"),
            seed_files=dict(entry.get("seed_files", {})),
        )

    # --- one run --------------------------------------------------------------------

    def invocation(self, context: RunContext) -> Invocation:
        flags = ["--permission-mode", self.permission_mode]
        if self.max_turns is not None:
            flags += ["--max-turns", str(self.max_turns)]
        invocation = self._print(
            context, flags + self._budget(context.cost_cap_usd), mode=self.permission_mode
        )
        if context.resume_session:
            # A later turn of the range: the session turn 1 made goes on.
            invocation.argv.extend(["--resume", _session_argument(context.resume_session)])
        elif context.fork is not None:
            self._place_fork(context)
            invocation.argv.extend(
                ["--resume", _session_argument(context.fork.session_id), "--fork-session"]
            )
        return invocation

    def _place_fork(self, context: RunContext) -> None:
        """Copy the cut historical session where `claude --resume` looks for it: the run's
        own config folder, projects/<slug of the folder claude runs in>/<session>.jsonl."""
        fork = context.fork
        assert fork is not None
        # Claude names the folder after the path it runs in, links resolved.
        slug = claude_project_slug(fork.cwd.resolve())
        target = context.run_dir / HOME_DIR / CONFIG_DIR / "projects" / slug / fork.file_name
        fork.copy_to(target, tool="claude_code")

    def session_id(self, context: RunContext) -> str:
        return self._read_log(context, exit_code=0)[1].session_id

    def _budget(self, cap: Decimal | None = None) -> list[str]:
        """--max-budget-usd: the entry's own cap, or the run's (a campaign's budget left)
        when that is lower."""
        caps = [Decimal(str(self.max_budget_usd))] if self.max_budget_usd is not None else []
        if cap is not None:
            caps.append(cap)
        return ["--max-budget-usd", _dollars(min(caps))] if caps else []

    def _print(self, context: RunContext, flags: list[str], *, mode: str) -> Invocation:
        """`claude -p` with stream-json, `flags` and then 'args', in the context's
        workspace (the caller's cwd) and own HOME, the request on stdin."""
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of claude.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        home = self.prepare_home(context.run_dir)
        binary = str(Path(self.binary).expanduser()) if os.sep in self.binary else self.binary
        argv = [
            binary,
            "-p",
            "--output-format",
            "stream-json",
            "--verbose",
            "--model",
            self.model,
            *flags,
            *self.args,
        ]
        env = {
            **self.env,
            "HOME": str(home),
            # Set as well: one inherited from the coordinator's environment would
            # otherwise point every run at the same configuration folder.
            "CLAUDE_CONFIG_DIR": str(home / CONFIG_DIR),
        }
        # No update checks, telemetry or error reports from inside a run.
        env.setdefault("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
        if self._bypasses_permissions(mode) and os.geteuid() == 0:
            # As root Claude refuses to skip permission checks outside a sandbox.
            env.setdefault("IS_SANDBOX", "1")
        return Invocation(argv=argv, env=env, stdin_path=context.request_file)

    def _bypasses_permissions(self, mode: str) -> bool:
        return mode == "bypassPermissions" or "--dangerously-skip-permissions" in self.args

    def cleanup(self, context: RunContext) -> None:
        remove_seed_files(context.run_dir / HOME_DIR, self.seed_files)

    def prepare_home(self, run_dir: Path) -> Path:
        """The run's own HOME, holding only the seed files."""
        home = run_dir / HOME_DIR
        (home / CONFIG_DIR).mkdir(mode=0o700, parents=True, exist_ok=True)
        copy_seed_files(home, self.seed_files, home="HOME")
        return home

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        return self._read_log(context, exit_code=exit_code)[0]

    def _read_log(
        self, context: RunContext, *, exit_code: int
    ) -> tuple[AgentOutcome, StreamSummary]:
        """The outcome, and the stream it was read from (judge mode reads its answer there)."""
        summary = StreamSummary()
        try:
            for event in _events(log_lines(context)):
                summary.add(event)
        except OSError as exc:
            failed = AgentOutcome(error=f"The agent's log could not be read: {exc}", failed=True)
            return failed, summary
        if summary.result is None:
            return self._outcome_without_result(context, summary), summary
        outcome = result_outcome(summary.result, model=self.model)
        if exit_code != 0 and not outcome.error:
            outcome.error = readable_tail(self.render_log(read_tail(context.log_path)))
        if outcome.failed or exit_code != 0:
            outcome.setup = setup_problem(summary.api_error, summary.result, outcome.error)
        # It stopped itself at --max-budget-usd: a campaign's run cap when it had one.
        outcome.stopped_at_cap = (
            context.cost_cap_usd is not None and summary.result.get("subtype") == MAX_BUDGET_SUBTYPE
        )
        fail_if_sandbox_refused(outcome, summary.shell_outputs, tool="Claude Code")
        return outcome, summary

    def _outcome_without_result(self, context: RunContext, summary: StreamSummary) -> AgentOutcome:
        """Claude ended without its result line (a crash, a bad flag): failed, usage from
        the session transcript when there is one."""
        tail = readable_tail(self.render_log(read_tail(context.log_path)))
        outcome = AgentOutcome(
            failed=True,
            error="Claude Code ended without a result." + (f"\n{tail}" if tail else ""),
        )
        if context.fork is not None or context.resume_session:
            # That transcript also holds the earlier turns (the history, the run's own):
            # its sums are not this turn's.
            outcome.notes.append("Claude Code reported no usage: tokens and cost are unknown.")
            return outcome
        transcript = find_transcript(context.run_dir / HOME_DIR, summary.session_id)
        if transcript is None:
            outcome.notes.append("Claude Code reported no usage: tokens and cost are unknown.")
            return outcome
        try:
            # The agent could have left a link or a FIFO there: read as untrusted, bounded,
            # and without its sub-agents' files.
            limit = settings.REPLAYS_MAX_TRANSCRIPT_BYTES
            data = read_untrusted(transcript, max_bytes=limit)
            if len(data) > limit:
                raise TranscriptError(f"{transcript.name} is larger than {limit:,} bytes")
            parsed = parse_claude_code(
                transcript, max_bytes=limit, include_subagents=False, data=data
            )
        except (OSError, TranscriptError) as exc:
            outcome.notes.append(f"The session transcript could not be read: {exc}")
            return outcome
        by_model: dict[str, TokenUsage] = {}
        for turn in parsed.turns:
            for model, usage in turn.usage_by_model.items():
                by_model[model] = by_model.get(model, TokenUsage()) + usage
        outcome.usage = sum(by_model.values(), TokenUsage())
        table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
        outcome.cost_usd = pricing.turn_cost_usd(by_model, table)
        outcome.notes.append(
            "Claude Code wrote no result: tokens and cost come from its session transcript."
        )
        return outcome

    def render_log(self, text: str) -> str:
        return render_events(text)

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        conflict = judge_conflict(self.args)
        if conflict:
            raise AgentSetupError(conflict)
        flags = [
            "--json-schema",
            task_json(task.schema),
            # No tool but StructuredOutput, which --json-schema adds.
            "--tools",
            "",
            "--strict-mcp-config",
            "--permission-mode",
            JUDGE_PERMISSION_MODE,
            *self._budget(),
        ]
        return self._print(judge_context(task, self.model), flags, mode=JUDGE_PERMISSION_MODE)

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome, summary = self._read_log(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome, exit_code=exit_code, reply=structured_reply(summary.result or {})
        )


# What gives Claude Code a login (besides a login file in its home).
LOGIN_VARIABLES = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "CLAUDE_CODE_USE_BEDROCK",
    "CLAUDE_CODE_USE_VERTEX",
)
CREDENTIALS_FILE = ".claude/.credentials.json"
SETTINGS_FILES = frozenset({".claude/settings.json", ".claude.json"})


def _session_argument(session_id: str) -> str:
    """A session id as the value of --resume (never an option of claude)."""
    if not session_id or session_id.startswith("-") or any(c.isspace() for c in session_id):
        raise AgentSetupError(f"{session_id[:60]!r} is not a session Claude Code can resume.")
    return session_id


def judge_conflict(args: list[str]) -> str:
    """Why 'args' keep this agent from judging ("" when they do not)."""
    for arg in args:
        flag = arg.split("=", 1)[0]
        if flag in _JUDGE_CONFLICTS:
            return (
                f"This agent's 'args' give {flag}, which judge mode cannot take: "
                f"{_JUDGE_CONFLICTS[flag]}."
            )
    return ""


def structured_reply(result: Mapping[str, Any]) -> str:
    """The evaluator's answer as JSON text: the StructuredOutput call's object when it
    made one, else its final text (which should then be the JSON)."""
    structured = result.get("structured_output")
    if structured is not None:
        return json.dumps(structured, ensure_ascii=False)
    return _text(result.get("result"))


# --- the result line ---------------------------------------------------------------------


@dataclass
class StreamSummary:
    """What a run's stream-json events add up to, fed one event at a time."""

    session_id: str = ""
    result: dict[str, Any] | None = None
    # The typed error Claude Code puts on an assistant message it made up when the API
    # failed ("authentication_failed", "rate_limit", ...): the last one counts.
    api_error: str = ""
    # What each shell command (the Bash tool) gave back: its sandbox's refusal, when it
    # refused (Claude Code's own sandbox, when a seeded settings.json turns it on).
    shell_outputs: list[str] = field(default_factory=list)
    _shell_calls: set[str] = field(default_factory=set)

    def add(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        if kind in ("assistant", "user"):
            self._tool_blocks(event)
        if kind == "system" and event.get("subtype") == "init" and not self.session_id:
            self.session_id = _text(event.get("session_id"))
        elif kind == "assistant" and isinstance(event.get("error"), str):
            self.api_error = event["error"]
        elif kind == "result":
            # The last one counts (there is one per session; a resumed stream may add more).
            self.result = dict(event)
            self.session_id = _text(event.get("session_id")) or self.session_id

    def _tool_blocks(self, event: Mapping[str, Any]) -> None:
        message = event.get("message")
        content = message.get("content") if isinstance(message, Mapping) else None
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, Mapping):
                continue
            if block.get("type") == "tool_use" and block.get("name") == "Bash":
                self._shell_calls.add(_text(block.get("id")))
            elif (
                block.get("type") == "tool_result" and block.get("tool_use_id") in self._shell_calls
            ):
                self.shell_outputs.append(_tool_result_text(block.get("content")))


def _tool_result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(_text(part.get("text")) for part in content if isinstance(part, Mapping))
    return ""


MAX_BUDGET_SUBTYPE = "error_max_budget_usd"


def _dollars(amount: Decimal) -> str:
    """A cap as claude reads it: plain decimal dollars, at most 4 places, never 0."""
    return format(max(amount, Decimal("0.0001")).quantize(Decimal("0.0001")).normalize(), "f")


def result_outcome(result: Mapping[str, Any], *, model: str) -> AgentOutcome:
    """The outcome the result line describes: final text, usage, Claude's cost, API time,
    and whether Claude itself reported an error (is_error, whatever the subtype)."""
    outcome = AgentOutcome(final_message=_text(result.get("result")))
    try:
        outcome.usage = anthropic_usage(result.get("usage"))
    except ValueError as exc:
        outcome.notes.append(f"Claude Code's usage was ignored: {exc}")
    extra = _usage_beyond(outcome.usage, _invocation_model_usage(result))
    if extra.total:
        outcome.usage = outcome.usage + extra
        outcome.notes.append(
            f"Claude Code's result usage leaves out sub-agents: {extra.total:,} tokens from its "
            "per-model usage were added (their cache writes as 5-minute writes)."
        )
    outcome.cost_usd = _reported_cost(result)
    if outcome.cost_usd is None:
        table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
        outcome.cost_usd = pricing.cost_usd(model, outcome.usage, table)
    api_ms = result.get("duration_api_ms")
    if _is_number(api_ms) and api_ms >= 0:
        outcome.model_seconds = round(api_ms / 1000, 3)
    if result.get("is_error") is True:
        outcome.failed = True
        outcome.error = result_error(result)
    denials = [d for d in result.get("permission_denials") or [] if isinstance(d, Mapping)]
    if denials:
        names = ", ".join(_denial_text(d) for d in denials[:5])
        more = f" and {len(denials) - 5} more" if len(denials) > 5 else ""
        outcome.notes.append(
            f"Claude Code was refused {len(denials)} tool call(s) its permission mode does not "
            f"allow: {names}{more}."
        )
    absurd = absurd_usage(outcome)
    if absurd:
        message = f"Claude Code's result {absurd}: its figures were not kept."
        return AgentOutcome(
            final_message=outcome.final_message, failed=True, error=message, notes=[message]
        )
    turns = result.get("num_turns")
    session = _text(result.get("session_id"))
    if session or _is_number(turns):
        outcome.notes.append(
            f"Claude Code session {session or '(unknown)'}"
            + (f": {turns} turn{'' if turns == 1 else 's'}." if _is_number(turns) else ".")
        )
    return outcome


# Claude Code's typed API errors (the `error` of its made-up assistant message) that are
# setup problems; "invalid_request" and "max_output_tokens" are the run's own.
_API_ERRORS = {
    "authentication_failed": SetupKind.CREDENTIALS,
    "billing_error": SetupKind.QUOTA,
    "rate_limit": SetupKind.RATE_LIMIT,
    "model_not_found": SetupKind.UNKNOWN_MODEL,
    "server_error": SetupKind.PROVIDER,
}


def setup_problem(api_error: str, result: Mapping[str, Any], words: str) -> SetupProblem | None:
    """The setup problem a failed Claude Code run reported: its typed error, else the HTTP
    status of the API's answer (`api_error_status`)."""
    kind = _API_ERRORS.get(api_error)
    if kind == SetupKind.CREDENTIALS and "not logged in" in words.lower():
        kind = SetupKind.NOT_LOGGED_IN
    if kind is not None:
        return SetupProblem(kind, words)
    status = result.get("api_error_status")
    if isinstance(status, int) and not isinstance(status, bool):
        return problems.from_http_status(status, words)
    return None


def result_error(result: Mapping[str, Any]) -> str:
    """Why Claude says it failed: its errors and result text, with the subtype when it adds one."""
    parts = [_text(error).strip() for error in result.get("errors") or []]
    text = _text(result.get("result")).strip()
    parts = [part for part in dict.fromkeys([text, *parts]) if part]
    message = "\n".join(parts)
    subtype = _text(result.get("subtype"))
    if subtype and subtype != "success" and subtype not in message:
        message = f"{message} ({subtype})" if message else f"Claude Code stopped: {subtype}."
    return message or "Claude Code reported an error."


def _usage_beyond(usage: TokenUsage, model_usage: object) -> TokenUsage:
    """Tokens modelUsage counts that `usage` does not (sub-agents: Claude's `usage` is the
    main conversation's only, while modelUsage and total_cost_usd cover everything)."""
    if not isinstance(model_usage, Mapping):
        return TokenUsage()
    totals = dict.fromkeys(
        ("inputTokens", "outputTokens", "cacheReadInputTokens", "cacheCreationInputTokens"), 0
    )
    for per_model in model_usage.values():
        if not isinstance(per_model, Mapping):
            return TokenUsage()
        for key in totals:
            value = per_model.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return TokenUsage()
            totals[key] += value
    written = usage.cache_write_5m_tokens + usage.cache_write_1h_tokens
    return TokenUsage(
        input_tokens=max(0, totals["inputTokens"] - usage.input_tokens),
        output_tokens=max(0, totals["outputTokens"] - usage.output_tokens),
        cache_read_tokens=max(0, totals["cacheReadInputTokens"] - usage.cache_read_tokens),
        cache_write_5m_tokens=max(0, totals["cacheCreationInputTokens"] - written),
    )


# Claude Code 2.1.3xx: in a resumed session, modelUsage and total_cost_usd are the whole
# session's (earlier invocations included); this per-model usage is this invocation's.
_SINCE_LAST_RESULT = "model_usage_since_last_result"


def _invocation_model_usage(result: Mapping[str, Any]) -> object:
    """The per-model usage of this invocation: model_usage_since_last_result where Claude
    writes it, else modelUsage (one invocation's in releases before it)."""
    since = result.get(_SINCE_LAST_RESULT)
    return since if isinstance(since, Mapping) else result.get("modelUsage")


def _reported_cost(result: Mapping[str, Any]) -> Decimal | None:
    """Claude's own cost of this invocation: the sum of model_usage_since_last_result's
    costUSD where Claude writes it, else total_cost_usd, else the sum of modelUsage's."""
    total = result.get("total_cost_usd")
    since = result.get(_SINCE_LAST_RESULT)
    if not isinstance(since, Mapping) and _is_number(total) and total >= 0:
        return Decimal(str(total))
    model_usage = _invocation_model_usage(result)
    if isinstance(model_usage, Mapping) and model_usage:
        costs = [
            per_model.get("costUSD") if isinstance(per_model, Mapping) else None
            for per_model in model_usage.values()
        ]
        if all(_is_number(cost) and cost >= 0 for cost in costs):
            return sum((Decimal(str(cost)) for cost in costs), Decimal(0))
    return None


def find_transcript(home: Path, session_id: str) -> Path | None:
    """The session's transcript under the run's own HOME, if Claude wrote one.

    Without a session id (Claude stopped before saying it) the only transcript there
    is taken: the HOME belongs to this run alone.
    """
    projects = home / CONFIG_DIR / "projects"
    if session_id and ("/" in session_id or session_id.startswith(".")):
        return None
    try:
        found = sorted(projects.glob(f"*/{session_id or '*'}.jsonl"))
    except OSError:
        return None
    return found[0] if len(found) == 1 else None


def claude_project_slug(folder: Path | str) -> str:
    """The folder Claude Code (2.1.197) keeps a project's sessions in, under projects/:
    every character that is not a letter or digit becomes '-'; a name longer than 200 is
    cut there and ends with '-' and a hash of the path (base 36, as Claude computes it)."""
    path = str(folder)
    slug = re.sub(r"[^a-zA-Z0-9]", "-", path)
    if len(slug) <= _CLAUDE_SLUG_CHARS:
        return slug
    return f"{slug[:_CLAUDE_SLUG_CHARS]}-{_base36(abs(_java_hash(path)))}"


def _java_hash(text: str) -> int:
    """JavaScript's `(h << 5) - h + charCode | 0` over UTF-16 code units."""
    value = 0
    units = text.encode("utf-16-le", errors="surrogatepass")
    for index in range(0, len(units), 2):
        value = (value * 31 + int.from_bytes(units[index : index + 2], "little")) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, rest = divmod(number, 36)
        text = digits[rest] + text
        if not number:
            return text


# --- the log, readable --------------------------------------------------------------------


def render_events(text: str) -> str:
    """Claude's stream-json events (with stderr lines between) as lines a person reads.

    `text` may start in the middle of a line (a broken first line is skipped) and end
    in one (a JSON line still being written is skipped).
    """
    return render_event_stream(text, _Renderer())


@dataclass
class _Renderer:
    lines: list[str] = field(default_factory=list)
    cwd: str = ""

    def emit(self, line: str, indent: str = "") -> None:
        for part in plain_text(line).split("\n"):
            part = (indent + part).rstrip()
            if len(part) > LINE_CHARS:
                part = part[: LINE_CHARS - 1] + "…"
            self.lines.append(part)

    def event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        # A sub-agent's messages are indented under the tool call that started it.
        indent = "  " if event.get("parent_tool_use_id") else ""
        if kind == "system":
            self.system(event)
        elif kind == "assistant":
            message = event.get("message")
            if isinstance(message, Mapping):
                self.assistant(message, indent, error=bool(event.get("error")))
        elif kind == "user":
            message = event.get("message")
            if isinstance(message, Mapping):
                self.tool_results(message, indent)
        elif kind == "result":
            self.result(event)
        # stream_event, rate limits and newer event types add nothing a reader needs.

    def system(self, event: Mapping[str, Any]) -> None:
        subtype = event.get("subtype")
        if subtype == "init":
            self.cwd = _text(event.get("cwd"))
            version = _text(event.get("claude_code_version"))
            self.emit(
                f"Claude Code{' ' + version if version else ''} started: "
                f"model {_text(event.get('model')) or '?'}, "
                f"permission mode {_text(event.get('permissionMode')) or '?'}"
            )
        elif subtype == "api_retry":
            status = event.get("error_status")
            error = _text(event.get("error"))
            what = " ".join(
                part
                for part in (
                    str(status) if status is not None else "",
                    f"({error})" if error else "",
                )
                if part
            )
            delay = event.get("retry_delay_ms")
            wait = f" in {delay / 1000:.1f}s" if _is_number(delay) else ""
            self.emit(
                f"API error{' ' + what if what else ''}: retry {event.get('attempt', '?')}"
                f"/{event.get('max_retries', '?')}{wait}"
            )
        elif subtype == "task_notification":
            summary = _text(event.get("summary")) or "sub-agent"
            self.emit(f"  {summary}: {_text(event.get('status')) or 'ended'}")
        elif subtype == "compact_boundary":
            self.emit("conversation compacted")

    def assistant(self, message: Mapping[str, Any], indent: str, *, error: bool) -> None:
        for block in message.get("content") or []:
            if not isinstance(block, Mapping):
                continue
            block_type = block.get("type")
            if block_type == "text":
                label = "error" if error else "assistant"
                self.emit(
                    f"{label}: {first_lines(_text(block.get('text')), MESSAGE_LINES)}", indent
                )
            elif block_type == "thinking":
                self.emit(f"thinking: {first_lines(_text(block.get('thinking')), 2)}", indent)
            elif block_type == "tool_use":
                self.emit(self.tool_call(block), indent)

    def tool_call(self, block: Mapping[str, Any]) -> str:
        name = _text(block.get("name")) or "tool"
        arguments = block.get("input")
        arguments = arguments if isinstance(arguments, Mapping) else {}
        if name == "Bash":
            return f"Bash: {first_lines(_text(arguments.get('command')), 3)}"
        if name in _FILE_TOOLS:
            return f"{name} {self.relative(_text(arguments.get(_FILE_TOOLS[name])))}"
        if name in _ONE_ARGUMENT_TOOLS:
            return f"{name}: {first_lines(_text(arguments.get(_ONE_ARGUMENT_TOOLS[name])), 1)}"
        if name == "TodoWrite":
            todos = arguments.get("todos")
            return f"TodoWrite: {len(todos) if isinstance(todos, list) else 0} items"
        shown = json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))
        return f"{name} {shown}" if arguments else name

    def relative(self, path: str) -> str:
        if self.cwd and path.startswith(self.cwd.rstrip("/") + "/"):
            return path[len(self.cwd.rstrip("/")) + 1 :]
        return path

    def tool_results(self, message: Mapping[str, Any], indent: str) -> None:
        content = message.get("content")
        if not isinstance(content, list):
            return  # a prompt (a sub-agent's): its tool call already said what it is
        for block in content:
            if not isinstance(block, Mapping) or block.get("type") != "tool_result":
                continue
            label = "tool error" if block.get("is_error") is True else "tool result"
            output = plain_text(_result_text(block.get("content"))).strip("\n")
            lines = output.split("\n") if output else ["(no output)"]
            self.emit(f"{label}: {lines[0]}", indent)
            for line in lines[1:OUTPUT_LINES]:
                self.emit(f"  {line}", indent)
            if len(lines) > OUTPUT_LINES:
                self.emit(f"  … {len(lines) - OUTPUT_LINES} more lines", indent)

    def result(self, event: Mapping[str, Any]) -> None:
        subtype = _text(event.get("subtype")) or "ended"
        failed = event.get("is_error") is True
        if failed and subtype == "success":
            subtype = "error"
        parts = [subtype]
        turns = event.get("num_turns")
        if _is_number(turns):
            parts.append(f"{turns} turn{'' if turns == 1 else 's'}")
        cost = event.get("total_cost_usd")
        if _is_number(cost):
            parts.append(_usd(cost))
        line = "result: " + ", ".join(parts)
        if failed:
            line += f": {first_lines(result_error(event), 3)}"
        self.emit(line)


# --- helpers ---------------------------------------------------------------------------


def _events(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    for line in lines:
        event = json_event(line)
        if event is not None:
            yield event


def _result_text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            _text(block.get("text"))
            for block in content
            if isinstance(block, Mapping) and block.get("type") == "text"
        ]
        return "\n".join(text for text in texts if text)
    return ""


def _denial_text(denial: Mapping[str, Any]) -> str:
    name = _text(denial.get("tool_name")) or "tool"
    arguments = denial.get("tool_input")
    if isinstance(arguments, Mapping) and name == "Bash":
        command = first_lines(_text(arguments.get("command")), 1)
        return f"{name} ({command[:100]})" if command else name
    if isinstance(arguments, Mapping) and name in _FILE_TOOLS:
        return f"{name} {_text(arguments.get(_FILE_TOOLS[name]))}"
    return name


def _usd(value: float) -> str:
    """$0.0123, $0.000621, $1.5000: four decimals, six when the cents need them."""
    text = f"{value:.6f}"
    whole, _, fraction = text.partition(".")
    return f"${whole}.{fraction.rstrip('0').ljust(4, '0')}"


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""
