"""Supervising one agent process: started in its own session (through its sandbox),
watched until it exits, the run's deadline passes, a cancel is asked for or it spends
past its cost cap, and stopped with everything it started. How it ended is a type, not
text: Exited(code), TIMED_OUT, CANCELLED or OVER_CAP."""

from __future__ import annotations

import logging
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from replays import processes, sandbox
from replays.agents.base import AgentNotReady
from replays.agents.problems import SetupKind, SetupProblem
from replays.processes import ProcessIdentity, pause_point

logger = logging.getLogger(__name__)

# How often the wait loop looks at the agent; heartbeats are much rarer.
POLL_SECONDS = 0.1


@dataclass(frozen=True)
class Exited:
    code: int  # negative: killed by that signal, as subprocess reports it


@dataclass(frozen=True)
class TimedOut:
    pass


@dataclass(frozen=True)
class Cancelled:
    pass


@dataclass(frozen=True)
class OverCap:
    """Stopped because what it reported spending passed the run's cost cap (a campaign's
    budget left when it started)."""


Ending = Exited | TimedOut | Cancelled | OverCap
TIMED_OUT = TimedOut()
CANCELLED = Cancelled()
OVER_CAP = OverCap()
# What a heartbeat may ask for: stop the agent, and why.
Stop = Cancelled | OverCap


class AgentProcess:
    """One agent process of a run, from its start to its end."""

    def __init__(self, *, run_id: int, log_path: Path) -> None:
        self.run_id = run_id
        self.log_path = log_path
        self.popen: subprocess.Popen[bytes] | None = None
        self.identity: ProcessIdentity | None = None
        self.ended = False

    def start(self, prepared: sandbox.Prepared, *, cwd: Path, stdin_path: Path | None) -> None:
        """Spawn it; AgentNotReady when its program cannot start (the user's setup)."""
        self.ended = False
        try:
            self.popen, self.identity = prepared.spawn(
                cwd=cwd, log_path=self.log_path, stdin_path=stdin_path
            )
        except (FileNotFoundError, PermissionError) as exc:
            if exc.filename not in (None, prepared.argv[0]):
                raise  # the working folder or the log, not the program: ours
            raise AgentNotReady(
                SetupProblem(
                    SetupKind.PROGRAM_MISSING,
                    f"{prepared.argv[0]} cannot start: {exc.strerror or exc}.",
                )
            ) from None

    def wait(self, deadline: float, beat: Callable[[], Stop | None]) -> Ending:
        """Poll it until it ends or `deadline` (time.monotonic()) passes; `beat` is called
        every heartbeat and says when to stop it (a cancel, its cost cap)."""
        assert self.popen is not None and self.identity is not None
        every = float(settings.REPLAYS_HEARTBEAT_SECONDS)
        next_beat = time.monotonic() + every
        paused = False
        while True:
            code = processes.exit_status(self.popen)
            if code is not None:
                self._reap(grace_seconds=1.0)
                return Exited(code)
            if not paused:
                paused = True
                pause_point("coordinator_agent_running")
            now = time.monotonic()
            if now >= deadline:
                logger.info("Run %s: the agent timed out; stopping it.", self.run_id)
                self.stop()
                return TIMED_OUT
            if now >= next_beat:
                next_beat = now + every
                stop = beat()
                if stop is not None:
                    logger.info("Run %s: %s; stopping the agent.", self.run_id, _WHY[type(stop)])
                    self.stop()
                    return stop
            time.sleep(min(POLL_SECONDS, max(0.0, deadline - now)))

    def stop(self) -> None:
        """Stop its whole tree unless it ended already (safe to call at any time)."""
        if self.popen is None or self.ended or self.identity is None:
            return
        self._reap(grace_seconds=3.0)

    def _reap(self, *, grace_seconds: float) -> None:
        """Stop what is left of its group (an exited agent's children too), reap it."""
        assert self.popen is not None and self.identity is not None
        processes.kill_tree(
            self.identity.pid, self.identity.create_time, grace_seconds=grace_seconds
        )
        self.popen.poll()
        self.ended = True


_WHY = {Cancelled: "cancel requested", OverCap: "it spent past its cost cap"}
