"""Every page on a phone held upright (375 px wide) in real Chromium: nothing scrolls the
page sideways (a wide table or diff scrolls inside its own box). The comparison page's
verdict and judgments tables did."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Plan, Report, ReportStatus, Run, RunPhase, RunStatus
from tests.test_browser import CHROMIUM, CHROMIUM_ARGS  # noqa: F401 (skips without it)

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WIDTH = 375
# The innermost elements that reach past the right edge: what to fix when the test fails.
WIDEST = """
[...document.querySelectorAll('main *')]
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 1
               && e.parentElement.getBoundingClientRect().right <= window.innerWidth + 1)
  .slice(0, 6)
  .map(e => e.tagName.toLowerCase() + '.' + [...e.classList].join('.') + ' ' + Math.round(e.getBoundingClientRect().right))
"""
LONG = "a_test_name_with_no_place_to_break_" * 4


def judged(run: Run, *, evaluator: str) -> Report:
    """A finished run with a long-worded report, as pages must show it."""
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.COMPLETED, phase=RunPhase.DONE, finished_at=timezone.now(),
        wall_seconds=75.0, cost_usd=Decimal("0.1234"), files_changed=3, exit_code=0,
        diff="diff --git a/x.py b/x.py\n--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-" + "x" * 300
        + "\n+" + "y" * 300 + "\n",
    )  # fmt: skip
    tree = {"outcome": "failed", "exit_code": 2, "seconds": 1.0, "tests": None,
            "output_tail": "E   " + LONG * 3, "message": ""}  # fmt: skip
    data = {
        "schema": 1,
        "historical": {"cost_usd": 0.25, "seconds": 120.0, "context": "cold", "files_changed": 2},
        "replay": {"cost_usd": 0.1234, "seconds": 75.0, "context": "cold", "files_changed": 3},
        "scores": {"historical": 1.0, "replay": 0.5},
        "checks": [{"id": "c1", "text": "Keeps " + LONG,
                    "historical": {"passed": True, "reasons": [LONG]},
                    "replay": {"passed": False, "reasons": [LONG]}}],
        "tests": {"verify_command": "python -m pytest -q --junitxml={junit_xml} " + LONG,
                  "test_files": [f"tests/{LONG}.py"], "usable": True, "reason": LONG,
                  "fail_to_pass": [f"tests.{LONG}::test_{LONG}"], "pass_to_pass": [],
                  "kept": [], "broken": [f"tests.{LONG}::test_{LONG}"],
                  "baseline": tree, "historical": tree, "replay": tree},
        "verdicts": [{"reason": LONG}],
        "evaluator": {"cost_usd": 0.01},
    }  # fmt: skip
    return Report.objects.create(
        run=run, is_current=True, status=ReportStatus.JUDGED, winner="historical",
        score_historical=1.0, score_replay=0.5, consistent=True, evaluator=evaluator,
        evaluator_cost_usd=Decimal("0.01"), reason="", data=data, finished_at=timezone.now(),
    )  # fmt: skip


@pytest.fixture
def pages(user: Any, real_threads: dict[str, Any], tmp_path: Path) -> list[str]:
    repo, baseline, ending = make_git_repo(tmp_path)
    batch, runs = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, evaluator="tests",
        models=["historical", "empty", "codex:" + "m" * 60],
    )  # fmt: skip
    for run in runs[:2]:
        judged(run, evaluator="tests")
    Run.objects.filter(pk=runs[2].pk).update(
        status=RunStatus.FAILED, phase=RunPhase.DONE, finished_at=timezone.now(),
        failure_code="setup", failure_message="Setup problem: " + LONG,
    )  # fmt: skip
    thread = real_threads["claude-line-count"]
    plan = Plan.objects.filter(pk=batch.plan_id).get()
    return [
        "/",
        f"/threads/{thread.pk}/",
        "/threads/upload/",
        "/batches/",
        batch.get_absolute_url(),
        f"/plans/{plan.pk}/",
        f"/runs/{runs[0].pk}/",
        f"/runs/{runs[0].pk}/compare/",
        f"/runs/{runs[2].pk}/",
        f"/runs/{runs[2].pk}/compare/",
        "/leaderboard/",
    ]


def test_no_page_scrolls_sideways_on_a_phone(
    pages: list[str], live_server: Any, browser_context: Any
) -> None:
    page = browser_context.new_page()
    page.goto(live_server.url + "/accounts/login/")
    assert page.evaluate("document.documentElement.scrollWidth") <= WIDTH
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("correct-horse-battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(live_server.url + "/")
    wide = {}
    for path in pages:
        response = page.goto(live_server.url + path)
        assert response is not None and response.status == 200, path
        width = page.evaluate("document.documentElement.scrollWidth")
        if width > WIDTH:
            wide[path] = (width, page.evaluate(WIDEST))
    assert wide == {}, "\n".join(f"{path}: {found}" for path, found in wide.items())


@pytest.fixture
def browser_context() -> Any:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": WIDTH, "height": 800})
        context.set_default_timeout(15_000)
        yield context
        context.close()
        browser.close()


def test_on_a_wide_screen_table_words_stay_whole(
    pages: list[str], live_server: Any, browser_context: Any
) -> None:
    """Breaking long names anywhere must not break short words in narrow table columns
    ("Historica" / "l" in the judgments table)."""
    page = browser_context.new_page()
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto(live_server.url + "/accounts/login/")
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("correct-horse-battery")
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url(live_server.url + "/")
    compare = next(path for path in pages if path.endswith("/compare/"))
    page.goto(live_server.url + compare)
    lines = page.evaluate(
        """[...document.querySelectorAll('.compare-judgments td')]
             .filter(td => td.textContent.trim() === 'Historical')
             .map(td => { const r = document.createRange(); r.selectNodeContents(td);
                          return r.getClientRects().length; })"""
    )
    assert lines == [1]
