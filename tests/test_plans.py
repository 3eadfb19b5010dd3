"""Prepare and approve through the API: single-use approvals and every refusal."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from replays import importing, repos
from replays.accounts import create_api_token
from replays.models import Batch, Plan, Run, RunStatus, Thread
from tests.conftest import manifest_session

pytestmark = pytest.mark.django_db

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"


def line_count_config(threads: dict[str, Thread], repo: Path, **extra: Any) -> dict[str, Any]:
    thread = threads["claude-line-count"]
    first = thread.turns.get(index=0)
    return {
        "configurations": [
            {
                "thread_id": thread.pk,
                "start_message_uuid": first.message_uuid,
                "repository": str(repo),
            }
        ],
        "models": ["historical", "empty"],
        **extra,
    }


def prepare(api: APIClient, configuration: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/api/plans/", configuration, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def approve(api: APIClient, plan: dict[str, Any], **overrides: Any) -> Any:
    body = {
        "approved": True,
        "prepare_token": plan["approval"]["prepare_token"],
        "run_config": plan["run_config"],
        **overrides,
    }
    return api.post(f"/api/plans/{plan['id']}/approve", body, format="json")


def test_prepare_resolves_baseline_ending_and_historical_result(
    api_client: APIClient, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    assert plan["status"] == "ready_for_approval" and plan["ready"] is True
    assert plan["approval"] == {
        "required": True,
        "prompt": "Approve 1 thread using 2 models?",
        "prepare_token": plan["approval"]["prepare_token"],
    }
    assert len(plan["approval"]["prepare_token"]) >= 43
    [prep] = plan["preparations"]
    turn = manifest_session("claude-line-count")["turns"][0]
    assert prep["baseline_commit"] == turn["head_before"]
    assert prep["ending_commit"] == turn["commit_after"]
    expected = repos.sha256_text(
        repos.historical_diff(sample_repo, turn["head_before"], turn["commit_after"])
    )
    assert prep["historical_result_sha256"] == expected
    assert set(prep["prepared_configuration_sha256"]) == {"historical", "empty"}
    assert prep["blockers"] == [] and prep["questions"] == []


def test_only_the_token_hash_is_stored(api_client: APIClient, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    stored = Plan.objects.get(pk=plan["id"])
    token = plan["approval"]["prepare_token"]
    assert token not in json.dumps([stored.token_hash, stored.configuration, stored.preparations])
    again = api_client.get(f"/api/plans/{plan['id']}/").json()
    assert again["approval"]["prepare_token"] is None


def test_first_approval_creates_the_batch_and_a_repeat_returns_it(
    api_client: APIClient, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    first = approve(api_client, plan)
    assert first.status_code == 201, first.content
    body = first.json()
    assert body["idempotent"] is False
    assert sorted(run["model"] for run in body["runs"]) == ["empty", "historical"]
    assert all(run["status"] == "queued" for run in body["runs"])
    again = approve(api_client, plan)
    assert again.status_code == 200
    assert again.json()["idempotent"] is True
    assert again.json()["batch"]["id"] == body["batch"]["id"]
    assert Batch.objects.count() == 1 and Run.objects.count() == 2


def test_each_run_carries_the_exact_approved_configuration(
    api_client, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo, timeout_seconds=90))
    approve(api_client, plan)
    [prep] = plan["preparations"]
    for run in Run.objects.all():
        config = run.configuration
        assert config["baseline_commit"] == prep["baseline_commit"]
        assert config["historical_result_sha256"] == prep["historical_result_sha256"]
        assert (
            config["prepared_configuration_sha256"]
            == prep["prepared_configuration_sha256"][run.model]
        )
        assert config["timeout_seconds"] == 90
        assert config["request"] == manifest_session("claude-line-count")["turns"][0]["request"]


def test_approval_needs_an_explicit_yes(api_client, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    for value in (None, False, "true", 1):
        response = approve(api_client, plan, approved=value)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "approval_required"
    assert Batch.objects.count() == 0


def test_unknown_and_foreign_tokens_are_refused(api_client, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    other = prepare(api_client, line_count_config(real_threads, sample_repo, timeout_seconds=60))
    unknown = approve(api_client, plan, prepare_token="not-a-token")
    assert unknown.status_code == 403 and unknown.json()["error"]["code"] == "unknown_token"
    foreign = approve(api_client, plan, prepare_token=other["approval"]["prepare_token"])
    assert foreign.status_code == 403 and foreign.json()["error"]["code"] == "foreign_token"
    assert Batch.objects.count() == 0


def test_an_expired_token_is_refused_with_410(api_client, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    Plan.objects.filter(pk=plan["id"]).update(
        expires_at=timezone.now() - timedelta(seconds=1),
        created_at=timezone.now() - timedelta(minutes=6),
    )
    response = approve(api_client, plan)
    assert response.status_code == 410
    assert response.json()["error"]["code"] == "token_expired"
    assert Batch.objects.count() == 0


def test_a_changed_configuration_is_refused(api_client, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    changed = {**plan["run_config"], "models": ["historical"]}
    response = approve(api_client, plan, run_config=changed)
    assert response.status_code == 409
    assert response.json()["error"]["message"] == (
        "The approved configuration changed. Prepare and approve it again."
    )
    assert Batch.objects.count() == 0


def test_a_changed_transcript_is_refused(api_client, real_threads, sample_repo, tmp_path) -> None:
    thread = real_threads["claude-line-count"]
    copy = tmp_path / "copy.jsonl"
    copy.write_bytes(Path(thread.source_path).read_bytes())
    Thread.objects.filter(pk=thread.pk).update(source_path=str(copy))
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    with copy.open("a") as handle:
        handle.write('{"type": "summary", "summary": "edited later"}\n')
    # The digest is of the copy stored at import: the edited file counts once imported.
    owner = Thread.objects.get(pk=thread.pk).owner
    assert importing.import_transcript_file(path=copy, user=owner).outcome == "updated"
    response = approve(api_client, plan)
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "protected_input_changed"
    assert [c["input"] for c in error["details"]["changes"]] == ["transcript_sha256"]


def test_a_changed_verify_file_is_refused(api_client, real_threads, sample_repo) -> None:
    config = line_count_config(
        real_threads, sample_repo, verify_command="python3 -m unittest tests/test_core.py"
    )
    if not (sample_repo / "tests" / "test_core.py").exists():
        pytest.skip("the sample repository has no tests/test_core.py")
    plan = prepare(api_client, config)
    (sample_repo / "tests" / "test_core.py").write_text("# rewritten after prepare\n")
    response = approve(api_client, plan)
    assert response.status_code == 409
    assert "verify_files" in [c["input"] for c in response.json()["error"]["details"]["changes"]]


def test_a_rewritten_ending_commit_is_refused(api_client, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    ending = plan["preparations"][0]["ending_commit"]
    # The ending commit disappears from the repository (history rewritten, objects pruned).
    git = ["git", "-C", str(sample_repo)]
    subprocess.run(
        [*git, "checkout", "-q", "--detach", plan["preparations"][0]["baseline_commit"]], check=True
    )
    refs = subprocess.run(
        [*git, "for-each-ref", "--format=%(refname)"], capture_output=True, text=True, check=True
    ).stdout.split()
    for ref in refs:
        subprocess.run([*git, "update-ref", "-d", ref], check=True)
    subprocess.run([*git, "reflog", "expire", "--expire=now", "--all"], check=True)
    subprocess.run([*git, "gc", "-q", "--prune=now"], check=True)
    assert repos.resolve_commit(sample_repo, ending) is None
    response = approve(api_client, plan)
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "protected_input_changed"


@pytest.mark.parametrize(
    ("models", "fragment"),
    [
        ([], "at least one model"),
        ([f"empty{i}" for i in range(9)], "At most 8 models"),
        (["historical", "historical"], "listed twice"),
        (["  "], "non-blank"),
        (["hist\x07orical"], "control characters"),
        (["no-such-model"], "Unknown model"),
    ],
)
def test_model_limits(api_client, real_threads, sample_repo, models, fragment) -> None:
    response = api_client.post(
        "/api/plans/", line_count_config(real_threads, sample_repo, models=models), format="json"
    )
    assert response.status_code == 400
    assert fragment in response.json()["error"]["message"]
    assert Plan.objects.count() == 0


def test_thread_limits(api_client, real_threads, sample_repo, make_thread) -> None:
    many = [make_thread(turns=1) for _ in range(13)]
    too_many = {"configurations": [{"thread_id": t.pk} for t in many], "models": ["empty"]}
    response = api_client.post("/api/plans/", too_many, format="json")
    assert (
        response.status_code == 400 and "At most 12 threads" in response.json()["error"]["message"]
    )
    twice = {
        "configurations": [{"thread_id": many[0].pk}, {"thread_id": many[0].pk}],
        "models": ["empty"],
    }
    response = api_client.post("/api/plans/", twice, format="json")
    assert response.status_code == 400 and "once" in response.json()["error"]["message"]
    ranged = {
        "configurations": [
            {"thread_id": many[0].pk, "start_message_uuid": "uuid-x"},
            {"thread_id": many[1].pk},
        ],
        "models": ["empty"],
    }
    response = api_client.post("/api/plans/", ranged, format="json")
    assert response.status_code == 400 and "whole threads" in response.json()["error"]["message"]
    unknown = {"configurations": [{"thread_id": 987654}], "models": ["empty"]}
    response = api_client.post("/api/plans/", unknown, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "unknown_thread"


def test_a_request_over_one_mebibyte_is_refused_with_413(
    api_client, real_threads, sample_repo
) -> None:
    config = line_count_config(real_threads, sample_repo)
    config["configurations"][0]["request"] = "x" * (1024 * 1024 + 1)
    response = api_client.post("/api/plans/", config, format="json")
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "too_large"


def test_a_request_of_one_mebibyte_is_accepted(api_client, real_threads, sample_repo) -> None:
    config = line_count_config(real_threads, sample_repo)
    config["configurations"][0]["request"] = "x" * (1024 * 1024)
    plan = prepare(api_client, config)
    assert plan["status"] == "ready_for_approval"


def test_a_folder_that_is_not_a_repository_is_a_question(api_client, make_thread, tmp_path) -> None:
    thread = make_thread(cwd=str(tmp_path / "gone"))
    plan = prepare(api_client, {"configurations": [{"thread_id": thread.pk}], "models": ["empty"]})
    assert plan["status"] == "needs_user_input"
    assert plan["questions"][0]["field"] == "repository"
    assert plan["approval"]["prepare_token"] is None
    response = approve(api_client, {**plan, "approval": {"prepare_token": "x"}})
    assert response.status_code == 403


def test_an_unknown_baseline_commit_blocks(api_client, real_threads, sample_repo) -> None:
    config = line_count_config(real_threads, sample_repo)
    config["configurations"][0]["baseline_commit"] = "0" * 40
    plan = prepare(api_client, config)
    assert plan["status"] == "blocked"
    assert "is not a commit" in plan["blockers"][0]


def test_a_range_without_a_commit_asks_for_the_ending(
    api_client, real_threads, sample_repo
) -> None:
    thread = real_threads["claude-line-count"]
    second = thread.turns.get(index=1)  # the sub-agent review: no commit was made
    config = {
        "configurations": [
            {
                "thread_id": thread.pk,
                "start_message_uuid": second.message_uuid,
                "repository": str(sample_repo),
            }
        ],
        "models": ["empty"],
    }
    plan = prepare(api_client, config)
    assert plan["status"] == "needs_user_input"
    question = plan["questions"][0]
    assert question["field"] == "ending_commit"
    # Answering the question makes the plan ready.
    config["configurations"][0]["ending_commit"] = (
        plan["preparations"][0]["baseline_commit"]
        or (manifest_session("claude-line-count")["turns"][1]["head_before"])
    )
    answered = prepare(api_client, config)
    assert answered["status"] == "ready_for_approval", answered


def test_other_users_cannot_see_or_approve_a_plan(
    api_client, real_threads, sample_repo, other_user
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION=f"Token {create_api_token(user=other_user)[1]}")
    assert stranger.get(f"/api/plans/{plan['id']}/").status_code == 404
    assert approve(stranger, plan).status_code == 404
    assert Batch.objects.count() == 0


def test_approvals_racing_in_threads_create_one_batch(
    transactional_db: None, api_client: APIClient, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    results: list[Any] = []

    def approve_once() -> None:
        try:
            results.append(approve(api_client, plan).json())
        finally:
            connection.close()

    workers = [threading.Thread(target=approve_once) for _ in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert len({result["batch"]["id"] for result in results}) == 1
    assert sorted(result["idempotent"] for result in results) == [False, True, True, True]
    assert Batch.objects.count() == 1 and Run.objects.count() == 2


APPROVE_IN_A_PROCESS = """
import json, os
from django.contrib.auth.models import User
from replays import approval
plan_id, token, config = json.loads(os.environ["APPROVAL"])
result = approval.approve_plan(plan_id=plan_id, user=User.objects.get(username="alice"),
                               approved=True, prepare_token=token, run_config=config)
