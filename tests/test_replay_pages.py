"""The replay pages: the form on the thread page, the plan, the batch, one run, the batch list."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import RequestFactory
from django.urls import reverse
from django.utils import timezone

from replays.factories.runs import make_run_graph
from replays.models import (
    Batch,
    FailureCode,
    LaunchError,
    LaunchErrorCode,
    Plan,
    PlanStatus,
    Report,
    ReportStatus,
    Run,
    RunPhase,
    RunStatus,
    Thread,
)
from tests.conftest import SAMPLE_BUNDLE, manifest_session

pytestmark = pytest.mark.django_db

BATCH_LIST_URL = reverse("replays:batch-list")


@pytest.fixture(autouse=True)
def _runs_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"
    settings.REPLAYS_RUN_ROOT = tmp_path / "var" / "runs"


def seed_batch(
    owner: User, tmp_path: Path, models: list[str] | None = None
) -> tuple[Batch, list[Run]]:
    """A batch with queued runs, written directly (no git, no prepare)."""
    return make_run_graph(
        owner=owner,
        repo=tmp_path,
        baseline="a" * 40,
        ending="b" * 40,
        models=models or ["historical", "empty"],
        result_sha256="0" * 64,
    )


def finish(run: Run, status: str, *, winner: str | None = None, **values: Any) -> Run:
    """End a run as its coordinator would; with `winner`, its current report too."""
    defaults: dict[str, Any] = {"phase": RunPhase.DONE, "finished_at": timezone.now()}
    if status == RunStatus.FAILED:
        defaults["failure_code"] = FailureCode.AGENT_ERROR
    Run.objects.filter(pk=run.pk).update(status=status, **{**defaults, **values})
    if winner is not None:
        Report.objects.create(
            run=run,
            status=ReportStatus.JUDGED,
            is_current=True,
            winner=winner,
            score_historical=1.0,
            score_replay=1.0,
            evaluator="tests",
            finished_at=timezone.now(),
        )
    run.refresh_from_db()
    return run


def replay_form_data(thread: Thread, **overrides: Any) -> dict[str, Any]:
    turns = list(thread.turns.order_by("index"))
    return {
        "models": ["historical", "empty"],
        "start_message_uuid": turns[0].message_uuid,
        "end_message_uuid": turns[-1].message_uuid,
        "repository": "",
        "baseline_commit": "",
        "ending_commit": "",
        "timeout_minutes": "20",
        "verify_command": "",
        **overrides,
    }


def prepare_line_count(client: Any, threads: dict[str, Thread], repo: Path) -> Plan:
    """Prepare the first request of the line-count session from its thread page."""
    thread = threads["claude-line-count"]
    first = thread.turns.get(index=0)
    data = replay_form_data(
        thread,
        start_message_uuid=first.message_uuid,
        end_message_uuid=first.message_uuid,
        repository=str(repo),
    )
    response = client.post(thread.get_absolute_url(), data)
    assert response.status_code == 302, response.content.decode()[:2000]
    plan = Plan.objects.latest("created_at")
    assert response["Location"] == reverse("replays:plan-detail", args=[plan.pk])
    return plan


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- Who sees what -----------------------------------------------------------------------


@pytest.mark.parametrize("url", [BATCH_LIST_URL, "/plans/1/", "/batches/1/", "/runs/1/"])
def test_every_replay_page_requires_login(client: Any, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


def test_cancel_and_approve_require_login(client: Any, user: User, tmp_path: Path) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    for url in (
        reverse("replays:run-cancel", args=[run.pk]),
        reverse("replays:batch-cancel", args=[batch.pk]),
        reverse("replays:plan-approve", args=[batch.plan_id]),
    ):
        response = client.post(url, {"approved": "true"})
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.QUEUED}


def test_other_users_get_404_for_someone_elses_plan_batch_and_run(
    client: Any, user: User, other_user: User, tmp_path: Path
) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    client.force_login(other_user)
    for url in (
        reverse("replays:plan-detail", args=[batch.plan_id]),
        reverse("replays:batch-detail", args=[batch.pk]),
        reverse("replays:run-detail", args=[run.pk]),
    ):
        assert client.get(url).status_code == 404, url
    for url in (
        reverse("replays:run-cancel", args=[run.pk]),
        reverse("replays:batch-cancel", args=[batch.pk]),
        reverse("replays:plan-approve", args=[batch.plan_id]),
        reverse("replays:plan-prepare-again", args=[batch.plan_id]),
    ):
        assert client.post(url, {"approved": "true"}).status_code == 404, url
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.QUEUED}
    assert f"Batch {batch.pk}" not in client.get(BATCH_LIST_URL).content.decode()


def test_staff_see_every_batch(client: Any, user: User, staff_user: User, tmp_path: Path) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    client.force_login(staff_user)
    assert client.get(batch.get_absolute_url()).status_code == 200
    assert client.get(reverse("replays:run-detail", args=[run.pk])).status_code == 200
    listing = client.get(BATCH_LIST_URL).content.decode()
    assert f"Batch {batch.pk}" in listing and "alice" in listing


def test_layout_has_a_batches_nav_item(logged_in_client: Any) -> None:
    page = logged_in_client.get(BATCH_LIST_URL).content.decode()
    assert f'<a href="{BATCH_LIST_URL}" aria-current="page">Batches</a>' in page


# --- The replay form on the thread page -------------------------------------------------------


def test_thread_page_shows_the_replay_form_with_the_calibration_baselines(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=3, requests=["Add a flag\nmore text", "<b>Bold</b> ask", "Ship it"])
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert 'id="replay"' in page
    assert 'name="models" value="historical"' in page
    assert 'name="models" value="empty"' in page
    assert "Calibration baselines" in page
    assert "Historical result (baseline)" in page and "No change (baseline)" in page
    # The range: every turn by number and first line, whole thread by default.
    assert "#1 · Add a flag</option>" in page
    assert "#2 · &lt;b&gt;Bold&lt;/b&gt; ask</option>" in page
    assert page.count(f'value="{thread.turns.get(index=0).message_uuid}" selected') == 1
    assert page.count(f'value="{thread.turns.get(index=2).message_uuid}" selected') == 1
    assert 'name="timeout_minutes"' in page and 'name="verify_command"' in page
    assert "Prepare replay" in page


def test_unavailable_models_are_disabled_with_their_reason(
    logged_in_client: Any, make_thread: Callable[..., Thread], settings: Any
) -> None:
    settings.REPLAYS_AGENTS = {
        "aider": {
            "kind": "command",
            "command": ["/nonexistent/aider", "{model}"],
            "models": ["gpt-5"],
            "label": "Aider",
        },
    }
    thread = make_thread()
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert 'value="aider:gpt-5" id="id_models_2" disabled' in page
    assert "Unavailable:" in page and "/nonexistent/aider" in page


def test_installed_agents_show_their_version(
    logged_in_client: Any, make_thread: Callable[..., Thread], settings: Any, tmp_path: Path
) -> None:
    # A stand-in for the codex binary that only answers --version.
    agent = tmp_path / "codex"
    agent.write_text("#!/bin/sh\necho 'codex-cli 9.8.7'\n")
    agent.chmod(0o755)
    settings.REPLAYS_AGENTS = {"codex": {"kind": "codex", "binary": str(agent), "models": ["m1"]}}
    page = logged_in_client.get(make_thread().get_absolute_url()).content.decode()
    assert 'value="codex:m1"' in page and "codex-cli 9.8.7" in page


def test_preparing_from_the_thread_page_lands_on_a_ready_plan_with_the_prompt(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    assert plan.status == PlanStatus.READY_FOR_APPROVAL
    assert plan.configuration["timeout_seconds"] == 1200
    # The token goes to the browser once, in a signed cookie scoped to the plan's pages;
    # the server keeps only its hash (nothing in the session, nothing on the page).
    cookie = logged_in_client.cookies[f"prepare_token_{plan.pk}"]
    assert cookie["path"] == f"/plans/{plan.pk}/" and cookie["httponly"]
    request = RequestFactory().get("/")
    request.COOKIES[cookie.key] = cookie.value
    token = request.get_signed_cookie(cookie.key, salt="replays.prepare-token")
    assert hashlib.sha256(token.encode()).hexdigest() == plan.token_hash
    assert token not in str(dict(logged_in_client.session))
    response = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk]))
    page = response.content.decode()
    assert "Approve 1 thread using 2 models?" in page
    assert ">Approve</button>" in page
    assert token not in page
    turn = manifest_session("claude-line-count")["turns"][0]
    assert f'title="{turn["head_before"]}">{turn["head_before"][:12]}</code>' in page
    assert f'title="{turn["commit_after"]}">{turn["commit_after"][:12]}</code>' in page
    assert plan.preparations[0]["historical_result_sha256"] in page
    assert "Ready for approval" in page


def test_approving_creates_the_batch_once(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    approve_url = reverse("replays:plan-approve", args=[plan.pk])
    first = logged_in_client.post(approve_url, {"approved": "true"})
    batch = Batch.objects.get()
    assert first.status_code == 302 and first["Location"] == batch.get_absolute_url()
    page = logged_in_client.get(first["Location"])
    assert "Approved: 2 runs queued." in messages_of(page)
    assert sorted(batch.runs.values_list("model", flat=True)) == ["empty", "historical"]

    again = logged_in_client.post(approve_url, {"approved": "true"})
    assert again.status_code == 302 and again["Location"] == batch.get_absolute_url()
    assert Batch.objects.count() == 1 and Run.objects.count() == 2
    messages = messages_of(logged_in_client.get(again["Location"]))
    assert any("already approved" in m for m in messages)
    # The plan now links to its batch instead of asking again.
    plan_page = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk])).content
    assert batch.get_absolute_url().encode() in plan_page
    assert b">Approve</button>" not in plan_page


def test_approval_without_the_explicit_yes_is_refused(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    response = logged_in_client.post(reverse("replays:plan-approve", args=[plan.pk]))
    assert response.status_code == 400
    assert "explicit approval" in response.content.decode()
    assert not Batch.objects.exists()


def test_an_expired_plan_says_so_and_prepares_again(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    Plan.objects.filter(pk=plan.pk).update(
        created_at=timezone.now() - timedelta(minutes=10),
        expires_at=timezone.now() - timedelta(minutes=5),
    )
    page = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk])).content.decode()
    assert "This plan expired" in page and ">Approve</button>" not in page

    refused = logged_in_client.post(
        reverse("replays:plan-approve", args=[plan.pk]), {"approved": "true"}
    )
    assert refused.status_code == 410
    assert "Prepare the plan again" in refused.content.decode()
    assert not Batch.objects.exists()

    again = logged_in_client.post(reverse("replays:plan-prepare-again", args=[plan.pk]))
    fresh = Plan.objects.latest("created_at")
    assert fresh.pk != plan.pk and again["Location"] == f"/plans/{fresh.pk}/"
    assert fresh.configuration == plan.configuration
    assert (
        logged_in_client.post(
            reverse("replays:plan-approve", args=[fresh.pk]), {"approved": "true"}
        ).status_code
        == 302
    )
    assert Batch.objects.get().plan_id == fresh.pk


def test_a_plan_prepared_elsewhere_offers_to_prepare_again(
    client: Any, user: User, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    client.force_login(user)
    plan = prepare_line_count(client, real_threads, sample_repo)
    client.logout()
    client.force_login(user)  # a new browser session: no token cookie
    page = client.get(reverse("replays:plan-detail", args=[plan.pk])).content.decode()
    assert ">Approve</button>" not in page and "Prepare again to approve" in page
    response = client.post(reverse("replays:plan-approve", args=[plan.pk]), {"approved": "true"})
    assert response.status_code == 403
    assert not Batch.objects.exists()


def test_a_thread_whose_folder_is_not_a_repository_shows_the_question(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path, tmp_path: Path
) -> None:
    thread = real_threads["claude-line-count"]
    Thread.objects.filter(pk=thread.pk).update(cwd=str(tmp_path / "gone"))
    first = thread.turns.get(index=0)
    response = logged_in_client.post(
        thread.get_absolute_url(),
        replay_form_data(
            thread, start_message_uuid=first.message_uuid, end_message_uuid=first.message_uuid
        ),
    )
    plan = Plan.objects.get()
    assert plan.status == PlanStatus.NEEDS_USER_INPUT
    page = logged_in_client.get(response["Location"]).content.decode()
    assert "Needs user input" in page
    assert "is not a git repository here" in page
    assert 'name="field" value="repository"' in page
    assert ">Approve</button>" not in page

    # Answering prepares the same configuration again with the repository filled in.
    answered = logged_in_client.post(
        reverse("replays:plan-prepare-again", args=[plan.pk]),
        {"thread_id": thread.pk, "field": "repository", "value": str(sample_repo)},
    )
    fresh = Plan.objects.latest("created_at")
    assert answered["Location"] == reverse("replays:plan-detail", args=[fresh.pk])
    assert fresh.configuration["configurations"][0]["repository"] == str(sample_repo)
    assert fresh.status == PlanStatus.READY_FOR_APPROVAL
    assert (
        "Approve 1 thread using 2 models?"
        in logged_in_client.get(answered["Location"]).content.decode()
    )


def test_a_question_lists_its_commits_and_the_chosen_one_is_filled_in(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    thread = real_threads["claude-line-count"]
    turn = manifest_session("claude-line-count")["turns"][0]
    # Shape a question as prepare writes it when branches disagree about the baseline.
    Plan.objects.filter(pk=plan.pk).update(
        status=PlanStatus.NEEDS_USER_INPUT,
        approval_prompt="",
        questions=[
            {
                "thread_id": thread.pk,
                "field": "baseline_commit",
                "message": "The last commit before the request differs between branches.",
                "choices": [
                    {
                        "commit": turn["head_before"],
                        "subject": "Add <core> module",
                        "committed_at": "2026-01-05T10:00:00+00:00",
                    },
                    {
                        "commit": turn["commit_after"],
                        "subject": "Line count",
                        "committed_at": "2026-01-05T11:00:00+00:00",
                    },
                ],
            }
        ],
    )
    page = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk])).content.decode()
    assert f'name="choice" value="{turn["head_before"]}" checked' in page
    assert f'name="choice" value="{turn["commit_after"]}"' in page
    assert "Add &lt;core&gt; module" in page
    response = logged_in_client.post(
        reverse("replays:plan-prepare-again", args=[plan.pk]),
        {
            "thread_id": thread.pk,
            "field": "baseline_commit",
            "choice": turn["head_before"],
            "value": "",
        },
    )
    fresh = Plan.objects.latest("created_at")
    assert response["Location"] == reverse("replays:plan-detail", args=[fresh.pk])
    assert fresh.configuration["configurations"][0]["baseline_commit"] == turn["head_before"]


def test_an_empty_answer_is_refused_on_the_plan_page(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare_line_count(logged_in_client, real_threads, sample_repo)
    thread = real_threads["claude-line-count"]
    response = logged_in_client.post(
        reverse("replays:plan-prepare-again", args=[plan.pk]),
        {"thread_id": thread.pk, "field": "baseline_commit", "value": " "},
    )
    assert response.status_code == 400
    assert Plan.objects.count() == 1


def test_a_blocked_plan_shows_its_blockers(
    logged_in_client: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    thread = real_threads["claude-line-count"]
    response = logged_in_client.post(
        thread.get_absolute_url(),
        replay_form_data(thread, repository=str(sample_repo), baseline_commit="0" * 40),
    )
    page = logged_in_client.get(response["Location"]).content.decode()
    assert "Blocked: this plan cannot be approved" in page
    assert f"baseline_commit {'0' * 40} is not a commit" in page
    assert ">Approve</button>" not in page


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([], "Choose at least one model."),
        (["historical", "no-such-model"], "Select a valid choice. no-such-model is not one of"),
    ],
)
def test_a_bad_model_selection_shows_the_error(
    logged_in_client: Any, make_thread: Callable[..., Thread], models: list[str], message: str
) -> None:
    thread = make_thread()
    response = logged_in_client.post(
        thread.get_absolute_url(), replay_form_data(thread, models=models)
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page
    assert 'id="replay"' in page
    assert not Plan.objects.exists()


def test_input_errors_from_prepare_keep_what_was_typed(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=3)
    turns = list(thread.turns.order_by("index"))
    response = logged_in_client.post(
        thread.get_absolute_url(),
        replay_form_data(
            thread,
            start_message_uuid=turns[2].message_uuid,
            end_message_uuid=turns[0].message_uuid,
            verify_command="pytest -q",
        ),
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "the range ends before it starts" in page
    assert 'value="pytest -q"' in page
    assert f'value="{turns[2].message_uuid}" selected' in page


# --- Batch page ----------------------------------------------------------------------------


def test_batch_page_shows_every_run_as_a_card(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [historical, empty] = seed_batch(user, tmp_path)
    finish(
        historical,
        RunStatus.COMPLETED,
        cost_usd=None,
        output_tokens=1200,
        wall_seconds=75,
        files_changed=3,
    )
    response = logged_in_client.get(batch.get_absolute_url())
    page = response.content.decode()
    assert response.status_code == 200
    assert page.count('class="run-card ') == 2
    assert "Historical result (baseline)" in page and "No change (baseline)" in page
    assert "unknown price" in page
    assert "$0" not in page
    assert "1m 15s" in page and "1.2k" in page
    assert "Queued" in page and "Completed" in page
    # One run is still queued: the page polls for its live part (htmx) and offers to cancel;
    # no full-page refresh.
    assert 'hx-trigger="every 2s"' in page and 'http-equiv="refresh"' not in page
    assert "Cancel batch" in page
    assert page.count(">Cancel</button>") == 1


def test_a_finished_batch_stops_refreshing_and_says_results_ready(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [historical, empty] = seed_batch(user, tmp_path)
    finish(historical, RunStatus.COMPLETED, cost_usd=Decimal("0"), winner="tie")
    finish(empty, RunStatus.CANCELLED)
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "hx-trigger" not in page and 'http-equiv="refresh"' not in page
    assert "Results ready" in page
    assert "Cancel batch" not in page and ">Cancel</button>" not in page


def test_a_finished_batch_waiting_for_reports_says_finished(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, runs = seed_batch(user, tmp_path)
    for run in runs:
        finish(run, RunStatus.COMPLETED, cost_usd=Decimal("0.5"))
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "Finished · reviews pending" in page
    assert "$1.00" in page  # the total


def test_failure_and_launch_error_are_shown_beside_their_run_escaped(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [historical, empty] = seed_batch(user, tmp_path)
    finish(
        historical,
        RunStatus.FAILED,
        failure_code=FailureCode.LAUNCH_FAILED,
        failure_message="<script>alert('x')</script> spawn failed",
    )
    LaunchError.objects.create(
        run=historical,
        code=LaunchErrorCode.SPAWN_ERROR,
        message="<img src=x onerror=alert(1)>",
        host="worker-2",
    )
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert "<script>alert" not in page and "<img src=x" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; spawn failed" in page
    assert "Launch failed: spawn error" in page and "worker-2" in page
    card = page[page.index(f'id="run-{historical.pk}"') : page.index(f'id="run-{empty.pk}"')]
    assert "launch_failed" in card and "&lt;img src=x" in card


def test_runs_are_grouped_by_thread_when_several(
    logged_in_client: Any, user: User, tmp_path: Path, make_thread: Callable[..., Thread]
) -> None:
    batch, [historical, _] = seed_batch(user, tmp_path)
    other = make_thread(title="Second thread")
    Run.objects.create(batch=batch, thread=other, model="historical", configuration={})
    page = logged_in_client.get(batch.get_absolute_url()).content.decode()
    assert page.count('class="run-group"') == 2
    assert "Second thread" in page and historical.thread.title in page


def test_cancel_button_cancels_a_queued_run(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [historical, empty] = seed_batch(user, tmp_path)
    response = logged_in_client.post(
        reverse("replays:run-cancel", args=[historical.pk]), {"next": batch.get_absolute_url()}
    )
    assert response.status_code == 302 and response["Location"] == batch.get_absolute_url()
    historical.refresh_from_db()
    empty.refresh_from_db()
    assert historical.status == RunStatus.CANCELLED and historical.finished_at is not None
    assert empty.status == RunStatus.QUEUED
    messages = messages_of(logged_in_client.get(response["Location"]))
    assert f"Run {historical.pk} (historical) cancelled." in messages


def test_cancel_never_redirects_off_site(logged_in_client: Any, user: User, tmp_path: Path) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    response = logged_in_client.post(
        reverse("replays:run-cancel", args=[run.pk]), {"next": "https://evil.example/"}
    )
    assert response["Location"] == batch.get_absolute_url()


def test_cancel_of_a_running_run_requests_it(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    Run.objects.filter(pk=run.pk).update(status=RunStatus.RUNNING, started_at=timezone.now())
    response = logged_in_client.post(reverse("replays:run-cancel", args=[run.pk]))
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING and run.cancel_requested_at is not None
    messages = messages_of(logged_in_client.get(response["Location"]))
    assert any("stops within a few seconds" in m for m in messages)
    assert "cancel requested" in logged_in_client.get(batch.get_absolute_url()).content.decode()


def test_cancel_batch_cancels_every_queued_run(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, runs = seed_batch(user, tmp_path, models=["historical", "empty"])
    finish(runs[0], RunStatus.COMPLETED, cost_usd=Decimal("0"))
    response = logged_in_client.post(reverse("replays:batch-cancel", args=[batch.pk]))
    assert response["Location"] == batch.get_absolute_url()
    statuses = dict(batch.runs.values_list("model", "status"))
    assert statuses == {"historical": RunStatus.COMPLETED, "empty": RunStatus.CANCELLED}
    assert "Cancelled 1 run." in messages_of(logged_in_client.get(response["Location"]))


# --- Run page ------------------------------------------------------------------------------


DIFF = """diff --git a/app.py b/app.py
index 1111111..2222222 100644
--- a/app.py
+++ b/app.py
@@ -1,2 +1,2 @@
 def greet(name):
