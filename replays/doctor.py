"""The doctor: checks a deployment and says what is wrong in plain words.

Each check is about the whole deployment (host None) or one host. A check with severity
"error" means something does not work (or will not: a run root nobody can write); a
"warning" means something to look at that does not stop Replays (no cluster ever seen on a
fresh machine, clocks a few seconds apart). `manage.py replays_doctor` prints them and
exits 1 when there is an error.

This machine is checked directly (it runs the agents' binaries, writes in the run root,
reads the repository roots); other machines through the Host rows their clusters write
(replays/hosts.py), so the doctor never needs to reach them.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.cache import caches
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from replays import agents, hosts, runfolder
from replays.agents.problems import MISSING, READY
from replays.models import Host, Run, RunStatus
from replaysite.folders import project_above

OK, WARNING, ERROR = "ok", "warning", "error"
# Clocks this close count as the same clock (one report's own latency is below it).
SKEW_TOLERANCE_SECONDS = 2.0
REDIS_TIMEOUT_SECONDS = 3


@dataclass(frozen=True)
class Check:
    name: str
    host: str | None  # None: the deployment as a whole
    severity: str  # ok | warning | error
    message: str

    @property
    def ok(self) -> bool:
        return self.severity == OK

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


@dataclass(frozen=True)
class Diagnosis:
    checks: list[Check]

    @property
    def ok(self) -> bool:
        """No errors (warnings allowed)."""
        return not any(check.severity == ERROR for check in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [check.as_dict() for check in self.checks]}


def diagnose() -> Diagnosis:
    """Every check, in the order a person fixes things: database, broker, hosts, this
    machine's folders and agents, clocks."""
    here = settings.REPLAYS_HOST_NAME
    checks: list[Check] = []
    database_ok = _check_database(checks)
    if database_ok:
        _check_migrations(checks)
    _check_broker(checks, database_ok)
    _check_shared_cache(checks, database_ok)
    known: list[Host] = []
    now: datetime | None = None
    if database_ok:
        try:
            known = list(Host.objects.order_by("name"))
            now = hosts.database_now()
        except Exception as exc:  # not migrated yet: said by the migrations check
            checks.append(Check("clusters", None, ERROR, f"The hosts cannot be read: {exc}"))
        else:
            _check_clusters(checks, known, now)
            _check_queue(checks, known, now)
    _check_run_root(checks, here)
    _check_sandbox(checks, here)
    _check_passwords(checks)
    _check_repository_roots(checks, here, known)
    _check_agents(checks, here, known)
    _check_logins(checks, here)
    if now is not None:
        _check_clocks(checks, known, now)
    return Diagnosis(checks)


# --- The database and the broker ----------------------------------------------------------


def _database_label() -> str:
    db = settings.DATABASES[DEFAULT_DB_ALIAS]
    if db["ENGINE"].endswith("sqlite3"):
        return f"SQLite at {db['NAME']}"
    where = f"{db.get('HOST') or 'localhost'}:{db.get('PORT') or 5432}"
    return f"PostgreSQL database {db.get('NAME')} on {where}"


def _check_database(checks: list[Check]) -> bool:
    try:
        connection = connections[DEFAULT_DB_ALIAS]
        connection.ensure_connection()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception as exc:
        checks.append(
            Check("database", None, ERROR, f"The {_database_label()} cannot be reached: {exc}")
        )
        return False
    checks.append(Check("database", None, OK, f"The {_database_label()} answers."))
    return True


def _check_migrations(checks: list[Check]) -> None:
    executor = MigrationExecutor(connections[DEFAULT_DB_ALIAS])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        names = ", ".join(f"{m.app_label}.{m.name}" for m, _ in plan[:5])
        more = f" and {len(plan) - 5} more" if len(plan) > 5 else ""
        checks.append(
            Check(
                "migrations",
                None,
                ERROR,
                f"{len(plan)} migration{'s are' if len(plan) != 1 else ' is'} not applied "
                f"({names}{more}): run `manage.py migrate`.",
            )
        )
    else:
        checks.append(Check("migrations", None, OK, "Every migration is applied."))


