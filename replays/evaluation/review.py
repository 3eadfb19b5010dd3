"""The shared historical review of one range: derived once, used by every run on it.

One Review row per (thread, range, baseline and ending commits, historical result,
evaluator, verify command and test paths). It holds the verify command's results
at the baseline and at the historical ending (both with the historical test files
laid over them), FAIL_TO_PASS / PASS_TO_PASS, and the checks the request required.

Claimed like a run: the process whose insert wins the unique constraint derives
it and writes a heartbeat while it works; every other process that needs it
waits for it. A claimer whose heartbeat went stale is taken over with a
compare-and-set on the claim it left, so two processes never derive it at once.
A review that failed before the judgment that needs it was asked for is derived
again; one that failed since is taken as it is (a batch does not retry a broken
evaluator once per run).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from string import Template
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from replays import processes, repos, runfolder, sandbox
from replays.evaluation import checks, evaluators
from replays.models import Review, ReviewStatus
from replays.runspec import RunSpec

logger = logging.getLogger(__name__)

PROMPT_VERSION = "v1"
PROMPTS = Path(__file__).parent / "prompts"
MAX_CHECKS = 10
MAX_CHECK_CHARS = 500
# How often a waiting process looks at the review it waits for.
WAIT_POLL_SECONDS = 0.5

CHECKS_SCHEMA = evaluators.strict_object(
    {"checks": {"type": "array", "items": evaluators.strict_object({"text": {"type": "string"}})}}
)

Tick = Callable[[], None]


class ClaimLost(processes.StopRequested):
    """Another process took our claim over (our heartbeat had gone stale)."""


class ReviewFailed(Exception):
    """The review cannot be derived; the message says why, for the report. `stored` holds
    what was learned before it failed (the tests, the prompt and the raw reply)."""

    def __init__(self, message: str, **stored: Any) -> None:
        super().__init__(message)
        self.stored = stored


@dataclass(frozen=True)
class ReviewKey:
    """What makes two runs share a review."""

    thread_id: int
    start_message_uuid: str
    end_message_uuid: str
    baseline_commit: str
    ending_commit: str
    historical_result_sha256: str
    evaluator: str
    verify_command: str
    test_paths: tuple[str, ...]

    @classmethod
    def for_spec(cls, spec: RunSpec, evaluator: str) -> ReviewKey:
        return cls(
            thread_id=spec.thread_id,
            start_message_uuid=spec.start_message_uuid,
            end_message_uuid=spec.end_message_uuid,
            baseline_commit=spec.baseline_commit,
            ending_commit=spec.ending_commit,
            historical_result_sha256=spec.historical_result_sha256,
            evaluator=evaluator,
            verify_command=spec.verify_command,
            test_paths=spec.test_paths,
        )

    @property
    def tests_digest(self) -> str:
        text = json.dumps([self.verify_command, list(self.test_paths)], ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()

    def lookup(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "start_message_uuid": self.start_message_uuid,
            "end_message_uuid": self.end_message_uuid,
            "baseline_commit": self.baseline_commit,
            "ending_commit": self.ending_commit,
            "historical_result_sha256": self.historical_result_sha256,
            "evaluator": self.evaluator,
            "tests_digest": self.tests_digest,
        }


@dataclass(frozen=True)
class ReviewInputs:
    """What deriving a review needs besides its key."""

    repository: Path
    request: str
    timeout_seconds: float
    # Read once by the caller (and checked against the key's sha256 here); None: read here.
    historical_diff: str | None = None


def obtain_review(
    *, key: ReviewKey, inputs: ReviewInputs, requested_at: datetime, tick: Tick
) -> Review:
    """The ready (or failed) review for `key`: derived here when this process wins the
    claim, else waited for. `tick` is called while working and waiting (heartbeats,
    cancel); only it raises."""
    me = _claimer()
    while True:
        review = _claim_new(key, me)
        if review is not None:
            return _derive(review, key, inputs, me, tick)
        review = Review.objects.get(**key.lookup())
        if review.status == ReviewStatus.READY:
            return review
        if review.status == ReviewStatus.FAILED:
            if review.updated_at >= requested_at or not _take_over(review, me):
                review.refresh_from_db()
                if review.status != ReviewStatus.PENDING:
                    return review
                continue
            return _derive(review, key, inputs, me, tick)
        if _is_stale(review) and _take_over(review, me):
            logger.warning(
                "Review %s: the claim of %s went stale; derived again here.",
                review.pk,
                review.claimed_by,
            )
            return _derive(review, key, inputs, me, tick)
        tick()
        time.sleep(WAIT_POLL_SECONDS)


def _claimer() -> str:
    return f"{settings.REPLAYS_HOST_NAME}:{processes.own_identity()}"


def _claim_new(key: ReviewKey, me: str) -> Review | None:
    """Insert the review, claimed by us; None when it already exists (the constraint says)."""
    now = timezone.now()
    try:
        with transaction.atomic():
            return Review.objects.create(
                **key.lookup(),
                verify_command=key.verify_command,
                test_paths=list(key.test_paths),
                status=ReviewStatus.PENDING,
                claimed_by=me,
                heartbeat_at=now,
                prompt_version=PROMPT_VERSION,
            )
    except IntegrityError:
        return None


def _is_stale(review: Review) -> bool:
    last = review.heartbeat_at or review.updated_at
    return last < timezone.now() - timedelta(seconds=settings.REPLAYS_HEARTBEAT_STALE_SECONDS)


def _take_over(review: Review, me: str) -> bool:
    """Compare-and-set on the claim as we saw it: one process wins a takeover. The earlier
    claimer's evaluators, when they ran on this host, are stopped: nobody waits for them."""
    taken = Review.objects.filter(
        pk=review.pk,
        status=review.status,
        claimed_by=review.claimed_by,
        heartbeat_at=review.heartbeat_at,
    ).update(status=ReviewStatus.PENDING, claimed_by=me, heartbeat_at=timezone.now(), error="")
    if taken == 1 and review.claimed_by.rpartition(":")[0] == settings.REPLAYS_HOST_NAME:
        runfolder.stop_evaluators(runfolder.review_folder(review.pk))
    return taken == 1


