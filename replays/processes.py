"""Processes we start and must be able to find and stop again, even after a restart.

A pid alone does not identify a process once it may have been reused, so every
process is identified by its pid together with its create time (psutil). Agents
and coordinators start in their own session, so a kill of the process group
also reaches their grandchildren.
"""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import psutil

# Two create times closer than this are the same process (psutil rounds differently per call).
CREATE_TIME_TOLERANCE = 0.05


# Ours: whatever runs code a model or a repository chose (agents, verify commands,
# evaluators, git on an agent's tree) gets no database, broker or secret key, and a
# Django project it works on must not pick up our settings module.
SECRET_VARIABLES = frozenset({"DATABASE_URL", "REDIS_URL", "SECRET_KEY", "DJANGO_SETTINGS_MODULE"})


def without_secrets(env: Mapping[str, str]) -> dict[str, str]:
    """`env` without our secrets and without our own REPLAYS_* settings."""
    return {
        key: value
        for key, value in env.items()
        if key not in SECRET_VARIABLES and not key.startswith("REPLAYS_")
    }


class StopRequested(Exception):
    """Raised to stop the work in hand: by a heartbeat that finds a cancel or a lost claim,
    or by a signal handler. Whoever catches errors to record them as data (a failed review,
    say) lets this one through."""


@dataclass(frozen=True)
class ProcessIdentity:
    pid: int
    create_time: float

    def __str__(self) -> str:
        return f"{self.pid}@{self.create_time:.2f}"


def identity_of(pid: int) -> ProcessIdentity | None:
    """The identity of a live process, None if there is none with that pid."""
    try:
        return ProcessIdentity(pid, psutil.Process(pid).create_time())
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return None


def own_identity() -> ProcessIdentity:
    identity = identity_of(os.getpid())
    assert identity is not None
    return identity


def is_alive(pid: int | None, create_time: float | None) -> bool:
    """True when the process with this pid is still the one started at create_time.

    A zombie has finished its work and only waits to be reaped: it counts as gone.
    """
    if not pid or create_time is None:
        return False
    try:
        process = psutil.Process(pid)
        if abs(process.create_time() - create_time) > CREATE_TIME_TOLERANCE:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):
        return False


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    stdin_path: Path | None = None,
    pass_fds: Sequence[int] = (),
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """Start argv (never through a shell) in its own session, output appended to log_path.

    The log may lie where an earlier process of the same run could write (its run
    folder): it is opened without following a link and never a FIFO or a device, so an
    agent cannot point the next turn's output at a file of ours or make the start hang.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with (
        open_log_for_append(log_path) as log,
        stdin_path.open("rb") if stdin_path else open(os.devnull, "rb") as stdin,
    ):
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            pass_fds=tuple(pass_fds),
        )
    identity = identity_of(process.pid)
    if identity is None:
        # It already ended; a create time of 0 never matches a live process.
        identity = ProcessIdentity(process.pid, 0.0)
    return process, identity


# Coordinators forked by this process that it has not reaped yet (see fork_detached).
_forked: set[int] = set()

# Held while this process has an flock on an open file (repos' worktree lock, taken by a
# reconcile in a worker's host-loop thread): an flock belongs to the open file, so a child
# forked meanwhile would hold it for its whole life, and its own later lock on the same
# repository would wait for ever on itself (found by the fault suite).
_no_fork = threading.Lock()


@contextmanager
def no_fork() -> Iterator[None]:
    """No fork_detached in this process while the block runs."""
    with _no_fork:
        yield


def fork_detached(
    function: Callable[[], object],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
) -> ProcessIdentity:
    """Run function() in a new process forked from this one, in its own session, output
    appended to log_path; the new process's identity. Like spawn(), without starting a
    new interpreter: the child starts with everything this process already imported.

    The caller closes what must not be shared first (database connections). The child
    is its own session leader like a spawned process, so killing it (or its group)
    kills no other process; it ends with os._exit, so no exit handler of this process
    runs twice, and an exception is printed to its log and ends it with code 1. This
    process reaps the children it forked that have ended each time it forks again (a
    child that ended meanwhile is a zombie, which is_alive counts as gone); a second
    fork to hand the child to init would make every start wait for a process that a
    busy machine schedules late.
    """
    reap_forked()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    try:
        with _no_fork:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                _no_fork.release()  # the forking thread held it: free the child's copy
                _forked_child(function, cwd=cwd, env=env, log_fd=log_fd)
    finally:
        os.close(log_fd)
    _forked.add(pid)
    identity = identity_of(pid)
    # It already ended; a create time of 0 never matches a live process.
    return identity or ProcessIdentity(pid, 0.0)


def reap_forked() -> None:
    """Collect the exit status of the children fork_detached started that have ended."""
    for pid in list(_forked):
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done = pid
        if done:
            _forked.discard(pid)


def _forked_child(
    function: Callable[[], object], *, cwd: Path, env: Mapping[str, str], log_fd: int
) -> None:  # pragma: no cover - runs in the child
    """The forked process: its own session, files and environment, then function(). Never
    returns."""
    code = 1
    try:
        _forked.clear()  # the parent's children are not ours to reap
        os.setsid()
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        os.close(devnull)
        os.close(log_fd)
        # The parent's handlers (a task worker's) are not ours.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stdout = open(1, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", buffering=1, closefd=False)  # noqa: SIM115
        function()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _tree(pid: int, create_time: float | None) -> list[psutil.Process]:
    """The process (if it is still the same one) and all its descendants."""
    try:
        root = psutil.Process(pid)
        if (
            create_time is not None
            and abs(root.create_time() - create_time) > CREATE_TIME_TOLERANCE
        ):
            return []
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


def record_started(path: Path, identity: ProcessIdentity) -> None:
    """Append a started process's identity to `path` (see `kill_recorded`)."""
    with path.open("a", encoding="ascii") as out:
        out.write(f"{identity.pid} {identity.create_time!r}\n")


