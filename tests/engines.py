"""Private PostgreSQL and Redis servers for the tests that stop, restart or share them.

The shared CI servers cannot be stopped by a test (everything else uses them), so the
two-machine and engine-fault tests start their own: `initdb` + `pg_ctl` in a temporary
folder on a free port, run as the `postgres` account when we are root (PostgreSQL
refuses to run as root), and a `redis-server` on a free port. Missing binaries skip
the test, or fail it in CI (REPLAYS_REQUIRE_TOOLS=1).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import require_tool

ROOT = Path(__file__).resolve().parent.parent
PG_USER = "replays"
PG_DATABASE = "replays"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def postgres_bin() -> Path:
    """The newest installed PostgreSQL's bin folder (Debian keeps it off the PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=_version)
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    tool = require_tool(which or "/usr/lib/postgresql/N/bin/pg_ctl", "apt-get install postgresql")
    return tool.parent


def _version(path: str) -> tuple[int, ...]:
    part = Path(path).parent.parent.name
    return tuple(int(piece) for piece in part.split(".") if piece.isdigit())


def _as_postgres(argv: list[str]) -> list[str]:
    """argv run as the postgres account when we are root, else as ourselves."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class PrivatePostgres:
    """One PostgreSQL server in a temporary folder; stop() and start() keep its data."""

    bin: Path
    data: Path
    port: int

    @property
    def url(self) -> str:
        return f"postgres://{PG_USER}@127.0.0.1:{self.port}/{PG_DATABASE}"

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), *args]),
            capture_output=True,
            text=True,
            check=check,
            timeout=60,
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.data} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off "
            "-c max_connections=200"
        )
        self._ctl("-o", options, "-l", str(self.data / "server.log"), "-w", "start")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server ('immediate' is a crash: no checkpoint, clients cut at once)."""
        self._ctl("-m", mode, "-w", "stop", check=False)

    def kill(self) -> None:
        self.stop("immediate")

    def is_ready(self) -> bool:
        done = subprocess.run(
            [str(self.bin / "pg_isready"), "-q", "-h", "127.0.0.1", "-p", str(self.port)],
            check=False,
        )
        return done.returncode == 0

    def sql(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        """Rows of one query, through its own short connection (no Django)."""
        import psycopg

        with psycopg.connect(self.url, connect_timeout=5, autocommit=True) as connection:
            cursor = connection.execute(query, params or None)
            return cursor.fetchall() if cursor.description else []


def start_postgres(folder: Path) -> PrivatePostgres:
    pg_bin = postgres_bin()
    data = folder / "pgdata"
    data.mkdir(parents=True)
    if os.geteuid() == 0:
        shutil.chown(folder, "postgres")
        shutil.chown(data, "postgres")
    os.chmod(data, 0o700)
    subprocess.run(
        _as_postgres(
            [str(pg_bin / "initdb"), "-D", str(data), "-U", PG_USER, "-A", "trust", "-E", "UTF8"]
        ),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    server = PrivatePostgres(bin=pg_bin, data=data, port=free_port())
    server.start()
    subprocess.run(
        [str(pg_bin / "createdb"), "-h", "127.0.0.1", "-p", str(server.port), "-U", PG_USER,
         PG_DATABASE],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return server


@dataclass
class PrivateRedis:
    """One redis-server without persistence; restart() is a new process on the same port."""

    binary: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            [str(self.binary), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server did not listen on {self.port}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()


def start_redis() -> PrivateRedis:
    binary = require_tool(shutil.which("redis-server") or "/usr/bin/redis-server",
                          "apt-get install redis-server")  # fmt: skip
    server = PrivateRedis(binary=binary, port=free_port())
    server.start()
    return server


@dataclass
class Engines:
    postgres: PrivatePostgres
    redis: PrivateRedis
    folder: Path


def private_engines() -> Iterator[Engines]:
    """A private PostgreSQL (migrated) and Redis for one test module; removed afterwards."""
    folder = Path(tempfile.mkdtemp(prefix="replays-engines-"))
    postgres = start_postgres(folder)
    redis = start_redis()
    try:
        migrated = subprocess.run(
            [sys.executable, str(ROOT / "manage.py"), "migrate", "-v", "0"],
            env={**os.environ, "DATABASE_URL": postgres.url, "REPLAYS_VAR_DIR": str(folder / "var")},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert migrated.returncode == 0, migrated.stderr[-3000:]
        yield Engines(postgres=postgres, redis=redis, folder=folder)
    finally:
        redis.stop()
        postgres.stop("immediate")
        shutil.rmtree(folder, ignore_errors=True)


def skip_on_the_shared_postgres_pass() -> None:
    """These tests bring their own servers whatever DATABASE_URL says: CI runs them once,
    in its default (SQLite) pass, not again in the PostgreSQL pass."""
    if os.environ.get("DATABASE_URL", "").startswith("postgres"):
        pytest.skip("brings its own PostgreSQL and Redis: runs in the default pass")
