"""Exports: a batch's results and the leaderboard as CSV and JSON (`?format=csv|json`),
with the filters applied, linked from their pages."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from replays.api.renderers import csv_cell
from replays.factories.leaderboard import make_batch, make_threads, seed
from replays.models import Run

pytestmark = pytest.mark.django_db

LEADERBOARD_URL = reverse("api-leaderboard")

RESULT_COLUMNS = [
    "run",
    "thread",
    "thread_title",
    "model",
    "status",
    "failure_code",
    "winner",
    "consistent",
    "score_historical",
    "score_replay",
    "tests_kept",
    "tests_broken",
    "replay_cost_usd",
    "historical_cost_usd",
    "replay_seconds",
    "historical_seconds",
    "evaluator",
    "evaluator_cost_usd",
    "report_status",
]


def read_csv(response: Any) -> list[dict[str, str]]:
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    return list(csv.DictReader(io.StringIO(response.content.decode("utf-8"))))


def results_url(batch_id: int) -> str:
    return reverse("api-batch-results", args=[batch_id])


# --- the leaderboard -----------------------------------------------------------------------------


def test_the_leaderboard_as_csv_has_the_rows_with_the_filters_applied(
    api_client: Any, user: User
) -> None:
    seed(user, {"codex:m": ["win", "tie", "loss", "timeout"], "claude:m": ["loss"]})
    seed(user, {"codex:m": ["win"]}, evaluator="claude:judge")
    response = api_client.get(LEADERBOARD_URL, {"agent": "codex", "format": "csv"})
    rows = read_csv(response)
    assert response["Content-Disposition"] == 'attachment; filename="leaderboard.csv"'
    assert response["X-Replays-Evaluator"] == "tests"
    assert [row["model"] for row in rows] == ["codex:m"]
    [row] = rows
    assert (row["n"], row["wins"], row["ties"], row["losses"], row["failed"]) == (
        "4",
        "1",
        "1",
        "1",
        "1",
    )
    assert row["baseline"] == "false"
    assert float(row["rate"]) == 0.5
    assert Decimal(row["total_cost_usd"]) == Decimal("0.4")
    assert row["consistency"] == ""  # null: the tests evaluator judges in one pass
    by_evaluator = read_csv(
        api_client.get(LEADERBOARD_URL, {"evaluator": "claude:judge", "format": "csv"})
    )
    assert [(row["model"], row["wins"]) for row in by_evaluator] == [("codex:m", "1")]


def test_the_leaderboard_csv_has_its_header_even_without_rows(api_client: Any) -> None:
    response = api_client.get(LEADERBOARD_URL, {"format": "csv"})
    assert response.status_code == 200
    header = response.content.decode().splitlines()[0]
    assert header.startswith("model,baseline,n,wins,ties,losses,failed,setup,not_counted,rate,")


def test_the_leaderboard_as_json(api_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win", "win"], "empty": ["loss"]})
    response = api_client.get(LEADERBOARD_URL, {"format": "json"})
    assert response["Content-Type"] == "application/json"
    assert [(row["model"], row["n"]) for row in response.json()] == [("codex:m", 2), ("empty", 1)]


def test_a_bad_filter_on_a_csv_export_answers_in_the_json_error_shape(api_client: Any) -> None:
    response = api_client.get(LEADERBOARD_URL, {"since": "2026-02-30", "format": "csv"})
    assert response.status_code == 400
    assert response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "invalid_filter"
    assert response.json()["error"]["details"]["field"] == "since"


def test_the_leaderboard_page_exports_what_it_shows(logged_in_client: Any, user: User) -> None:
    seed(user, {"codex:m": ["win"], "claude:m": ["loss"]})
    page = logged_in_client.get(reverse("replays:leaderboard"), {"agent": "claude"})
    csv_url = page.context["csv_url"]
    assert csv_url == f"{LEADERBOARD_URL}?agent=claude&format=csv"
    # The page's own session is enough to download it.
    rows = read_csv(logged_in_client.get(csv_url))
    assert [row["model"] for row in rows] == ["claude:m"]


# --- a batch's results ---------------------------------------------------------------------------


def test_a_batchs_results_have_one_row_per_run_with_its_report(api_client: Any, user: User) -> None:
    seeded = seed(
        user,
        {"codex:m": [("win", 0.9), "timeout"], "historical": [("loss", 0.3), "review_failed"]},
        consistent=True,
    )
    response = api_client.get(results_url(seeded.batch.pk))
    assert response.status_code == 200
    body = response.json()
    assert len(body) == 4
    assert list(body[0]) == RESULT_COLUMNS
    first_thread = seeded.threads[0]
    won = next(row for row in body if row["model"] == "codex:m" and row["status"] == "completed")
    assert won == {
        "run": seeded.runs["codex:m"][0].pk,
        "thread": first_thread.pk,
        "thread_title": first_thread.title,
        "model": "codex:m",
        "status": "completed",
        "failure_code": "",
        "winner": "replay",
        "consistent": True,
        "score_historical": 1.0,
        "score_replay": 0.9,
        "tests_kept": 2,
        "tests_broken": 0,
        "replay_cost_usd": 0.1,
        "historical_cost_usd": 0.25,
        "replay_seconds": 60.0,
        "historical_seconds": 30.0,
        "evaluator": "tests",
        "evaluator_cost_usd": 0.01,
        "report_status": "judged",
    }
    lost = next(row for row in body if row["model"] == "historical" and row["winner"])
    assert (lost["winner"], lost["tests_broken"]) == ("historical", 1)
    failed = next(row for row in body if row["status"] == "failed")
    assert (failed["failure_code"], failed["winner"], failed["report_status"]) == (
        "timeout",
        None,
        None,
    )
    assert failed["tests_kept"] is None
    review_failed = next(row for row in body if row["report_status"] == "review_failed")
    assert (review_failed["winner"], review_failed["evaluator"]) == (None, "tests")


def test_a_batchs_results_as_csv(api_client: Any, user: User) -> None:
    seeded = seed(user, {"codex:m": [("win", 0.9), "timeout"]})
    Run.objects.filter(pk=seeded.runs["codex:m"][1].pk).update(cost_usd=None)
    response = api_client.get(results_url(seeded.batch.pk), {"format": "csv"})
    rows = read_csv(response)
    batch_id = seeded.batch.pk
    assert response["Content-Disposition"] == f'attachment; filename="batch-{batch_id}-results.csv"'
    assert list(rows[0]) == RESULT_COLUMNS
    assert [(row["winner"], row["consistent"], row["replay_cost_usd"]) for row in rows] == [
        ("replay", "", "0.100000"),
        ("", "", ""),  # no report; unknown price is empty, never 0
    ]
    assert rows[0]["score_replay"] == "0.9"


def test_a_batch_without_runs_exports_just_the_header(api_client: Any, user: User) -> None:
    batch = make_batch(user)
    response = api_client.get(results_url(batch.pk), {"format": "csv"})
    assert response.content.decode().splitlines() == [",".join(RESULT_COLUMNS)]


def test_another_users_batch_is_not_found(api_client: Any, other_user: User) -> None:
    seeded = seed(other_user, {"codex:m": ["win"]})
    for params in ({}, {"format": "csv"}):
        response = api_client.get(results_url(seeded.batch.pk), params)
        assert response.status_code == 404
        assert response["Content-Type"] == "application/json"
        assert response.json()["error"]["code"] == "not_found"


def test_staff_export_anyones_batch(client: Any, staff_user: User, other_user: User) -> None:
    seeded = seed(other_user, {"codex:m": ["win"]})
    client.force_login(staff_user)
    assert len(read_csv(client.get(results_url(seeded.batch.pk), {"format": "csv"}))) == 1


def test_the_batch_page_links_its_exports(logged_in_client: Any, user: User) -> None:
    seeded = seed(user, {"codex:m": ["win"]})
    html = logged_in_client.get(seeded.batch.get_absolute_url()).content.decode()
    assert f'href="{results_url(seeded.batch.pk)}?format=csv"' in html
    assert f'href="{results_url(seeded.batch.pk)}?format=json"' in html


def test_the_results_export_asks_the_same_queries_for_2_and_20_runs(
    api_client: Any, user: User
) -> None:
    def queries(batch_id: int) -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api_client.get(results_url(batch_id), {"format": "csv"}).status_code == 200
        return len(captured)

    small = seed(user, {"codex:m": ["win", "timeout"]})
    threads = make_threads(10)
    large = seed(
        user,
        {"codex:m": ["win", "loss"] * 5, "claude:m": ["tie", "cancelled"] * 5},
        threads=threads,
    )
    assert queries(small.batch.pk) == queries(large.batch.pk)


# --- the cells -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "cell"),
    [
        (None, ""),
        (True, "true"),
        (False, "false"),
        (3, "3"),
        (Decimal("0.100000"), "0.100000"),
        ("Fix the build", "Fix the build"),
        ('=HYPERLINK("http://x")', '\'=HYPERLINK("http://x")'),
        ("-1+2", "'-1+2"),
        ("@sum", "'@sum"),
    ],
)
def test_csv_cells_are_plain_and_never_formulas(value: object, cell: str) -> None:
    assert csv_cell(value) == cell
