"""Configuring and approving a replay (the evaluator, the verify command, the cost estimate),
and the rough edges a new user meets: question wording, known clones, size limits, grammar,
the folder column, the favicon and the way back from the API docs."""

from __future__ import annotations

import io
import secrets
import subprocess
from collections.abc import Callable
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.contrib.staticfiles import finders
from django.core.management import CommandError, call_command
from django.test import Client, override_settings
from django.urls import reverse
from django.utils import timezone

from replays import approval, estimates, planning, pricing
from replays.agents import ModelInfo
from replays.models import Plan, PlanStatus, Thread, Turn
from replays.transcripts.base import TokenUsage
from replays.views.threads import folder_labels
from tests.conftest import SAMPLE_BUNDLE

pytestmark = pytest.mark.django_db

UPLOAD_URL = reverse("replays:thread-upload")
MILLION = 1_000_000


@pytest.fixture(autouse=True)
def _var_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"
    settings.REPLAYS_RUN_ROOT = tmp_path / "var" / "runs"


def git_init(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", str(path)], check=True)
    return path


def demo_clone(var_dir: Path) -> Path:
    """What setup_demo makes: the sample bundle cloned to $REPLAYS_VAR_DIR/sample-repo, with
    a local branch for each branch the sessions used."""
    target = var_dir / "sample-repo"
    subprocess.run(["git", "clone", "-q", str(SAMPLE_BUNDLE), str(target)], check=True)
    subprocess.run(
        ["git", "-C", str(target), "branch", "-q", "feature/cli", "origin/feature/cli"], check=True
    )
    return target.resolve()


def ready_plan(owner: User, threads: list[Thread], models: list[str], **values: Any) -> Plan:
    """A ready plan written directly (no git): each thread's whole range, prepared."""
    now = timezone.now()
    preparations = []
    for thread in threads:
        turns = list(thread.turns.order_by("index"))
        preparations.append(
            {
                "thread_id": thread.pk,
                "repository": "/srv/repo",
                "baseline_commit": "a" * 40,
                "ending_commit": "b" * 40,
                "start_message_uuid": turns[0].message_uuid,
                "end_message_uuid": turns[-1].message_uuid,
                "blockers": [],
                "questions": [],
            }
        )
    configuration = {
        "configurations": [{"thread_id": thread.pk} for thread in threads],
        "models": models,
        "timeout_seconds": 1200,
        "verify_command": None,
    }
    fields: dict[str, Any] = {
        "owner": owner,
        "configuration": configuration,
        "fingerprint": planning.fingerprint(configuration),
        "preparations": preparations,
        "status": PlanStatus.READY_FOR_APPROVAL,
        "approval_prompt": planning.approval_prompt(configuration),
        "token_hash": planning.hash_token(secrets.token_urlsafe(16)),
        "created_at": now,
        "expires_at": now + timedelta(minutes=5),
        **values,
    }
    return Plan.objects.create(**fields)


def set_turn_tokens(thread: Thread, **tokens: int) -> None:
    Turn.objects.filter(thread=thread).update(**tokens)


# --- 6. The replay form: the evaluator and the verify command ----------------------------


def test_the_replay_form_shows_each_evaluators_availability_and_the_junit_hint(
    logged_in_client: Any, make_thread: Callable[..., Thread], settings: Any, tmp_path: Path
) -> None:
    codex = tmp_path / "codex"  # a stand-in that only answers --version
    codex.write_text("#!/bin/sh\necho 'codex-cli 9.8.7'\n")
    codex.chmod(0o755)
    settings.REPLAYS_AGENTS = {
        "codex": {"kind": "codex", "binary": str(codex), "models": ["m1"], "label": "Codex"},
        "claude": {"kind": "claude_code", "binary": "/nonexistent/claude", "models": ["s1"]},
    }
    page = logged_in_client.get(make_thread().get_absolute_url()).content.decode()
    # What GET /api/evaluators/ offers: tests (it needs a verify command), a model that can
    # judge, and one that cannot here: shown with why, and not selectable.
    assert "Tests only (offline, no model): needs a verify command</option>" in page
    assert '<option value="codex:m1">Codex m1 (available)</option>' in page
    assert '<option value="claude:s1" disabled>claude s1 (unavailable: ' in page
    # The verify command: no shell, {junit_xml} and the variable with the same path.
    assert "without a shell" in page
    assert "<code>{junit_xml}</code> in it becomes a path for JUnit XML" in page
    assert "<code>REPLAYS_JUNIT_XML</code>" in page


# --- 6. The approval: what the batch may cost ------------------------------------------


def test_the_estimate_prices_the_historical_tokens_at_each_models_prices() -> None:
    table = pricing.load_price_table()
    million_of_each = TokenUsage(MILLION, MILLION, MILLION, MILLION, MILLION)
    tokens = [million_of_each, TokenUsage(input_tokens=MILLION, output_tokens=100_000)]
    sonnet = ModelInfo(
        id="claude:claude-sonnet-4-5", label="Sonnet", agent="claude", available=True,
        model="claude-sonnet-4-5", kind="claude_code",
    )  # fmt: skip
    mystery = ModelInfo(
        id="local:mystery-1", label="Mystery", agent="local", available=True,
        model="mystery-1", kind="command",
    )  # fmt: skip
    baseline = ModelInfo(id="empty", label="No change", agent="baseline", available=True)
    result = estimates.estimate_costs(
        tokens=tokens,
        models=[("empty", baseline), (sonnet.id, sonnet), (mystery.id, mystery), ("gone", None)],
        table=table,
    )
    by_model = {estimate.model: estimate for estimate in result}
    # 3 in, 15 out, 0.3 cache read, 3.75 and 6 cache writes per million.
    assert by_model[sonnet.id].per_thread == [Decimal("28.05"), Decimal("4.5")]
    assert by_model[sonnet.id].total == Decimal("32.55")
    assert by_model[sonnet.id].priced_as == "claude-sonnet-4-5"
    assert by_model["empty"].per_thread == [0, 0] and by_model["empty"].total == 0
    # No price known: unknown, never $0.
    assert by_model[mystery.id].per_thread == [None, None] and by_model[mystery.id].total is None
    assert by_model["gone"].total is None


def test_range_tokens_sums_the_turns_of_each_range_in_two_queries(
    make_thread: Callable[..., Thread], django_assert_num_queries: Any
) -> None:
    threads = [make_thread(turns=3) for _ in range(3)]
    for thread in threads:
        set_turn_tokens(
            thread, input_tokens=10, output_tokens=1, cache_read_tokens=100,
            cache_write_5m_tokens=1000, cache_write_1h_tokens=10_000,
        )  # fmt: skip
    first, second, _ = (list(t.turns.order_by("index")) for t in threads)
    preparations = [
        # Turns 1 and 2 of the first thread, turn 3 alone of the second, all of the third.
        {
            "thread_id": threads[0].pk,
            "start_message_uuid": first[0].message_uuid,
            "end_message_uuid": first[1].message_uuid,
        },
        {
            "thread_id": threads[1].pk,
            "start_message_uuid": second[2].message_uuid,
            "end_message_uuid": second[2].message_uuid,
        },
        {
            "thread_id": threads[2].pk,
            "start_message_uuid": f"uuid-of-{threads[2].pk}-missing",
            "end_message_uuid": "",
        },
    ]
    with django_assert_num_queries(2):
        usage = estimates.range_tokens(preparations)
    assert usage[threads[0].pk] == TokenUsage(20, 2, 200, 2000, 20_000)
    assert usage[threads[1].pk] == TokenUsage(10, 1, 100, 1000, 10_000)
    assert threads[2].pk not in usage  # no range found: nothing is counted


def test_the_approval_card_shows_the_estimate_with_unknown_prices_as_unknown(
    logged_in_client: Any,
    user: User,
    make_thread: Callable[..., Thread],
    settings: Any,
    django_assert_max_num_queries: Any,
) -> None:
    settings.REPLAYS_AGENTS = {
        "local": {
            "kind": "command",
            "command": ["/nonexistent/agent", "{model}"],
            "models": ["claude-sonnet-4-5", "mystery-1"],
            "label": "Local",
        },
    }
    thread = make_thread(turns=2)
    set_turn_tokens(thread, input_tokens=500_000, output_tokens=100_000, cache_read_tokens=MILLION)
    plan = ready_plan(
        user,
        [thread],
        ["historical", "local:claude-sonnet-4-5", "local:mystery-1"],
        evaluator="local:claude-sonnet-4-5",
    )
    with django_assert_max_num_queries(12):
        page = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk]))
    html = page.content.decode()
    # Two turns of 1.5 + 1.5 + 0.3 dollars at 3 in, 15 out, 0.3 cache read per million.
    assert (
        '<td class="num" title="estimate: the historical tokens at this model\'s prices">$6.60</td>'
        in html
    )
    assert "$0.00</td>" in html  # the baseline calls no model
    assert html.count("unknown price</span></td>") == 1  # mystery-1 has no price, never $0
    assert "3,200,000 tokens the requests historically used" in html
    assert "The evaluator's cost (local:claude-sonnet-4-5) comes on top." in html


