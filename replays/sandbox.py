"""The bubblewrap sandbox around every process a run starts (agents, command agents, the
verify command, evaluators, command judges).

Plain Python, no Django: a typed Policy says what a process may see, `prepare` turns it
and the process's argv into bwrap's argv, `probe` says whether bwrap works on this
machine. What a policy shows, and nothing else:

- the system read-only: /usr (and /bin, /lib... as they are on this machine), /etc
  without its secrets (`HIDDEN`), a private /tmp, /dev, its own /proc (its own PID
  namespace: no process of ours is in it);
- its writable folders (a run's folder with its worktree and home, a judge call's
  folder) and its read-only ones (the agent's program, an operator's toolchains), each
  at its own path, so every path in argv and in the environment means the same inside;
- for a worktree, what git needs: the repository's git folder read-only, the worktree's
  own admin folder writable, and private copies of the object store and refs, so the
  agent can commit and branch without writing into the repository (`GitAccess`);
- the network, unless the policy says no (the verify command's default).

Folders around the ones shown are empty folders bwrap makes: nothing of what lies around
a run root (Replays' own checkout, its var folder, other runs) is there.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from replays import processes

# The system as every sandbox sees it, read-only (those that exist here; a link such as
# /bin -> usr/bin is made as the same link inside).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
# Inside those, what no run may read: account secrets, host keys, Replays' own deployment
# folder (deploy/replays.env.example lives at /etc/replays).
HIDDEN = (
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/sudoers",
    "/etc/sudoers.d",
    "/etc/ssh",
    "/etc/ssl/private",
    "/etc/replays",
)
# The real object store of a worktree's repository, inside the sandbox: the private store
# (at the repository's own objects path) borrows from it.
SOURCE_OBJECTS = Path("/run/replays-git/objects")
# Private git files of one sandboxed worktree, in its run's folder (see GitAccess).
GIT_STATE = "git"
# How long a probe's answer is trusted (a web process runs for days; bwrap may be
# installed meanwhile).
PROBE_SECONDS = 60.0
PROBE_TIMEOUT_SECONDS = 20
# Lines of bwrap's own output that explain why it could not start the program.
_BWRAP_PREFIX = "bwrap: "


class SandboxUnavailable(Exception):
    """bwrap is missing or cannot create the namespaces a sandbox needs; str() says why."""


@dataclass(frozen=True)
class GitAccess:
    """What git needs for one worktree, inside the sandbox.

    `common_dir` (the repository's git folder) is shown read-only, with three private
    folders of `state` (in the run's own folder) over it: objects (empty, borrowing the
    real store, shown read-only at SOURCE_OBJECTS), refs (a copy) and logs. Commits and
    branches of the agent land there, never in the repository; `admin_dir` (the
    worktree's HEAD and index) is writable, except its two files that say where the
    worktree and the repository are. Other worktrees' admin folders are not shown.
    """

    common_dir: Path
    admin_dir: Path
    state: Path
    # Object stores the repository's own borrows from (objects/info/alternates, followed):
    # shown read-only at their own paths.
    alternates: tuple[Path, ...] = ()


@dataclass(frozen=True)
class Policy:
    """What one sandboxed process sees. Paths are absolute; each is shown at its own path."""

    cwd: Path
    writable: tuple[Path, ...]
    readable: tuple[Path, ...] = ()
    # Shown as empty (a folder) or as /dev/null (a file), wherever they lie in what is shown.
    hidden: tuple[Path, ...] = ()
    network: bool = True
    git: GitAccess | None = None


@dataclass
class Prepared:
    """One sandboxed start: the argv and environment to spawn, and bwrap's status pipe.

    Pass `pass_fds` to the spawn, call `started()` right after it, and `failure()` once
    the process exited (not killed by us): "" when the program ran, else why the sandbox
    could not start it.
    """

    argv: list[str]
    env: dict[str, str]
    pass_fds: tuple[int, ...] = ()
    _read_fd: int | None = None
    _write_fd: int | None = None
    _status: str = field(default="", repr=False)

    def spawn(
        self, *, cwd: Path, log_path: Path, stdin_path: Path | None = None
    ) -> tuple[subprocess.Popen[bytes], processes.ProcessIdentity]:
        """Start it (processes.spawn: its own session, output to log_path); its process and
        identity. OSError when it cannot start."""
        try:
            return processes.spawn(
                self.argv,
                cwd=cwd,
                env=self.env,
                log_path=log_path,
                stdin_path=stdin_path,
                pass_fds=self.pass_fds,
            )
        finally:
            self.started()

    def started(self) -> None:
        """The spawn is done: the parent's copy of the pipe's write end goes."""
        if self._write_fd is not None:
            os.close(self._write_fd)
            self._write_fd = None

    def failure(self, log_text: str = "") -> str:
        """Why bwrap did not run the program ("" when it did, or when not sandboxed). bwrap
        writes an exit-code line only for a program it started; without one, its own
        message (a line "bwrap: ..." of the log) is the reason."""
        if self._read_fd is None:
            return ""
        self._status += _drain(self._read_fd)
        self.close()
        if '"exit-code"' in self._status:
            return ""
        reasons = [line.strip() for line in log_text.splitlines() if line.startswith(_BWRAP_PREFIX)]
        return reasons[-1] if reasons else "bwrap ended before the program started."

    def close(self) -> None:
        for fd in (self._read_fd, self._write_fd):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._read_fd = self._write_fd = None


def unsandboxed(argv: Sequence[str], env: Mapping[str, str]) -> Prepared:
    """A start without a sandbox (the operator's explicit single-user mode)."""
    return Prepared(argv=list(argv), env=dict(env))


def prepare(policy: Policy, argv: Sequence[str], env: Mapping[str, str], *, bwrap: str) -> Prepared:
    """The sandboxed start of argv under `policy` (bwrap's status goes to a pipe)."""
    if policy.git is not None:
        _prepare_git_state(policy.git)
    read_fd, write_fd = os.pipe()
    os.set_inheritable(write_fd, True)
    command = [bwrap, *bwrap_arguments(policy), "--json-status-fd", str(write_fd), "--", *argv]
    return Prepared(
        argv=command, env=dict(env), pass_fds=(write_fd,), _read_fd=read_fd, _write_fd=write_fd
    )


def bwrap_arguments(policy: Policy) -> list[str]:
    """bwrap's options for `policy` (without the program)."""
    args = [
        # Killed with the process that started it (a coordinator SIGKILLed before it
        # wrote the agent's pid anywhere would leave it running, and spending, for ever).
        "--die-with-parent",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--hostname",
        "sandbox",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/var/tmp",
        "--tmpfs",
        "/run",
    ]
    if not policy.network:
        args.append("--unshare-net")
    shown: list[Path] = []
    for system in SYSTEM_PATHS:
        path = Path(system)
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), system]
        elif path.is_dir():
            args += ["--ro-bind", system, system]
            shown.append(path)
    resolver = _resolver_folder()
    if resolver is not None:
        args += ["--ro-bind", str(resolver), str(resolver)]
    for path in _distinct(policy.readable):
        if path.exists() and not any(_inside(path, root) for root in shown):
            args += ["--ro-bind", str(path), str(path)]
            shown.append(path)
    # Hidden after everything read-only is shown (a hidden path may lie inside it), before
    # the writable folders, which are the policy's own even where they lie inside one.
    masked: list[Path] = []
    for path in _distinct([*map(Path, HIDDEN), *policy.hidden]):
        if not any(_inside(path, root) for root in shown) or not os.path.lexists(path):
            continue
        if path.is_dir() and not path.is_symlink():
            args += ["--tmpfs", str(path)]
        else:
            args += ["--ro-bind", os.devnull, str(path)]
        masked.append(path)
    # A read-only folder inside a hidden one (a program in an operator's folder that also
    # holds a protected path) is shown again.
    for path in _distinct(policy.readable):
        if path.exists() and any(_inside(path, hidden) and path != hidden for hidden in masked):
            args += ["--ro-bind", str(path), str(path)]
    for path in _distinct(policy.writable):
        args += ["--bind", str(path), str(path)]
    if policy.git is not None:
        args += _git_arguments(policy.git)
    args += ["--chdir", str(policy.cwd)]
    return args


# --- git ------------------------------------------------------------------------------


def _git_arguments(git: GitAccess) -> list[str]:
    common, admin, state = git.common_dir, git.admin_dir, git.state
    args = ["--ro-bind", str(common), str(common)]
    for path in git.alternates:
        args += ["--ro-bind", str(path), str(path)]
    args += ["--ro-bind", str(common / "objects"), str(SOURCE_OBJECTS)]
    args += ["--bind", str(state / "objects"), str(common / "objects")]
    args += ["--bind", str(state / "refs"), str(common / "refs")]
    if (common / "logs").is_dir():
        args += ["--bind", str(state / "logs"), str(common / "logs")]
    # Other runs' worktrees (their index names their files) are not this one's business.
    args += ["--tmpfs", str(common / "worktrees"), "--bind", str(admin), str(admin)]
    for name in ("gitdir", "commondir"):
        if (admin / name).is_file():
            args += ["--ro-bind", str(admin / name), str(admin / name)]
    return args


def _prepare_git_state(git: GitAccess) -> None:
    """The private objects, refs and logs of a sandboxed worktree (made once per state
    folder; the objects' alternates file is written again before every start, since the
    sandboxed process may have changed it)."""
    state = git.state
    objects = state / "objects"
    (objects / "info").mkdir(mode=0o700, parents=True, exist_ok=True)
    (objects / "pack").mkdir(mode=0o700, exist_ok=True)
    refs = state / "refs"
    if not refs.is_dir():
        copy = state / "refs.partial"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(git.common_dir / "refs", copy, symlinks=True)
        os.replace(copy, refs)
    (state / "logs").mkdir(mode=0o700, exist_ok=True)
    _write_alternates(objects, f"{SOURCE_OBJECTS}\n")


def objects_for_collecting(state: Path) -> Path | None:
    """The private object store of a sandboxed worktree, ready for our own git outside the
    sandbox (its alternates emptied: what the sandboxed process wrote there is not ours to
    follow); None when there is none."""
    objects = state / "objects"
    if not objects.is_dir() or objects.is_symlink():
        return None
    _write_alternates(objects, "")
    return objects


def _write_alternates(objects: Path, text: str) -> None:
    info = objects / "info"
    if info.is_symlink() or not info.is_dir():
        if info.is_symlink() or info.exists():
            info.unlink()
        info.mkdir(mode=0o700)
    path = info / "alternates"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        path.unlink()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)


