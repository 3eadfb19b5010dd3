"""A user-configured command line as an agent (aider, a script, anything that edits files).

settings.REPLAYS_AGENTS entry:
    {"kind": "command", "command": ["aider", "--model", "{model}", "--message-file",
     "{request_file}", "--yes"], "models": ["gpt-5"], "env": {"K": "V"}, "label": "Aider"}

Placeholders {model}, {request_file}, {workspace} and {run_dir} are replaced inside
each argv element (and env value); nothing goes through a shell. The command runs in
the workspace. It may report usage as JSON in the file named by $REPLAYS_USAGE_FILE:
{"input_tokens", "output_tokens", "cache_read_tokens", "cache_write_5m_tokens",
"cache_write_1h_tokens", "cost_usd", "model_seconds", "model"}, all optional.

A range of several requests runs the command once per request, in order, in the same
workspace: {request_file} is that turn's request, $REPLAYS_TURN its number (1, 2, ...)
and $REPLAYS_TURNS how many there are; each turn has its own usage file. A command
keeps no session for Replays to resume, so the `fork` context is not offered to it
(`digest` gives its first turn the earlier requests).

Judge mode (an evaluator's one structured answer) needs the optional key
"judge_command", an argv like "command", e.g.
    ["python", "judge.py", "--model", "{model}", "{task_file}", "{answer_file}"]
with the placeholders {model}, {task_file}, {answer_file} and {folder}, run in the
call's own empty FOLDER with the prompt on stdin. FOLDER/task.json holds {"task",
"prompt", "schema", "inputs"}; the program writes its answer, a JSON object matching
the schema, to FOLDER/answer.json. $REPLAYS_TASK_FILE, $REPLAYS_ANSWER_FILE and
$REPLAYS_USAGE_FILE (usage as above) name the three files.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, ClassVar

from django.conf import settings

from replays import pricing
from replays.agents.base import (
    AgentOutcome,
    AgentSetupError,
    ConfiguredAgent,
    Invocation,
    JudgeAnswer,
    JudgeTask,
    RunContext,
    absurd_usage,
    error_from_log,
    judge_answer_from,
    judge_context,
    program_unavailable_reason,
    read_untrusted,
    task_json,
    write_private,
)
from replays.transcripts.base import TokenUsage

USAGE_FILE_NAME = "usage.json"
# Judge mode's files in the call's folder.
TASK_FILE_NAME = "task.json"
ANSWER_FILE_NAME = "answer.json"
NO_JUDGE_COMMAND = "This agent has no judge_command."
_TOKEN_KEYS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
)
# A usage report is a few hundred bytes; anything far larger is not one.
_MAX_USAGE_FILE_BYTES = 64 * 1024


class CommandAgent(ConfiguredAgent):
    kind: ClassVar[str] = "command"
    can_judge: ClassVar[bool] = True

    def __init__(
        self,
        *,
        name: str,
        model: str,
        command: list[str],
        env: dict[str, str],
        judge_command: list[str] | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.command = command
        self.env = env
        self.judge_command = judge_command

    @classmethod
    def check_entry(cls, entry: Mapping[str, Any]) -> None:
        _check_argv(entry.get("command"), "command")
        if "judge_command" in entry:
            _check_argv(entry["judge_command"], "judge_command")
        env = entry.get("env", {})
        if not isinstance(env, dict) or not all(
            isinstance(key, str) and key and isinstance(value, str) for key, value in env.items()
        ):
            raise ValueError("'env' must map names to strings")

    @classmethod
    def unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        return program_unavailable_reason(entry["command"][0], entry.get("env", {}))

    @classmethod
    def judge_unavailable_reason(cls, entry: Mapping[str, Any]) -> str:
        judge_command = entry.get("judge_command")
        if not judge_command:
            return NO_JUDGE_COMMAND
        # It may start another program than 'command' does.
        return program_unavailable_reason(judge_command[0], entry.get("env", {}))

    @classmethod
    def from_entry(cls, name: str, entry: Mapping[str, Any], model: str) -> CommandAgent:
        judge_command = entry.get("judge_command")
        return cls(
            name=name,
            model=model,
            command=list(entry["command"]),
            env=dict(entry.get("env", {})),
            judge_command=list(judge_command) if judge_command else None,
        )

    def invocation(self, context: RunContext) -> Invocation:
        values = {
            "model": self.model,
            "request_file": str(context.request_file),
            "workspace": str(context.workspace),
            "run_dir": str(context.run_dir),
        }
        files = {
            "REPLAYS_USAGE_FILE": str(usage_file(context)),
            "REPLAYS_TURN": str(context.turn),
            "REPLAYS_TURNS": str(context.turns),
        }
        return self._invocation(self.command, values, files)

    def _invocation(
        self,
        command: list[str],
        values: Mapping[str, str],
        files: Mapping[str, str],
        stdin_path: Path | None = None,
    ) -> Invocation:
        """`command` and the entry's env with `values` in place of their placeholders,
        plus the environment naming our `files`."""
        if self.model.startswith("-"):
            # A model typed by hand must not turn into an option of the program.
            raise AgentSetupError(f"'{self.model}' is not a model name.")
        env = {key: substitute(value, values) for key, value in self.env.items()}
        env.update(files)
        argv = [substitute(part, values) for part in command]
        return Invocation(argv=argv, env=env, stdin_path=stdin_path, shown=named_files(command))

    def outcome(self, context: RunContext, *, exit_code: int) -> AgentOutcome:
        outcome = read_usage_file(usage_file(context), model=self.model)
        if exit_code != 0:
            outcome.error = error_from_log(context.log_path)
        return outcome

    # --- judge mode -----------------------------------------------------------------

    def judge_invocation(self, task: JudgeTask) -> Invocation:
        if not self.judge_command:
            raise AgentSetupError(NO_JUDGE_COMMAND)
        task_file = task.folder / TASK_FILE_NAME
        answer_file = task.folder / ANSWER_FILE_NAME
        data = {
            "task": task.name,
            "prompt": task.prompt,
            "schema": task.schema,
            "inputs": task.inputs,
        }
        write_private(task_file, task_json(data).encode("utf-8"))
        values = {
            "model": self.model,
            "task_file": str(task_file),
            "answer_file": str(answer_file),
            "folder": str(task.folder),
        }
        files = {
            "REPLAYS_TASK_FILE": str(task_file),
            "REPLAYS_ANSWER_FILE": str(answer_file),
            "REPLAYS_USAGE_FILE": str(task.folder / USAGE_FILE_NAME),
        }
        # The prompt goes on stdin as well, for programs that read it there.
        return self._invocation(self.judge_command, values, files, stdin_path=task.prompt_file)

    def judge_answer(self, task: JudgeTask, *, exit_code: int) -> JudgeAnswer:
        outcome = self.outcome(judge_context(task, self.model), exit_code=exit_code)
        return judge_answer_from(
            outcome, exit_code=exit_code, answer_file=task.folder / ANSWER_FILE_NAME
        )


def usage_file(context: RunContext) -> Path:
    """Where a turn reports its usage: usage.json, usage-2.json for turn 2, ..."""
    name = USAGE_FILE_NAME if context.turn == 1 else f"usage-{context.turn}.json"
    return context.run_dir / name


def _check_argv(command: object, key: str) -> None:
    if (
        not isinstance(command, list)
        or not command
        or not all(isinstance(part, str) for part in command)
        or not command[0].strip()
    ):
        raise ValueError(f"'{key}' must be a non-empty list of strings")


def named_files(command: list[str]) -> tuple[Path, ...]:
    """The files the configured command names by absolute path besides its program (`python
    /opt/judge/judge.py {task_file}`: the script), for the sandbox to show read-only. Only
    the operator's template counts: a placeholder's value never does."""
    found = []
    for part in command[1:]:
        if "{" not in part and part.startswith("/") and Path(part).is_file():
            found.append(Path(part))
    return tuple(found)


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace each {name} placeholder of `values` by its value; other braces stay as they
    are (this is not str.format)."""
    for name, value in values.items():
        text = text.replace("{" + name + "}", value)
    return text


