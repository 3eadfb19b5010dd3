"""A run's whole agent log is in the database: any machine (and a run folder that is gone)
still shows it, through the page and the API; a very long log keeps its end."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from replays import runlogs, supervision
from replays.models import Run, RunLog, RunStatus
from tests.test_dispatch import Lab, finished, make_lab, wait_until

LINES = 5000  # far more than the tail a run keeps on its row
CHATTY = [sys.executable, "-c", f"for i in range({LINES}): print(f'line {{i}} of the agent')"]


@pytest.fixture
def chatty(
    process_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Lab:
    """The dispatch lab with one more agent, `chatty:m1`, that prints LINES lines."""
    lab = make_lab(process_env, tmp_path, monkeypatch, settings)
    agents_file = Path(lab.env["REPLAYS_AGENTS_FILE"])
    agents = json.loads(agents_file.read_text())
    agents["chatty"] = {"kind": "command", "models": ["m1"], "command": CHATTY}
    agents_file.write_text(json.dumps(agents))
    settings.REPLAYS_AGENTS = agents
    return lab


def ended_run(lab: Lab, user: User) -> Run:
    _, [run] = lab.batch(user, ["chatty:m1"])
    supervision.dispatch_runs()
    wait_until(lambda: finished(run), seconds=60, what="the run to end")
    run.refresh_from_db()
    assert run.status == RunStatus.COMPLETED, run.failure_message
    return run


def test_the_whole_log_is_served_from_the_database_when_the_run_folder_is_gone(
    chatty: Lab, user: User, other_user: User, client: Any
) -> None:
    run = ended_run(chatty, user)
    assert "line 4999 of the agent" in run.log_tail and "line 0 of" not in run.log_tail
    shutil.rmtree(chatty.run_dir(run))  # another machine's cache, or cleaned up

    api = APIClient()
    api.force_authenticate(user)
    answer = api.get(f"/api/runs/{run.pk}/log")
    assert answer.status_code == 200 and answer["Content-Type"].startswith("text/plain")
    lines = answer.content.decode().splitlines()
    assert lines == [f"line {i} of the agent" for i in range(LINES)]

    client.force_login(user)
    page = client.get(f"/runs/{run.pk}/")
    assert f'href="/runs/{run.pk}/log/"' in page.content.decode()
    assert client.get(f"/runs/{run.pk}/log/").content == answer.content

    # Another user's run does not exist for them.
    api.force_authenticate(other_user)
    assert api.get(f"/api/runs/{run.pk}/log").status_code == 404
    client.force_login(other_user)
    assert client.get(f"/runs/{run.pk}/log/").status_code == 404


def test_a_log_longer_than_the_limit_keeps_its_end_and_says_so(
    chatty: Lab, user: User, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPLAYS_MAX_LOG_BYTES", "2048")  # the coordinator started from here
    run = ended_run(chatty, user)
    stored = RunLog.objects.get(run=run)
    assert stored.cut > 0 and stored.size - stored.cut == 2048
    settings.REPLAYS_MAX_LOG_BYTES = 2048
    text = runlogs.log_text(run)
    assert text is not None
    first, *rest = text.splitlines()
    assert first.startswith(f"[replays] The first {stored.cut:,} bytes of this log are left out")
    assert rest[-1] == f"line {LINES - 1} of the agent"


def test_a_run_without_a_log_is_a_404_that_says_so(user: User) -> None:
    from tests.test_reconcile import one_run

    run = one_run(user)
    api = APIClient()
    api.force_authenticate(user)
    answer = api.get(f"/api/runs/{run.pk}/log")
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "no_log"
