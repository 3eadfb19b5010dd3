"""Model prices as data, and the cost arithmetic on top of them.

Prices are dollars per million tokens, kept in a JSON file with the source they
came from and the date they were taken (``replays/data/prices.json``, built
from LiteLLM's model price file). A user can replace them from a newer LiteLLM
file; the result is saved as an override (the intended caller passes
``$REPLAYS_VAR_DIR/prices.json``) that ``load_price_table`` prefers.

Costs are exact Decimals; rounding happens only for display (``round_usd``).
A model missing from the table has an unknown cost (None), never $0. No price
is above MAX_PRICE_PER_MILLION_USD, so with the transcripts' token bounds every
cost fits the money fields (see replays.transcripts.base).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any

from replays.transcripts.base import MAX_PRICE_PER_MILLION_USD, TokenUsage

BUNDLED_PRICES = Path(__file__).resolve().parent / "data" / "prices.json"
PER_MILLION = Decimal(1_000_000)
MAX_PRICE = Decimal(MAX_PRICE_PER_MILLION_USD)
USD_PLACES = Decimal("0.000001")

# Anthropic's rule for cache writes, used where a source gives no price:
# a 5-minute write costs 1.25x input, a 1-hour write 2x input.
CACHE_WRITE_5M_FACTOR = Decimal("1.25")
CACHE_WRITE_1H_FACTOR = Decimal("2")

# LiteLLM's per-token fields, in our per-million names.
_LITELLM_FIELDS = {
    "input": "input_cost_per_token",
    "output": "output_cost_per_token",
    "cache_read": "cache_read_input_token_cost",
    "cache_write_5m": "cache_creation_input_token_cost",
    "cache_write_1h": "cache_creation_input_token_cost_above_1hr",
}
_PRICE_FIELDS = tuple(_LITELLM_FIELDS)

# Ids as written by other providers: "bedrock/us.anthropic.claude-x-v1:0",
# "vertex_ai/claude-x@20250929", "openai/gpt-5".
_REGION_VENDOR_RE = re.compile(r"^(?:[a-z]{2,6}\.)?(?:anthropic|openai)\.")
_VERSION_SUFFIX_RE = re.compile(r"(?:-v\d+(?::\d+)?|\[[^\]]*\])$")
_DATE_SUFFIX_RE = re.compile(r"(?:[-@]\d{8}|-\d{4}-\d{2}-\d{2})$")


@dataclass(frozen=True)
class ModelPrice:
    """Dollars per million tokens of each kind."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal

    def cost_usd(self, usage: TokenUsage) -> Decimal:
        return (
            Decimal(usage.input_tokens) * self.input
            + Decimal(usage.output_tokens) * self.output
            + Decimal(usage.cache_read_tokens) * self.cache_read
            + Decimal(usage.cache_write_5m_tokens) * self.cache_write_5m
            + Decimal(usage.cache_write_1h_tokens) * self.cache_write_1h
        ) / PER_MILLION

    def as_dict(self) -> dict[str, str]:
        return {name: _decimal_text(getattr(self, name)) for name in _PRICE_FIELDS}


@dataclass(frozen=True)
class PriceTable:
    source: str
    date: str  # ISO date the prices were taken
    prices: dict[str, ModelPrice] = field(default_factory=dict)
    note: str = ""

    def lookup(self, model: str) -> ModelPrice | None:
        """The price of ``model``, trying its exact id first, then looser spellings.

        Order: exact; without a provider prefix ("anthropic/", "bedrock/us.anthropic.",
        "-v1:0"); without a date suffix ("-20250929", "-2025-08-07"); then each of
        those case-insensitively.
        """
        candidates = _spellings(model)
        for candidate in candidates:
            if candidate in self.prices:
                return self.prices[candidate]
        lowered = self._lowercase_index
        for candidate in candidates:
            found = lowered.get(candidate.lower())
            if found is not None:
                return self.prices[found]
        return None

    @cached_property
    def _lowercase_index(self) -> dict[str, str]:
        # Built on first need: lookups that match exactly (nearly all) never need it.
        index: dict[str, str] = {}
        for name in sorted(self.prices):
            index.setdefault(name.lower(), name)
        return index


def _spellings(model: str) -> list[str]:
    model = model.strip()
    spellings = [model]
    bare = model.rsplit("/", 1)[-1]
    bare = _REGION_VENDOR_RE.sub("", bare)
    bare = _VERSION_SUFFIX_RE.sub("", bare)
    spellings.append(bare)
    spellings.append(_DATE_SUFFIX_RE.sub("", bare))
    return list(dict.fromkeys(s for s in spellings if s))


