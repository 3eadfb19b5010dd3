"""The admin lists, filters, searches and shows every model, with protocol fields read-only."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import LaunchError, Report, Review, Run, Thread

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client, staff_user: User) -> Client:
    client.force_login(staff_user)
    return client


@pytest.fixture
def graph(staff_user: User, tmp_path, make_thread) -> dict[str, object]:
    repo, baseline, ending = make_git_repo(tmp_path)
    batch, runs = make_run_graph(
        owner=staff_user,
        repo=repo,
        baseline=baseline,
        ending=ending,
        models=["historical", "empty"],
    )
    LaunchError.objects.create(run=runs[0], code="spawn_error", message="<b>no such file</b>")
    thread = make_thread(title="Fix <the> bug")
    review = Review.objects.create(
        thread=thread,
        start_message_uuid="a",
        end_message_uuid="b",
        baseline_commit=baseline,
        ending_commit=ending,
        historical_result_sha256="c" * 64,
        evaluator="tests",
        tests_digest="d" * 64,
    )
    Report.objects.create(
        run=runs[0],
        review=review,
        status="review_failed",
        is_current=True,
        evaluator="tests",
        reason="The <b>tests</b> could not run",
    )
    return {"batch": batch, "runs": runs, "thread": thread}


@pytest.mark.parametrize(
    "model", ["thread", "turn", "plan", "batch", "run", "launcherror", "review", "report"]
)
def test_every_model_has_a_working_list_search_and_change_page(
    admin_client: Client, graph, model: str
) -> None:
    listing = admin_client.get(reverse(f"admin:replays_{model}_changelist"))
    assert listing.status_code == 200
    searched = admin_client.get(reverse(f"admin:replays_{model}_changelist"), {"q": "bug"})
    assert searched.status_code == 200
    first = listing.context["cl"].result_list[0]
    change = admin_client.get(reverse(f"admin:replays_{model}_change", args=[first.pk]))
    assert change.status_code == 200


def test_thread_search_matches_request_text_once(admin_client: Client, make_thread) -> None:
    make_thread(title="one", requests=["refactor the parser", "refactor the parser again"])
    response = admin_client.get(reverse("admin:replays_thread_changelist"), {"q": "refactor"})
    assert response.context["cl"].result_count == 1


def test_hashes_tokens_and_protocol_fields_are_read_only(admin_client: Client, graph) -> None:
    thread = Thread.objects.get(pk=graph["thread"].pk)
    form = admin_client.get(reverse("admin:replays_thread_change", args=[thread.pk])).context[
        "adminform"
    ]
    for name in ("source_sha256", "input_tokens", "cost_usd", "session_id"):
        assert name not in form.form.fields
    run = Run.objects.first()
    form = admin_client.get(reverse("admin:replays_run_change", args=[run.pk])).context["adminform"]
    assert not form.form.fields  # a run changes only through the protocol
    assert admin_client.get(reverse("admin:replays_plan_add")).status_code == 403


def test_launch_error_text_is_escaped(admin_client: Client, graph) -> None:
    html = admin_client.get(reverse("admin:replays_launcherror_changelist")).content.decode()
    assert "<b>no such file</b>" not in html


def test_admin_needs_staff(client: Client, user: User) -> None:
    client.force_login(user)
    response = client.get(reverse("admin:replays_thread_changelist"))
    assert response.status_code == 302
