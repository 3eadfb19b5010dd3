"""Campaigns through the REST API and the services: the scan's decisions over a real
imported history, the selection, the estimate, one approval, the budget's admission
rules, the results' statistics."""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.utils import timezone
from rest_framework.test import APIClient

from replays import budgets, campaigns, importing, statistics
from replays.factories.histories import Step, make_repo, write_session
from replays.models import (
    FINISHED_RUN_STATUSES,
    Batch,
    Campaign,
    CampaignStatus,
    Plan,
    Report,
    ReportStatus,
    Run,
    RunPhase,
    RunStatus,
    Thread,
    Winner,
)
from tests.campaign_fixtures import PYTEST, History, build_history

BASELINES = {"models": ["historical", "empty"], "evaluator": "tests"}


@pytest.fixture
def history(tmp_path: Path, user: User) -> History:
    return build_history(tmp_path / "work", user)


def client_for(user: User) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def prepare(client: APIClient, **body: Any) -> Any:
    return client.post("/api/campaigns/", {**BASELINES, **body}, format="json")


def by_request(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {candidate["request"]: candidate for candidate in body["candidates"]}


# --- prepare ---------------------------------------------------------------------------------


def test_prepare_decides_every_request_and_finds_the_test_command_the_agent_ran(
    history: History, user: User
) -> None:
    response = prepare(client_for(user), limit=10)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "ready_for_approval"
    assert body["counts"]["scanned"] == 6
    assert body["counts"]["excluded"] == {
        "no_code_change": 1,
        "repository_missing": 1,
        # Judged by tests, the notes repository (no test runner ever ran there) cannot be.
        "not_gradable": 1,
    }
    candidates = by_request(body)
    assert candidates["What does calc/ops.py do?"]["reason"] == "no_code_change"
    assert candidates["Fix the build."]["reason"] == "repository_missing"
    assert "not a git repository" in candidates["Fix the build."]["detail"]
    selected = [c for c in body["candidates"] if c["selected"]]
    assert [c["request"] for c in selected] == [
        "Add a neg function to calc/ops.py with a test.",
        "Add a mul function to calc/ops.py with a test.",
        "Add a sub function to calc/ops.py with a test.",
    ]
    found = body["test_commands"][str(history.calc)]
    assert found["runner"] == "pytest"
    assert found["origin"]["typed"].endswith("-m pytest -q")  # the newest run, as typed
    assert found["command"].endswith("-m pytest -q --junitxml={junit_xml}")
    assert "error" in body["test_commands"][str(history.notes)]
    assert body["approval"]["prepare_token"]
    assert body["approval"]["prompt"] == "Approve 3 requests using 2 models (6 runs)?"
    # Baselines call no model and tests judge for free: known zeros, not unknowns.
    assert body["estimate"]["total_cost_usd"] == 0
    assert body["estimate"]["runs"] == 6


def test_the_estimate_prices_each_request_for_each_model_and_an_unknown_price_is_unknown(
    history: History, user: User, settings: Any
) -> None:
    settings.REPLAYS_AGENTS = {
        "cmd": {"kind": "command", "command": ["true"], "models": ["claude-sonnet-4-5", "nopriced"]}
    }
    body = prepare(
        client_for(user), models=["cmd:claude-sonnet-4-5", "cmd:nopriced"], evaluator="tests"
    ).json()
    models = body["estimate"]["models"]
    # The three calc requests: 20k/21k/22k input and 1.5k output tokens each, at $3 and $15
    # per million: (63,000 x 3 + 4,500 x 15) / 1e6.
    assert Decimal(str(models["cmd:claude-sonnet-4-5"]["cost_usd"])) == Decimal("0.2565")
    assert models["cmd:nopriced"]["cost_usd"] is None
    assert body["estimate"]["total_cost_usd"] is None


def test_a_budget_without_prices_blocks_the_campaign(
    history: History, user: User, settings: Any
) -> None:
    settings.REPLAYS_AGENTS = {"cmd": {"kind": "command", "command": ["true"], "models": ["x1"]}}
    body = prepare(client_for(user), models=["cmd:x1"], budget_usd=5).json()
    assert body["status"] == "blocked"
    assert body["approval"]["prepare_token"] is None
    assert any("cmd:x1 has no price" in blocker for blocker in body["blockers"])


def test_another_users_history_is_never_scanned(
    history: History, user: User, other_user: User, staff_user: User, tmp_path: Path
) -> None:
    repo = make_repo(tmp_path / "bob-repo", {"a.txt": "a\n"}, at=history_start())
    path = write_session(
        tmp_path / "bob-sessions", cwd=repo, start=history_start().replace(hour=13),
        steps=[Step(request="Bob's own request.", writes={"a.txt": "b\n"})],
    )  # fmt: skip
    importing.import_transcript_file(path=path, user=other_user)
    alice = prepare(client_for(user), limit=50).json()
    assert "Bob's own request." not in by_request(alice)
    assert alice["counts"]["scanned"] == 6
    bob = prepare(client_for(other_user), limit=50).json()
    assert list(by_request(bob)) == ["Bob's own request."]
    # Staff see everyone's runs, but a campaign is over one's own history only.
    assert prepare(client_for(staff_user)).json()["counts"]["scanned"] == 0
    # And another user's campaign is not theirs to read, approve or cancel.
    assert client_for(other_user).get(f"/api/campaigns/{alice['id']}/").status_code == 404
    refused = client_for(other_user).post(
        f"/api/campaigns/{alice['id']}/approve",
        {"approved": True, "prepare_token": alice["approval"]["prepare_token"]},
        format="json",
    )
    assert refused.status_code == 404
    assert client_for(other_user).post(f"/api/campaigns/{alice['id']}/cancel").status_code == 404


def history_start() -> Any:
    from tests.campaign_fixtures import START

    return START


def test_filters_narrow_the_scan(history: History, user: User) -> None:
    client = client_for(user)
    only_calc = prepare(client, filters={"repository": str(history.calc)}).json()
    assert only_calc["counts"]["scanned"] == 4  # the calc thread's requests
    in_folder = prepare(client, filters={"folder": str(history.notes)}).json()
    assert [c["request"] for c in in_folder["candidates"]] == ["Add a todo list to README.md."]
    newest_two = prepare(client, filters={"last": 2}).json()
    assert newest_two["counts"]["scanned"] == 2
    none = prepare(client, filters={"since": "2027-01-01"}).json()
    assert none["status"] == "blocked" and none["counts"]["scanned"] == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"models": []}, None),
        ({"limit": 0}, "limit"),
        ({"limit": 501}, "limit"),
        ({"budget_usd": -1}, "budget_usd"),
        ({"budget_usd": "lots"}, "budget_usd"),
        ({"selection": "best"}, "selection"),
        ({"filters": {"since": "yesterday"}}, "since"),
        ({"filters": {"since": "2026-10-02", "until": "2026-10-01"}}, "filters.until"),
        ({"filters": {"colour": "red"}}, "filters"),
        ({"verify_commands": {"/x": "pytest 'unclosed"}}, "verify_commands"),
        ({"surprise": 1}, None),
    ],
)
def test_bad_input_is_refused_with_what_is_wrong(
    history: History, user: User, body: dict[str, Any], field: str | None
) -> None:
    response = prepare(client_for(user), **body)
    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    if field is not None:
        assert error["details"]["field"] == field
    assert not Campaign.objects.exists()


