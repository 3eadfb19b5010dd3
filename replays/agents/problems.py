"""Setup problems: an agent that could not work for a reason that is not the model's.

Not logged in, bad or missing credentials, a quota or a rate limit, a model id the
provider does not know, the program missing, the network unreachable, the provider
down: a run that ends so says nothing about how well the model does the task, so it is
failed as `setup` (FailureCode.SETUP) with the agent's own words and the fix, and the
leaderboard does not count it against the model.

Each adapter reads its agent's own signal where it gives one (Claude Code's typed
`error` on an assistant message and `api_error_status` on its result; the HTTP status
Codex quotes) and turns it into a SetupProblem here; the words stay the agent's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class SetupKind(StrEnum):
    NOT_LOGGED_IN = "not_logged_in"
    CREDENTIALS = "credentials"
    QUOTA = "quota"
    RATE_LIMIT = "rate_limit"
    UNKNOWN_MODEL = "unknown_model"
    PROGRAM_MISSING = "program_missing"
    NETWORK = "network"
    PROVIDER = "provider_unavailable"
    SANDBOX = "sandbox"


# What each kind is called, and what to do about it.
_EXPLAINED: dict[SetupKind, tuple[str, str]] = {
    SetupKind.NOT_LOGGED_IN: (
        "Not logged in",
        "A run's agent starts with a home of its own holding only the agent's seed_files: "
        "give it your login there (for claude `.claude/.credentials.json`, for codex "
        "`auth.json`, for gemini `.gemini/oauth_creds.json`, for opencode "
        "`.local/share/opencode/auth.json`, for pi `.pi/agent/auth.json`) or an API key "
        "through its `env` (REPLAYS_AGENTS_FILE).",
    ),
    SetupKind.CREDENTIALS: (
        "Credentials refused or missing",
        "Check the API key or login the agent is given (its `env` and `seed_files` in "
        "REPLAYS_AGENTS_FILE); an expired login must be renewed.",
    ),
    SetupKind.QUOTA: (
        "Quota or credit used up",
        "Add credit or raise the quota with the provider, then prepare the replay again.",
    ),
    SetupKind.RATE_LIMIT: (
        "Rate limited by the provider",
        "Run fewer replays at once (REPLAYS_MAX_PARALLEL_RUNS) or wait, then prepare "
        "the replay again.",
    ),
    SetupKind.UNKNOWN_MODEL: (
        "The provider does not know this model",
        "Check the model id in REPLAYS_AGENTS_FILE against the provider's list.",
    ),
    SetupKind.PROGRAM_MISSING: (
        "The agent's program cannot start",
        "Install it, or set its `binary` in REPLAYS_AGENTS_FILE (manage.py replays_doctor "
        "checks every agent).",
    ),
    SetupKind.NETWORK: (
        "The provider cannot be reached",
        "Check this machine's network and the agent's base URL.",
    ),
    SetupKind.PROVIDER: (
        "The provider is unavailable",
        "The provider answered with a server error or is overloaded: try again later.",
    ),
    SetupKind.SANDBOX: (
        "The sandbox stopped the agent's commands",
        "See manage.py replays_doctor for the sandbox's state.",
    ),
}


@dataclass(frozen=True)
class SetupProblem:
    kind: SetupKind
    words: str = ""  # the agent's own message

    @property
    def title(self) -> str:
        return _EXPLAINED[self.kind][0]

    @property
    def fix(self) -> str:
        return _EXPLAINED[self.kind][1]

    def message(self) -> str:
        """What the run's failure says: what happened, the agent's words, the fix."""
        words = self.words.strip()
        said = f": {words}" if words else "."
        return f"Setup problem ({self.title.lower()}){said}\nFix: {self.fix}"


def from_http_status(status: int, words: str) -> SetupProblem | None:
    """The problem a provider's HTTP status says, or None for one that is the request's own
    (a 400 for a prompt too long is the model's run going wrong, not setup)."""
    lowered = words.lower()
    if status == 401 or status == 403:
        return SetupProblem(SetupKind.CREDENTIALS, words)
    if status == 402 or (status in (400, 429) and _QUOTA_RE.search(lowered)):
        return SetupProblem(SetupKind.QUOTA, words)
    if status == 429:
        return SetupProblem(SetupKind.RATE_LIMIT, words)
    if status == 404 and "model" in lowered:
        return SetupProblem(SetupKind.UNKNOWN_MODEL, words)
    if status in (502, 503, 529) or (status == 500 and "overloaded" in lowered):
        return SetupProblem(SetupKind.PROVIDER, words)
    return None


_QUOTA_RE = re.compile(r"quota|credit balance|billing|usage limit|insufficient_quota")


# --- Known before anything is spent: is the agent given a login? ---------------------

READY, MISSING, UNKNOWN = "ready", "missing", "unknown"


@dataclass(frozen=True)
class Login:
    """Whether a run's agent will have a login. A run starts its agent in a home of its
    own holding only the seed files, so what the agent is given (its env, the seed files,
    the service's own environment) is all it has, and that can be read before anything
    runs: `missing` means certainly none, `unknown` that we cannot tell."""

    state: str  # READY | MISSING | UNKNOWN
    message: str = ""  # what is missing and how to give it


def first_set(env: dict[str, str], names: tuple[str, ...]) -> str:
    """The first of `names` set (not blank) in `env`, or ""."""
    return next((name for name in names if env.get(name, "").strip()), "")
