"""The price table (data with its source and date) and cost arithmetic.

Plain Python (no database): runs with or without the Django plugin.
"""

from __future__ import annotations

import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from replays.pricing import (
    BUNDLED_PRICES,
    FREE_ENTRY,
    ModelPrice,
    PriceTable,
    PriceTier,
    cost_usd,
    load_price_table,
    price_table_from_litellm,
    priced_as,
    round_usd,
    save_price_table,
    turn_cost_usd,
)
from replays.transcripts import TokenUsage, parse_transcript

REAL = Path(__file__).parent / "fixtures" / "transcripts" / "real"
EDGE = Path(__file__).parent / "fixtures" / "transcripts" / "edge"
D = Decimal


def price(
    input: str, output: str, read: str, write_5m: str, write_1h: str, *tiers: PriceTier
) -> ModelPrice:
    return ModelPrice(D(input), D(output), D(read), D(write_5m), D(write_1h), tiers)


def tier(above: int, input: str, output: str, read: str, write_5m: str, write_1h: str) -> PriceTier:
    return PriceTier(above, D(input), D(output), D(read), D(write_5m), D(write_1h))


# --- the bundled table ------------------------------------------------------------------


def test_bundled_table_records_its_source_and_date() -> None:
    table = load_price_table()

    assert table.source.startswith("LiteLLM model_prices_and_context_window.json (litellm ")
    assert len(table.date) == 10 and table.date[4] == "-"
    raw = json.loads(BUNDLED_PRICES.read_text())
    assert raw["unit"] == "USD per million tokens"


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("claude-sonnet-4-5", price("3", "15", "0.3", "3.75", "6")),
        ("claude-sonnet-4-5-20250929", price("3", "15", "0.3", "3.75", "6")),
        # LiteLLM lists Sonnet 4 only as a Bedrock id, with its 1M-context tier.
        (
            "claude-sonnet-4-20250514",
            price("3", "15", "0.3", "3.75", "6", tier(200_000, "6", "22.5", "0.6", "7.5", "12")),
        ),
        ("claude-opus-4-5-20251101", price("5", "25", "0.5", "6.25", "10")),
        ("claude-opus-4-1-20250805", price("15", "75", "1.5", "18.75", "30")),
        ("claude-opus-4-20250514", price("15", "75", "1.5", "18.75", "30")),
        ("claude-haiku-4-5-20251001", price("1", "5", "0.1", "1.25", "2")),
        # OpenAI lists no cache-write price: 1.25x and 2x input stand in.
        ("gpt-5", price("1.25", "10", "0.125", "1.5625", "2.5")),
        ("gpt-5-codex", price("1.25", "10", "0.125", "1.5625", "2.5")),
        ("gpt-5.1-codex", price("1.25", "10", "0.125", "1.5625", "2.5")),
        ("gpt-5.1-codex-mini", price("0.25", "2", "0.025", "0.3125", "0.5")),
        ("gpt-5.2", price("1.75", "14", "0.175", "2.1875", "3.5")),
        ("gpt-5.3-codex", price("1.75", "14", "0.175", "2.1875", "3.5")),
        # Above 272k of input: 2x input and cached input, 1.5x output.
        (
            "gpt-5.5",
            price("5", "30", "0.5", "6.25", "10", tier(272_000, "10", "45", "1", "12.5", "20")),
        ),
    ],
)
def test_bundled_prices_match_the_vendors(model: str, expected: ModelPrice) -> None:
    assert load_price_table().prices[model] == expected


# --- lookup ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spelling",
    [
        "claude-sonnet-4-5-20250929",  # exact
        "anthropic/claude-sonnet-4-5-20250929",  # provider prefix
        "bedrock/us.anthropic.claude-sonnet-4-5-20250929-v1:0",  # Bedrock id
        "vertex_ai/claude-sonnet-4-5@20250929",  # Vertex id
        "claude-sonnet-4-5-20991231",  # a date the table does not list
        "Claude-Sonnet-4-5",  # case
    ],
)
def test_lookup_normalises_model_ids(spelling: str) -> None:
    table = PriceTable(
        source="test",
        date="2026-01-01",
        prices={"claude-sonnet-4-5": price("3", "15", "0.3", "3.75", "6")},
    )
    assert table.lookup(spelling) == price("3", "15", "0.3", "3.75", "6")


def test_lookup_prefers_the_exact_dated_id() -> None:
    table = PriceTable(
        source="t",
        date="2026-01-01",
        prices={
            "gpt-5": price("1", "1", "1", "1", "1"),
            "gpt-5-2025-08-07": price("2", "2", "2", "2", "2"),
        },
    )
    assert table.lookup("gpt-5-2025-08-07") == price("2", "2", "2", "2", "2")
    assert table.lookup("openai/gpt-5-2099-01-01") == price("1", "1", "1", "1", "1")