def object_alternates(objects: Path) -> tuple[Path, ...]:
    """The object stores `objects` borrows from (objects/info/alternates), followed."""
    found: list[Path] = []
    pending = [objects]
    while pending and len(found) < 32:
        current = pending.pop()
        try:
            lines = (current / "info" / "alternates").read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError):
            continue
        for line in lines:
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            path = Path(line) if os.path.isabs(line) else (current / line)
            path = Path(os.path.normpath(path))
            if path.is_dir() and path not in found:
                found.append(path)
                pending.append(path)
    return tuple(found)


# --- programs ---------------------------------------------------------------------------


def find_program(program: str, path_variable: str, *, cwd: Path) -> Path | None:
    """Where `program` (argv[0]) is: a path (relative to cwd), or a name on the PATH."""
    if os.sep in program:
        path = Path(program).expanduser()
        path = path if path.is_absolute() else cwd / path
        return Path(os.path.abspath(path)) if path.exists() else None
    found = shutil.which(program, path=path_variable)
    return Path(os.path.abspath(found)) if found else None


def installation_roots(found: Path, path_variable: str) -> list[Path]:
    """The folders a program needs to run, to show read-only: its installation (the
    node_modules folder it is in, the prefix of its bin/ folder, its own folder), for the
    path as given and with links followed, and the same for the interpreter its #! line
    names."""
    roots: list[Path] = []
    for path in (found, Path(os.path.realpath(found))):
        roots.append(_installation_root(path))
    interpreter = _interpreter(Path(os.path.realpath(found)), path_variable)
    if interpreter is not None:
        for path in (interpreter, Path(os.path.realpath(interpreter))):
            roots.append(_installation_root(path))
    return _distinct(roots)