def read_usage_file(path: Path, *, model: str) -> AgentOutcome:
    """Usage and cost from the agent's usage report; a malformed report is ignored with a note.

    Without a report the usage is unknown: zero tokens and an unknown cost. Without a
    reported cost it comes from the price table for the reported (or requested) model.
    """
    try:
        # The agent wrote it: never through a link, never a FIFO, read with a bound.
        raw = read_untrusted(path, max_bytes=_MAX_USAGE_FILE_BYTES)
    except FileNotFoundError:
        return AgentOutcome()
    except OSError as exc:
        return AgentOutcome(
            notes=[f"The usage file {path.name} was ignored: {exc.strerror or exc}."]
        )
    try:
        if len(raw) > _MAX_USAGE_FILE_BYTES:
            raise ValueError(f"larger than {_MAX_USAGE_FILE_BYTES} bytes")
        data = json.loads(raw.decode("utf-8"))
        usage, reported_cost, model_seconds, reported_model = _parse_usage(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        return AgentOutcome(notes=[f"The usage file {path.name} was ignored: {exc}"])
    cost = reported_cost
    if cost is None:
        table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
        cost = pricing.cost_usd(reported_model or model, usage, table)
    outcome = AgentOutcome(usage=usage, cost_usd=cost, model_seconds=model_seconds)
    absurd = absurd_usage(outcome)
    if absurd:
        # A figure no run can reach is the agent's fault, said as such: the run fails
        # (its diff is kept), its usage unknown.
        message = f"The usage file {path.name} {absurd}: its figures were not kept."
        return AgentOutcome(failed=True, error=message, notes=[message])
    return outcome


def _parse_usage(data: object) -> tuple[TokenUsage, Decimal | None, float | None, str]:
    if not isinstance(data, dict):
        raise ValueError("it is not a JSON object")
    tokens = {}
    for key in _TOKEN_KEYS:
        value = data.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{key} must be a whole number of tokens, not {value!r}")
        tokens[key] = value
    cost = data.get("cost_usd")
    if cost is not None:
        cost = pricing.non_negative_decimal("cost_usd", cost)
    seconds = data.get("model_seconds")
    if seconds is not None:
        if (
            isinstance(seconds, bool)
            or not isinstance(seconds, (int, float))
            or not (math.isfinite(seconds) and seconds >= 0)
        ):
            raise ValueError(f"model_seconds must be a number of seconds, not {seconds!r}")
        seconds = float(seconds)
    model = data.get("model", "")
    if not isinstance(model, str):
        raise ValueError(f"model must be a string, not {model!r}")
    return TokenUsage(**tokens), cost, seconds, model.strip()
