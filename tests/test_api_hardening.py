"""Bad input never answers 500, every refusal is in the one error shape, the schema says
what the server accepts and returns, and writes are throttled through a shared cache."""

from __future__ import annotations

import json
import os
import runpy
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest
from django.core.cache import caches
from django.db import connection
from rest_framework.test import APIClient

from replays import approval
from replays.agents.base import AgentSetupError, RunContext
from replays.agents.command import CommandAgent
from replays.errors import ErrorKind
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Batch, Plan, Thread
from replays.runspec import RunSpec

pytestmark = pytest.mark.django_db

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
SETTINGS_FILE = MANAGE.parent / "replaysite" / "settings.py"


def assert_error_shape(response: Any, status: int, code: str | None = None) -> dict[str, Any]:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = json.loads(response.content)
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str)
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def post_json(api: APIClient, path: str, body: str) -> Any:
    return api.generic("POST", path, body, content_type="application/json")


def one_thread_plan(thread: Thread, **item: Any) -> dict[str, Any]:
    return {"configurations": [{"thread_id": thread.pk, **item}], "models": ["empty"]}


def line_count_plan(threads: dict[str, Thread], repo: Path, **extra: Any) -> dict[str, Any]:
    thread = threads["claude-line-count"]
    item = {"thread_id": thread.pk, "start_message_uuid": thread.turns.get(index=0).message_uuid}
    return {
        "configurations": [{**item, "repository": str(repo)}],
        "models": ["historical", "empty"],
        **extra,
    }


def prepared(api: APIClient, configuration: dict[str, Any]) -> dict[str, Any]:
    response = api.post("/api/plans/", configuration, format="json")
    assert response.status_code == 201, response.content
    return response.json()


# --- 11: inputs that crashed the server -------------------------------------------------------


@pytest.mark.parametrize("thread_id", [2**63 - 1, 2**63, 2**64, 10**30])
def test_a_thread_id_beyond_the_database_integers_is_refused(
    api_client: APIClient, thread_id: int
) -> None:
    configuration = {"configurations": [{"thread_id": thread_id}], "models": ["empty"]}
    response = api_client.post("/api/plans/", configuration, format="json")
    status = 400
    error = assert_error_shape(response, status)
    assert error["code"] == ("unknown_thread" if thread_id < 2**63 else "invalid")
    assert Plan.objects.count() == 0


@pytest.mark.parametrize(
    "path", ["threads/{}/", "plans/{}/", "batches/{}/", "runs/{}/", "batches/{}/results"]
)
def test_an_id_beyond_the_database_integers_in_a_path_is_not_found(
    api_client: APIClient, path: str
) -> None:
    assert_error_shape(api_client.get("/api/" + path.format(2**64)), 404, "not_found")


@pytest.mark.parametrize(
    "field", ["request", "thread_title", "repository", "verify_command", "models"]
)
def test_a_lone_surrogate_in_a_plan_is_refused(
    api_client: APIClient, make_thread: Any, field: str
) -> None:
    configuration = one_thread_plan(make_thread())
    if field == "verify_command":
        configuration["verify_command"] = "pytest \ud800"
    elif field == "models":
        configuration["models"] = ["\udfff"]
    else:
        configuration["configurations"][0][field] = "text \ud83d here"
    # json.dumps writes the surrogate as the escape \ud83d, which JSON itself allows.
    response = post_json(api_client, "/api/plans/", json.dumps(configuration))
    error = assert_error_shape(response, 400, "invalid")
    assert "surrogate" in error["message"]
    assert Plan.objects.count() == 0


def test_a_lone_surrogate_in_a_key_or_a_prepare_token_is_refused(
    api_client: APIClient, make_thread: Any
) -> None:
    response = post_json(api_client, "/api/plans/", json.dumps({"\udc00": 1}))
    assert_error_shape(response, 400, "invalid")
    body = {"approved": True, "prepare_token": "\ud800", "run_config": {}}
    response = post_json(api_client, "/api/plans/1/approve", json.dumps(body))
    assert_error_shape(response, 400, "invalid")


@pytest.mark.parametrize("token", ["\ud800", "x" * 100_000, "t\x00ken", "é" * 43])
def test_a_prepare_token_that_cannot_be_one_is_an_unknown_token(
    user: Any, real_threads: dict[str, Thread], sample_repo: Path, token: str
) -> None:
    api = APIClient()
    api.force_authenticate(user)
    plan = prepared(api, line_count_plan(real_threads, sample_repo))
    with pytest.raises(approval.ApprovalError) as refused:
        approval.approve_plan(
            plan_id=plan["id"],
            user=user,
            approved=True,
            prepare_token=token,
            run_config=plan["run_config"],
        )
    assert (refused.value.code, refused.value.kind) == ("unknown_token", ErrorKind.NOT_ALLOWED)
    assert Batch.objects.count() == 0


