"""Hostile transcripts: whatever a file claims, an import reports bad lines or refuses the
file with a reason, never crashes, and never breaks a page for anyone afterwards.

Runs on SQLite and PostgreSQL; the NUL cases only ever failed on PostgreSQL.
"""

from __future__ import annotations

import io
import json
import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.apps import apps
from django.core.files.uploadedfile import SimpleUploadedFile
from django.core.management import CommandError, call_command
from django.db import models
from django.urls import reverse

from replays import importing, pricing
from replays.models import Thread, Turn
from replays.transcripts import parse_transcript
from replays.transcripts.base import (
    MAX_LINE_TOKENS,
    MAX_MESSAGE_ID_CHARS,
    MAX_THREAD_COST_USD,
    MAX_THREAD_TOKENS,
)
from tests.conftest import importer

pytestmark = pytest.mark.django_db

SESSION = "6b1d3c2e-0000-4000-8000-000000000001"
MODEL = "claude-sonnet-4-5"  # $3 in, $15 out per million tokens
OUT_OF_RANGE = "token counts out of range"


@pytest.fixture(autouse=True)
def _own_var_dir(settings: Any, tmp_path: Path) -> None:
    settings.REPLAYS_VAR_DIR = tmp_path / "var"


# --- writing transcripts -------------------------------------------------------------


def user(uuid: str | None, second: int, content: Any, **extra: Any) -> dict[str, Any]:
    line = {
        "type": "user",
        "sessionId": SESSION,
        "timestamp": f"2026-03-01T10:00:{second:02d}.000Z",
        "cwd": "/home/alice/app",
        "version": "2.1.197",
        "message": {"role": "user", "content": content},
        **extra,
    }
    if uuid is not None:
        line["uuid"] = uuid
    return line


def assistant(second: int, usage: dict[str, Any], *, model: str = MODEL, **extra: Any) -> dict:
    return {
        "type": "assistant",
        "uuid": f"a-{second}",
        "sessionId": SESSION,
        "timestamp": f"2026-03-01T10:00:{second:02d}.000Z",
        "requestId": f"req-{second}",
        "message": {
            "id": f"msg-{second}",
            "model": model,
            "role": "assistant",
            "content": [{"type": "text", "text": "Done."}],
            "usage": usage,
        },
        **extra,
    }


def write(path: Path, lines: list[Any]) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text, encoding="utf-8")
    return path


def claude_file(tmp_path: Path, lines: list[Any], name: str = f"{SESSION}.jsonl") -> Path:
    return write(tmp_path / name, lines)


def sane_session(
    tmp_path: Path, name: str = f"{SESSION}.jsonl", request: str = "Add a test"
) -> Path:
    return claude_file(
        tmp_path,
        [user("u1", 0, request), assistant(5, {"input_tokens": 1000, "output_tokens": 200})],
        name,
    )


def codex_file(tmp_path: Path, lines: list[dict[str, Any]], session: str = SESSION) -> Path:
    meta = {
        "timestamp": "2026-03-01T10:00:00.000Z",
        "type": "session_meta",
        "payload": {"id": session, "cwd": "/home/alice/app", "cli_version": "0.169.0"},
    }
    context = {
        "timestamp": "2026-03-01T10:00:00.100Z",
        "type": "turn_context",
        "payload": {"cwd": "/home/alice/app", "model": "gpt-5.5"},
    }
    return write(tmp_path / f"rollout-2026-03-01T10-00-00-{SESSION}.jsonl", [meta, context, *lines])


def codex_prompt(second: int, text: str, turn_id: str | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"type": "user_message", "message": text}
    if turn_id is not None:
        payload["turn_id"] = turn_id
    return {
        "timestamp": f"2026-03-01T10:00:{second:02d}.000Z",
        "type": "event_msg",
        "payload": payload,
    }


def codex_record(second: int, input_tokens: Any, output_tokens: Any = 10) -> dict[str, Any]:
    return {
        "timestamp": f"2026-03-01T10:00:{second:02d}.000Z",
        "type": "token_usage_record",
        "payload": {
            "response_id": f"resp-{second}",
            "usage": {
                "input_tokens": input_tokens,
                "cached_input_tokens": 0,
                "output_tokens": output_tokens,
            },
        },
    }