def _check_broker(checks: list[Check], database_ok: bool) -> None:
    redis_url = settings.Q_CLUSTER.get("redis")
    if redis_url:
        import redis

        shown = _without_password(str(redis_url))
        try:
            client = (
                redis.Redis.from_url(
                    redis_url,
                    socket_connect_timeout=REDIS_TIMEOUT_SECONDS,
                    socket_timeout=REDIS_TIMEOUT_SECONDS,
                )
                if isinstance(redis_url, str)
                else redis.Redis(**redis_url, socket_connect_timeout=REDIS_TIMEOUT_SECONDS)
            )
            client.ping()
        except Exception as exc:
            checks.append(
                Check(
                    "broker",
                    None,
                    ERROR,
                    f"The Redis broker at {shown} does not answer: {exc}. Nothing is "
                    "dispatched until it does (runs wait queued).",
                )
            )
            return
        checks.append(Check("broker", None, OK, f"The Redis broker at {shown} answers PING."))
        return
    from django_q.models import OrmQ

    table = OrmQ._meta.db_table
    if not database_ok:
        checks.append(
            Check(
                "broker",
                None,
                ERROR,
                f"The database broker (table {table}) is down with the database: nothing is "
                "dispatched.",
            )
        )
        return
    try:
        waiting = OrmQ.objects.count()
    except Exception as exc:
        checks.append(
            Check(
                "broker",
                None,
                ERROR,
                f"The database broker's table {table} cannot be read: {exc}. "
                "Run `manage.py migrate`.",
            )
        )
        return
    checks.append(
        Check(
            "broker",
            None,
            OK,
            f"The database broker (table {table}) works; {waiting} task"
            f"{'s' if waiting != 1 else ''} waiting.",
        )
    )


def _without_password(url: str) -> str:
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    credentials, where = rest.rsplit("@", 1)
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user + ':***@' if user else '***@'}{where}"


def _check_shared_cache(checks: list[Check], database_ok: bool) -> None:
    """The throttle counts in the default cache; every process must share it."""
    backend = str(settings.CACHES["default"]["BACKEND"])
    if backend.endswith("DatabaseCache") and not database_ok:
        return  # said by the database check
    cache = caches["default"]
    key = f"replays-doctor-{os.getpid()}"
    try:
        cache.set(key, "ok", 30)
        answered = cache.get(key)
        cache.delete(key)
    except Exception as exc:
        checks.append(
            Check(
                "shared cache",
                None,
                ERROR,
                f"The shared cache ({backend.rsplit('.', 1)[-1]}) does not work: {exc}. "
                "API writes fail until it does.",
            )
        )
        return
    if answered != "ok":
        checks.append(Check("shared cache", None, ERROR, "The shared cache did not keep a value."))
        return
    checks.append(
        Check(
            "shared cache",
            None,
            OK,
            f"The shared cache ({backend.rsplit('.', 1)[-1]}) keeps values for every process.",
        )
    )


# --- Hosts ---------------------------------------------------------------------------------