def _holding(review: Review, me: str, tick: Tick) -> Tick:
    """`tick`, plus our heartbeat on the review; ClaimLost when someone took it over."""
    return evaluators.holding(
        tick,
        beat=lambda: (
            Review.objects.filter(pk=review.pk, status=ReviewStatus.PENDING, claimed_by=me).update(
                heartbeat_at=timezone.now()
            )
            == 1
        ),
        lost=ClaimLost,
    )


def _derive(review: Review, key: ReviewKey, inputs: ReviewInputs, me: str, tick: Tick) -> Review:
    processes.pause_point("review_claimed")
    beat = _holding(review, me, tick)
    started = time.monotonic()
    folder = runfolder.review_folder(review.pk)
    values: dict[str, Any] = {}
    try:
        values = _work(review, key, inputs, folder, beat)
        values["status"] = ReviewStatus.READY
    except ClaimLost:
        logger.warning("Review %s was taken over while it was derived here.", review.pk)
        return obtain_review(key=key, inputs=inputs, requested_at=timezone.now(), tick=tick)
    except ReviewFailed as exc:
        values = {**exc.stored, "status": ReviewStatus.FAILED, "error": str(exc)}
    values["seconds"] = round(time.monotonic() - started, 3)
    written = Review.objects.filter(
        pk=review.pk, status=ReviewStatus.PENDING, claimed_by=me
    ).update(**values)
    review.refresh_from_db()
    if not written:
        logger.warning("Review %s was taken over before its result was written.", review.pk)
    return review


def _work(
    review: Review, key: ReviewKey, inputs: ReviewInputs, folder: Path, beat: Tick
) -> dict[str, Any]:
    """Tests at the baseline and the historical ending, then the checks: the fields to store."""
    diff = _historical_diff(key, inputs)
    kept = repos.bound_diff(diff, settings.REPLAYS_MAX_DIFF_BYTES)
    stored = {"historical_diff": kept.text, "historical_diff_cut": kept.cut}
    tests = _historical_tests(key, inputs, diff, folder, beat)
    info = _evaluator(key.evaluator)
    if info.is_tests:
        return _checks_from_the_tests(tests, stored)
    return _checks_from_the_evaluator(info, inputs, diff, tests, stored, folder, beat)


def _historical_diff(key: ReviewKey, inputs: ReviewInputs) -> str:
    """The historical diff (as the caller read it, or read here), as approved."""
    diff = inputs.historical_diff
    if diff is None:
        try:
            diff = repos.historical_diff(inputs.repository, key.baseline_commit, key.ending_commit)
        except repos.GitError as exc:
            raise ReviewFailed(f"The historical result cannot be read: {exc}") from None
    if repos.sha256_text(diff) != key.historical_result_sha256:
        raise ReviewFailed("The historical result changed since the plan was approved.")
    return diff


