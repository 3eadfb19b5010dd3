"""The benchmark scripts in bench/ still run: each once, on a tiny input (docs/benchmarks.md
has the real figures)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

# The scripts make their own databases (SQLite), whatever the pass: CI runs them once.
pytestmark = pytest.mark.bench

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


# --- bench/corpus.py and bench/import.py ---------------------------------------------------


def bench_import_env() -> dict[str, str]:
    """The bench makes its own SQLite database: never the one a PostgreSQL test pass names."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REPLAYS_VAR_DIR")}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    return env


def test_bench_import_corpus_is_the_same_for_the_same_seed(tmp_path: Path) -> None:
    for name in ("a", "b"):
        subprocess.run(
            [sys.executable, str(BENCH / "corpus.py"), str(tmp_path / name), "--mb", "0.2"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*.json*"))
    assert any("subagents" in p.parts for p in files)
    assert files == sorted(p.relative_to(tmp_path / "b") for p in (tmp_path / "b").rglob("*.json*"))
    for relative in files:
        assert (tmp_path / "a" / relative).read_bytes() == (tmp_path / "b" / relative).read_bytes()


def test_bench_import_runs_and_prints_its_table(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    made = subprocess.run(
        [sys.executable, str(BENCH / "corpus.py"), str(corpus), "--mb", "0.5"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert "sessions" in made.stdout
    completed = subprocess.run(
        [sys.executable, str(BENCH / "import.py"), str(corpus), "--repeat", "1"],
        capture_output=True, text=True, timeout=180, env=bench_import_env(), cwd=tmp_path,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    out = completed.stdout
    for row in (
        "| import_threads, first import (fresh database) |",
        "| import_threads, re-import of unchanged files |",
        "| parse floor: every line through orjson, one process |",
        "| ours / parse floor |",
        "| re-import / first import |",
        "| peak RSS, whole corpus",
        "| peak RSS, first quarter",
    ):
        assert row in out, out
    assert "machine: " in out and "corpus: " in out
    if "ccusage: not installed" not in out:
        # Both read the whole corpus: the same total cost.
        assert "| ours / ccusage |" in out
        [line] = [line for line in out.splitlines() if line.startswith("total cost:")]
        ours, theirs = re.findall(r"\$([\d,]*\d\.\d\d)", line)
        assert ours == theirs, line


# --- launch, pages and worktree benchmarks: a tiny run of each ---------------------------------


def run_bench(script: str, *arguments: str, seconds: float = 120) -> str:
    """Run bench/SCRIPT on its own temporary SQLite database; its output."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")
    }
    completed = subprocess.run(
        [sys.executable, str(BENCH / script), *arguments],
        env=env,
        capture_output=True,
        text=True,
        timeout=seconds,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def table_rows(output: str) -> dict[str, list[str]]:
    """The printed Markdown table: first cell -> the other cells."""
    rows = {}
    for line in output.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and not line.startswith("|---"):
            rows[cells[0]] = cells[1:]
    return rows


def test_bench_launch_smoke() -> None:
    output = run_bench("launch.py", "--members", "2", "--rounds", "1", "--slot-rounds", "0")
    rows = table_rows(output)
    assert rows["all 2 agents started"][-1].endswith("x"), output
    assert rows["per member above the floor"][1].endswith("ms"), output


def test_bench_pages_smoke() -> None:
    output = run_bench("pages.py", "--runs", "100", "--turns", "200", "--repeat", "1")
    rows = table_rows(output)
    for page in ("batch page", "comparison page", "leaderboard page", "thread list"):
        small, large, ratio = rows[page]
        # The same number of queries at both sizes (the last figure of each cell).
        assert small.rsplit(", ", 1)[1] == large.rsplit(", ", 1)[1], output
        assert ratio.endswith("x")
    assert "GET /api/leaderboard/" in rows


def test_bench_worktree_smoke() -> None:
    output = run_bench("worktree.py", "--files", "50", "--rounds", "2")
    rows = table_rows(output)
    assert rows["add + remove"][-1].endswith("x"), output


def test_bench_sandbox_smoke() -> None:
    output = run_bench("sandbox.py", "--rounds", "2")
    rows = table_rows(output)
    for process in ("`true`", "`python -c pass`", "`true`, an agent's policy (git)"):
        assert rows[process][-1].endswith("x") and rows[process][-2].endswith("ms"), output
