"""The pages in a real browser (Debian's Chromium, driven by Playwright) against a live server."""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from replays.models import Thread
from tests.test_pages import claude_transcript

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

if not CHROMIUM.exists():
    pytest.skip(
        "Chromium is not installed at /usr/bin/chromium (apt-get install chromium)",
        allow_module_level=True,
    )

# Playwright's sync API runs an event loop in this thread; the ORM calls the
# tests make around it are still plain synchronous code.
os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"

from playwright.sync_api import Browser, Page, expect, sync_playwright  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    context.set_default_timeout(10_000)
    yield context.new_page()
    context.close()


@pytest.fixture(autouse=True)
def _uploads_in_tmp(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"


def log_in(page: Page, base_url: str) -> None:
    page.goto(base_url + "/")
    expect(page).to_have_url(base_url + "/accounts/login/?next=/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("correct-horse-battery")
    page.get_by_role("button", name="Log in").click()
    expect(page).to_have_url(base_url + "/")


def test_log_in_and_see_the_seeded_threads(
    page: Page, live_server: Any, user: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Fix the flaky login test", turns=3)
    make_thread(title="Add CSV export", turns=1, kind="codex")
    log_in(page, live_server.url)
    rows = page.locator("table.thread-table tbody tr")
    expect(rows).to_have_count(2)
    expect(page.get_by_role("link", name="Fix the flaky login test")).to_be_visible()
    expect(page.get_by_role("link", name="Add CSV export")).to_be_visible()
    expect(page.locator("[data-total=threads]")).to_have_text("2")
    expect(page.get_by_text("alice", exact=True)).to_be_visible()
    # The stylesheet is served and applied (numbers are right-aligned).
    assert (
        page.locator("td.num").first.evaluate("cell => getComputedStyle(cell).textAlign") == "right"
    )


def test_search_narrows_the_list(
    page: Page, live_server: Any, user: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Refactor billing", requests=["split invoices by customer", "done?"])
    make_thread(title="Write release notes", requests=["notes for 2.0", "thanks"])
    log_in(page, live_server.url)
    search = page.get_by_role("searchbox", name="Search threads")
    search.fill("INVOICES")
    search.press("Enter")
    expect(page).to_have_url(live_server.url + "/?q=INVOICES")
    expect(page.locator("table.thread-table tbody tr")).to_have_count(1)
    expect(page.get_by_role("link", name="Refactor billing")).to_be_visible()
    expect(page.get_by_role("searchbox", name="Search threads")).to_have_value("INVOICES")


def test_click_into_a_thread_and_see_its_turns(
    page: Page, live_server: Any, user: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(
        title="Dark mode", requests=["Add a dark mode toggle", "<b>Persist</b> it"]
    )
    log_in(page, live_server.url)
    page.get_by_role("link", name="Dark mode").click()
    expect(page).to_have_url(live_server.url + thread.get_absolute_url())
    expect(page.get_by_role("heading", level=1)).to_have_text("Dark mode")
    turns = page.locator("li.turn")
    expect(turns).to_have_count(2)
    expect(turns.nth(0).locator(".request-text")).to_have_text("Add a dark mode toggle")
    # Markup in a request is shown as text, not rendered.
    expect(turns.nth(1).locator(".request-text")).to_have_text("<b>Persist</b> it")
    expect(turns.nth(1).locator("b")).to_have_count(0)


def test_long_request_opens_on_demand(
    page: Page, live_server: Any, user: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=1, requests=["\n".join(f"log line {n}" for n in range(1, 51))])
    log_in(page, live_server.url)
    page.goto(live_server.url + thread.get_absolute_url())
    expect(page.get_by_text("log line 20")).to_be_visible()
    expect(page.get_by_text("log line 50")).to_be_hidden()
    page.get_by_text("Show 30 more lines").click()
    expect(page.get_by_text("log line 50")).to_be_visible()


def test_upload_a_transcript_and_land_on_the_new_thread(
    page: Page, live_server: Any, user: Any, tmp_path: Path
) -> None:
    transcript = tmp_path / "4c1f1f0e-1111-4222-8333-444455556666.jsonl"
    transcript.write_bytes(
        claude_transcript(requests=["Add a --verbose flag to the CLI", "Document it"])
    )
    log_in(page, live_server.url)
    page.get_by_role("navigation", name="Main").get_by_role("link", name="Upload").click()
    page.get_by_label("Transcript file").set_input_files(transcript)
    page.get_by_role("button", name="Import").click()
    thread = Thread.objects.get()
    expect(page).to_have_url(live_server.url + thread.get_absolute_url())
    expect(page.locator(".message-success")).to_contain_text("2 turns")
    turns = page.locator("li.turn")
    expect(turns).to_have_count(2)
    expect(turns.nth(0).locator(".request-text")).to_have_text("Add a --verbose flag to the CLI")


def test_upload_of_a_non_transcript_shows_the_error_in_the_form(
    page: Page, live_server: Any, user: Any, tmp_path: Path
) -> None:
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list: milk, eggs\n")
    log_in(page, live_server.url)
    page.goto(live_server.url + "/threads/upload/")
    page.get_by_label("Transcript file").set_input_files(notes)
    page.get_by_role("button", name="Import").click()
    expect(page.locator(".field-error")).to_contain_text("not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi")
    assert not Thread.objects.exists()


def test_log_out_returns_to_the_login_page(page: Page, live_server: Any, user: Any) -> None:
    log_in(page, live_server.url)
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(live_server.url + "/accounts/login/")
    page.goto(live_server.url + "/")
    expect(page).to_have_url(live_server.url + "/accounts/login/?next=/")


def test_replay_a_thread_from_its_page_and_approve_it(
    page: Page, live_server: Any, user: Any, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    from replays.models import Batch

    thread = real_threads["claude-line-count"]
    log_in(page, live_server.url)
    page.goto(live_server.url + thread.get_absolute_url())
    page.get_by_role("link", name="Replay…").click()
    form = page.locator("#replay")
    form.get_by_label("Historical result (baseline)").check()
    form.get_by_label("No change (baseline)").check()
    first = form.get_by_label("First request")
    first.select_option(index=0)
    form.get_by_label("Last request").select_option(first.input_value())
    form.get_by_label("Repository").fill(str(sample_repo))
    form.get_by_role("button", name="Prepare replay").click()

    expect(page).to_have_url(re.compile(r"/plans/\d+/$"))
    expect(page.locator(".approval-prompt")).to_have_text("Approve 1 thread using 2 models?")
    page.get_by_role("button", name="Approve").click()

    batch = Batch.objects.get()
    expect(page).to_have_url(live_server.url + batch.get_absolute_url())
    expect(page.locator(".message-success")).to_have_text("Approved: 2 runs queued.")
    cards = page.locator(".run-card")
    expect(cards).to_have_count(2)
    expect(cards.nth(0).locator(".run-card-label")).to_have_text("Historical result (baseline)")
    expect(cards.nth(1).locator(".run-card-label")).to_have_text("No change (baseline)")
    for index in range(2):
        expect(cards.nth(index).locator(".status")).to_have_text("Queued")
    expect(page.get_by_role("button", name="Cancel batch")).to_be_visible()


@pytest.mark.parametrize("width", [375, 600])
def test_the_header_fits_a_phone_screen_and_every_link_can_be_reached(
    browser: Browser, live_server: Any, staff_user: Any, width: int
) -> None:
    """A narrow screen (a phone held upright) must not scroll sideways: the header wraps,
    and every main link stays visible inside the viewport."""
    context = browser.new_context(viewport={"width": width, "height": 800})
    context.set_default_timeout(10_000)
    page = context.new_page()
    try:
        page.goto(live_server.url + "/accounts/login/")
        page.get_by_label("Username").fill("carol")
        page.get_by_label("Password").fill("correct-horse-battery")
        page.get_by_role("button", name="Log in").click()
        expect(page.get_by_role("navigation", name="Main")).to_be_visible()
        assert page.evaluate("document.documentElement.scrollWidth") <= width
        for name in ("Threads", "Batches", "Leaderboard", "Upload", "API docs", "Admin"):
            box = page.get_by_role("navigation", name="Main").get_by_role("link", name=name)
            box.scroll_into_view_if_needed()
            bounds = box.bounding_box()
            assert (
                bounds is not None and 0 <= bounds["x"] and bounds["x"] + bounds["width"] <= width
            )
        logout = page.get_by_role("button", name="Log out").bounding_box()
        assert logout is not None and logout["x"] + logout["width"] <= width
    finally:
        context.close()
