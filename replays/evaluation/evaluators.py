"""Which evaluators exist, and which one judges a plan.

An evaluator id is `tests` (the built-in offline evaluator: scores from the test
checks alone, no model) or a model id of an agent that has a judge mode
(`AGENT:MODEL`, as in GET /api/models/). The calibration baselines never judge.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings

from replays import agents, processes, runfolder, sandbox
from replays.agents.base import (
    AgentSetupError,
    JudgeAnswer,
    JudgeTask,
    absurd_usage,
    plain_text,
    write_private,
)

TESTS = "tests"
TESTS_LABEL = "Tests only (offline, no model)"


class UnknownEvaluator(ValueError):
    """An evaluator id that names neither `tests` nor a known model."""


@dataclass(frozen=True)
class EvaluatorInfo:
    id: str
    label: str
    kind: str  # "tests", or the agent's kind: codex, claude_code, command
    available: bool
    reason: str = ""  # why it cannot judge here
    model: agents.ModelInfo | None = None  # None for `tests`

    @property
    def is_tests(self) -> bool:
        return self.id == TESTS


def _tests() -> EvaluatorInfo:
    return EvaluatorInfo(id=TESTS, label=TESTS_LABEL, kind=TESTS, available=True)


def _from_model(info: agents.ModelInfo) -> EvaluatorInfo:
    reason = agents.judge_unavailable_reason(info)
    return EvaluatorInfo(
        id=info.id,
        label=info.label,
        kind=info.kind,
        available=not reason,
        reason=reason,
        model=info,
    )


def discover_evaluators() -> list[EvaluatorInfo]:
    """`tests` first, then every agent model in discovery order, judge-capable or not
    (with the reason when not)."""
    found = [_tests()]
    found += [_from_model(info) for info in agents.discover_models() if not info.is_baseline]
    return found


def resolve_evaluator(evaluator_id: str) -> EvaluatorInfo:
    """The evaluator named by its id (a bare model name works as for models)."""
    wanted = evaluator_id.strip() if isinstance(evaluator_id, str) else ""
    if wanted == TESTS:
        return _tests()
    try:
        info = agents.resolve_model(wanted)
    except agents.UnknownModel as exc:
        raise UnknownEvaluator(f"Unknown evaluator '{wanted}': {exc}") from None
    if info.is_baseline:
        raise UnknownEvaluator(
            f"'{wanted}' is a calibration baseline, not an evaluator: name `tests` or a model."
        )
    return _from_model(info)


def default_evaluator(*, models: list[str], verify_command: str | None) -> str | None:
    """The evaluator of a plan that names none, decided once for the whole plan:
    REPLAYS_DEFAULT_EVALUATOR if set, else the first available judge-capable agent model
    in discovery order, else `tests` when a verify command is given, else the first
    candidate model that is an agent (which, at this point, cannot judge: the plan is
    blocked with the reason). None when the candidates are all baselines: they cost
    nothing, so the plan may run them unjudged, and says so."""
    configured = settings.REPLAYS_DEFAULT_EVALUATOR
    if configured:
        return configured
    for candidate in discover_evaluators():
        if not candidate.is_tests and candidate.available:
            return candidate.id
    if verify_command:
        return TESTS
    for model in models:
        try:
            info = agents.resolve_model(model)
        except agents.UnknownModel:
            continue
        if not info.is_baseline:
            return info.id  # it may be unable to judge: the plan is then blocked, saying why
    return None


def same_family(evaluator: EvaluatorInfo, model_id: str) -> bool:
    """The evaluator runs on the same agent as a candidate: judges favour their own
    family, so the plan says so (FACTS.md, "Judging with a model")."""
    if evaluator.model is None:
        return False
    try:
        candidate = agents.resolve_model(model_id)
    except agents.UnknownModel:
        return False
    return not candidate.is_baseline and candidate.kind == evaluator.model.kind


# --- asking an evaluator ----------------------------------------------------------------

Tick = Callable[[], None]


def holding(tick: Tick, *, beat: Callable[[], bool], lost: Callable[[], Exception]) -> Tick:
    """`tick`, plus a heartbeat on a row this process holds (a review or a judgment) at
    most every REPLAYS_HEARTBEAT_SECONDS; `beat` writes it (False: the row is no longer
    ours) and `lost()` is then raised."""
    every = float(settings.REPLAYS_HEARTBEAT_SECONDS)
    last = time.monotonic()

    def holding_tick() -> None:
        nonlocal last
        tick()
        if time.monotonic() - last < every:
            return
        last = time.monotonic()
        if not beat():
            raise lost()

    return holding_tick


def strict_object(properties: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON schema object as strict structured outputs need it: every property required,
    nothing else allowed."""
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(properties),
        "properties": dict(properties),
    }