def _ago(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def recent_seconds() -> float:
    """A cluster that reported within this long is running (it reports every heartbeat)."""
    return max(30.0, float(settings.REPLAYS_HEARTBEAT_STALE_SECONDS))


def _check_clusters(checks: list[Check], known: list[Host], now: datetime) -> None:
    if not known:
        checks.append(
            Check(
                "clusters",
                None,
                WARNING,
                "No django-q2 cluster has ever reported: start one with `manage.py qcluster` "
                "(approved runs wait queued until one runs).",
            )
        )
        return
    recent = recent_seconds()
    for host in known:
        age = max(0.0, (now - host.last_seen_at).total_seconds())
        active = Run.objects.filter(
            host=host.name, status__in=[RunStatus.LAUNCHING, RunStatus.RUNNING]
        ).count()
        if age <= recent:
            checks.append(
                Check(
                    "cluster",
                    host.name,
                    OK,
                    f"Its cluster reported {_ago(age)}; capacity {host.capacity}, "
                    f"{active} run{'s' if active != 1 else ''} active.",
                )
            )
            continue
        runs = (
            f" {active} run{'s are' if active != 1 else ' is'} still marked active there; "
            "other clusters fail them once their heartbeats are stale."
            if active
            else ""
        )
        checks.append(
            Check(
                "cluster",
                host.name,
                ERROR,
                f"Its cluster was last seen {_ago(age)}: it is stopped or cannot reach the "
                f"database.{runs} If the machine was removed, delete its host row in the admin.",
            )
        )
    if all((now - host.last_seen_at).total_seconds() > recent for host in known):
        checks.append(
            Check(
                "clusters",
                None,
                ERROR,
                "No cluster is running anywhere: approved runs wait queued until one starts.",
            )
        )


# Queued runs are dispatched within a minute (the schedule) of a slot being free; a
# queued run older than this while slots are free means no cluster is taking tasks.
QUEUE_STALL_SECONDS = 180


def _check_queue(checks: list[Check], known: list[Host], now: datetime) -> None:
    """Queued runs waiting with free slots: every cluster looks alive (its host loop still
    reports) but none takes tasks. A django-q2 cluster one of whose processes was killed
    can end up so (a multiprocessing queue lock held by the dead process)."""
    waiting = Run.objects.filter(
        status=RunStatus.QUEUED,
        cancel_requested_at__isnull=True,
        created_at__lt=now - timedelta(seconds=QUEUE_STALL_SECONDS),
    )
    count = waiting.count()
    active = Run.objects.filter(status__in=[RunStatus.LAUNCHING, RunStatus.RUNNING])
    free = settings.REPLAYS_MAX_PARALLEL_RUNS - active.count()
    recent = recent_seconds()
    live = [host for host in known if (now - host.last_seen_at).total_seconds() <= recent]
    with_room = [
        host.name for host in live if active.filter(host=host.name).count() < host.capacity
    ]
    if not count or free <= 0 or not with_room:
        checks.append(
            Check(
                "queue",
                None,
                OK,
                f"{count} run{'s wait' if count != 1 else ' waits'} in the queue for a "
                "free slot: every slot is taken."
                if count
                else "No run has been waiting in the queue.",
            )
        )
        return
    oldest = waiting.order_by("created_at").values_list("created_at", flat=True).first()
    age = (now - oldest).total_seconds() if oldest else 0.0
    checks.append(
        Check(
            "queue",
            None,
            ERROR,
            f"{count} run{'s have' if count != 1 else ' has'} waited in the queue since "
            f"{_ago(age)} although {free} slot{'s are' if free != 1 else ' is'} free "
            f"({', '.join(with_room)} {'have' if len(with_room) != 1 else 'has'} room): no "
            "cluster is taking tasks. Restart the cluster (systemctl restart "
            "replays-worker); a cluster one of whose processes was killed can stop taking "
            "tasks while it still looks alive.",
        )
    )


# --- The sandbox --------------------------------------------------------------------------


def _check_sandbox(checks: list[Check], here: str) -> None:
    """Every process a run starts runs in bubblewrap: missing or unable to make its
    namespaces, runs are refused here, unless the operator chose the single-user mode."""
    if not runfolder.sandbox_required():
        checks.append(
            Check(
                "sandbox",
                here,
                WARNING,
                "Runs start unsandboxed (REPLAYS_SANDBOX=off): every agent, verify command "
                "and evaluator can read what this account can, the database, the secret key "
                "and every user's data included. Only for a single user on their own machine.",
            )
        )
        return
    reason = runfolder.sandbox_unavailable_reason(fresh=True)
    if reason:
        checks.append(Check("sandbox", here, ERROR, reason))
        return
    checks.append(
        Check(
            "sandbox",
            here,
            OK,
            f"bubblewrap ({settings.REPLAYS_SANDBOX_BWRAP}) sandboxes every process a run starts.",
        )
    )


def _check_passwords(checks: list[Check]) -> None:
    """A run has the network, so it reaches whatever the worker reaches: a database or a
    Redis that asks no password over TCP is open to it (an open Redis would take tasks for
    the clusters from it)."""
    open_services = []
    database = settings.DATABASES["default"]
    if "postgresql" in database["ENGINE"] and not database.get("PASSWORD"):
        open_services.append("DATABASE_URL names no password")
    redis_url = settings.REDIS_URL
    if redis_url and not urlsplit(redis_url).password:
        open_services.append("REDIS_URL names no password")
    if not open_services:
        return
    checks.append(
        Check(
            "passwords",
            None,
            WARNING,
            f"{' and '.join(open_services)}: a run has the network and reaches what this "
            "machine reaches, so the database and Redis must ask for a password over TCP "
            "(docs/deployment.md).",
        )
    )


# --- This machine's folders -------------------------------------------------------------


def _check_run_root(checks: list[Check], here: str) -> None:
    root = Path(settings.REPLAYS_RUN_ROOT)
    try:
        root.mkdir(parents=True, exist_ok=True)
        handle, probe = tempfile.mkstemp(prefix=".doctor-", dir=root)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        checks.append(
            Check(
                "run root",
                here,
                ERROR,
                f"The run root {root} (REPLAYS_RUN_ROOT) cannot be written: "
                f"{exc.strerror or exc}. Runs on this machine fail to launch.",
            )
        )
        return
    checks.append(Check("run root", here, OK, f"The run root {root} is writable."))
    project = project_above(root)
    if project is not None:
        checks.append(
            Check(
                "run root location",
                here,
                WARNING,
                f"The run root {root} lies inside the project {project}: a verify command "
                "or agent run in a worktree there may take that project's configuration "
                "(pytest climbs to its pyproject.toml and its tests package) instead of "
                "its own. Set REPLAYS_RUN_ROOT to a folder outside any project.",
            )
        )


def _check_repository_roots(checks: list[Check], here: str, known: list[Host]) -> None:
    roots = [Path(root) for root in settings.REPLAYS_REPOSITORY_ROOTS]
    bad = []
    for root in roots:
        try:
            resolved = root.resolve()
            if not resolved.is_dir():
                bad.append(f"{root} does not exist or is not a folder")
                continue
            os.listdir(resolved)
        except OSError as exc:
            bad.append(f"{root} cannot be read ({exc.strerror or exc})")
    if bad:
        checks.append(
            Check(
                "repository roots",
                here,
                ERROR,
                f"Repository roots (REPLAYS_REPOSITORY_ROOTS) on this machine: {'; '.join(bad)}. "
                "Plans and runs cannot open repositories there.",
            )
        )
    else:
        listed = ", ".join(str(root) for root in roots) or "(none)"
        checks.append(
            Check("repository roots", here, OK, f"The repository roots are readable: {listed}.")
        )
    # Repositories must be at the same path on the machines that prepare and those that run.
    mine = [str(root) for root in roots]
    differing = [
        host
        for host in known
        if host.name != here
        and isinstance(host.details.get("repository_roots"), list)
        and sorted(host.details["repository_roots"]) != sorted(mine)
    ]
    for host in differing:
        checks.append(
            Check(
                "repository roots",
                host.name,
                WARNING,
                f"Its repository roots ({', '.join(host.details['repository_roots']) or 'none'}) "
                f"differ from this machine's ({', '.join(mine) or 'none'}): a repository must be "
                "at the same path on the machines that prepare and those that run.",
            )
        )


# --- Agents ------------------------------------------------------------------------------


def _agents_severity(configured: bool) -> str:
    """An agent someone configured (REPLAYS_AGENTS_FILE) that cannot run is an error; a
    default one that is not installed only leaves its models unavailable."""
    return ERROR if configured else WARNING


def _check_agents(checks: list[Check], here: str, known: list[Host]) -> None:
    hosts._version_cache.clear()  # the doctor asks the binaries now, not a cached answer
    mine = hosts.agent_versions()
    configured = bool(settings.REPLAYS_AGENTS_FILE)
    if not mine:
        checks.append(
            Check("agents", here, OK, "No codex or claude_code agent is configured here.")
        )
    for name, answer in mine.items():
        checks.append(_agent_check(name, here, answer, configured))
    by_agent: dict[str, dict[str, str]] = {}
    for name, answer in mine.items():
        if isinstance(answer, str):
            by_agent.setdefault(name, {})[here] = answer
    for host in known:
        if host.name == here or not isinstance(host.agent_versions, dict):
            continue
        for name, answer in host.agent_versions.items():
            checks.append(
                _agent_check(name, host.name, answer, bool(host.details.get("agents_configured")))
            )
            if isinstance(answer, str):
                by_agent.setdefault(name, {})[host.name] = answer
    for name, versions in sorted(by_agent.items()):
        if len(set(versions.values())) > 1:
            listed = ", ".join(f"{host} {version}" for host, version in sorted(versions.items()))
            checks.append(
                Check(
                    "agent versions",
                    None,
                    WARNING,
                    f"Agent {name} differs between hosts ({listed}): replays of one batch "
                    "may run different versions.",
                )
            )


def _check_logins(checks: list[Check], here: str) -> None:
    """Whether each available agent's runs will have a login (a run's agent gets a home of
    its own): one without would fail every run as a setup problem."""
    seen: set[str] = set()
    for info in agents.discover_models():
        if info.is_baseline or not info.available or info.agent in seen:
            continue
        seen.add(info.agent)
        if info.login == MISSING:
            checks.append(
                Check("agent login", here, WARNING, f"Agent {info.agent}: {info.login_message}")
            )
        elif info.login == READY:
            checks.append(
                Check("agent login", here, OK, f"Agent {info.agent}: {info.login_message}")
            )


def _agent_check(name: str, host: str, answer: Any, configured: bool) -> Check:
    if isinstance(answer, str):
        return Check("agent", host, OK, f"Agent {name}: {answer}.")
    error = answer.get("error") if isinstance(answer, dict) else None
    return Check(
        "agent",
        host,
        _agents_severity(configured),
        f"Agent {name} cannot run: {error or 'unknown error'} Its models are unavailable "
        "on this host.",
    )


# --- Clocks ------------------------------------------------------------------------------


def _signed(seconds: float) -> str:
    return f"{abs(seconds):.1f} s {'ahead of' if seconds >= 0 else 'behind'}"


def _check_clocks(checks: list[Check], known: list[Host], now: datetime) -> None:
    """Heartbeats and claims are written by each host's clock and judged by another's, and
    a prepare token's expiry is set on one machine and checked on another."""
    stale = float(settings.REPLAYS_HEARTBEAT_STALE_SECONDS)
    skews: dict[str, float] = {}
    for host in known:
        skew = hosts.clock_skew(host).total_seconds()
        skews[host.name] = skew
        if abs(skew) >= stale / 2:
            severity, effect = (
                ERROR,
                f" Heartbeats from there look {abs(skew):.0f} s "
                f"{'newer' if skew > 0 else 'older'} to other hosts, against a stale limit of "
                f"{stale:.0f} s (REPLAYS_HEARTBEAT_STALE_SECONDS): live runs may be failed as "
                "lost, or dead ones kept. Run NTP (chrony, systemd-timesyncd) on every machine.",
            )
        elif abs(skew) > SKEW_TOLERANCE_SECONDS:
            severity, effect = WARNING, " Run NTP (chrony, systemd-timesyncd) on every machine."
        else:
            severity, effect = OK, ""
        checks.append(
            Check(
                "clock",
                host.name,
                severity,
                f"Its clock was {_signed(skew)} the database's at its last report.{effect}",
            )
        )
    # This machine, measured now: it may run the web app without a cluster.
    here = settings.REPLAYS_HOST_NAME
    if here not in skews:
        skews[here] = (timezone.now() - now).total_seconds()
    if len(skews) < 2:
        spread, pair = 0.0, ""
    else:
        fast = max(skews, key=skews.__getitem__)
        slow = min(skews, key=skews.__getitem__)
        spread, pair = skews[fast] - skews[slow], f" ({fast} and {slow})"
    lifetime = float(settings.REPLAYS_PREPARE_TOKEN_SECONDS)
    if spread >= lifetime / 2:
        severity = ERROR
    elif spread > SKEW_TOLERANCE_SECONDS:
        severity = WARNING
    else:
        severity = OK
    if severity == OK:
        message = (
            f"Clocks agree within {SKEW_TOLERANCE_SECONDS:g} s: a prepare token lives its "
            f"{lifetime:.0f} s (REPLAYS_PREPARE_TOKEN_SECONDS) on any machine."
        )
    else:
        message = (
            f"Clocks differ by up to {spread:.1f} s between hosts{pair}: a prepare token "
            f"meant to live {lifetime:.0f} s (REPLAYS_PREPARE_TOKEN_SECONDS) lives "
            f"{max(0.0, lifetime - spread):.0f} to {lifetime + spread:.0f} s when it is "
            "prepared on one and approved on another."
        )
    checks.append(Check("prepare tokens", None, severity, message))
