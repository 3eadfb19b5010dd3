"""Take the README screenshot of the thread list (1280x800) with a few realistic threads.

    .venv/bin/python tests/screenshot.py [--thread-page /tmp/thread.png]

Runs against a throwaway database in a temporary folder, so it never touches var/.
Needs Chromium at /usr/bin/chromium.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "replays" / "static" / "replays" / "screenshot.png"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]

# fmt: off
THREADS = [
    # (title, kind, folder, branch,
    #  turns, input, output, cache read, cache write 5m, cost, seconds)
    ("Fix flaky test_checkout_total on CI",
     "claude_code", "/home/alice/src/shop", "fix/flaky-checkout",
     6, 48_210, 12_904, 1_204_556, 88_120, "2.8714", 1_472),
    ("Add CSV export to the reports page",
     "codex", "/home/alice/src/shop", "feature/csv-export",
     4, 210_400, 18_220, 1_530_112, 0, "0.6931", 913),
    ("Migrate settings to environment variables",
     "claude_code", "/home/alice/src/replays", "main",
     9, 91_002, 30_118, 3_905_210, 150_400, "5.1260", 3_781),
    ("Why is the importer slow on large sessions?",
     "claude_code", "/home/alice/src/replays", "perf/importer",
     2, 12_001, 2_410, 220_914, 31_000, "0.2107", 125),
    ("Rename Customer.kind to Customer.segment",
     "codex", "/home/alice/src/crm", "refactor/segment",
     3, 84_320, 9_610, 610_240, 0, "0.2533", 402),
    ("Write a README section on deployment",
     "claude_code", "/home/alice/src/replays", "docs/deploy",
     1, 3_200, 1_150, 40_210, 8_200, "0.0812", 45),
    ("Try the local model on the parser bug",
     "codex", "/srv/work/parser", "main",
     2, 40_100, 6_020, 0, 0, None, 310),
    ("Bump Django to 5.2 and fix deprecations",
     "claude_code", "/home/alice/src/crm", "chore/django-5.2",
     5, 60_880, 14_302, 2_118_004, 64_090, "1.9435", 1_260),
    ("Paginate the runs API and document the cursor",
     "codex", "/home/alice/src/replays", "feature/api-cursor",
     3, 120_400, 11_480, 880_300, 0, "0.4127", 655),
    ("Explain the failing migration on PostgreSQL 16",
     "claude_code", "/home/alice/src/crm", "main",
     1, 6_410, 980, 84_200, 12_050, "0.0391", 38),
    ("Port the date helpers from moment to Temporal",
     "claude_code", "/home/alice/src/web-client", "refactor/temporal-dates",
     7, 70_110, 21_998, 2_760_050, 102_300, "3.0482", 2_405),
]
# fmt: on

REQUESTS = [
    "The test test_checkout_total fails about one run in ten on CI but never locally.\n"
    "Find out why and fix it. Here is the failing log:\n\n"
    + "\n".join(
        f"  E   AssertionError: assert Decimal('{n}9.99') == Decimal('{n}9.98')" for n in range(30)
    ),
    "Looks good. Can you also add a regression test that pins the rounding mode?",
    "Run the whole suite once more and summarise what changed.",
]


def seed() -> int:
    from django.contrib.auth.models import User

    from replays.models import Thread, Turn

    User.objects.create_user("alice", "alice@example.com", "correct-horse-battery", is_staff=True)
    start = datetime(2026, 11, 14, 16, 40, tzinfo=UTC)
    first_pk = 0
    for number, row in enumerate(THREADS):
        title, kind, cwd, branch, turns, inp, out, read, write, cost, seconds = row
        started = start - timedelta(hours=7 * number, minutes=13 * number)
        thread = Thread.objects.create(
            source_kind=kind,
            session_id=f"6f1c2a0e-0000-4000-8000-{number:012d}",
            title=title,
            cwd=cwd,
            git_branch=branch,
            git_commit="9b2e4f1c0a7d3e5f8a6b1c2d3e4f5a6b7c8d9e0f" if kind == "codex" else "",
            cli_version="2.1.197" if kind == "claude_code" else "0.169.0",
            started_at=started,
            ended_at=started + timedelta(seconds=seconds * 1.4),
            source_path=f"{cwd.replace('/src/', '/.claude/projects/-')}/{number}.jsonl",
            source_sha256=f"{number:064x}",
            source_size=100_000 * turns,
            turn_count=turns,
            input_tokens=inp,
            output_tokens=out,
            cache_read_tokens=read,
            cache_write_5m_tokens=write,
            cost_usd=None if cost is None else Decimal(cost),
            seconds=seconds,
            models_used=["gpt-5.3-codex"]
            if kind == "codex"
            else ["claude-sonnet-4-5", "claude-haiku-4-5"],
        )
        first_pk = first_pk or thread.pk
        for index in range(turns):
            share = Decimal(1) / turns
            Turn.objects.create(
                thread=thread,
                index=index,
                message_uuid=f"{number}-{index}",
                timestamp=started + timedelta(seconds=seconds * index / turns),
                request=REQUESTS[index % len(REQUESTS)]
                if number == 0
                else f"{title} (step {index + 1})",
                models_used=thread.models_used,
                input_tokens=inp // turns,
                output_tokens=out // turns,
                cache_read_tokens=read // turns,
                cache_write_5m_tokens=write // turns,
                cost_usd=None
                if cost is None
                else (Decimal(cost) * share).quantize(Decimal("0.000001")),
                seconds=seconds / turns,
            )
    return first_pk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=OUTPUT)
    parser.add_argument(
        "--thread-page", type=Path, help="also save a screenshot of one thread page here"
    )
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="replays-screenshot-"))
    os.environ["REPLAYS_VAR_DIR"] = str(workdir)
    os.environ.pop("DATABASE_URL", None)
    os.environ["DJANGO_SETTINGS_MODULE"] = "replaysite.settings"
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    sys.path.insert(0, str(ROOT))

    import django

    django.setup()
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.management import call_command
    from django.core.wsgi import get_wsgi_application
    from playwright.sync_api import sync_playwright

    call_command("migrate", verbosity=0)
    thread_pk = seed()

    class QuietHandler(WSGIRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            pass

    server = make_server(
        "127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()), handler_class=QuietHandler
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(base + "/accounts/login/")
            page.get_by_label("Username").fill("alice")
            page.get_by_label("Password").fill("correct-horse-battery")
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(base + "/")
            page.screenshot(path=str(args.output))
            print(f"wrote {args.output}")
            if args.thread_page:
                page.goto(f"{base}/threads/{thread_pk}/")
                page.screenshot(path=str(args.thread_page), full_page=True)
                print(f"wrote {args.thread_page}")
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
