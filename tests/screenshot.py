"""Take the README screenshots from the real demo: what `make demo` shows a new user.

    .venv/bin/python tests/screenshot.py [--output-dir replays/static/replays]

Builds the demo in a throwaway folder (a fresh database, the bundled sample transcripts,
the sample repository cloned, the sample thread replayed with the calibration baselines
and judged by the sample's own tests: `manage.py setup_demo`), serves it on loopback and
photographs the thread list, the finished batch, its comparison page and the
leaderboard at 1280x800 in Debian's Chromium. Never touches var/.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import threading
from pathlib import Path
from wsgiref.simple_server import WSGIRequestHandler, make_server

ROOT = Path(__file__).resolve().parent.parent
OUTPUT_DIR = ROOT / "replays" / "static" / "replays"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "screenshot-password"


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def build_demo() -> tuple[int, int]:
    """The demo, as `make demo` makes it; (the batch's id, its empty run's id)."""
    from django.contrib.auth.models import User
    from django.core.management import call_command

    from replays.models import Batch

    call_command("migrate", verbosity=0)
    call_command("setup_demo", stdout=io.StringIO(), stderr=sys.stderr)
    user = User.objects.get(username="demo")
    user.set_password(PASSWORD)
    user.save()
    batch = Batch.objects.get()
    return batch.pk, batch.runs.get(model="empty").pk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="replays-screenshot-"))
    os.environ.update(
        REPLAYS_VAR_DIR=str(workdir),
        REPLAYS_RUN_ROOT=str(workdir / "runs"),
        DJANGO_SETTINGS_MODULE="replaysite.settings",
        DJANGO_ALLOW_ASYNC_UNSAFE="true",
    )
    os.environ.pop("DATABASE_URL", None)
    os.environ.pop("REPLAYS_AGENTS_FILE", None)
    sys.path.insert(0, str(ROOT))

    import django

    django.setup()
    from django.contrib.staticfiles.handlers import StaticFilesHandler
    from django.core.wsgi import get_wsgi_application
    from playwright.sync_api import sync_playwright

    batch_id, run_id = build_demo()
    server = make_server(
        "127.0.0.1", 0, StaticFilesHandler(get_wsgi_application()), handler_class=QuietHandler
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_port}"
    shots = {
        "screenshot.png": "/",
        "batch.png": f"/batches/{batch_id}/",
        "compare.png": f"/runs/{run_id}/compare/",
        "leaderboard.png": "/leaderboard/",
    }
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(base + "/accounts/login/")
            page.get_by_label("Username").fill("demo")
            page.get_by_label("Password").fill(PASSWORD)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(base + "/")
            for name, path in shots.items():
                page.goto(base + path)
                page.wait_for_load_state("networkidle")
                target = args.output_dir / name
                page.screenshot(path=str(target))
                print(f"wrote {target}")
            browser.close()
    finally:
        server.shutdown()


if __name__ == "__main__":
    main()
