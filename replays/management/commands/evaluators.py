from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandParser

from replays.evaluation import evaluators, results
from replays.management.base import ReplaysCommand


class Command(ReplaysCommand):
    help = (
        "List the evaluators (tests first, then every agent model, with why one cannot "
        "judge here) and each evaluator's consistency rate: the share of its both-order "
        "judgments whose two orders agreed, with a 95% interval."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="Print JSON instead of text.")

    def handle(self, *args: Any, **options: Any) -> None:
        found = evaluators.discover_evaluators()
        rates = results.consistency_rates()
        if options["json"]:
            body = {
                "evaluators": [
                    {"id": e.id, "label": e.label, "kind": e.kind, "available": e.available,
                     "reason": e.reason}
                    for e in found
                ],
                "consistency": rates,
            }  # fmt: skip
            self.stdout.write(json.dumps(body, indent=2))
            return
        for info in found:
            state = "available" if info.available else f"unavailable: {info.reason}"
            self.stdout.write(f"{info.id:<40} {info.kind:<12} {state}")
        self.stdout.write("")
        if not rates:
            self.stdout.write("Consistency: no both-order judgments stored yet.")
            return
        self.stdout.write("Consistency of both-order judgments (the two orders agreed):")
        for row in rates:
            self.stdout.write(
                f"  {row['evaluator']:<40} prompt {row['prompt_version']:<4} "
                f"{row['agreed']:>4} of {row['n']:<4} {row['rate']:>6.0%} "
                f"(95% interval {row['rate_low']:.0%} to {row['rate_high']:.0%})"
            )
