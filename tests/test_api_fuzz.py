"""Schemathesis against the live OpenAPI schema: a real server on loopback, a token user
with data behind every kind of id, every operation fuzzed with valid and invalid input.

No answer is a 5xx, every 4xx is in the one error shape, and every answer matches what
the schema declares (its status, content type, headers and body)."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.utils import timezone
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from replays import importing, planning
from replays.accounts import create_api_token
from replays.factories.leaderboard import seed
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Batch, Plan, Report, ReportStatus, Run, RunStatus, Thread
from tests.conftest import MANIFEST_PATH, REAL_TRANSCRIPTS

# 18 operations, valid and invalid input each: at least 1,000 cases, about a minute.
EXAMPLES_PER_MODE = 40
MINIMUM_CASES = 1000

cases: Counter[str] = Counter()
statuses: Counter[tuple[str, int]] = Counter()


def error_shape(ctx: Any, response: Any, case: Any) -> None:
    """Every 4xx is `{"error": {"code", "message", "details"}}`, as JSON."""
    if response.status_code < 400:
        return
    kind = ",".join(response.headers.get("content-type", []))
    assert kind.startswith("application/json"), f"{response.status_code} answered as {kind}"
    body = json.loads(response.content)
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict) and set(error) == {"code", "message", "details"}, body
    assert isinstance(error["code"], str) and error["code"], body
    assert isinstance(error["message"], str) and error["message"], body


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    error_shape,
]

# Where known values go, about half the time (the rest is generated): so that cases get
# past "no such thing" to the checks behind it.
BINDINGS = {
    "path.id": "ids",
    "body.configurations[*].thread_id": "threads",
    "body.configurations[*].repository": "repositories",
    "body.configurations[*].baseline_commit": "commits",
    "body.configurations[*].ending_commit": "commits",
    "body.models[*]": "models",
    "body.evaluator": "models",
    "body.prepare_token": "tokens",
    "body.run_config.configurations[*].thread_id": "threads",
    "body.run_config.models[*]": "models",
}


def fuzz_data(user: User, tmp_path: Path) -> dict[str, list[Any]]:
    """Something behind each kind of id, and the values that go with them: threads
    imported from the real fixture sessions, a git repository, a ready plan (its token), a
    batch of queued runs (judging them is refused, never started), and finished runs with
    reports (each being judged already: judging them again is refused too)."""
    manifest = json.loads(MANIFEST_PATH.read_text())
    for session in manifest["sessions"]:
        result = importing.import_transcript_file(
            path=REAL_TRANSCRIPTS / session["path"], user=user
        )
        assert result.thread is not None, result.error
    repo, baseline, ending = make_git_repo(tmp_path)
    batch, _ = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical", "empty"]
    )
    ready = planning.prepare_plan(owner=user, raw_configuration=batch.plan.configuration)
    assert ready.prepare_token, ready.plan.blockers
    finished = seed(user, {"historical": ["win", "loss"], "empty": ["tie", "review_failed"]})
    # The factory's plan has no configuration; a plan always has one (prepare stores it).
    Plan.objects.filter(pk=finished.batch.plan_id).update(configuration=batch.plan.configuration)
    now = timezone.now()
    for run in Run.objects.filter(batch=finished.batch, status=RunStatus.COMPLETED):
        Report.objects.create(
            run=run,
            status=ReportStatus.JUDGING,
            evaluator="tests",
            prompt_version="v1",
            context="cold",
            heartbeat_at=now,
            created_at=now,
        )
    highest = max(
        model.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        for model in (Thread, Plan, Batch, Run, Report)
    )
    return {
        "ids": list(range(1, highest + 1)),
        "threads": list(Thread.objects.values_list("pk", flat=True)),
        "models": ["historical", "empty", "tests"],
        "repositories": [str(repo)],
        "commits": [baseline, ending],
        "tokens": [ready.prepare_token],
    }


@pytest.fixture
def api(live_server: Any, user: User, tmp_path: Path, settings: Any) -> tuple[Any, dict[str, str]]:
    """The schema as the live server gives it to the token user, and the token's header."""
    # The fuzzing writes far more than a person: the write rate does not stop it here.
    settings.REPLAYS_API_WRITE_RATE = "1000000/minute"
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    known = fuzz_data(user, tmp_path)
    headers = {"Authorization": f"Token {create_api_token(user=user)[1]}"}
    config = schemathesis.Config.from_dict(
        {
            "dictionaries": {name: {"values": values} for name, values in known.items()},
            "parameters": {
                key: {"dictionary": name, "probability": 0.5} for key, name in BINDINGS.items()
            },
        }
    )
    loaded = schemathesis.openapi.from_url(
        f"{live_server.url}/api/schema/?format=json", config=config, headers=headers, timeout=30
    )
    return loaded, headers


def fuzz(operation: Any, mode: GenerationMode, headers: dict[str, str]) -> None:
    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_MODE,
        derandomize=True,  # the same cases on every run, in CI too
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    def one_case(case: Case) -> None:
        cases[operation.label] += 1
        response = case.call_and_validate(headers=headers, checks=CHECKS, timeout=30)
        statuses[operation.label, response.status_code] += 1

    one_case()


def has_inputs(operation: Any) -> bool:
    return bool(operation.path_parameters or operation.query or operation.body)


@pytest.mark.django_db(transaction=True, reset_sequences=True)
def test_every_operation_answers_as_its_schema_says(api: tuple[Any, dict[str, str]]) -> None:
    loaded, headers = api
    operations = [result.ok() for result in loaded.get_all_operations()]
    cases.clear()
    statuses.clear()
    failures = []
    started = time.monotonic()
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                fuzz(operation, mode, headers)
            except Unsatisfiable:
                # Nothing can be invalid in an operation with no parameters and no body.
                assert mode == GenerationMode.NEGATIVE and not has_inputs(operation)
            # Every operation is fuzzed, then all failures are shown (schemathesis raises
            # a BaseExceptionGroup of them).
            except (Exception, BaseExceptionGroup) as exc:
                failures.append(f"{operation.label} ({mode.value}): {exc}")
    elapsed = time.monotonic() - started
    total = sum(cases.values())
    print(f"\nschemathesis: {total} cases, {len(operations)} operations, {elapsed:.0f} s")
    for (label, status), count in sorted(statuses.items()):
        print(f"  {label}: {status} x{count}")
    assert not failures, "\n\n".join(failures)
    assert total >= MINIMUM_CASES, cases
    assert set(cases) == {operation.label for operation in operations}
