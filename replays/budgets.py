"""A campaign's budget, as dispatch keeps it.

A member starts only while the money spent, plus the estimates of the members in flight,
plus its own estimate, stays within the budget; started, it may spend at most what was
left (its cost cap: claude is given it as --max-budget-usd, and the coordinator stops any
agent whose reported cost passes it). A member that cannot start while nothing else of
its campaign is in flight never will: it ends `budget_exhausted` (ours, never counted
against a model). A member's estimate holds its share of the judging too (the evaluator's
cost counts), until its judgment is written with what it really cost. So the money spent
exceeds the budget by at most one run's overshoot past its cap (an agent's cost is known
only as it reports it)."""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Sum

from replays.models import (
    FINISHED_REPORT_STATUSES,
    Campaign,
    Report,
    Review,
    Run,
    RunStatus,
)

IN_FLIGHT = (RunStatus.LAUNCHING, RunStatus.RUNNING)
ZERO = Decimal(0)


@dataclass
class Money:
    """A campaign's money now."""

    budget: Decimal | None  # None: no budget
    spent: Decimal  # what ended runs and written judgments cost
    in_flight: Decimal  # held for runs in flight and judgments to come (their estimates)
    flying: int = 0  # members in flight

    @property
    def left(self) -> Decimal | None:
        return None if self.budget is None else self.budget - self.spent - self.in_flight

    @property
    def committed(self) -> Decimal:
        """Spent, plus what is held for the work under way."""
        return self.spent + self.in_flight


def money_of(campaign: Campaign) -> Money:
    """What the campaign spent and holds. An ended run counts its cost (its estimate when
    its cost is unknown and it started; nothing when it never started); a run in flight
    holds its estimate (or what it cost so far, when more); a completed run not yet
    judged holds its share of the judging; a judgment counts what its evaluator cost, and
    each shared review its own cost once."""
    judging_share = _judging_share(campaign)
    spent = in_flight = ZERO
    flying = 0
    rows = (
        Run.objects.filter(batch__campaign=campaign)
        .exclude(status=RunStatus.QUEUED)
        .values_list("pk", "status", "cost_usd", "estimated_cost_usd", "started_at")
    )
    judged = set(
        Report.objects.filter(
            run__batch__campaign=campaign, status__in=FINISHED_REPORT_STATUSES
        ).values_list("run_id", flat=True)
    )
    for run_id, status, cost, estimated, started_at in rows:
        estimate = estimated or ZERO
        if status in IN_FLIGHT:
            flying += 1
            in_flight += max(cost or ZERO, estimate)
            continue
        if cost is not None:
            spent += cost
        elif started_at is not None:
            spent += max(ZERO, estimate - judging_share)
        if status == RunStatus.COMPLETED and run_id not in judged:
            in_flight += judging_share
    reports = Report.objects.filter(run__batch__campaign=campaign)
    spent += reports.aggregate(total=Sum("evaluator_cost_usd"))["total"] or ZERO
    reviews = Review.objects.filter(pk__in=reports.values("review_id"))
    spent += reviews.aggregate(total=Sum("cost_usd"))["total"] or ZERO
    return Money(budget=campaign.budget_usd, spent=spent, in_flight=in_flight, flying=flying)


def _judging_share(campaign: Campaign) -> Decimal:
    """What one member's judgment is expected to cost (the prepare estimate)."""
    share = (campaign.estimate or {}).get("evaluator_per_run_usd")
    return Decimal(str(share)) if share else ZERO


@dataclass(frozen=True)
class Admission:
    admit: bool
    cap: Decimal | None = None  # the most the member may spend (None: no cap)
    exhausted: bool = False  # it never will start: end it budget_exhausted


class Ledger:
    """The budgets of the campaigns whose members one claim looks at, kept up to date as
    it admits them (inside the claim's serialised transaction)."""

    def __init__(self) -> None:
        self._money: dict[int, Money] = {}

    def admit(self, campaign_id: int | None, estimate: Decimal | None) -> Admission:
        if campaign_id is None:
            return Admission(admit=True)
        money = self._money_of(campaign_id)
        left = money.left
        if left is None:
            return Admission(admit=True)
        if (estimate or ZERO) <= left:
            return Admission(admit=True, cap=max(ZERO, left))
        return Admission(admit=False, exhausted=money.flying == 0)

    def claimed(self, campaign_id: int | None, estimate: Decimal | None) -> None:
        if campaign_id is not None and campaign_id in self._money:
            money = self._money[campaign_id]
            money.in_flight += estimate or ZERO
            money.flying += 1

    def _money_of(self, campaign_id: int) -> Money:
        if campaign_id not in self._money:
            self._money[campaign_id] = money_of(Campaign.objects.get(pk=campaign_id))
        return self._money[campaign_id]


def waiting_for_money(campaign: Campaign, money: Money | None = None) -> bool:
    """Members queued while the budget holds them back (pages say so)."""
    money = money if money is not None else money_of(campaign)
    return (
        money.left is not None
        and money.flying > 0
        and Run.objects.filter(batch__campaign=campaign, status=RunStatus.QUEUED).exists()
    )

