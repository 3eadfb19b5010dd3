"""Replays settings, read from the environment (see .env.example).

Defaults just work on one machine: SQLite under var/ and the django-q2 ORM
broker. DATABASE_URL and REDIS_URL switch to PostgreSQL and Redis.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
from datetime import timedelta
from pathlib import Path

import dj_database_url

from replaysite.folders import default_run_root

BASE_DIR = Path(__file__).resolve().parent.parent


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default).strip()


def env_bool(name: str, default: bool = False) -> bool:
    value = env_str(name)
    if not value:
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"{name} must be true or false, not {value!r}")


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    value = env_str(name)
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name} must be a whole number, not {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {number}")
    return number


def env_float(name: str, default: float, *, minimum: float = 0.0) -> float:
    value = env_str(name)
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{name} must be a number, not {value!r}") from None
    if number < minimum:
        raise ValueError(f"{name} must be at least {minimum}, not {number}")
    return number


def env_list(name: str, default: list[str]) -> list[str]:
    value = env_str(name)
    if not value:
        return default
    return [item.strip() for item in value.split(",") if item.strip()]


_RATE_PERIODS = {"s", "sec", "second", "m", "min", "minute", "h", "hour", "d", "day"}


def env_rate(name: str, default: str) -> str:
    """A rate as DRF's throttles read it: a whole number, "/", a period."""
    value = env_str(name) or default
    number, slash, period = value.partition("/")
    if not (number.isdigit() and int(number) >= 1 and slash and period in _RATE_PERIODS):
        raise ValueError(
            f"{name} must be a number per second, minute, hour or day (like 120/minute), "
            f"not {value!r}"
        )
    return value


def env_path(name: str, default: Path) -> Path:
    value = env_str(name)
    path = Path(value).expanduser() if value else default
    return path if path.is_absolute() else (BASE_DIR / path)


# --- Folders -------------------------------------------------------------------------

REPLAYS_VAR_DIR = env_path("REPLAYS_VAR_DIR", BASE_DIR / "var")
# Run folders (worktrees) never lie inside a project: see replaysite/folders.py.
REPLAYS_RUN_ROOT = env_path("REPLAYS_RUN_ROOT", default_run_root(REPLAYS_VAR_DIR))
# Everything a Replays process makes is private to its account: the SQLite database and
# its WAL, uploaded transcripts, run folders, the secret key (other local accounts read
# nothing of it). Set here, before anything is made, in every process (web, cluster,
# coordinators, commands); the systemd units say UMask=0077 as well.
os.umask(0o077)
REPLAYS_VAR_DIR.mkdir(parents=True, exist_ok=True)
# A var folder made before (0755) is closed too: nothing inside can be reached through it.
if REPLAYS_VAR_DIR.stat().st_uid == os.geteuid() and REPLAYS_VAR_DIR.stat().st_mode & 0o077:
    REPLAYS_VAR_DIR.chmod(0o700)
(REPLAYS_VAR_DIR / "static").mkdir(exist_ok=True)

# Repositories are opened only under these folders (":"-separated; symlinks are followed
# before the check). Default: the home folder of the account Replays runs as, and the
# var folder (the demo's clone lives there).
REPLAYS_REPOSITORY_ROOTS = [
    Path(root).expanduser()
    for root in (env_str("REPLAYS_REPOSITORY_ROOTS") or f"{Path.home()}:{REPLAYS_VAR_DIR}").split(
        ":"
    )
    if root.strip()
]

# A user-updated price table (manage.py update_prices) overrides the bundled one.
REPLAYS_PRICES_FILE = REPLAYS_VAR_DIR / "prices.json"


def _secret_key() -> str:
    given = env_str("SECRET_KEY")
    if given:
        return given
    # Generated once per var folder so sessions survive restarts without configuration.
    key_file = REPLAYS_VAR_DIR / "secret_key"
    if not key_file.exists():
        key_file.write_text(secrets.token_urlsafe(50))
        key_file.chmod(0o600)
    return key_file.read_text().strip()


SECRET_KEY = _secret_key()
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])
# Behind a proxy that ends TLS (docs/deployment.md): trust its X-Forwarded-Proto for
# request.is_secure(), and send the session and CSRF cookies over HTTPS only.
REPLAYS_BEHIND_HTTPS_PROXY = env_bool("REPLAYS_BEHIND_HTTPS_PROXY", False)
if REPLAYS_BEHIND_HTTPS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

# --- Limits --------------------------------------------------------------------------