def _checks_from_the_tests(tests: dict[str, Any], stored: dict[str, Any]) -> dict[str, Any]:
    """The `tests` evaluator's checks: the reference tests themselves (no model asked)."""
    found = checks_from_tests(tests)
    if not found:
        sets = checks.TestSets.from_dict(tests["sets"]) if tests.get("sets") else None
        raise ReviewFailed(
            "The `tests` evaluator needs the verify command to pass on the historical "
            f"ending: {sets.reason if sets else 'no verify command was given.'}",
            tests=tests,
            **stored,
        )
    # No model was asked: the checks cost nothing (a known zero, not unknown).
    return {"tests": tests, "checks": found, "audit": {}, "cost_usd": Decimal(0), **stored}


def _checks_from_the_evaluator(
    info: evaluators.EvaluatorInfo,
    inputs: ReviewInputs,
    diff: str,
    tests: dict[str, Any],
    stored: dict[str, Any],
    folder: Path,
    beat: Tick,
) -> dict[str, Any]:
    """The checks a model evaluator derives from the request, the diff and the tests."""
    prompt = checks_prompt(request=inputs.request, diff=diff, tests=tests)
    answer, seconds = evaluators.ask(
        info,
        name="checks",
        prompt=prompt,
        schema=CHECKS_SCHEMA,
        inputs={"request": inputs.request, "historical_diff": diff, "tests": tests},
        folder=folder,
        tick=beat,
    )
    audit = {"prompt": prompt, "raw": answer.raw, "seconds": seconds, "notes": answer.notes}
    spent = {"cost_usd": answer.cost_usd, **answer.usage.as_dict(), **stored}
    if answer.answer is None:
        raise ReviewFailed(
            f"The evaluator {info.id} gave no usable checks: {answer.error}",
            tests=tests,
            audit=audit,
            **spent,
        )
    try:
        found = parse_checks(answer.answer)
    except ReviewFailed as exc:
        raise ReviewFailed(str(exc), tests=tests, audit=audit, **spent) from None
    return {"tests": tests, "checks": found, "audit": audit, **spent}


def _evaluator(evaluator_id: str) -> evaluators.EvaluatorInfo:
    try:
        info = evaluators.resolve_evaluator(evaluator_id)
    except evaluators.UnknownEvaluator as exc:
        raise ReviewFailed(str(exc)) from None
    if not info.available:
        raise ReviewFailed(f"The evaluator {info.id} is not available here: {info.reason}")
    return info


def _historical_tests(
    key: ReviewKey, inputs: ReviewInputs, diff: str, folder: Path, beat: Tick
) -> dict[str, Any]:
    """The verify command on the baseline and on the historical ending, both with the
    historical test files laid over them; {} without a verify command."""
    if not key.verify_command:
        return {}
    test_files = checks.historical_test_files(diff, key.test_paths)
    results: dict[str, Any] = {"verify_command": key.verify_command, "test_files": test_files}
    trees: dict[str, checks.TreeTests] = {}
    for side, commit in (("baseline", key.baseline_commit), ("historical", key.ending_commit)):
        # Folders are named for the commit, not the side: their paths can reach the evaluator.
        trees[side] = tree_tests_at(
            repository=inputs.repository,
            commit=commit,
            ending=key.ending_commit,
            test_files=test_files,
            command=key.verify_command,
            timeout_seconds=inputs.timeout_seconds,
            folder=folder / commit[:12],
            tick=beat,
        )
        results[side] = trees[side].as_dict()
    results["sets"] = checks.test_sets(trees["baseline"], trees["historical"]).as_dict()
    return results


def tree_tests_at(
    *,
    repository: Path,
    commit: str,
    ending: str,
    test_files: list[str],
    command: str,
    timeout_seconds: float,
    folder: Path,
    tick: Tick,
    diff: str = "",
) -> checks.TreeTests:
    """The verify command on a fresh worktree at `commit` (with `diff` applied, when given)
    and the historical test files laid over it; the worktree is removed afterwards."""
    tree = folder / "tree"
    _remove_tree(repository, tree)  # left by an earlier holder of the claim
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        repos.add_worktree(repository, tree, commit)
        repos.apply_diff(tree, diff)
    except (repos.GitError, OSError) as exc:
        _remove_tree(repository, tree)
        return checks.TreeTests(outcome="error", message=f"The tree could not be made: {exc}")
    try:
        return verify_tree(
            tree=tree,
            repository=repository,
            ending=ending,
            test_files=test_files,
            command=command,
            timeout_seconds=timeout_seconds,
            folder=folder,
            tick=tick,
        )
    finally:
        _remove_tree(repository, tree)


