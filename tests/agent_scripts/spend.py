"""A command agent that reports spending COST dollars at once (its usage file), edits a
file, then works on for SECONDS before it exits 0: what a campaign's budget must stop.

Usage: spend.py COST SECONDS
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

cost, seconds = sys.argv[1], float(sys.argv[2])
Path(os.environ["REPLAYS_USAGE_FILE"]).write_text(
    json.dumps({"input_tokens": 1000, "output_tokens": 100, "cost_usd": cost})
)
(Path.cwd() / "SPENT.txt").write_text(f"{cost}\n")
print(f"Spent ${cost}; working on for {seconds:g} s.", flush=True)
time.sleep(seconds)
