"""The campaign pages with Django's test client: the new-campaign form and its live preview
over a real history (tests/campaign_fixtures.py: repositories with and without tests, one
gone, a question), prepare -> the campaign's page -> one approval, cancel, the results of a
finished campaign (replays/factories/campaigns.py), the exports, ownership, the admin, and
a page that asks as many queries for 200 requests x 4 models as for a handful."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from replays.factories.campaigns import make_campaign
from replays.formatting import duration
from replays.models import (
    Batch,
    Campaign,
    CampaignRequest,
    CampaignStatus,
    ExclusionReason,
    Run,
    RunStatus,
    Turn,
)
from tests.campaign_fixtures import History, build_history

pytestmark = pytest.mark.django_db

NEW = "/campaigns/new/"
PREVIEW = "/campaigns/new/preview/"


def form_data(**changes: Any) -> dict[str, Any]:
    """The form as a person fills it: both baselines, judged by tests, the last 10."""
    data: dict[str, Any] = {
        "tool": "",
        "repository": "",
        "folder": "",
        "since": "",
        "until": "",
        "scan_last": "2000",
        "selection": "last",
        "limit": "10",
        "seed": "",
        "models": ["historical", "empty"],
        "evaluator": "tests",
        "budget_usd": "5",
        "verify_commands": "",
        "clones": "",
        "timeout_minutes": "30",
        "context": "",
    }
    data.update(changes)
    return {key: value for key, value in data.items() if value is not None}


@pytest.fixture
def history(tmp_path: Path, user: User) -> History:
    return build_history(tmp_path / "history", user)


@pytest.fixture
def alice(client: Client, user: User) -> Client:
    client.force_login(user)
    return client


def text_of(response: Any) -> str:
    """The page's text without tags and with spaces collapsed (what a person reads)."""
    html = response.content.decode()
    html = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html)).strip()


def prepare(client: Client, **changes: Any) -> Campaign:
    response = client.post(NEW, form_data(**changes))
    assert response.status_code == 302, text_of(response)[:2000]
    campaign = Campaign.objects.latest("pk")
    assert response["Location"] == campaign.get_absolute_url()
    return campaign


# --- the form and its preview --------------------------------------------------------------


def test_the_form_offers_filters_selection_models_evaluator_and_budget(alice: Client) -> None:
    response = alice.get(NEW)
    assert response.status_code == 200
    html = response.content.decode()
    for name in ("tool", "repository", "folder", "since", "until", "scan_last", "selection",
                 "limit", "seed", "evaluator", "budget_usd", "gradable_only", "verify_commands",
                 "clones"):  # fmt: skip
        assert f'name="{name}"' in html, name
    # The models as the replay form offers them, baselines included.
    assert 'value="historical"' in html and 'value="empty"' in html
    # The preview asks for itself as the fields change (debounced).
    assert f'hx-get="{PREVIEW}"' in html
    assert "delay:600ms" in html
    # Reached from the site's navigation.
    assert 'href="/campaigns/"' in html


