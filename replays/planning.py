"""Prepare: validate and normalise a replay configuration, resolve every thread's
repository, baseline and ending commits and historical result, and store a Plan
that waits for a single-use approval.

Git and file reads happen before any transaction; the Plan is written at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import secrets
import shlex
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from replays import access, agents, context, evidence, repos, runfolder
from replays.agents.problems import MISSING
from replays.errors import ErrorKind, ServiceError
from replays.evaluation import evaluators
from replays.models import (
    MAX_MODELS_PER_PLAN,
    MAX_THREADS_PER_PLAN,
    MODEL_ID_LENGTH,
    Plan,
    PlanStatus,
    SourceKind,
    Thread,
    Turn,
)
from replays.runspec import DEFAULT_TEST_PATHS

MAX_REQUEST_BYTES = 1024 * 1024
MAX_PATH_LENGTH = 4096
# The longest name one folder or file can have (in bytes): a longer one names nothing.
MAX_NAME_BYTES = 255
MAX_TITLE_LENGTH = 500
MAX_VERIFY_COMMAND_LENGTH = 4000
MAX_TEST_PATHS = 20
MAX_TEST_PATH_LENGTH = 200
MIN_TIMEOUT_SECONDS = 10
# The largest id a (64-bit) primary key holds; a larger one cannot even be looked up.
MAX_ID = 2**63 - 1
MAX_TIMEOUT_SECONDS = 24 * 60 * 60
REQUEST_SEPARATOR = "\n\n---\n\n"
# The answer to a baseline_commit or ending_commit question that means "rebuilt from the
# transcript's own edits" (in a repository Replays keeps under the var folder).
TRANSCRIPT = "transcript"
# How many earlier requests a rebuilt starting tree may gather the edits of.
MAX_REBUILT_REQUESTS = 50
# Users commit an agent's work right after it finishes: commits this soon after the
# thread's end still count as its result.
ENDING_GRACE = timedelta(minutes=10)
# Known clones offered when a thread's folder is not a repository: how many, and how far
# back the user's own plans are searched for them.
MAX_KNOWN_CLONES = 5
KNOWN_CLONE_PLANS = 200
# Where setup_demo clones the sample sessions' repository, under REPLAYS_VAR_DIR.
DEMO_CLONE = "sample-repo"
CONFIGURATION_KEYS = {
    "thread_id",
    "start_message_uuid",
    "end_message_uuid",
    "request",
    "repository",
    "baseline_commit",
    "ending_commit",
    "thread_title",
}


class PlanInputError(ServiceError):
    """The configuration itself is not acceptable (invalid, or too large)."""


class PrepareConflict(ServiceError):
    """Models of one thread saw different baselines or historical results."""

    kind = ErrorKind.CONFLICT


@dataclass
class PreparedPlan:
    plan: Plan
    prepare_token: str | None  # shown once; None when the plan is not ready for approval


@dataclass
class ThreadPreparation:
    """What prepare resolved for one thread; compared again at approval."""

    thread_id: int
    repository: str = ""
    baseline_commit: str = ""
    ending_commit: str = ""
    historical_result_sha256: str = ""
    transcript_sha256: str = ""
    verify_files: dict[str, str] = field(default_factory=dict)
    request: str = ""
    start_message_uuid: str = ""
    end_message_uuid: str = ""
    prepared_configuration_sha256: dict[str, str] = field(default_factory=dict)
    blockers: list[str] = field(default_factory=list)
    questions: list[dict[str, Any]] = field(default_factory=list)
    # What was rebuilt from the transcript: {"baseline"?: {...}, "ending"?: {...}}, each
    # evidence.Rebuilt.as_dict() (commit, base, repository, files, edits, unsure).
    rebuilt: dict[str, Any] = field(default_factory=dict)
    # Each request of the range, one turn each (a replaced request is one turn).
    requests: list[str] = field(default_factory=list)
    # What each model knows before the request: {model: {"mode", "reason"}}.
    context: dict[str, dict[str, str]] = field(default_factory=dict)
    # The `digest` preamble when a model runs with it ("" otherwise); kept as its sha256.
    digest: str = ""

    @property
    def digest_sha256(self) -> str:
        return context.text_sha256(self.digest) if self.digest else ""

    def mode_of(self, model: str) -> str:
        return self.context.get(model, {}).get("mode", context.COLD)

    def protected_inputs(self) -> dict[str, Any]:
        return {
            "context": {model: item["mode"] for model, item in self.context.items()},
            "digest_sha256": self.digest_sha256,
            "rebuilt": self.rebuilt,
            "repository": self.repository,
            "baseline_commit": self.baseline_commit,
            "ending_commit": self.ending_commit,
            "historical_result_sha256": self.historical_result_sha256,
            "transcript_sha256": self.transcript_sha256,
            "verify_files": self.verify_files,
            "request_sha256": self.request_sha256,
        }

    @property
    def request_sha256(self) -> str:
        """The text that will run: approval refuses it changed (a turn edited meanwhile)."""
        return hashlib.sha256(self.request.encode("utf-8", errors="surrogatepass")).hexdigest()

    def stored(self) -> dict[str, Any]:
        """as_dict() and the texts a batch is made from (a campaign keeps it for approval)."""
        return {**self.as_dict(), "request": self.request, "requests": self.requests,
                "digest": self.digest}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ThreadPreparation:
        """The preparation stored() kept."""
        names = {item.name for item in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in names})

    def as_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "repository": self.repository,
            "baseline_commit": self.baseline_commit,
            "ending_commit": self.ending_commit,
            "historical_result_sha256": self.historical_result_sha256,
            "prepared_configuration_sha256": self.prepared_configuration_sha256,
            "transcript_sha256": self.transcript_sha256,
            "verify_files": self.verify_files,
            "request_sha256": self.request_sha256,
            "start_message_uuid": self.start_message_uuid,
            "end_message_uuid": self.end_message_uuid,
            "rebuilt": self.rebuilt,
            "context": self.context,
            "digest_sha256": self.digest_sha256,
            "blockers": self.blockers,
            "questions": self.questions,
        }


# --- Normalising -----------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(configuration: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json(configuration).encode()).hexdigest()


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _has_control_characters(text: str) -> bool:
    return any(unicodedata.category(ch) in {"Cc", "Cf"} for ch in text)


def _optional_string(item: dict[str, Any], key: str, *, max_length: int, where: str) -> str | None:
    value = item.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise PlanInputError(f"{where}: {key} must be a string.", details={"field": key})
    value = value.strip()
    if len(value) > max_length:
        raise PlanInputError(
            f"{where}: {key} is longer than {max_length} characters.", details={"field": key}
        )
    if _has_control_characters(value):
        raise PlanInputError(f"{where}: {key} contains control characters.", details={"field": key})
    return value or None


def _path_string(item: dict[str, Any], key: str, *, where: str) -> str | None:
    value = _optional_string(item, key, max_length=MAX_PATH_LENGTH, where=where)
    if value is not None and any(
        len(part.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for part in Path(value).parts
    ):
        raise PlanInputError(
            f"{where}: {key} has a name longer than {MAX_NAME_BYTES} bytes: no folder is named so.",
            details={"field": key},
        )
    return value


def _commit_string(item: dict[str, Any], key: str, *, where: str) -> str | None:
    value = _optional_string(item, key, max_length=64, where=where)
    if value is not None and value.lower() == TRANSCRIPT:
        return TRANSCRIPT
    if value is not None and not all(ch in "0123456789abcdefABCDEF" for ch in value):
        raise PlanInputError(
            f"{where}: {key} must be a commit id (hexadecimal).", details={"field": key}
        )
    return value.lower() if value else None


def normalise_models(raw: Any) -> list[str]:
    if not isinstance(raw, list) or not raw:
        raise PlanInputError("Choose at least one model.", details={"field": "models"})
    if len(raw) > MAX_MODELS_PER_PLAN:
        raise PlanInputError(
            f"At most {MAX_MODELS_PER_PLAN} models per plan ({len(raw)} given).",
            details={"field": "models"},
        )
    models: list[str] = []
    for value in raw:
        if not isinstance(value, str) or not value.strip():
            raise PlanInputError(
                "Model ids must be non-blank strings.", details={"field": "models"}
            )
        model = value.strip()
        if len(model) > MODEL_ID_LENGTH or _has_control_characters(model):
            raise PlanInputError(
                f"Model id {model[:60]!r} is too long or contains control characters.",
                details={"field": "models"},
            )
        try:
            model = agents.resolve_model(model).id
        except agents.UnknownModel as exc:
            raise PlanInputError(str(exc), code="unknown_model", details={"model": model}) from None
        if model in models:
            raise PlanInputError(f"Model {model} is listed twice.", details={"field": "models"})
        models.append(model)
    return models


def normalise_configuration(raw: Any) -> dict[str, Any]:
    """The canonical form of a replay configuration; its sha256 is the plan's fingerprint.

    Normalising a normalised configuration gives it back unchanged, so a client can send
    the `run_config` that prepare returned and get the same fingerprint.
    """
    if not isinstance(raw, dict):
        raise PlanInputError("The configuration must be a JSON object.")
    unknown = set(raw) - {
        "configurations",
        "models",
        "timeout_seconds",
        "verify_command",
        "evaluator",
        "test_paths",
        "context",
    }
    if unknown:
        raise PlanInputError(
            f"Unknown fields: {', '.join(sorted(unknown))}.", details={"fields": sorted(unknown)}
        )
    items = raw.get("configurations")
    if not isinstance(items, list) or not items:
        raise PlanInputError(
            "Give at least one thread in `configurations`.", details={"field": "configurations"}
        )
    if len(items) > MAX_THREADS_PER_PLAN:
        raise PlanInputError(
            f"At most {MAX_THREADS_PER_PLAN} threads per plan ({len(items)} given).",
            details={"field": "configurations"},
        )
    configurations = [_normalise_thread_item(item, index) for index, item in enumerate(items)]
    thread_ids = [item["thread_id"] for item in configurations]
    if len(set(thread_ids)) != len(thread_ids):
        raise PlanInputError(
            "Each thread may appear once in a plan.", details={"field": "configurations"}
        )
    if len(configurations) > 1:
        for item in configurations:
            if item["start_message_uuid"] or item["end_message_uuid"] or item["request"]:
                raise PlanInputError(
                    "A plan with several threads replays whole threads: give a range or a "
                    "request only when the plan has one thread.",
                    details={"thread_id": item["thread_id"]},
                )
    timeout = raw.get("timeout_seconds", settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS)
    if timeout is None:
        timeout = settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, int)
        or not (MIN_TIMEOUT_SECONDS <= timeout <= MAX_TIMEOUT_SECONDS)
    ):
        raise PlanInputError(
            f"timeout_seconds must be a whole number from {MIN_TIMEOUT_SECONDS} to {MAX_TIMEOUT_SECONDS}.",
            details={"field": "timeout_seconds"},
        )
    verify = _optional_string(
        raw, "verify_command", max_length=MAX_VERIFY_COMMAND_LENGTH, where="verify_command"
    )
    if verify is not None:
        try:
            shlex.split(verify)
        except ValueError as exc:
            raise PlanInputError(
                f"verify_command cannot be split into words: {exc}.",
                details={"field": "verify_command"},
            ) from None
        verify = _verify_program_resolved(verify, configurations)
    models = normalise_models(raw.get("models"))
    normalised = {
        "configurations": configurations,
        "models": models,
        "timeout_seconds": timeout,
        "verify_command": verify,
        "evaluator": normalise_evaluator(raw.get("evaluator")),
        "test_paths": normalise_test_paths(raw.get("test_paths")),
    }
    try:
        modes = context.normalise_context(raw.get("context"), models)
    except context.ContextError as exc:
        raise PlanInputError(str(exc), details={"field": "context"}) from None
    if modes is not None:
        # Absent means the default for every model (and keeps older fingerprints).
        normalised["context"] = modes
    return normalised


def verify_command_from(command: str, *, base: Path) -> str:
    """The verify command with a relative program (`.venv/bin/python`) made absolute from
    `base`, the folder the user typed it in (the command line's working folder, or the
    repository for the API and the pages). The command runs in a worktree, where the same
    relative path would name something else, or nothing. PlanInputError when the program
    is not there. A bare name (`pytest`) is looked up on PATH when it runs."""
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise PlanInputError(
            f"verify_command cannot be split into words: {exc}.",
            details={"field": "verify_command"},
        ) from None
    if not words or "/" not in words[0] or words[0].startswith("/"):
        return command
    program = Path(os.path.abspath(base / words[0]))
    if not (program.is_file() and os.access(program, os.X_OK)):
        raise PlanInputError(
            f"The verify command's program {words[0]} is not an executable file in {base} "
            f"({program}). A relative program is taken from {base}; give an absolute path "
            "or a program on PATH.",
            code="verify_program_missing",
            details={"field": "verify_command", "program": str(program)},
        )
    return shlex.join([str(program), *words[1:]])


def _verify_program_resolved(command: str, configurations: list[dict[str, Any]]) -> str:
    """A relative program left in the configuration (the API, the pages) is taken from
    the repository the plan names; with none named, it is refused: the thread's folder
    is not where the user typed it, and the worktree would be a surprise."""
    words = shlex.split(command)
    if not words or "/" not in words[0] or words[0].startswith("/"):
        return command
    named = {item.get("repository") or "" for item in configurations}
    repository = Path(named.pop()) if len(named) == 1 else None
    if repository is None or not repository.is_absolute() or not access.under_roots(repository):
        raise PlanInputError(
            f"The verify command's program {words[0]} is a relative path, and the plan names "
            "no repository (one, absolute, under the repository roots) to take it from: give "
            "`repository`, or an absolute path to the program.",
            code="verify_program_relative",
            details={"field": "verify_command", "program": words[0]},
        )
    return verify_command_from(command, base=repository)


def normalise_evaluator(raw: Any) -> str | None:
    """The evaluator's canonical id, or None: prepare then resolves one for the plan."""
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return None
    if not isinstance(raw, str) or len(raw) > MODEL_ID_LENGTH or _has_control_characters(raw):
        raise PlanInputError(
            "evaluator must be `tests` or a model id.", details={"field": "evaluator"}
        )
    try:
        return evaluators.resolve_evaluator(raw).id
    except evaluators.UnknownEvaluator as exc:
        raise PlanInputError(
            str(exc), code="unknown_evaluator", details={"evaluator": raw.strip()}
        ) from None