def test_a_seeded_sample_is_the_same_for_the_same_history_and_seed(
    history: History, user: User
) -> None:
    client = client_for(user)

    def chosen(seed: int) -> list[str]:
        body = prepare(client, selection="sample", limit=2, seed=seed).json()
        return [c["request"] for c in body["candidates"] if c["selected"]]

    assert chosen(7) == chosen(7)
    assert len(chosen(7)) == 2
    assert {tuple(chosen(seed)) for seed in range(8)} != {tuple(chosen(7))}


def test_gradable_only_runs_the_historical_tests_and_keeps_the_requests_they_see(
    history: History, user: User
) -> None:
    body = prepare(client_for(user), gradable_only=True, limit=2).json()
    selected = [c for c in body["candidates"] if c["selected"]]
    assert len(selected) == 2
    assert all(c["gradable"] is True for c in selected)
    assert all("fail before and pass after" in c["gradable_detail"] for c in selected)


def test_a_request_whose_tests_do_not_see_its_change_is_not_gradable(
    tmp_path: Path, user: User
) -> None:
    """The change touches code no test covers: the tests pass at both ends."""
    repo = make_repo(
        tmp_path / "lib",
        {"lib.py": "A = 1\n", "test_lib.py": "def test_nothing():\n    assert True\n"},
        at=history_start(),
    )
    path = write_session(
        tmp_path / "sessions", cwd=repo, start=history_start().replace(hour=10),
        steps=[Step(request="Set A to 2.", writes={"lib.py": "A = 2\n"},
                    commands=[PYTEST])],
    )  # fmt: skip
    importing.import_transcript_file(path=path, user=user)
    body = prepare(client_for(user), gradable_only=True).json()
    candidate = by_request(body)["Set A to 2."]
    assert (candidate["eligible"], candidate["reason"]) == (False, "not_gradable")
    assert "no test fails at the baseline" in candidate["detail"]
    assert body["status"] == "blocked"