REPLAYS_MAX_PARALLEL_RUNS = env_int("REPLAYS_MAX_PARALLEL_RUNS", 2, minimum=1)
REPLAYS_MAX_RUNS_PER_HOST = env_int(
    "REPLAYS_MAX_RUNS_PER_HOST", REPLAYS_MAX_PARALLEL_RUNS, minimum=1
)
# A task worker forks each coordinator from itself (Django already loaded) rather than
# starting a new interpreter for it: the launch cost of a batch falls from about a
# second of CPU per member to milliseconds (docs/benchmarks.md). Off: always spawn.
REPLAYS_FORK_COORDINATORS = env_bool("REPLAYS_FORK_COORDINATORS", True)
# This machine's name in Run.host: capacity per host and same-host process checks use it.
REPLAYS_HOST_NAME = env_str("REPLAYS_HOST_NAME") or socket.gethostname()
# Coordinators write a heartbeat (and check for cancel) this often; a heartbeat older than
# the stale limit means the coordinator is gone, whichever machine it ran on.
REPLAYS_HEARTBEAT_SECONDS = env_float("REPLAYS_HEARTBEAT_SECONDS", 3.0, minimum=0.1)
REPLAYS_HEARTBEAT_STALE_SECONDS = env_float("REPLAYS_HEARTBEAT_STALE_SECONDS", 60.0, minimum=1.0)
# A launching run whose coordinator never reported within this time failed to launch.
REPLAYS_LAUNCH_GRACE_SECONDS = env_float("REPLAYS_LAUNCH_GRACE_SECONDS", 120.0, minimum=1.0)
# A queued run that waits this long beside a free slot on a host, with no dispatch taken
# from the task queue meanwhile, is dispatched by that host's loop itself (a django-q2
# worker that died holding the queue's lock stops its whole cluster: django-q2 #23).
REPLAYS_DISPATCH_STALL_SECONDS = env_float("REPLAYS_DISPATCH_STALL_SECONDS", 20.0, minimum=1.0)
# How long a prepare token stays valid.
REPLAYS_PREPARE_TOKEN_SECONDS = env_int("REPLAYS_PREPARE_TOKEN_SECONDS", 300, minimum=1)
REPLAYS_DEFAULT_TIMEOUT_SECONDS = env_int("REPLAYS_DEFAULT_TIMEOUT_SECONDS", 1200, minimum=1)
# A run's diff larger than this is stored cut (the run folder keeps all of it).
REPLAYS_MAX_DIFF_BYTES = env_int("REPLAYS_MAX_DIFF_BYTES", 20 * 1024 * 1024, minimum=100)
# A run's agent log longer than this is stored in the database by its end (the run
# folder keeps all of it).
REPLAYS_MAX_LOG_BYTES = env_int("REPLAYS_MAX_LOG_BYTES", 16 * 1024 * 1024, minimum=1024)
# Keep run worktrees after the diff is stored (they are removed by default).
REPLAYS_KEEP_WORKSPACES = env_bool("REPLAYS_KEEP_WORKSPACES", False)
# Largest transcript file the importer reads (bytes).
REPLAYS_MAX_TRANSCRIPT_BYTES = env_int(
    "REPLAYS_MAX_TRANSCRIPT_BYTES", 50 * 1024 * 1024, minimum=1024
)
# Requests can carry a pasted log or spec: bodies up to 2 MiB, uploads up to the transcript limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024 + 64 * 1024
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024

# Named agents that can run a replay (besides the built-in baselines `historical` and
# `empty`): {"name": {"kind": "codex" | "claude_code" | "command", "binary", "args", "env",
# "models", ...}}. A model id names its agent: "name:model". Read from the JSON file
# REPLAYS_AGENTS_FILE when it is set (see the README for each kind's keys).
REPLAYS_AGENTS_FILE = env_str("REPLAYS_AGENTS_FILE")


def _agents() -> dict[str, dict[str, object]]:
    if not REPLAYS_AGENTS_FILE:
        return {}
    path = Path(REPLAYS_AGENTS_FILE).expanduser()
    try:
        agents = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"REPLAYS_AGENTS_FILE {path}: {exc}") from None
    if not isinstance(agents, dict):
        raise ValueError(f"REPLAYS_AGENTS_FILE {path}: must hold a JSON object of named agents")
    return agents