def _installation_root(path: Path) -> Path:
    """A program's installation: the node_modules folder it is in; the prefix of its bin/
    folder when that prefix is an installation (it has lib/ too: a Python, a venv, an npm
    prefix), never a home folder or ~/.local, which hold far more than programs; else the
    program's own folder."""
    for parent in path.parents:
        if parent.name == "node_modules":
            return parent
    folder = path.parent
    prefix = folder.parent
    if (
        folder.name in ("bin", "sbin")
        and prefix != Path("/")
        and prefix.name != ".local"
        and prefix != Path.home()
        and (prefix / "lib").is_dir()
    ):
        return prefix
    return folder


def _interpreter(script: Path, path_variable: str) -> Path | None:
    """The program a script's #! line runs (`#!/usr/bin/env node` -> node on PATH)."""
    try:
        with script.open("rb") as handle:
            head = handle.read(256)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    words = head[2:].split(b"\n", 1)[0].decode("utf-8", errors="replace").split()
    if not words:
        return None
    if Path(words[0]).name == "env":
        names = [word for word in words[1:] if not word.startswith("-") and "=" not in word]
        return find_program(names[0], path_variable, cwd=Path("/")) if names else None
    return Path(words[0])


# --- what went wrong --------------------------------------------------------------------

# What a command's output says when the agent's own sandbox (Codex's bwrap helper,
# landlock, seccomp), or ours, stopped it before it did anything.
SANDBOX_FAILURE_MARKERS = (
    "bwrap: ",
    "codex-linux-sandbox",
    "Refusing to create helper binaries",
    "landlock",
    "Sandbox(",
    "sandbox error",
    "failed in sandbox",
)


