"""The campaign pages in a real browser (Debian's Chromium, driven by Playwright) against a
live server: the form's live preview as the filters change, prepare and approve with the
token kept in the browser, a running campaign's page updating itself, the results' chart,
and no page scrolling sideways on a phone."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone

from replays.factories.campaigns import make_campaign
from replays.models import Batch, Campaign, Run, RunPhase, RunStatus
from tests.campaign_fixtures import History, build_history
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS
from tests.test_browser_narrow import WIDEST

os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture(autouse=True)
def _var_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"


@pytest.fixture
def history(tmp_path: Path, user: User) -> History:
    return build_history(tmp_path / "history", user)


def signed_in(browser: Browser, base_url: str, *, width: int = 1280) -> Page:
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(20_000)
    page = context.new_page()
    page.goto(base_url + "/accounts/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("correct-horse-battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(base_url + "/")
    return page


def test_the_preview_follows_the_filters_as_they_are_typed(
    browser: Browser, live_server: Any, history: History
) -> None:
    page = signed_in(browser, live_server.url)
    previews: list[str] = []
    page.on(
        "request",
        lambda request: previews.append(request.url) if "/preview/" in request.url else None,
    )
    page.get_by_role("link", name="Campaigns").click()
    page.get_by_role("link", name="New campaign").click()
    expect(page.locator('[data-count="scanned"]')).to_have_text("6")
    # Judged by `tests` (no model chosen yet: the baselines' evaluator), the notes
    # repository, where no agent ran a test runner, is not gradable.
    expect(page.locator('[data-count="eligible"]')).to_have_text("3")
    expect(page.locator('[data-reason="repository_missing"]')).to_contain_text("Repository missing")
    expect(page.locator('[data-reason="not_gradable"]')).to_contain_text("Not gradable")

    before = len(previews)
    folder = str(history.calc)
    page.get_by_label("Folder").press_sequentially(folder, delay=15)
    expect(page.locator('[data-count="scanned"]')).to_have_text("4")
    expect(page.locator('[data-count="eligible"]')).to_have_text("3")
    # Debounced: typing a path asks for a handful of previews, not one per key.
    assert len(previews) - before < len(folder) // 3

    page.get_by_label("N", exact=True).fill("2")
    expect(page.locator('[data-count="would_select"]')).to_have_text("2")
    assert not Campaign.objects.exists()  # a preview stores nothing


def test_prepare_and_approve_in_the_browser_then_watch_it_run(
    browser: Browser, live_server: Any, history: History
) -> None:
    page = signed_in(browser, live_server.url)
    page.goto(live_server.url + "/campaigns/new/")
    page.get_by_label("Historical result").check()
    page.get_by_label("No change").check()
    page.get_by_label("Evaluator").select_option("tests")
    page.get_by_label("Budget (USD)").fill("5")
    page.get_by_role("button", name="Prepare campaign").click()
    expect(page.locator("#approval-prompt")).to_have_text(
        "Approve 3 requests using 2 models (6 runs) within $5?"
    )
    campaign = Campaign.objects.get()
    expect(page.locator(".test-command").first).to_contain_text(
        "Found in what the historical agent ran"
    )

    # A reason's fold loads its requests when opened.
    fold = page.locator('details[data-reason="no_code_change"]')
    fold.locator("summary").click()
    expect(fold.locator(".excluded-list li")).to_have_count(1)
    expect(fold).to_contain_text("What does calc/ops.py do?")

    # The token went to this browser only, in a cookie scoped to the campaign's pages.
    page.get_by_role("button", name="Approve").click()
    expect(page.locator(".message-success")).to_contain_text("Approved: 3 requests, 6 runs queued.")
    assert Batch.objects.filter(campaign=campaign).count() == 3
    expect(page.locator('[data-progress="ended"]')).to_have_text("0 / 6")

    # The page follows the runs as they end, without a reload.
    Run.objects.filter(batch__campaign=campaign).update(
        status=RunStatus.CANCELLED, phase=RunPhase.DONE, finished_at=timezone.now()
    )
    expect(page.locator('[data-progress="ended"]')).to_have_text("6 / 6", timeout=30_000)
    expect(page.locator("#campaign-live")).not_to_have_attribute("hx-trigger", re.compile("every"))


def test_the_results_page_draws_rate_against_cost(
    browser: Browser, live_server: Any, user: User
) -> None:
    made = make_campaign(user, requests=12)
    page = signed_in(browser, live_server.url)
    page.goto(live_server.url + made.campaign.get_absolute_url())
    chart = page.locator("svg.rate-cost-chart")
    expect(chart).to_be_visible()
    points = chart.locator("g.chart-point")
    expect(points).to_have_count(4)
    for label in ("codex:gpt-5.5", "Historical result (baseline)", "No change (baseline)"):
        expect(chart.locator("text.chart-label", has_text=label)).to_have_count(1)
    expect(chart.locator("text.chart-sweet-label")).to_have_text("as good, for less")
    box = chart.bounding_box()
    assert box is not None and box["width"] > 500 and box["height"] > 250
    # An agent cheaper than history sits left of history's cost line, one dearer right of it.
    line = float(chart.locator("line.chart-history").get_attribute("x1") or 0)
    cheap = float(points.nth(2).locator("circle").get_attribute("cx") or 0)
    dear = float(points.nth(3).locator("circle").get_attribute("cx") or 0)
    assert cheap < line < dear
    expect(page.locator(".calibration-trusted")).to_have_text("The judge holds.")
    # Each outcome opens the run's comparison with history.
    page.locator("a.outcome").first.click()
    expect(page).to_have_url(re.compile(r"/runs/\d+/compare/$"))


def test_no_campaign_page_scrolls_sideways_on_a_phone(
    browser: Browser, live_server: Any, user: User, history: History
) -> None:
    finished = make_campaign(user, requests=8, models=[
        "historical", "empty", "codex:" + "m" * 60, "claude_code:claude-sonnet-4-5"])  # fmt: skip
    untrusted = make_campaign(user, requests=4, outcomes={"historical": [("loss", 0.1)]})
    running = make_campaign(user, requests=4, outcomes={"codex:gpt-5.5": ["running"]})
    page = signed_in(browser, live_server.url, width=375)
    page.goto(live_server.url + "/campaigns/new/")
    page.get_by_label("Historical result").check()
    page.get_by_label("Evaluator").select_option("tests")
    page.get_by_role("button", name="Prepare campaign").click()
    page.wait_for_url(re.compile(r"/campaigns/\d+/$"))
    ready = page.url.removeprefix(live_server.url)
    wide = {}
    for path in ["/campaigns/", "/campaigns/new/", ready, finished.campaign.get_absolute_url(),
                 untrusted.campaign.get_absolute_url(), running.campaign.get_absolute_url()]:  # fmt: skip
        response = page.goto(live_server.url + path)
        assert response is not None and response.status == 200, path
        page.wait_for_load_state("networkidle") if path == "/campaigns/new/" else None
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > 375:
            wide[path] = (width, page.evaluate(WIDEST))
    assert wide == {}, "\n".join(f"{path}: {found}" for path, found in wide.items())