# --- approve ---------------------------------------------------------------------------------


def test_one_approval_creates_a_plan_and_a_batch_per_request_and_again_returns_the_same(
    history: History, user: User
) -> None:
    client = client_for(user)
    body = prepare(client, limit=3).json()
    approve = {"approved": True, "prepare_token": body["approval"]["prepare_token"]}
    first = client.post(f"/api/campaigns/{body['id']}/approve", approve, format="json")
    assert first.status_code == 201, first.json()
    again = client.post(f"/api/campaigns/{body['id']}/approve", approve, format="json")
    assert again.status_code == 200
    assert first.json()["batches"] == again.json()["batches"]
    assert len(first.json()["batches"]) == 3
    assert (Plan.objects.count(), Batch.objects.count(), Run.objects.count()) == (3, 3, 6)
    for batch in Batch.objects.all():
        assert batch.campaign_id == body["id"]
        assert batch.evaluator == "tests"
        assert batch.runs.count() == 2
        assert {run.status for run in batch.runs.all()} == {RunStatus.QUEUED}
    detail = client.get(f"/api/campaigns/{body['id']}/").json()
    assert detail["status"] == "running"
    assert detail["members"] == {"queued": 6}
    assert detail["approval"]["prepare_token"] is None


def test_approval_needs_true_and_the_token(history: History, user: User) -> None:
    client = client_for(user)
    body = prepare(client).json()
    url = f"/api/campaigns/{body['id']}/approve"
    token = body["approval"]["prepare_token"]
    assert client.post(url, {"prepare_token": token}, format="json").status_code == 400
    assert client.post(url, {"approved": True}, format="json").status_code == 400
    wrong = client.post(url, {"approved": True, "prepare_token": "x" * 43}, format="json")
    assert wrong.status_code == 403
    assert not Run.objects.exists()


def test_a_changed_transcript_refuses_the_approval(history: History, user: User) -> None:
    client = client_for(user)
    body = prepare(client).json()
    thread = history.threads["calc"]
    path = Path(thread.source_path)
    path.write_text(path.read_text().replace("Add a mul function", "Add a MUL function"))
    importing.import_transcript_file(path=path, user=user)
    response = client.post(
        f"/api/campaigns/{body['id']}/approve",
        {"approved": True, "prepare_token": body["approval"]["prepare_token"]},
        format="json",
    )
    assert response.status_code == 409, response.json()
    assert response.json()["error"]["code"] == "protected_input_changed"
    assert f"the transcript of thread {thread.pk} changed" in response.json()["error"]["message"]
    assert not Run.objects.exists()
    assert Campaign.objects.get().status == CampaignStatus.READY_FOR_APPROVAL


def test_a_changed_history_refuses_the_approval(history: History, user: User) -> None:
    client = client_for(user)
    body = prepare(client).json()
    # Someone rewrote the repository's history: the commits prepare resolved are gone.
    from replays.factories.histories import git

    git(history.calc, "reset", "-q", "--hard", "HEAD~1")
    git(history.calc, "reflog", "expire", "--expire=now", "--all")
    git(history.calc, "gc", "-q", "--prune=now")
    response = client.post(
        f"/api/campaigns/{body['id']}/approve",
        {"approved": True, "prepare_token": body["approval"]["prepare_token"]},
        format="json",
    )
    assert response.status_code == 409, response.json()
    assert not Run.objects.exists()


