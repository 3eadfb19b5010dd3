"""Hosts: each django-q2 cluster writes its machine's row (REPLAYS_HOST_NAME) at start and
every few seconds while it runs, so the doctor and the pages can say which machines work,
what they run and whether their clocks agree, without reaching those machines.

`last_seen_at` is the database's clock and `clock_at` the host's own clock at the same
write: their difference is the host's clock skew. Heartbeats and claims are written with
each host's clock and compared with another's, so skew matters (see replays/doctor.py).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from datetime import datetime, timedelta
from importlib import metadata
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.utils import timezone

from replays import runfolder
from replays.agents.base import program_unavailable_reason
from replays.agents.claude_code import ClaudeCodeAgent
from replays.agents.codex import CodexAgent
from replays.models import Host
from replays.processes import plain_text

# `--version` answers at once; a hung binary must not hold up the cluster's report.
AGENT_VERSION_TIMEOUT_SECONDS = 5
# Versions change when someone upgrades a CLI: read them again after a few minutes.
AGENT_VERSION_CACHE_SECONDS = 300
# The agents whose binaries Replays runs itself (a `command` agent's program is a template).
VERSIONED_KINDS = {CodexAgent.kind: "codex", ClaudeCodeAgent.kind: "claude"}

# (agent name, binary, PATH) -> (monotonic expiry, answer); a per-process cache of a fact
# about this machine, never shared state.
_version_cache: dict[tuple[str, str, str], tuple[float, str | dict[str, str]]] = {}


def agent_versions() -> dict[str, str | dict[str, str]]:
    """What each configured codex / claude_code agent's binary says to `--version` on this
    machine: {"codex": "codex-cli 0.169.0", "claude": {"binary": "claude", "error": "..."}}."""
    agents = settings.REPLAYS_AGENTS if isinstance(settings.REPLAYS_AGENTS, dict) else {}
    found: dict[str, str | dict[str, str]] = {}
    for name, entry in agents.items():
        if not isinstance(entry, dict) or entry.get("kind") not in VERSIONED_KINDS:
            continue
        binary = str(entry.get("binary") or VERSIONED_KINDS[entry["kind"]])
        env = entry.get("env") if isinstance(entry.get("env"), dict) else {}
        found[str(name)] = _cached_version(str(name), binary, env)
    return found


def _cached_version(name: str, binary: str, env: dict[str, str]) -> str | dict[str, str]:
    search_path = env.get("PATH") or os.environ.get("PATH", os.defpath)
    key = (name, binary, search_path)
    cached = _version_cache.get(key)
    if cached is not None and cached[0] > time.monotonic():
        return cached[1]
    answer = _read_version(binary, env)
    _version_cache[key] = (time.monotonic() + AGENT_VERSION_CACHE_SECONDS, answer)
    return answer


def _read_version(binary: str, env: dict[str, str]) -> str | dict[str, str]:
    reason = program_unavailable_reason(binary, env)
    if reason:
        return {"binary": binary, "error": reason}
    search_path = env.get("PATH") or os.environ.get("PATH", os.defpath)
    try:
        completed = subprocess.run(
            [os.path.expanduser(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=AGENT_VERSION_TIMEOUT_SECONDS,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PATH": search_path},
        )
    except subprocess.TimeoutExpired:
        return {
            "binary": binary,
            "error": f"{binary} --version did not answer within {AGENT_VERSION_TIMEOUT_SECONDS} s.",
        }
    except OSError as exc:
        return {"binary": binary, "error": f"{binary} could not be started: {exc.strerror or exc}."}
    lines = (completed.stdout or completed.stderr or "").strip().splitlines()
    first = plain_text(lines[0])[:100] if lines else ""
    if completed.returncode != 0:
        return {
            "binary": binary,
            "error": f"{binary} --version exited with status {completed.returncode}"
            + (f": {first}" if first else "."),
        }
    if not first:
        return {"binary": binary, "error": f"{binary} --version printed nothing."}
    return first


def host_details() -> dict[str, Any]:
    """What else a host says about itself: its folders, its process and its versions."""

    def version(package: str) -> str:
        try:
            return metadata.version(package)
        except metadata.PackageNotFoundError:
            return ""

    return {
        "run_root": str(settings.REPLAYS_RUN_ROOT),
        # Why runs cannot start here for want of a sandbox ("" when they can).
        "sandbox": runfolder.sandbox_unavailable_reason(),
        "sandbox_mode": settings.REPLAYS_SANDBOX,
        "repository_roots": [str(Path(root)) for root in settings.REPLAYS_REPOSITORY_ROOTS],
        "pid": os.getpid(),
        "broker": "redis" if settings.Q_CLUSTER.get("redis") else "orm",
        # Agents named in REPLAYS_AGENTS_FILE must run; the defaults may be missing.
        "agents_configured": bool(settings.REPLAYS_AGENTS_FILE),
        "python": platform.python_version(),
        "django": version("Django"),
        "django_q2": version("django-q2"),
        "replays": version("replays"),
    }


def report_host(*, name: str | None = None) -> Host:
    """Upsert this host's row: last seen now by the database's clock, and by its own."""
    name = name or settings.REPLAYS_HOST_NAME
    values: dict[str, Any] = {
        "capacity": settings.REPLAYS_MAX_RUNS_PER_HOST,
        "agent_versions": agent_versions(),
        "details": host_details(),
    }
    # Taken last, just before the write, so the two clocks are read as close together as
    # one statement allows.
    values |= {"last_seen_at": Now(), "clock_at": timezone.now()}
    if not Host.objects.filter(name=name).update(**values):
        try:
            with transaction.atomic():
                Host.objects.create(name=name, first_seen_at=Now(), **values)
        except IntegrityError:
            # Another process of the same host created it in between: update that one.
            Host.objects.filter(name=name).update(**values)
    return Host.objects.get(name=name)


def clock_skew(host: Host) -> timedelta:
    """How far the host's clock is ahead of the database's (negative: behind), as measured
    at its last report."""
    return host.clock_at - host.last_seen_at


def database_now() -> datetime:
    """The database's clock, which every host's `last_seen_at` is written by (Now(): the
    statement's time on PostgreSQL, not the transaction's). SQLite lives on this machine,
    so its clock is this one's."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT statement_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()
