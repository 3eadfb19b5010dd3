"""kill -9 during a campaign's approval and during its dispatch: nothing approved is lost,
nothing is created twice, no member starts twice (real processes, real kills)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import campaigns, dispatch, supervision
from replays.models import (
    FINISHED_RUN_STATUSES,
    Batch,
    Campaign,
    CampaignStatus,
    FailureCode,
    Plan,
    Run,
    RunStatus,
)
from tests.campaign_fixtures import build_history
from tests.test_crash_recovery import kill9
from tests.test_dispatch import MANAGE, Lab, make_lab, wait_until


@pytest.fixture
def lab(
    process_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> Lab:
    made = make_lab(process_env, tmp_path, monkeypatch, settings)
    # This process prepares and approves with the agents its children run.
    settings.REPLAYS_AGENTS = json.loads(Path(made.env["REPLAYS_AGENTS_FILE"]).read_text())
    return made


def prepared(lab: Lab, user: User) -> campaigns.PreparedCampaign:
    build_history(lab.root / "work", user)
    found = campaigns.prepare_campaign(
        owner=user,
        raw_configuration={
            "models": ["editor:m1", "editor:m2"],
            "evaluator": "tests",
            "limit": 3,
        },  # fmt: skip
    )
    assert found.prepare_token, found.campaign.blockers
    return found


APPROVE = """
import os
from django.contrib.auth.models import User
from replays import campaigns
campaigns.approve_campaign(
    campaign_id=int(os.environ["CAMPAIGN"]), user=User.objects.get(username="alice"),
    approved=True, prepare_token=os.environ["TOKEN"],
)
print("approved")
"""


def test_a_kill_inside_the_approval_leaves_nothing_and_the_same_approval_then_makes_it_all_once(
    lab: Lab, user: User
) -> None:
    found = prepared(lab, user)
    campaign = found.campaign
    approver = subprocess.Popen(
        [sys.executable, str(MANAGE), "shell", "-c", APPROVE],
        env={**lab.env, "REPLAYS_TEST_PAUSE_AT": "campaign_approval_in_transaction",
             "REPLAYS_TEST_PAUSE_FILE": str(lab.pause_file), "CAMPAIGN": str(campaign.pk),
             "TOKEN": found.prepare_token},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    pid = lab.paused_pid("campaign_approval_in_transaction", seconds=60)
    assert pid == approver.pid
    kill9(pid)
    approver.wait()

    # The transaction died with it: not approved, no plan, no batch, no run.
    campaign.refresh_from_db()
    assert (campaign.status, campaign.approved_at) == (CampaignStatus.READY_FOR_APPROVAL, None)
    assert (Plan.objects.count(), Batch.objects.count(), Run.objects.count()) == (0, 0, 0)

    # The same approval, given again, makes every member once; again, nothing more.
    first = campaigns.approve_campaign(
        campaign_id=campaign.pk, user=user, approved=True, prepare_token=found.prepare_token
    )
    again = campaigns.approve_campaign(
        campaign_id=campaign.pk, user=user, approved=True, prepare_token=found.prepare_token
    )
    assert (first.idempotent, again.idempotent) == (False, True)
    assert Batch.objects.filter(campaign=campaign).count() == 3
    assert Run.objects.filter(batch__campaign=campaign).count() == 6
    assert [b.pk for b in again.batches] == [b.pk for b in first.batches]


def test_a_dispatcher_killed_after_its_claim_starts_no_member_twice(lab: Lab, user: User) -> None:
    found = prepared(lab, user)
    campaigns.approve_campaign(
        campaign_id=found.campaign.pk, user=user, approved=True,
        prepare_token=found.prepare_token,
    )  # fmt: skip
    members = list(Run.objects.filter(batch__campaign=found.campaign).order_by("id"))
    dispatcher = lab.start_dispatcher(pause_at="dispatch_after_claim")
    lab.paused_pid("dispatch_after_claim")
    claimed = [
        run.pk for run in members if Run.objects.get(pk=run.pk).status == RunStatus.LAUNCHING
    ]
    assert len(claimed) == 2  # the capacity
    dispatcher.kill()
    dispatcher.wait()

    report = dispatch.reconcile_runs()
    assert report.launch_failed == 2

    # The rest start as slots free, each once.
    def all_ended() -> bool:
        supervision.dispatch_runs()
        return (
            not Run.objects.filter(pk__in=[r.pk for r in members])
            .exclude(status__in=FINISHED_RUN_STATUSES)
            .exists()
        )

    wait_until(all_ended, seconds=300, what="every member to end")
    ended = {run.pk: run for run in Run.objects.filter(pk__in=[r.pk for r in members])}
    for run_id in claimed:
        assert ended[run_id].failure_code == FailureCode.LAUNCH_FAILED
        assert run_id not in lab.starts()
    others = [run_id for run_id in ended if run_id not in claimed]
    assert sorted(lab.starts()) == sorted(others)
    assert all(count == 1 for count in lab.starts().values()), lab.starts()
    # Nothing relaunches afterwards; the campaign ends, its launch failures ours.
    assert supervision.dispatch_runs() == []
    campaign = Campaign.objects.get(pk=found.campaign.pk)
    from replays.evaluation import campaign_results

    campaign = campaign_results.refresh_if_stale(campaign)
    assert campaign.status == CampaignStatus.FINISHED
    rows = {row["model"]: row for row in campaign.results["models"]}
    assert sum(row["not_counted_reasons"].get("launch failed", 0) for row in rows.values()) == 2
    assert json.dumps(campaign.results)  # stored as plain JSON