def test_unknown_models_have_no_price() -> None:
    table = load_price_table()
    assert table.lookup("fake-model-9000") is None
    assert table.lookup("unknown") is None
    assert table.lookup("") is None


# --- cost arithmetic ----------------------------------------------------------------------


def test_cost_adds_every_token_kind_at_its_own_price() -> None:
    usage = TokenUsage(
        input_tokens=1_000_000,
        output_tokens=100_000,
        cache_read_tokens=2_000_000,
        cache_write_5m_tokens=100_000,
        cache_write_1h_tokens=10_000,
    )
    # 3 + 1.5 + 0.6 + 0.375 + 0.06
    assert cost_usd("claude-sonnet-4-5", usage) == D("5.535")


def test_cost_is_exact_and_rounded_only_for_display() -> None:
    cost = cost_usd("gpt-5", TokenUsage(input_tokens=1, output_tokens=1))
    assert cost == D("0.00001125")
    assert round_usd(cost) == D("0.000011")
    assert round_usd(D("0.0000005")) == D("0.000001")


def test_cost_of_an_unknown_model_is_none_never_zero() -> None:
    assert cost_usd("fake-model-9000", TokenUsage(input_tokens=10)) is None
    assert cost_usd("fake-model-9000", TokenUsage()) is None


def test_turn_cost_is_unknown_when_any_model_that_used_tokens_is_unknown() -> None:
    known = TokenUsage(input_tokens=1_000_000)
    assert (
        turn_cost_usd({"claude-sonnet-4-5": known, "fake-model": TokenUsage(output_tokens=1)})
        is None
    )
    # A model that used no tokens cannot change the cost.
    assert turn_cost_usd({"claude-sonnet-4-5": known, "fake-model": TokenUsage()}) == D("3")
    assert turn_cost_usd({}) == D("0")


def test_turn_cost_sums_models() -> None:
    assert turn_cost_usd(
        {
            "claude-sonnet-4-5": TokenUsage(output_tokens=1_000_000),
            "claude-haiku-4-5-20251001": TokenUsage(output_tokens=1_000_000),
        }
    ) == D("20")


def real_ccusage_sessions() -> list[tuple[str, float]]:
    """(transcript path, ccusage's cost) for every real session ccusage priced."""
    manifest_path = REAL / "manifest.json"
    if not manifest_path.exists():
        return []
    manifest = json.loads(manifest_path.read_text())
    return [
        (s["path"], s["ccusage_cost_usd"])
        for s in manifest["sessions"]
        if s.get("ccusage_cost_usd") is not None
    ]


@pytest.mark.parametrize(("path", "ccusage_cost"), real_ccusage_sessions())
def test_real_session_costs_agree_with_ccusage(path: str, ccusage_cost: float) -> None:
    thread = parse_transcript(REAL / path)
    costs = [turn_cost_usd(turn.usage_by_model) for turn in thread.turns]

    assert None not in costs
    assert float(sum(costs, D(0))) == pytest.approx(ccusage_cost, rel=1e-9)


# --- long-context tiers: each request priced by its own input ---------------------------


def test_a_long_request_is_priced_whole_at_its_tier() -> None:
    gpt = price("5", "30", "0.5", "6.25", "10", tier(272_000, "10", "45", "1", "12.5", "20"))
    short = TokenUsage(input_tokens=50_000, cache_read_tokens=100_000, output_tokens=2_000)
    long = TokenUsage(input_tokens=10_000, cache_read_tokens=270_000, output_tokens=1_000)

    assert gpt.request_cost_usd(short) == D("0.36")  # 150k of input: base prices
    # 280k of input: every token of it at the tier's prices, not only those past 272k.
    assert gpt.request_cost_usd(long) == D("0.415")
    # The same from a turn's sums: all its usage, and the part from requests past 272k.
    assert gpt.cost_usd(short + long, {272_000: long}) == D("0.775")
    # Without the long requests' part every request is a short one (the old, low figure).
    assert gpt.cost_usd(short + long) == D("0.575")


def test_requests_between_two_tiers_are_priced_at_the_lower_one() -> None:
    model = price(
        "1", "2", "0.1", "1.25", "2",
        tier(128_000, "2", "4", "0.2", "2.5", "4"),
        tier(256_000, "3", "6", "0.3", "3.75", "6"),
    )  # fmt: skip
    small, middle, large = (TokenUsage(input_tokens=n) for n in (100_000, 200_000, 300_000))
    above = {128_000: middle + large, 256_000: large}

    # 100k at $1, 200k at $2, 300k at $3 per million.
    assert model.cost_usd(small + middle + large, above) == D("0.1") + D("0.4") + D("0.9")


