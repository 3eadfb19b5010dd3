"""A campaign at size: prepare over 2,000 requests selecting 200 for 4 models (800
members), its one approval, a results refresh, and its results and detail read back,
each as a ratio against the same work for one request in the same process.

    python bench/campaign.py                     # SQLite in a temporary folder
    DATABASE_URL=postgres://u:p@host/db python bench/campaign.py

The history is written as Claude Code sessions (replays/factories/histories.py) over 20
repositories whose commits come from one `git fast-import` each, then imported as a user
imports it. Every fifth request is a question that changed nothing. Baselines, in the
same process: `planning.prepare_plan` of one request with the same models (prepare),
`approval.approve_plan` of that plan (approval, per member), and the results of a
campaign of one request (refresh and reads).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
MODELS = ["historical", "empty", "cmd:claude-sonnet-4-5", "cmd:claude-haiku-4-5"]
STEPS_PER_SESSION = 10


def write_history(folder: Path, *, repos: int, requests: int) -> list[Path]:
    """`requests` requests over `repos` repositories; the session files."""
    from replays.factories.histories import Step, fast_import, step_time, write_session

    sessions = folder / "sessions"
    per_repo = max(1, requests // repos)
    files = []
    for number in range(repos):
        repo = folder / "repos" / f"project-{number:02d}"
        commits = [(START - timedelta(days=1), {
            "pkg/__init__.py": "", "pkg/mod.py": "def base():\n    return 0\n",
            "tests/test_base.py": "from pkg.mod import base\n\n\ndef test_base():\n"
                                  "    assert base() == 0\n",
        }, "Start")]  # fmt: skip
        module = "def base():\n    return 0\n"
        made = 0
        session = 0
        while made < per_repo:
            start = START + timedelta(hours=session)
            steps = []
            for index in range(min(STEPS_PER_SESSION, per_repo - made)):
                made += 1
                if made % 5 == 0:
                    steps.append(Step(request=f"What does f{made - 1} do?", reads=["pkg/mod.py"],
                                      commands=["grep -n def pkg/mod.py"]))  # fmt: skip
                    continue
                module += f"\n\ndef f{made}():\n    return {made}\n"
                test = f"from pkg.mod import f{made}\n\n\ndef test_f{made}():\n    assert f{made}() == {made}\n"
                writes = {"pkg/mod.py": module, f"tests/test_f{made}.py": test}
                steps.append(Step(request=f"Add f{made} returning {made}, with a test.",
                                  writes=writes, reads=["pkg/mod.py"],
                                  commands=[f"{sys.executable} -m pytest -q"]))  # fmt: skip
                commits.append((step_time(start, index) + timedelta(seconds=60), writes, f"f{made}"))
            files.append(write_session(sessions, cwd=repo, steps=steps, start=start, commit=False))
            session += 1
        fast_import(repo, commits)
    return files


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--select", type=int, default=200)
    parser.add_argument("--repos", type=int, default=20)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile of the prepare")
    arguments = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="replays-bench-campaign-"))
    database_url = os.environ.get("DATABASE_URL", "")
    if database_url.startswith("postgres"):
        sys.path.insert(0, str(ROOT / "bench"))
        from pages import bench_database_url

        database_url = bench_database_url(database_url)
    else:
        database_url = f"sqlite:///{folder / 'bench.sqlite3'}"
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "replaysite.settings",
            "DATABASE_URL": database_url,
            "REPLAYS_VAR_DIR": str(folder / "var"),
            "REPLAYS_REPOSITORY_ROOTS": str(folder),
        }
    )
    os.environ.pop("REDIS_URL", None)
    sys.path.insert(0, str(ROOT))
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.urls import reverse
    from rest_framework.test import APIClient

    from replays import approval, campaigns, importing, planning
    from replays.evaluation import campaign_results
    from replays.models import Report, ReportStatus, Run, RunPhase, RunStatus, Winner

    settings.ALLOWED_HOSTS = ["*"]
    settings.REPLAYS_AGENTS = {"cmd": {"kind": "command", "command": ["true"],
                                       "models": ["claude-sonnet-4-5", "claude-haiku-4-5"]}}  # fmt: skip
    call_command("migrate", verbosity=0)
    user, _ = User.objects.get_or_create(username="bench")

    started = time.perf_counter()
    paths = write_history(folder, repos=arguments.repos, requests=arguments.requests)
    written = time.perf_counter() - started
    started = time.perf_counter()
    for result in importing.import_files(paths=paths, user=user):
        assert result.thread is not None, result.error
    imported = time.perf_counter() - started
    print(
        f"campaign: {arguments.requests:,} requests in {len(paths)} sessions over "
        f"{arguments.repos} repositories (written in {written:.1f} s, imported in "
        f"{imported:.1f} s); {connection.vendor}, Python {sys.version.split()[0]}, Django "
        f"{django.__version__}, {os.cpu_count()} CPUs",
        flush=True,
    )

    # Baseline: one request prepared and approved as a plan, the same models.
    from replays.models import Thread

    baseline_prepare, baseline_plans = [], []
    for thread in Thread.objects.order_by("pk")[: arguments.repeat]:
        turn = thread.turns.order_by("index").first()
        assert turn is not None
        configuration = {
            "configurations": [{"thread_id": thread.pk, "start_message_uuid": turn.message_uuid,
                                "end_message_uuid": turn.message_uuid}],
            "models": MODELS, "evaluator": "tests",
            "verify_command": f"{sys.executable} -m pytest -q",
        }  # fmt: skip
        clock = time.perf_counter()
        prepared = planning.prepare_plan(owner=user, raw_configuration=configuration)
        baseline_prepare.append(time.perf_counter() - clock)
        assert prepared.prepare_token, prepared.plan.blockers or prepared.plan.questions
        baseline_plans.append(prepared)
    baseline_approve = []
    for prepared in baseline_plans:
        clock = time.perf_counter()
        approval.approve_plan(plan_id=prepared.plan.pk, user=user, approved=True,
                              prepare_token=prepared.prepare_token,
                              run_config=prepared.plan.configuration)  # fmt: skip
        baseline_approve.append((time.perf_counter() - clock) / len(MODELS))

    raw = {"models": MODELS, "evaluator": "tests", "limit": arguments.select,
           "filters": {"last": arguments.requests}}  # fmt: skip
    clock = time.perf_counter()
    if arguments.profile:
        import cProfile
        import pstats

        profile = cProfile.Profile()
        found = profile.runcall(campaigns.prepare_campaign, owner=user, raw_configuration=raw)
        pstats.Stats(profile).sort_stats("cumulative").print_stats(30)
    else:
        found = campaigns.prepare_campaign(owner=user, raw_configuration=raw)
    prepare_seconds = time.perf_counter() - clock
    campaign = found.campaign
    print(f"prepared in {prepare_seconds:.1f} s: {campaign.counts}", flush=True)
    assert found.prepare_token, campaign.blockers
    clock = time.perf_counter()
    campaigns.approve_campaign(campaign_id=campaign.pk, user=user, approved=True,
                               prepare_token=found.prepare_token)  # fmt: skip
    approve_seconds = time.perf_counter() - clock
    members = Run.objects.filter(batch__campaign=campaign).count()

    small = campaigns.prepare_campaign(owner=user, raw_configuration={**raw, "limit": 1,
                                                                      "filters": {"last": 50}})  # fmt: skip
    assert small.prepare_token, (small.campaign.blockers, small.campaign.counts)
    campaigns.approve_campaign(campaign_id=small.campaign.pk, user=user, approved=True,
                               prepare_token=small.prepare_token)  # fmt: skip

    # Every member ends judged, as coordinators and judgments would leave them.
    now = datetime.now(UTC)
    Run.objects.update(status=RunStatus.COMPLETED, phase=RunPhase.DONE, started_at=now,
                       finished_at=now, wall_seconds=60.0, cost_usd="0.05")  # fmt: skip
    winners = [Winner.REPLAY, Winner.TIE, Winner.HISTORICAL]
    Report.objects.bulk_create(
        Report(run=run, status=ReportStatus.JUDGED, is_current=True, finished_at=now,
               winner=winners[run.pk % 3], score_historical=0.5, score_replay=(run.pk % 3) / 2,
               evaluator="tests", evaluator_cost_usd=0)  # fmt: skip
        for run in Run.objects.all()
    )

    def timed(function, *args) -> list[float]:  # type: ignore[no-untyped-def]
        samples = []
        for _ in range(arguments.repeat):
            clock = time.perf_counter()
            function(*args)
            samples.append(time.perf_counter() - clock)
        return samples

    refresh_big = timed(campaign_results.refresh, campaign.pk)
    refresh_small = timed(campaign_results.refresh, small.campaign.pk)
    client = APIClient()
    client.force_authenticate(user)
    reads = {}
    for label, url in (("results", "/api/campaigns/{}/results"), ("detail", "/api/campaigns/{}/")):
        for size, target in (("big", campaign), ("small", small.campaign)):
            address = url.format(target.pk)
            assert client.get(address).status_code == 200
            reads[(label, size)] = timed(client.get, address)
    browser = Client()
    browser.force_login(user)
    pages = {size: reverse("replays:campaign-detail", args=[target.pk])
             for size, target in (("big", campaign), ("small", small.campaign))}  # fmt: skip
    for address in pages.values():
        assert browser.get(address).status_code == 200
    page = {size: timed(browser.get, address) for size, address in pages.items()}

    per_request = median_ms(baseline_prepare)
    print()
    print("| figure | baseline | at size | ratio |")
    print("|---|---|---|---|")
    print(
        f"| prepare: {campaign.counts['scanned']:,} scanned, {campaign.counts['selected']} "
        f"selected, {len(MODELS)} models | one request's plan: {per_request:.0f} ms | "
        f"{prepare_seconds:.1f} s ({prepare_seconds * 1000 / campaign.counts['scanned']:.1f} ms "
        f"a request) | {prepare_seconds * 1000 / campaign.counts['scanned'] / per_request:.2f}x "
        f"a request |"
    )
    per_member = median_ms(baseline_approve)
    print(
        f"| approve: {members} members in one transaction | one plan's, per member: "
        f"{per_member:.1f} ms | {approve_seconds:.1f} s ({approve_seconds * 1000 / members:.1f} "
        f"ms a member) | {approve_seconds * 1000 / members / per_member:.2f}x a member |"
    )
    print(
        f"| results refresh ({members} members) | one request's campaign: "
        f"{median_ms(refresh_small):.1f} ms | {median_ms(refresh_big):.1f} ms | "
        f"{median_ms(refresh_big) / median_ms(refresh_small):.1f}x |"
    )
    for label in ("results", "detail"):
        big, small_ms = median_ms(reads[(label, "big")]), median_ms(reads[(label, "small")])
        print(
            f"| GET /api/campaigns/ID/{'results' if label == 'results' else ''} | one "
            f"request's campaign: {small_ms:.1f} ms | {big:.1f} ms | {big / small_ms:.1f}x |"
        )
    big, small_ms = median_ms(page["big"]), median_ms(page["small"])
    print(f"| campaign page | one request's campaign: {small_ms:.1f} ms | {big:.1f} ms | "
          f"{big / small_ms:.1f}x |")  # fmt: skip
    connection.close()


if __name__ == "__main__":
    main()