def cost_usd(model: str, usage: TokenUsage, table: PriceTable | None = None) -> Decimal | None:
    """Exact cost of ``usage`` on ``model``; None when the model's price is unknown."""
    price = (table or load_price_table()).lookup(model)
    if price is None:
        return None
    return price.cost_usd(usage)


def turn_cost_usd(
    usage_by_model: Mapping[str, TokenUsage], table: PriceTable | None = None
) -> Decimal | None:
    """Cost of a turn's usage across models; None when any model that used tokens is unknown.

    A partial sum would understate the cost while looking complete, so one
    unknown model makes the whole figure unknown.
    """
    table = table or load_price_table()
    total = Decimal(0)
    for model, usage in usage_by_model.items():
        if usage.total == 0:
            continue
        cost = cost_usd(model, usage, table)
        if cost is None:
            return None
        total += cost
    return total


def round_usd(amount: Decimal) -> Decimal:
    """Round to whole micro-dollars, for display and storage only (never mid-arithmetic)."""
    return amount.quantize(USD_PLACES, rounding=ROUND_HALF_UP)


# --- reading and writing tables -------------------------------------------------


def load_price_table(path: Path | None = None) -> PriceTable:
    """The price table in ``path`` if that file exists, else the bundled one.

    ``path`` is the user's override file; settings are not imported at this
    layer, so the caller passes it (``$REPLAYS_VAR_DIR/prices.json``). A
    missing override is normal; a broken one raises ValueError rather than
    silently falling back to other prices.
    """
    chosen = path if path is not None and path.exists() else BUNDLED_PRICES
    resolved = chosen.resolve()
    stat = resolved.stat()
    # Keyed on mtime and size too, so an override saved later is read again.
    return _load_cached(resolved, stat.st_mtime_ns, stat.st_size)


@lru_cache(maxsize=8)
def _load_cached(path: Path, mtime_ns: int, size: int) -> PriceTable:
    # mtime_ns and size are only part of the cache key.
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"price table {path.name} cannot be read: {exc}") from exc
    return price_table_from_dict(data, name=path.name)


# Callers that just wrote a table may clear the cache explicitly (the
# update_prices command does); the mtime in the key makes it optional.
load_price_table.cache_clear = _load_cached.cache_clear  # type: ignore[attr-defined]


def price_table_from_dict(data: object, *, name: str = "price table") -> PriceTable:
    """Our own format: {source, date, note?, prices: {model: {input, output, ...}}}."""
    if not isinstance(data, dict) or not isinstance(data.get("prices"), dict):
        raise ValueError(f"{name} is not a price table: it needs a 'prices' object")
    source, date = data.get("source"), data.get("date")
    if not isinstance(source, str) or not isinstance(date, str):
        raise ValueError(f"{name} is not a price table: it needs 'source' and 'date' strings")
    prices: dict[str, ModelPrice] = {}
    for model, entry in data["prices"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"{name}: the price of {model} is not an object")
        try:
            values = {key: _decimal(entry.get(key)) for key in _PRICE_FIELDS}
        except ValueError as exc:
            raise ValueError(f"{name}: the price of {model} has {exc}") from None
        if values["input"] is None or values["output"] is None:
            raise ValueError(f"{name}: the price of {model} needs input and output")
        try:
            prices[model] = _complete(values)
        except ValueError as exc:
            raise ValueError(f"{name}: the price of {model} has {exc}") from None
    note = data.get("note")
    return PriceTable(
        source=source, date=date, prices=prices, note=note if isinstance(note, str) else ""
    )


