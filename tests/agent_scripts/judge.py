"""A scripted evaluator for the `command` kind's judge mode (tests only).

Reads the task file, writes an answer, reports usage, and logs the call. JUDGE_MODE:
- "prefer-changes": checks from the request; a verdict prefers the attempt with a diff
  (the same in both orders: consistent);
- "always-a": always prefers attempt A (a position-biased judge: inconsistent);
- "garbage": writes an answer that is not JSON;
- "slow": like prefer-changes after sleeping JUDGE_SLEEP seconds.
JUDGE_COST, when set, is the cost its usage file reports (0.0125 by default).
JUDGE_CALLS, when set, gets one line per call: the task name and the process id.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> int:
    task_file, answer_file = sys.argv[1], sys.argv[2]
    task = json.loads(open(task_file, encoding="utf-8").read())
    mode = os.environ.get("JUDGE_MODE", "prefer-changes")
    calls = os.environ.get("JUDGE_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as log:
            log.write(f"{task['task']} {os.getpid()}\n")
    if mode == "slow":
        time.sleep(float(os.environ.get("JUDGE_SLEEP", "30")))
    with open(os.environ["REPLAYS_USAGE_FILE"], "w", encoding="utf-8") as usage:
        cost = float(os.environ.get("JUDGE_COST", "0.0125"))
        json.dump({"input_tokens": 1000, "output_tokens": 100, "cost_usd": cost}, usage)
    if mode == "garbage":
        with open(answer_file, "w", encoding="utf-8") as answer:
            answer.write("I think A is better, probably.")
        return 0
    if task["task"] == "checks":
        answer = {"checks": [{"text": "The request is done"}, {"text": "Nothing else breaks"}]}
    else:
        inputs = task["inputs"]
        has_a = bool(inputs["a"]["diff"].strip()) and inputs["a"]["diff"] != "(no changes)"
        has_b = bool(inputs["b"]["diff"].strip()) and inputs["b"]["diff"] != "(no changes)"
        if mode == "always-a":
            preferred = "A"
        elif has_a == has_b:
            preferred = "tie"
        else:
            preferred = "A" if has_a else "B"
        answer = {
            "checks": [
                {"id": check["id"], "a": has_a, "b": has_b, "reason": "looked at the diff"}
                for check in inputs["checks"]
            ],
            "score_a": 0.9 if has_a else 0.1,
            "score_b": 0.9 if has_b else 0.1,
            "preferred": preferred,
            "reason": "The attempt with changes does what was asked.",
        }
    with open(answer_file, "w", encoding="utf-8") as out:
        json.dump(answer, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
