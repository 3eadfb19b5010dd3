"""The approved run: one member's exact configuration, typed.

Approval builds a RunSpec for every member and stores it (`Run.configuration`, JSON, and
the run folder's `configuration.json`); everything that runs, tests or judges the member
reads it back through `Run.spec` (coordinator, agents' RunContext, the shared review's
key, the report, pages and API). Nothing else reads the stored JSON by key.

`from_json` is tolerant: rows written by older versions lack keys added since (a
context, test paths, a rebuilt tree): each missing key takes its default. The context
modes and the default test paths are defined here, where the spec that carries them is.

Ground layer: plain Python; settings only for the default timeout.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# What the agent knows before the request (replays.context builds each).
COLD = "cold"
DIGEST = "digest"
FORK = "fork"
CONTEXT_MODES = (COLD, DIGEST, FORK)

# Which files of the historical diff are tests (SWE-bench's test patch), unless a plan says.
DEFAULT_TEST_PATHS = ("test_*.py", "*_test.py", "tests/**", "*.test.*", "*_spec.*")


def _doc(text: str, **kwargs: Any) -> Any:
    """A field with its description (the API's schema says it, from here)."""
    return field(metadata={"doc": text}, **kwargs)


@dataclass(frozen=True)
class RunSpec:
    """What one member of a batch runs with, exactly as approved."""

    thread_id: int = _doc("The thread replayed.", default=0)
    model: str = _doc("The model id (`historical`, `empty` or `agent:model`).", default="")
    plan_id: int | None = _doc("The approved plan.", default=None)
    batch_id: int | None = _doc("The batch the member belongs to.", default=None)
    thread_title: str = _doc("The thread's title as approved.", default="")
    repository: str = _doc("The git repository the worktree is made from.", default="")
    baseline_commit: str = _doc("The commit the replay starts from.", default="")
    ending_commit: str = _doc("The commit holding the historical result.", default="")
    historical_result_sha256: str = _doc(
        "sha256 of the historical diff (baseline..ending) as approved.", default=""
    )
    start_message_uuid: str = _doc("The range's first request.", default="")
    end_message_uuid: str = _doc("The range's last request.", default="")
    request: str = _doc("The range's requests as one text.", default="")
    requests: tuple[str, ...] = _doc(
        "Each request of the range: one turn each, in order.", default=()
    )
    timeout_seconds: int | None = _doc(
        "The whole run's timeout; null: REPLAYS_DEFAULT_TIMEOUT_SECONDS.", default=None
    )
    verify_command: str = _doc(
        "The command that tests a tree (no shell; {junit_xml} filled in); empty: none.",
        default="",
    )
    test_paths: tuple[str, ...] = _doc(
        "Globs of the historical diff's test files.", default=DEFAULT_TEST_PATHS
    )
    evaluator: str = _doc("Who judges the run (`tests` or a model id).", default="")
    context: str = _doc(
        "What the agent knows before the request: cold, digest, fork.", default=COLD
    )
    context_reason: str = _doc("Why this context.", default="")
    preamble: str = _doc("The digest the first request starts with (digest only).", default="")
    transcript_sha256: str = _doc("The transcript as approved (a fork cuts it).", default="")
    prepared_configuration_sha256: str = _doc(
        "The fingerprint of this member's prepared configuration.", default=""
    )
    rebuilt: Mapping[str, Any] = _doc(
        "What was rebuilt from the transcript ({side: {commit, base, files, edits, ...}}).",
        default_factory=dict,
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> RunSpec:
        """The spec a stored configuration describes; a missing or empty key is its
        default (rows written before the key existed)."""
        data = data if isinstance(data, Mapping) else {}
        values: dict[str, Any] = {}
        for spec_field in dataclasses.fields(cls):
            raw = data.get(spec_field.name)
            if raw is None or raw == "":
                continue
            values[spec_field.name] = _typed(spec_field.name, raw)
        return cls(**values)

    def as_json(self) -> dict[str, Any]:
        """What approval stores and the run folder holds: plain JSON (lists, null for no
        verify command, as rows always had it)."""
        data = dataclasses.asdict(self)
        data["requests"] = list(self.requests)
        data["test_paths"] = list(self.test_paths)
        data["verify_command"] = self.verify_command or None
        data["rebuilt"] = dict(self.rebuilt)
        return data

    def timeout(self) -> float:
        """The run's timeout in seconds (the deployment's default when none was given)."""
        if self.timeout_seconds is not None and self.timeout_seconds > 0:
            return float(self.timeout_seconds)
        from django.conf import settings

        return float(settings.REPLAYS_DEFAULT_TIMEOUT_SECONDS)

    def turn_requests(self, *, one_turn: bool) -> list[str]:
        """The requests an agent gets, one turn each; `one_turn` (a baseline) gets the
        range's request as one."""
        if one_turn or not self.requests:
            return [self.request]
        return list(self.requests)


_INTEGERS = frozenset({"thread_id", "plan_id", "batch_id", "timeout_seconds"})
_TUPLES = frozenset({"requests", "test_paths"})


def _typed(name: str, raw: Any) -> Any:
    if name in _INTEGERS:
        return int(raw)
    if name in _TUPLES:
        return tuple(str(item) for item in raw) if isinstance(raw, (list, tuple)) else ()
    if name == "rebuilt":
        return dict(raw) if isinstance(raw, Mapping) else {}
    return str(raw)


def documented_fields() -> list[tuple[str, Any, str]]:
    """(name, type, description) of every field, for the API's schema."""
    hints = {spec_field.name: spec_field.type for spec_field in dataclasses.fields(RunSpec)}
    return [
        (spec_field.name, hints[spec_field.name], spec_field.metadata.get("doc", ""))
        for spec_field in dataclasses.fields(RunSpec)
    ]