def price_table_from_litellm(
    data: object,
    *,
    source: str,
    date: str | None = None,
    prefixes: tuple[str, ...] | None = None,
) -> PriceTable:
    """A PriceTable from LiteLLM's ``model_prices_and_context_window.json``.

    Entries without an input and an output price (images, embeddings, the
    ``sample_spec`` template) are skipped; ``alias_of`` entries take their
    target's price. ``prefixes`` keeps only model ids starting with one of
    them. Raises ValueError when ``data`` is not shaped like that file.
    """
    if not isinstance(data, dict):
        raise ValueError("not a LiteLLM price file: expected a JSON object of models")
    prices: dict[str, ModelPrice] = {}
    aliases: dict[str, str] = {}
    for model, entry in data.items():
        if not isinstance(model, str) or not isinstance(entry, dict) or model == "sample_spec":
            continue
        if prefixes is not None and not model.startswith(prefixes):
            continue
        if isinstance(entry.get("alias_of"), str):
            aliases[model] = entry["alias_of"]
            continue
        values = {name: _litellm_cost(entry.get(key)) for name, key in _LITELLM_FIELDS.items()}
        if values["input"] is None or values["output"] is None:
            continue
        try:
            prices[model] = _complete(values)
        except ValueError:
            continue  # dearer than any real model: a broken entry
    if not prices:
        raise ValueError(
            "not a LiteLLM price file: no entry has input_cost_per_token and output_cost_per_token"
        )
    for alias, target in aliases.items():
        target_entry = data.get(target)
        if target in prices:
            prices[alias] = prices[target]
        elif isinstance(target_entry, dict):
            values = {
                name: _litellm_cost(target_entry.get(key)) for name, key in _LITELLM_FIELDS.items()
            }
            if values["input"] is not None and values["output"] is not None:
                try:
                    prices[alias] = _complete(values)
                except ValueError:
                    continue
    return PriceTable(
        source=source,
        date=date or datetime.now(UTC).date().isoformat(),
        prices=dict(sorted(prices.items())),
    )


def save_price_table(table: PriceTable, path: Path) -> None:
    """Write ``table`` in our format, atomically (a reader never sees half a file)."""
    data: dict[str, Any] = {
        "source": table.source,
        "date": table.date,
        "unit": "USD per million tokens",
    }
    if table.note:
        data["note"] = table.note
    data["prices"] = {model: price.as_dict() for model, price in sorted(table.prices.items())}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    partial.replace(path)
    _load_cached.cache_clear()


# --- helpers -------------------------------------------------------------------


def _complete(values: dict[str, Decimal | None]) -> ModelPrice:
    """Fill the prices a source left out; input and output must be present. ValueError
    when a price, given or filled in, is above MAX_PRICE (the bound costs rely on)."""
    input_price = values["input"]
    output_price = values["output"]
    assert input_price is not None and output_price is not None
    price = ModelPrice(
        input=input_price,
        output=output_price,
        # No cache discount known: charge cached reads as input rather than guess lower.
        cache_read=values["cache_read"] if values["cache_read"] is not None else input_price,
        cache_write_5m=(
            values["cache_write_5m"]
            if values["cache_write_5m"] is not None
            else _tidy(input_price * CACHE_WRITE_5M_FACTOR)
        ),
        cache_write_1h=(
            values["cache_write_1h"]
            if values["cache_write_1h"] is not None
            else _tidy(input_price * CACHE_WRITE_1H_FACTOR)
        ),
    )
    dearest = max(getattr(price, name) for name in _PRICE_FIELDS)
    if dearest > MAX_PRICE:
        raise ValueError(f"a price of {dearest} dollars per million tokens, above {MAX_PRICE}")
    return price


def _litellm_cost(value: object) -> Decimal | None:
    """LiteLLM's dollars per token -> dollars per million; None when absent or not a price."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    # repr() gives the shortest text that round-trips the float (3e-06, not
    # 2.9999...e-06), so the per-million figure comes out exact.
    return _tidy(Decimal(repr(value)) * PER_MILLION)


def non_negative_decimal(name: str, value: object) -> Decimal:
    """A money figure from JSON (number or numeric string); ValueError naming `name` otherwise.

    A float goes through repr(), the shortest text that round-trips it, so 3e-06 stays exact."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{name} must be a number, not {value!r}")
    try:
        number = Decimal(repr(value)) if isinstance(value, float) else Decimal(value)
    except InvalidOperation:
        raise ValueError(f"{name} must be a number, not {value!r}") from None
    if not number.is_finite() or number < 0:
        raise ValueError(f"{name} must be a non-negative number, not {value!r}")
    return number


def _decimal(value: object) -> Decimal | None:
    return None if value is None else _tidy(non_negative_decimal("a price", value))


def _tidy(number: Decimal) -> Decimal:
    # 3.000000 -> 3, without turning 10 into 1E+1.
    normal = number.normalize()
    return normal.quantize(Decimal(1)) if normal == normal.to_integral_value() else normal


def _decimal_text(number: Decimal) -> str:
    return format(number, "f")