def normalise_test_paths(raw: Any) -> list[str] | None:
    """Globs naming the historical diff's test files; None means the default set."""
    if raw is None:
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TEST_PATHS:
        raise PlanInputError(
            f"test_paths must be a list of at most {MAX_TEST_PATHS} globs.",
            details={"field": "test_paths"},
        )
    paths: list[str] = []
    for value in raw:
        if (
            not isinstance(value, str)
            or not value.strip()
            or len(value) > MAX_TEST_PATH_LENGTH
            or _has_control_characters(value)
            or value.strip().startswith("/")
        ):
            raise PlanInputError(
                "Each of test_paths is a relative glob such as `tests/**` or `test_*.py`.",
                details={"field": "test_paths"},
            )
        if value.strip() not in paths:
            paths.append(value.strip())
    return paths


def _normalise_thread_item(item: Any, index: int) -> dict[str, Any]:
    where = f"configurations[{index}]"
    if not isinstance(item, dict):
        raise PlanInputError(f"{where} must be an object.")
    unknown = set(item) - CONFIGURATION_KEYS
    if unknown:
        raise PlanInputError(f"{where}: unknown fields {', '.join(sorted(unknown))}.")
    thread_id = item.get("thread_id")
    if (
        isinstance(thread_id, bool)
        or not isinstance(thread_id, int)
        or not 1 <= thread_id <= MAX_ID
    ):
        raise PlanInputError(
            f"{where}: thread_id must be a thread's id.", details={"field": "thread_id"}
        )
    request = item.get("request")
    if request is not None:
        if not isinstance(request, str):
            raise PlanInputError(f"{where}: request must be a string.")
        if len(request.encode()) > MAX_REQUEST_BYTES:
            raise PlanInputError(
                f"{where}: the request is larger than 1 MiB.",
                code="too_large",
                kind=ErrorKind.TOO_LARGE,
                details={"field": "request", "limit": MAX_REQUEST_BYTES},
            )
        if "\x00" in request:
            raise PlanInputError(f"{where}: the request contains a NUL character.")
        request = request if request.strip() else None
    return {
        "thread_id": thread_id,
        "start_message_uuid": _optional_string(
            item, "start_message_uuid", max_length=200, where=where
        ),
        "end_message_uuid": _optional_string(item, "end_message_uuid", max_length=200, where=where),
        "request": request,
        "repository": _path_string(item, "repository", where=where),
        "baseline_commit": _commit_string(item, "baseline_commit", where=where),
        "ending_commit": _commit_string(item, "ending_commit", where=where),
        "thread_title": _optional_string(
            item, "thread_title", max_length=MAX_TITLE_LENGTH, where=where
        ),
    }


