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
        home/                a sandboxed command agent's HOME
        git/                 a sandboxed worktree's private git objects and refs
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

from replays import processes, repos, sandbox

CONFIGURATION_FILE = "configuration.json"
REQUEST_FILE = "request.md"
AGENT_LOG = "agent.log"
COORDINATOR_LOG = "coordinator.log"
WORKSPACE = "workspace"
# The HOME of a sandboxed agent that its adapter gives no HOME of its own (a command agent).
AGENT_HOME = "home"
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


# --- The sandbox ------------------------------------------------------------------------


def sandbox_required() -> bool:
    """Runs start in a sandbox (REPLAYS_SANDBOX=bwrap), not in the single-user mode."""
    return settings.REPLAYS_SANDBOX != "off"


def sandbox_unavailable_reason(*, fresh: bool = False) -> str:
    """Why runs cannot start on this machine for want of a sandbox ("" when they can:
    bwrap works, or the operator chose to run unsandboxed)."""
    if not sandbox_required():
        return ""
    reason = sandbox.probe(settings.REPLAYS_SANDBOX_BWRAP, fresh=fresh)
    if not reason:
        return ""
    return (
        f"Runs cannot start on this machine: {reason} Every process a run starts must run "
        "in a sandbox; a single user on their own machine may set REPLAYS_SANDBOX=off "
        "instead (README, Security model)."
    )


def verify_network() -> bool:
    """The verify command gets the network only when the operator says so."""
    return bool(settings.REPLAYS_SANDBOX_VERIFY_NETWORK)


def verify_program_folders(repository: Path) -> list[Path]:
    """Where a verify command's program may lie to be shown in its sandbox (beyond the
    system and REPLAYS_SANDBOX_READ_ONLY_PATHS): the run's repository (its .venv, its
    node_modules/.bin), and the Python Replays runs on (`python -m pytest` with it, as the
    demo does: an interpreter and its packages, no data)."""
    return [repository, Path(sys.prefix), Path(sys.base_prefix)]


def protected_paths() -> list[Path]:
    """What no sandbox may show, wherever it lies: our var folder (database, uploads,
    secret key), every run's folder, Replays' own checkout, the agents file."""
    paths = [
        Path(settings.REPLAYS_VAR_DIR),
        run_root(),
        Path(settings.BASE_DIR),
        *settings.REPLAYS_SANDBOX_HIDDEN_PATHS,
    ]
    database = settings.DATABASES["default"]
    if database["ENGINE"] == "django.db.backends.sqlite3":
        name = Path(str(database["NAME"]))
        paths += [name, Path(f"{name}-wal"), Path(f"{name}-shm")]
    agents_file = str(getattr(settings, "REPLAYS_AGENTS_FILE", "") or "")
    if agents_file:
        paths.append(Path(agents_file).expanduser())
    return [Path(os.path.abspath(path)) for path in paths]


def start_sandboxed(
    argv: list[str],
    env: dict[str, str],
    *,
    cwd: Path,
    writable: list[Path],
    home: Path,
    network: bool = True,
    programs_within: list[Path] | None = None,
    files: tuple[Path, ...] = (),
    git: tuple[Path, Path] | None = None,
) -> sandbox.Prepared:
    """argv and env as they start under the sandbox (or as they are, in the single-user
    mode): `writable` folders and the system shown, `home` its HOME (made private).

    The program (argv[0]) is shown read-only with its installation (and its #!
    interpreter's), except what lies in (or holds) a protected path; with
    `programs_within`, only when the program itself lies in one of those folders (a
    user's verify command names its own program: beyond the system, only one of its
    repository's, such as its .venv, is shown). `files` are shown read-only as well (a
    `command` agent's script its settings name). `git` is (repository, worktree) for a
    process working in a worktree: what git needs for it is shown (sandbox.GitAccess), its
    private state kept beside the worktree. Raises sandbox.SandboxUnavailable when bwrap
    does not work here.
    """
    if not sandbox_required():
        return sandbox.unsandboxed(argv, env)
    reason = sandbox_unavailable_reason()
    if reason:
        raise sandbox.SandboxUnavailable(reason)
    protected = protected_paths()
    path_variable = env.get("PATH") or os.environ.get("PATH", os.defpath)
    readable: list[Path] = [Path(path) for path in settings.REPLAYS_SANDBOX_READ_ONLY_PATHS]
    found = sandbox.find_program(argv[0], path_variable, cwd=cwd)
    if found is not None and (programs_within is None or sandbox.contained(found, programs_within)):
        readable += sandbox.installation_roots(found, path_variable)
    readable += list(files)
    readable = [
        path
        for path in readable
        if not sandbox.encloses(path, protected)
        and not sandbox.contained(path, [Path(settings.REPLAYS_VAR_DIR), run_root()])
    ]
    access = None
    if git is not None:
        repository, worktree = git
        common_dir, admin_dir = repos.worktree_git_dirs(repository, worktree)
        access = sandbox.GitAccess(
            common_dir=common_dir,
            admin_dir=admin_dir,
            state=git_state(worktree),
            alternates=sandbox.object_alternates(common_dir / "objects"),
        )
    home.mkdir(mode=0o700, parents=True, exist_ok=True)
    # The tests' marker folders (tests/settings.py); never set in a deployment.
    writable = [*writable, *getattr(settings, "REPLAYS_TEST_SANDBOX_WRITABLE", [])]
    policy = sandbox.Policy(
        cwd=cwd,
        writable=tuple(writable),
        readable=tuple(readable),
        hidden=tuple(protected),
        network=network,
        git=access,
    )
    # Our own HOME is not inside; a HOME the program was given (Claude Code's) stays.
    if env.get("HOME") in (None, "", os.environ.get("HOME")):
        env = {**env, "HOME": str(home)}
    return sandbox.prepare(policy, argv, env, bwrap=settings.REPLAYS_SANDBOX_BWRAP)


def git_state(worktree: Path) -> Path:
    """Where a sandboxed worktree's private git objects and refs are kept: beside it."""
    return worktree.parent / sandbox.GIT_STATE


def collected_objects(worktree: Path) -> Path | None:
    """The private object store a sandboxed process's git wrote to in `worktree` (its
    commits), for our own git to read the worktree with; None when there is none."""
    try:
        return sandbox.objects_for_collecting(git_state(worktree))
    except OSError:
        return None


def manage_command(*args: str) -> list[str]:
    """argv of one of our management commands, as the processes we start run it."""
    return [sys.executable, str(Path(settings.BASE_DIR) / "manage.py"), *args]
