"""The server-rendered pages: thread list, thread page, upload, and the formatters they use."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import override_settings
from django.urls import reverse

from replays.models import Thread
from replays.templatetags.replays_format import duration, short_path, tokens, tokens_short, usd

LIST_URL = reverse("replays:thread-list")
UPLOAD_URL = reverse("replays:thread-upload")


@pytest.fixture(autouse=True)
def _uploads_in_tmp(settings: Any, tmp_path: Path) -> None:
    # Uploaded transcripts are kept under the var folder: keep each test's own.
    settings.REPLAYS_VAR_DIR = tmp_path / "var"


def claude_transcript(
    *, session: str = "4c1f1f0e-1111-4222-8333-444455556666", requests: list[str] | None = None
) -> bytes:
    """A small but genuine-looking Claude Code session: user prompts each answered once."""
    lines: list[dict[str, Any]] = []
    parent = None
    for number, request in enumerate(requests or ["Add a --verbose flag to the CLI"], start=1):
        user_uuid = f"00000000-0000-4000-8000-{number:012d}"
        answer_uuid = f"00000000-0000-4000-9000-{number:012d}"
        common = {
            "sessionId": session,
            "cwd": "/home/alice/tooling",
            "gitBranch": "feature/verbose",
            "version": "2.1.197",
            "isSidechain": False,
            "userType": "external",
        }
        lines.append(
            {
                **common,
                "type": "user",
                "uuid": user_uuid,
                "parentUuid": parent,
                "timestamp": f"2026-11-02T10:{number:02d}:00.000Z",
                "message": {"role": "user", "content": request},
            }
        )
        lines.append(
            {
                **common,
                "type": "assistant",
                "uuid": answer_uuid,
                "parentUuid": user_uuid,
                "timestamp": f"2026-11-02T10:{number:02d}:42.000Z",
                "requestId": f"req_{number}",
                "message": {
                    "id": f"msg_{number}",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-sonnet-4-5-20250929",
                    "content": [{"type": "text", "text": "Done."}],
                    "stop_reason": "end_turn",
                    "usage": {
                        "input_tokens": 1200,
                        "output_tokens": 300,
                        "cache_read_input_tokens": 5000,
                        "cache_creation_input_tokens": 0,
                    },
                },
            }
        )
        parent = answer_uuid
    return "\n".join(json.dumps(line) for line in lines).encode() + b"\n"


def upload(client: Any, content: bytes, name: str = "session.jsonl") -> Any:
    return client.post(UPLOAD_URL, {"transcript": SimpleUploadedFile(name, content)})


def messages_of(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# --- Formatters ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (Decimal("1.234"), "$1.23"),
        (Decimal("1234.5"), "$1,234.50"),
        (Decimal("0.012345"), "$0.0123"),
        (Decimal("0.00004"), "$0.0000"),
        (Decimal("0"), "$0.00"),
        (0, "$0.00"),
        (Decimal("0.999999"), "$1.0000"),
        (2.5, "$2.50"),
    ],
)
def test_usd_formats_known_costs(value: object, expected: str) -> None:
    assert usd(value) == expected


def test_usd_shows_unknown_price_for_none_never_zero() -> None:
    text = usd(None)
    assert "unknown price" in text
    assert 'title="' in text
    assert "$" not in text


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (None, "—"),
        (0, "0s"),
        (0.4, "<1s"),
        (45, "45s"),
        (45.4, "45s"),
        (60, "1m"),
        (125, "2m 5s"),
        (3600, "1h"),
        (3780, "1h 3m"),
        (3805, "1h 3m"),
        (90000, "1d 1h"),
    ],
)
def test_duration_reads_like_a_person_would_say_it(seconds: object, expected: str) -> None:
    assert duration(seconds) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, "—"), (0, "0"), (999, "999"), (12345, "12,345"), (1234567, "1,234,567")],
)
def test_tokens_have_thousands_separators(value: object, expected: str) -> None:
    assert tokens(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(950, "950"), (12345, "12.3k"), (2000, "2k"), (4_500_000, "4.5M")]
)
def test_tokens_short_form(value: int, expected: str) -> None:
    assert tokens_short(value) == expected


def test_short_path_writes_home_as_tilde() -> None:
    assert short_path("/home/alice/code/app") == "~/code/app"
    assert short_path("/Users/bob") == "~"
    assert short_path("/srv/app") == "/srv/app"


# --- Login ---------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("url", [LIST_URL, UPLOAD_URL, "/threads/1/"])
def test_every_page_requires_login(client: Any, url: str) -> None:
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("login") + "?next=")


def test_thread_list_requires_login(client: Any, make_thread: Callable[..., Thread]) -> None:
    thread = make_thread(title="Secret work")
    response = client.get(LIST_URL)
    assert response.status_code == 302
    assert "Secret work" not in response.content.decode()
    assert client.get(thread.get_absolute_url()).status_code == 302


@pytest.mark.django_db
def test_upload_post_requires_login(client: Any) -> None:
    response = upload(client, claude_transcript())
    assert response.status_code == 302
    assert not Thread.objects.exists()


@pytest.mark.django_db
def test_login_page_renders_the_form(client: Any) -> None:
    response = client.get(reverse("login"))
    assert response.status_code == 200
    assert b'name="username"' in response.content and b'name="password"' in response.content


def test_login_then_logout(client: Any, user: Any) -> None:
    response = client.post(
        reverse("login"), {"username": "alice", "password": "correct-horse-battery"}
    )
    assert response.status_code == 302 and response["Location"] == LIST_URL
    page = client.get(LIST_URL).content.decode()
    assert "alice" in page and 'action="/accounts/logout/"' in page
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(LIST_URL).status_code == 302


def test_admin_link_only_for_staff(client: Any, user: Any, staff_user: Any) -> None:
    client.force_login(user)
    assert reverse("admin:index") not in client.get(LIST_URL).content.decode()
    client.force_login(staff_user)
    assert reverse("admin:index") in client.get(LIST_URL).content.decode()


def test_layout_links_to_upload_and_api_docs(logged_in_client: Any) -> None:
    page = logged_in_client.get(LIST_URL).content.decode()
    assert f'href="{UPLOAD_URL}"' in page
    assert 'href="/api/docs/"' in page


# --- Thread list ---------------------------------------------------------------------


def test_thread_list_shows_threads_with_their_numbers(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(
        title="Fix the flaky login test", turns=3, kind="codex", cwd="/home/alice/webapp"
    )
    response = logged_in_client.get(LIST_URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert "Fix the flaky login test" in page
    assert f'href="{thread.get_absolute_url()}"' in page
    assert "Codex" in page
    assert "~/webapp" in page
    assert "$0.75" in page  # 3 turns at $0.25
    assert "1m 30s" in page  # 3 turns of 30 s
    assert "450" in page  # 300 input + 150 output tokens


@pytest.mark.parametrize(
    ("kind", "label"),
    [("claude_code", "Claude Code"), ("codex", "Codex"), ("gemini", "Gemini CLI"),
     ("opencode", "OpenCode"), ("pi", "pi")],
)  # fmt: skip
def test_every_tool_is_named_by_its_name_on_the_list_and_the_thread(
    logged_in_client: Any, make_thread: Callable[..., Thread], kind: str, label: str
) -> None:
    thread = make_thread(title="Some work", kind=kind)
    for url in (LIST_URL, thread.get_absolute_url()):
        page = logged_in_client.get(url).content.decode()
        assert f'<span class="badge badge-{kind}">{label}</span>' in page


def test_empty_list_explains_how_to_import(logged_in_client: Any) -> None:
    page = logged_in_client.get(LIST_URL).content.decode()
    assert "No threads yet" in page
    assert f'href="{UPLOAD_URL}"' in page
    assert "python manage.py import_threads" in page


def test_search_matches_title(logged_in_client: Any, make_thread: Callable[..., Thread]) -> None:
    make_thread(title="Refactor the billing module")
    make_thread(title="Write release notes")
    page = logged_in_client.get(LIST_URL, {"q": "BILLING"}).content.decode()
    assert "Refactor the billing module" in page
    assert "Write release notes" not in page


def test_search_matches_request_text(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(
        title="First",
        requests=["please fix the segfault in parser.c", "thanks", "and the other one"],
        turns=3,
    )
    make_thread(title="Second", requests=["update the docs"], turns=1)
    response = logged_in_client.get(LIST_URL, {"q": "Segfault"})
    titles = [t.title for t in response.context["threads"]]
    assert titles == ["First"]


def test_search_matching_many_turns_lists_the_thread_once(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(
        title="Repeated", requests=["deploy it", "deploy it again", "deploy once more"], turns=3
    )
    response = logged_in_client.get(LIST_URL, {"q": "deploy"})
    assert [t.title for t in response.context["threads"]] == ["Repeated"]
    assert response.context["totals"].threads == 1


def test_search_matches_folder(logged_in_client: Any, make_thread: Callable[..., Thread]) -> None:
    make_thread(title="In the API repo", cwd="/home/alice/src/Payments-API")
    make_thread(title="Elsewhere", cwd="/home/alice/src/website")
    response = logged_in_client.get(LIST_URL, {"q": "payments-api"})
    assert [t.title for t in response.context["threads"]] == ["In the API repo"]


def test_search_without_matches_says_so(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Something")
    page = logged_in_client.get(LIST_URL, {"q": "nothing-like-this"}).content.decode()
    assert "No threads match" in page
    assert "No threads yet" not in page


def test_search_query_is_escaped(logged_in_client: Any, make_thread: Callable[..., Thread]) -> None:
    make_thread(title="Something")
    page = logged_in_client.get(LIST_URL, {"q": '<script>alert("q")</script>'}).content.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;" in page


def test_list_paginates_25_per_page(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    for _ in range(27):
        make_thread(turns=1)
    first = logged_in_client.get(LIST_URL)
    assert len(first.context["threads"]) == 25
    second = logged_in_client.get(LIST_URL, {"page": 2})
    assert len(second.context["threads"]) == 2
    # A page past the end shows the last page rather than an error.
    assert logged_in_client.get(LIST_URL, {"page": 99}).context["page"].number == 2


def test_pagination_keeps_the_query(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    for number in range(30):
        make_thread(title=f"Match {number}", turns=1)
    make_thread(title="Other", turns=1)
    response = logged_in_client.get(LIST_URL, {"q": "match & more"})
    assert response.context["totals"].threads == 0
    response = logged_in_client.get(LIST_URL, {"q": "Match"})
    page = response.content.decode()
    assert 'href="?q=Match&amp;page=2"' in page
    second = logged_in_client.get(LIST_URL, {"q": "Match", "page": 2})
    assert len(second.context["threads"]) == 5
    assert all(t.title.startswith("Match") for t in second.context["threads"])
    assert 'href="?q=Match&amp;page=1"' in second.content.decode()


def test_pagination_link_encodes_special_characters(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    for _ in range(26):
        make_thread(title="a&b c", turns=1)
    page = logged_in_client.get(LIST_URL, {"q": "a&b c"}).content.decode()
    assert 'href="?q=a%26b%20c&amp;page=2"' in page


def test_totals_summarise_all_matching_threads(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    for _ in range(26):
        make_thread(turns=2, cost=Decimal("0.5"))  # $1.00 and 300 tokens each
    response = logged_in_client.get(LIST_URL)
    totals = response.context["totals"]
    assert totals.threads == 26
    assert totals.known_cost == Decimal("26")
    assert totals.tokens == 26 * 300
    page = response.content.decode()
    assert "$26.00" in page
    assert "7,800" in page


def test_unknown_cost_is_not_shown_as_zero(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Unpriced model", cost=None)
    page = logged_in_client.get(LIST_URL).content.decode()
    assert "unknown price" in page
    assert "$0" not in page


def test_known_zero_cost_is_shown_as_zero(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Free", cost=Decimal("0"))
    page = logged_in_client.get(LIST_URL).content.decode()
    assert "$0.00" in page
    assert "unknown price" not in page


def test_totals_with_some_unknown_costs_count_them_apart(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(turns=1, cost=Decimal("2"))
    make_thread(turns=1, cost=None)
    response = logged_in_client.get(LIST_URL)
    totals = response.context["totals"]
    assert totals.known_cost == Decimal("2")
    assert totals.unknown_cost_threads == 1
    assert "+ 1 unknown" in response.content.decode()


def test_thread_titles_are_escaped_in_the_list(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="<img src=x onerror=alert(1)>")
    page = logged_in_client.get(LIST_URL).content.decode()
    assert "<img src=x" not in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page


# --- Thread page ---------------------------------------------------------------------


def test_thread_page_lists_turns_with_tokens_and_cost(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(
        title="Add dark mode", turns=2, requests=["Add a dark mode toggle", "Now persist it"]
    )
    Thread.objects.filter(pk=thread.pk).update(git_commit="a" * 40, cli_version="2.1.197")
    turn = thread.turns.get(index=1)
    turn.cache_read_tokens = 12345
    turn.cache_write_5m_tokens = 2000
    turn.cache_write_1h_tokens = 700
    turn.cost_usd = Decimal("1.5")
    turn.seconds = 125
    turn.save()

    response = logged_in_client.get(thread.get_absolute_url())
    assert response.status_code == 200
    page = response.content.decode()
    assert "Add dark mode" in page
    assert thread.session_id in page
    assert "/home/alice/project" in page
    assert "2.1.197" in page and "aaaaaaaaaaaa" in page
    assert "claude-sonnet-4-5" in page
    assert page.index("Add a dark mode toggle") < page.index("Now persist it")
    assert 'id="turn-1"' in page and 'id="turn-2"' in page
    for text in ["12,345", "2,000", "700", "$1.50", "$0.25", "2m 5s", "30s", "Cache write 1h"]:
        assert text in page, text


def test_thread_page_shows_unknown_price_per_turn(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=1, cost=None)
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert page.count(">unknown price<") >= 2  # the thread total and the turn
    assert "$0" not in page


def test_html_in_a_request_is_escaped(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(
        turns=1, requests=['<script>alert("owned")</script>\n  indented & <b>bold</b>']
    )
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert "<script>alert" not in page
    assert (
        "&lt;script&gt;alert(&quot;owned&quot;)&lt;/script&gt;\n"
        "  indented &amp; &lt;b&gt;bold&lt;/b&gt;" in page
    )


def test_long_request_is_collapsed_after_twenty_lines(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    long_request = "\n".join(f"log line {n}" for n in range(1, 61))
    thread = make_thread(turns=2, requests=[long_request, "short"])
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert page.count("<details") == 1
    assert "Show 40 more lines" in page
    # Every line is on the page, in order; the 21st starts the collapsed part.
    positions = [page.index(f"log line {n}\n" if n < 60 else "log line 60") for n in range(1, 61)]
    assert positions == sorted(positions)
    assert page.index("<details") < page.index("log line 21\n")
    assert page.index("log line 20\n") < page.index("<details")


def test_long_single_line_request_is_collapsed_too(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=1, requests=["x" * 10_000])
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert "Show the rest (6,000 more characters)" in page
    # The preview and the rest together hold the request once.
    assert [len(run) for run in re.findall("x{100,}", page)] == [4000, 6000]


def test_short_request_is_not_collapsed(
    logged_in_client: Any, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=1, requests=["\n".join(["line"] * 22)])
    page = logged_in_client.get(thread.get_absolute_url()).content.decode()
    assert "<details" not in page


def test_unknown_thread_is_404(logged_in_client: Any) -> None:
    assert logged_in_client.get(reverse("replays:thread-detail", args=[999999])).status_code == 404


# --- Upload --------------------------------------------------------------------------


def test_upload_page_shows_the_form(logged_in_client: Any) -> None:
    response = logged_in_client.get(UPLOAD_URL)
    assert response.status_code == 200
    page = response.content.decode()
    assert 'enctype="multipart/form-data"' in page and 'type="file"' in page
    assert "python manage.py import_threads" in page


def test_upload_of_a_claude_code_transcript_creates_the_thread(
    logged_in_client: Any, user: Any
) -> None:
    content = claude_transcript(requests=["Add a --verbose flag to the CLI", "Also document it"])
    response = upload(logged_in_client, content)
    thread = Thread.objects.get()
    assert response.status_code == 302
    assert response["Location"] == thread.get_absolute_url()
    assert thread.source_kind == "claude_code"
    assert thread.turn_count == 2
    assert thread.owner == user

    page = logged_in_client.get(response["Location"])
    assert any(re.search(r"^Imported .+: 2 turns\.$", m) for m in messages_of(page))
    text = page.content.decode()
    assert "Add a --verbose flag to the CLI" in text and "Also document it" in text
    assert "6,500" in text  # 1,200 in + 300 out + 5,000 cache read, one turn


def test_reupload_of_the_same_transcript_says_unchanged(logged_in_client: Any) -> None:
    content = claude_transcript()
    first = upload(logged_in_client, content)
    logged_in_client.get(first["Location"])  # consume the first message
    again = upload(logged_in_client, content)
    assert again.status_code == 302 and again["Location"] == first["Location"]
    assert Thread.objects.count() == 1
    messages = messages_of(logged_in_client.get(again["Location"]))
    assert any("already imported, unchanged" in m for m in messages)


def test_upload_of_a_grown_transcript_updates_the_thread(logged_in_client: Any) -> None:
    first = upload(logged_in_client, claude_transcript(requests=["one"]))
    logged_in_client.get(first["Location"])
    second = upload(logged_in_client, claude_transcript(requests=["one", "two"]))
    assert second["Location"] == first["Location"]
    thread = Thread.objects.get()
    assert thread.turn_count == 2
    messages = messages_of(logged_in_client.get(second["Location"]))
    assert any(m.startswith("Imported") and "2 turns" in m for m in messages)


def test_upload_with_bad_lines_warns_with_their_numbers(logged_in_client: Any) -> None:
    good = claude_transcript().decode().splitlines()
    content = "\n".join([good[0], "{not json", good[1], "also not json"]).encode() + b"\n"
    response = upload(logged_in_client, content)
    assert response.status_code == 302
    messages = messages_of(logged_in_client.get(response["Location"]))
    warning = next(m for m in messages if m.startswith("Skipped"))
    assert "line 2" in warning and "line 4" in warning


def test_upload_warning_lists_at_most_ten_problems(logged_in_client: Any) -> None:
    good = claude_transcript().decode().splitlines()
    content = "\n".join(good + [f"garbage {n}" for n in range(15)]).encode() + b"\n"
    response = upload(logged_in_client, content)
    messages = messages_of(logged_in_client.get(response["Location"]))
    warning = next(m for m in messages if m.startswith("Skipped"))
    assert warning.startswith("Skipped 15 lines")
    assert warning.count("line ") == 10
    assert warning.endswith("and 5 more.")


def test_upload_of_a_non_transcript_shows_the_error(logged_in_client: Any) -> None:
    response = upload(logged_in_client, b"just some notes, not a transcript\n", name="notes.txt")
    assert response.status_code == 400
    page = response.content.decode()
    assert "notes.txt" in page
    assert "not a session file of Claude Code, Codex, Gemini CLI, OpenCode or pi" in page
    assert not Thread.objects.exists()


def test_upload_error_text_is_escaped(logged_in_client: Any) -> None:
    response = upload(logged_in_client, b"plain text\n", name="<b>x</b>.jsonl")
    assert response.status_code == 400
    assert "<b>x</b>" not in response.content.decode()


def test_upload_without_a_file_is_refused(logged_in_client: Any) -> None:
    response = logged_in_client.post(UPLOAD_URL, {})
    assert response.status_code == 400
    assert "This field is required" in response.content.decode()


def test_upload_of_an_empty_file_is_refused(logged_in_client: Any) -> None:
    response = upload(logged_in_client, b"")
    assert response.status_code == 400
    assert "empty" in response.content.decode()


def test_upload_larger_than_the_limit_is_refused(logged_in_client: Any) -> None:
    content = claude_transcript(requests=["x" * 3000])
    with override_settings(REPLAYS_MAX_TRANSCRIPT_BYTES=2048):
        response = upload(logged_in_client, content)
    assert response.status_code == 400
    page = response.content.decode()
    size = f"{len(content) / 1024:.1f} KiB"
    assert f"session.jsonl is {size}, larger than the transcript limit of 2.0 KiB." in page
    assert not Thread.objects.exists()


def test_upload_far_beyond_the_limit_is_refused_before_it_is_read(logged_in_client: Any) -> None:
    content = claude_transcript(requests=["x" * 200_000])
    with override_settings(REPLAYS_MAX_TRANSCRIPT_BYTES=2048):
        response = upload(logged_in_client, content)
    assert response.status_code == 413
    assert "limit" in response.content.decode()
    assert not Thread.objects.exists()


def test_import_message_escapes_the_title(logged_in_client: Any) -> None:
    response = upload(logged_in_client, claude_transcript(requests=["<i>fix</i> the <script>"]))
    page = logged_in_client.get(response["Location"]).content.decode()
    assert "<i>fix</i>" not in page and "<script>" not in page
    assert "&lt;i&gt;fix&lt;/i&gt;" in page