def run_import(*paths: Path) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "import_threads",
        "--user",
        importer().username,
        *map(str, paths),
        "--no-progress",
        stdout=out,
        stderr=err,
    )
    return out.getvalue(), err.getvalue()


def problems(result: importing.ImportResult) -> list[tuple[int, str]]:
    return [(p.line_number, p.message) for p in result.problems]


def pages_load(client: Any, staff_user: Any) -> None:
    client.force_login(staff_user)
    for url in ("/", "/api/threads/", "/admin/replays/thread/", "/admin/replays/turn/"):
        response = client.get(url)
        assert response.status_code == 200, (url, response.status_code)


# --- 9: absurd numbers are bad lines; every cost that passes fits its field -----------


def test_a_line_with_absurd_token_counts_is_skipped_and_the_pages_still_load(
    tmp_path: Path, client: Any, staff_user: Any
) -> None:
    path = claude_file(
        tmp_path,
        [
            user("u1", 0, "Add a test"),
            assistant(3, {"input_tokens": 10**14, "output_tokens": 5}),
            assistant(5, {"input_tokens": 1000, "output_tokens": 200}),
        ],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new"
    assert [line for line, _ in problems(result)] == [2]
    assert OUT_OF_RANGE in problems(result)[0][1]
    thread = Thread.objects.get()
    assert thread.input_tokens == 1000
    assert thread.cost_usd == Decimal("0.006")  # 1000 in at $3/M + 200 out at $15/M
    pages_load(client, staff_user)
    thread.delete()


@pytest.mark.parametrize(
    "number",
    [str(2**63), str(2**64 + 1), "1e300", "Infinity", str(10**12 + 1), "1e13", "9" * 4301],
    ids=["2^63", "2^64+1", "1e300", "Infinity", "bound+1", "1e13-float", "4301-digits"],
)
def test_token_counts_beyond_the_bound_are_bad_lines_in_claude_files(
    tmp_path: Path, number: str
) -> None:
    line = json.dumps(assistant(3, {"cache_read_input_tokens": 0})).replace(
        '"cache_read_input_tokens": 0', f'"cache_read_input_tokens": {number}'
    )
    path = claude_file(
        tmp_path,
        [user("u1", 0, "Add a test"), line, assistant(5, {"input_tokens": 7, "output_tokens": 1})],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new"
    assert [line for line, _ in problems(result)] == [2]
    assert OUT_OF_RANGE in problems(result)[0][1] or "invalid JSON" in problems(result)[0][1]
    assert Turn.objects.get().input_tokens == 7


def test_token_counts_beyond_the_bound_are_bad_lines_in_codex_files(tmp_path: Path) -> None:
    path = codex_file(
        tmp_path,
        [
            codex_prompt(1, "Add a test", "t1"),
            codex_record(2, 2**63),
            codex_record(3, 1e300),
            codex_record(4, 400),
        ],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new"
    assert [line for line, _ in problems(result)] == [4, 5]
    assert all(OUT_OF_RANGE in message for _, message in problems(result))
    assert Turn.objects.get().input_tokens == 400


def test_a_bound_exactly_is_still_counted(tmp_path: Path) -> None:
    path = claude_file(
        tmp_path, [user("u1", 0, "Add a test"), assistant(3, {"input_tokens": MAX_LINE_TOKENS})]
    )
    result = importing.import_transcript_file(path=path, user=importer())
    assert result.problems == []
    assert Thread.objects.get().input_tokens == MAX_LINE_TOKENS


def test_a_session_cannot_sum_past_its_bound(tmp_path: Path, client: Any, staff_user: Any) -> None:
    """Each line within the line bound, together past the session bound: the lines that
    would take a kind past it are skipped, so no sum overflows the 64-bit columns."""
    per_line = MAX_LINE_TOKENS
    allowed = MAX_THREAD_TOKENS // per_line
    lines: list[Any] = [user("u1", 0, "Add a test")]
    lines += [assistant(second, {"output_tokens": per_line}) for second in range(1, allowed + 4)]
    result = importing.import_transcript_file(path=claude_file(tmp_path, lines), user=importer())

    assert result.outcome == "new"
    assert [line for line, _ in problems(result)] == list(range(allowed + 2, allowed + 5))
    assert all(OUT_OF_RANGE in message for _, message in problems(result))
    thread = Thread.objects.get()
    assert thread.output_tokens == MAX_THREAD_TOKENS
    pages_load(client, staff_user)


def test_codex_sums_cannot_pass_the_session_bound(tmp_path: Path) -> None:
    allowed = MAX_THREAD_TOKENS // MAX_LINE_TOKENS
    lines = [codex_prompt(1, "Add a test", "t1")]
    lines += [codex_record(second, MAX_LINE_TOKENS, 0) for second in range(2, allowed + 4)]
    result = importing.import_transcript_file(path=codex_file(tmp_path, lines), user=importer())

    assert len(result.problems) == 2
    assert Thread.objects.get().input_tokens == MAX_THREAD_TOKENS


@pytest.mark.parametrize("cost", ["1e300", "Infinity", "NaN", "-1"])
def test_an_absurd_recorded_cost_is_a_bad_line(tmp_path: Path, cost: str) -> None:
    line = json.dumps(assistant(3, {"input_tokens": 5}, costUSD=0)).replace(
        '"costUSD": 0', f'"costUSD": {cost}'
    )
    thread = parse_transcript(claude_file(tmp_path, [user("u1", 0, "Add a test"), line]))
    assert [p.line_number for p in thread.problems] == [2]
    assert thread.turns[0].recorded_cost_usd is None


def test_the_largest_cost_that_can_pass_fits_every_money_field(
    make_thread: Any, client: Any, staff_user: Any
) -> None:
    # What MAX_THREAD_COST_USD says: every token of a session at the dearest price allowed.
    largest = Decimal(MAX_THREAD_COST_USD).quantize(Decimal("0.000001"))
    for model in apps.get_app_config("replays").get_models():
        for field in model._meta.get_fields():
            if isinstance(field, models.DecimalField):
                whole_digits = field.max_digits - field.decimal_places
                assert len(str(int(largest))) <= whole_digits, (model.__name__, field.name)
    thread = make_thread(cost=largest / 2, turns=2)
    thread.refresh_from_db()
    assert thread.cost_usd == largest
    pages_load(client, staff_user)
    assert client.get(f"/api/threads/{thread.pk}/").json()["cost_usd"] == float(largest)
    thread.delete()


# --- 10: text, timestamps, ids and field lengths ----------------------------------------


@pytest.mark.parametrize(
    ("bad", "kept"), [("\ud83d", "\ufffd"), ("\x00", "")], ids=["lone-surrogate", "NUL"]
)
def test_unstorable_characters_are_cleaned_and_the_rest_of_the_text_kept(
    tmp_path: Path, bad: str, kept: str
) -> None:
    # Node cuts an emoji in half and writes the half as an escape ("\ud83d"); PostgreSQL
    # takes no NUL in text or JSON.
    path = claude_file(
        tmp_path,
        [
            user(
                "u1",
                0,
                f"Fix the 😀 parser{bad} please",
                cwd=f"/home/{bad}app",
                gitBranch=f"ma{bad}in",
            ),
            assistant(3, {"input_tokens": 5}, model=f"claude-{bad}sonnet-4-5"),
        ],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new", result.error
    turn = Turn.objects.get()
    assert turn.request == f"Fix the 😀 parser{kept} please"
    assert turn.models_used == [f"claude-{kept}sonnet-4-5"] == list(turn.usage_by_model)
    assert (turn.cost_usd is not None) == (turn.models_used == [MODEL])
    thread = Thread.objects.get()
    assert (thread.cwd, thread.git_branch) == (f"/home/{kept}app", f"ma{kept}in")


def test_a_lone_surrogate_in_a_codex_prompt_is_replaced(tmp_path: Path) -> None:
    path = codex_file(tmp_path, [codex_prompt(1, "Rename \udfff it", "t1"), codex_record(2, 4)])
    result = importing.import_transcript_file(path=path, user=importer())
    assert result.outcome == "new", result.error
    assert Turn.objects.get().request == "Rename \ufffd it"


def test_nul_in_a_codex_session_is_removed(tmp_path: Path) -> None:
    lines = [codex_prompt(1, "Do\u0000 it", "t\u00001"), codex_record(2, 4)]
    path = codex_file(tmp_path, lines, session="sess\u0000ion")
    result = importing.import_transcript_file(path=path, user=importer())
    assert result.outcome == "new", result.error
    thread = Thread.objects.get()
    assert thread.session_id == "session"
    assert thread.turns.get().request == "Do it"


@pytest.mark.parametrize(
    "timestamp",
    [
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T23:59:59Z",
    ],
)
def test_a_timestamp_that_cannot_be_represented_is_a_bad_line(
    tmp_path: Path, timestamp: str
) -> None:
    odd = user("u2", 0, "Odd request")
    odd["timestamp"] = timestamp
    claude = claude_file(
        tmp_path, [user("u1", 0, "Add a test"), odd, assistant(5, {"input_tokens": 5})]
    )
    codex_line = codex_prompt(2, "Odd request")
    codex_line["timestamp"] = timestamp
    codex = codex_file(tmp_path, [codex_prompt(1, "Add a test", "t1"), codex_line])

    for path in (claude, codex):
        result = importing.import_transcript_file(path=path, user=importer())
        assert result.outcome == "new", result.error
        (problem,) = result.problems
        assert "timestamp" in problem.message
        assert list(result.thread.turns.values_list("request", flat=True)) == ["Add a test"]


def test_long_uuids_that_share_their_first_200_characters_stay_apart(tmp_path: Path) -> None:
    shared = "u" * 250
    path = claude_file(
        tmp_path,
        [
            user(shared + "-first", 0, "First"),
            user(shared + "-second", 1, "Second"),
            user("u3", 2, "Third"),
        ],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new", result.error
    uuids = list(Turn.objects.order_by("index").values_list("message_uuid", flat=True))
    assert len(set(uuids)) == 3
    assert all(len(uuid) <= MAX_MESSAGE_ID_CHARS for uuid in uuids)
    assert uuids[2] == "u3"
    # The same file always gives the same ids: a range named by them survives a re-import.
    again = [turn.message_uuid for turn in parse_transcript(path).turns]
    assert again == uuids


def test_a_derived_id_never_collides_with_a_real_one(tmp_path: Path) -> None:
    # Line 1 has no uuid: its id is derived from its line number ("line-1")...
    path = claude_file(
        tmp_path,
        [user(None, 0, "No uuid here"), user("line-1", 1, "A uuid that looks derived")],
    )
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "new", result.error
    uuids = list(Turn.objects.order_by("index").values_list("message_uuid", flat=True))
    assert len(set(uuids)) == 2


def test_codex_derived_ids_stay_unique_with_a_long_session_id(tmp_path: Path) -> None:
    session = "s" * 199  # within the column, but "<session>:<n>" is not
    lines = [
        codex_prompt(1, "First"),
        codex_prompt(2, "Second"),
        codex_prompt(3, "Third", f"{session}:0"),  # a real turn id shaped like a derived one
    ]
    result = importing.import_transcript_file(
        path=codex_file(tmp_path, lines, session=session), user=importer()
    )

    assert result.outcome == "new", result.error
    uuids = list(Turn.objects.order_by("index").values_list("message_uuid", flat=True))
    assert len(uuids) == 3 and len(set(uuids)) == 3
    assert all(len(uuid) <= MAX_MESSAGE_ID_CHARS for uuid in uuids)


@pytest.mark.parametrize("kind", ["claude_code", "codex"])
def test_a_session_id_over_the_column_length_refuses_the_file(tmp_path: Path, kind: str) -> None:
    session = "x" * 201
    if kind == "codex":
        path = codex_file(tmp_path, [codex_prompt(1, "Add a test", "t1")], session=session)
    else:
        path = claude_file(tmp_path, [user("u1", 0, "Add a test", sessionId=session)])
    result = importing.import_transcript_file(path=path, user=importer())

    assert result.outcome == "failed"
    assert path.name in result.error and "session id" in result.error
    assert Thread.objects.count() == 0


def test_import_threads_goes_on_after_a_file_that_fails(tmp_path: Path, monkeypatch) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()
    sane_session(folder, "a-session.jsonl")
    crashing = claude_file(
        folder, [user("u1", 0, "Crash", sessionId="crashing")], "b-crashing.jsonl"
    )
    refused = claude_file(folder, [user("u1", 0, "Long", sessionId="y" * 300)], "c-too-long.jsonl")
    codex = codex_file(folder, [codex_prompt(1, "Add a test", "t1")], session="codex-session")
    real_save = importing._save_thread

    def save_or_crash(parsed: Any, **kwargs: Any) -> Any:
        if parsed.session_id == "crashing":
            raise RuntimeError("the disk is full")
        return real_save(parsed, **kwargs)

    monkeypatch.setattr(importing, "_save_thread", save_or_crash)
    out, err = io.StringIO(), io.StringIO()
    with pytest.raises(CommandError, match="2 of 4 files could not be imported"):
        call_command(
            "import_threads", "--user", importer().username, str(folder), stdout=out, stderr=err
        )

    assert "4 files: 2 new, 0 updated, 0 unchanged, 2 failed" in out.getvalue()
    assert f"{crashing}" in err.getvalue() and "the disk is full" in err.getvalue()
    assert f"{refused.name}" in err.getvalue() and "session id" in err.getvalue()
    assert set(Thread.objects.values_list("session_id", flat=True)) == {SESSION, "codex-session"}
    assert codex.exists()


def uploads(settings: Any) -> list[Path]:
    folder = settings.REPLAYS_VAR_DIR / "uploads"
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.exists() else []


def hostile_upload() -> bytes:
    # A session id no column can hold: refused, whichever database.
    line = user("u1", 0, "Add a test", sessionId="z" * 300)
    return (json.dumps(line) + "\n").encode()


def test_a_refused_api_upload_leaves_no_file(api_client: Any, settings: Any) -> None:
    response = api_client.post(
        "/api/threads/import",
        {"file": SimpleUploadedFile("hostile.jsonl", hostile_upload())},
        format="multipart",
    )
    assert response.status_code == 400
    assert "session id" in response.json()["error"]["message"]
    assert uploads(settings) == []


def test_a_refused_page_upload_leaves_no_file(logged_in_client: Any, settings: Any) -> None:
    response = logged_in_client.post(
        reverse("replays:thread-upload"),
        {"transcript": SimpleUploadedFile("hostile.jsonl", hostile_upload())},
    )
    assert response.status_code == 400
    assert "session id" in response.content.decode()
    assert uploads(settings) == []


def test_an_upload_that_crashes_leaves_no_file(tmp_path: Path, settings: Any, monkeypatch) -> None:
    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the disk is full")

    monkeypatch.setattr(importing, "_save_thread", crash)
    content = sane_session(tmp_path).read_bytes()
    with pytest.raises(RuntimeError):
        importing.import_uploaded_transcript(
            upload=io.BytesIO(content), filename="s.jsonl", user=importer()
        )
    assert uploads(settings) == []


def test_a_hostile_upload_is_imported_not_a_server_error(api_client: Any, settings: Any) -> None:
    lines = [
        user("u1", 0, "Fix \ud83d\u0000 it"),
        assistant(3, {"input_tokens": 2**64}),
        assistant(4, {"input_tokens": 9}),
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    response = api_client.post(
        "/api/threads/import",
        {"file": SimpleUploadedFile("hostile.jsonl", content)},
        format="multipart",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["thread"]["turns"][0]["request"] == "Fix \ufffd it"
    assert [p["line_number"] for p in body["lines_skipped"]] == [2]
    assert len(uploads(settings)) == 1


# --- 12: two files, one session ---------------------------------------------------------


def test_a_second_file_with_the_same_session_is_refused_naming_both(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = sane_session(tmp_path / "one")
    second = sane_session(tmp_path / "two", request="Something else entirely")

    for _ in range(2):  # a second run must not flip the thread over to the other file
        err = io.StringIO()
        with pytest.raises(CommandError, match="1 of 2 files could not be imported"):
            call_command(
                "import_threads",
                "--user",
                importer().username,
                str(first),
                str(second),
                stdout=io.StringIO(),
                stderr=err,
            )
        assert f"duplicate of {first}" in err.getvalue()
        assert str(second) in err.getvalue()
        thread = Thread.objects.get()
        assert thread.source_path == str(first)
        assert list(thread.turns.values_list("request", flat=True)) == ["Add a test"]


def test_the_recorded_file_wins_whichever_order_the_files_come_in(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = sane_session(tmp_path / "one")
    second = sane_session(tmp_path / "two", request="Something else entirely")
    assert importing.import_transcript_file(path=first, user=importer()).outcome == "new"

    result = importing.import_transcript_file(path=second, user=importer())
    assert result.outcome == "failed"
    assert str(first) in result.error and str(second) in result.error
    assert Thread.objects.get().source_path == str(first)


def test_an_identical_copy_neither_fails_nor_moves_the_thread(tmp_path: Path) -> None:
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    first = sane_session(tmp_path / "one")
    copy = sane_session(tmp_path / "two")
    for _ in range(2):
        out, _ = run_import(first, copy)
        assert "2 files: " in out and "0 failed" in out
        assert Thread.objects.get().source_path == str(first)


def test_a_moved_and_grown_file_takes_over_from_its_old_path(tmp_path: Path) -> None:
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    old = sane_session(tmp_path / "old")
    importing.import_transcript_file(path=old, user=importer())
    old.unlink()
    new = claude_file(
        tmp_path / "new",
        [
            user("u1", 0, "Add a test"),
            assistant(5, {"input_tokens": 1000, "output_tokens": 200}),
            user("u2", 9, "And document it"),
        ],
    )
    assert importing.import_transcript_file(path=new, user=importer()).outcome == "updated"
    thread = Thread.objects.get()
    assert thread.source_path == str(new) and thread.turn_count == 2


# --- and the rest of what a hostile file can do ------------------------------------------


def test_the_parsers_message_id_bound_is_the_columns_length() -> None:
    assert Turn._meta.get_field("message_uuid").max_length == MAX_MESSAGE_ID_CHARS


def test_a_price_table_holds_no_price_beyond_the_bound() -> None:
    def table(input_price: str) -> dict[str, Any]:
        return {
            "source": "test",
            "date": "2026-01-01",
            "prices": {"m": {"input": input_price, "output": "1"}},
        }

    with pytest.raises(ValueError, match="the price of m"):
        pricing.price_table_from_dict(table("20000"))
    with pytest.raises(ValueError, match="above"):
        pricing.price_table_from_dict(table("6000"))  # its 1h cache write would be 12000
    assert pricing.price_table_from_dict(table("5000")).lookup("m") is not None
    litellm = {
        "sane": {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05},
        "typo": {"input_cost_per_token": 3.0, "output_cost_per_token": 1.5e-05},
    }
    assert set(pricing.price_table_from_litellm(litellm, source="test").prices) == {"sane"}


def test_line_types_of_the_wrong_type_are_skipped_not_a_crash(tmp_path: Path) -> None:
    first = {"type": [], "sessionId": SESSION, "uuid": "x"}
    claude = claude_file(
        tmp_path,
        [first, user("u1", 0, "Add a test"), {"type": {"a": 1}, "uuid": "y"}, assistant(3, {})],
    )
    assert [t.request for t in parse_transcript(claude).turns] == ["Add a test"]
    odd = codex_prompt(2, "ignored")
    odd["payload"]["type"] = ["user_message"]
    codex = codex_file(
        tmp_path,
        [{"timestamp": "x", "type": [], "payload": {}}, codex_prompt(1, "Add a test", "t1"), odd],
    )
    assert [t.request for t in parse_transcript(codex).turns] == ["Add a test"]


def test_a_session_id_cannot_lead_the_sub_agent_search_elsewhere(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere" / "subagents"
    elsewhere.mkdir(parents=True)
    write(elsewhere / "agent.jsonl", [assistant(2, {"input_tokens": 777})])
    (tmp_path / "project").mkdir()
    path = claude_file(
        tmp_path / "project", [user("u1", 0, "Add a test", sessionId="../elsewhere")], "s.jsonl"
    )
    thread = parse_transcript(path)
    assert thread.turns[0].usage.input_tokens == 0


def test_a_file_name_that_is_not_utf8_is_refused_and_the_import_goes_on(tmp_path: Path) -> None:
    folder = tmp_path / "sessions"
    folder.mkdir()
    bad_name = folder / os.fsdecode(b"bad-\xff.jsonl")
    bad_name.write_bytes(sane_session(tmp_path).read_bytes())
    sane_session(folder, "z-good.jsonl", request="Another one").read_text()
    # The same session in both: the good one is imported, the other refused for its name.
    err = io.StringIO()
    with pytest.raises(CommandError, match="1 of 2 files"):
        call_command(
            "import_threads",
            "--user",
            importer().username,
            str(folder),
            stdout=io.StringIO(),
            stderr=err,
        )
    assert "not UTF-8" in err.getvalue()
    assert Thread.objects.get().source_path.endswith("z-good.jsonl")