# --- Resolving one thread --------------------------------------------------------------


def _range(thread: Thread, item: dict[str, Any]) -> tuple[list[Turn], Turn | None]:
    """The turns of the range and the first turn after it (None when the range ends the thread)."""
    turns = list(thread.turns.order_by("index"))
    if not turns:
        raise PlanInputError(
            f"Thread {thread.pk} has no requests to replay.", details={"thread_id": thread.pk}
        )
    by_uuid = {turn.message_uuid: turn for turn in turns}
    start = turns[0]
    end = turns[-1]
    for key in ("start_message_uuid", "end_message_uuid"):
        uuid = item[key]
        if uuid is not None and uuid not in by_uuid:
            raise PlanInputError(
                f"Thread {thread.pk} has no request with message uuid {uuid}.",
                details={"thread_id": thread.pk, "field": key},
            )
    if item["start_message_uuid"]:
        start = by_uuid[item["start_message_uuid"]]
    if item["end_message_uuid"]:
        end = by_uuid[item["end_message_uuid"]]
    elif item["start_message_uuid"]:
        end = start
    if end.index < start.index:
        raise PlanInputError(
            f"Thread {thread.pk}: the range ends before it starts.",
            details={"thread_id": thread.pk},
        )
    selected = turns[start.index : end.index + 1]
    following = turns[end.index + 1] if end.index + 1 < len(turns) else None
    return selected, following


