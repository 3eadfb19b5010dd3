"""The sandbox's cost: starting a process in bubblewrap the way a run starts its agent, its
verify command or an evaluator (replays.runfolder.start_sandboxed, then its
spawn, waited for to its end), against starting the same process plainly, in the
same process, rounds alternating.

    python bench/sandbox.py [--rounds 30]

Three programs: `true` (the start alone), `python -c pass` (an interpreter's start on
top), and `true` under an agent's policy (its run folder writable and what git needs for
its worktree: the private object store and refs are made on the first start and reused).
Every figure is a median over the rounds; the overhead is the median difference.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    arguments = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="replays-bench-sandbox-"))
    os.environ.update(
        DJANGO_SETTINGS_MODULE="replaysite.settings",
        REPLAYS_VAR_DIR=str(folder / "var"),
        REPLAYS_RUN_ROOT=str(folder / "runs"),
        REPLAYS_SANDBOX="bwrap",
    )
    os.environ.pop("DATABASE_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings

    from replays import repos, runfolder, sandbox

    try:
        reason = sandbox.probe(settings.REPLAYS_SANDBOX_BWRAP, fresh=True)
        if reason:
            sys.exit(reason)
        run_dir = runfolder.create_run_folder(1)
        repo = folder / "repository"
        repo.mkdir()
        git = ["git", "-c", "user.name=b", "-c", "user.email=b@b"]
        subprocess.run([*git, "init", "-q", str(repo)], check=True)
        (repo / "README").write_text("bench\n")
        subprocess.run([*git, "-C", str(repo), "add", "-A"], check=True)
        subprocess.run([*git, "-C", str(repo), "commit", "-qm", "one"], check=True)
        workspace = run_dir / runfolder.WORKSPACE
        repos.add_worktree(repo, workspace, "HEAD")
        log = run_dir / "bench.log"
        env = runfolder.agent_environment({})

        def start(argv: list[str], sandboxed: bool, agent: bool = False) -> float:
            began = time.perf_counter()
            if sandboxed:
                prepared = runfolder.start_sandboxed(
                    argv,
                    env,
                    cwd=workspace if agent else run_dir,
                    writable=[run_dir],
                    home=run_dir / runfolder.AGENT_HOME,
                    git=(repo, workspace) if agent else None,
                )
            else:
                prepared = sandbox.unsandboxed(argv, env)
            try:
                process, _ = prepared.spawn(cwd=workspace if agent else run_dir, log_path=log)
                # Waited for directly: wait_for polls every 0.1 s, which would be measured.
                code = process.wait(timeout=60)
                assert code == 0 and not prepared.failure(""), log.read_text()[-500:]
            finally:
                prepared.close()
            return time.perf_counter() - began

        cases: list[tuple[str, Callable[[bool], float]]] = [
            ("`true`", lambda boxed: start(["true"], boxed)),
            ("`python -c pass`", lambda boxed: start([sys.executable, "-c", "pass"], boxed)),
            ("`true`, an agent's policy (git)", lambda boxed: start(["true"], boxed, True)),
        ]
        version = subprocess.run(
            [settings.REPLAYS_SANDBOX_BWRAP, "--version"], capture_output=True, text=True
        ).stdout.strip()
        print(f"sandbox: {arguments.rounds} rounds, {version}, Python {sys.version.split()[0]}")
        print()
        print("| process | baseline: plain spawn | in the sandbox | overhead | ratio |")
        print("|---|---|---|---|---|")
        for name, case in cases:
            case(True)  # the first start makes the git state; not counted
            plain: list[float] = []
            boxed: list[float] = []
            for number in range(arguments.rounds):
                order = [False, True] if number % 2 == 0 else [True, False]
                for sandboxed in order:
                    (boxed if sandboxed else plain).append(case(sandboxed))
            base, mine = statistics.median(plain), statistics.median(boxed)
            overhead = statistics.median(b - p for b, p in zip(boxed, plain, strict=True))
            print(
                f"| {name} | {base * 1000:.1f} ms | {mine * 1000:.1f} ms | "
                f"{overhead * 1000:+.1f} ms | {mine / base:.2f}x |"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
