"""The agents a replay can use, and the models each offers.

Model ids: the baselines `historical` and `empty`, then `<agent>:<model>` for every
model of every agent in settings.REPLAYS_AGENTS, in settings order. A kind of agent
is a ConfiguredAgent subclass registered in KINDS.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from replays.agents.base import Agent, ConfiguredAgent
from replays.agents.baselines import EMPTY, HISTORICAL, EmptyAgent, HistoricalAgent
from replays.agents.claude_code import ClaudeCodeAgent
from replays.agents.codex import CodexAgent
from replays.agents.command import CommandAgent
from replays.agents.gemini import GeminiAgent
from replays.agents.opencode import OpenCodeAgent
from replays.agents.pi import PiAgent
from replays.models import MODEL_ID_LENGTH

logger = logging.getLogger(__name__)

KINDS: dict[str, type[ConfiguredAgent]] = {
    CodexAgent.kind: CodexAgent,
    ClaudeCodeAgent.kind: ClaudeCodeAgent,
    GeminiAgent.kind: GeminiAgent,
    OpenCodeAgent.kind: OpenCodeAgent,
    PiAgent.kind: PiAgent,
    CommandAgent.kind: CommandAgent,
}

BASELINE_AGENT = "baseline"
_BASELINES = {HISTORICAL: HistoricalAgent, EMPTY: EmptyAgent}
_BASELINE_LABELS = {
    HISTORICAL: "Historical result (baseline)",
    EMPTY: "No change (baseline)",
}
# An agent name is the part of a model id before the first colon.
_AGENT_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


class UnknownModel(ValueError):
    """A model id that no configured agent offers."""


@dataclass(frozen=True)
class ModelInfo:
    id: str  # "historical", "empty" or "<agent>:<model>"
    label: str
    agent: str  # the configured agent's name; "baseline" for the baselines
    available: bool
    reason: str = ""  # why it is not available here
    model: str = ""  # the model as the agent names it ("" for the baselines)
    version: str = ""  # the installed agent's version, when it says
    kind: str = BASELINE_AGENT  # the agent's kind (codex, claude_code, gemini, ...) or "baseline"
    # Whether its runs will have a login: ready | missing | unknown (problems.Login).
    login: str = "ready"
    login_message: str = ""

    @property
    def is_baseline(self) -> bool:
        return self.agent == BASELINE_AGENT


def discover_models() -> list[ModelInfo]:
    """Every model a replay can use: the baselines, then each agent's models in settings order.

    Duplicates are dropped (the first position stays, a later entry's label wins);
    blank and malformed entries are ignored with a warning in the log.
    """
    found: dict[str, ModelInfo] = {
        model_id: ModelInfo(
            id=model_id, label=_BASELINE_LABELS[model_id], agent=BASELINE_AGENT, available=True
        )
        for model_id in _BASELINES
    }
    agents = settings.REPLAYS_AGENTS if isinstance(settings.REPLAYS_AGENTS, Mapping) else {}
    for name, entry in agents.items():
        try:
            kind = _check_agent(name, entry)
        except ValueError as exc:
            logger.warning("REPLAYS_AGENTS: agent %r ignored: %s", name, exc)
            continue
        agent_label = entry.get("label")
        if not isinstance(agent_label, str) or not agent_label.strip():
            agent_label = name
        reason = kind.unavailable_reason(entry)
        version = "" if reason else kind.version(entry)
        login = kind.login(entry)
        # The models the tool itself lists with this login (OpenCode, pi), after those named.
        listed = [] if reason else kind.discovered_models(entry)
        for item in [*entry["models"], *listed]:
            parsed = _model_entry(item)
            if parsed is None:
                logger.warning("REPLAYS_AGENTS: a model of %r ignored: %r", name, item)
                continue
            model, label = parsed
            model_id = f"{name}:{model}"
            if len(model_id) > MODEL_ID_LENGTH:
                logger.warning("REPLAYS_AGENTS: model id %r ignored: too long", model_id)
                continue
            info = ModelInfo(
                id=model_id,
                label=label or f"{agent_label.strip()} {model}",
                agent=name,
                available=not reason,
                reason=reason,
                model=model,
                version=version,
                kind=entry["kind"],
                login=login.state,
                login_message=login.message,
            )
            # dict keeps the first insertion's position when a later one replaces the value.
            found[model_id] = info
    return list(found.values())


def resolve_model(model_id: str) -> ModelInfo:
    """The model named by its id, or by its bare name when exactly one agent offers it."""
    wanted = model_id.strip() if isinstance(model_id, str) else ""
    models = discover_models()
    for info in models:
        if info.id == wanted:
            return info
    typed = _typed_by_hand(wanted, models)
    if typed is not None:
        return typed
    offering = [info for info in models if info.model and info.model == wanted]
    if len(offering) == 1:
        return offering[0]
    if len(offering) > 1:
        names = ", ".join(info.id for info in offering)
        raise UnknownModel(
            f"Model '{wanted}' is offered by several agents ({names}): name one of them."
        )
    known = ", ".join(info.id for info in models)
    raise UnknownModel(f"Unknown model '{wanted}'. Known: {known}")


def _typed_by_hand(wanted: str, models: list[ModelInfo]) -> ModelInfo | None:
    """`agent:model` for a configured agent names any model that agent can run, listed or not."""
    name, colon, model = wanted.partition(":")
    if not colon or not model.strip() or any(char.isspace() for char in model):
        return None
    sibling = next((info for info in models if info.agent == name), None)
    if sibling is None:
        return None
    agent_label = sibling.label.removesuffix(sibling.model).strip() or name
    return ModelInfo(
        id=wanted,
        label=f"{agent_label} {model}",
        agent=name,
        available=sibling.available,
        reason=sibling.reason,
        model=model,
        version=sibling.version,
        kind=sibling.kind,
    )


def adapter_for(model_id: str) -> Agent:
    """The adapter that runs `model_id` (see resolve_model for the names accepted)."""
    info = resolve_model(model_id)
    if info.is_baseline:
        return _BASELINES[info.id]()
    entry = settings.REPLAYS_AGENTS[info.agent]
    return KINDS[entry["kind"]].from_entry(info.agent, entry, info.model)


def judge_unavailable_reason(info: ModelInfo) -> str:
    """Why this model cannot act as an evaluator here ("" when it can)."""
    if info.is_baseline:
        return "A calibration baseline cannot judge."
    if not info.available:
        return info.reason
    entry = settings.REPLAYS_AGENTS[info.agent]
    return KINDS[entry["kind"]].judge_unavailable_reason(entry)


def _check_agent(name: object, entry: object) -> type[ConfiguredAgent]:
    if not isinstance(name, str) or not _AGENT_NAME_RE.match(name):
        raise ValueError("an agent name is letters, digits, '.', '_' or '-'")
    if name == BASELINE_AGENT:
        raise ValueError(f"'{BASELINE_AGENT}' is reserved for the built-in baselines")
    if not isinstance(entry, Mapping):
        raise ValueError("an agent is a JSON object")
    kind = KINDS.get(entry.get("kind"))  # type: ignore[arg-type]
    if kind is None:
        known = ", ".join(sorted(KINDS))
        raise ValueError(f"unknown kind {entry.get('kind')!r} (known: {known})")
    if not isinstance(entry.get("models"), list):
        raise ValueError("'models' must be a list")
    kind.check_entry(entry)
    return kind


def _model_entry(item: Any) -> tuple[str, str] | None:
    """(model, label) from "gpt-5" or {"id": "gpt-5", "label": "GPT-5"}; None when malformed."""
    label: object = ""
    if isinstance(item, Mapping):
        label = item.get("label", "")
        item = item.get("id")
    if not isinstance(item, str) or not isinstance(label, str):
        return None
    model = item.strip()
    if not model or any(char.isspace() for char in model):
        return None
    return model, label.strip()