@pytest.mark.parametrize("opening", ["[", '{"a":'])
def test_json_nested_too_deeply_is_refused(api_client: APIClient, opening: str) -> None:
    response = post_json(api_client, "/api/plans/", opening * 50_000)
    error = assert_error_shape(response, 400, "invalid")
    assert "nested" in error["message"]


def test_json_nested_deeper_than_any_request_needs_is_refused(api_client: APIClient) -> None:
    deep = '{"models": ' + "[" * 200 + "]" * 200 + "}"
    error = assert_error_shape(post_json(api_client, "/api/plans/", deep), 400, "invalid")
    assert "nested" in error["message"]


def test_a_search_of_a_hundred_thousand_characters_is_cut_as_on_the_page(
    api_client: APIClient, make_thread: Any
) -> None:
    make_thread(title="a" * 300)
    response = api_client.get("/api/threads/", {"search": "a" * 100_000})
    assert response.status_code == 200, response.content[:300]
    # Cut to the page's 200 characters, the search still finds the thread.
    assert response.json()["count"] == 1


def test_a_search_with_a_nul_character_finds_nothing_and_does_not_fail(
    api_client: APIClient, make_thread: Any
) -> None:
    make_thread(title="plain")
    response = api_client.get("/api/threads/", {"search": "pla\x00in"})
    assert response.status_code == 200, response.content[:300]
    assert response.json()["count"] == 0


def test_a_verify_command_naming_a_link_out_of_the_repository_prepares(
    api_client: APIClient, real_threads: dict[str, Thread], sample_repo: Path, tmp_path: Path
) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text("print('not in the repository')\n")
    (sample_repo / "linked.py").symlink_to(outside)
    configuration = line_count_plan(
        real_threads, sample_repo, verify_command="python3 linked.py README.md"
    )
    plan = prepared(api_client, configuration)
    assert plan["status"] == "ready_for_approval", plan
    stored = Plan.objects.get(pk=plan["id"]).preparations[0]["verify_files"]
    # The link leads out of the repository: it is not one of its files.
    assert "linked.py" not in stored


