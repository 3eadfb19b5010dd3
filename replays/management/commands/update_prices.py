from __future__ import annotations

import json
from datetime import date
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import CommandError, CommandParser

from replays import importing, pricing
from replays.management.base import ReplaysCommand


class Command(ReplaysCommand):
    help = (
        "Replace the price table with the chat models of a LiteLLM-format JSON file "
        "(model_prices_and_context_window.json), then re-price every imported turn."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", type=Path, help="A LiteLLM-format price file.")
        parser.add_argument(
            "--bundled",
            metavar="LITELLM_VERSION",
            help="For developers: write the table Replays ships (replays/data/prices.json), "
            "from the file in the litellm wheel of this version, instead of the override; "
            "nothing is re-priced.",
        )

    def handle(self, *args: Any, file: Path, bundled: str | None, **options: Any) -> None:
        try:
            data = json.loads(file.read_text(encoding="utf-8"))
        except OSError as exc:
            raise CommandError(f"{file}: cannot read ({exc.strerror}).") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise CommandError(f"{file}: not valid JSON ({exc}).") from None
        if bundled:
            source = f"LiteLLM model_prices_and_context_window.json (litellm {bundled})"
            note = pricing.BUNDLED_NOTE.format(version=bundled, file=file.name)
        else:
            source = f"{file.name} (LiteLLM format), loaded {date.today().isoformat()}"
            note = ""
        try:
            table = pricing.price_table_from_litellm(data, source=source, note=note)
        except ValueError as exc:
            raise CommandError(f"{file}: {exc}") from None
        if not table.prices:
            raise CommandError(f"{file}: no model in it has both an input and an output price.")
        if bundled:
            pricing.save_price_table(table, pricing.BUNDLED_PRICES)
            self.stdout.write(
                f"Saved {len(table.prices)} model prices to {pricing.BUNDLED_PRICES}."
            )
            return
        pricing.save_price_table(table, settings.REPLAYS_PRICES_FILE)
        pricing.load_price_table.cache_clear()
        changed = importing.recompute_costs()
        self.stdout.write(
            f"Saved {len(table.prices)} model prices to {settings.REPLAYS_PRICES_FILE}; "
            f"re-priced {changed} threads."
        )
