"""Who may see what: the schema and the API docs need a login (a token for the schema),
and approval runs the request text that was prepared, not an edited one."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from replays import approval, planning
from replays.accounts import create_api_token
from replays.errors import ErrorKind
from replays.factories.runs import make_git_repo
from replays.models import Turn

pytestmark = pytest.mark.django_db


def test_the_schema_and_the_docs_need_a_login(client: Any, user: User) -> None:
    assert client.get("/api/schema/").status_code in (401, 403)
    docs = client.get("/api/docs/")
    assert docs.status_code == 302 and docs["Location"].startswith("/accounts/login/")
    _, key = create_api_token(user=user)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    schema = api.get("/api/schema/")
    assert schema.status_code == 200 and b"/api/plans/" in schema.content
    client.force_login(user)
    assert client.get("/api/docs/").status_code == 200


def test_approval_refuses_a_request_edited_after_prepare(
    tmp_path: Any, user: User, make_thread: Any, settings: Any
) -> None:
    repo, baseline, ending = make_git_repo(tmp_path)
    thread = make_thread(cwd=str(repo))
    prepared = planning.prepare_plan(
        owner=user,
        raw_configuration={
            "configurations": [{"thread_id": thread.pk, "baseline_commit": baseline,
                                "ending_commit": ending}],
            "models": ["historical"],
        },
    )  # fmt: skip
    plan = prepared.plan
    assert plan.status == "ready_for_approval", plan.blockers + plan.questions
    Turn.objects.filter(thread=thread, index=0).update(request="rm -rf the other things")
    with pytest.raises(approval.ApprovalError) as refused:
        approval.approve_plan(
            plan_id=plan.pk,
            user=user,
            approved=True,
            prepare_token=prepared.prepare_token,
            run_config=plan.configuration,
        )
    assert refused.value.kind == ErrorKind.CONFLICT
    assert "the request text of thread" in refused.value.message


def test_a_turns_request_is_read_only_in_the_admin(
    client: Any, staff_user: User, make_thread: Any
) -> None:
    turn = make_thread().turns.first()
    client.force_login(staff_user)
    form = client.get(f"/admin/replays/turn/{turn.pk}/change/").context["adminform"].form
    assert "request" not in form.fields
