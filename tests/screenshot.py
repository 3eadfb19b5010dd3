"""Take the README screenshots from the real demo: what `make demo` shows a new user.

    .venv/bin/python tests/screenshot.py [--output-dir replays/static/replays]

Copies the checkout to a throwaway folder (tests/demo_layout.py: a fresh clone's layout,
var/ inside it), runs `make demo PORT=...` there exactly as the README says, logs in
with the password it prints, and photographs the thread list, the finished batch, its
comparison page, the leaderboard and the campaign pages at 1280x800 in Debian's Chromium. Never touches this
checkout's var/.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.demo_layout import running_demo  # noqa: E402

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
# The demo's first batch: its runs are historical (1) and empty (2). The new-campaign form
# previews the demo's own history; campaign 1 is the demo's campaign, when it has one.
SHOTS = {
    "screenshot.png": "/",
    "batch.png": "/batches/1/",
    "compare.png": "/runs/2/compare/",
    "leaderboard.png": "/leaderboard/",
    "campaign-new.png": "/campaigns/new/",
    "campaign.png": "/campaigns/1/",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output-dir", type=Path, default=OUTPUT_DIR)
    args = parser.parse_args()

    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory(prefix="replays-screenshot-") as folder:
        with running_demo(Path(folder)) as demo, sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS
            )
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(demo.url + "/accounts/login/")
            page.get_by_label("Username").fill(demo.username)
            page.get_by_label("Password").fill(demo.password)
            page.get_by_role("button", name="Log in").click()
            page.wait_for_url(demo.url + "/")
            for name, path in SHOTS.items():
                page.goto(demo.url + path)
                page.wait_for_load_state("networkidle")
                target = args.output_dir / name
                page.screenshot(path=str(target))
                print(f"wrote {target}")
            browser.close()


if __name__ == "__main__":
    main()
