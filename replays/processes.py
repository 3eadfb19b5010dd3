"""Processes we start and must be able to find and stop again, even after a restart.

A pid alone does not identify a process once it may have been reused, so every
process is identified by its pid together with its create time (psutil). Agents
and coordinators start in their own session, so a kill of the process group
also reaches their grandchildren.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

# Two create times closer than this are the same process (psutil rounds differently per call).
CREATE_TIME_TOLERANCE = 0.05


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
) -> tuple[subprocess.Popen[bytes], ProcessIdentity]:
    """Start argv (never through a shell) in its own session, output appended to log_path."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log, (
        stdin_path.open("rb") if stdin_path else open(os.devnull, "rb")
    ) as stdin:
        process = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=stdin,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    identity = identity_of(process.pid)
    if identity is None:
        # It already ended; a create time of 0 never matches a live process.
        identity = ProcessIdentity(process.pid, 0.0)
    return process, identity


def _tree(pid: int, create_time: float | None) -> list[psutil.Process]:
    """The process (if it is still the same one) and all its descendants."""
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > CREATE_TIME_TOLERANCE:
            return []
        return [root, *root.children(recursive=True)]
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return []


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


def pause_point(name: str) -> None:
    """Crash tests stop a real process at a named step of the protocol and kill -9 it there.

    When REPLAYS_TEST_PAUSE_AT names this step, write REPLAYS_TEST_PAUSE_FILE (so the
    test knows the step was reached) and sleep until killed. Does nothing otherwise.
    """
    if os.environ.get("REPLAYS_TEST_PAUSE_AT") != name:
        return
    marker = os.environ.get("REPLAYS_TEST_PAUSE_FILE")
    if marker:
        Path(marker).write_text(f"{name} {os.getpid()}\n")
    while True:
        time.sleep(60)
