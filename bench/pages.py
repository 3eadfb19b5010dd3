"""Pages and API at size: server time (median) and queries per page, for a user who sees
one batch of 12 threads x 8 models among 10,000 runs and 100,000 turns, against the same
page for a user who sees only that batch.

    python bench/pages.py                         # SQLite in a temporary folder
    DATABASE_URL=postgres://u:p@host/replays python bench/pages.py   # PostgreSQL

Both users' data sit in the same database; requests alternate between them (Django's
test Client, in process, no network), so the ratio says what the size costs. On
PostgreSQL the bench makes and uses its own database (replays_bench_pages on the server
of DATABASE_URL), never the one named there. Rows are written with bulk_create (the
factories of tests/leaderboard_factories.py): about half a minute at the full size.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
BENCH_DATABASE = "replays_bench_pages"
MODELS = [f"bench:model-{index}" for index in range(8)]
# Every kind of ending a member can have, so every branch of the pages is drawn.
OUTCOMES = [
    ("win", 0.9),
    ("tie", 0.5),
    ("loss", 0.2),
    "timeout",
    "review_failed",
    "pending",
    ("win", 0.7),
    "cancelled",
    "agent_error",
    ("loss", 0.4),
    ("tie", 0.6),
    ("win", 0.8),
]


def bench_database_url(url: str) -> str:
    """A fresh PostgreSQL database of the bench's own on the server of `url`."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{BENCH_DATABASE}"')
        connection.execute(f'CREATE DATABASE "{BENCH_DATABASE}"')
    return urlunsplit(urlsplit(url)._replace(path=f"/{BENCH_DATABASE}"))


def add_turns(threads: list, per_thread: int) -> int:  # type: ignore[type-arg]

    from replays.factories.leaderboard import CREATED
    from replays.models import Thread, Turn

    made = 0
    batch: list[Turn] = []
    for thread in threads:
        for index in range(per_thread):
            batch.append(
                Turn(
                    thread=thread,
                    index=index,
                    # The first is the one the seeded runs replay (uuid-<thread id>).
                    message_uuid=f"uuid-{thread.pk}" if index == 0 else f"uuid-{thread.pk}-{index}",
                    timestamp=CREATED + timedelta(minutes=index),
                    request=f"Request {index} of thread {thread.pk}: make the tests pass.",
                    models_used=["claude-sonnet-4-5"],
                    input_tokens=1000,
                    output_tokens=200,
                )
            )
        if len(batch) >= 20_000:
            Turn.objects.bulk_create(batch, batch_size=2000)
            made += len(batch)
            batch = []
    Turn.objects.bulk_create(batch, batch_size=2000)
    made += len(batch)
    Thread.objects.filter(pk__in=[thread.pk for thread in threads]).update(
        turn_count=per_thread, input_tokens=per_thread * 1000
    )
    return made


def seed_user(username: str, *, filler_batches: int, turns_per_thread: int, threads: int):  # type: ignore[no-untyped-def]
    """The user's batch under study (12 threads x 8 models) last, after `filler_batches`
    more batches of the same shape on their other threads."""
    from django.contrib.auth.models import User

    from replays.factories.leaderboard import make_threads, seed
    from replays.models import Thread

    user = User.objects.create_user(username, password="bench")
    made = make_threads(threads * (filler_batches + 1))
    Thread.objects.filter(pk__in=[thread.pk for thread in made]).update(owner=user)
    for thread in made:
        thread.owner = user
    turns = add_turns(made, turns_per_thread)
    outcomes = itertools.cycle(OUTCOMES)
    groups = [made[i : i + threads] for i in range(0, len(made), threads)]
    for group in groups[1:]:
        seed(user, {model: [next(outcomes) for _ in group] for model in MODELS}, threads=group)
    studied = seed(
        user, {model: [next(outcomes) for _ in groups[0]] for model in MODELS}, threads=groups[0]
    )
    return user, studied, turns


def pages(studied) -> dict[str, str]:  # type: ignore[no-untyped-def]
    from django.urls import reverse

    from replays.models import Report

    judged = (
        Report.objects.filter(run__batch=studied.batch, is_current=True, status="judged")
        .order_by("run_id")
        .first()
    )
    return {
        "batch page": reverse("replays:batch-detail", args=[studied.batch.pk]),
        "comparison page": reverse("replays:run-compare", args=[judged.run_id]),
        "leaderboard page": reverse("replays:leaderboard"),
        "GET /api/leaderboard/": "/api/leaderboard/",
        "thread list": reverse("replays:thread-list"),
    }


