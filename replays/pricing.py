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

Long-context tiers: a model may charge more for a request whose own input passes a size
(LiteLLM's ``*_above_200k_tokens``, ``*_above_272k_tokens``...: the whole request at the
dearer prices). The parsers keep the usage of such requests apart (LongContextUsage), so
each request is priced by its own input.

Model ids are matched as ccusage matches them: exactly; an OpenRouter ``:free`` id (and an
OpenCode Zen ``-free`` one, which ccusage prices) costs nothing; then without a provider
prefix or a dated or versioned suffix; then the entry of the same model under any provider
("glm-5.1" -> "zai/glm-5.1"), or of the model the id extends ("claude-opus-4-6-thinking"
-> "claude-opus-4-6", but never "claude-opus-4-6" -> "claude-opus-4"). ``PriceTable.match`` says which entry priced a model.
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

from replays.transcripts.base import (
    LONG_CONTEXT_THRESHOLDS,
    MAX_PRICE_PER_MILLION_USD,
    LongContextUsage,
    TokenUsage,
)

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
# What the bundled table says of itself (update_prices --bundled writes it).
BUNDLED_NOTE = (
    "The chat models (mode chat, responses or none) of the LiteLLM file bundled in the litellm "
    "{version} wheel ({file}), per-token prices times 1,000,000, with their long-context prices "
    "(*_above_<N>k_tokens and tiered_pricing bands, at sizes of 32k, 100k, 128k, 200k, 256k, "
    "272k and 512k tokens); alias_of entries take their target's price. Claude models listed "
    "only as Bedrock ids (anthropic.claude-x-YYYYMMDD-v1:0) are also under claude-x-YYYYMMDD, "
    "and every dated Claude id also undated, at the same prices. Missing prices: cache_read = "
    "input, cache_write_5m = 1.25x input, cache_write_1h = 2x input; in a tier, output as the "
    "base's, cache prices scaled like input."
)
# A long-context price: "<field>_above_<N>k_tokens" (N thousand tokens).
_LITELLM_TIER_RE = re.compile(
    r"^(" + "|".join(re.escape(key) for key in _LITELLM_FIELDS.values()) + r")_above_(\d+)k_tokens$"
)
_FIELD_NAMES = {key: name for name, key in _LITELLM_FIELDS.items()}
# LiteLLM's modes that are not chat models (their token prices, when any, are for
# embeddings, images, audio...); an entry without a mode is kept.
_CHAT_MODES = frozenset({"chat", "responses"})

# Ids as written by other providers: "bedrock/us.anthropic.claude-x-v1:0",
# "vertex_ai/claude-x@20250929", "openai/gpt-5".
_REGION_VENDOR_RE = re.compile(r"^(?:[a-z]{2,6}\.)?(?:anthropic|openai)\.")
_VERSION_SUFFIX_RE = re.compile(r"(?:-v\d+(?::\d+)?|\[[^\]]*\])$")
_DATE_SUFFIX_RE = re.compile(r"(?:[-@]\d{8}|-\d{4}-\d{2}-\d{2})$")
# OpenRouter's free variant of a model ("vendor/model:free"): it costs nothing.
FREE_SUFFIX = ":free"
# OpenCode Zen's and Go's free models end so ("deepseek-v4-flash-free"; LiteLLM prices its
# opencode_go/*-free entries at $0): they cost nothing either.
FREE_DASH_SUFFIX = "-free"
FREE_ENTRY = ":free"  # the entry a free variant is priced by
# priced_as of a model whose cost the tool recorded itself (OpenCode, pi): not the table's.
RECORDED_ENTRY = ":recorded"
# Bedrock's version of an id ("-v1:0") and a bracketed variant ("[1m]"): not the model's name.
_ID_VERSION_RE = re.compile(r"(?:-v\d+:\d+|\[[^\]]*\])$")
# What follows a model's name that makes another model, not a spelling of the same one: a
# version number ("claude-opus-4" + "-6"), unless it is a date of 8 digits.
_OTHER_VERSION_RE = re.compile(r"^[-.](\d+)(?![0-9a-z])")


