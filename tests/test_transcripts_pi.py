"""pi sessions read right: formats 1 and 3, two entries on a line, the costs pi recorded.

Our own files (tests/fixtures/transcripts/edge/pi_*) in the shapes real ones have; the
session pi 0.73.1 wrote itself is in real/pi/.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from replays import importing, pricing
from replays.transcripts import parse_transcript
from replays.transcripts.base import TokenUsage
from tests.conftest import EDGE_TRANSCRIPTS, REAL_TRANSCRIPTS, importer, manifest_session

pytestmark = pytest.mark.django_db


def test_format_1_reads_both_entries_of_a_line_and_keeps_the_costs_pi_recorded() -> None:
    thread = parse_transcript(EDGE_TRANSCRIPTS / "pi_v1.jsonl")

    assert (thread.kind, thread.cwd) == ("pi", "/home/ada/calc")
    # A command the user ran with `!` is no request.
    assert [turn.request for turn in thread.turns] == [
        "Make add() handle floats",
        "Now write a test for it",
    ]
    first, second = thread.turns
    # The response on the line holding two entries is counted (pi itself skips that line).
    assert first.usage_by_model["claude-sonnet-4-5"] == TokenUsage(
        input_tokens=19, output_tokens=175, cache_read_tokens=9280, cache_write_5m_tokens=3180
    )
    assert str(first.recorded_costs["claude-sonnet-4-5"].usd) == "0.017391"
    assert second.recorded_costs == {}  # recorded no cost: the table prices it
    assert thread.problems == []
    # read (the whole file, as pi returned it), edit (the old single form), the command;
    # the write that failed is not evidence.
    assert [(item["kind"], item.get("path")) for item in first.evidence.items] == [
        ("read", "calc.py"), ("edit", "calc.py"), ("shell", None),
    ]  # fmt: skip
    assert first.evidence.items[0]["text"] == "def add(a: int, b: int) -> int:\n    return a + b\n"
    assert first.final_answer == "add() now takes floats; 0.5 + 0.25 gives 0.75."
    assert first.model_seconds == 6.0  # each response from its start to its line


def test_format_3_reads_a_branch_in_order_and_counts_reasoning_as_output() -> None:
    thread = parse_transcript(EDGE_TRANSCRIPTS / "pi_tree.jsonl")

    assert [turn.request for turn in thread.turns] == [
        "Make the header sticky",
        "No, make it fixed instead",
    ]
    assert [turn.message_uuid for turn in thread.turns] == ["u1", "u2"]
    # 60 tokens totalTokens counts beyond the four kinds: reasoning, output.
    assert thread.turns[1].usage_by_model["gpt-5"] == TokenUsage(
        input_tokens=500, output_tokens=100, cache_read_tokens=1800
    )
    assert thread.turns[1].final_answer == "The header is fixed now."
    assert [(p.line_number, p.message[:12]) for p in thread.problems] == [(8, "invalid JSON")]


def test_a_pi_session_imports_with_the_costs_pi_recorded_shown_as_such() -> None:
    result = importing.import_transcript_file(
        path=EDGE_TRANSCRIPTS / "pi_v1.jsonl", user=importer()
    )

    thread = result.thread
    assert thread is not None and thread.get_source_kind_display() == "pi"
    first, second = thread.turns.order_by("index")
    assert first.cost_usd == Decimal("0.017391")
    assert first.priced_as == {"claude-sonnet-4-5": pricing.RECORDED_ENTRY}
    # Sonnet 4.5 at 3 / 15 / 0.30 a million tokens.
    assert second.cost_usd == Decimal("0.003600")
    assert second.priced_as == {"claude-sonnet-4-5": "claude-sonnet-4-5"}
    assert thread.cost_usd == Decimal("0.020991")


def test_the_session_pi_wrote_reads_as_the_server_answered() -> None:
    session = manifest_session("pi-vowel-count")
    thread = parse_transcript(REAL_TRANSCRIPTS / session["path"])

    assert (thread.session_id, thread.cwd) == (session["session_id"], session["cwd"])
    assert [turn.request for turn in thread.turns] == [t["request"] for t in session["turns"]]
    for turn, expected in zip(thread.turns, session["turns"], strict=True):
        usage = expected["usage"]  # OpenAI's: input holds the cached part
        assert turn.usage == TokenUsage(
            input_tokens=usage["input_tokens"] - usage["cached_input_tokens"],
            output_tokens=usage["output_tokens"],
            cache_read_tokens=usage["cached_input_tokens"],
        )
    assert [item["kind"] for item in thread.turns[0].evidence.items] == ["read", "edit", "shell"]