def test_cancel_stops_the_rest(history: History, user: User) -> None:
    client = client_for(user)
    body = prepare(client).json()
    client.post(
        f"/api/campaigns/{body['id']}/approve",
        {"approved": True, "prepare_token": body["approval"]["prepare_token"]},
        format="json",
    )
    cancelled = client.post(f"/api/campaigns/{body['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert set(Run.objects.values_list("status", flat=True)) == {RunStatus.CANCELLED}


# --- the budget's rules ---------------------------------------------------------------------------


def _campaign_with_runs(
    user: User, budget: str, runs: list[tuple[str, str | None, str]], tmp_path: Path
) -> Any:
    """A campaign whose members are (status, cost, estimate) rows, written directly."""
    from replays.factories.runs import make_git_repo, make_run_graph

    repo, baseline, ending = make_git_repo(tmp_path / f"repo-{Campaign.objects.count()}")
    campaign = Campaign.objects.create(
        owner=user, configuration={"models": ["m"]}, fingerprint="f" * 64,
        status=CampaignStatus.RUNNING, budget_usd=Decimal(budget),
        token_hash=f"{Campaign.objects.count():064x}",
        expires_at=history_start().replace(year=2030), approved_at=history_start(),
    )  # fmt: skip
    made = []
    for status, cost, estimate in runs:
        batch, (run,) = make_run_graph(
            owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"]
        )
        Batch.objects.filter(pk=batch.pk).update(campaign=campaign)
        Run.objects.filter(pk=run.pk).update(
            status=status,
            cost_usd=None if cost is None else Decimal(cost),
            estimated_cost_usd=Decimal(estimate),
            started_at=None if status == RunStatus.QUEUED else history_start(),
            finished_at=history_start() if status in FINISHED_RUN_STATUSES else None,
            phase=RunPhase.DONE if status in FINISHED_RUN_STATUSES else RunPhase.QUEUED,
        )
        made.append(run)
    return campaign, made


@pytest.mark.django_db
def test_a_member_is_admitted_while_spent_plus_in_flight_plus_its_estimate_fits(
    user: User, tmp_path: Path
) -> None:
    campaign, _ = _campaign_with_runs(
        user, "1.00", [("completed", "0.40", "0.10"), ("running", None, "0.30")], tmp_path
    )
    money = budgets.money_of(campaign)
    assert (money.spent, money.in_flight, money.left) == (
        Decimal("0.40"), Decimal("0.30"), Decimal("0.30"),
    )  # fmt: skip
    ledger = budgets.Ledger()
    admitted = ledger.admit(campaign.pk, Decimal("0.30"))
    assert (admitted.admit, admitted.cap) == (True, Decimal("0.30"))
    ledger.claimed(campaign.pk, Decimal("0.30"))
    # Now nothing is left: the next waits (one is in flight), it does not end.
    waiting = ledger.admit(campaign.pk, Decimal("0.01"))
    assert (waiting.admit, waiting.exhausted) == (False, False)


@pytest.mark.django_db
def test_what_cannot_start_when_nothing_is_in_flight_is_exhausted(
    user: User, tmp_path: Path
) -> None:
    campaign, _ = _campaign_with_runs(user, "1.00", [("completed", "0.95", "0.10")], tmp_path)
    verdict = budgets.Ledger().admit(campaign.pk, Decimal("0.10"))
    assert (verdict.admit, verdict.exhausted) == (False, True)
    # A run that spent more than its estimate while in flight holds what it spent.
    campaign, _ = _campaign_with_runs(user, "1.00", [("running", "0.80", "0.10")], tmp_path)
    assert budgets.money_of(campaign).in_flight == Decimal("0.80")


@pytest.mark.django_db
def test_claims_respect_the_budget_and_end_what_it_never_will_admit(
    user: User, settings: Any, tmp_path: Path
) -> None:
    from replays import dispatch

    settings.REPLAYS_MAX_PARALLEL_RUNS = 8
    settings.REPLAYS_MAX_RUNS_PER_HOST = 8
    campaign, runs = _campaign_with_runs(
        user, "1.00",
        [("completed", "0.70", "0.20"), ("queued", None, "0.20"), ("queued", None, "0.20")],
        tmp_path,
    )  # fmt: skip
    claimed = dispatch.claim_queued_runs()
    assert [run.pk for run in claimed] == [runs[1].pk]
    assert claimed[0].cost_cap_usd == Decimal("0.30")
    # The third waits while the second is in flight...
    assert Run.objects.get(pk=runs[2].pk).status == RunStatus.QUEUED
    assert not dispatch.waits_beside_free_slot()  # ... and the watchdog knows why
    # ... and once the second ended having spent its estimate, it can never start.
    ended(runs[1], cost=Decimal("0.20"))
    assert dispatch.claim_queued_runs() == []
    third = Run.objects.get(pk=runs[2].pk)
    assert (third.status, third.failure_code) == (RunStatus.FAILED, "budget_exhausted")


def ended(run: Run, *, cost: Decimal) -> None:
    now = timezone.now()
    Run.objects.filter(pk=run.pk).update(
        status=RunStatus.COMPLETED, phase=RunPhase.DONE, cost_usd=cost,
        started_at=now, finished_at=now,
    )  # fmt: skip


# --- results ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("wins", "losses", "p"),
    [(0, 0, None), (3, 0, 0.25), (5, 5, 1.0), (10, 0, 2 / 1024), (8, 2, 0.109375)],
)
def test_the_sign_test_gives_exact_two_sided_p_values(wins: int, losses: int, p: Any) -> None:
    found = statistics.sign_test_p(wins, losses)
    assert found == pytest.approx(p) if p is not None else found is None