@dataclass(frozen=True)
class PriceTier:
    """The prices of a request whose own input is above ``above_tokens`` (one of
    LONG_CONTEXT_THRESHOLDS), dollars per million tokens of each kind."""

    above_tokens: int
    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal

    def __post_init__(self) -> None:
        if self.above_tokens not in LONG_CONTEXT_THRESHOLDS:
            raise ValueError(
                f"a long-context price above {self.above_tokens} tokens, not one of the sizes "
                f"transcripts are read for ({', '.join(map(str, LONG_CONTEXT_THRESHOLDS))})"
            )

    def as_dict(self) -> dict[str, Any]:
        return {
            "above_tokens": self.above_tokens,
            **{name: _decimal_text(getattr(self, name)) for name in _PRICE_FIELDS},
        }


@dataclass(frozen=True)
class ModelPrice:
    """Dollars per million tokens of each kind, and the dearer prices of long requests."""

    input: Decimal
    output: Decimal
    cache_read: Decimal
    cache_write_5m: Decimal
    cache_write_1h: Decimal
    tiers: tuple[PriceTier, ...] = ()  # by above_tokens, smallest first

    def cost_usd(
        self, usage: TokenUsage, long_context: Mapping[int, TokenUsage] | None = None
    ) -> Decimal:
        """The cost of ``usage``, the usage of some requests; ``long_context`` is the part of
        it from requests whose input passed each size (LongContextUsage of one model), which
        the tiers price. Without it every request is priced as a short one."""
        if not self.tiers or not long_context:
            return _priced(self, usage)
        total = Decimal(0)
        rest = usage  # the requests no tier above has taken yet
        for tier in reversed(self.tiers):
            above = long_context.get(tier.above_tokens)
            if above is None:
                continue
            band = above - (usage - rest)  # past this tier's size, below the dearer ones
            total += _priced(tier, band)
            rest = usage - above
        return total + _priced(self, rest)

    def request_cost_usd(self, usage: TokenUsage) -> Decimal:
        """The cost of one request, at the tier its own input size falls in."""
        tier = self.tier_for(usage.input_size)
        return _priced(tier if tier is not None else self, usage)

    def tier_for(self, input_size: int) -> PriceTier | None:
        chosen = None
        for tier in self.tiers:
            if input_size > tier.above_tokens:
                chosen = tier
        return chosen

    def as_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {name: _decimal_text(getattr(self, name)) for name in _PRICE_FIELDS}
        if self.tiers:
            data["tiers"] = [tier.as_dict() for tier in self.tiers]
        return data


def _priced(price: ModelPrice | PriceTier, usage: TokenUsage) -> Decimal:
    return (
        Decimal(usage.input_tokens) * price.input
        + Decimal(usage.output_tokens) * price.output
        + Decimal(usage.cache_read_tokens) * price.cache_read
        + Decimal(usage.cache_write_5m_tokens) * price.cache_write_5m
        + Decimal(usage.cache_write_1h_tokens) * price.cache_write_1h
    ) / PER_MILLION


FREE_PRICE = ModelPrice(Decimal(0), Decimal(0), Decimal(0), Decimal(0), Decimal(0))


@dataclass(frozen=True)
class PriceMatch:
    """The price a model id was matched to, and the table's entry that gave it (FREE_ENTRY
    for a free variant)."""

    entry: str
    price: ModelPrice


