"""Where a run's files live, and the environment of the processes started for it.

Ground layer: settings only, no ORM. The coordinator writes these files, reconcile
reads them after a lost coordinator, and evaluation runs the verify command and the
evaluator beside them, so the layout lives here, below all three.

    $REPLAYS_RUN_ROOT/run-ID/
        configuration.json   the exact approved configuration (0600)
        request.md           the request the agent gets on stdin (0600)
        agent.log            the agent's stdout and stderr
        coordinator.log      the coordinator's own output
        workspace/           the git worktree (removed after the diff is stored)
        workspace.diff       the whole diff, when the stored one had to be cut
        checks/              the verify command's log and JUnit XML for the run's tree
    $REPLAYS_RUN_ROOT/reviews/review-ID/   the shared historical review's trees and calls
    $REPLAYS_RUN_ROOT/judgments/report-ID/ one judgment's evaluator calls
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

from django.conf import settings

from replays import processes, repos

CONFIGURATION_FILE = "configuration.json"
REQUEST_FILE = "request.md"
AGENT_LOG = "agent.log"
COORDINATOR_LOG = "coordinator.log"
WORKSPACE = "workspace"
FULL_DIFF_FILE = "workspace.diff"
CHECKS_DIR = "checks"
# In a judgment's or review's folder: the evaluator processes started for it, one
# "pid create_time" per line, so whoever finds their parent gone can stop them.
EVALUATOR_PIDS = "evaluators.pids"


def run_root() -> Path:
    return Path(settings.REPLAYS_RUN_ROOT)


def run_folder(run_id: int) -> Path:
    return run_root() / f"run-{run_id}"


class UnsafeRunFolder(Exception):
    """A run's folder exists as something we did not make (a link, a file): refused."""


def create_run_folder(run_id: int) -> Path:
    """The run's folder, made private (0700) and never through a link: a link or a file
    already standing at its path is refused, never followed. A folder that exists already
    is the one the dispatcher made for the coordinator's log."""
    root = run_root()
    root.mkdir(parents=True, exist_ok=True)
    path = run_folder(run_id)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        found = os.lstat(path)
        if stat.S_ISLNK(found.st_mode):
            raise UnsafeRunFolder(f"The run folder {path} is a link: refused.") from None
        if not stat.S_ISDIR(found.st_mode):
            raise UnsafeRunFolder(f"The run folder {path} is not a folder: refused.") from None
    return path


def review_folder(review_id: int) -> Path:
    return run_root() / "reviews" / f"review-{review_id}"


def judgment_folder(report_id: int) -> Path:
    return run_root() / "judgments" / f"report-{report_id}"


def stop_evaluators(folder: Path) -> int:
    """Stop the evaluator processes recorded under `folder` (EVALUATOR_PIDS files, written
    on this host) that still run; how many."""
    if not folder.is_dir():
        return 0
    return sum(processes.kill_recorded(path) for path in sorted(folder.rglob(EVALUATOR_PIDS)))


def agent_environment(extra: dict[str, str], *, run_id: int | None = None) -> dict[str, str]:
    """Our environment without our own secrets, plus the caller's additions.

    Agents, verify commands and evaluators all run programs that a model or a
    repository chose: none gets a database URL, a secret key or our settings.
    """
    # GIT_DIR and the like, inherited from a git hook or shell, would point the agent's git
    # at another repository than its worktree.
    env = {
        key: value
        for key, value in processes.without_secrets(os.environ).items()
        if key not in repos.GIT_LOCATION_VARIABLES
    }
    env.update(extra)
    if run_id is not None:
        env["REPLAYS_RUN_ID"] = str(run_id)
    return env


def manage_command(*args: str) -> list[str]:
    """argv of one of our management commands, as the processes we start run it."""
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args]
