"""The Run columns that copy keys of its configuration (repository, the range's first and
last message, the context): the leaderboard filters and groups on them, so they must say
what the configuration says on every path that writes one (approval; migration 0011 for
the runs that existed before)."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from rest_framework.test import APIClient

from replays.models import Run, Thread
from tests.test_plans import approve, line_count_config, prepare

pytestmark = pytest.mark.django_db

BEFORE = [("replays", "0010_thread_source_mtime")]
AFTER = [("replays", "0011_run_configuration_columns")]


def test_approval_writes_the_columns_from_each_runs_configuration(
    api_client: APIClient, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    assert approve(api_client, plan).status_code == 201
    runs = list(Run.objects.all())
    assert len(runs) == 2
    first = real_threads["claude-line-count"].turns.get(index=0).message_uuid
    for run in runs:
        config = run.configuration
        assert (run.repository, run.start_message_uuid, run.end_message_uuid, run.context) == (
            config["repository"],
            config["start_message_uuid"],
            config["end_message_uuid"],
            config["context"],
        )
        assert run.repository == str(sample_repo)
        assert run.start_message_uuid == first
    # What a person sees: the repository is offered as a leaderboard filter, and keeps them.
    available = api_client.get("/api/leaderboard/filters").json()["available"]
    assert available["repository"] == [{"value": str(sample_repo), "count": 2}]
    filtered = api_client.get("/api/leaderboard/filters", {"repository": str(sample_repo)})
    assert filtered.status_code == 200


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_the_columns_of_existing_runs_from_their_configuration() -> None:
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    old = executor.loader.project_state(BEFORE).apps
    User = old.get_model("auth", "User")
    OldThread = old.get_model("replays", "Thread")
    OldBatch = old.get_model("replays", "Batch")
    OldRun = old.get_model("replays", "Run")
    owner = User.objects.create(username="owner")
    thread = OldThread.objects.create(
        owner=owner, source_kind="claude_code", session_id="s", source_path="/x",
        source_sha256="a" * 64, source_size=1,
    )  # fmt: skip
    now = timezone.now()
    plan = old.get_model("replays", "Plan").objects.create(
        owner=owner, configuration={}, fingerprint="0" * 64, status="ready_for_approval",
        token_hash="1" * 64, created_at=now, expires_at=now + timedelta(minutes=5),
    )  # fmt: skip
    batch = OldBatch.objects.create(
        plan=plan, owner=owner, thread_count=1, evaluator="tests", approved_at=now
    )
    full = OldRun.objects.create(
        batch=batch,
        thread=thread,
        model="claude:a",
        configuration={
            "repository": "/srv/repo",
            "start_message_uuid": "u-1",
            "end_message_uuid": "u-3",
            "context": "digest",
        },
    )
    # Older configurations may lack keys: no repository, no range, cold by default.
    bare = OldRun.objects.create(batch=batch, thread=thread, model="claude:b", configuration={})

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    NewRun = executor.loader.project_state(AFTER).apps.get_model("replays", "Run")
    columns = ("repository", "start_message_uuid", "end_message_uuid", "context")
    assert NewRun.objects.values_list(*columns).get(pk=full.pk) == (
        "/srv/repo",
        "u-1",
        "u-3",
        "digest",
    )
    assert NewRun.objects.values_list(*columns).get(pk=bare.pk) == ("", "", "", "cold")
    MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
