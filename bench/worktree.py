"""Workspaces: creating and removing a run's git worktree the way the coordinator does
(replays.repos.add_worktree, then remove_worktree) against plain `git worktree add` and
`git worktree remove`, for a generated repository of 20,000 files.

    python bench/worktree.py [--files 20000] [--rounds 7]

The repository is generated deterministically (folders of small source files, one
commit). Each round does both, alternating which goes first; the figures are medians.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FILES_PER_FOLDER = 100


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, check=True, capture_output=True, text=True
    ).stdout


def make_repository(folder: Path, files: int) -> tuple[Path, str]:
    repo = folder / "repository"
    repo.mkdir()
    git(repo, "init", "-q")
    git(repo, "config", "user.email", "bench@example.com")
    git(repo, "config", "user.name", "bench")
    for index in range(files):
        sub = repo / "src" / f"package_{index // FILES_PER_FOLDER:04d}"
        if index % FILES_PER_FOLDER == 0:
            sub.mkdir(parents=True)
        (sub / f"module_{index % FILES_PER_FOLDER:03d}.py").write_text(
            f'"""Module {index}."""\n\n\ndef value_{index}() -> int:\n    return {index}\n'
        )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "generated")
    return repo, git(repo, "rev-parse", "HEAD").strip()


def plain(repo: Path, path: Path, commit: str) -> tuple[float, float]:
    started = time.perf_counter()
    git(repo, "worktree", "add", "--detach", "--", str(path), commit)
    added = time.perf_counter()
    git(repo, "worktree", "remove", "--", str(path))
    return added - started, time.perf_counter() - added


def ours(repo: Path, path: Path, commit: str) -> tuple[float, float]:
    from replays import repos

    started = time.perf_counter()
    repos.add_worktree(repo, path, commit)
    added = time.perf_counter()
    repos.remove_worktree(repo, path)
    return added - started, time.perf_counter() - added


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--files", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    sys.path.insert(0, str(ROOT))

    folder = Path(tempfile.mkdtemp(prefix="replays-bench-worktree-"))
    try:
        started = time.perf_counter()
        repo, commit = make_repository(folder, arguments.files)
        version = git(repo, "--version").strip()
        print(
            f"worktree: {arguments.files:,} files, {arguments.rounds} rounds, {version}, "
            f"Python {sys.version.split()[0]}; repository made in "
            f"{time.perf_counter() - started:.1f} s",
            flush=True,
        )
        results: dict[str, list[tuple[float, float]]] = {"git": [], "Replays": []}
        ways = {"git": plain, "Replays": ours}
        for round_number in range(arguments.rounds):
            order = ["git", "Replays"] if round_number % 2 == 0 else ["Replays", "git"]
            for name in order:
                path = folder / f"{name}-{round_number}"
                results[name].append(ways[name](repo, path, commit))
        print()
        print("| step | baseline: plain git | Replays | ratio |")
        print("|---|---|---|---|")
        for step, pick in (
            ("add", lambda pair: pair[0]),
            ("remove", lambda pair: pair[1]),
            ("add + remove", lambda pair: pair[0] + pair[1]),
        ):
            base = statistics.median(pick(pair) for pair in results["git"])
            mine = statistics.median(pick(pair) for pair in results["Replays"])
            print(
                f"| {step} | {base * 1000:,.0f} ms | {mine * 1000:,.0f} ms | {mine / base:.2f}x |"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