@dataclass(frozen=True)
class PriceTable:
    source: str
    date: str  # ISO date the prices were taken
    prices: dict[str, ModelPrice] = field(default_factory=dict)
    note: str = ""

    def lookup(self, model: str) -> ModelPrice | None:
        """The price of ``model`` (see ``match``), None when no entry matches."""
        found = self.match(model)
        return found.price if found is not None else None

    def match(self, model: str) -> PriceMatch | None:
        """The entry that prices ``model``, None when none does (the cost is then unknown).

        Order: the exact id; a ``:free`` or ``-free`` id costs nothing; without a provider prefix
        ("anthropic/", "bedrock/us.anthropic.", "-v1:0"), then without a date suffix
        ("-20250929", "-2025-08-07"), each exactly then case-insensitively; then the same
        model under any provider, or the model the id extends (see _family_match).
        """
        cache = self._matches
        if model not in cache:
            cache[model] = self._match(model)
        return cache[model]

    def _match(self, model: str) -> PriceMatch | None:
        if model in self.prices:
            return PriceMatch(model, self.prices[model])
        if model.strip().lower().endswith((FREE_SUFFIX, FREE_DASH_SUFFIX)):
            return PriceMatch(FREE_ENTRY, FREE_PRICE)
        candidates = _spellings(model)
        for candidate in candidates:
            if candidate in self.prices:
                return PriceMatch(candidate, self.prices[candidate])
        lowered = self._lowercase_index
        for candidate in candidates:
            found = lowered.get(candidate.lower())
            if found is not None:
                return PriceMatch(found, self.prices[found])
        found = self._family_match(model)
        return PriceMatch(found, self.prices[found]) if found is not None else None

    def _family_match(self, model: str) -> str | None:
        """The entry for the same model under another name, as ccusage finds it.

        Names are compared as their model part (after the last "/", without a Bedrock
        region, lower case, "." and "@" read as "-"). An entry matches when its name is
        the id's, or the beginning of the id up to a "-" that starts no version number
        ("claude-opus-4-6" for "claude-opus-4-6-thinking" or "...-20251101", never
        "claude-opus-4" for "claude-opus-4-6"). The longest name wins (the most precise
        model); between providers of the same one, the vendor's own entry (no "/"), then
        the shortest id ("zai/glm-5.1" before "dashscope/glm-5.1"), then the first in
        alphabetical order. A name of one word ("claude") is matched only whole.
        """
        name = _model_part(model)
        index = self._family_index
        position = len(name)
        while position > 0:
            prefix = name[:position]
            entries = index.get(prefix)
            if entries and (
                position == len(name)
                or ("-" in prefix and _same_model_after(prefix, name[position:]))
            ):
                return entries[0]
            position = name.rfind("-", 0, position)
        return None

    @cached_property
    def _matches(self) -> dict[str, PriceMatch | None]:
        return {}

    @cached_property
    def _lowercase_index(self) -> dict[str, str]:
        # Built on first need: lookups that match exactly (nearly all) never need it.
        index: dict[str, str] = {}
        for name in sorted(self.prices):
            index.setdefault(name.lower(), name)
        return index

    @cached_property
    def _family_index(self) -> dict[str, list[str]]:
        index: dict[str, list[str]] = {}
        for name in self.prices:
            index.setdefault(_model_part(name), []).append(name)
        for entries in index.values():
            entries.sort(key=lambda entry: ("/" in entry, len(entry), entry))
        return index