-    return "<b>Hello</b> " + name
+    return f"Hello, {name}! <script>"
--- not a header
"""


def test_run_page_escapes_log_and_failure_and_colours_the_diff(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    finish(
        run,
        RunStatus.FAILED,
        failure_message="agent said <b>no</b> & left",
        log_tail="starting\n<script>alert('log')</script>\n",
        diff=DIFF,
        files_changed=1,
    )
    response = logged_in_client.get(reverse("replays:run-detail", args=[run.pk]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "<script>alert('log')" not in page and "<b>no</b>" not in page
    assert "&lt;script&gt;alert(&#x27;log&#x27;)&lt;/script&gt;" in page
    assert "agent said &lt;b&gt;no&lt;/b&gt; &amp; left" in page
    assert '<span class="diff-line diff-file">diff --git a/app.py b/app.py</span>' in page
    assert '<span class="diff-line diff-meta">+++ b/app.py</span>' in page
    assert '<span class="diff-line diff-hunk">@@ -1,2 +1,2 @@</span>' in page
    assert (
        '<span class="diff-line diff-del">-    return &quot;&lt;b&gt;Hello&lt;/b&gt; &quot; + name</span>'
        in page
    )
    assert (
        '<span class="diff-line diff-add">+    return f&quot;Hello, {name}! &lt;script&gt;&quot;</span>'
        in page
    )
    # Inside a hunk, a removed line that looks like a header is still a removal.
    assert '<span class="diff-line diff-del">--- not a header</span>' in page
    assert '<span class="diff-line diff-context"> def greet(name):</span>' in page
    assert f'href="/api/runs/{run.pk}/diff"' in page


def test_run_page_shows_the_exact_configuration_with_the_request_collapsed(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    page = logged_in_client.get(reverse("replays:run-detail", args=[run.pk])).content.decode()
    assert "&quot;baseline_commit&quot;: &quot;" + "a" * 40 in page
    assert "&quot;request&quot;" not in page
    details = page[page.index('<details class="request-details">') :]
    assert run.configuration["request"] in details
    # Still queued: polls for its live part and can be cancelled from here too.
    assert 'hx-trigger="every 2s"' in page and "Cancel run" in page


def test_raw_diff_link_serves_the_diff_to_the_logged_in_user(
    logged_in_client: Any, user: User, tmp_path: Path
) -> None:
    batch, [run, _] = seed_batch(user, tmp_path)
    finish(run, RunStatus.COMPLETED, diff=DIFF)
    response = logged_in_client.get(f"/api/runs/{run.pk}/diff")
    assert response.status_code == 200 and response.content.decode() == DIFF


# --- Batch list ----------------------------------------------------------------------------


def test_batch_list_shows_my_batches_newest_first_with_counts(
    logged_in_client: Any, user: User, other_user: User, tmp_path: Path
) -> None:
    older, older_runs = seed_batch(user, tmp_path)
    Batch.objects.filter(pk=older.pk).update(approved_at=timezone.now() - timedelta(days=1))
    newer, newer_runs = seed_batch(user, tmp_path, models=["historical", "empty"])
    finish(newer_runs[0], RunStatus.FAILED)
    hidden, _ = seed_batch(other_user, tmp_path)
    page = logged_in_client.get(BATCH_LIST_URL).content.decode()
    assert page.index(f"Batch {newer.pk}<") < page.index(f"Batch {older.pk}<")
    assert f"Batch {hidden.pk}<" not in page
    row = page[page.index(f"Batch {newer.pk}<") : page.index(f"Batch {older.pk}<")]
    assert "Failed" in row and "Queued" in row and "In progress" in row
    assert older_runs[0].thread.title in page


def test_batch_list_is_paginated(logged_in_client: Any, user: User, tmp_path: Path) -> None:
    for _ in range(26):
        seed_batch(user, tmp_path, models=["empty"])
    first = logged_in_client.get(BATCH_LIST_URL).content.decode()
    assert first.count('class="batch-link"') == 25
    second = logged_in_client.get(BATCH_LIST_URL, {"page": 2}).content.decode()
    assert second.count('class="batch-link"') == 1


def test_batch_list_without_batches_explains_how_to_start(logged_in_client: Any) -> None:
    page = logged_in_client.get(BATCH_LIST_URL).content.decode()
    assert "No batches yet" in page


def test_the_form_offers_the_known_clone_up_front_when_the_threads_folder_is_not_a_repository(
    logged_in_client: Any, real_threads: dict[str, Thread], settings: Any, tmp_path: Path
) -> None:
    """The demo's threads name a folder that is not on this machine; the form showed that
    folder, and the clone only came up after prepare asked."""
    import subprocess

    settings.REPLAYS_VAR_DIR = tmp_path
    clone = tmp_path / "sample-repo"
    subprocess.run(["git", "clone", "-q", str(SAMPLE_BUNDLE), str(clone)], check=True)
    thread = real_threads["claude-line-count"]
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert f'name="repository" value="{clone}"' in page
    assert 'list="known-clones"' in page
    assert f'<option value="{clone}">the demo clone</option>' in page
    assert f"The thread&#x27;s folder {thread.cwd} is not a git repository here" in page