def measure(client, url: str) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    """Wall seconds, this process's CPU seconds (steadier on a shared machine; SQLite runs
    in it, a PostgreSQL server does not), and the number of queries of one request."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        started, cpu = time.perf_counter(), time.process_time()
        response = client.get(url)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    if response.status_code != 200:
        raise SystemExit(f"{url}: HTTP {response.status_code}")
    return seconds, cpu, len(queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs of the large user")
    parser.add_argument("--turns", type=int, default=100_000, help="turns of the large user")
    parser.add_argument("--threads", type=int, default=12, help="threads of the studied batch")
    parser.add_argument("--repeat", type=int, default=7, help="requests per page and user")
    parser.add_argument(
        "--profile", metavar="PAGE", help="print cProfile of one request of this page (large user)"
    )
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder")
    arguments = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="replays-bench-pages-"))
    database_url = os.environ.get("DATABASE_URL", "")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "replaysite.settings",
            "DATABASE_URL": bench_database_url(database_url)
            if database_url.startswith("postgres")
            else f"sqlite:///{folder / 'bench.sqlite3'}",
            "REPLAYS_VAR_DIR": str(folder / "var"),
        }
    )
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client

    settings.ALLOWED_HOSTS = ["*"]
    settings.DEBUG = False
    call_command("migrate", verbosity=0)

    per_batch = arguments.threads * len(MODELS)
    filler = max(0, round(arguments.runs / per_batch) - 1)
    thread_total = arguments.threads * (filler + 1)
    turns_per_thread = max(1, round(arguments.turns / thread_total))
    started = time.perf_counter()
    small_user, small_batch, _ = seed_user(
        "small", filler_batches=0, turns_per_thread=turns_per_thread, threads=arguments.threads
    )
    large_user, large_batch, turns = seed_user(
        "large",
        filler_batches=filler,
        turns_per_thread=turns_per_thread,
        threads=arguments.threads,
    )
    from replays.models import Run

    runs = Run.objects.filter(batch__owner=large_user).count()
    print(
        f"pages: the large user sees {runs:,} runs, {thread_total:,} threads and {turns:,} "
        f"turns; the small one {per_batch} runs on {arguments.threads} threads; "
        f"{connection.vendor}, Python {sys.version.split()[0]}, Django {django.__version__}, "
        f"{os.cpu_count()} CPUs; data written in {time.perf_counter() - started:.1f} s",
        flush=True,
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")

    clients = {}
    for name, user in (("small", small_user), ("large", large_user)):
        clients[name] = Client()
        clients[name].force_login(user)
    urls = {"small": pages(small_batch), "large": pages(large_batch)}
    times: dict[tuple[str, str], list[float]] = {}
    cpu_times: dict[tuple[str, str], list[float]] = {}
    queries: dict[tuple[str, str], int] = {}
    for name in ("small", "large"):  # warm-up: templates compiled, caches filled
        for url in urls[name].values():
            measure(clients[name], url)
    if arguments.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        profile.runcall(clients["large"].get, urls["large"][arguments.profile])
        pstats.Stats(profile).sort_stats(os.environ.get("BENCH_SORT", "cumulative")).print_stats(40)
    for _ in range(arguments.repeat):
        for page in urls["small"]:
            for name in ("small", "large"):
                seconds, cpu, count = measure(clients[name], urls[name][page])
                times.setdefault((page, name), []).append(seconds)
                cpu_times.setdefault((page, name), []).append(cpu)
                queries[(page, name)] = count

    print()
    print(
        "| page | baseline: one batch, ms (CPU ms), queries "
        "| at size, ms (CPU ms), queries | ratio |"
    )
    print("|---|---|---|---|")
    for page in urls["small"]:
        small, large = (statistics.median(times[(page, name)]) for name in ("small", "large"))
        small_cpu, large_cpu = (
            statistics.median(cpu_times[(page, name)]) for name in ("small", "large")
        )
        print(
            f"| {page} | {small * 1000:.1f} ({small_cpu * 1000:.1f}), "
            f"{queries[(page, 'small')]} | {large * 1000:.1f} ({large_cpu * 1000:.1f}), "
            f"{queries[(page, 'large')]} | {large / small:.2f}x |"
        )
    connection.close()
    if arguments.keep:
        print(f"kept {folder}")
    else:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
