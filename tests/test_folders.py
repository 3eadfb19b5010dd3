"""Run folders never lie inside a project (replaysite/folders.py): the default run root
moves out of a var folder that is inside one, as `make demo`'s is."""

from __future__ import annotations

from pathlib import Path

import pytest

from replaysite.folders import default_run_root, project_above


@pytest.mark.parametrize("marker", ["pyproject.toml", "package.json", ".git", "setup.cfg"])
def test_a_var_folder_inside_a_project_gets_its_runs_in_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marker: str
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    checkout = tmp_path / "replays"
    (checkout / "var").mkdir(parents=True)
    (checkout / marker).write_text("")

    root = default_run_root(checkout / "var")

    assert root.parent == tmp_path / "cache" / "replays"
    assert root.name.startswith("runs-")
    assert project_above(root) is None
    # Another install's var folder gets its own run root.
    (tmp_path / "other" / "var").mkdir(parents=True)
    (tmp_path / "other" / marker).write_text("")
    assert default_run_root(tmp_path / "other" / "var") != root


def test_a_var_folder_outside_any_project_keeps_its_runs(tmp_path: Path) -> None:
    (tmp_path / "srv" / "var").mkdir(parents=True)
    assert default_run_root(tmp_path / "srv" / "var") == tmp_path / "srv" / "var" / "runs"
