"""A command agent that edits the workspace, reports usage and exits 0.

Usage: edit_files.py --model MODEL --request-file PATH [--cost USD] [--bad-usage]
Appends one line per start to $MARKER_FILE: "<REPLAYS_RUN_ID> <model> <cwd>".
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

parser = argparse.ArgumentParser()
parser.add_argument("--model", required=True)
parser.add_argument("--request-file", required=True)
parser.add_argument("--cost")
parser.add_argument("--bad-usage", action="store_true")
args = parser.parse_args()

with open(os.environ["MARKER_FILE"], "a", encoding="utf-8") as marker:
    marker.write(f"{os.environ.get('REPLAYS_RUN_ID', '')} {args.model} {os.getcwd()}\n")

request = Path(args.request_file).read_text(encoding="utf-8")
print(f"Read a request of {len(request)} characters.", flush=True)

workspace = Path.cwd()
(workspace / "app.py").write_text('def greet(name):\n    return "Hi " + name\n')
(workspace / "CHANGES.md").write_text("Greeting shortened.\n")
(workspace / "obsolete.txt").unlink(missing_ok=True)
print("Edited app.py, added CHANGES.md, removed obsolete.txt.", flush=True)

usage_file = Path(os.environ["REPLAYS_USAGE_FILE"])
if args.bad_usage:
    usage_file.write_text("{not json")
else:
    usage = {
        "input_tokens": 1000,
        "output_tokens": 200,
        "cache_read_tokens": 500,
        "model_seconds": 1.5,
        "model": args.model,
    }
    if args.cost:
        usage["cost_usd"] = args.cost
    usage_file.write_text(json.dumps(usage))
