"""Threads of the shapes other people's real sessions have, as the import stores them and the
thread page and the API show them: background-task notifications, typed commands, an IDE's
blocks, a proxy's partial usage, work before the first request, rolled-back Codex turns,
long-context prices and models priced through another provider's entry (issue 18).

The files are our own, in tests/fixtures/transcripts/edge; the real sessions they imitate
are checked by tests/test_realdata.py when they are on the machine.
"""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from replays import importing, planning, pricing
from replays.models import Thread
from tests.conftest import EDGE_TRANSCRIPTS, importer

pytestmark = pytest.mark.django_db
D = Decimal


def imported(name: str) -> Thread:
    result = importing.import_transcript_file(path=EDGE_TRANSCRIPTS / name, user=importer())
    assert result.outcome == "new", result.error
    assert result.thread is not None
    return result.thread


def page(client: Any, thread: Thread) -> str:
    response = client.get(f"/threads/{thread.pk}/")
    assert response.status_code == 200
    return response.content.decode()


def test_work_before_the_first_request_counts_in_the_threads_totals(
    logged_in_client: Any, api_client: Any
) -> None:
    thread = imported("claude_work_before_first_request.jsonl")

    (turn,) = thread.turns.all()
    assert (turn.input_tokens, turn.output_tokens) == (5, 11)
    # The thread holds every usage in the file: its turn's and the answer to the
    # notification that opened the session (7 in, 9 out, 500 read, 100 written for 1h).
    assert (thread.input_tokens, thread.output_tokens) == (5 + 7, 11 + 9)
    assert (thread.cache_read_tokens, thread.cache_write_1h_tokens) == (600 + 500, 100)
    sonnet = pricing.load_price_table().lookup("claude-sonnet-4-5-20250929")
    assert sonnet is not None
    before = (7 * sonnet.input + 9 * sonnet.output + 500 * sonnet.cache_read
              + 100 * sonnet.cache_write_1h) / 1_000_000  # fmt: skip
    assert thread.pre_turn_cost_usd == pricing.round_usd(before)
    assert thread.cost_usd == pricing.round_usd(before) + turn.cost_usd

    html = page(logged_in_client, thread)
    assert "Includes 616 tokens" in html and "before the first request" in html

    body = api_client.get(f"/api/threads/{thread.pk}/").json()
    assert body["before_first_turn"]["tokens"]["total"] == 616
    assert body["before_first_turn"]["models"] == ["claude-sonnet-4-5-20250929"]
    assert Decimal(str(body["before_first_turn"]["cost_usd"])) == thread.pre_turn_cost_usd
    assert body["tokens"]["total"] == 616 + 616  # the turn's and the work before it


def test_notifications_and_claude_codes_own_commands_are_not_turns(logged_in_client: Any) -> None:
    notified = imported("claude_task_notifications.jsonl")
    commands = imported("claude_commands.jsonl")

    assert notified.turn_count == 2
    assert list(commands.turns.values_list("request", flat=True)) == [
        "/review-plan check the retry logic in fetch.py",
        "Fix the first risk.",
        "/ship",
    ]
    html = page(logged_in_client, commands)
    assert "/review-plan check the retry logic in fetch.py" in html
    assert "As the agent received it" in html  # the skill's expansion, kept apart
    assert "ARGUMENTS: check the retry logic in fetch.py" in html


def test_titles_and_requests_leave_out_the_ides_blocks(
    logged_in_client: Any, api_client: Any
) -> None:
    thread = imported("claude_ide_context.jsonl")

    assert thread.title == "Why does parse() drop the last row?"
    html = page(logged_in_client, thread)
    assert "<title>Why does parse() drop the last row?" in html
    turns = api_client.get(f"/api/threads/{thread.pk}/").json()["turns"]
    assert turns[0]["request"] == "Why does parse() drop the last row?"
    assert turns[0]["request_as_sent"].startswith("<ide_opened_file>")
    # What a replay sends is what the historical agent got.
    first = thread.turns.get(index=0)
    assert first.sent_request == first.request_as_sent


def test_a_rolled_back_turn_is_marked_and_not_offered_for_replay(
    logged_in_client: Any, api_client: Any
) -> None:
    thread = imported("codex_rolled_back.jsonl")

    first, second = thread.turns.order_by("index")
    assert (first.rolled_back, second.rolled_back) == (True, False)
    # Its tokens were spent: the thread counts them.
    assert thread.output_tokens == first.output_tokens + second.output_tokens == 70 + 50

    html = page(logged_in_client, thread)
    assert "rolled back</span>" in html
    options = html.split('name="start_message_uuid"')[1].split("</select>")[0]
    assert second.message_uuid in options and first.message_uuid not in options

    turns = api_client.get(f"/api/threads/{thread.pk}/").json()["turns"]
    assert [turn["rolled_back"] for turn in turns] == [True, False]