def kill_recorded(path: Path, *, grace_seconds: float = 3.0) -> int:
    """Stop the trees of the processes recorded in `path` (record_started) that still run;
    how many there were. A pid reused since by another process is left alone: the create
    time must match. Only meaningful on the machine that recorded them."""
    try:
        lines = path.read_text(encoding="ascii").split("\n")
    except (FileNotFoundError, UnicodeDecodeError):
        return 0
    stopped = 0
    for line in lines:
        pid, _, create_time = line.partition(" ")
        try:
            identity = ProcessIdentity(int(pid), float(create_time))
        except ValueError:
            continue  # a line cut by a crash while it was written
        if is_alive(identity.pid, identity.create_time):
            kill_tree(identity.pid, identity.create_time, grace_seconds=grace_seconds)
            stopped += 1
    return stopped


def kill_tree(pid: int | None, create_time: float | None, *, grace_seconds: float = 3.0) -> None:
    """Stop a process, its process group and all its descendants: terminate, wait, then kill.

    The group catches grandchildren whose parent already exited (they are reparented
    and no longer descendants); the descendant walk catches children that left the group.
    """
    if not pid:
        return
    processes = _tree(pid, create_time)
    if not processes:
        return
    group_leader = _is_group_leader(pid)
    _signal_all(pid, processes, signal.SIGTERM, group_leader)
    _, alive = psutil.wait_procs(processes, timeout=grace_seconds)
    alive += _tree_members_left(pid, group_leader)
    if alive:
        _signal_all(pid, alive, signal.SIGKILL, group_leader)
        psutil.wait_procs(alive, timeout=grace_seconds)


def _is_group_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _tree_members_left(pgid: int, group_leader: bool) -> list[psutil.Process]:
    if not group_leader:
        return []
    left = []
    for process in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(process.pid) == pgid and process.status() != psutil.STATUS_ZOMBIE:
                left.append(process)
        except (OSError, psutil.NoSuchProcess):
            continue
    return left


