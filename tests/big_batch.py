"""The largest batch tried end to end: 12 threads x 8 models (96 members) with the cap at 8.

Run once by hand (it takes minutes, too long for CI):

    REPLAYS_VAR_DIR=/tmp/big-batch .venv/bin/python tests/big_batch.py

On a fresh SQLite database under REPLAYS_VAR_DIR (or DATABASE_URL), it queues 12
threads' members as approval leaves them (tests/run_factories.py), each with 8 models of
a command agent that marks its start, naps 1-2 s and edits, judged by the scripted
evaluator; one cluster runs them all at REPLAYS_MAX_PARALLEL_RUNS=8 while the cap is
sampled. It prints the wall time, the most members ever holding a slot, the statuses,
the reports, and how many agents started more than once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
THREADS = 12
MODELS = 8
CAP = 8


def main() -> int:
    folder = Path(tempfile.mkdtemp(prefix="replays-big-batch-"))
    var = Path(os.environ.get("REPLAYS_VAR_DIR") or folder / "var")
    sys.path.insert(0, str(ROOT))
    agents_file = folder / "agents.json"
    agents_file.write_text("{}")  # this process runs no agent; the cluster reads the real one
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "REPLAYS_VAR_DIR": str(var),
        "DATABASE_URL": os.environ.get("DATABASE_URL") or f"sqlite:///{folder / 'big.sqlite3'}",
        "REPLAYS_RUN_ROOT": str(folder / "runs"),
        "REPLAYS_AGENTS_FILE": str(agents_file),
        "REPLAYS_MAX_PARALLEL_RUNS": str(CAP),
        "REPLAYS_MAX_RUNS_PER_HOST": str(CAP),
        "REPLAYS_Q_WORKERS": "2",
    }
    os.environ.update(env)
    import django

    django.setup()
    from tests.faults import agents_config

    agents_file.write_text(json.dumps(agents_config(folder)))
    from django.contrib.auth.models import User
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from replays import dispatch
    from replays.factories.runs import make_git_repo, make_run_graph
    from replays.models import Report, Run

    owner, _ = User.objects.get_or_create(username="alice")
    for number in range(THREADS):
        repo, baseline, ending = make_git_repo(folder / f"thread-{number}")
        make_run_graph(
            owner=owner,
            repo=repo,
            baseline=baseline,
            ending=ending,
            models=[f"nap:s{1000 + 100 * number + model}" for model in range(MODELS)],
            evaluator="judge:fair",
            timeout_seconds=300,
        )
    total = Run.objects.count()
    started = time.monotonic()
    cluster = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "qcluster"],
        env=env,
        stdout=(folder / "cluster.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    most = 0
    try:
        while Run.objects.filter(status__in=["queued", "launching", "running"]).exists():
            most = max(most, Run.objects.filter(status__in=dispatch.SLOT_STATUSES).count())
            time.sleep(0.05)
        while Report.objects.filter(status="judging").exists():
            time.sleep(0.2)
    finally:
        cluster.send_signal(signal.SIGTERM)
        cluster.wait(timeout=60)
    seconds = time.monotonic() - started
    marker = folder / "starts.txt"
    starts = Counter(line.split()[0] for line in marker.read_text().splitlines())
    print(
        json.dumps(
            {
                "members": total,
                "threads": THREADS,
                "models": MODELS,
                "cap": CAP,
                "seconds": round(seconds, 1),
                "most_holding_a_slot": most,
                "statuses": dict(Counter(Run.objects.values_list("status", flat=True))),
                "reports": dict(Counter(Report.objects.values_list("status", flat=True))),
                "started_twice": sum(1 for count in starts.values() if count > 1),
                "agents_started": len(starts),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
