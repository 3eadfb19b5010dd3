"""Threads belong to who imported them: another user's thread is a 404 everywhere (pages,
API, planning), an upload with someone else's session id never touches their turns, and
every command imports for a user by one rule. Staff see all."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from rest_framework.test import APIClient

from replays import importing, planning
from replays.accounts import create_api_token
from replays.models import Thread
from tests.conftest import REAL_TRANSCRIPTS, manifest_session

pytestmark = pytest.mark.django_db

SESSION_FILE = REAL_TRANSCRIPTS / manifest_session("claude-line-count")["path"]


def api_for(user: User) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {create_api_token(user=user)[1]}")
    return api


def test_another_users_thread_is_not_found_in_pages_or_the_api(
    client: Any, user: User, other_user: User, staff_user: User
) -> None:
    theirs = importing.import_transcript_file(path=SESSION_FILE, user=other_user).thread
    client.force_login(user)
    assert client.get(f"/threads/{theirs.pk}/").status_code == 404
    assert theirs.title not in client.get("/").content.decode()
    api = api_for(user)
    assert api.get(f"/api/threads/{theirs.pk}/").status_code == 404
    assert api.get("/api/threads/").json()["count"] == 0
    # The owner and staff see it.
    assert api_for(other_user).get(f"/api/threads/{theirs.pk}/").status_code == 200
    assert api_for(staff_user).get("/api/threads/").json()["count"] == 1


def test_an_upload_with_someone_elses_session_id_leaves_their_turns_alone(
    user: User, other_user: User
) -> None:
    theirs = importing.import_transcript_file(path=SESSION_FILE, user=other_user).thread
    turns_before = list(theirs.turns.values_list("request", flat=True))
    # The same session, edited, uploaded by another user.
    edited = SESSION_FILE.read_text().replace("line_count", "DELETE_EVERYTHING")
    mine = importing.import_uploaded_transcript(
        upload=io.BytesIO(edited.encode()), filename="s.jsonl", user=user
    )
    assert mine.outcome == "new" and mine.thread.pk != theirs.pk
    assert mine.thread.owner == user
    assert list(theirs.turns.values_list("request", flat=True)) == turns_before
    assert Thread.objects.get(pk=theirs.pk).source_path == str(SESSION_FILE)


def test_a_plan_cannot_name_another_users_thread(user: User, other_user: User) -> None:
    theirs = importing.import_transcript_file(path=SESSION_FILE, user=other_user).thread
    with pytest.raises(planning.PlanInputError) as refused:
        planning.prepare_plan(
            owner=user,
            raw_configuration={"configurations": [{"thread_id": theirs.pk}], "models": ["empty"]},
        )
    assert refused.value.code == "unknown_thread"


def test_import_threads_imports_for_the_user_named_or_the_only_superuser(
    user: User, tmp_path: Path
) -> None:
    out = io.StringIO()
    call_command(
        "import_threads", str(SESSION_FILE), "--user", "alice", "--no-progress", stdout=out
    )
    assert Thread.objects.get().owner == user
    with pytest.raises(CommandError, match="--user NAME"):
        call_command("import_threads", str(SESSION_FILE), "--no-progress", stdout=io.StringIO())
    boss = User.objects.create_superuser("boss", "boss@example.com", "x")
    call_command("import_threads", str(SESSION_FILE), "--no-progress", stdout=io.StringIO())
    assert set(Thread.objects.values_list("owner__username", flat=True)) == {"alice", "boss"}
    assert Thread.objects.filter(owner=boss).count() == 1


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_existing_threads_to_their_importer_or_the_first_staff_user() -> None:
    executor = MigrationExecutor(connection)
    before = [("replays", "0004_wider_money_fields")]
    after = [("replays", "0005_thread_owner")]
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    OldUser = old.get_model("auth", "User")
    OldThread = old.get_model("replays", "Thread")
    importer = OldUser.objects.create(username="imp")
    staff = OldUser.objects.create(username="staff", is_staff=True)
    common = {"source_kind": "claude_code", "source_path": "/x", "source_sha256": "a" * 64,
              "source_size": 1}  # fmt: skip
    mine = OldThread.objects.create(session_id="s1", imported_by=importer, **common)
    nobodys = OldThread.objects.create(session_id="s2", imported_by=None, **common)
    executor = MigrationExecutor(connection)
    executor.migrate(after)
    new = executor.loader.project_state(after).apps.get_model("replays", "Thread")
    assert new.objects.get(pk=mine.pk).owner_id == importer.pk
    assert new.objects.get(pk=nobodys.pk).owner_id == staff.pk
    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