transcript_digest = context.transcript_digest


def verify_command_files(repository: Path, command: str | None) -> dict[str, str]:
    """Digests of the files the verify command names (its arguments that are files in the repo)."""
    if not command:
        return {}
    try:
        words = shlex.split(command)
    except ValueError:
        words = command.split()
    names = []
    root = repository.resolve()
    for word in words:
        candidate = word.split("::", 1)[0]
        if candidate.startswith("-") or candidate.startswith("/") or ".." in Path(candidate).parts:
            continue
        if candidate not in names and _is_file_inside(root, repository / candidate):
            names.append(candidate)
    return repos.digest_files(repository, names) if names else {}


def _is_file_inside(root: Path, path: Path) -> bool:
    """A file of the repository: a link out of it is not one, like an absolute path; a name
    the system refuses (too long) names none."""
    try:
        return path.is_file() and root in path.resolve().parents
    except (OSError, RuntimeError):  # RuntimeError: a loop of links
        return False


def _question(question: repos.Question, thread: Thread) -> dict[str, Any]:
    return {
        "thread_id": thread.pk,
        "field": question.field,
        "message": question.message,
        "choices": [
            {"commit": c.sha, "subject": c.subject, "committed_at": c.committed_at.isoformat()}
            for c in question.choices
        ],
    }


def resolve_thread(
    thread: Thread,
    item: dict[str, Any],
    *,
    verify_command: str | None,
    transcript_sha256: str | None = None,
) -> ThreadPreparation:
    """Repository, baseline, ending, historical result and digests for one thread and range.

    `transcript_sha256` saves hashing the transcript again when the caller already has it."""
    selected, following = _range(thread, item)
    # What each historical agent received (an IDE's blocks, a command's expansion
    # included); a request the user rolled back is not replayed as if it had stood.
    stood = [turn.sent_request for turn in selected if not turn.rolled_back]
    prep = ThreadPreparation(
        thread_id=thread.pk,
        start_message_uuid=selected[0].message_uuid,
        end_message_uuid=selected[-1].message_uuid,
        request=item["request"] or REQUEST_SEPARATOR.join(stood),
        requests=[item["request"]] if item["request"] else stood,
        transcript_sha256=transcript_sha256 or transcript_digest(thread),
    )
    if not item["request"] and not stood:
        prep.blockers.append(
            f"Thread {thread.pk}: the user rolled back every selected request "
            "(the thread went on without them)."
        )
    elif not prep.request.strip():
        prep.blockers.append(f"Thread {thread.pk}: the selected requests are empty.")
    given_repository = item["repository"]
    candidate = given_repository or thread.cwd
    if given_repository and not access.under_roots(given_repository):
        # Said the same whether the path exists or not: nothing is learnt about the disk.
        prep.blockers.append(f"The repository {given_repository} {access.OUTSIDE_ROOTS}.")
        return prep
    repository = (
        repos.find_repository(Path(candidate))
        if candidate and access.under_roots(candidate)
        else None
    )
    if repository is not None and not access.under_roots(repository):
        if given_repository:
            prep.blockers.append(f"The repository {given_repository} {access.OUTSIDE_ROOTS}.")
            return prep
        repository = None  # the folder is inside a repository that lies outside the roots
    if repository is None:
        if given_repository:
            prep.blockers.append(f"{given_repository} is not a git repository.")
        else:
            # The choices (known clones) depend on who asks: prepare_thread fills them in.
            prep.questions.append(
                {
                    "thread_id": thread.pk,
                    "field": "repository",
                    "message": f"The thread's folder {thread.cwd or '(none recorded)'} is not a git "
                    "repository here. Where is a clone of it?",
                    "choices": [],
                }
            )
        return prep
    prep.repository = str(repository)

    # Codex records the commit its session started from (the baseline of the first request;
    # a later record, when a release writes one, that of its turn).
    recorded = ""
    if thread.source_kind == SourceKind.CODEX:
        later = _evidence_of(selected[0]).get("recorded_commit", "")
        recorded = thread.git_commit if selected[0].index == 0 else str(later)
    found = TranscriptEvidence(thread, repository, selected, following)
    baseline = _decide_commit(
        prep, thread, repository, given=item["baseline_commit"], field="baseline_commit",
        resolve=lambda: repos.resolve_baseline(
            repository, branch=thread.git_branch, before=selected[0].timestamp,
            recorded_commit=recorded, check=found.starting_check(),
        ),
        rebuild=found.rebuild_start,
    )  # fmt: skip
    if baseline is None:
        return prep
    prep.baseline_commit = baseline
    # A rebuilt start is not in the user's repository: its ending is looked for from the
    # commit it was rebuilt on.
    anchor = found.rebuilt["baseline"].base if "baseline" in found.rebuilt else baseline
    ending = _decide_commit(
        prep, thread, repository, given=item["ending_commit"], field="ending_commit",
        resolve=lambda: repos.resolve_ending(
            repository, branch=thread.git_branch, baseline=anchor,
            before=following.timestamp if following else _next_session_start(thread),
            thread_ended_at=thread.ended_at, grace=ENDING_GRACE,
            check=found.result_check(), following_check=found.following_check(),
        ),
        rebuild=lambda resolution: found.rebuild_ending(baseline, resolution),
    )  # fmt: skip
    if ending is None:
        return prep
    prep.ending_commit = ending
    prep.rebuilt = {side: done.as_dict() for side, done in found.rebuilt.items()}
    if prep.rebuilt:
        # Runs check out from the repository that holds the rebuilt commits.
        repository = found.rebuilt_repository()
        prep.repository = str(repository)
    try:
        prep.historical_result_sha256 = repos.sha256_text(
            repos.historical_diff(repository, baseline, ending)
        )
        prep.verify_files = verify_command_files(repository, verify_command)
    except repos.GitError as exc:
        prep.blockers.append(str(exc))
    return prep


