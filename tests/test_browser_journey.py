"""The whole journey in real Chromium, as a person does it: from the thread list to the
replay form, the plan and its approval, a batch that finishes live (the cards change
without a reload), the comparison and the leaderboard. The runs are real: a django-q2
cluster dispatches them, coordinators run the two calibration baselines, the sample's own
tests judge them. Screenshots of each step go to $REPLAYS_VAR_DIR/test-output/journey/."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, expect, sync_playwright

from tests.test_browser import CHROMIUM, CHROMIUM_ARGS, log_in  # noqa: F401 (skips without it)
from tests.test_cluster import start_cluster, stop_cluster

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

SCRIPTS = Path(__file__).resolve().parent / "agent_scripts"


@pytest.fixture
def world(
    process_env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    settings: Any,
    user: Any,
    real_threads: Any,
    sample_repo: Path,
) -> dict[str, Any]:
    values = {
        "REPLAYS_RUN_ROOT": str(tmp_path / "runs"),
        "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        # The tests take a few seconds, so the page is seen changing while they run.
        "VERIFY_SLEEP": "2",
    }
    env = {**process_env, **values}
    for name in ("DATABASE_URL", "REPLAYS_VAR_DIR", *values):
        monkeypatch.setenv(name, env[name])
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    cluster = start_cluster(env)
    output = Path(settings.REPLAYS_VAR_DIR) / "test-output" / "journey"
    output.mkdir(parents=True, exist_ok=True)
    yield {"thread": real_threads["claude-line-count"], "repo": sample_repo, "output": output}
    stop_cluster(cluster)


def test_configure_approve_watch_live_compare_and_rank(
    world: dict[str, Any], live_server: Any
) -> None:
    thread, output = world["thread"], world["output"]
    verify = f"{sys.executable} {SCRIPTS / 'verify.py'} {{junit_xml}}"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page: Page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
        page.set_default_timeout(15_000)
        log_in(page, live_server.url)

        # The thread list, then the thread and its replay form.
        page.get_by_role("link", name=thread.title[:40], exact=False).first.click()
        expect(page.get_by_role("heading", name="Replay")).to_be_visible()
        page.get_by_label("Historical result (baseline)").check()
        page.get_by_label("No change (baseline)").check()
        page.get_by_label("Last request").select_option(index=0)
        page.get_by_label("Repository").fill(str(world["repo"]))
        page.get_by_label("Verify command").fill(verify)
        page.get_by_label("Evaluator").select_option("tests")
        page.screenshot(path=str(output / "1-replay-form.png"), full_page=True)
        page.get_by_role("button", name="Prepare replay").click()

        # The plan: what will run, who judges, an estimate; then the one approval.
        expect(page.get_by_text("Approve 1 thread using 2 models?")).to_be_visible()
        expect(page.get_by_text("judged against history by")).to_be_visible()
        expect(page.locator(".approval-card")).to_contain_text("estimate")
        page.screenshot(path=str(output / "2-plan.png"), full_page=True)
        page.get_by_role("button", name="Approve").click()

        # The batch finishes live: the same page (no reload) goes from running to judged.
        expect(page).to_have_url(page.url)
        batch_url = page.url
        page.evaluate("window.__notReloaded = true")
        expect(page.locator(".live-note")).to_be_visible()
        page.screenshot(path=str(output / "3-batch-running.png"), full_page=True)
        expect(page.get_by_text("Results ready", exact=True)).to_be_visible(timeout=90_000)
        assert page.evaluate("window.__notReloaded === true"), "the page reloaded itself"
        assert page.url == batch_url
        cards = page.locator("article.run-card")
        expect(cards).to_have_count(2)
        historical = cards.filter(has_text="Historical result (baseline)")
        empty = cards.filter(has_text="No change (baseline)")
        expect(historical.locator(".verdict-winner")).to_have_text("Tie")
        expect(empty.locator(".verdict-winner")).to_have_text("Historical")
        expect(empty.locator("td.better")).to_contain_text(["1.00"])
        expect(empty).to_contain_text("2 broken")
        expect(page.locator(".results-summary")).to_contain_text("wins / ties / losses")
        page.screenshot(path=str(output / "4-batch-finished.png"), full_page=True)

        # The comparison: the verdict, the tests, the two diffs side by side.
        empty.get_by_role("link", name="Compare with history").click()
        expect(
            page.get_by_role("heading", name="No change (baseline) against history")
        ).to_be_visible()
        expect(page.locator("body")).to_contain_text("FAIL_TO_PASS")
        expect(page.locator("body")).to_contain_text("line_count")
        page.screenshot(path=str(output / "5-comparison.png"), full_page=True)

        # The leaderboard: a row per model with its interval.
        page.get_by_role("link", name="Leaderboard").click()
        table = page.locator("table").first
        expect(table).to_contain_text("Historical result")
        expect(table).to_contain_text("No change")
        expect(table).to_contain_text("100% (21–100%)")
        page.screenshot(path=str(output / "6-leaderboard.png"), full_page=True)
        browser.close()
