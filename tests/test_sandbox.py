"""The sandbox around what a run starts (replays/sandbox.py, README "Security model").

Each attack is reproduced with real processes: a `command` agent and a verify command, run
by a real coordinator, try to read the database, the secret key, another run's folder,
Replays' own checkout and the agents file, and `/proc` of their parent (the coordinator,
whose environment holds the database's address). With the sandbox off (the single-user
mode) the attack succeeds, which is what shows it is real; with it on, it finds nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from django.conf import settings as django_settings
from django.contrib.auth.models import User

from replays import dispatch, doctor, planning, processes, runfolder, sandbox
from replays.agents.base import RunContext
from replays.agents.codex import CodexAgent
from replays.agents.problems import SetupKind, SetupProblem
from replays.factories.runs import git, make_git_repo, make_run_graph, mark_launching
from replays.models import FailureCode, PlanStatus, Run, RunStatus
from replays.runspec import RunSpec
from tests.conftest import NODE_BIN, require_tool
from tests.fakes.openai_server import OpenAIServer
from tests.fakes.scripting import Text, shell
from tests.test_dispatch import gone

MANAGE = Path(__file__).resolve().parent.parent / "manage.py"
BASE_DIR = Path(__file__).resolve().parent.parent
OTHER_REQUEST = "ANOTHER-USERS-PRIVATE-REQUEST"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def needs_bwrap() -> None:
    require_tool("/usr/bin/bwrap", "apt-get install bubblewrap")
    reason = sandbox.probe("bwrap", fresh=True)
    if reason:
        pytest.fail(reason)


class World:
    """A repository, a run root holding another user's run, an agents file, and the
    environment of coordinators started for this test's database."""

    def __init__(self, tmp_path: Path, process_env: dict[str, str], owner: User) -> None:
        self.tmp_path = tmp_path
        self.owner = owner
        self.repo, self.baseline, self.ending = make_git_repo(tmp_path)
        self.run_root = tmp_path / "runs"
        other = self.run_root / "run-999999"
        other.mkdir(parents=True)
        (other / "request.md").write_text(OTHER_REQUEST + "\n")
        self.agents_file = tmp_path / "agents.json"
        self.env = {
            **process_env,
            "REPLAYS_AGENTS_FILE": str(self.agents_file),
            "REPLAYS_RUN_ROOT": str(self.run_root),
            "REPLAYS_HEARTBEAT_SECONDS": "0.5",
        }
        self.agents: dict[str, Any] = {}
        self.agents_file.write_text("{}")

    def agent(self, name: str, command: list[str], **entry: Any) -> str:
        self.agents[name] = {"kind": "command", "command": command, "models": ["m"], **entry}
        self.agents_file.write_text(json.dumps(self.agents))
        return f"{name}:m"

    def run(self, model: str, *, mode: str, seconds: float = 120, **options: Any) -> Run:
        """One run of `model` by a real coordinator, the sandbox `mode` (bwrap | off)."""
        _, [run] = make_run_graph(
            owner=self.owner,
            repo=self.repo,
            baseline=self.baseline,
            ending=self.ending,
            models=[model],
            **options,
        )
        run = mark_launching(run)
        completed = subprocess.run(
            [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
            env={**self.env, "REPLAYS_SANDBOX": mode},
            capture_output=True,
            text=True,
            timeout=seconds,
        )
        assert completed.returncode == 0, completed.stdout + completed.stderr
        run.refresh_from_db()
        return run


@pytest.fixture
def world(tmp_path: Path, process_env: dict[str, str], user: User) -> World:
    return World(tmp_path, process_env, user)


def secrets_of_the_deployment(world: World) -> dict[str, str]:
    """What the attack prints when it succeeds, by what it tried to read."""
    found = {
        "the coordinator's environment": "DATABASE_URL=",
        "another run's folder": OTHER_REQUEST,
        "the run root around its own run": "run-999999",
        "a process of ours": "run_coordinator",
        "Replays' own checkout": 'name = "replays"',
        "the agents file": '"attacker"',
    }
    key_file = Path(django_settings.REPLAYS_VAR_DIR) / "secret_key"
    if key_file.exists():
        found["the secret key"] = key_file.read_text().strip()
    if django_settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        found["the database"] = "SQLite format 3"
    return found


def attack(world: World) -> str:
    """A shell script that tries to read what no run may read, and prints what it found."""
    database = django_settings.DATABASES["default"]
    steps = [
        "tr '\\0' '\\n' < /proc/$PPID/environ | grep -a DATABASE_URL=",
        f"cat {Path(django_settings.REPLAYS_VAR_DIR) / 'secret_key'}",
        f"head -c 15 {database['NAME']}; echo",
        f"cat {world.run_root / 'run-999999' / 'request.md'}",
        f"ls {world.run_root}",
        "cat /proc/[0-9]*/cmdline | tr '\\0' ' ' | grep -ao 'run_coord[i]nator' | head -1",
        f"grep -a '^name' {BASE_DIR / 'pyproject.toml'}",
        f"grep -o '\"attacker\"' {world.agents_file}",
    ]
    return "; ".join(f"{step} 2>/dev/null" for step in steps) + "; echo attack-done"


@pytest.mark.parametrize("mode", ["bwrap", "off"])
def test_a_command_agent_reads_nothing_of_replays_or_another_user(world: World, mode: str) -> None:
    model = world.agent("attacker", ["sh", "-c", attack(world)])
    run = world.run(model, mode=mode)
    assert run.status == RunStatus.COMPLETED, run.failure_message
    output = run.log_tail
    assert "attack-done" in output
    leaked = {what for what, text in secrets_of_the_deployment(world).items() if text in output}
    if mode == "off":
        # Unsandboxed (the single-user mode), the attack works: it is a real one.
        assert leaked == set(secrets_of_the_deployment(world)), output
    else:
        assert leaked == set(), output


@pytest.mark.parametrize("mode", ["bwrap", "off"])
def test_a_verify_command_reads_nothing_of_replays_or_another_user(world: World, mode: str) -> None:
    """The high one: a user's own verify command ran as the service account and its output
    came back in the user's report."""
    world.agent("attacker", ["true"])  # the agents file the attack looks for
    run = world.run(
        "historical",
        mode=mode,
        verify_command=shlex.join(["sh", "-c", attack(world)]),
        evaluator="tests",
    )
    assert run.status == RunStatus.COMPLETED, run.failure_message
    output = run.tree_tests["output_tail"]
    assert "attack-done" in output, run.tree_tests
    leaked = {what for what, text in secrets_of_the_deployment(world).items() if text in output}
    if mode == "off":
        assert leaked == set(secrets_of_the_deployment(world)), output
    else:
        assert leaked == set(), output


def test_a_verify_command_climbing_out_of_its_worktree_finds_no_project_around_it(
    world: World,
) -> None:
    """What pytest does looking for its configuration: every folder above the worktree up to
    the root holds nothing but the way down to the worktree (issue 16's demo failure)."""
    script = (
        "d=$PWD; while [ \"$d\" != / ]; do d=$(dirname \"$d\"); "
        "for f in \"$d\"/* \"$d\"/.[!.]*; do [ -e \"$f\" ] && echo \"FOUND $f\"; done; done; "
        f"echo REPOSITORY $(ls -A {world.repo})"
    )
    run = world.run(
        "historical",
        mode="bwrap",
        verify_command=shlex.join(["sh", "-c", script]),
        evaluator="tests",
    )
    found = [
        "/" + line.removeprefix("FOUND ").lstrip("/")
        for line in run.tree_tests["output_tail"].splitlines()
        if line.startswith("FOUND ")
    ]
    workspace = Path(run.workspace_path)
    # What tests/settings.py shows read-only (this checkout's .venv, its agent scripts):
    # the folders on the way down to them are seen, wherever the checkout lies.
    shown = [Path(path) for path in django_settings.REPLAYS_SANDBOX_READ_ONLY_PATHS]
    for path in map(Path, found):
        # Only folders on the way down to its own run, its run's own files, the repository's
        # git folder (what git needs), to what is shown read-only, the system.
        on_the_way = path in workspace.parents or path.parent == workspace.parent
        to_shown = any(path == folder or path in folder.parents for folder in shown)
        assert on_the_way or to_shown or path == world.repo or path.parent == Path("/"), path
    assert "REPOSITORY .git" in run.tree_tests["output_tail"].splitlines()
    assert not any(path.endswith("pyproject.toml") for path in found)
    assert not any("run-999999" in path for path in found)


# --- what the sandbox shows ------------------------------------------------------------------


def start(argv: list[str], tmp_path: Path, **options: Any) -> subprocess.CompletedProcess[str]:
    """argv started as runfolder.start_sandboxed starts it, in tmp_path/work."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    options = {"cwd": work, "writable": [work], "home": tmp_path / "home", **options}
    prepared = runfolder.start_sandboxed(argv, dict(os.environ), **options)
    try:
        completed = subprocess.run(
            prepared.argv,
            env=prepared.env,
            pass_fds=prepared.pass_fds,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        prepared.close()
    return completed


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on loopback that accepts connections (a model server, say)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    yield server.getsockname()[1]
    server.close()


CONNECT = "import socket, sys; socket.create_connection(('127.0.0.1', int(sys.argv[1])), 5); print('connected')"


def test_the_verify_command_has_no_network_unless_opened_and_agents_have_it(
    tmp_path: Path, listening: int
) -> None:
    closed = start([sys.executable, "-c", CONNECT, str(listening)], tmp_path, network=False)
    assert closed.returncode != 0 and "connected" not in closed.stdout
    assert "Connection refused" in closed.stderr or "unreachable" in closed.stderr
    opened = start([sys.executable, "-c", CONNECT, str(listening)], tmp_path, network=True)
    assert opened.stdout.strip() == "connected", opened.stderr
    assert runfolder.verify_network() is False  # the default (REPLAYS_SANDBOX_VERIFY_NETWORK)


def test_its_own_pid_namespace_and_a_read_only_system(tmp_path: Path) -> None:
    completed = start(
        ["sh", "-c", "ls /proc | grep -c '^[0-9]'; touch /usr/x 2>&1; touch ok && echo wrote"],
        tmp_path,
    )
    count, *rest = completed.stdout.splitlines()
    assert int(count) <= 4  # bwrap's init, sh, ls, grep: nothing else on the machine
    assert "Read-only file system" in "\n".join(rest)
    assert rest[-1] == "wrote" and (tmp_path / "work" / "ok").exists()


# Stands in for a coordinator: starts argv as the coordinator starts an agent, says the
# process's pid, then waits to be killed (before it could record that pid anywhere).
STARTER = """
import json, sys
from pathlib import Path
from replays import processes
argv, env, fds, work = json.loads(sys.argv[1])
_, identity = processes.spawn(argv, cwd=Path(work), env=env,
                              log_path=Path(work) / "agent.log", pass_fds=fds)
print(identity.pid, flush=True)
sys.stdin.read()
"""


def test_an_agent_whose_coordinator_is_killed_before_it_recorded_the_pid_does_not_outlive_it(
    tmp_path: Path,
) -> None:
    """The fault suite's orphan: a coordinator SIGKILLed between starting the agent and
    writing its pid to the run row leaves a reconcile nothing to kill; the agent would
    run (and spend) for ever. The sandbox ends with the process that started it."""
    work = tmp_path / "work"
    work.mkdir()
    marker = work / "started"
    program = ["sh", "-c", f"touch {marker}; exec sleep 300"]
    prepared = runfolder.start_sandboxed(
        program, dict(os.environ), cwd=work, writable=[work], home=tmp_path / "home"
    )
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, json.dumps([prepared.argv, prepared.env, prepared.pass_fds, str(work)])],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=BASE_DIR,
        pass_fds=prepared.pass_fds,
    )  # fmt: skip
    prepared.started()  # the read end of bwrap's status pipe stays here, as in a coordinator
    assert starter.stdout is not None
    agent = int(starter.stdout.readline())
    try:
        deadline = time.monotonic() + 20
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (work / "agent.log").read_text()
        tree = {agent, *(child.pid for child in psutil.Process(agent).children(recursive=True))}
        assert len(tree) >= 3  # bwrap, its init in the namespace, the program
        starter.kill()
        starter.wait()

        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not all(map(gone, tree)):
            time.sleep(0.05)
        assert all(map(gone, tree)), "the sandboxed agent outlived the process that started it"
    finally:
        starter.kill()
        processes.kill_tree(agent, None, grace_seconds=1)
        prepared.close()


def test_a_program_that_cannot_start_in_the_sandbox_fails_the_run_and_says_why(
    world: World,
) -> None:
    """Never a completed run with no change: a program the sandbox does not show (here one
    kept in Replays' var folder) fails the run with bwrap's reason."""
    hidden = Path(django_settings.REPLAYS_VAR_DIR) / f"agent-{os.getpid()}.sh"
    hidden.write_text("#!/bin/sh\necho hi > CHANGES.md\n")
    hidden.chmod(0o700)
    try:
        model = world.agent("hidden", [str(hidden)])
        run = world.run(model, mode="bwrap")
        # Not the model's failure: setup's, with bwrap's reason and the fix.
        assert (run.status, run.failure_code) == (RunStatus.FAILED, FailureCode.SETUP)
        assert run.failure_message.startswith(
            "Setup problem (the agent's program cannot start): The sandbox could not start the "
            "agent: bwrap: execvp "
        )
        assert "No such file or directory" in run.failure_message
        assert run.diff == ""
        unsandboxed = world.run(model, mode="off")
        assert unsandboxed.status == RunStatus.COMPLETED and "CHANGES.md" in unsandboxed.diff
    finally:
        hidden.unlink()


def test_an_agent_can_commit_and_branch_without_touching_the_repository(world: World) -> None:
    """What git needs for the worktree: the agent's commits and branches land in the run's
    own store, the diff is still collected, and the repository gains nothing."""
    refs_before = git(world.repo, "for-each-ref")
    objects_before = sorted(p.name for p in (world.repo / ".git" / "objects").rglob("*"))
    script = (
        "git checkout -q -b agent-branch && echo new > NEW.md && git add NEW.md && "
        "git -c user.name=a -c user.email=a@a commit -qm agent && git log --oneline | head -1 "
        "&& git status --short && echo committed; "
        "git -C . worktree list | wc -l; "
        f"git --git-dir={world.repo / '.git'} update-ref refs/heads/main HEAD 2>&1 | head -1"
    )
    model = world.agent("committer", ["sh", "-c", script])
    run = world.run(model, mode="bwrap")
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert "committed" in run.log_tail, run.log_tail
    assert "+new" in run.diff and "NEW.md" in run.diff
    # Only its own worktree is listed; the repository's main branch could not be moved.
    assert "Read-only file system" in run.log_tail
    assert git(world.repo, "for-each-ref") == refs_before
    assert sorted(p.name for p in (world.repo / ".git" / "objects").rglob("*")) == objects_before


# --- refused without a sandbox ---------------------------------------------------------------


def test_without_a_working_bwrap_the_doctor_says_so_and_prepare_refuses_runs(
    settings: Any, user: User, tmp_path: Path
) -> None:
    settings.REPLAYS_SANDBOX_BWRAP = str(tmp_path / "no-bwrap")
    settings.REPLAYS_SANDBOX = "bwrap"
    settings.REPLAYS_AGENTS = {"aider": {"kind": "command", "command": ["true"], "models": ["m"]}}
    reason = runfolder.sandbox_unavailable_reason(fresh=True)
    assert reason.startswith(
        f"Runs cannot start on this machine: bubblewrap ({tmp_path / 'no-bwrap'}) is not "
        "installed: install the Debian package bubblewrap."
    )
    [check] = [c for c in doctor.diagnose().checks if c.name == "sandbox"]
    assert (check.severity, check.message) == (doctor.ERROR, reason)

    repo, _, _ = make_git_repo(tmp_path)
    thread_id = make_run_graph(
        owner=user, repo=repo, baseline="HEAD", ending="HEAD", models=["historical"]
    )[1][0].thread_id
    raw = {
        "configurations": [{"thread_id": thread_id, "repository": str(repo)}],
        "models": ["aider:m"],
    }
    plan = planning.prepare_plan(owner=user, raw_configuration=raw).plan
    assert plan.status == PlanStatus.BLOCKED and reason in plan.blockers

    # The explicit single-user mode runs them unsandboxed, and every page says so.
    settings.REPLAYS_SANDBOX = "off"
    assert runfolder.sandbox_unavailable_reason(fresh=True) == ""
    [check] = [c for c in doctor.diagnose().checks if c.name == "sandbox"]
    assert check.severity == doctor.WARNING and "REPLAYS_SANDBOX=off" in check.message
    plan = planning.prepare_plan(owner=user, raw_configuration=raw).plan
    assert reason not in plan.blockers


# --- files a run could write are read safely ---------------------------------------------------


def returns_within(seconds: float, call: Callable[[], Any]) -> Any:
    """call() in a thread; fails the test when it has not returned within `seconds` (a read
    that blocks on a FIFO would hang the test otherwise)."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"{call} did not return within {seconds} s"
    return result[0] if result else None


@pytest.mark.parametrize("planted", ["fifo", "dev-zero"])
def test_an_agent_log_replaced_by_a_fifo_or_dev_zero_hangs_nothing_of_ours(
    world: World, planted: str, admin_client: Any, client: Any, user: User
) -> None:
    log = "{run_dir}/agent.log"
    plant = f"mkfifo {log}" if planted == "fifo" else f"ln -s /dev/zero {log}"
    model = world.agent("planter", ["sh", "-c", f"rm -f {log}; {plant}; echo planted; sleep 30"])
    _, [run] = make_run_graph(
        owner=user,
        repo=world.repo,
        baseline=world.baseline,
        ending=world.ending,
        models=[model],
        timeout_seconds=60,
    )
    run = mark_launching(run)
    coordinator = subprocess.Popen(
        [sys.executable, str(MANAGE), "run_coordinator", str(run.pk)],
        env={**world.env, "REPLAYS_SANDBOX": "bwrap"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        path = world.run_root / f"run-{run.pk}" / "agent.log"
        deadline = time.monotonic() + 30
        while not path.is_symlink() and not (path.exists() and path.is_fifo()):
            assert time.monotonic() < deadline, "the agent did not plant its file"
            time.sleep(0.1)
        # The coordinator's heartbeat goes on.
        first = Run.objects.get(pk=run.pk).heartbeat_at
        deadline = time.monotonic() + 20
        while Run.objects.get(pk=run.pk).heartbeat_at == first:
            assert time.monotonic() < deadline, "the heartbeat stopped"
            time.sleep(0.2)
        # The log endpoints answer.
        client.force_login(user)
        page = returns_within(10, lambda: client.get(f"/runs/{run.pk}/log/"))
        assert page.status_code in (200, 404)
        api = returns_within(10, lambda: client.get(f"/api/runs/{run.pk}/log"))
        assert api.status_code in (200, 404)
        # The coordinator dies; the host loop's reconcile reads the log and goes on.
        coordinator.kill()
        coordinator.wait(timeout=10)
        report = returns_within(30, dispatch.reconcile_runs)
        assert report.coordinator_lost == 1
    finally:
        if coordinator.poll() is None:
            coordinator.kill()
        run.refresh_from_db()
        processes.kill_tree(run.agent_pid, run.agent_pid_create_time)
    assert run.failure_code == FailureCode.COORDINATOR_LOST


# --- Codex's own sandbox inside ours ----------------------------------------------------------


@pytest.mark.cli
def test_codex_whose_commands_all_fail_in_its_sandbox_is_a_setup_failure_not_a_run_with_no_change(
    tmp_path: Path, settings: Any
) -> None:
    """FACTS.md: with bwrap installed, Codex refuses to link its sandbox helper into a
    CODEX_HOME under the temporary folder, and every command then fails while `codex exec`
    ends normally. The adapter gives Codex its own TMPDIR (the helper is linked, the command
    runs), and reads a turn whose every command failed so as a setup failure."""
    binary = require_tool(NODE_BIN / "codex", "make node")
    provider = ["model_provider=fake", 'model_providers.fake.name="fake"',
                'model_providers.fake.wire_api="responses"',
                'model_providers.fake.env_key="FAKE_KEY"']  # fmt: skip
    outcomes = {}
    for name, temporary in (("its own TMPDIR", True), ("TMPDIR /tmp", False)):
        run_dir = tmp_path / name.replace(" ", "-").replace("/", "")
        workspace = run_dir / "workspace"
        workspace.mkdir(parents=True)
        (run_dir / "request.md").write_text("Make a file.")
        context = RunContext(run_id=1, model="gpt-5.5", spec=RunSpec(), run_dir=run_dir,
                             workspace=workspace, request_file=run_dir / "request.md",
                             log_path=run_dir / "agent.log")  # fmt: skip
        with OpenAIServer([shell("echo made > made.txt"), Text("Done.")]) as server:
            args = [a for pair in provider for a in ("-c", pair)]
            args += ["-c", f'model_providers.fake.base_url="{server.api_url}"']
            agent = CodexAgent(name="codex", model="gpt-5.5", binary=str(binary), args=args,
                               env={"FAKE_KEY": "x"})  # fmt: skip
            invocation = agent.invocation(context)
            env = {**runfolder.agent_environment(invocation.env), "FAKE_KEY": "x"}
            if not temporary:
                env.pop("TMPDIR")
            process, identity = processes.spawn(
                invocation.argv, cwd=workspace, env=env, log_path=context.log_path,
                stdin_path=invocation.stdin_path,
            )  # fmt: skip
            code = processes.wait_for(process, identity, timeout_seconds=120)
        assert code == 0
        outcomes[name] = (agent.outcome(context, exit_code=0), (workspace / "made.txt").exists())
    outcome, made = outcomes["its own TMPDIR"]
    assert made and outcome.setup is None and not outcome.failed
    outcome, made = outcomes["TMPDIR /tmp"]
    assert not made
    assert outcome.failed and outcome.setup == SetupProblem(
        SetupKind.SANDBOX,
        "Codex could not run any command: its one command failed in a sandbox before "
        "running: bwrap: execvp codex-linux-sandbox: No such file or directory",
    )


@pytest.mark.parametrize("page", ["/", "/batches/", "/leaderboard/", "/threads/upload/"])
def test_every_page_says_when_runs_are_not_sandboxed(
    settings: Any, logged_in_client: Any, page: str
) -> None:
    assert "Runs are not sandboxed" not in logged_in_client.get(page).content.decode()
    settings.REPLAYS_SANDBOX = "off"
    body = logged_in_client.get(page).content.decode()
    assert 'class="sandbox-banner" role="alert"' in body
    assert "Runs are not sandboxed (REPLAYS_SANDBOX=off)" in body
    assert "every user&#x27;s data included" in body


def test_a_script_the_agents_settings_name_is_shown_and_nothing_beside_it(
    world: World, tmp_path: Path
) -> None:
    """`["sh", "/opt/tools/agent.sh"]`: the script the operator named is shown read-only
    (a value put in a placeholder never is), not the folder it lies in."""
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "secret.txt").write_text("NOT FOR RUNS\n")
    script = tools / "agent.sh"
    script.write_text(f"echo edited > CHANGES.md; cat {tools / 'secret.txt'} 2>&1; true\n")
    model = world.agent("scripted", ["sh", str(script)])
    run = world.run(model, mode="bwrap")
    assert run.status == RunStatus.COMPLETED, run.failure_message
    assert "CHANGES.md" in run.diff
    assert "NOT FOR RUNS" not in run.log_tail and "No such file" in run.log_tail
