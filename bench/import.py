"""How fast `import_threads` reads a corpus of Claude Code transcripts, against ccusage
and against a bare parse of the same files.

    python bench/import.py CORPUS [--repeat 3]
    python bench/import.py --make 210 [--repeat 3]     # writes the corpus first (bench/corpus.py)

Each repetition runs, in turn (the order rotating from one repetition to the next):
- ours: `manage.py import_threads CORPUS` into a fresh database (a new SQLite file; with
  DATABASE_URL set, that database with the bench user's threads deleted first), the
  transcripts stored compressed in it, then the same command again on the unchanged
  files (the re-import);
- ccusage: `ccusage session --json --offline` on the same folder (tests/node, `make
  node`); its total cost must match ours within a cent per thousand dollars, so both really
  read the corpus;
- the parse floor: one process reading every line of every file with orjson, and
  nothing else.
Every figure is the wall time of a whole process, startup included, as a user waits for it;
the table gives the medians and their ratios. The peak RSS of our import (the largest of
its processes) is measured on the whole corpus and on its first quarter of sessions, to
show that it does not grow with the corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "manage.py"
CCUSAGE = ROOT / "tests" / "node" / "node_modules" / ".bin" / "ccusage"
USER = "bench"

FLOOR = """
import sys, orjson
from pathlib import Path
lines = 0
for path in sorted(Path(sys.argv[1]).rglob("*.jsonl")):
    with path.open("rb") as handle:
        for line in handle:
            if line.strip():
                orjson.loads(line)
                lines += 1
print(lines)
"""

TOTALS = """
from django.db.models import Sum
from replays.models import Thread, Transcript
threads = Thread.objects.filter(owner__username="bench")
print(threads.count(), threads.aggregate(c=Sum("cost_usd"))["c"] or 0, threads.aggregate(t=Sum("turn_count"))["t"] or 0,
      Transcript.objects.filter(thread__in=threads).count())
"""

SQLITE_TOTALS = """
SELECT count(*), sum(t.cost_usd), sum(t.turn_count),
       (SELECT count(*) FROM replays_transcript WHERE thread_id IN (SELECT id FROM replays_thread))
