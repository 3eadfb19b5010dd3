"""The pages a person opens most (a batch, a comparison, the leaderboard page and API, the
thread list) ask the database the same number of queries however much there is: a
small data set and one several times larger, with a larger batch on it, give the same
count. bench/pages.py times them at 10,000 runs; this keeps them from growing an N+1."""

from __future__ import annotations

import itertools
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from replays.factories.leaderboard import CREATED, Seeded, make_threads, seed
from replays.models import Report, ReportStatus, Thread, Turn

# Every kind of ending a member can have, so every branch of the pages is drawn.
OUTCOMES = [("win", 0.9), ("tie", 0.5), ("loss", 0.2), "timeout", "review_failed", "pending"]
OUTCOMES += ["cancelled", "agent_error", ("win", 0.7)]


def seed_batch(owner: User, *, threads: int, models: int, turns: int) -> Seeded:
    """One batch of `threads` x `models` members on new threads of `owner`, each thread
    with `turns` turns."""
    made = make_threads(threads)
    Thread.objects.filter(pk__in=[thread.pk for thread in made]).update(
        owner=owner, turn_count=turns
    )
    Turn.objects.bulk_create(
        Turn(
            thread=thread,
            index=index,
            message_uuid=f"uuid-{thread.pk}" if index == 0 else f"uuid-{thread.pk}-{index}",
            timestamp=CREATED + timedelta(minutes=index),
            request=f"Request {index}",
        )
        for thread in made
        for index in range(turns)
    )
    outcomes = itertools.cycle(OUTCOMES)
    return seed(
        owner,
        {f"agent:model-{m}": [next(outcomes) for _ in made] for m in range(models)},
        threads=made,
    )


def page_urls(studied: Seeded) -> dict[str, str]:
    judged = (
        Report.objects.filter(run__batch=studied.batch, is_current=True, status=ReportStatus.JUDGED)
        .order_by("run_id")
        .first()
    )
    assert judged is not None
    return {
        "batch": reverse("replays:batch-detail", args=[studied.batch.pk]),
        "comparison": reverse("replays:run-compare", args=[judged.run_id]),
        "leaderboard": reverse("replays:leaderboard"),
        "leaderboard api": "/api/leaderboard/",
        "thread list": reverse("replays:thread-list"),
    }


def queries_of(client: Any, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200, url
    return len(queries)


@pytest.mark.django_db
@pytest.mark.parametrize(
    "page", ["batch", "comparison", "leaderboard", "leaderboard api", "thread list"]
)
def test_a_page_asks_as_many_queries_for_a_large_data_set_as_for_a_small_one(
    page: str, client: Any, user: User
) -> None:
    client.force_login(user)
    small = page_urls(seed_batch(user, threads=2, models=2, turns=2))[page]
    client.get(small)  # the first request of a session reads what later ones have
    few = queries_of(client, small)

    for _ in range(4):
        seed_batch(user, threads=5, models=4, turns=6)
    large = page_urls(seed_batch(user, threads=6, models=5, turns=8))[page]
    assert Report.objects.filter(run__batch__owner=user).count() > 60

    assert queries_of(client, large) == few