def test_turn_costs_use_the_long_context_part_of_each_model() -> None:
    table = PriceTable(
        source="t",
        date="2026-01-01",
        prices={"gpt-5.5": price("5", "30", "0.5", "6.25", "10", tier(272_000, "10", "45", "1", "12.5", "20"))},
    )  # fmt: skip
    long = TokenUsage(input_tokens=300_000)

    assert turn_cost_usd({"gpt-5.5": long}, table, {"gpt-5.5": {272_000: long}}) == D("3")
    assert turn_cost_usd({"gpt-5.5": long}, table) == D("1.5")


def test_the_long_context_fixture_costs_what_its_requests_cost() -> None:
    # Three requests of gpt-5.5: 150k, 280k and 300k of input (LiteLLM: $5 / $0.50 / $30 a
    # million, $10 / $1 / $45 for a request past 272k). Priced by request: 0.36 + 0.415 +
    # 0.57; as if every request were short: 0.89.
    (turn,) = parse_transcript(EDGE / "codex_long_context.jsonl").turns

    assert turn_cost_usd(turn.usage_by_model, long_context=turn.long_context_usage) == D("1.345")


def test_a_tier_at_a_size_transcripts_are_not_read_for_is_refused() -> None:
    with pytest.raises(ValueError, match="above 150000 tokens"):
        tier(150_000, "1", "1", "1", "1", "1")


# --- matching model ids as ccusage does ------------------------------------------------------


FAMILY = PriceTable(
    source="t",
    date="2026-01-01",
    prices={
        "zai/glm-5.1": price("1.4", "4.4", "0.26", "0", "2.8"),
        "dashscope/glm-5.1": price("9", "9", "9", "9", "9"),
        "kyma/glm-5.1": price("9", "9", "9", "9", "9"),
        "claude-opus-4": price("15", "75", "1.5", "18.75", "30"),
        "claude-opus-4-6": price("5", "25", "0.5", "6.25", "10"),
        "vertex_ai/claude-opus-4-6": price("9", "9", "9", "9", "9"),
        "nebius/nvidia/nemotron-3-super-120b-a12b": price("0.3", "0.9", "0.06", "0.375", "0.6"),
        "anthropic.claude-v2:1": price("8", "24", "8", "10", "16"),
    },
)


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        # The same model under a provider: the shortest id among providers.
        ("glm-5.1", "zai/glm-5.1"),
        ("GLM-5.1", "zai/glm-5.1"),
        # An id that extends a model's: the model's own entry before a provider's.
        ("claude-opus-4-6-thinking", "claude-opus-4-6"),
        ("claude-opus-4-6-20260101", "claude-opus-4-6"),
        # A date of 8 digits extends the model; a provider's prefix is dropped.
        ("nvidia/nemotron-3-super-120b-a12b-20230311", "nebius/nvidia/nemotron-3-super-120b-a12b"),
        # Another version is another model, never the one it starts like.
        ("claude-opus-4-7", None),
        ("claude-opus-4-5-20251101", None),
        ("glm-5", None),
        ("fake-model-9000", None),
        # A name of one word (Bedrock's "anthropic.claude-v2:1" reads as "claude") is no
        # family: it matches only itself, never every Claude.
        ("claude-mystery-4-5", None),
    ],
)
def test_model_ids_are_matched_to_the_entry_of_their_model(model: str, entry: str | None) -> None:
    found = FAMILY.match(model)

    assert (found.entry if found else None) == entry
    if found is not None:
        assert found.price == FAMILY.prices[entry]


def test_a_free_variant_costs_nothing_and_says_so() -> None:
    model = "nvidia/nemotron-3-super-120b-a12b-20230311:free"
    usage = {model: TokenUsage(input_tokens=40_000, output_tokens=900)}

    assert turn_cost_usd(usage, FAMILY) == D("0")
    assert priced_as(usage, FAMILY) == {model: FREE_ENTRY}


def test_an_opencode_free_model_costs_nothing_too() -> None:
    # OpenCode Zen's and Go's free models end in -free (LiteLLM prices its opencode_go ones
    # at 0): not the paid model of the same name.
    model = "deepseek-v4-flash-free"
    usage = {model: TokenUsage(input_tokens=216_234, output_tokens=69_242)}

    assert turn_cost_usd(usage, FAMILY) == D("0")
    assert priced_as(usage, FAMILY) == {model: FREE_ENTRY}