# Without a file: the Codex CLI, Claude Code, Gemini CLI, OpenCode and pi as installed on
# PATH, with their usual models (OpenCode's and pi's are `provider/model`).
DEFAULT_AGENTS: dict[str, dict[str, object]] = {
    "codex": {
        "kind": "codex",
        "label": "Codex",
        "binary": "codex",
        "models": ["gpt-5.5", "gpt-5.3-codex", "gpt-5-codex"],
    },
    "claude": {
        "kind": "claude_code",
        "label": "Claude Code",
        "binary": "claude",
        "models": ["claude-sonnet-4-5", "claude-opus-4-5", "claude-haiku-4-5"],
    },
    "gemini": {
        "kind": "gemini",
        "label": "Gemini CLI",
        "binary": "gemini",
        "models": ["gemini-2.5-pro", "gemini-2.5-flash"],
    },
    "opencode": {
        "kind": "opencode",
        "label": "OpenCode",
        "binary": "opencode",
        "models": ["anthropic/claude-sonnet-4-5", "openai/gpt-5"],
    },
    "pi": {
        "kind": "pi",
        "label": "pi",
        "binary": "pi",
        "models": ["anthropic/claude-sonnet-4-5", "openai/gpt-5"],
    },
}
REPLAYS_AGENTS = _agents() if REPLAYS_AGENTS_FILE else DEFAULT_AGENTS

# --- The sandbox ---------------------------------------------------------------------

# Every process a run starts (agents, the verify command, evaluators) runs in a bubblewrap
# sandbox (README, "Security model"): "bwrap" (the default). Without a working bwrap on a
# machine its runs are refused, unless this is "off": runs then start unsandboxed, able to
# read everything this account can (the database, the secret key, every user's data), so
# only for a single user on their own machine; every page says so.
REPLAYS_SANDBOX = env_str("REPLAYS_SANDBOX", "bwrap").lower()
if REPLAYS_SANDBOX not in ("bwrap", "off"):
    raise ValueError(f"REPLAYS_SANDBOX must be bwrap or off, not {REPLAYS_SANDBOX!r}")
# The bwrap program (a name on PATH or a path).
REPLAYS_SANDBOX_BWRAP = env_str("REPLAYS_SANDBOX_BWRAP", "bwrap")
# The verify command runs without network unless this is on (agents and evaluators always
# have it: they call their model's API).
REPLAYS_SANDBOX_VERIFY_NETWORK = env_bool("REPLAYS_SANDBOX_VERIFY_NETWORK", False)
# Folders every sandbox shows read-only besides the system (":"-separated): toolchains a
# verify command or an agent needs (/opt/go, a Python installation). An agent's own
# program (its installation) is shown without being listed.
REPLAYS_SANDBOX_READ_ONLY_PATHS = [
    Path(path).expanduser()
    for path in env_str("REPLAYS_SANDBOX_READ_ONLY_PATHS").split(":")
    if path.strip()
]
# Paths inside what a sandbox shows (the system's /etc, a read-only folder above) that it
# must not see (":"-separated), besides those always hidden (README).
REPLAYS_SANDBOX_HIDDEN_PATHS = [
    Path(path).expanduser()
    for path in env_str("REPLAYS_SANDBOX_HIDDEN_PATHS").split(":")
    if path.strip()
]

# --- Evaluation ----------------------------------------------------------------------

# The evaluator of a plan that names none: `tests` or a model id (AGENT:MODEL). Unset:
# the first available judge-capable agent model, else `tests` when the plan has a verify
# command, else the plan's first agent model.
REPLAYS_DEFAULT_EVALUATOR = env_str("REPLAYS_DEFAULT_EVALUATOR")
# One evaluator call (deriving the checks, one verdict) may take this long.
REPLAYS_EVALUATOR_TIMEOUT_SECONDS = env_int("REPLAYS_EVALUATOR_TIMEOUT_SECONDS", 600, minimum=10)
# A diff shown to the evaluator is cut beyond this many characters (with a marker it sees).
REPLAYS_JUDGE_DIFF_CHARS = env_int("REPLAYS_JUDGE_DIFF_CHARS", 60_000, minimum=1000)

# --- Application ---------------------------------------------------------------------

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    # API tokens are replays.models.ApiToken, kept hashed (rest_framework.authtoken kept
    # them in the clear: replays' migration 0015 hashes those and empties its table).
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_q",
    "django_htmx",
    # Sign-in attempts limited per account and per address, with a lockout.
    "axes",
    "replays",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "replays.middleware.BodySizeLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # request.htmx: pages that update in place answer htmx requests with their partials.
    "django_htmx.middleware.HtmxMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # The pages' writes share the API's per-user write limit (REPLAYS_API_WRITE_RATE).
    "replays.middleware.PageWriteThrottleMiddleware",
    # Last, as django-axes asks: it answers a locked-out sign-in.
    "axes.middleware.AxesMiddleware",
]

# django-axes checks every sign-in first (the lockout), then Django's own accounts.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]

ROOT_URLCONF = "replaysite.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                # The unsandboxed single-user mode (or a missing sandbox) on every page.
                "replays.views.common.sandbox_notice",
            ],
        },
    },
]

WSGI_APPLICATION = "replaysite.wsgi.application"

# --- Database ------------------------------------------------------------------------