def _signal_all(
    pid: int, processes: list[psutil.Process], sig: signal.Signals, group_leader: bool
) -> None:
    if group_leader:
        try:
            os.killpg(pid, sig)
        except OSError:
            pass
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


_ANSI_ESCAPE_RE = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
# C0 controls except tab and newline; NUL in particular cannot be stored in PostgreSQL text.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


# What a log served as text shows as `\xNN` / `\uNNNN` rather than sends raw: C0 controls
# but tab and newline, DEL, C1 controls, and the bidirectional overrides that reorder what
# a reader sees.
_INVISIBLE_RE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible_controls(text: str) -> str:
    """`text` with every terminal escape and control character written out as text
    (ESC as `\x1b`), so a log shown in a browser or a terminal cannot drive it, and a
    reader still sees what the program printed."""
    text = text.replace("\r\n", "\n")

    def shown(match: re.Match[str]) -> str:
        code = ord(match.group())
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _INVISIBLE_RE.sub(shown, text)


def plain_text(text: str) -> str:
    """Text safe to store and show: no terminal escapes, no control characters but tab/newline.

    Here, below Django, so that plain modules (evaluation.checks) can read the logs
    of what they spawn without importing the agents package.
    """
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    return _CONTROL_RE.sub("", _ANSI_ESCAPE_RE.sub("", text))


# --- Files a run's processes could have written -------------------------------------
#
# Everything under a run's folder or worktree may have been replaced by its agent: a link
# to a file of ours, a FIFO that blocks whoever opens it, a link to /dev/zero that never
# ends. Such files are opened without following a link and without blocking, used only
# when they are regular files, and read no further than a bound.

_SAFE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UnsafeFile(OSError):
    """A file a run could have written is a link, a FIFO, a device or a folder: not read."""


@contextmanager
def open_untrusted(path: Path) -> Iterator[BinaryIO]:
    """`path` opened for reading if it is a regular file (never through a link, never
    waiting on a FIFO); FileNotFoundError when it is missing, UnsafeFile when it is
    something else."""
    try:
        descriptor = os.open(path, _SAFE_READ)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeFile(errno.ELOOP, "it is a symbolic link", str(path)) from None
        raise
    handle = os.fdopen(descriptor, "rb")
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise UnsafeFile(errno.EINVAL, "it is not a regular file", str(path))
        os.set_blocking(descriptor, True)
        yield handle
    finally:
        handle.close()


def read_untrusted(path: Path, *, max_bytes: int) -> bytes:
    """The content of a file a run could have written, at most max_bytes + 1 bytes (so a
    caller can tell "larger than the bound"); errors as open_untrusted."""
    with open_untrusted(path) as handle:
        return handle.read(max_bytes + 1)


def read_untrusted_end(path: Path, *, max_bytes: int) -> tuple[bytes, int]:
    """The last max_bytes of a file a run could have written, and how many bytes come
    before them; errors as open_untrusted."""
    with open_untrusted(path) as handle:
        size = os.fstat(handle.fileno()).st_size
        cut = max(0, size - max_bytes)
        handle.seek(cut)
        return handle.read(max_bytes), cut