def test_results_are_kept_and_exported_as_json_and_csv(history: History, user: User) -> None:
    client = client_for(user)
    body = prepare(client, limit=2).json()
    client.post(
        f"/api/campaigns/{body['id']}/approve",
        {"approved": True, "prepare_token": body["approval"]["prepare_token"]},
        format="json",
    )
    # Members end as a coordinator would write them: historical judged a tie, empty a loss.
    for run in Run.objects.filter(batch__campaign_id=body["id"]):
        ended(run, cost=Decimal(0))
        tie = run.model == "historical"
        Report.objects.create(
            run=run, status=ReportStatus.JUDGED, is_current=True,
            winner=Winner.TIE if tie else Winner.HISTORICAL, score_historical=1.0,
            score_replay=1.0 if tie else 0.0, evaluator="tests", evaluator_cost_usd=Decimal(0),
        )  # fmt: skip
    results = client.get(f"/api/campaigns/{body['id']}/results").json()
    rows = {row["model"]: row for row in results["models"]}
    assert (rows["historical"]["ties"], rows["empty"]["losses"]) == (2, 2)
    assert rows["historical"]["rate"] == 1.0
    assert rows["historical"]["rate_low"] == pytest.approx(0.342, abs=1e-3)
    assert results["head_to_head"] == [
        {"a": "historical", "b": "empty", "n": 2, "wins": 2, "ties": 0, "losses": 0,
         "p_value": 0.5}
    ]  # fmt: skip
    assert results["status"] == "finished"
    assert len(results["requests"]) == 2
    exported = client.get(f"/api/campaigns/{body['id']}/results?format=csv")
    assert exported.status_code == 200
    assert exported["Content-Type"].startswith("text/csv")
    table = list(csv.reader(io.StringIO(exported.content.decode())))
    assert table[0][:3] == ["model", "n", "wins"]
    assert table[1][0] == "historical"
    assert Thread.objects.count() == 3


def test_the_preview_counts_what_prepare_would_select_and_stores_nothing(
    history: History, user: User
) -> None:
    counts = campaigns.preview(user, {**BASELINES, "limit": 10})
    assert counts["excluded"] == {
        "no_code_change": 1, "repository_missing": 1, "not_gradable": 1,
    }  # fmt: skip
    assert counts["would_select"] == 3
    assert not Campaign.objects.exists()
    prepared = prepare(client_for(user), limit=10).json()
    assert prepared["counts"]["selected"] == counts["would_select"]


def test_a_clone_given_for_a_folder_that_is_gone_makes_its_requests_eligible(
    history: History, user: User, tmp_path: Path
) -> None:
    """The calc repository moved: its recorded folder is gone; given where the clone is now,
    its requests are found again, with the test command its agent ran there."""
    moved = tmp_path / "elsewhere" / "calc"
    moved.parent.mkdir()
    history.calc.rename(moved)
    gone = prepare(client_for(user)).json()
    assert by_request(gone)["Add a neg function to calc/ops.py with a test."]["reason"] == (
        "repository_missing"
    )
    found = prepare(client_for(user), clones={str(history.calc): str(moved)}).json()
    neg = by_request(found)["Add a neg function to calc/ops.py with a test."]
    assert (neg["eligible"], neg["repository"], neg["selected"]) == (True, str(moved), True)
    assert found["test_commands"][str(moved)]["runner"] == "pytest"
