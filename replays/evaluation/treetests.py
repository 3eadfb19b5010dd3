"""The verify command on a run's own tree: on its worktree before the coordinator
removes it, or on a tree rebuilt from the baseline and the stored diff when a judgment
needs it later (judging again). Stored on the run (`tree_tests`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from replays import runfolder
from replays.evaluation import checks
from replays.evaluation.review import tree_tests_at, verify_tree
from replays.models import Run

Tick = Callable[[], None]


def replay_tree_tests(run: Run, *, historical_diff: str, tick: Tick) -> checks.TreeTests | None:
    """The verify command's outcome on the run's tree: as stored by its coordinator, else
    rebuilt from the baseline and the stored diff (and then stored); None without a
    verify command."""
    spec = run.spec
    if not spec.verify_command:
        return None
    if run.tree_tests:
        return checks.TreeTests.from_dict(run.tree_tests)
    if run.diff_cut:
        tests = checks.TreeTests(
            outcome="error",
            message="The run's diff was stored cut, so its tree cannot be rebuilt for the tests.",
        )
    else:
        tests = tree_tests_at(
            repository=Path(spec.repository),
            commit=spec.baseline_commit,
            ending=spec.ending_commit,
            test_files=checks.historical_test_files(historical_diff, spec.test_paths),
            command=spec.verify_command,
            timeout_seconds=spec.timeout(),
            folder=runfolder.run_folder(run.pk) / runfolder.CHECKS_DIR,
            tick=tick,
            diff=run.diff,
        )
    Run.objects.filter(pk=run.pk, tree_tests__isnull=True).update(tree_tests=tests.as_dict())
    return tests


def verify_run_tree(
    run: Run, *, tree: Path, historical_diff: str, tick: Tick
) -> checks.TreeTests | None:
    """The verify command on a run's own worktree, before it is removed (the coordinator);
    None without a verify command."""
    spec = run.spec
    if not spec.verify_command:
        return None
    return verify_tree(
        tree=tree,
        repository=Path(spec.repository),
        ending=spec.ending_commit,
        test_files=checks.historical_test_files(historical_diff, spec.test_paths),
        command=spec.verify_command,
        timeout_seconds=spec.timeout(),
        folder=runfolder.run_folder(run.pk) / runfolder.CHECKS_DIR,
        tick=tick,
    )
