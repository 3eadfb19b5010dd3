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
    ModelPrice,
    PriceTable,
    cost_usd,
    load_price_table,
    price_table_from_litellm,
    round_usd,
    save_price_table,
    turn_cost_usd,
)
from replays.transcripts import TokenUsage, parse_transcript

REAL = Path(__file__).parent / "fixtures" / "transcripts" / "real"
D = Decimal


def price(input: str, output: str, read: str, write_5m: str, write_1h: str) -> ModelPrice:
    return ModelPrice(D(input), D(output), D(read), D(write_5m), D(write_1h))


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
        ("claude-sonnet-4-20250514", price("3", "15", "0.3", "3.75", "6")),
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
        ("gpt-5.5", price("5", "30", "0.5", "6.25", "10")),
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
