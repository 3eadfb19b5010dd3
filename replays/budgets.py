"""A campaign's budget, as dispatch keeps it: a member starts only while the money spent
plus the estimates of the members in flight, plus its own estimate, stays within the
budget; started, it may spend at most what was left (its cost cap, at which its agent is
stopped). What cannot start when nothing is in flight ends `budget_exhausted` (ours,
never counted against a model). So the money spent exceeds the budget by at most one
run's overshoot past its cap (an agent's cost is known only as it reports it)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Sum

from replays.models import ACTIVE_RUN_STATUSES, Campaign, Report, Review, Run, RunStatus

IN_FLIGHT = (RunStatus.LAUNCHING, RunStatus.RUNNING)


@dataclass
class Money:
    budget: Decimal
    spent: Decimal  # what ended runs and judgments cost (a run's, or its estimate if unknown)
    in_flight: Decimal  # the estimates (or costs so far, when higher) of runs in flight

    @property
    def left(self) -> Decimal:
        return self.budget - self.spent - self.in_flight


def money_of(campaign: Campaign) -> Money | None:
    """The campaign's money now; None without a budget."""
    if campaign.budget_usd is None:
        return None
    runs = Run.objects.filter(batch__campaign=campaign)
    spent = Decimal(0)
    in_flight = Decimal(0)
    for status, cost, estimated in runs.exclude(status=RunStatus.QUEUED).values_list(
        "status", "cost_usd", "estimated_cost_usd"
    ):
        known = cost if cost is not None else (estimated or Decimal(0))
        if status in IN_FLIGHT:
            in_flight += max(known, estimated or Decimal(0))
        else:
            spent += known
    judged = Report.objects.filter(run__batch__campaign=campaign)
    spent += judged.aggregate(total=Sum("evaluator_cost_usd"))["total"] or Decimal(0)
    reviews = Review.objects.filter(pk__in=judged.values("review_id"))
    spent += reviews.aggregate(total=Sum("cost_usd"))["total"] or Decimal(0)
    return Money(budget=campaign.budget_usd, spent=spent, in_flight=in_flight)


def spent_of(campaign: Campaign) -> Decimal:
    """Money spent so far, runs in flight counted by what they reported (pages and API)."""
    money = money_of(campaign) if campaign.budget_usd is not None else None
    if money is not None:
        return money.spent
    total = Run.objects.filter(batch__campaign=campaign).aggregate(total=Sum("cost_usd"))
    return total["total"] or Decimal(0)


def waiting(campaign: Campaign) -> bool:
    return Run.objects.filter(batch__campaign=campaign, status__in=ACTIVE_RUN_STATUSES).exists()