def _decide_commit(
    prep: ThreadPreparation,
    thread: Thread,
    repository: Path,
    *,
    given: str | None,
    field: str,
    resolve: Callable[[], repos.Resolution],
    rebuild: Callable[[repos.Resolution | None], Rebuilding] | None = None,
) -> str | None:
    """The commit the user gave (which must exist), or the one git resolves; None after
    adding the blocker or question that stops this thread.

    `rebuild` makes the tree from the transcript's edits: for the answer `transcript`, and
    when the evidence says no commit is the tree asked for (then its commit is used, or
    offered as the choice `transcript` when it is not certain, or the question says why it
    cannot be rebuilt)."""
    if given == TRANSCRIPT:
        outcome = rebuild(None) if rebuild is not None else Rebuilding(note="")
        if outcome.commit is None:
            prep.blockers.append(
                f"{field} {TRANSCRIPT}: the tree cannot be rebuilt from the transcript"
                f"{': ' + outcome.note if outcome.note else '.'}"
            )
        return outcome.commit
    if given:
        commit = repos.resolve_commit(repository, given)
        if commit is None:
            prep.blockers.append(f"{field} {given} is not a commit in {repository}.")
        return commit
    resolution = resolve()
    if resolution.blocker:
        prep.blockers.append(resolution.blocker)
        return None
    if resolution.question is None:
        return resolution.commit
    question = _question(resolution.question, thread)
    if resolution.uncommitted and rebuild is not None:
        outcome = rebuild(resolution)
        if outcome.commit is not None and outcome.automatic:
            return outcome.commit
        if outcome.choice is not None:
            question["choices"].insert(0, outcome.choice)
        if outcome.note:
            question["message"] += f" {outcome.note}"
    prep.questions.append(question)
    return None


# --- Evidence and results rebuilt from the transcript ----------------------------------


@dataclass
class Rebuilding:
    """What rebuilding a tree from the transcript gave."""

    commit: str | None = None  # the rebuilt commit
    automatic: bool = False  # certain enough to be used without asking
    choice: dict[str, Any] | None = None  # the `transcript` choice to offer
    note: str = ""  # said in the question: what it would be, or why it cannot be


def _evidence_of(turn: Turn) -> dict[str, Any]:
    return turn.evidence if isinstance(turn.evidence, dict) else {}