def test_a_plan_of_several_threads_shows_each_threads_estimate(
    logged_in_client: Any, user: User, make_thread: Callable[..., Thread]
) -> None:
    threads = [make_thread(turns=1), make_thread(turns=1)]
    plan = ready_plan(user, threads, ["empty"], evaluator="tests")
    html = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk])).content.decode()
    assert f"Thread {threads[0].pk}</th>" in html and f"Thread {threads[1].pk}</th>" in html
    assert "The tests evaluator calls no model either." in html


# --- 8. Questions name the answer each door takes ----------------------------------------


def test_questions_name_no_api_fields_and_the_command_prints_its_options(
    user: User, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    thread = real_threads["claude-line-count"]
    second = thread.turns.get(index=1)  # the sub-agent review: no commit was made
    errors = io.StringIO()
    with pytest.raises(CommandError) as raised:
        call_command(
            "replay", "--thread", str(thread.pk), "--from", second.message_uuid,
            "--model", "empty", "--repository", str(sample_repo), "--user", "alice",
            "--yes", stderr=errors,
        )  # fmt: skip
    plan = Plan.objects.get()
    question = plan.questions[0]
    assert question["field"] == "ending_commit"  # the API keeps the machine name
    assert "ending_commit" not in question["message"] and "`" not in question["message"]
    printed = errors.getvalue()
    assert "Answer with --ending COMMIT, for example:" in printed
    assert f"    --ending {question['choices'][0]['commit'][:12]}" in printed
    assert "ending_commit" not in printed
    assert (
        str(raised.value)
        == f"Plan {plan.pk} needs your input. Run the command again with the answers."
    )


def test_the_repository_question_names_no_field_on_the_page(
    logged_in_client: Any, user: User, make_thread: Callable[..., Thread], tmp_path: Path
) -> None:
    thread = make_thread(cwd=str(tmp_path / "gone"))
    plan = planning.prepare_plan(
        owner=user,
        raw_configuration={"configurations": [{"thread_id": thread.pk}], "models": ["empty"]},
    ).plan
    message = plan.questions[0]["message"]
    assert message.endswith("is not a git repository here. Where is a clone of it?")
    html = logged_in_client.get(reverse("replays:plan-detail", args=[plan.pk])).content.decode()
    assert (
        "Give `repository`" not in html and "`" not in html.split('class="question-text">')[1][:300]
    )
    assert ">Repository path</label>" in html


# --- 8. Known clones: the demo clone, the user's own earlier repositories ---------------


def test_the_demo_clone_is_offered_for_the_demo_thread_on_the_page_and_the_command(
    logged_in_client: Any, user: User, real_threads: dict[str, Thread], settings: Any
) -> None:
    clone = demo_clone(settings.REPLAYS_VAR_DIR)
    thread = real_threads["claude-line-count"]  # its folder is not a repository here
    assert not Path(thread.cwd).exists()
    turns = list(thread.turns.order_by("index"))
    response = logged_in_client.post(
        thread.get_absolute_url(),
        {
            "models": ["empty"],
            "start_message_uuid": turns[0].message_uuid,
            "end_message_uuid": turns[0].message_uuid,
            "timeout_minutes": "20",
        },
    )
    plan = Plan.objects.get()
    assert plan.status == PlanStatus.NEEDS_USER_INPUT
    assert plan.questions[0]["choices"] == [{"repository": str(clone), "reason": "the demo clone"}]
    html = logged_in_client.get(response["Location"]).content.decode()
    assert f'name="choice" value="{clone}" checked' in html
    assert "the demo clone" in html and "Or another repository path" in html
    # Picking it prepares again with that repository: the plan is ready.
    logged_in_client.post(
        reverse("replays:plan-prepare-again", args=[plan.pk]),
        {"thread_id": thread.pk, "field": "repository", "choice": str(clone), "value": ""},
    )
    fresh = Plan.objects.latest("created_at")
    assert fresh.configuration["configurations"][0]["repository"] == str(clone)
    assert fresh.status == PlanStatus.READY_FOR_APPROVAL, fresh.blockers or fresh.questions

    errors = io.StringIO()
    with pytest.raises(CommandError):
        call_command(
            "replay", "--thread", str(thread.pk), "--model", "empty", "--user", "alice",
            "--yes", stderr=errors,
        )  # fmt: skip
    # Printed as the option that answers it; the plan just made now remembers the clone.
    assert f"    --repository {clone}  (used by your plan {fresh.pk})" in errors.getvalue()


def test_known_clones_are_the_users_own_earlier_repositories_never_another_users(
    user: User, other_user: User, make_thread: Callable[..., Thread], tmp_path: Path
) -> None:
    folder = str(tmp_path / "gone")
    earlier_thread = make_thread(cwd=folder)
    mine = git_init(tmp_path / "my-clone")
    theirs = git_init(tmp_path / "their-clone")
    removed = tmp_path / "removed-clone"  # used once, no longer a repository
    elsewhere = git_init(tmp_path / "other-project")

    def earlier_plan(owner: User, repository: Path, thread: Thread) -> Plan:
        plan = ready_plan(owner, [thread], ["empty"])
        plan.preparations[0]["repository"] = str(repository)
        plan.save(update_fields=["preparations"])
        return plan

    my_plan = earlier_plan(user, mine, earlier_thread)
    earlier_plan(user, removed, earlier_thread)
    earlier_plan(user, elsewhere, make_thread(cwd="/somewhere/else"))
    # Bob's own thread of the same folder (threads are their importer's).
    earlier_plan(other_user, theirs, make_thread(cwd=folder, owner=other_user))

    thread = make_thread(cwd=folder)
    plan = planning.prepare_plan(
        owner=user,
        raw_configuration={"configurations": [{"thread_id": thread.pk}], "models": ["empty"]},
    ).plan
    assert plan.questions[0]["choices"] == [
        {"repository": str(mine.resolve()), "reason": f"used by your plan {my_plan.pk}"}
    ]
    # Bob asks the same question: he sees his clone, not Alice's.
    bobs = make_thread(cwd=folder, owner=other_user)
    theirs_plan = planning.prepare_plan(
        owner=other_user,
        raw_configuration={"configurations": [{"thread_id": bobs.pk}], "models": ["empty"]},
    ).plan
    assert [c["repository"] for c in theirs_plan.questions[0]["choices"]] == [str(theirs.resolve())]


# --- 8. Size limits: the page itself says so --------------------------------------------


def test_an_upload_over_the_limit_gets_the_upload_page_with_the_error(
    logged_in_client: Any,
) -> None:
    limit = 2048
    with override_settings(REPLAYS_MAX_TRANSCRIPT_BYTES=limit):
        response = logged_in_client.post(
            UPLOAD_URL, {"transcript": io.BytesIO(b"x" * 200_000)}, format="multipart"
        )
        form_page = logged_in_client.get(UPLOAD_URL).content.decode()
    assert response.status_code == 413
    assert response["Content-Type"].startswith("text/html")
    html = response.content.decode()
    assert "<h1>Upload a transcript</h1>" in html and 'type="file"' in html
    assert "larger than the transcript limit of 2.0 KiB, so it was not read" in html
    # The page and its refusal say the same limit, the one the import checks.
    assert "Up to 2.0 KiB." in html and "Up to 2.0 KiB." in form_page
    assert f"{limit + 64 * 1024:,}" not in html
    assert not Thread.objects.exists()


def test_a_replay_form_over_the_limit_gets_the_thread_page_with_the_error(
    user: User, make_thread: Callable[..., Thread]
) -> None:
    # A real browser sends a CSRF token the server cannot read without reading the body.
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(user)
    thread = make_thread()
    response = browser.post(thread.get_absolute_url(), {"verify_command": "x" * (2 * 1024 * 1024)})
    assert response.status_code == 413
    html = response.content.decode()
    assert "Prepare replay" in html and thread.title in html
    assert "so none of it was read and the fields below are back to their defaults" in html
    assert not Plan.objects.exists()


def test_a_refused_page_body_still_needs_a_login(make_thread: Callable[..., Thread]) -> None:
    thread = make_thread()
    response = Client().post(thread.get_absolute_url(), {"verify_command": "x" * (3 * 1024 * 1024)})
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


# --- 8. Grammar: statuses in sentences ---------------------------------------------------


def test_statuses_read_as_sentences_in_messages(
    user: User, make_thread: Callable[..., Thread], tmp_path: Path
) -> None:
    assert planning.status_phrase(PlanStatus.NEEDS_USER_INPUT) == "needs your input"
    assert planning.status_phrase(PlanStatus.BLOCKED) == "is blocked"
    thread = make_thread(cwd=str(tmp_path / "gone"))
    plan = planning.prepare_plan(
        owner=user,
        raw_configuration={"configurations": [{"thread_id": thread.pk}], "models": ["empty"]},
    ).plan
    Plan.objects.filter(pk=plan.pk).update(token_hash=planning.hash_token("known"))
    with pytest.raises(approval.ApprovalError) as raised:
        approval.approve_plan(
            plan_id=plan.pk, user=user, approved=True, prepare_token="known",
            run_config=plan.configuration,
        )  # fmt: skip
    assert raised.value.message == "The plan needs your input: it cannot be approved."


# --- 8. The folder column, the favicon, the API docs -------------------------------------


def test_folder_labels_show_the_end_that_tells_folders_apart() -> None:
    labels = folder_labels(
        ["/var/tmp/replays-fixtures/textstats", "/srv/a/app", "/srv/b/app", "/home/alice/x", "/srv"]
    )
    assert labels == {
        "/var/tmp/replays-fixtures/textstats": "…/textstats",
        "/srv/a/app": "…/a/app",
        "/srv/b/app": "…/b/app",
        "/home/alice/x": "~/x",
        "/srv": "/srv",
    }


def test_the_thread_list_shows_the_end_of_each_folder_with_the_whole_path_in_a_title(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(cwd="/var/tmp/replays-fixtures/textstats")
    make_thread(cwd="/var/tmp/replays-fixtures/wordcount")
    html = logged_in_client.get(reverse("replays:thread-list")).content.decode()
    assert '<span title="/var/tmp/replays-fixtures/textstats">…/textstats</span>' in html
    assert '<span title="/var/tmp/replays-fixtures/wordcount">…/wordcount</span>' in html


def test_favicon_is_served(logged_in_client: Any) -> None:
    response = Client().get("/favicon.ico")
    assert response.status_code == 301
    assert response["Location"].endswith("/static/replays/favicon.svg")
    assert finders.find("replays/favicon.svg")
    page = logged_in_client.get(reverse("replays:thread-list")).content.decode()
    assert 'rel="icon" href="/static/replays/favicon.svg"' in page


def test_the_api_docs_lead_back_to_the_site(logged_in_client: Any) -> None:
    html = logged_in_client.get("/api/docs/").content.decode()
    assert 'href="/">← Replays</a>' in html
    assert "swagger-ui" in html