def test_priced_as_names_each_models_entry_and_none_for_an_unknown_one() -> None:
    usage = {
        "glm-5.1": TokenUsage(input_tokens=1),
        "mystery-model": TokenUsage(input_tokens=1),
        "unused": TokenUsage(),
    }

    assert priced_as(usage, FAMILY) == {"glm-5.1": "zai/glm-5.1", "mystery-model": None}
    assert turn_cost_usd(usage, FAMILY) is None  # unknown, never $0


@pytest.mark.parametrize(
    ("model", "entry"),
    [
        ("glm-5.1", "zai/glm-5.1"),
        ("glm-5", "zai/glm-5"),
        ("glm-4.7", "zai/glm-4.7"),
        ("claude-opus-4-6-thinking", "claude-opus-4-6"),
        ("gpt-5.6-sol", "gpt-5.6-sol"),
        ("openai/gpt-5.5", "gpt-5.5"),
    ],
)
def test_the_bundled_table_prices_models_beyond_claude_and_gpt(model: str, entry: str) -> None:
    found = load_price_table().match(model)

    assert found is not None and found.entry == entry


def test_the_bundled_table_holds_chat_models_only() -> None:
    prices = load_price_table().prices

    assert len(prices) > 3000
    assert "text-embedding-3-large" not in prices  # an embedding model
    assert "zai/glm-5.1" in prices and "gpt-5.6-sol" in prices


# --- LiteLLM files ---------------------------------------------------------------------------


LITELLM_SAMPLE: dict[str, Any] = {
    "sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0},
    "claude-sonnet-4-5": {
        "input_cost_per_token": 3e-06,
        "output_cost_per_token": 1.5e-05,
        "cache_read_input_token_cost": 3e-07,
        "cache_creation_input_token_cost": 3.75e-06,
        "cache_creation_input_token_cost_above_1hr": 6e-06,
        "litellm_provider": "anthropic",
    },
    "gpt-5": {
        "input_cost_per_token": 1.25e-06,
        "output_cost_per_token": 1e-05,
        "cache_read_input_token_cost": 1.25e-07,
    },
    "gpt-image-1": {"input_cost_per_image": 0.04, "mode": "image_generation"},
    "claude-sonnet-latest": {"alias_of": "claude-sonnet-4-5"},
    "broken": {"input_cost_per_token": "cheap", "output_cost_per_token": 1e-06},
    "also-broken": "not an object",
}


def test_litellm_file_becomes_a_table_in_dollars_per_million() -> None:
    table = price_table_from_litellm(LITELLM_SAMPLE, source="LiteLLM (test)", date="2026-02-03")

    assert (table.source, table.date) == ("LiteLLM (test)", "2026-02-03")
    assert set(table.prices) == {"claude-sonnet-4-5", "gpt-5", "claude-sonnet-latest"}
    assert table.prices["claude-sonnet-4-5"] == price("3", "15", "0.3", "3.75", "6")
    # Missing cache-write prices: 1.25x (5m) and 2x (1h) input.
    assert table.prices["gpt-5"] == price("1.25", "10", "0.125", "1.5625", "2.5")
    assert table.prices["claude-sonnet-latest"] == table.prices["claude-sonnet-4-5"]