def test_the_preview_counts_the_users_own_history_and_stores_nothing(
    alice: Client, history: History, other_user: User, tmp_path: Path
) -> None:
    build_history(tmp_path / "bob", other_user)  # another user's history is never scanned
    response = alice.get(PREVIEW, form_data(), HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    html = response.content.decode()
    # calc: 3 changes and a question; notes: 1 change but no test command for `tests` to
    # judge it by; gone: no repository.
    assert 'data-count="scanned">6<' in html
    assert 'data-count="eligible">3<' in html
    assert 'data-count="would_select">3<' in html
    assert f'data-reason="{ExclusionReason.NOT_GRADABLE}"' in html
    assert f'data-reason="{ExclusionReason.NO_CODE_CHANGE}"' in html
    assert f'data-reason="{ExclusionReason.REPOSITORY_MISSING}"' in html
    assert "<html" not in html  # a fragment
    assert not Campaign.objects.exists()

    narrowed = alice.get(PREVIEW, form_data(folder=str(history.calc)), HTTP_HX_REQUEST="true")
    assert 'data-count="scanned">4<' in narrowed.content.decode()
    assert 'data-count="eligible">3<' in narrowed.content.decode()


def test_the_preview_counts_before_models_are_chosen_and_says_what_is_wrong(
    alice: Client, history: History
) -> None:
    response = alice.get(PREVIEW, form_data(models=None))
    assert response.status_code == 200
    assert 'data-count="scanned">6<' in response.content.decode()
    assert "Choose models" in text_of(response)

    wrong = alice.get(PREVIEW, form_data(since="2026-10-06", until="2026-10-01"))
    # htmx swaps only a success: the fragment says what is wrong.
    assert wrong.status_code == 200
    assert "until is before" in text_of(wrong)


# --- prepare, the campaign's page, approval ------------------------------------------------------


def test_prepare_shows_the_counts_test_commands_estimate_and_the_approval(
    alice: Client, history: History
) -> None:
    campaign = prepare(alice)
    assert campaign.status == CampaignStatus.READY_FOR_APPROVAL
    response = alice.get(campaign.get_absolute_url())
    assert response.status_code == 200
    html, text = response.content.decode(), text_of(response)
    assert 'data-count="scanned">6<' in html
    assert 'data-count="selected">3<' in html
    # Excluded by reason, each in a fold that loads its list when opened.
    excluded = f"/campaigns/{campaign.pk}/excluded/?reason="
    for reason in ("repository_missing", "no_code_change"):
        assert f'data-reason="{reason}" hx-get="{excluded}{reason}"' in html
    folded = alice.get(excluded + "repository_missing", HTTP_HX_REQUEST="true")
    assert "is not a git repository here" in text_of(folded)
    assert f'href="/threads/{history.threads["gone"].pk}/#turn-1"' in folded.content.decode()
    folded = alice.get(excluded + "no_code_change", HTTP_HX_REQUEST="true")
    assert "What does calc/ops.py do?" in text_of(folded)
    assert "The agent only read and ran commands that change no file." in text_of(folded)
    assert alice.get(excluded + "nonsense").status_code == 404
    # calc's test command, found in what the historical agent typed, and where.
    command = campaign.test_commands[str(history.calc)]
    origin = command["origin"]
    assert f'href="/threads/{origin["thread_id"]}/#turn-{origin["turn"]}"' in html
    assert origin["typed"] in text and "-m pytest -q" in origin["typed"]
    assert "Found in what the historical agent ran" in text
    # notes has none, and says why.
    assert "No test command. No test runner was found" in text
    # The estimate: the baselines call no model (a known $0), the time at capacity.
    assert 'data-estimate="total">$0.00<' in html
    assert f"≈ {duration(campaign.estimate['seconds'])}" in text  # the time at capacity
    assert "$5.00" in text  # the budget
    assert campaign.approval_prompt in text
    assert f'action="/campaigns/{campaign.pk}/approve/"' in html
    assert f"/campaigns/new/?from={campaign.pk}" in html  # the way back


def test_an_unknown_price_is_shown_as_unknown_never_as_zero(
    alice: Client, history: History
) -> None:
    campaign = prepare(alice)
    estimate = campaign.estimate
    estimate["models"]["empty"]["cost_usd"] = None
    estimate["total_cost_usd"] = None
    Campaign.objects.filter(pk=campaign.pk).update(estimate=estimate)
    html = alice.get(campaign.get_absolute_url()).content.decode()
    total = re.search(r'data-estimate="total">(.*?)</td>', html, re.S)
    assert total is not None and "unknown price" in total.group(1)


def test_approval_from_the_page_creates_every_member_once(alice: Client, history: History) -> None:
    campaign = prepare(alice)
    url = f"/campaigns/{campaign.pk}/approve/"
    token_cookie = alice.cookies[f"campaign_token_{campaign.pk}"].value

    response = alice.post(url, {"approved": "true"})
    assert response.status_code == 302
    assert response["Location"] == campaign.get_absolute_url()
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.RUNNING
    selected = CampaignRequest.objects.filter(campaign=campaign, selected=True).count()
    assert Batch.objects.filter(campaign=campaign).count() == selected == 3
    assert Run.objects.filter(batch__campaign=campaign).count() == 6

    # The token was single use: the browser forgot it; a second press says it is done.
    again = alice.post(url, {"approved": "true"}, follow=True)
    assert "was already approved" in text_of(again)
    # A replayed token (a double submit that carried it) returns the same campaign.
    alice.cookies[f"campaign_token_{campaign.pk}"] = token_cookie
    replayed = alice.post(url, {"approved": "true"}, follow=True)
    assert "was already approved" in text_of(replayed)
    assert Batch.objects.filter(campaign=campaign).count() == 3
    assert Run.objects.filter(batch__campaign=campaign).count() == 6


def test_approval_needs_the_token_and_an_explicit_yes(alice: Client, history: History) -> None:
    campaign = prepare(alice)
    url = f"/campaigns/{campaign.pk}/approve/"
    refused = alice.post(url, {})  # no approved=true
    assert refused.status_code == 400
    assert "explicit approval" in text_of(refused)
    alice.cookies.pop(f"campaign_token_{campaign.pk}")
    no_token = alice.post(url, {"approved": "true"})
    assert no_token.status_code == 403
    assert "prepare token is not in this browser" in text_of(no_token)
    assert not Batch.objects.filter(campaign=campaign).exists()


def test_an_expired_campaign_is_prepared_again_from_its_page(
    alice: Client, history: History
) -> None:
    campaign = prepare(alice)
    Campaign.objects.filter(pk=campaign.pk).update(
        created_at=timezone.now() - timedelta(hours=1),
        expires_at=timezone.now() - timedelta(minutes=1),
    )
    page = alice.get(campaign.get_absolute_url())
    assert "This campaign expired" in text_of(page)
    assert f'action="/campaigns/{campaign.pk}/prepare-again/"' in page.content.decode()
    response = alice.post(f"/campaigns/{campaign.pk}/prepare-again/")
    newer = Campaign.objects.latest("pk")
    assert newer.pk != campaign.pk and response["Location"] == newer.get_absolute_url()
    assert newer.configuration == campaign.configuration
    assert alice.cookies[f"campaign_token_{newer.pk}"].value


def test_a_blocked_campaign_says_why_and_leads_back_to_its_form(
    alice: Client, history: History
) -> None:
    campaign = prepare(alice, since="2030-01-01", budget_usd="7.5", limit="4")
    assert campaign.status == CampaignStatus.BLOCKED
    page = alice.get(campaign.get_absolute_url())
    text = text_of(page)
    assert "Blocked: this campaign cannot be approved" in text
    assert "No request of the history is eligible" in text
    assert "/approve/" not in page.content.decode()
    back = alice.get(f"/campaigns/new/?from={campaign.pk}")
    form = back.context["form"]
    assert str(form["since"].value()) == "2030-01-01"
    assert form["limit"].value() == 4
    assert str(form["budget_usd"].value()) == "7.5"
    assert form["models"].value() == ["historical", "empty"]


def test_form_mistakes_are_shown_at_their_fields(alice: Client, history: History) -> None:
    wrong = alice.post(NEW, form_data(verify_commands="just a command"))
    assert wrong.status_code == 400
    assert "is not REPOSITORY=COMMAND" in text_of(wrong)
    refused = alice.post(NEW, form_data(since="2026-10-06", until="2026-10-01"))
    assert refused.status_code == 400
    assert refused.context["form"].errors["until"] == ["filters.until is before filters.since."]
    assert not Campaign.objects.exists()


def test_the_page_still_shows_requests_whose_turns_are_gone(
    alice: Client, history: History
) -> None:
    """Importing a thread again replaces its turns: the campaign keeps what it scanned."""
    campaign = prepare(alice)
    Turn.objects.filter(thread=history.threads["calc"]).delete()
    response = alice.get(campaign.get_absolute_url())
    assert response.status_code == 200
    assert "Add a neg function to calc/ops.py with a test." in text_of(response)
    folded = alice.get(f"/campaigns/{campaign.pk}/excluded/?reason=no_code_change")
    assert "What does calc/ops.py do?" in text_of(folded)


def test_a_given_test_command_is_shown_as_given(alice: Client, history: History) -> None:
    campaign = prepare(alice, verify_commands=f"{history.notes}=true --junit={{junit_xml}}")
    text = text_of(alice.get(campaign.get_absolute_url()))
    assert "Given by you." in text


# --- running, cancel ----------------------------------------------------------------------------


def approve(client: Client, campaign: Campaign) -> None:
    response = client.post(f"/campaigns/{campaign.pk}/approve/", {"approved": "true"})
    assert response.status_code == 302


def test_a_running_campaign_polls_its_progress_and_money(alice: Client, history: History) -> None:
    campaign = prepare(alice)
    approve(alice, campaign)
    page = alice.get(campaign.get_absolute_url())
    html, text = page.content.decode(), text_of(page)
    assert 'hx-trigger="every 2s"' in html
    assert "Cancel campaign" in text
    assert "0 / 6 runs ended" in text
    assert "$0.00 of $5.00 spent" in text
    # Each member's outcome links to its comparison with history.
    run = Run.objects.filter(batch__campaign=campaign).order_by("pk").first()
    assert f'href="/runs/{run.pk}/compare/"' in html
    # The poll answers the live part only.
    live = alice.get(campaign.get_absolute_url(), HTTP_HX_REQUEST="true")
    assert live.status_code == 200
    assert live.content.decode().lstrip().startswith('<div id="campaign-live"')


def test_cancel_stops_every_member_that_has_not_started(alice: Client, history: History) -> None:
    campaign = prepare(alice)
    approve(alice, campaign)
    response = alice.post(f"/campaigns/{campaign.pk}/cancel/", follow=True)
    assert "Campaign cancelled" in text_of(response)
    campaign.refresh_from_db()
    assert campaign.status == CampaignStatus.CANCELLED
    assert set(Run.objects.filter(batch__campaign=campaign).values_list("status", flat=True)) == {
        RunStatus.CANCELLED
    }
    page = alice.get(campaign.get_absolute_url())
    assert "Cancel campaign" not in text_of(page)
    assert 'hx-trigger="every' not in page.content.decode()


def test_the_page_says_when_members_wait_for_the_budget(alice: Client, user: User) -> None:
    made = make_campaign(user, requests=3, models=["historical", "codex:gpt-5.5"],
                         outcomes={"codex:gpt-5.5": ["running", "queued", "queued"]},
                         budget_usd=Decimal("0.3"))  # fmt: skip
    text = text_of(alice.get(made.campaign.get_absolute_url()))
    assert "Runs are waiting for the budget" in text


# --- results ------------------------------------------------------------------------------------


def test_a_finished_campaigns_results(alice: Client, user: User) -> None:
    made = make_campaign(user, requests=12)
    campaign = made.campaign
    assert campaign.status == CampaignStatus.FINISHED
    response = alice.get(campaign.get_absolute_url())
    html, text = response.content.decode(), text_of(response)
    assert 'hx-trigger="every' not in html  # nothing to wait for
    results = campaign.results
    for row in results["models"]:
        assert f'data-model="{row["model"]}"' in html
    gpt = next(row for row in results["models"] if row["model"] == "codex:gpt-5.5")
    # n, the rate with its Wilson interval, what is not counted (with why) and setup apart.
    row_html = html.split('data-model="codex:gpt-5.5"')[1].split("</tr>")[0]
    assert f'data-cell="n">{gpt["n"]}<' in row_html
    low, high = round(gpt["rate_low"] * 100), round(gpt["rate_high"] * 100)
    assert f"{round(gpt['rate'] * 100)}% ({low}–{high}%)" in row_html
    assert "budget exhausted" in row_html
    assert gpt["setup"] >= 1 and "leaderboard-setup" in row_html
    # Head to head with exact p-values, every pair.
    assert len(results["head_to_head"]) == 6
    assert "p-value" in text
    # Calibration holds: historical tied, empty lost.
    assert 'data-trusted="true"' in html and "The judge holds." in text
    # The chart: one point per model with a cost against history, and the corner.
    svg = html.split('<svg class="rate-cost-chart"')[1].split("</svg>")[0]
    drawn = [point for point in results["chart"] if point["x"] is not None]
    assert svg.count('<circle class="chart-dot"') == len(drawn) == 4
    assert "as good, for less" in svg and "1/16×" in svg and "16×" in svg
    # Every request, every model's outcome linking to its comparison.
    for run in made.runs["empty"]:
        assert f'href="/runs/{run.pk}/compare/"' in html
    assert html.count('class="outcome-cell"') == 12 * 4
    assert "CSV" in text and f"/campaigns/{campaign.pk}/results.csv" in html


def test_the_page_warns_when_the_judge_is_not_to_be_trusted(alice: Client, user: User) -> None:
    made = make_campaign(user, requests=6, outcomes={"historical": [("tie", 1.0), ("loss", 0.2)]})
    response = alice.get(made.campaign.get_absolute_url())
    text = text_of(response)
    assert "The judge is not to be trusted on this campaign" in text
    assert "historical lost on 3 of 6 gradable request(s)." in text
    assert 'data-trusted="false"' in response.content.decode()
    # The runs that came out wrong, to look at.
    for run in made.runs["historical"][1::2]:
        assert f'<a href="/runs/{run.pk}/compare/">run {run.pk}</a>' in response.content.decode()


def test_calibration_not_checked_without_the_baselines(alice: Client, user: User) -> None:
    made = make_campaign(
        user, requests=4, models=["codex:gpt-5.5", "claude_code:claude-sonnet-4-5"]
    )
    response = alice.get(made.campaign.get_absolute_url())
    assert 'data-trusted="unknown"' in response.content.decode()
    assert "Not checked." in text_of(response)
    assert "Include the historical and empty baselines" in text_of(response)


def test_exports_give_the_results_as_csv_and_json(alice: Client, user: User) -> None:
    made = make_campaign(user, requests=5)
    campaign = made.campaign
    response = alice.get(f"/campaigns/{campaign.pk}/results.csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert f'filename="campaign-{campaign.pk}-results.csv"' in response["Content-Disposition"]
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    assert rows[0][:3] == ["model", "n", "wins"]
    assert [row[0] for row in rows[1:5]] == campaign.configuration["models"]
    assert sum(1 for row in rows if len(row) == 11 and row[0].isdigit()) == 5 * 4

    exported = alice.get(f"/campaigns/{campaign.pk}/results.json")
    assert exported["Content-Type"] == "application/json"
    assert "attachment" in exported["Content-Disposition"]
    data = json.loads(exported.content)
    assert data["campaign"] == campaign.pk
    assert [row["model"] for row in data["models"]] == campaign.configuration["models"]
    assert len(data["requests"]) == 5 and "signature" not in data


def test_exports_of_a_campaign_not_approved_are_404(alice: Client, history: History) -> None:
    campaign = prepare(alice)
    assert alice.get(f"/campaigns/{campaign.pk}/results.csv").status_code == 404
    assert alice.get(f"/campaigns/{campaign.pk}/results.json").status_code == 404


# --- whose is what ---------------------------------------------------------------------------------


def test_another_users_campaign_is_not_found(client: Client, user: User, other_user: User) -> None:
    made = make_campaign(user, requests=2)
    pk = made.campaign.pk
    client.force_login(other_user)
    for path in (f"/campaigns/{pk}/", f"/campaigns/{pk}/results.csv",
                 f"/campaigns/{pk}/results.json", f"/campaigns/new/?from={pk}",
                 f"/campaigns/{pk}/excluded/?reason=no_code_change"):  # fmt: skip
        assert client.get(path).status_code == 404, path
    for path in (f"/campaigns/{pk}/cancel/", f"/campaigns/{pk}/approve/",
                 f"/campaigns/{pk}/prepare-again/"):  # fmt: skip
        assert client.post(path, {"approved": "true"}).status_code == 404, path
    listing = client.get("/campaigns/")
    assert f"Campaign {pk}" not in text_of(listing)
    assert "No campaigns yet" in text_of(listing)


def test_the_list_shows_the_users_campaigns(alice: Client, user: User, history: History) -> None:
    finished = make_campaign(user, requests=3).campaign
    ready = prepare(alice)
    response = alice.get("/campaigns/")
    assert response.status_code == 200
    text = text_of(response)
    assert f"Campaign {finished.pk}" in text and f"Campaign {ready.pk}" in text
    assert "Finished" in text and "Ready for approval" in text
    assert "3 of 6" in text  # selected of scanned
    assert "not approved" in text
    assert 'aria-current="page">Campaigns<' in response.content.decode()


# --- the admin -------------------------------------------------------------------------------------


def test_the_admin_lists_campaigns_and_their_requests_read_only(
    client: Client, staff_user: User
) -> None:
    made = make_campaign(staff_user, requests=4, excluded=2)
    client.force_login(staff_user)
    listing = client.get(reverse("admin:replays_campaign_changelist"))
    assert listing.status_code == 200
    assert client.get(reverse("admin:replays_campaign_add")).status_code == 403
    change = client.get(reverse("admin:replays_campaign_change", args=[made.campaign.pk]))
    assert change.status_code == 200
    assert not change.context["adminform"].form.fields  # nothing can be edited here
    html = change.content.decode()
    assert "&quot;head_to_head&quot;" in html  # the results, as JSON
    requests_url = reverse("admin:replays_campaignrequest_changelist")
    assert f"{requests_url}?campaign={made.campaign.pk}" in html
    rows = client.get(requests_url, {"campaign": made.campaign.pk})
    assert rows.context["cl"].result_count == 6
    excluded = client.get(requests_url, {"campaign": made.campaign.pk, "eligible__exact": "0"})
    assert excluded.context["cl"].result_count == 2
    by_reason = client.get(requests_url, {"reason__exact": ExclusionReason.NO_CODE_CHANGE})
    assert by_reason.context["cl"].result_count == 2
    batches = client.get(reverse("admin:replays_batch_changelist"), {"campaign": made.campaign.pk})
    assert batches.context["cl"].result_count == 4
    request = CampaignRequest.objects.filter(campaign=made.campaign).first()
    change = client.get(reverse("admin:replays_campaignrequest_change", args=[request.pk]))
    assert change.status_code == 200 and not change.context["adminform"].form.fields


# --- no N+1 ------------------------------------------------------------------------------------------


def queries_of(client: Client, url: str, **headers: Any) -> int:
    with CaptureQueriesContext(connection) as queries:
        response = client.get(url, **headers)
    assert response.status_code == 200, url
    return len(queries)


@pytest.mark.parametrize("part", ["page", "live", "list", "excluded"])
def test_the_campaign_page_asks_as_many_queries_for_200_requests_x_4_models_as_for_a_few(
    alice: Client, user: User, part: str
) -> None:
    small = make_campaign(user, requests=3, models=["historical", "codex:gpt-5.5"]).campaign
    headers = {"HTTP_HX_REQUEST": "true"} if part == "live" else {}
    url = address(part, small)
    alice.get(url, **headers)  # the first request of a session reads what later ones have
    few = queries_of(alice, url, **headers)

    large = make_campaign(user, requests=200, excluded=40).campaign
    for _ in range(3):
        make_campaign(user, requests=5)
    assert Run.objects.filter(batch__campaign=large).count() == 800
    assert queries_of(alice, address(part, large), **headers) == few


def address(part: str, campaign: Campaign) -> str:
    if part == "list":
        return "/campaigns/"
    if part == "excluded":
        return f"/campaigns/{campaign.pk}/excluded/?reason={ExclusionReason.NO_CODE_CHANGE}"
    return campaign.get_absolute_url()