print(json.dumps({"batch": result.batch.pk, "idempotent": result.idempotent}))
"""


def approve_in_a_process(env: dict[str, str], plan: dict[str, Any]) -> subprocess.Popen[str]:
    payload = json.dumps([plan["id"], plan["approval"]["prepare_token"], plan["run_config"]])
    return subprocess.Popen(
        [sys.executable, str(MANAGE), "shell", "-c", APPROVE_IN_A_PROCESS],
        env={**env, "APPROVAL": payload},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def process_result(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


def test_approvals_racing_in_processes_create_one_batch(
    process_env: dict[str, str], api_client: APIClient, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    processes = [approve_in_a_process(process_env, plan) for _ in range(3)]
    results = [process_result(process) for process in processes]
    assert len({result["batch"] for result in results}) == 1
    assert sorted(result["idempotent"] for result in results) == [False, True, True]
    assert Batch.objects.count() == 1 and Run.objects.count() == 2


def test_a_repeated_approval_after_a_restart_returns_the_same_batch(
    process_env: dict[str, str], api_client: APIClient, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    first = process_result(approve_in_a_process(process_env, plan))
    # A new process knows nothing but the database: the same approval is the same batch.
    second = process_result(approve_in_a_process(process_env, plan))
    assert first == {"batch": first["batch"], "idempotent": False}
    assert second == {"batch": first["batch"], "idempotent": True}
    assert Run.objects.count() == 2


def test_batch_run_and_model_reads(api_client: APIClient, real_threads, sample_repo) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    batch = approve(api_client, plan).json()["batch"]
    body = api_client.get(f"/api/batches/{batch['id']}/").json()
    assert body["finished"] is False and body["results_ready"] is False
    assert body["launch_errors"] == []
    run_id = body["runs"][0]["id"]
    run = api_client.get(f"/api/runs/{run_id}/").json()
    assert run["status"] == "queued" and run["phase"] == "queued"
    assert run["configuration"]["model"] == run["model"]
    diff = api_client.get(f"/api/runs/{run_id}/diff")
    assert diff.status_code == 200 and diff["Content-Type"].startswith("text/plain")
    models = api_client.get("/api/models/").json()
    assert [m["id"] for m in models][:2] == ["historical", "empty"]


def test_cancel_of_a_queued_run_is_immediate_and_idempotent(
    api_client, real_threads, sample_repo
) -> None:
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    batch = approve(api_client, plan).json()["batch"]
    run_id = batch["runs"][0]["id"]
    first = api_client.post(f"/api/runs/{run_id}/cancel")
    assert first.status_code == 200 and first.json()["status"] == "cancelled"
    again = api_client.post(f"/api/runs/{run_id}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    whole = api_client.post(f"/api/batches/{batch['id']}/cancel").json()
    assert {run["status"] for run in whole["runs"]} == {RunStatus.CANCELLED}
    assert whole["finished"] is True


CHANGES = {
    "models reordered": lambda config: {**config, "models": ["empty", "historical"]},
    "a longer timeout": lambda config: {
        **config,
        "timeout_seconds": config["timeout_seconds"] + 60,
    },
    "another verify command": lambda config: {**config, "verify_command": "true"},
    "another evaluator": lambda config: {**config, "evaluator": "tests"},
    "other test paths": lambda config: {**config, "test_paths": ["spec/**"]},
    "another context": lambda config: {**config, "context": "digest"},
    "another range": lambda config: {
        **config,
        "configurations": [{**config["configurations"][0], "end_message_uuid": "other"}],
    },
    "another repository": lambda config: {
        **config,
        "configurations": [{**config["configurations"][0], "repository": "/elsewhere"}],
    },
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_any_field_changed_since_prepare_is_refused_and_nothing_runs(
    api_client, real_threads, sample_repo, change: str
) -> None:
    """A second guard of the exact approval: whatever field differs, 409 and no batch; the
    configuration as prepared is then still accepted (the token was not used up)."""
    plan = prepare(api_client, line_count_config(real_threads, sample_repo))
    response = approve(api_client, plan, run_config=CHANGES[change](plan["run_config"]))
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "configuration_changed"
    assert Batch.objects.count() == 0 and Run.objects.count() == 0
    assert approve(api_client, plan).status_code == 201