def _model_part(model: str) -> str:
    """A model id as _family_match compares it."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    name = _REGION_VENDOR_RE.sub("", name)
    name = _ID_VERSION_RE.sub("", name)
    return name.replace(".", "-").replace("@", "-")


def _same_model_after(prefix: str, rest: str) -> bool:
    """Whether ``rest`` after the model ``prefix`` still names that model (a variant, a
    date), not another version of it."""
    if not prefix[-1].isdigit():
        return True
    version = _OTHER_VERSION_RE.match(rest)
    return version is None or len(version.group(1)) == 8


def _spellings(model: str) -> list[str]:
    model = model.strip()
    spellings = [model]
    bare = model.rsplit("/", 1)[-1]
    bare = _REGION_VENDOR_RE.sub("", bare)
    bare = _VERSION_SUFFIX_RE.sub("", bare)
    spellings.append(bare)
    spellings.append(_DATE_SUFFIX_RE.sub("", bare))
    return list(dict.fromkeys(s for s in spellings if s))


def cost_usd(
    model: str,
    usage: TokenUsage,
    table: PriceTable | None = None,
    long_context: Mapping[int, TokenUsage] | None = None,
) -> Decimal | None:
    """Exact cost of ``usage`` on ``model``; None when the model's price is unknown.
    ``long_context``: see ModelPrice.cost_usd."""
    price = (table or load_price_table()).lookup(model)
    if price is None:
        return None
    return price.cost_usd(usage, long_context)


def turn_cost_usd(
    usage_by_model: Mapping[str, TokenUsage],
    table: PriceTable | None = None,
    long_context: LongContextUsage | None = None,
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
        by_size = long_context.get(model) if long_context else None
        cost = cost_usd(model, usage, table, by_size)
        if cost is None:
            return None
        total += cost
    return total


def priced_as(usage_by_model: Mapping[str, TokenUsage], table: PriceTable) -> dict[str, str | None]:
    """The entry that priced each model that used tokens (None: no entry, unknown price)."""
    entries: dict[str, str | None] = {}
    for model, usage in usage_by_model.items():
        if usage.total:
            found = table.match(model)
            entries[model] = found.entry if found is not None else None
    return entries


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
            prices[model] = _complete(values, _tiers_from_dict(entry.get("tiers")))
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
    note: str = "",
) -> PriceTable:
    """A PriceTable of the chat models in LiteLLM's ``model_prices_and_context_window.json``.

    Kept: every entry with an input and an output price (per token, or as the first band
    of its ``tiered_pricing``) whose mode is a chat model's ("chat", "responses", or none
    given), with its long-context prices (``*_above_<N>k_tokens``, or the later bands of
    ``tiered_pricing``) at the sizes in LONG_CONTEXT_THRESHOLDS. Skipped: images,
    embeddings, audio, the ``sample_spec`` template; ``alias_of`` entries take their
    target's price. ``prefixes`` keeps only model ids starting with one of them; ``note``
    is kept with the table. Raises ValueError when ``data`` is not shaped like that file.
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
        price = _litellm_price(entry)
        if price is not None:
            prices[model] = price
    if not prices:
        raise ValueError(
            "not a LiteLLM price file: no entry has input_cost_per_token and output_cost_per_token"
        )
    for alias, target in aliases.items():
        target_entry = data.get(target)
        if target in prices:
            prices[alias] = prices[target]
        elif isinstance(target_entry, dict):
            price = _litellm_price(target_entry)
            if price is not None:
                prices[alias] = price
    _add_claude_ids(prices)
    return PriceTable(
        source=source,
        date=date or datetime.now(UTC).date().isoformat(),
        prices=dict(sorted(prices.items())),
        note=note,
    )


# A Claude model LiteLLM lists under Bedrock's id only: "anthropic.claude-opus-4-1-20250805-v1:0".
_BEDROCK_CLAUDE_RE = re.compile(r"^anthropic\.(claude-[a-z0-9-]+-\d{8})-v\d+:\d+$")
_DATED_CLAUDE_RE = re.compile(r"^(claude-[a-z0-9-]+)-\d{8}$")


def _add_claude_ids(prices: dict[str, ModelPrice]) -> None:
    """Claude Code's own ids for Claude models some LiteLLM releases list only as Bedrock
    ids (at the same price): "claude-opus-4-1-20250805", and "claude-opus-4-1" undated."""
    for name, price in list(prices.items()):
        match = _BEDROCK_CLAUDE_RE.match(name)
        if match:
            prices.setdefault(match.group(1), price)
    for name, price in list(prices.items()):
        match = _DATED_CLAUDE_RE.match(name)
        if match:
            prices.setdefault(match.group(1), price)


def _litellm_price(entry: dict[str, Any]) -> ModelPrice | None:
    """One LiteLLM entry's price (None: not a chat model's, or no usable price)."""
    mode = entry.get("mode")
    if mode is not None and mode not in _CHAT_MODES:
        return None
    values = {name: _litellm_cost(entry.get(key)) for name, key in _LITELLM_FIELDS.items()}
    bands = _litellm_bands(entry.get("tiered_pricing"))
    if values["input"] is None and values["output"] is None and bands and bands[0][0] == 0:
        values = bands[0][1]  # the prices of the first band, from 0 tokens on
    if values["input"] is None or values["output"] is None:
        return None
    tier_values: dict[int, dict[str, Decimal | None]] = {}
    for start, band in bands:
        if start > 0:
            tier_values[start] = band
    for key, value in entry.items():
        match = _LITELLM_TIER_RE.match(key)
        if match:
            above = int(match.group(2)) * 1000
            tier_values.setdefault(above, dict.fromkeys(_PRICE_FIELDS))
            tier_values[above][_FIELD_NAMES[match.group(1)]] = _litellm_cost(value)
    try:
        return _complete(values, _filled_tiers(values, tier_values))
    except ValueError:
        return None  # dearer than any real model: a broken entry