def test_a_verify_command_naming_a_file_too_long_for_the_system_prepares(
    api_client: APIClient, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    configuration = line_count_plan(real_threads, sample_repo, verify_command="pytest " + "a" * 300)
    assert prepared(api_client, configuration)["status"] == "ready_for_approval"


def test_a_repository_with_a_name_longer_than_any_folder_is_refused(
    api_client: APIClient, make_thread: Any, tmp_path: Path
) -> None:
    configuration = one_thread_plan(make_thread(), repository=str(tmp_path / ("a" * 300)))
    error = assert_error_shape(api_client.post("/api/plans/", configuration, format="json"), 400)
    assert "255 bytes" in error["message"]


@pytest.mark.parametrize("method", ["get", "post", "put", "delete"])
@pytest.mark.parametrize(
    "path", ["/api/nothing", "/api/threads/x/", "/api/threads", "/api/", "/api/runs/1%0A/judge"]
)
def test_unknown_api_paths_answer_404_in_the_error_shape(
    api_client: APIClient, method: str, path: str
) -> None:
    error = assert_error_shape(getattr(api_client, method)(path), 404, "not_found")
    assert unquote(path) in error["message"]


def test_unknown_api_paths_answer_404_without_credentials(client: Any) -> None:
    assert_error_shape(client.post("/api/plans/1/approve/nothing"), 404, "not_found")


# --- 12: loose edges ------------------------------------------------------------------------


def test_approve_refuses_unknown_fields_as_prepare_does(
    api_client: APIClient, real_threads: dict[str, Thread], sample_repo: Path
) -> None:
    plan = prepared(api_client, line_count_plan(real_threads, sample_repo))
    body = {
        "approved": True,
        "prepare_token": plan["approval"]["prepare_token"],
        "run_config": plan["run_config"],
        "aproved": True,
    }
    response = api_client.post(f"/api/plans/{plan['id']}/approve", body, format="json")
    error = assert_error_shape(response, 400, "invalid")
    assert error["details"] == {"fields": ["aproved"]}
    assert Batch.objects.count() == 0


def test_judge_refuses_unknown_fields(api_client: APIClient, user: Any, tmp_path: Path) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    _, [run] = make_run_graph(owner=user, repo=repo, baseline=baseline, ending=ending, models=["x"])
    response = api_client.post(f"/api/runs/{run.pk}/judge", {"evaluatr": "tests"}, format="json")
    error = assert_error_shape(response, 400, "invalid")
    assert error["details"] == {"fields": ["evaluatr"]}


@pytest.mark.parametrize("body", ["[1, 2]", '"text"', "null", "3"])
def test_a_body_that_is_not_an_object_is_refused(
    api_client: APIClient, user: Any, tmp_path: Path, body: str
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    batch, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["x"]
    )
    for path in ("/api/plans/", f"/api/plans/{batch.plan_id}/approve", f"/api/runs/{run.pk}/judge"):
        assert_error_shape(post_json(api_client, path, body), 400)


def schema(api: APIClient) -> dict[str, Any]:
    response = api.get("/api/schema/", {"format": "json"})
    assert response.status_code == 200
    return json.loads(response.content)


def test_the_schema_declares_every_error_in_the_one_shape(api_client: APIClient) -> None:
    document = schema(api_client)
    error = document["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    body = document["components"]["schemas"]["ErrorBody"]
    assert sorted(body["required"]) == ["code", "details", "message"]
    with_bodies = {
        ("post", "/api/threads/import"),
        ("post", "/api/plans/"),
        ("post", "/api/plans/{id}/approve"),
        ("post", "/api/runs/{id}/judge"),
    }
    writes = {*with_bodies, ("post", "/api/batches/{id}/cancel"), ("post", "/api/runs/{id}/cancel")}
    seen = set()
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            seen.add((method, path))
            responses = operation["responses"]
            errors = {code for code in responses if code.startswith("4")}
            assert {"401", "403"} <= errors, (method, path)
            if "{id}" in path or path == "/api/threads/":
                assert "404" in errors, (method, path)
            if (method, path) in writes:
                assert {"413", "429"} <= errors, (method, path)
                assert "Retry-After" in responses["429"]["headers"]
            if (method, path) in with_bodies:
                assert {"400", "415"} <= errors, (method, path)
            for code in errors:
                content = responses[code]["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/Error"}, (code, path)
    assert writes <= seen


def test_the_schema_refuses_what_the_server_refuses(api_client: APIClient) -> None:
    components = schema(api_client)["components"]["schemas"]
    run_config = components["RunConfig"]["properties"]
    assert run_config["models"]["items"]["minLength"] == 1
    assert run_config["models"]["items"]["pattern"]
    assert (run_config["configurations"]["minItems"], run_config["configurations"]["maxItems"]) == (
        1,
        12,
    )
    thread_id = components["ThreadConfiguration"]["properties"]["thread_id"]
    assert (thread_id["minimum"], thread_id["maximum"]) == (1, 2**63 - 1)
    timeout = run_config["timeout_seconds"]
    assert (timeout["minimum"], timeout["maximum"]) == (10, 24 * 60 * 60)
    approved = components["ApproveInput"]["properties"]["approved"]["allOf"][0]["$ref"]
    assert components[approved.rsplit("/", 1)[1]]["enum"] == [True]
    for body in ("RunConfig", "ThreadConfiguration", "ApproveInput", "JudgeInput"):
        assert components[body]["additionalProperties"] is False, body


def test_the_schema_still_validates() -> None:
    from django.core.management import call_command

    call_command("spectacular", "--validate", "--fail-on-warn", "--file", os.devnull)


def test_a_command_agent_refuses_a_model_that_looks_like_an_option(tmp_path: Path) -> None:
    agent = CommandAgent.from_entry(
        "aider", {"command": ["aider", "--model", "{model}"], "models": ["gpt-5"]}, "--yes-always"
    )
    context = RunContext(
        run_id=1,
        model="--yes-always",
        spec=RunSpec(),
        run_dir=tmp_path,
        workspace=tmp_path / "workspace",
        request_file=tmp_path / "request.md",
        log_path=tmp_path / "agent.log",
    )
    with pytest.raises(AgentSetupError, match="is not a model name"):
        agent.invocation(context)


# --- 12: throttling -----------------------------------------------------------------------------


@pytest.fixture
def two_writes_a_minute(settings: Any) -> None:
    settings.REPLAYS_API_WRITE_RATE = "2/minute"
    caches["default"].clear()


def test_writes_beyond_the_rate_are_refused_with_429_and_retry_after(
    api_client: APIClient, two_writes_a_minute: None
) -> None:
    for _ in range(2):
        assert api_client.post("/api/plans/", {}, format="json").status_code == 400
    refused = api_client.post("/api/plans/", {}, format="json")
    error = assert_error_shape(refused, 429, "throttled")
    assert 0 < int(refused["Retry-After"]) <= 60
    assert error["details"] == {"retry_after": int(refused["Retry-After"])}
    # Every write endpoint shares the rate; reads are never throttled.
    assert api_client.post("/api/runs/1/cancel").status_code == 429
    assert api_client.get("/api/threads/").status_code == 200


def test_the_rate_is_counted_per_user(
    api_client: APIClient, other_user: Any, two_writes_a_minute: None
) -> None:
    for _ in range(3):
        api_client.post("/api/plans/", {}, format="json")
    other = APIClient()
    other.force_authenticate(other_user)
    assert other.post("/api/plans/", {}, format="json").status_code == 400


def test_the_throttle_history_is_in_the_database_cache_all_processes_share(
    api_client: APIClient, two_writes_a_minute: None
) -> None:
    from django.conf import settings

    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.db.DatabaseCache"
    table = settings.CACHES["default"]["LOCATION"]
    api_client.post("/api/plans/", {}, format="json")
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT COUNT(*) FROM {connection.ops.quote_name(table)}")
        assert cursor.fetchone()[0] >= 1


def test_migrate_alone_makes_the_cache_table(tmp_path: Path) -> None:
    database = tmp_path / "fresh.sqlite3"
    env = {
        **os.environ,
        "DATABASE_URL": f"sqlite:///{database}",
        "REPLAYS_VAR_DIR": str(tmp_path / "var"),
    }
    env.pop("REDIS_URL", None)
    subprocess.run(
        [sys.executable, str(MANAGE), "migrate", "--no-input", "-v", "0"],
        env=env,
        check=True,
        capture_output=True,
    )
    with sqlite3.connect(database) as db:
        tables = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    assert "replays_cache" in tables


def settings_with(monkeypatch: pytest.MonkeyPatch, **environment: str) -> dict[str, Any]:
    """The settings module's values, read again with this environment."""
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(str(SETTINGS_FILE))


def test_the_cache_is_redis_when_redis_url_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = settings_with(monkeypatch, REDIS_URL="redis://127.0.0.1:6390/3")
    assert loaded["CACHES"]["default"] == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://127.0.0.1:6390/3",
        "KEY_PREFIX": "replays",
    }
    monkeypatch.delenv("REDIS_URL")
    loaded = settings_with(monkeypatch)
    assert loaded["CACHES"]["default"]["BACKEND"] == "django.core.cache.backends.db.DatabaseCache"


@pytest.mark.parametrize("rate", ["120/minute", "5/s", "1000/day"])
def test_the_write_rate_comes_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, rate: str
) -> None:
    assert settings_with(monkeypatch, REPLAYS_API_WRITE_RATE=rate)["REPLAYS_API_WRITE_RATE"] == rate