def ask(
    info: EvaluatorInfo,
    *,
    name: str,
    prompt: str,
    schema: Mapping[str, Any],
    inputs: Mapping[str, Any],
    folder: Path,
    tick: Tick | None = None,
) -> tuple[JudgeAnswer, float]:
    """One call of a model evaluator in judge mode, in its own empty folder and process
    group, with the evaluator timeout; the answer (or why there is none) and the seconds
    it took. Only a raising `tick` (cancel, a lost claim) raises."""
    assert info.model is not None, "the tests evaluator asks no model"
    call = folder / name
    if call.exists():
        shutil.rmtree(call)  # a claim taken over: the earlier holder's attempt
    call.mkdir(mode=0o700, parents=True)
    task = JudgeTask(
        name=name,
        prompt=prompt,
        schema=schema,
        inputs=inputs,
        folder=call,
        log_path=call / "evaluator.log",
        prompt_file=call / "prompt.md",
    )
    write_private(task.prompt_file, prompt.encode("utf-8", errors="surrogateescape"))
    started = time.monotonic()
    try:
        adapter = agents.adapter_for(info.id)
        invocation = adapter.judge_invocation(task)
    except (AgentSetupError, agents.UnknownModel, OSError) as exc:
        return JudgeAnswer(error=f"The evaluator {info.id} could not start: {exc}"), 0.0
    try:
        # Its own empty folder writable, its program and the system read-only, no repository.
        prepared = runfolder.start_sandboxed(
            invocation.argv,
            runfolder.agent_environment(invocation.env),
            cwd=call,
            writable=[call],
            home=call / runfolder.AGENT_HOME,
            files=invocation.shown,
        )
    except (sandbox.SandboxUnavailable, OSError) as exc:
        adapter.judge_cleanup(task)
        return JudgeAnswer(error=f"The evaluator {info.id} could not start: {exc}"), 0.0
    try:
        try:
            process, identity = prepared.spawn(
                cwd=call, log_path=task.log_path, stdin_path=invocation.stdin_path
            )
        except OSError as exc:
            adapter.judge_cleanup(task)
            return JudgeAnswer(error=f"The evaluator {info.id} could not start: {exc}"), 0.0
        # Its own process group: in the sandbox it dies with us, unsandboxed it outlives
        # us if we are killed, and reconcile (a lost judgment) or the next claimer (a
        # review taken over) stops it from this record.
        processes.record_started(folder / runfolder.EVALUATOR_PIDS, identity)
        timeout = float(settings.REPLAYS_EVALUATOR_TIMEOUT_SECONDS)
        try:
            exit_code = processes.wait_for(
                process, identity, timeout_seconds=timeout, tick=tick, tick_seconds=0.5
            )
        finally:
            adapter.judge_cleanup(task)
        not_started = (
            prepared.failure(processes.read_tail(task.log_path)) if exit_code is not None else ""
        )
    finally:
        prepared.close()
    seconds = round(time.monotonic() - started, 3)
    if exit_code is None:
        return JudgeAnswer(
            error=f"The evaluator {info.id} did not answer within {timeout:g} s."
        ), seconds
    if not_started:
        return JudgeAnswer(
            error=f"The evaluator {info.id} could not start in the sandbox: {not_started}"
        ), seconds
    answer = adapter.judge_answer(task, exit_code=exit_code)
    answer.error = plain_text(answer.error)
    absurd = absurd_usage(answer)
    if absurd:
        # Figures no call can reach fail the review with the reason (and keep the reply
        # for audit), rather than the money columns.
        return JudgeAnswer(
            error=f"The evaluator {info.id} {absurd}: its answer was not used.", raw=answer.raw
        ), seconds
    return answer, seconds
