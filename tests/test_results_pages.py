"""What a person sees of the judgment on the batch and run pages: the winner, history against
the replay with the better side marked, tests kept and broken, the batch's wins, ties and
losses and its costs; the live part htmx swaps in place while runs are active; constant
queries whatever the number of runs."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Batch, Report, ReportStatus, Run, RunPhase, RunStatus

pytestmark = pytest.mark.django_db


def graph(user: User, tmp_path: Path, models: list[str]) -> tuple[Batch, list[Run]]:
    repo, baseline, ending = make_git_repo(tmp_path)
    return make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=models, evaluator="tests"
    )


def complete(run: Run, **values: Any) -> None:
    fields = {
        "status": RunStatus.COMPLETED,
        "phase": RunPhase.DONE,
        "finished_at": timezone.now(),
        "wall_seconds": 90.0,
        "cost_usd": Decimal("0.40"),
        **values,
    }
    Run.objects.filter(pk=run.pk).update(**fields)


def judge(run: Run, winner: str | None, **values: Any) -> Report:
    data = {
        "schema": 1,
        "historical": {"cost_usd": 0.25, "seconds": 120.0},
        "tests": {"usable": True, "reason": "", "kept": ["t1", "t2"], "broken": ["t3"]},
        "review": {"id": None, "cost_usd": 0.0},
    }
    fields: dict[str, Any] = {
        "status": ReportStatus.JUDGED if winner else ReportStatus.REVIEW_FAILED,
        "winner": winner,
        "score_historical": 1.0 if winner else None,
        "score_replay": 0.5 if winner else None,
        "consistent": True if winner else None,
        "evaluator": "tests",
        "evaluator_cost_usd": Decimal("0.01"),
        "reason": "" if winner else "The evaluator's answer is not JSON: <b>oops</b>",
        "data": data,
        **values,
    }
    return Report.objects.create(run=run, is_current=True, finished_at=timezone.now(), **fields)


def test_a_judged_card_shows_the_winner_and_history_against_the_replay(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [lost, tied, failed] = graph(user, tmp_path, ["historical", "empty", "x:m"])
    complete(lost)
    judge(lost, "historical")
    complete(tied, cost_usd=Decimal("0.10"), wall_seconds=30.0)
    judge(tied, "tie", consistent=False, score_replay=1.0)
    complete(failed)
    judge(failed, None)
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert page.count('class="verdict verdict-') == 2
    assert '<strong class="verdict-winner">Historical</strong>' in page
    assert '<strong class="verdict-winner">Tie</strong>' in page and ">inconsistent<" in page
    # Better marks in classes and in words for screen readers.
    assert '<td class="better">$0.2500<span class="visually-hidden"> (better)</span></td>' in page
    assert '<td class="better">$0.1000<span class="visually-hidden"> (better)</span></td>' in page
    assert '<td class="better">30s<span class="visually-hidden"> (better)</span></td>' in page
    assert "2 kept" in page and "1 broken" in page
    # A review that failed says why, escaped.
    assert "Not judged" in page and "&lt;b&gt;oops&lt;/b&gt;" in page and "<b>oops" not in page
    # The header: wins / ties / losses, the replays' cost against history's, the evaluator's.
    assert (
        '<span class="wtl-win">0</span> / <span class="wtl-tie">1</span> / <span class="wtl-loss">1</span>'
        in page
    )
    # History's cost counts once for the one request the three models replayed.
    assert '$0.5000 <span class="versus-word">vs</span> $0.2500' in page
    assert "history's for the same request (1, counted once)" in page
    assert "1 tie inconsistent" in page and "1 not judged" in page
    assert "$0.0300" in page  # three judgments at $0.01


def test_the_live_part_is_polled_while_runs_are_active_and_then_no_more(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [done, queued] = graph(user, tmp_path, ["historical", "empty"])
    complete(done)
    judge(done, "tie")
    partial = logged_in_client.get(batch.get_absolute_url(), HTTP_HX_REQUEST="true")
    body = partial.content.decode()
    assert "<html" not in body and body.lstrip().startswith('<div id="batch-live"')
    assert 'hx-trigger="every 2s"' in body
    complete(queued)
    judge(queued, "historical")
    body = logged_in_client.get(batch.get_absolute_url(), HTTP_HX_REQUEST="true").content.decode()
    assert "hx-trigger" not in body and "Results ready" in body
    # A reload restores everything from the server: the full page has the same part.
    full = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "<html" in full and '<div id="batch-live"' in full and "hx-trigger" not in full


def test_the_batch_list_and_the_batch_page_agree_on_pending_reviews(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [first, second] = graph(user, tmp_path, ["historical", "empty"])
    complete(first)
    complete(second)
    judge(first, "tie")
    listing = logged_in_client.get("/batches/").content.decode()
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "reviews pending" in listing and "reviews pending" in page
    judge(second, "tie")
    listing = logged_in_client.get("/batches/").content.decode()
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "Results ready" in listing and "Results ready" in page


def test_a_completed_run_without_output_says_so_and_its_page_stops_polling(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    _, [run] = graph(user, tmp_path, ["empty"])
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.RUNNING, phase=RunPhase.REVIEWING, started_at=timezone.now()
    )
    running = logged_in_client.get(f"/runs/{run.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert running.lstrip().startswith('<div id="run-live"') and 'hx-trigger="every 2s"' in running
    assert "Judging against history" in running
    complete(run, log_tail="")
    judge(run, "historical")
    page = logged_in_client.get(f"/runs/{run.pk}/").content.decode()
    assert "The agent wrote no output." in page and "No output yet" not in page
    assert "hx-trigger" not in page and "Against history" in page


@pytest.mark.parametrize("path", ["/batches/{batch}/", "/runs/{run}/", "/batches/"])
def test_result_pages_ask_a_constant_number_of_queries(
    client: Any, user: User, tmp_path: Path, path: str
) -> None:
    client.force_login(user)
    counts = []
    for size in (2, 20):
        batch, runs = graph(user, tmp_path / str(size), [f"x:m{i}" for i in range(size)])
        for run in runs:
            complete(run)
            judge(run, "tie")
        url = path.format(batch=batch.pk, run=runs[-1].pk)
        client.get(url)  # warm caches (agents discovery, sessions)
        with CaptureQueriesContext(connection) as queries:
            assert client.get(url).status_code == 200
        counts.append(len(queries))
    assert counts[0] == counts[1], counts


def test_a_card_shows_the_first_line_of_a_reason_whole_and_links_to_the_rest(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    """Cards cut reasons just before their cause; now the first line is whole and the rest
    is a link away. A setup failure says it is not counted against the model."""
    batch, [unjudged, setup] = graph(user, tmp_path, ["historical", "claude:sonnet"])
    complete(unjudged)
    cause = "ModuleNotFoundError: No module named 'tests.test_core'"
    long_reason = "The `tests` evaluator needs the verify command to pass. " * 12 + cause
    judge(unjudged, None, reason=long_reason + "\nsecond line")
    Run.objects.filter(pk=setup.pk).update(
        status=RunStatus.FAILED, phase=RunPhase.DONE, finished_at=timezone.now(),
        failure_code="setup",
        failure_message="Setup problem (not logged in): Not logged in · Please run /login\n"
        "Fix: give it your login.",
    )  # fmt: skip
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert cause.replace("'", "&#x27;") in page
    assert f'href="/runs/{unjudged.pk}/compare/">The whole reason and the tests\' output' in page
    card = page[page.index(f'id="run-{setup.pk}"') :]
    assert "Setup problem (not logged in): Not logged in · Please run /login" in card
    assert "not counted against the model: setup (the user&#x27;s or the provider&#x27;s)" in card
    assert f'<a href="/runs/{setup.pk}/">The whole message →</a>' in card
    assert "Fix: give it your login." not in card  # on the run's page
    run_page = logged_in_client.get(f"/runs/{setup.pk}/").content.decode()
    assert "Fix: give it your login." in run_page


def test_a_batch_where_nothing_was_judged_says_so_not_results_ready(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, runs = graph(user, tmp_path, ["historical", "empty"])
    for run in runs:
        complete(run)
        judge(run, None)
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "Finished · not judged" in page and "Results ready" not in page
    assert "no run was judged: each card says why" in page
    listing = logged_in_client.get("/batches/").content.decode()
    assert "Finished · not judged" in listing and "Results ready" not in listing
    # One verdict is enough for results.
    complete(runs[0])
    Report.objects.filter(run=runs[0]).update(is_current=False)
    judge(runs[0], "tie")
    assert "Results ready" in logged_in_client.get(batch.get_absolute_url()).content.decode()


def test_equal_shown_values_mark_no_side_better(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    """ "Time <1s vs <1s (better)" marked a winner a person cannot see."""
    batch, [run] = graph(user, tmp_path, ["historical"])
    complete(run, wall_seconds=0.6, cost_usd=Decimal("0.25"))
    report = judge(run, "tie", score_replay=1.0)
    report.data["historical"] = {"cost_usd": 0.25, "seconds": 0.3}
    report.save()
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "(better)" not in page and "(worse)" not in page
    assert page.count('class="better"') == 0
