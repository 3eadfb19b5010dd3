"""A fresh clone's layout with `make demo` running in it, as a new user has it.

The demo's replays once ended "Not judged" for every new user while every test passed:
the tests used temporary folders, and the demo keeps `var/` (so its run folders) inside
the checkout. This copies the checkout (its tracked and new files, with their times, so
make sees the same up-to-date install), shares this checkout's `.venv` (a clone's own
would take minutes to install), and runs `make demo PORT=...` there, the README's way.
Used by tests/test_readme_commands.py and tests/screenshot.py.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PASSWORD_RE = re.compile(r"with username (\S+) and password (\S+)")
READY_LINE = "Starting the django-q2 cluster and the web server"
# Settings of this process that a new user's shell does not have.
NOT_A_USERS = ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "SECRET_KEY")


def copy_checkout(target: Path) -> Path:
    """The checkout's files (tracked and new, not ignored) copied with their times, and its
    `.venv` linked: what a clone with its install done looks like."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode()  # fmt: skip
    for name in filter(None, listed.split("\0")):
        source = ROOT / name
        if not source.is_file():
            continue  # deleted in the working tree
        destination = target / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination)
    (target / ".venv").symlink_to(ROOT / ".venv")
    return target


def users_environment(home: Path) -> dict[str, str]:
    """This environment as a user's shell has it: none of our test settings, and a home
    of the test's own (the agents' sessions are looked for there, the demo's run folders
    go in its cache)."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in NOT_A_USERS and not key.startswith(("REPLAYS_", "PYTEST_", "XDG_"))
    }
    home.mkdir(parents=True, exist_ok=True)
    env["HOME"] = str(home)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Demo:
    """`make demo PORT=...` running in `root`."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.output: list[str] = []
        self.username = self.password = ""
        self.process: subprocess.Popen[str] | None = None

    def start(self, *, seconds: float = 600) -> None:
        # The copy shares this checkout's .venv: make must find its install up to date, or
        # it would install the copy into this checkout's venv.
        installed = subprocess.run(
            ["make", "-q", "install"], cwd=self.root, env=self.env, capture_output=True
        )
        if installed.returncode != 0:
            raise AssertionError("Run `make install` first: the .venv is not up to date.")
        self.process = subprocess.Popen(
            ["make", "demo", f"PORT={self.port}"],
            cwd=self.root, env=self.env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        assert self.process.stdout is not None
        deadline = time.monotonic() + seconds
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))
            found = PASSWORD_RE.search(line)
            if found:
                self.username, self.password = found.groups()
            if READY_LINE in line or time.monotonic() > deadline:
                break
        if READY_LINE not in self.text:
            raise AssertionError(f"make demo did not start:\n{self.text}")
        self._wait_for_port(deadline)

    @property
    def text(self) -> str:
        return "\n".join(self.output)

    def _wait_for_port(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"The demo's web server never listened on {self.port}.")

    def shell(self, command: str, *, seconds: float = 300) -> subprocess.CompletedProcess[str]:
        """A README command, run as written in the checkout's folder."""
        return subprocess.run(
            ["bash", "-c", command], cwd=self.root, env=self.env, text=True,
            capture_output=True, timeout=seconds, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def stop(self) -> None:
        """Ctrl-C, as the README says: make's trap stops the cluster too."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        if self.process.stdout is not None:
            self.output += self.process.stdout.read().splitlines()


@contextmanager
def running_demo(folder: Path) -> Iterator[Demo]:
    """A fresh copy of the checkout in `folder`/replays, `make demo` running in it, with
    `folder`/home as the user's home."""
    root = copy_checkout(folder / "replays")
    demo = Demo(root, users_environment(folder / "home"))
    try:
        demo.start()
        yield demo
    finally:
        demo.stop()
