"""A command agent for the multi-machine and fault tests: marks its start, sleeps, edits.

Usage: mark_and_sleep.py MODEL, where MODEL is "s<milliseconds>" (s1500 sleeps 1.5 s).
Appends "<REPLAYS_RUN_ID> <pid>" to $MARKER_FILE as its first act, so a member whose
agent started twice shows two lines; then sleeps, adds CHANGES.md and exits 0.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

with open(os.environ["MARKER_FILE"], "a", encoding="utf-8") as marker:
    marker.write(f"{os.environ.get('REPLAYS_RUN_ID', '')} {os.getpid()}\n")
time.sleep(int(sys.argv[1].lstrip("s")) / 1000)
Path("CHANGES.md").write_text("Done after a nap.\n")
print("Slept and wrote CHANGES.md.", flush=True)
