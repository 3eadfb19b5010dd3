"""A run's walk from dispatch to its report passes each room of the protocol once, in
order (dispatch -> coordinator -> evaluation), and never calls back into a room before
it: watched with a profiler on a real run of the historical baseline, judged by tests."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from django.contrib.auth.models import User

from replays import coordinator, dispatch
from replays.factories.runs import make_git_repo, make_run_graph
from replays.models import Run, RunStatus

PROTOCOL = ["planning", "approval", "dispatch", "supervision", "coordinator", "evaluation"]


def room_of(frame: FrameType | None) -> str | None:
    """The protocol room of the nearest frame that is in one (walking up to callers)."""
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        parts = module.split(".")
        if parts[0] == "replays" and len(parts) > 1 and parts[1] in PROTOCOL:
            return parts[1]
        frame = frame.f_back
    return None


class Walk:
    def __init__(self) -> None:
        self.entered: list[str] = []
        self.backwards: set[tuple[str, str]] = set()

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        callee = room_of(frame)
        if callee is None:
            return
        if callee not in self.entered:
            self.entered.append(callee)
        caller = room_of(frame.f_back)
        if caller is not None and PROTOCOL.index(callee) < PROTOCOL.index(caller):
            self.backwards.add((caller, callee))


@pytest.mark.django_db(transaction=True)
def test_a_runs_walk_passes_each_room_once_in_protocol_order(
    user: User, tmp_path: Path, settings: Any
) -> None:
    settings.REPLAYS_RUN_ROOT = tmp_path / "runs"
    repo, baseline, ending = make_git_repo(tmp_path)
    _, [run] = make_run_graph(
        owner=user, repo=repo, baseline=baseline, ending=ending, models=["historical"],
        verify_command=f"{sys.executable} -c pass", evaluator="tests",
    )  # fmt: skip
    walk = Walk()
    threading.setprofile(walk)
    sys.setprofile(walk)
    try:
        [claimed] = dispatch.claim_queued_runs()
        # Here dispatch starts the coordinator's process (replays.supervision); in this
        # test the same process runs it, so one profiler sees the whole walk.
        coordinator.run_member(run_id=claimed.pk)
    finally:
        sys.setprofile(None)
        threading.setprofile(None)  # type: ignore[arg-type]
    run = Run.objects.get(pk=run.pk)
    assert run.status == RunStatus.COMPLETED and run.current_report is not None
    assert walk.entered == ["dispatch", "coordinator", "evaluation"]
    assert walk.backwards == set()