def sandbox_failure(output: str) -> str:
    """The line of a failed command's output that shows a sandbox stopped it ("" when none
    does)."""
    for line in output.splitlines():
        if any(marker in line for marker in SANDBOX_FAILURE_MARKERS):
            return line.strip()[:500]
    return ""


# --- does bwrap work here ---------------------------------------------------------------

_probed: dict[str, tuple[float, str]] = {}


def probe(bwrap: str, *, fresh: bool = False) -> str:
    """Why bwrap cannot sandbox a process on this machine ("" when it can): missing, or
    unable to make the namespaces (a container without user namespaces, say). A real
    sandbox, network off, runs `true`; the answer is kept PROBE_SECONDS."""
    now = time.monotonic()
    cached = _probed.get(bwrap)
    if cached is not None and not fresh and now - cached[0] < PROBE_SECONDS:
        return cached[1]
    reason = _probe(bwrap)
    _probed[bwrap] = (now, reason)
    return reason


def _probe(bwrap: str) -> str:
    program = bwrap if os.sep in bwrap else shutil.which(bwrap)
    if not program or not Path(program).is_file():
        return f"bubblewrap ({bwrap}) is not installed: install the Debian package bubblewrap."
    policy = Policy(cwd=Path("/"), writable=(), network=False)
    try:
        completed = subprocess.run(
            [program, *bwrap_arguments(policy), "--", "true"],
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bubblewrap ({program}) cannot start: {exc}"
    if completed.returncode != 0:
        said = (completed.stderr or completed.stdout).strip().splitlines()
        return (
            f"bubblewrap ({program}) cannot make a sandbox here: "
            f"{said[-1] if said else f'exit {completed.returncode}'}"
        )
    return ""


# --- helpers --------------------------------------------------------------------------


def _resolver_folder() -> Path | None:
    """Where /etc/resolv.conf leads when it is a link out of /etc (systemd-resolved's
    /run/systemd/resolve): shown too, or names would not resolve inside."""
    resolv = Path("/etc/resolv.conf")
    if not resolv.is_symlink():
        return None
    target = Path(os.path.realpath(resolv)).parent
    if any(_inside(target, Path(system)) for system in SYSTEM_PATHS):
        return None
    return target if target.is_dir() else None


def _inside(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def _distinct(paths: Iterable[Path]) -> list[Path]:
    seen: list[Path] = []
    for path in paths:
        path = Path(os.path.abspath(path))
        if path not in seen:
            seen.append(path)
    return seen


def _drain(fd: int) -> str:
    """What the pipe holds now, without waiting for more."""
    os.set_blocking(fd, False)
    chunks = []
    try:
        while True:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    except BlockingIOError:
        pass
    except OSError:
        pass
    return b"".join(chunks).decode("utf-8", errors="replace")


def contained(path: Path, roots: Iterable[Path]) -> bool:
    """True when `path` lies in (or is) one of `roots`."""
    return any(_inside(path, root) for root in roots)


def encloses(path: Path, protected: Iterable[Path]) -> bool:
    """True when `path` is one of `protected` or a folder holding one."""
    return any(_inside(item, path) for item in protected)


def regular_file_mode(mode: int) -> bool:
    return stat.S_ISREG(mode)