def test_litellm_long_context_prices_become_tiers() -> None:
    data = {
        "gpt-x": {
            "mode": "responses",
            "input_cost_per_token": 5e-06,
            "output_cost_per_token": 3e-05,
            "cache_read_input_token_cost": 5e-07,
            "input_cost_per_token_above_272k_tokens": 1e-05,
            "output_cost_per_token_above_272k_tokens": 4.5e-05,
            "cache_read_input_token_cost_above_272k_tokens": 1e-06,
            "input_cost_per_token_above_272k_tokens_priority": 2e-05,  # another service tier
        },
        # Bands instead of per-field prices (some providers' models).
        "qwen-x": {
            "mode": "chat",
            "tiered_pricing": [
                {"range": [0, 256000.0], "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06},
                {"range": [256000.0, 1000000.0], "input_cost_per_token": 3e-06, "output_cost_per_token": 6e-06},
            ],
        },
        # A size transcripts are not read for: left out, the base price kept.
        "odd-x": {
            "input_cost_per_token": 1e-06,
            "output_cost_per_token": 1e-06,
            "input_cost_per_token_above_64k_tokens": 2e-06,
        },
        "embedder": {"mode": "embedding", "input_cost_per_token": 1e-07, "output_cost_per_token": 0},
    }  # fmt: skip

    table = price_table_from_litellm(data, source="t")

    assert set(table.prices) == {"gpt-x", "qwen-x", "odd-x"}
    assert table.prices["gpt-x"] == price(
        "5", "30", "0.5", "6.25", "10", tier(272_000, "10", "45", "1", "12.5", "20")
    )
    assert table.prices["qwen-x"] == price(
        "1", "2", "1", "1.25", "2", tier(256_000, "3", "6", "3", "3.75", "6")
    )
    assert table.prices["odd-x"].tiers == ()


def test_saved_tiers_load_back(tmp_path: Path) -> None:
    table = PriceTable(
        source="t", date="2026-01-01",
        prices={"m": price("1", "2", "0.1", "1.25", "2", tier(200_000, "2", "3", "0.2", "2.5", "4"))},
    )  # fmt: skip
    path = tmp_path / "prices.json"

    save_price_table(table, path)

    assert load_price_table(path).prices == table.prices


def test_litellm_entries_without_a_cache_read_price_charge_input() -> None:
    table = price_table_from_litellm(
        {"m": {"input_cost_per_token": 2e-06, "output_cost_per_token": 4e-06}}, source="t"
    )
    assert table.prices["m"] == price("2", "4", "2", "2.5", "4")
    assert len(table.date) == 10  # defaults to today


def test_litellm_prefixes_keep_only_matching_models() -> None:
    table = price_table_from_litellm(LITELLM_SAMPLE, source="t", prefixes=("gpt-5",))
    assert set(table.prices) == {"gpt-5"}


@pytest.mark.parametrize(
    "data",
    [
        [1, 2, 3],
        "prices",
        {"name": "demo", "version": "1.0.0"},
        {"sample_spec": {"input_cost_per_token": 0.0, "output_cost_per_token": 0.0}},
    ],
)
def test_files_not_shaped_like_litellm_are_refused(data: Any) -> None:
    with pytest.raises(ValueError, match="not a LiteLLM price file"):
        price_table_from_litellm(data, source="t")


# --- saving and loading --------------------------------------------------------------------


def test_saved_tables_load_back_identically(tmp_path: Path) -> None:
    table = price_table_from_litellm(LITELLM_SAMPLE, source="LiteLLM (test)", date="2026-02-03")
    path = tmp_path / "var" / "prices.json"

    save_price_table(table, path)
    loaded = load_price_table(path)

    assert loaded.source == table.source
    assert loaded.date == table.date
    assert loaded.prices == table.prices
    assert json.loads(path.read_text())["prices"]["gpt-5"]["cache_write_5m"] == "1.5625"


def test_the_override_file_wins_when_it_exists(tmp_path: Path) -> None:
    override = tmp_path / "prices.json"
    assert load_price_table(override).source == load_price_table().source  # missing: bundled

    save_price_table(
        PriceTable(
            source="mine",
            date="2026-03-04",
            prices={
                "fake-model": price("1", "2", "0.1", "1.25", "2"),
            },
        ),
        override,
    )

    table = load_price_table(override)
    assert table.source == "mine"
    assert cost_usd("fake-model", TokenUsage(output_tokens=1_000_000), table) == D("2")


def test_an_updated_override_is_read_again(tmp_path: Path) -> None:
    override = tmp_path / "prices.json"
    save_price_table(PriceTable(source="v1", date="2026-01-01", prices={}), override)
    assert load_price_table(override).source == "v1"
    assert load_price_table(override) is load_price_table(override)  # cached

    save_price_table(PriceTable(source="v2 (longer)", date="2026-01-02", prices={}), override)
    os.utime(override, ns=(1, 1))  # a different mtime even on coarse clocks

    assert load_price_table(override).source == "v2 (longer)"


def test_the_cache_can_be_cleared_explicitly(tmp_path: Path) -> None:
    override = tmp_path / "prices.json"
    save_price_table(PriceTable(source="v1", date="2026-01-01", prices={}), override)
    first = load_price_table(override)

    load_price_table.cache_clear()  # type: ignore[attr-defined]

    assert load_price_table(override) is not first
    assert load_price_table(override).source == "v1"


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"prices": {}}),
        json.dumps({"source": "s", "date": "d", "prices": {"m": {"input": "x", "output": "1"}}}),
        json.dumps({"source": "s", "date": "d", "prices": {"m": {"input": "1"}}}),
        json.dumps({"source": "s", "date": "d", "prices": {"m": {"input": "-1", "output": "1"}}}),
    ],
)
def test_a_broken_override_is_an_error_not_a_silent_fallback(tmp_path: Path, content: str) -> None:
    override = tmp_path / "prices.json"
    override.write_text(content)

    with pytest.raises(ValueError, match="prices.json"):
        load_price_table(override)