def open_log_for_append(path: Path) -> BinaryIO:
    """A log file opened for appending (created 0600 when missing), refused when something
    else stands at its path (UnsafeFile): output never goes through a link or into a FIFO."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        descriptor = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENXIO):
            raise UnsafeFile(exc.errno, "it is not a regular file", str(path)) from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise UnsafeFile(errno.EINVAL, "it is not a regular file", str(path))
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "ab")


def read_tail(path: Path, *, max_bytes: int = 64 * 1024, max_lines: int = 200) -> str:
    """The last lines of a process's log file as plain text ("" when it does not exist or
    is not a regular file: see open_untrusted)."""
    try:
        data, cut = read_untrusted_end(path, max_bytes=max_bytes)
    except OSError:
        return ""
    size = cut + len(data)
    if size > max_bytes:
        # Cut at a line start: the first line read is usually a fragment.
        newline = data.find(b"\n")
        if 0 <= newline < len(data) - 1:
            data = data[newline + 1 :]
    lines = plain_text(data.decode("utf-8", errors="replace")).split("\n")
    return "\n".join(lines[-max_lines:])


# How often wait_for looks at the process; ticks (heartbeats) are usually much rarer.
WAIT_POLL_SECONDS = 0.1


def exit_status(process: subprocess.Popen[bytes]) -> int | None:
    """The exit code of our child once it ended, without reaping it (None while it runs).

    Left unreaped, the finished process still holds its process group id, so
    kill_tree can stop what it left running in that group before it is reaped.
    A negative code means killed by that signal, as subprocess reports it.
    """
    if process.returncode is not None:
        return process.returncode
    try:
        info = os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        # Reaped elsewhere already; Popen may still know the code.
        code = process.poll()
        return -1 if code is None else code
    if info is None:
        return None
    if info.si_code == os.CLD_EXITED:
        return info.si_status
    return -info.si_status


def wait_for(
    process: subprocess.Popen[bytes],
    identity: ProcessIdentity,
    *,
    timeout_seconds: float,
    tick: Callable[[], None] | None = None,
    tick_seconds: float = 1.0,
    grace_seconds: float = 3.0,
) -> int | None:
    """Wait for a process started by spawn; its exit code, or None when it timed out.

    On timeout the whole tree is stopped (kill_tree) and reaped. After a normal
    exit, whatever it left running in its group is stopped too (a test server, a
    watcher), so nothing it started outlives it. `tick` is called every
    tick_seconds while waiting (heartbeats, cancel checks); if it raises, the tree
    is stopped and the exception goes on to the caller.
    """
    started = time.monotonic()
    deadline = started + timeout_seconds
    next_tick = started + tick_seconds
    try:
        while True:
            code = exit_status(process)
            if code is not None:
                _stop(process, identity, grace_seconds=min(grace_seconds, 1.0))
                return code
            now = time.monotonic()
            if now >= deadline:
                _stop(process, identity, grace_seconds=grace_seconds)
                return None
            if tick is not None and now >= next_tick:
                next_tick = now + tick_seconds
                tick()
            wake = min(deadline, next_tick) if tick is not None else deadline
            time.sleep(min(WAIT_POLL_SECONDS, max(0.0, wake - time.monotonic())))
    except BaseException:
        # A raising tick, KeyboardInterrupt, a signal turned into an exception:
        # the process must not keep running unwatched.
        _stop(process, identity, grace_seconds=grace_seconds)
        raise


def _stop(
    process: subprocess.Popen[bytes], identity: ProcessIdentity, *, grace_seconds: float
) -> None:
    """Stop the tree of a process we started, then reap it (no zombie left behind)."""
    kill_tree(identity.pid, identity.create_time, grace_seconds=grace_seconds)
    if process.poll() is None:
        process.kill()
        process.wait()


_test_hooks = False


def enable_test_hooks(enabled: bool) -> None:
    """Called once at start-up from the settings: only tests/settings.py turns them on."""
    global _test_hooks
    _test_hooks = bool(enabled)


def pause_point(name: str) -> None:
    """Crash tests stop a real process at a named step of the protocol and kill -9 it there.

    Under the test settings only (REPLAYS_TEST_HOOKS, which no deployment sets): when
    REPLAYS_TEST_PAUSE_AT names this step, write REPLAYS_TEST_PAUSE_FILE (so the test
    knows the step was reached) and sleep until killed. Does nothing otherwise; agents
    never see either variable (no REPLAYS_* reaches them).
    """
    if not _test_hooks or os.environ.get("REPLAYS_TEST_PAUSE_AT") != name:
        return
    marker = os.environ.get("REPLAYS_TEST_PAUSE_FILE")
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    while True:
        time.sleep(60)
