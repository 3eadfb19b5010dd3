"""What a batch may cost, said before it is approved: the historical tokens of each thread's
range priced at every candidate model's prices.

An estimate only: another model spends other tokens on the same requests, and the
evaluator's cost comes on top. A model with no known price has an unknown estimate
(None), never $0; the calibration baselines call no model and cost $0.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db.models import Q, Sum

from replays import agents, pricing
from replays.models import TOKEN_FIELDS, Plan, Turn
from replays.transcripts.base import TokenUsage


@dataclass(frozen=True)
class ModelEstimate:
    model: str  # the model id, as the plan names it
    label: str
    priced_as: str  # the model as its agent names it (the price table's key); "" for a baseline
    per_thread: list[Decimal | None]  # in the plan's thread order; None: unknown price
    total: Decimal | None


@dataclass(frozen=True)
class PlanEstimate:
    thread_ids: list[int]
    tokens: list[TokenUsage]  # the historical tokens of each thread's range, same order
    models: list[ModelEstimate]

    @property
    def several_threads(self) -> bool:
        return len(self.thread_ids) > 1

    @property
    def total_tokens(self) -> int:
        return sum(usage.total for usage in self.tokens)


def estimate_costs(
    *,
    tokens: list[TokenUsage],
    models: list[tuple[str, agents.ModelInfo | None]],
    table: pricing.PriceTable,
) -> list[ModelEstimate]:
    """Each model's cost for every thread's tokens, and the total (unknown when the model's
    price is; a model that no agent offers any more is unknown too)."""
    estimates = []
    for model_id, info in models:
        per_thread: list[Decimal | None]
        if info is not None and info.is_baseline:
            per_thread = [Decimal(0) for _ in tokens]
        else:
            price = table.lookup(info.model) if info is not None and info.model else None
            per_thread = [price.cost_usd(usage) if price else None for usage in tokens]
        known = [cost for cost in per_thread if cost is not None]
        estimates.append(
            ModelEstimate(
                model=model_id,
                label=info.label if info is not None else model_id,
                priced_as=info.model if info is not None else "",
                per_thread=per_thread,
                total=sum(known, Decimal(0)) if len(known) == len(per_thread) else None,
            )
        )
    return estimates


def range_tokens(preparations: list[dict[str, Any]]) -> dict[int, TokenUsage]:
    """The historical tokens of each prepared thread's range, summed over its Turn rows:
    two queries however many threads (the range's ends, then one sum per thread)."""
    ends = {
        (thread_id, uuid): index
        for thread_id, uuid, index in Turn.objects.filter(
            thread_id__in=[prep["thread_id"] for prep in preparations],
            message_uuid__in=[
                prep.get(key)
                for prep in preparations
                for key in ("start_message_uuid", "end_message_uuid")
            ],
        ).values_list("thread_id", "message_uuid", "index")
    }
    ranges = Q(pk__in=[])
    for prep in preparations:
        first = ends.get((prep["thread_id"], prep.get("start_message_uuid")))
        last = ends.get((prep["thread_id"], prep.get("end_message_uuid")))
        if first is not None and last is not None:
            ranges |= Q(thread_id=prep["thread_id"], index__gte=first, index__lte=last)
    sums = (
        Turn.objects.filter(ranges)
        .values("thread_id")
        .order_by("thread_id")
        .annotate(**{f"sum_{name}": Sum(name) for name in TOKEN_FIELDS})
    )
    return {
        row["thread_id"]: TokenUsage(*(row[f"sum_{name}"] or 0 for name in TOKEN_FIELDS))
        for row in sums
    }


def plan_estimate(plan: Plan, *, known_models: list[agents.ModelInfo]) -> PlanEstimate:
    """The estimate the approval shows, for the models the plan names (`known_models` is what
    agents.discover_models() found, so the page asks the agents once)."""
    by_id = {info.id: info for info in known_models}
    models = []
    for model_id in plan.configuration["models"]:
        info = by_id.get(model_id)
        if info is None:
            try:
                info = agents.resolve_model(model_id)  # `agent:model` typed by hand
            except agents.UnknownModel:
                info = None
        models.append((model_id, info))
    thread_ids = [item["thread_id"] for item in plan.configuration["configurations"]]
    by_thread = range_tokens(plan.preparations)
    tokens = [by_thread.get(thread_id, TokenUsage()) for thread_id in thread_ids]
    table = pricing.load_price_table(settings.REPLAYS_PRICES_FILE)
    return PlanEstimate(
        thread_ids=thread_ids,
        tokens=tokens,
        models=estimate_costs(tokens=tokens, models=models, table=table),
    )