@pytest.mark.parametrize("rate", ["many", "10/fortnight", "-1/minute", "10"])
def test_a_write_rate_that_cannot_be_read_stops_the_settings(
    monkeypatch: pytest.MonkeyPatch, rate: str
) -> None:
    with pytest.raises(ValueError, match="REPLAYS_API_WRITE_RATE"):
        settings_with(monkeypatch, REPLAYS_API_WRITE_RATE=rate)


def test_writes_are_throttled_through_redis_too(
    api_client: APIClient, settings: Any, two_writes_a_minute: None
) -> None:
    url = os.environ.get("REPLAYS_TEST_REDIS_URL", "")
    if not url:
        if os.environ.get("REPLAYS_REQUIRE_TOOLS") == "1":
            pytest.fail("REPLAYS_TEST_REDIS_URL is not set")
        pytest.skip("no Redis server for tests (set REPLAYS_TEST_REDIS_URL)")
    settings.CACHES = {
        **settings.CACHES,
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": url,
            "KEY_PREFIX": f"replays-test-{os.getpid()}",
        },
    }
    redis_cache = caches["default"]
    keys = _throttle_keys()
    redis_cache.delete_many(keys)
    try:
        statuses = [api_client.post("/api/plans/", {}, format="json").status_code for _ in range(3)]
        assert statuses == [400, 400, 429]
        assert any(redis_cache.get(key) for key in keys)
    finally:
        redis_cache.delete_many(keys)


def _throttle_keys() -> list[str]:
    from django.contrib.auth.models import User

    return [f"throttle_write_{user.pk}" for user in User.objects.all()]


def test_a_search_with_nul_on_the_thread_page_finds_nothing_rather_than_failing(
    logged_in_client: Any,
) -> None:
    assert logged_in_client.get("/", {"q": "a\x00b"}).status_code == 200


def test_a_thread_folder_too_long_for_the_file_system_is_no_repository(
    user: Any, make_thread: Any
) -> None:
    from replays import planning

    thread = make_thread(cwd="/tmp/" + "x" * 300)
    plan = planning.prepare_plan(
        owner=user,
        raw_configuration={"configurations": [{"thread_id": thread.pk}], "models": ["empty"]},
    ).plan
    assert plan.status == "needs_user_input" and plan.questions[0]["field"] == "repository"