def verify_tree(
    *,
    tree: Path,
    repository: Path,
    ending: str,
    test_files: list[str],
    command: str,
    timeout_seconds: float,
    folder: Path,
    tick: Tick,
) -> checks.TreeTests:
    """Lay the historical test files over `tree` (so nobody passes by editing them), then
    run the verify command there with an agent's scrubbed environment."""
    try:
        checks.overlay_tests(tree=tree, repo=repository, ending=ending, paths=test_files)
    except (repos.GitError, checks.OverlayError, OSError) as exc:
        return checks.TreeTests(
            outcome="error", message=f"The historical tests could not be laid over: {exc}"
        )

    def sandboxed(argv: list[str], env: dict[str, str]) -> sandbox.Prepared:
        # The tree and the command's own folder writable; beyond the system, a program of
        # the repository's own (its .venv, say) or Replays' own Python read-only; what git
        # needs for the tree; no network unless the operator opened it.
        return runfolder.start_sandboxed(
            argv,
            env,
            cwd=tree,
            writable=[folder, tree],
            home=folder / runfolder.AGENT_HOME,
            network=runfolder.verify_network(),
            programs_within=runfolder.verify_program_folders(repository),
            git=(repository, tree),
        )

    return checks.run_verify(
        tree=tree,
        command=command,
        timeout_seconds=timeout_seconds,
        env=runfolder.agent_environment({}),
        folder=folder,
        tick=tick,
        sandboxed=sandboxed,
    )


def _remove_tree(repository: Path, tree: Path) -> None:
    if not tree.exists():
        return
    try:
        repos.remove_worktree(repository, tree)
    except repos.GitError as exc:
        logger.warning("The review tree %s could not be removed: %s", tree, exc)
        shutil.rmtree(tree, ignore_errors=True)


# --- checks ------------------------------------------------------------------------------


def checks_from_tests(tests: dict[str, Any]) -> list[dict[str, Any]]:
    """The `tests` evaluator's checks: each FAIL_TO_PASS test passes, and the tests that
    passed before still pass ([] when the tests cannot be used)."""
    if not tests.get("sets"):
        return []
    sets = checks.TestSets.from_dict(tests["sets"])
    if not sets.usable:
        return []
    found = [
        {"text": f"{name} passes (it failed before the request)", "tests": [name]}
        for name in sets.fail_to_pass
    ]
    if sets.pass_to_pass:
        count = len(sets.pass_to_pass)
        found.append(
            {
                "text": f"The {count} test{'s' if count != 1 else ''} that passed before still "
                f"pass{'' if count != 1 else 'es'}",
                "tests": list(sets.pass_to_pass),
            }
        )
    return [{"id": f"c{index}", "source": "tests", **check} for index, check in enumerate(found, 1)]


def parse_checks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The evaluator's checks, numbered c1..cN; ReviewFailed when there are none to use."""
    items = answer.get("checks")
    if not isinstance(items, list):
        raise ReviewFailed("The evaluator's answer has no list of checks.")
    texts = []
    for item in items:
        text = item.get("text") if isinstance(item, dict) else item
        if isinstance(text, str) and text.strip():
            texts.append(" ".join(text.split())[:MAX_CHECK_CHARS])
    if not texts:
        raise ReviewFailed("The evaluator's answer lists no checks.")
    return [
        {"id": f"c{index}", "text": text, "source": "evaluator"}
        for index, text in enumerate(texts[:MAX_CHECKS], 1)
    ]


def prompt_template(name: str) -> Template:
    return Template((PROMPTS / f"{name}.{PROMPT_VERSION}.md").read_text(encoding="utf-8"))


def checks_prompt(*, request: str, diff: str, tests: dict[str, Any]) -> str:
    return prompt_template("checks").substitute(
        request=request.strip(),
        historical_diff=cut_diff(diff),
        tests=describe_reference_tests(tests),
        max_checks=MAX_CHECKS,
    )


def cut_diff(diff: str) -> str:
    """A diff as the evaluator sees it: cut with a marker beyond the limit."""
    limit = settings.REPLAYS_JUDGE_DIFF_CHARS
    if not diff.strip():
        return "(no changes)"
    if len(diff) <= limit:
        return diff
    return (
        diff[:limit]
        + f"\n[replays] The diff is cut here: {len(diff) - limit:,} more characters not shown.\n"
    )


def describe_reference_tests(tests: dict[str, Any]) -> str:
    """What the tests say about the historical result, for deriving the checks."""
    if not tests:
        return "No verify command was given: there are no tests to go by."
    sets = checks.TestSets.from_dict(tests["sets"])
    lines = [f"Verify command: {tests['verify_command']}"]
    if not sets.usable:
        lines.append(sets.reason)
        return "\n".join(lines)
    if sets.fail_to_pass:
        lines.append("Tests this result makes pass: " + ", ".join(sets.fail_to_pass))
    if sets.pass_to_pass:
        lines.append(f"Tests that passed before and still pass: {len(sets.pass_to_pass)}")
    return "\n".join(lines)
