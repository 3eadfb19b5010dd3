"""The leaderboard: the statistics behind it (known values), the selector over rows written
directly in the database, the page and GET /api/leaderboard/."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from replays import statistics
from replays.evaluation import leaderboard as leaderboards
from replays.factories.leaderboard import CREATED, REPOSITORY, make_threads, seed
from replays.models import Report

PAGE_URL = reverse("replays:leaderboard")
API_URL = reverse("api-leaderboard")


def board(user: User, **params: str) -> leaderboards.Leaderboard:
    return leaderboards.leaderboard(user=user, filters=leaderboards.parse_filters(params))


def row_of(result: leaderboards.Leaderboard, model: str) -> leaderboards.Row:
    [row] = [row for row in result.rows if row.model == model]
    return row


# --- statistics, with known values ---------------------------------------------------------------


def test_wilson_interval_of_known_proportions() -> None:
    # For k = n the lower bound is n / (n + z^2); 4 of 5 is the textbook (0.376, 0.964).
    three = statistics.wilson_interval(3, 3)
    assert three.low == pytest.approx(3 / (3 + statistics.Z_95**2))
    assert three.high == 1.0
    four = statistics.wilson_interval(4, 5)
    assert (four.low, four.high) == (
        pytest.approx(0.37553, abs=1e-5),
        pytest.approx(0.96378, abs=1e-5),
    )
    many = statistics.wilson_interval(250, 300)
    assert (many.low, many.high) == (
        pytest.approx(0.78700, abs=1e-5),
        pytest.approx(0.87123, abs=1e-5),
    )


def test_median_of_an_odd_count_is_the_middle_value() -> None:
    assert statistics.median([3.0, 1.0, 2.0]) == 2.0
    assert statistics.median([7.5]) == 7.5


def test_median_of_an_even_count_is_the_mean_of_the_middle_two() -> None:
    assert statistics.median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert statistics.median([Decimal("0.10"), Decimal("0.30")]) == Decimal("0.20")


def test_median_of_nothing_or_of_an_unknown_is_unknown() -> None:
    assert statistics.median([]) is None
    assert statistics.median([Decimal("0.10"), None, Decimal("0.30")]) is None


def test_total_is_unknown_when_any_value_is() -> None:
    assert statistics.total([Decimal("0.10"), Decimal("0.25")]) == Decimal("0.35")
    assert statistics.total([Decimal("0.10"), None]) is None
    assert statistics.total([]) == Decimal(0)


def test_dollars_counted_in_millionths_add_up_and_split_exactly() -> None:
    # 0.1 + 0.2 is not 0.3 in floats; in millionths of a dollar it is.
    assert statistics.total_usd([100_000, 200_000]) == Decimal("0.3")
    assert statistics.total_usd([100_000, None]) is None
    assert statistics.total_usd([]) == Decimal(0)
    assert statistics.median_usd([300_000, 1, 100_000]) == Decimal("0.1")
    # The mean of the middle two may need a seventh decimal place: it is kept.
    assert statistics.median_usd([1, 2]) == Decimal("0.0000015")
    assert statistics.median_usd([1, None]) is None
    assert statistics.median_usd([]) is None


def test_mean() -> None:
    assert statistics.mean([0.5, 1.0, 0.0]) == pytest.approx(0.5)
    assert statistics.mean([]) is None


def test_head_to_head_counts_each_pair_over_the_requests_both_have() -> None:
    scores = {
        "a": {1: 0.9, 2: 0.5, 3: 0.95},
        "b": {1: 0.8, 2: 0.5, 3: 0.99, 4: 1.0},
        "c": {9: 0.1},
    }
    records = statistics.head_to_head(scores)
    assert records[("a", "b")] == statistics.Record(wins=1, ties=1, losses=1)
    assert records[("b", "a")] == statistics.Record(wins=1, ties=1, losses=1)
    assert ("a", "c") not in records and ("c", "b") not in records
    assert records[("a", "b")].n == 3


def test_head_to_head_scores_equal_but_for_float_noise_tie() -> None:
    records = statistics.head_to_head({"a": {1: 0.1 + 0.2, 2: 0.9}, "b": {1: 0.3, 2: 0.4}})
    assert records[("a", "b")] == statistics.Record(wins=1, ties=1, losses=0)
    assert records[("b", "a")] == statistics.Record(wins=0, ties=1, losses=1)


# --- what counts ---------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_row_counts_wins_ties_losses_and_failures_against_the_model(user: User) -> None:
    seed(
        user,
        {
            "codex:gpt-5.5": [
                ("win", 0.9),
                ("win", 0.8),
                ("tie", 0.7),
                ("loss", 0.2),
                "timeout",
                "agent_error",
            ]
        },
    )
    row = row_of(board(user), "codex:gpt-5.5")
    assert (row.wins, row.ties, row.losses, row.failed, row.n) == (2, 1, 1, 2, 6)
    rate = statistics.wilson_interval(3, 6)
    assert (row.rate, row.rate_low, row.rate_high) == (3 / 6, rate.low, rate.high)
    assert row.mean_score == pytest.approx((0.9 + 0.8 + 0.7 + 0.2) / 4)
    assert row.total_cost_usd == Decimal("0.60")
    assert row.median_cost_usd == Decimal("0.10")
    assert row.median_seconds == 60.0
    assert row.cost_per_win_usd == Decimal("0.30")
    assert (row.setup, row.not_counted) == (0, 0)
    assert not row.baseline


@pytest.mark.django_db
def test_failed_reviews_cancels_and_our_own_failures_are_not_counted(user: User) -> None:
    seed(
        user,
        {
            "codex:gpt-5.5": [
                "win",
                "review_failed",
                "cancelled",
                "infrastructure",
                "launch_failed",
                "coordinator_lost",
                "pending",
            ]
        },
    )
    row = row_of(board(user), "codex:gpt-5.5")
    assert (row.n, row.wins, row.failed, row.rate) == (1, 1, 0, 1.0)
    assert row.not_counted == 6
    assert row.not_counted_reasons == {
        "review_failed": 1,
        "cancelled": 1,
        "infrastructure": 1,
        "launch_failed": 1,
        "coordinator_lost": 1,
        "awaiting_report": 1,
    }
    # Their cost is not in the figures either.
    assert row.total_cost_usd == Decimal("0.10")


@pytest.mark.django_db
def test_a_setup_failure_is_listed_apart_and_never_against_the_model(user: User) -> None:
    """An agent not logged in (or out of quota, or given a model id its provider does not
    know) says nothing about the model: it is not in n, its rate or its cost."""
    seed(user, {"claude:claude-sonnet-4-5": ["win", "setup", "setup", "agent_error"]})
    row = row_of(board(user), "claude:claude-sonnet-4-5")
    assert (row.n, row.wins, row.failed, row.setup, row.not_counted) == (2, 1, 1, 2, 0)
    assert row.rate == 0.5
    assert row.total_cost_usd == Decimal("0.20")
    assert row.not_counted_reasons == {}


@pytest.mark.django_db
def test_rows_are_ranked_by_the_lower_bound_so_three_of_three_is_below_250_of_300(
    user: User,
) -> None:
    seed(user, {"claude:small": ["win"] * 3})
    seed(user, {"codex:big": ["win"] * 250 + ["loss"] * 50})
    result = board(user)
    assert result.models == ["codex:big", "claude:small"]
    assert row_of(result, "claude:small").rate == 1.0
    assert row_of(result, "codex:big").rate_low == pytest.approx(0.78700, abs=1e-5)


@pytest.mark.django_db
def test_the_baselines_are_rows_marked_as_baselines(user: User) -> None:
    seed(
        user, {"historical": ["tie", "tie"], "empty": ["loss", "loss"], "codex:m": ["win", "loss"]}
    )
    result = board(user)
    assert {row.model: row.baseline for row in result.rows} == {
        "historical": True,
        "codex:m": False,
        "empty": True,
    }
    assert result.models[0] == "historical"


@pytest.mark.django_db
def test_unknown_prices_make_the_total_and_the_median_unknown_never_zero(user: User) -> None:
    seed(user, {"codex:m": ["win", "win"]})
    seed(user, {"codex:m": ["loss"]}, cost=None)
    row = row_of(board(user), "codex:m")
    assert (row.total_cost_usd, row.median_cost_usd, row.cost_per_win_usd) == (None, None, None)


@pytest.mark.django_db
def test_a_launch_failure_that_did_no_work_costs_nothing_rather_than_unknown(user: User) -> None:
    seeded = seed(user, {"codex:m": ["win", "launch_failed"]})
    launch_failed = seeded.runs["codex:m"][1]
    type(launch_failed).objects.filter(pk=launch_failed.pk).update(
        cost_usd=None, output_tokens=0, wall_seconds=None
    )
    row = row_of(board(user), "codex:m")
    assert row.total_cost_usd == Decimal("0.10")
    assert row.median_seconds == 60.0  # over the runs whose time is known


@pytest.mark.django_db
def test_consistency_is_over_the_judgments_made_in_both_orders(user: User) -> None:
    seed(user, {"codex:m": ["win", "tie", "loss"]}, evaluator="claude:judge", consistent=True)
    seed(user, {"codex:m": ["tie"]}, evaluator="claude:judge", consistent=False)
    seed(user, {"codex:t": ["win"]}, evaluator="claude:judge", consistent=None)
    result = board(user)
    assert row_of(result, "codex:m").consistency == 0.75
    assert row_of(result, "codex:t").consistency is None


@pytest.mark.django_db
def test_cost_per_win_needs_a_win(user: User) -> None:
    seed(user, {"codex:m": ["tie", "loss"]})
    assert row_of(board(user), "codex:m").cost_per_win_usd is None


# --- evaluators and prompt versions are never mixed ----------------------------------------------


@pytest.mark.django_db
def test_the_figures_are_for_the_most_used_evaluator_unless_one_is_asked_for(user: User) -> None:
    seed(user, {"codex:m": ["win", "win", "loss"]}, evaluator="tests")
    seed(user, {"codex:m": ["loss"]}, evaluator="claude:judge")
    default = board(user)
    assert (default.evaluator, default.prompt_version) == ("tests", "v1")
    assert row_of(default, "codex:m").n == 3
    other = board(user, evaluator="claude:judge")
    assert other.evaluator == "claude:judge"
    row = row_of(other, "codex:m")
    assert (row.n, row.losses) == (1, 1)


@pytest.mark.django_db
def test_prompt_versions_are_never_mixed(user: User) -> None:
    seed(user, {"codex:m": ["win", "win"]}, prompt_version="v1")
    seed(user, {"codex:m": ["loss", "loss", "loss"]}, prompt_version="v2")
    assert board(user).prompt_version == "v2"
    assert row_of(board(user), "codex:m").losses == 3
    row = row_of(board(user, prompt_version="v1"), "codex:m")
    assert (row.wins, row.losses) == (2, 0)


@pytest.mark.django_db
def test_failed_runs_count_in_the_view_of_their_batchs_evaluator(user: User) -> None:
    seed(user, {"codex:m": ["win", "win"]}, evaluator="tests")
    seed(user, {"codex:m": ["loss"]}, evaluator="claude:judge")
    seed(user, {"codex:m": ["timeout"]}, evaluator="claude:judge")
    assert row_of(board(user), "codex:m").failed == 0
    row = row_of(board(user, evaluator="claude:judge"), "codex:m")
    assert (row.n, row.failed) == (2, 1)


# --- filters -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_each_filter_keeps_only_its_runs(user: User) -> None:
    seed(user, {"codex:m": ["win"], "claude:m": ["loss"], "historical": ["tie"]})
    seed(user, {"codex:m": ["loss", "loss"]}, repository="/srv/repos/other")
    seed(user, {"codex:m": ["tie"]}, context="warm")
    seed(user, {"codex:m": ["win"]}, created_at=CREATED - timedelta(days=30))

    assert row_of(board(user, repository=REPOSITORY), "codex:m").n == 3
    assert row_of(board(user, repository="/srv/repos/other"), "codex:m").losses == 2
    assert board(user, agent="claude").models == ["claude:m"]
    assert board(user, agent="baseline").models == ["historical"]
    assert row_of(board(user, context="warm"), "codex:m").ties == 1
    assert row_of(board(user, context="cold"), "codex:m").n == 4
    since = (CREATED - timedelta(days=1)).date().isoformat()
    assert row_of(board(user, since=since), "codex:m").n == 4
    until = (CREATED - timedelta(days=29)).date().isoformat()
    assert row_of(board(user, until=until), "codex:m").n == 1
    day = CREATED.date().isoformat()
    assert row_of(board(user, since=day, until=day), "codex:m").n == 4


@pytest.mark.django_db
def test_the_filters_list_their_available_values(user: User) -> None:
    seed(user, {"codex:m": ["win", "win"], "historical": ["tie", "tie"]})
    seed(user, {"claude:m": ["loss"]}, evaluator="claude:judge", repository="/srv/other")
    choices = board(user).choices
    assert [(c.value, c.count) for c in choices.evaluators] == [("tests", 4), ("claude:judge", 1)]
    assert [c.value for c in choices.prompt_versions] == ["v1"]
    assert [c.value for c in choices.contexts] == ["cold"]
    assert [c.value for c in choices.repositories] == ["/srv/other", REPOSITORY]
    assert [c.value for c in choices.agents] == ["baseline", "claude", "codex"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"since": "yesterday"}, "since"),
        ({"until": "2026-13-01"}, "until"),
        ({"since": "2026-11-10", "until": "2026-11-01"}, "until"),
        ({"evaluator": "tests\x00"}, "evaluator"),
        ({"repository": "x" * 5000}, "repository"),
    ],
)
def test_bad_filter_values_are_refused_with_the_field(params: dict[str, str], field: str) -> None:
    with pytest.raises(leaderboards.InvalidFilter) as caught:
        leaderboards.parse_filters(params)
    assert caught.value.field == field


def test_empty_filter_values_mean_any() -> None:
    assert leaderboards.parse_filters({"evaluator": " ", "since": ""}) == leaderboards.Filters()


# --- who sees what -------------------------------------------------------------------------------


@pytest.mark.django_db
def test_another_users_runs_are_invisible_and_staff_see_all(
    user: User, other_user: User, staff_user: User
) -> None:
    seed(user, {"codex:m": ["win"]})
    seed(other_user, {"codex:m": ["loss", "loss"], "claude:m": ["win"]})
    mine = board(user)
    assert mine.models == ["codex:m"]
    assert row_of(mine, "codex:m").n == 1
    assert [c.value for c in mine.choices.agents] == ["codex"]
    everyone = board(staff_user)
    assert row_of(everyone, "codex:m").n == 3
    assert set(everyone.models) == {"codex:m", "claude:m"}


# --- head to head --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_head_to_head_is_over_the_requests_both_models_replayed_and_got_judged(
    user: User,
) -> None:
    seeded = seed(
        user,
        {
            "codex:a": [("win", 0.9), ("tie", 0.6), ("loss", 0.2), "timeout"],
            "claude:b": [("tie", 0.7), ("tie", 0.6), ("win", 0.8), ("win", 0.9)],
        },
    )
    # Another batch on the same first request: the latest run counts, once.
    seed(user, {"codex:a": [("loss", 0.1)]}, threads=seeded.threads[:1])
    # The same request judged by another evaluator is not compared.
    seed(user, {"claude:b": [("win", 1.0)]}, evaluator="claude:judge", threads=seeded.threads[1:2])
    result = board(user)
    assert result.head_to_head[("codex:a", "claude:b")] == statistics.Record(0, 1, 2)
    assert result.head_to_head[("claude:b", "codex:a")] == statistics.Record(2, 1, 0)


# --- the page ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_page_shows_the_figures_a_person_reads(logged_in_client: Any, user: User) -> None:
    seed(
        user,
        {
            "codex:gpt-5.5": ["win", "win", "win", "tie", "loss"],
            "historical": ["tie", "tie", "tie", "tie", "tie"],
        },
        consistent=True,
    )
    response = logged_in_client.get(PAGE_URL)
    assert response.status_code == 200
    html = response.content.decode()
    assert "80% (38–96%)" in html  # 4 of 5, Wilson 95%
    assert "100% (57–100%)" in html  # 5 of 5
    assert "baseline</span>" in html
    assert "Figures for evaluator <code>tests</code>, prompts <code>v1</code>" in html
    assert "$0.5000" in html and "$0.1000" in html  # total, median
    assert "$0.1667" in html  # cost per win: 0.50 / 3
    assert "1m" in html  # median time
    assert "Wilson interval" in html
    assert 'aria-current="page">Leaderboard</a>' in html
    rows = [row.model for row in response.context["board"].rows]
    assert rows == ["historical", "codex:gpt-5.5"]


@pytest.mark.django_db
def test_the_page_draws_the_rates_as_an_accessible_svg(logged_in_client: Any, user: User) -> None:
    seed(user, {"codex:m": [("win", 0.9), ("loss", 0.2)], "claude:m": [("win", 0.8), "win"]})
    html = logged_in_client.get(PAGE_URL).content.decode()
    assert '<svg class="rate-chart"' in html
    assert '<title id="rate-chart-title">' in html and '<desc id="rate-chart-desc">' in html
    assert html.count('class="rate-chart-dot"') == 2
    assert "Head to head" in html
    assert html.count(">1–0–1<") == 2  # each against the other: one win, one loss


@pytest.mark.django_db
def test_the_page_says_unknown_price_rather_than_zero(logged_in_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win"]}, cost=None)
    html = logged_in_client.get(PAGE_URL).content.decode()
    assert "unknown price" in html
    assert "$0.00" not in html


@pytest.mark.django_db
def test_the_page_links_exports_carrying_its_filters(logged_in_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win"]})
    html = logged_in_client.get(
        PAGE_URL, {"agent": "codex", "since": "2026-11-01"}
    ).content.decode()
    assert f"{API_URL}?agent=codex&amp;since=2026-11-01&amp;format=csv" in html
    assert f"{API_URL}?agent=codex&amp;since=2026-11-01&amp;format=json" in html


@pytest.mark.django_db
def test_the_page_without_judged_runs_says_how_to_get_some(logged_in_client: Any) -> None:
    response = logged_in_client.get(PAGE_URL)
    assert response.status_code == 200
    assert "No judged runs yet: replay a thread" in response.content.decode()


@pytest.mark.django_db
def test_the_page_explains_a_bad_filter(logged_in_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win"]})
    response = logged_in_client.get(PAGE_URL, {"since": "last week"})
    assert response.status_code == 400
    html = response.content.decode()
    assert "since must be a date written YYYY-MM-DD, not &#x27;last week&#x27;." in html
    assert "rate-chart" not in html


def test_the_page_needs_a_login(client: Any, db: None) -> None:
    response = client.get(PAGE_URL)
    assert response.status_code == 302
    assert "login" in response["Location"]


# --- the API -------------------------------------------------------------------------------------

ROW_KEYS = [
    "model",
    "baseline",
    "n",
    "wins",
    "ties",
    "losses",
    "failed",
    "setup",
    "not_counted",
    "rate",
    "rate_low",
    "rate_high",
    "mean_score",
    "total_cost_usd",
    "median_cost_usd",
    "median_seconds",
    "cost_per_win_usd",
    "consistency",
]


@pytest.mark.django_db
def test_the_api_returns_the_bare_list_of_rows(api_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win", "tie", "loss", "timeout"], "empty": ["loss"] * 4})
    response = api_client.get(API_URL)
    assert response.status_code == 200
    assert response["X-Replays-Evaluator"] == "tests"
    assert response["X-Replays-Prompt-Version"] == "v1"
    body = response.json()
    assert [row["model"] for row in body] == ["codex:m", "empty"]
    assert list(body[0]) == ROW_KEYS
    rate = statistics.wilson_interval(2, 4)
    assert body[0] == {
        "model": "codex:m",
        "baseline": False,
        "n": 4,
        "wins": 1,
        "ties": 1,
        "losses": 1,
        "failed": 1,
        "setup": 0,
        "not_counted": 0,
        "rate": 0.5,
        "rate_low": rate.low,
        "rate_high": rate.high,
        "mean_score": 0.5,
        "total_cost_usd": 0.4,
        "median_cost_usd": 0.1,
        "median_seconds": 60.0,
        "cost_per_win_usd": 0.4,
        "consistency": None,
    }
    assert body[1]["baseline"] is True


@pytest.mark.django_db
def test_the_api_applies_the_filters(api_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win"], "claude:m": ["loss"]})
    seed(user, {"codex:m": ["loss"]}, evaluator="claude:judge")
    body = api_client.get(API_URL, {"agent": "codex", "evaluator": "claude:judge"}).json()
    assert [(row["model"], row["losses"]) for row in body] == [("codex:m", 1)]


@pytest.mark.django_db
def test_the_api_refuses_a_bad_filter_in_its_error_shape(api_client: Any) -> None:
    response = api_client.get(API_URL, {"until": "soon"})
    assert response.status_code == 400
    assert response.json() == {
        "error": {
            "code": "invalid_filter",
            "message": "until must be a date written YYYY-MM-DD, not 'soon'.",
            "details": {"field": "until", "value": "soon"},
        }
    }


@pytest.mark.django_db
def test_the_api_shows_only_the_users_runs(api_client: Any, user: User, other_user: User) -> None:
    seed(other_user, {"codex:m": ["win"]})
    response = api_client.get(API_URL)
    assert response.json() == []
    assert response["X-Replays-Evaluator"] == ""


@pytest.mark.django_db
def test_the_filters_endpoint_names_the_evaluator_and_the_available_values(
    api_client: Any, user: User
) -> None:
    seed(user, {"codex:m": ["win", "win"]})
    seed(user, {"codex:m": ["loss"]}, evaluator="claude:judge")
    body = api_client.get(reverse("api-leaderboard-filters"), {"agent": "codex"}).json()
    assert body["evaluator"] == "tests"
    assert body["prompt_version"] == "v1"
    assert body["filters"] == {"agent": "codex"}
    assert body["available"]["evaluator"] == [
        {"value": "tests", "count": 2},
        {"value": "claude:judge", "count": 1},
    ]
    assert body["available"]["agent"] == [{"value": "codex", "count": 3}]


# --- a fixed number of queries -------------------------------------------------------------------


def _seed_runs(user: User, count: int) -> None:
    """`count` runs over four models, with every kind of outcome among them."""
    kinds = [
        "win",
        "tie",
        "loss",
        "timeout",
        "review_failed",
        "cancelled",
        "win",
        "loss",
        "tie",
        "win",
    ]
    models = ["codex:a", "claude:b", "historical", "empty"]
    threads = make_threads(count)
    per_model: dict[str, list[Any]] = {model: [] for model in models}
    for index in range(count):
        per_model[models[index % len(models)]].append(kinds[index % len(kinds)])
    seed(user, per_model, threads=threads)


def _queries(client: Any, url: str) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url)
    assert response.status_code == 200
    return len(queries)


@pytest.mark.django_db
@pytest.mark.parametrize("door", ["page", "api"])
def test_the_number_of_queries_does_not_grow_with_the_runs(
    door: str, client: Any, api_client: Any, user: User, other_user: User
) -> None:
    client.force_login(user)
    http, url = (client, PAGE_URL) if door == "page" else (api_client, API_URL)
    _seed_runs(user, 2)
    few = _queries(http, url)
    _seed_runs(user, 18)
    assert Report.objects.filter(run__batch__owner=user).count() >= 10
    assert _queries(http, url) == few