FROM replays_thread t JOIN auth_user u ON u.id = t.owner_id WHERE u.username = ?
"""

SETUP = """
from django.contrib.auth import get_user_model
User = get_user_model()
user, _ = User.objects.get_or_create(username="bench", defaults={"is_superuser": True, "is_staff": True})
user.threads.all().delete()
"""


class Measured:
    def __init__(self, seconds: float, cpu: float, max_rss_kib: int, stdout: str) -> None:
        self.seconds = seconds
        self.cpu = cpu
        self.max_rss_kib = max_rss_kib
        self.stdout = stdout


def run(command: list[str], env: dict[str, str]) -> Measured:
    """Run a process to its end: wall time, CPU time and the peak RSS of it and the
    children it waited for (wait4's rusage)."""
    started = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(), err.read().decode()
    if process.returncode != 0:
        raise SystemExit(
            f"{' '.join(command)} failed ({process.returncode}):\n{stdout[-2000:]}{stderr[-2000:]}"
        )
    return Measured(seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss, stdout)


class Ours:
    """Our import, each time into a fresh database."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": "replaysite.settings"}
        self.env["REPLAYS_VAR_DIR"] = str(work / "var")
        self.shared = bool(os.environ.get("DATABASE_URL"))
        self.template = work / "template.sqlite3"
        self.database = work / "bench.sqlite3"
        if not self.shared:
            self.env["DATABASE_URL"] = f"sqlite:///{self.template}"
        run([sys.executable, str(MANAGE), "migrate", "--no-input", "-v0"], self.env)
        self.manage("shell", "-c", SETUP)
        if not self.shared:
            self.env["DATABASE_URL"] = f"sqlite:///{self.database}"

    def manage(self, *args: str) -> Measured:
        return run([sys.executable, str(MANAGE), *args], self.env)

    def fresh(self) -> None:
        if self.shared:
            self.manage("shell", "-c", SETUP)
        else:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{self.database}{suffix}").unlink(missing_ok=True)
            shutil.copyfile(self.template, self.database)

    def import_threads(self, paths: list[Path]) -> Measured:
        return self.manage("import_threads", "--no-progress", "--user", USER, *map(str, paths))

    def totals(self) -> tuple[int, float, int, int]:
        if not self.shared:
            # Read straight from the file: a Django process would add a second to each run.
            with sqlite3.connect(self.database) as db:
                row = db.execute(SQLITE_TOTALS, (USER,)).fetchone()
            return int(row[0]), float(row[1] or 0), int(row[2] or 0), int(row[3])
        output = self.manage("shell", "-c", TOTALS).stdout
        threads, cost, turns, copies = output.strip().splitlines()[-1].split()
        return int(threads), float(cost), int(turns), int(copies)


def ccusage(corpus: Path, home: Path) -> tuple[Measured, float] | None:
    if not CCUSAGE.exists():
        return None
    env = {**os.environ, "CLAUDE_CONFIG_DIR": str(corpus), "HOME": str(home)}
    measured = run([str(CCUSAGE), "session", "--json", "--offline"], env)
    report = json.loads(measured.stdout)
    return measured, sum(row["totalCost"] for row in report["session"])


def version(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60).stdout.strip()
    except OSError:
        return "not installed"


def machine(corpus: Path, sessions: list[Path]) -> list[str]:
    import django
    import orjson

    try:
        import zstandard

        zstd = zstandard.__version__
    except ImportError:
        zstd = "not installed"
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    files = list(corpus.rglob("*.jsonl"))
    size = sum(path.stat().st_size for path in files)
    database = os.environ.get("DATABASE_URL", "").split(":", 1)[0] or "sqlite (a new file)"
    return [
        f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
        f"versions: Python {platform.python_version()}, Django {django.__version__}, "
        f"orjson {orjson.__version__}, zstandard {zstd}, node {version(['node', '--version'])}, "
        f"ccusage {version([str(CCUSAGE), '--version']) if CCUSAGE.exists() else 'not installed'}",
        f"database: {database}",
        f"corpus: {corpus}: {size / 2**20:.1f} MiB in {len(files)} files, "
        f"{len(sessions)} sessions (the rest are sub-agent files)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("corpus", nargs="?", type=Path, help="a folder made by bench/corpus.py")
    parser.add_argument("--make", type=float, metavar="MB", help="write a corpus of MB MiB first")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions (default 3; median)")
    args = parser.parse_args(argv)
    if (args.corpus is None) == (args.make is None):
        parser.error("give a corpus folder or --make MB")
    with tempfile.TemporaryDirectory(prefix="replays-bench-import-") as temporary:
        work = Path(temporary)
        corpus = args.corpus
        if corpus is None:
            corpus = work / "corpus"
            run([sys.executable, str(ROOT / "bench" / "corpus.py"), str(corpus), "--mb", str(args.make)], dict(os.environ))  # fmt: skip
        corpus = corpus.resolve()
        sessions = sorted(p for p in corpus.rglob("*.jsonl") if "subagents" not in p.parts)
        if not sessions:
            parser.error(f"{corpus}: no session files")
        quarter = sessions[: max(1, len(sessions) // 4)]
        for line in machine(corpus, sessions):
            print(line)
        ours = Ours(work)
        home = work / "home"
        home.mkdir()
        times: dict[str, list[float]] = {"ours": [], "reimport": [], "ccusage": [], "floor": []}
        cpu: dict[str, list[float]] = {name: [] for name in times}
        rss: list[int] = []
        ours_total = ccusage_total = None
        steps = ["ours", "ccusage", "floor"]
        for repetition in range(args.repeat):
            order = steps[repetition % 3 :] + steps[: repetition % 3]
            for step in order:
                if step == "ours":
                    ours.fresh()
                    first = ours.import_threads([corpus])
                    again = ours.import_threads([corpus])
                    assert "0 new, 0 updated" in again.stdout, again.stdout[-500:]
                    for name, measured in (("ours", first), ("reimport", again)):
                        times[name].append(measured.seconds)
                        cpu[name].append(measured.cpu)
                    rss.append(first.max_rss_kib)
                    threads, ours_total, turns, copies = ours.totals()
                    assert threads == copies == len(sessions), (threads, copies, len(sessions))
                elif step == "ccusage":
                    measured_total = ccusage(corpus, home)
                    if measured_total is not None:
                        measured, ccusage_total = measured_total
                        times["ccusage"].append(measured.seconds)
                        cpu["ccusage"].append(measured.cpu)
                else:
                    measured = run([sys.executable, "-c", FLOOR, str(corpus)], dict(os.environ))
                    times["floor"].append(measured.seconds)
                    cpu["floor"].append(measured.cpu)
        ours.fresh()
        quarter_rss = ours.import_threads(quarter).max_rss_kib
    print(f"threads: {threads}, turns: {turns}, transcripts stored: {copies}")
    if ccusage_total is not None:
        assert ours_total is not None
        print(f"total cost: ours ${ours_total:,.2f}, ccusage ${ccusage_total:,.2f}")
        if abs(ours_total - ccusage_total) > max(0.01, ccusage_total * 1e-5):
            print("ccusage and we disagree on the total cost")
            return 1
    else:
        print("ccusage: not installed (make node); its rows are left out")
    median = {name: statistics.median(values) for name, values in times.items() if values}
    median_cpu = {name: statistics.median(values) for name, values in cpu.items() if values}
    print()
    print(f"medians of {args.repeat} alternating runs (wall time of the whole process):")
    print()
    print("| measure | seconds | CPU seconds |")
    print("| --- | ---: | ---: |")
    labels = {
        "ours": "import_threads, first import (fresh database)",
        "reimport": "import_threads, re-import of unchanged files",
        "ccusage": "ccusage session --json --offline",
        "floor": "parse floor: every line through orjson, one process",
    }
    for name, label in labels.items():
        if name in median:
            print(f"| {label} | {median[name]:.2f} | {median_cpu[name]:.2f} |")
    print()
    print("| ratio | value |")
    print("| --- | ---: |")
    if "ccusage" in median:
        print(f"| ours / ccusage | {median['ours'] / median['ccusage']:.2f} |")
    print(f"| ours / parse floor | {median['ours'] / median['floor']:.2f} |")
    print(f"| re-import / first import | {median['reimport'] / median['ours']:.3f} |")
    full_mib = statistics.median(rss) / 1024
    print(f"| peak RSS, whole corpus ({len(sessions)} sessions) | {full_mib:.0f} MiB |")
    print(f"| peak RSS, first quarter ({len(quarter)} sessions) | {quarter_rss / 1024:.0f} MiB |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