DATABASES = {
    "default": dj_database_url.parse(
        env_str("DATABASE_URL") or f"sqlite:///{REPLAYS_VAR_DIR / 'replays.sqlite3'}",
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes (web, cluster, coordinators) write: WAL lets readers go on,
    # IMMEDIATE takes the write lock up front so transactions never deadlock on upgrade.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": 20,
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=20000;",
    }
    DATABASES["default"].setdefault("TEST", {})
    # Tests that start other processes (the cluster, commands) need a file, not :memory:.
    DATABASES["default"]["TEST"]["NAME"] = str(REPLAYS_VAR_DIR / "test_replays.sqlite3")

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = REPLAYS_VAR_DIR / "static"
# WhiteNoise serves static files straight from the apps, so the demo needs no collectstatic.
WHITENOISE_USE_FINDERS = True

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "replays:thread-list"
LOGOUT_REDIRECT_URL = "login"

# --- API -----------------------------------------------------------------------------

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "replays.api.authentication.HashedTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "replays.api.errors.exception_handler",
    # JSON only (uploads name their own parser); it refuses lone surrogates and deep nesting.
    "DEFAULT_PARSER_CLASSES": ["replays.api.parsers.JSONParser"],
    # Views with throttle_scope "write" (every POST) allow REPLAYS_API_WRITE_RATE per user.
    "DEFAULT_THROTTLE_CLASSES": ["replays.api.throttling.WriteThrottle"],
}
# Writes (POSTs) per user, through the API and the pages alike: a person never gets near
# it, a runaway script does.
REPLAYS_API_WRITE_RATE = env_rate("REPLAYS_API_WRITE_RATE", "120/minute")

# --- Signing in (django-axes) --------------------------------------------------------

# After this many wrong passwords for one account, or from one address, that account or
# address cannot sign in for REPLAYS_LOGIN_LOCKOUT_MINUTES (the page says so).
REPLAYS_LOGIN_FAILURES = env_int("REPLAYS_LOGIN_FAILURES", 5, minimum=1)
REPLAYS_LOGIN_LOCKOUT_MINUTES = env_int("REPLAYS_LOGIN_LOCKOUT_MINUTES", 15, minimum=1)
AXES_FAILURE_LIMIT = REPLAYS_LOGIN_FAILURES
AXES_COOLOFF_TIME = timedelta(minutes=REPLAYS_LOGIN_LOCKOUT_MINUTES)
# Each on its own: an account under attack from many addresses, or one address trying many
# accounts.
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "replays.views.common.locked_out"
# Behind the proxy, the client's own address (replays.middleware.client_address).
AXES_CLIENT_IP_CALLABLE = "replays.middleware.client_address"
# Its access log is a row per sign-in: not needed beyond the failures.
AXES_DISABLE_ACCESS_LOG = True

SPECTACULAR_SETTINGS = {
    "TITLE": "Replays API",
    "DESCRIPTION": "Import agent transcripts and replay their requests with other models.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # Served from our own static files: the machines running Replays may have no internet.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "replays.api.schema.refuse_unknown_fields",
    ],
}

# --- Background work (django-q2) -----------------------------------------------------

REDIS_URL = env_str("REDIS_URL")
Q_CLUSTER: dict[str, object] = {
    "name": "replays",
    "workers": env_int("REPLAYS_Q_WORKERS", 2, minimum=1),
    # Tasks are short and idempotent; `timeout` must stay below `retry` (FACTS.md).
    "timeout": 120,
    "retry": 180,
    "max_attempts": 1,
    "catch_up": False,
    "label": "Tasks",
}
if REDIS_URL:
    Q_CLUSTER["redis"] = REDIS_URL
else:
    Q_CLUSTER["orm"] = "default"

# The default cache is shared by every process (the API's throttle counts in it): Redis,
# else a database table, made by `migrate` (replays/migrations/0006_cache_table.py).
REPLAYS_CACHE_TABLE = "replays_cache"
CACHES: dict[str, dict[str, object]] = {
    "default": (
        {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "replays",
        }
        if REDIS_URL
        else {
            "BACKEND": "django.core.cache.backends.db.DatabaseCache",
            "LOCATION": REPLAYS_CACHE_TABLE,
        }
    ),
    # The ORM broker's cluster writes its statistics (django-q2's Stat, for qinfo) every
    # half second: kept in its own memory rather than in the database. Nothing Replays
    # decides reads them; the Host rows (replays/hosts.py) are the shared view of the
    # clusters. With Redis, django-q2 keeps them in Redis itself.
    "local": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
}
Q_CLUSTER["cache"] = "local"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "WARNING")},
    "loggers": {"replays": {"level": env_str("LOG_LEVEL", "INFO")}},
}