def test_a_replay_sends_what_the_agent_got_and_skips_a_rolled_back_request() -> None:
    ide = imported("claude_ide_context.jsonl")
    rolled = imported("codex_rolled_back.jsonl")
    whole = {"start_message_uuid": None, "end_message_uuid": None, "request": None,
             "repository": None, "baseline_commit": None, "ending_commit": None}  # fmt: skip

    prep = planning.resolve_thread(ide, whole, verify_command=None, transcript_sha256="x")
    assert prep.requests == [turn.request_as_sent for turn in ide.turns.order_by("index")]
    assert prep.requests[0].startswith("<ide_opened_file>")

    prep = planning.resolve_thread(rolled, whole, verify_command=None, transcript_sha256="x")
    assert prep.requests == ["Draft the grant application"]
    first = rolled.turns.get(index=0).message_uuid
    only = {**whole, "start_message_uuid": first, "end_message_uuid": first}
    prep = planning.resolve_thread(rolled, only, verify_command=None, transcript_sha256="x")
    assert prep.blockers[0].endswith(
        "the user rolled back every selected request (the thread went on without them)."
    )


def test_a_model_priced_through_another_providers_entry_says_which(
    logged_in_client: Any, api_client: Any
) -> None:
    thread = imported("claude_proxy_partial_usage.jsonl")

    # glm-5 is not a Claude or GPT model: the bundled table prices it by z.ai's entry.
    assert thread.priced_as == {"glm-5": "zai/glm-5"}
    zai = pricing.load_price_table().prices["zai/glm-5"]
    # The final figures of each response (4900 + 5350 in, 120 + 45 out), not the estimates.
    assert (thread.input_tokens, thread.output_tokens) == (10_250, 165)
    assert thread.cost_usd == pricing.round_usd((10_250 * zai.input + 165 * zai.output) / 1_000_000)

    html = page(logged_in_client, thread)
    assert "priced as zai/glm-5" in html
    body = api_client.get(f"/api/threads/{thread.pk}/").json()
    assert body["priced_as"] == {"glm-5": "zai/glm-5"}
    assert body["turns"][0]["priced_as"] == {"glm-5": "zai/glm-5"}


def test_a_free_variant_costs_nothing_and_an_unknown_model_stays_unknown(
    tmp_path: Path, logged_in_client: Any
) -> None:
    lines = (EDGE_TRANSCRIPTS / "claude_work_before_first_request.jsonl").read_text()
    free = tmp_path / "free.jsonl"
    free.write_text(lines.replace("claude-sonnet-4-5-20250929", "vendor/some-model:free"))
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(
        lines.replace("claude-sonnet-4-5-20250929", "house-model-7").replace("aaaa0003", "aaaa0009")
    )

    free_thread = importing.import_transcript_file(path=free, user=importer()).thread
    unknown_thread = importing.import_transcript_file(path=unknown, user=importer()).thread

    assert free_thread is not None and unknown_thread is not None
    assert free_thread.cost_usd == D(0)
    assert free_thread.priced_as == {"vendor/some-model:free": pricing.FREE_ENTRY}
    assert unknown_thread.cost_usd is None  # never $0
    assert unknown_thread.priced_as == {"house-model-7": None}
    assert "free variant: $0" in page(logged_in_client, free_thread)
    assert "unknown price" in page(logged_in_client, unknown_thread)


def test_a_cost_the_agent_recorded_is_shown_as_its_own(logged_in_client: Any) -> None:
    # pi recorded what each response cost: the page says the figure is the agent's.
    thread = importing.import_transcript_file(
        path=EDGE_TRANSCRIPTS / "pi_v1.jsonl", user=importer()
    ).thread

    assert thread is not None
    shown = page(logged_in_client, thread)
    assert "cost as the agent recorded it" in shown
    assert "$0.0174" in shown  # the turn, $0.017391 as pi recorded it


def litellm_file(tmp_path: Path, *, tiers: bool) -> Path:
    entry = {
        "mode": "responses",
        "input_cost_per_token": 5e-06,
        "output_cost_per_token": 3e-05,
        "cache_read_input_token_cost": 5e-07,
    }
    if tiers:
        entry |= {
            "input_cost_per_token_above_272k_tokens": 1e-05,
            "output_cost_per_token_above_272k_tokens": 4.5e-05,
            "cache_read_input_token_cost_above_272k_tokens": 1e-06,
        }
    path = tmp_path / f"litellm-{tiers}.json"
    path.write_text(json.dumps({"gpt-5.5": entry}))
    return path


def test_each_request_is_priced_by_its_own_input_at_import_and_after_update_prices(
    tmp_path: Path, settings: Any
) -> None:
    settings.REPLAYS_PRICES_FILE = tmp_path / "var" / "prices.json"
    thread = imported("codex_long_context.jsonl")

    # 150k, 280k and 300k of input: 0.36 + 0.415 + 0.57 (the last two past 272k).
    assert thread.cost_usd == D("1.345")

    call_command("update_prices", str(litellm_file(tmp_path, tiers=False)), stdout=io.StringIO())
    thread.refresh_from_db()
    assert thread.cost_usd == D("0.89")  # a table without the tier: every request short

    call_command("update_prices", str(litellm_file(tmp_path, tiers=True)), stdout=io.StringIO())
    thread.refresh_from_db()
    assert thread.cost_usd == D("1.345")
    assert thread.priced_as == {"gpt-5.5": "gpt-5.5"}
    assert thread.turns.get().priced_as == {"gpt-5.5": "gpt-5.5"}