def _litellm_bands(raw: object) -> list[tuple[int, dict[str, Decimal | None]]]:
    """``tiered_pricing`` [{range: [start, end], input_cost_per_token, ...}] as (start in
    tokens, prices) by start; [] when absent or not shaped so."""
    if not isinstance(raw, list):
        return []
    bands = []
    for band in raw:
        if not isinstance(band, dict):
            return []
        span = band.get("range")
        if not isinstance(span, list) or not span or isinstance(span[0], bool):
            return []
        start = span[0]
        if not isinstance(start, (int, float)) or not math.isfinite(start) or start < 0:
            return []
        prices = {name: _litellm_cost(band.get(key)) for name, key in _LITELLM_FIELDS.items()}
        bands.append((int(start), prices))
    return sorted(bands, key=lambda band: band[0])


def _filled_tiers(
    base: dict[str, Decimal | None], tiers: dict[int, dict[str, Decimal | None]]
) -> tuple[PriceTier, ...]:
    """Tiers with their missing prices filled: input as the base's; output as the base's;
    cached reads and cache writes as the base's scaled like input (every vendor prices them
    as a share of input). A tier at a size transcripts are not read for is left out."""
    filled = []
    base_input = base["input"]
    assert base_input is not None
    for above, values in sorted(tiers.items()):
        if above not in LONG_CONTEXT_THRESHOLDS:
            continue
        if values["input"] is None and values["output"] is None:
            continue
        tier_input = values["input"] if values["input"] is not None else base_input
        ratio = tier_input / base_input if base_input else Decimal(1)
        complete = _complete(base)  # the base's own fills (cache read = input...)
        filled.append(
            PriceTier(
                above_tokens=above,
                input=tier_input,
                output=values["output"] if values["output"] is not None else complete.output,
                cache_read=_given_or(values["cache_read"], complete.cache_read * ratio),
                cache_write_5m=_given_or(values["cache_write_5m"], complete.cache_write_5m * ratio),
                cache_write_1h=_given_or(values["cache_write_1h"], complete.cache_write_1h * ratio),
            )
        )
    return tuple(filled)


def _given_or(value: Decimal | None, default: Decimal) -> Decimal:
    return value if value is not None else _tidy(default)


def _tiers_from_dict(raw: object) -> tuple[PriceTier, ...]:
    """Our format's "tiers": [{above_tokens, input, output, ...}], every price given."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ValueError("tiers that are not a list")
    tiers = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("a tier that is not an object")
        above = item.get("above_tokens")
        if isinstance(above, bool) or not isinstance(above, int):
            raise ValueError("a tier without a whole above_tokens")
        values = {key: _decimal(item.get(key)) for key in _PRICE_FIELDS}
        missing = [key for key, value in values.items() if value is None]
        if missing:
            raise ValueError(f"a tier above {above} tokens without {', '.join(missing)}")
        tiers.append(PriceTier(above, **values))  # type: ignore[arg-type]
    return tuple(sorted(tiers, key=lambda tier: tier.above_tokens))


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


def _complete(values: dict[str, Decimal | None], tiers: tuple[PriceTier, ...] = ()) -> ModelPrice:
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
        tiers=tiers,
    )
    dearest = max(getattr(each, name) for each in (price, *tiers) for name in _PRICE_FIELDS)
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
    if value is None:
        return None
    if type(value) is str:
        return _decimal_of_text(value)
    return _tidy(non_negative_decimal("a price", value))


@lru_cache(maxsize=4096)
def _decimal_of_text(value: str) -> Decimal:
    # A table repeats few distinct prices over thousands of entries: each is read once.
    return _tidy(non_negative_decimal("a price", value))


def _tidy(number: Decimal) -> Decimal:
    # 3.000000 -> 3, without turning 10 into 1E+1.
    normal = number.normalize()
    return normal.quantize(Decimal(1)) if normal == normal.to_integral_value() else normal


def _decimal_text(number: Decimal) -> str:
    return format(number, "f")