def _items(turn: Turn) -> list[dict[str, Any]]:
    items = _evidence_of(turn).get("items")
    return [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []


class TranscriptEvidence:
    """One thread's evidence for one range: the checks that pick its baseline and ending
    among candidate commits, and the trees rebuilt from its edits (replays/evidence.py)."""

    def __init__(
        self, thread: Thread, repository: Path, selected: list[Turn], following: Turn | None
    ) -> None:
        self.thread = thread
        self.repository = repository
        self.selected = selected
        self.following = following
        self.paths = evidence.PathMap.for_thread(thread.cwd, repository)
        self.rebuilt: dict[str, evidence.Rebuilt] = {}

    def starting_check(self) -> repos.EvidenceCheck | None:
        facts = evidence.starting_facts(_items(self.selected[0]), self.paths)
        return evidence.checker(self.repository, facts)

    def result_check(self) -> repos.EvidenceCheck | None:
        items = [item for turn in self.selected for item in _items(turn)]
        return evidence.checker(self.repository, evidence.result_facts(items, self.paths))

    def following_check(self) -> repos.EvidenceCheck | None:
        if self.following is None:
            return None
        facts = evidence.starting_facts(_items(self.following), self.paths)
        return evidence.checker(self.repository, facts)

    def rebuilt_repository(self) -> Path:
        return next(iter(self.rebuilt.values())).repository

    def _steps(self, turns: list[Turn]) -> list[tuple[int, dict[str, Any]]]:
        return [(turn.index + 1, item) for turn in turns for item in _items(turn)]

    def _rebuild(self, what: str, base: str, turns: list[Turn]) -> evidence.Rebuilt:
        cut = [turn.index + 1 for turn in turns if _evidence_of(turn).get("cut")]
        if cut:
            raise evidence.CannotRebuild(
                f"the transcript's record of request #{cut[0]} was cut (too large to keep)"
            )
        last = turns[-1]
        message = (
            f"Replays: {what} rebuilt from the transcript\n\n"
            f"{self.thread.get_source_kind_display()} session {self.thread.session_id}, "
            f"{_requests(turns)}: the file edits applied to {base[:12]}.\n"
        )
        return evidence.rebuild(
            source=self.repository,
            root=Path(settings.REPLAYS_VAR_DIR) / "rebuilt",
            base=base,
            steps=self._steps(turns),
            paths=self.paths,
            message=message,
            when=last.last_answer_at or last.timestamp,
        )

    def rebuild_ending(self, baseline: str, resolution: repos.Resolution | None) -> Rebuilding:
        """The range's result: its edits applied to the baseline. Used as the ending when
        every edit applied exactly and no command may have changed files besides."""
        if not _has_edits(self._steps(self.selected)):
            # Nothing to rebuild from: a question stands as it is.
            return Rebuilding(note="the requests made no file edits" if resolution is None else "")
        try:
            done = self._rebuild("the result", baseline, self.selected)
        except evidence.CannotRebuild as exc:
            return Rebuilding(note=f"It cannot be rebuilt from the transcript's edits: {exc}.")
        if resolution is None or not done.unsure:
            self.rebuilt["ending"] = done
            return Rebuilding(commit=done.commit, automatic=True)
        self.rebuilt.pop("ending", None)
        return Rebuilding(
            choice=_transcript_choice(done),
            note=(
                f"Answer {TRANSCRIPT} to use the agent's edits applied to the baseline "
                f"({_changes(done)}); commands may have changed files too: "
                f"{'; '.join(done.unsure[:3])}."
            ),
        )

    def rebuild_start(self, resolution: repos.Resolution | None) -> Rebuilding:
        """The tree the range started from, when the thread's earlier requests left their
        edits uncommitted: a candidate commit with the edits of the requests since it applied
        (the earliest of them is the last one whose own evidence the commit supports), which
        the range's evidence must then support. Offered, never taken without asking."""
        asked = resolution is None
        if resolution is None:
            resolution = repos.resolve_baseline(
                self.repository, branch=self.thread.git_branch, before=self.selected[0].timestamp
            )
        candidates = [resolution.commit] if resolution.commit else []
        if resolution.question is not None:
            candidates += [choice.sha for choice in resolution.question.choices]
        first_index = self.selected[0].index
        earlier = list(
            self.thread.turns.filter(
                index__lt=first_index, index__gte=first_index - MAX_REBUILT_REQUESTS
            ).order_by("index")
        )
        facts = evidence.starting_facts(_items(self.selected[0]), self.paths)
        reason = "the session made no file edits before these requests"
        for candidate in dict.fromkeys(candidates):
            for first in range(len(earlier) - 1, -1, -1):
                since = earlier[first:]
                if not _has_edits(self._steps(since)):
                    continue
                started = evidence.starting_facts(_items(earlier[first]), self.paths)
                if evidence.support(self.repository, candidate, started).failed:
                    continue  # that request did not start from this commit: look further back
                try:
                    done = self._rebuild("the starting tree", candidate, since)
                except evidence.CannotRebuild as exc:
                    reason = str(exc)
                    break
                if evidence.support(done.repository, done.commit, facts).failed:
                    reason = "the earlier requests' edits do not give the files the agent saw"
                    break
                if asked:  # the answer `transcript`: this is the baseline
                    self.rebuilt["baseline"] = done
                unsure = f"; commands may have changed files too: {'; '.join(done.unsure[:3])}"
                return Rebuilding(
                    commit=done.commit,
                    choice=_transcript_choice(done),
                    note=(
                        f"Answer {TRANSCRIPT} to start from {candidate[:12]} with the edits of "
                        f"{_requests(since)} applied ({_changes(done)}){unsure if done.unsure else ''}."
                    ),
                )
        return Rebuilding(note=f"It cannot be rebuilt from the transcript: {reason}.")


def _requests(turns: list[Turn]) -> str:
    if len(turns) == 1:
        return f"request #{turns[0].index + 1}"
    return f"requests #{turns[0].index + 1}-#{turns[-1].index + 1}"


def _has_edits(steps: list[tuple[int, dict[str, Any]]]) -> bool:
    return any(item.get("kind") in ("edit", "write", "patch") for _, item in steps)


def _changes(done: evidence.Rebuilt) -> str:
    files = ", ".join(done.files[:3]) + (
        f" and {len(done.files) - 3} more" if len(done.files) > 3 else ""
    )
    return f"{done.edits} edit{'s' if done.edits != 1 else ''} of {files or 'no file'}"


def _transcript_choice(done: evidence.Rebuilt) -> dict[str, Any]:
    return {
        "commit": TRANSCRIPT,
        "subject": f"rebuilt from the transcript: {_changes(done)}, on {done.base[:12]}",
    }


def known_clones(*, owner: AbstractBaseUser, thread: Thread) -> list[dict[str, str]]:
    """Git repositories here that are likely clones of the thread's repository, offered as
    answers when its folder is not one: first those this user's own earlier plans used for
    threads in the same folder (newest first; never another user's paths), then the demo
    clone when it holds a commit recorded by a thread in that folder (Codex records the
    commit a session started from; the demo's Claude Code sessions share their folder with
    its Codex sessions, so they find it too). Each is `{"repository", "reason"}`."""
    thread_ids = {thread.pk}
    recorded = {thread.git_commit} - {""}
    if thread.cwd:
        same_folder = Thread.objects.filter(owner=thread.owner_id, cwd=thread.cwd)
        thread_ids |= set(same_folder.values_list("pk", flat=True))
        commits = same_folder.exclude(git_commit="").order_by().values_list("git_commit", flat=True)
        recorded |= set(commits.distinct()[:MAX_KNOWN_CLONES])
    found: dict[str, str] = {}
    checked: set[str] = set()  # each path is asked of git once, however many plans used it
    earlier = Plan.objects.filter(owner=owner).order_by("-created_at", "-pk")
    for plan_id, preparations in earlier.values_list("pk", "preparations")[:KNOWN_CLONE_PLANS]:
        for prep in preparations if isinstance(preparations, list) else []:
            path = prep.get("repository")
            if not path or prep.get("thread_id") not in thread_ids or path in checked:
                continue
            checked.add(path)
            top = _work_tree_top(path)
            if top is not None and len(found) < MAX_KNOWN_CLONES:
                found.setdefault(top, f"used by your plan {plan_id}")
    demo = _work_tree_top(str(Path(settings.REPLAYS_VAR_DIR) / DEMO_CLONE))
    if demo is not None and demo not in found and len(found) < MAX_KNOWN_CLONES:
        if any(repos.resolve_commit(Path(demo), commit) for commit in recorded):
            found[demo] = "the demo clone"
    return [{"repository": path, "reason": reason} for path, reason in found.items()]


def repository_suggestions(*, owner: AbstractBaseUser, thread: Thread) -> list[dict[str, str]]:
    """The known clones to offer up front when the thread's folder is not a repository here
    (prepare would ask); [] when the folder is one."""
    if thread.cwd and _work_tree_top(thread.cwd) is not None:
        return []
    return known_clones(owner=owner, thread=thread)


def _work_tree_top(path: str) -> str | None:
    """The path when it is the top of a git work tree here (a folder inside one is no
    clone) under the repository roots."""
    if not access.under_roots(path):
        return None
    top = repos.find_repository(Path(path))
    return str(top) if top is not None and top == Path(path).resolve() else None


def _next_session_start(thread: Thread) -> Any:
    """When the range ends the thread, commits made soon after it count as its result, but
    not those of a session that started in the same folder meanwhile."""
    if thread.ended_at is None:
        return None
    return (
        Thread.objects.filter(
            owner=thread.owner_id,
            cwd=thread.cwd,
            started_at__gt=thread.ended_at,
            started_at__lt=thread.ended_at + ENDING_GRACE,
        )
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )


def resolve_thread_context(
    prep: ThreadPreparation, thread: Thread, configuration: dict[str, Any]
) -> None:
    """What each model knows before the range (replays.context): the resolved mode and why,
    a blocker for a fork that cannot be done, and the digest when a model uses it."""
    first = thread.turns.filter(message_uuid=prep.start_message_uuid).first()
    if first is None:
        return
    resolved = context.resolve_modes(
        thread,
        first,
        configuration["models"],
        configuration.get("context"),
        repository=Path(prep.repository) if prep.repository else None,
        baseline=prep.baseline_commit,
    )
    prep.context = {model: item.as_dict() for model, item in resolved.items()}
    prep.blockers += [item.blocker for item in resolved.values() if item.blocker]
    if any(item.mode == context.DIGEST for item in resolved.values()):
        prep.digest = context.digest_preamble(thread, first.index)


def prepared_configuration_sha256(
    prep: ThreadPreparation, model: str, configuration: dict[str, Any], evaluator: str
) -> str:
    mode = prep.mode_of(model)
    return fingerprint(
        {
            "model": model,
            "context": mode,
            # What the context is made of: the digest's text, the transcript a fork cuts.
            "context_sha256": {
                context.DIGEST: prep.digest_sha256,
                context.FORK: prep.transcript_sha256,
            }.get(mode, ""),
            "thread_id": prep.thread_id,
            "repository": prep.repository,
            "baseline_commit": prep.baseline_commit,
            "ending_commit": prep.ending_commit,
            "historical_result_sha256": prep.historical_result_sha256,
            "request_sha256": prep.request_sha256,
            "start_message_uuid": prep.start_message_uuid,
            "end_message_uuid": prep.end_message_uuid,
            "timeout_seconds": configuration["timeout_seconds"],
            "verify_command": configuration["verify_command"],
            "test_paths": effective_test_paths(configuration),
            "evaluator": evaluator,
        }
    )


def effective_test_paths(configuration: dict[str, Any]) -> list[str]:
    paths = configuration.get("test_paths")
    return list(paths) if paths is not None else list(DEFAULT_TEST_PATHS)


def prepare_thread(
    thread: Thread,
    item: dict[str, Any],
    configuration: dict[str, Any],
    *,
    evaluator: str,
    owner: AbstractBaseUser,
) -> ThreadPreparation:
    """Resolve the thread once per model: every model must see the same baseline and result."""
    first: ThreadPreparation | None = None
    # Git is asked again per model; the transcript (possibly large) is hashed once.
    transcript_sha256 = transcript_digest(thread)
    for model in configuration["models"]:
        prep = resolve_thread(
            thread,
            item,
            verify_command=configuration["verify_command"],
            transcript_sha256=transcript_sha256,
        )
        if first is None:
            first = prep
            resolve_thread_context(first, thread, configuration)
        elif not (prep.blockers or prep.questions or first.blockers or first.questions):
            if prep.baseline_commit != first.baseline_commit:
                raise PrepareConflict(
                    f"Thread {thread.pk}: baseline changed between selected models "
                    f"({first.baseline_commit[:12]} for {configuration['models'][0]}, "
                    f"{prep.baseline_commit[:12]} for {model}).",
                    code="baseline_changed",
                    details={"thread_id": thread.pk, "model": model},
                )
            if prep.historical_result_sha256 != first.historical_result_sha256:
                raise PrepareConflict(
                    f"Thread {thread.pk}: historical result changed between selected models "
                    f"({configuration['models'][0]} and {model}).",
                    code="historical_result_changed",
                    details={"thread_id": thread.pk, "model": model},
                )
        if not (first.blockers or first.questions):
            first.prepared_configuration_sha256[model] = prepared_configuration_sha256(
                first, model, configuration, evaluator
            )
    assert first is not None
    for question in first.questions:
        if question["field"] == "repository":
            question["choices"] = known_clones(owner=owner, thread=thread)
    return first


def load_threads(configuration: dict[str, Any], owner: AbstractBaseUser) -> list[Thread]:
    """The configuration's threads, among those `owner` may see (another user's thread is
    as unknown as one that does not exist)."""
    ids = [item["thread_id"] for item in configuration["configurations"]]
    threads = Thread.objects.visible_to(owner).in_bulk(ids)
    missing = [thread_id for thread_id in ids if thread_id not in threads]
    if missing:
        raise PlanInputError(
            f"Unknown thread {', '.join(map(str, missing))}.",
            code="unknown_thread",
            details={"thread_ids": missing},
        )
    return [threads[thread_id] for thread_id in ids]


def approval_prompt(configuration: dict[str, Any]) -> str:
    threads = len(configuration["configurations"])
    models = len(configuration["models"])
    return (
        f"Approve {threads} thread{'s' if threads != 1 else ''} "
        f"using {models} model{'s' if models != 1 else ''}?"
    )


def resolve_plan_evaluator(configuration: dict[str, Any]) -> tuple[str, list[str], list[str]]:
    """The plan's one evaluator (named, or resolved by the fallback rule), the blockers that
    stop it from judging, and warnings to show before approval. Decided again at approval,
    where a different answer is a changed input."""
    evaluator = configuration.get("evaluator") or evaluators.default_evaluator(
        models=configuration["models"], verify_command=configuration["verify_command"]
    )
    if not evaluator:
        return "", [], [NO_EVALUATOR]
    try:
        info = evaluators.resolve_evaluator(evaluator)
    except evaluators.UnknownEvaluator as exc:
        return evaluator, [str(exc)], []
    if info.is_tests and not configuration["verify_command"]:
        return (
            info.id,
            ["The tests evaluator scores from the verify command alone: give a verify command."],
            [],
        )
    if not info.available:
        return info.id, [f"The evaluator {info.id} cannot judge here: {info.reason}"], []
    kin = [model for model in configuration["models"] if evaluators.same_family(info, model)]
    warnings = []
    if kin:
        warnings.append(
            f"The evaluator {info.id} runs on the same agent as {', '.join(kin)}: judges "
            "tend to favour their own family; an evaluator of another family is fairer."
        )
    return info.id, [], warnings


def _evaluator_login_warnings(evaluator: str, configuration: dict[str, Any]) -> list[str]:
    """The evaluator's missing login, said once when it is not also a candidate."""
    if not evaluator or evaluator in configuration["models"]:
        return []
    try:
        info = agents.resolve_model(evaluator)
    except agents.UnknownModel:
        return []  # `tests`, or a command judge: nothing to log in to
    if info.available and info.login == MISSING:
        return [f"The evaluator {evaluator} has no login, so judging will fail: "
                f"{info.login_message}"]  # fmt: skip
    return []


NO_EVALUATOR = (
    "No evaluator can judge this plan, so its runs will not be judged: name an evaluator, "
    "give a verify command (for the offline tests evaluator), or configure an agent that "
    "can judge."
)

# A plan's status as words that read in a sentence ("Plan 4 needs your input"), for the
# messages of every door; the badges show the status's own label.
STATUS_PHRASES = {
    PlanStatus.READY_FOR_APPROVAL: "is ready for approval",
    PlanStatus.BLOCKED: "is blocked",
    PlanStatus.NEEDS_USER_INPUT: "needs your input",
}


def status_phrase(status: str) -> str:
    return STATUS_PHRASES.get(status, f"is {status}")


# --- The service -----------------------------------------------------------------------


def _starts_processes(configuration: dict[str, Any], evaluator: str | None) -> bool:
    """Whether the plan's runs would start a process of a model's or the user's choosing:
    an agent, a verify command or a model evaluator (the baselines and the `tests`
    evaluator without a verify command start none)."""
    if configuration.get("verify_command"):
        return True
    if evaluator and evaluator != evaluators.TESTS:
        return True
    for model in configuration["models"]:
        try:
            if not agents.resolve_model(model).is_baseline:
                return True
        except agents.UnknownModel:
            continue
    return False


def prepare_plan(*, owner: AbstractBaseUser, raw_configuration: Any) -> PreparedPlan:
    configuration = normalise_configuration(raw_configuration)
    threads = load_threads(configuration, owner)
    plan_blockers: list[str] = []
    unavailable = []
    login_warnings = []
    for model in configuration["models"]:
        info = agents.resolve_model(model)
        if not info.available:
            unavailable.append(info.id)
            plan_blockers.append(f"Model {model} cannot run here: {info.reason}")
        elif info.login == MISSING:
            login_warnings.append(f"Model {model} has no login, so its run will fail: "
                                  f"{info.login_message}")  # fmt: skip
    evaluator, evaluator_blockers, warnings = resolve_plan_evaluator(configuration)
    if evaluator not in unavailable:  # else the same reason is said once, for the model
        plan_blockers += evaluator_blockers
    warnings = login_warnings + warnings + _evaluator_login_warnings(evaluator, configuration)
    if _starts_processes(configuration, evaluator):
        # Everything a run starts runs in the sandbox; without one here, nothing may run.
        sandbox_reason = runfolder.sandbox_unavailable_reason()
        if sandbox_reason:
            plan_blockers.append(sandbox_reason)
    preparations = [
        prepare_thread(thread, item, configuration, evaluator=evaluator, owner=owner)
        for thread, item in zip(threads, configuration["configurations"], strict=True)
    ]
    blockers = plan_blockers + [b for prep in preparations for b in prep.blockers]
    questions = [q for prep in preparations for q in prep.questions]
    if blockers:
        status = PlanStatus.BLOCKED
    elif questions:
        status = PlanStatus.NEEDS_USER_INPUT
    else:
        status = PlanStatus.READY_FOR_APPROVAL
    token = secrets.token_urlsafe(32)
    now = timezone.now()
    plan = Plan.objects.create(
        owner=owner,
        configuration=configuration,
        fingerprint=fingerprint(configuration),
        preparations=[prep.as_dict() for prep in preparations],
        status=status,
        blockers=blockers,
        questions=questions,
        approval_prompt=approval_prompt(configuration)
        if status == PlanStatus.READY_FOR_APPROVAL
        else "",
        evaluator=evaluator,
        warnings=warnings,
        # A plan that cannot be approved still gets a (never shown) token: the hash is unique.
        token_hash=hash_token(token),
        created_at=now,
        expires_at=now + timedelta(seconds=settings.REPLAYS_PREPARE_TOKEN_SECONDS),
    )
    return PreparedPlan(
        plan=plan, prepare_token=token if status == PlanStatus.READY_FOR_APPROVAL else None
    )
