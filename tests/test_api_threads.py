from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from replays.models import Thread

pytestmark = pytest.mark.django_db


def claude_line(kind: str, uuid: str, ts: str, message: dict, **extra: object) -> str:
    return json.dumps(
        {
            "type": kind,
            "uuid": uuid,
            "parentUuid": None,
            "sessionId": "api-session",
            "timestamp": ts,
            "cwd": "/home/alice/app",
            "gitBranch": "main",
            "version": "2.1.197",
            "isSidechain": False,
            "message": message,
            **extra,
        }
    )


def small_transcript(extra_request: str = "") -> bytes:
    lines = [
        claude_line(
            "user", "u1", "2026-11-01T10:00:00.000Z", {"role": "user", "content": "Add a test"}
        ),
        claude_line(
            "assistant",
            "a1",
            "2026-11-01T10:00:05.000Z",
            {
                "id": "msg_1",
                "model": "claude-sonnet-4-5",
                "role": "assistant",
                "content": [{"type": "text", "text": "Done."}],
                "usage": {
                    "input_tokens": 1000,
                    "output_tokens": 200,
                    "cache_read_input_tokens": 0,
                    "cache_creation_input_tokens": 0,
                },
            },
            requestId="req_1",
        ),
    ]
    if extra_request:
        lines.append(
            claude_line(
                "user", "u2", "2026-11-01T10:01:00.000Z", {"role": "user", "content": extra_request}
            )
        )
    return ("\n".join(lines) + "\n").encode()


def upload(api: APIClient, content: bytes, name: str = "session.jsonl"):
    return api.post(
        "/api/threads/import", {"file": SimpleUploadedFile(name, content)}, format="multipart"
    )


def test_api_needs_authentication(client) -> None:
    response = client.get("/api/threads/")
    assert response.status_code in (401, 403)
    assert response.json()["error"]["code"] in ("not_authenticated", "permission_denied")


def test_thread_list_is_paginated(
    api_client: APIClient, make_thread: Callable[..., Thread]
) -> None:
    for _ in range(55):
        make_thread(turns=1)
    first = api_client.get("/api/threads/").json()
    assert first["count"] == 55
    assert len(first["results"]) == 50
    assert first["previous"] is None and first["next"]
    second = api_client.get(first["next"]).json()
    assert len(second["results"]) == 5


def test_thread_list_search_matches_title_folder_and_request(
    api_client: APIClient, make_thread: Callable[..., Thread]
) -> None:
    make_thread(title="Fix the login bug")
    make_thread(cwd="/srv/billing-service")
    make_thread(requests=["please refactor the parser", "thanks"])
    make_thread(title="Unrelated")

    def titles(term: str) -> int:
        return api_client.get("/api/threads/", {"search": term}).json()["count"]

    assert titles("LOGIN") == 1
    assert titles("billing") == 1
    assert titles("refactor the parser") == 1
    assert titles("nothing like this") == 0


def test_thread_detail_lists_turns(
    api_client: APIClient, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(turns=3, cost=Decimal("0.5"))
    body = api_client.get(f"/api/threads/{thread.pk}/").json()
    assert [turn["index"] for turn in body["turns"]] == [0, 1, 2]
    turn = body["turns"][0]
    assert set(turn) == {
        "message_uuid",
        "index",
        "timestamp",
        "request",
        "request_as_sent",
        "rolled_back",
        "models",
        "tokens",
        "cost_usd",
        "priced_as",
        "seconds",
        "model_seconds",
    }
    assert turn["tokens"]["input"] == 100 and turn["tokens"]["total"] == 150
    assert turn["cost_usd"] == 0.5
    assert body["cost_usd"] == 1.5


def test_unknown_cost_is_null_not_zero(
    api_client: APIClient, make_thread: Callable[..., Thread]
) -> None:
    thread = make_thread(cost=None)
    body = api_client.get(f"/api/threads/{thread.pk}/").json()
    assert body["cost_usd"] is None
    assert body["turns"][0]["cost_usd"] is None


def test_unknown_thread_is_404_with_the_error_shape(api_client: APIClient) -> None:
    response = api_client.get("/api/threads/999999/")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_import_new_then_unchanged_then_changed(api_client: APIClient) -> None:
    first = upload(api_client, small_transcript())
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["outcome"] == "new"
    assert body["thread"]["session_id"] == "api-session"
    assert len(body["thread"]["turns"]) == 1
    assert body["thread"]["turns"][0]["tokens"]["input"] == 1000

    again = upload(api_client, small_transcript())
    assert again.status_code == 200
    assert again.json()["outcome"] == "unchanged"

    grown = upload(api_client, small_transcript(extra_request="And document it"))
    assert grown.status_code == 201
    assert grown.json()["outcome"] == "updated"
    assert len(grown.json()["thread"]["turns"]) == 2
    assert Thread.objects.count() == 1


def test_import_refuses_a_file_that_is_not_a_transcript(api_client: APIClient) -> None:
    response = upload(api_client, b"# Just a README\n\nNothing to see.\n", name="README.md")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "not_a_transcript"
    assert "README.md" in error["message"]
    assert Thread.objects.count() == 0


def test_import_without_a_file_is_400(api_client: APIClient) -> None:
    response = api_client.post("/api/threads/import", {}, format="multipart")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["file"]


def test_import_refuses_a_file_over_the_limit_with_413(api_client: APIClient, settings) -> None:
    settings.REPLAYS_MAX_TRANSCRIPT_BYTES = 2048
    response = upload(api_client, small_transcript() + b" " * 4096)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"
    assert Thread.objects.count() == 0


def test_request_bodies_over_two_mebibytes_are_refused_with_413(api_client: APIClient) -> None:
    response = api_client.post(
        "/api/threads/", data="x" * (2 * 1024 * 1024 + 1), content_type="application/json"
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"


def test_import_reports_skipped_lines(api_client: APIClient) -> None:
    content = small_transcript().replace(b"\n", b"\n{not json\n", 1)
    body = upload(api_client, content).json()
    assert body["lines_skipped"][0]["line_number"] == 2


def test_schema_is_served(api_client: APIClient) -> None:
    response = api_client.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    paths = json.loads(response.content)["paths"]
    assert {"/api/threads/", "/api/threads/{id}/", "/api/threads/import"} <= set(paths)


def test_docs_page_uses_local_assets(client, user) -> None:
    client.force_login(user)
    html = client.get("/api/docs/").content.decode()
    assert "swagger-ui" in html
    assert "cdn.jsdelivr" not in html
