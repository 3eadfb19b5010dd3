from __future__ import annotations

import secrets
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandParser

from replays import importing
from replays.management.base import ReplaysCommand
from replays.models import Batch, Campaign, Thread

SAMPLES = settings.BASE_DIR / "tests" / "fixtures" / "transcripts" / "real"
SAMPLE_BUNDLE = settings.BASE_DIR / "tests" / "fixtures" / "repos" / "sample.bundle"


class Command(ReplaysCommand):
    help = "Import the bundled sample transcripts and create (or reset) a local demo user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--samples", type=Path, default=SAMPLES)
        parser.add_argument(
            "--url",
            default="http://127.0.0.1:8000/",
            help="Where the demo's web server listens (make demo passes its HOST and PORT).",
        )
        parser.add_argument(
            "--no-replay",
            action="store_true",
            help="Do not replay the sample thread or run the sample campaign (by default the "
            "thread is replayed once, and a campaign runs over the samples' last requests, "
            "with the two calibration baselines judged by the sample's own tests).",
        )

    def handle(self, *args: Any, username: str, samples: Path, url: str, **options: Any) -> None:
        # The demo user first: the sample threads are theirs.
        user, created = User.objects.get_or_create(username=username)
        summary = importing.ImportSummary()
        for path in importing.find_transcript_files([samples]):
            summary.add(importing.import_transcript_file(path=path, user=user))
        self.stdout.write(
            f"Sample transcripts: {summary.new} new, {summary.updated} updated, "
            f"{summary.unchanged} unchanged, {summary.failed} failed ({summary.turns} turns)."
        )
        for result in summary.results:
            if result.outcome == "failed":
                self.stderr.write(self.style.ERROR(result.error))
        repository = self.sample_repository()
        password = secrets.token_urlsafe(9)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Reset the password of"
        self.stdout.write(
            self.style.SUCCESS(
                f"{verb} the local user '{username}'. Log in at {url} "
                f"with username {username} and password {password}"
            )
        )
        thread = (
            Thread.objects.filter(owner=user, source_kind="claude_code")
            .order_by("started_at")
            .first()
        )
        if thread is None or repository is None:
            return
        replay = self.sample_replay(thread, repository, username)
        if options["no_replay"]:
            self.stdout.write(
                "Try a replay with the calibration baselines, judged by the sample's tests:\n"
                f"  .venv/bin/python manage.py {shlex.join(replay)}"
            )
        elif Batch.objects.filter(owner=user, runs__thread=thread).exists():
            self.stdout.write("The sample thread was replayed already: see /batches/.")
        else:
            self.stdout.write("Replaying the sample thread with the calibration baselines…")
            # The same command a user runs; it dispatches itself, so no cluster is needed.
            call_command(*replay, stdout=self.stdout, stderr=self.stderr)
        if options["no_replay"] or Campaign.objects.filter(owner=user).exists():
            return
        self.stdout.write(
            "A campaign over the samples' last gradable requests, with the baselines…"
        )
        call_command(
            *self.sample_campaign(thread, repository, username),
            stdout=self.stdout,
            stderr=self.stderr,
        )

    def sample_replay(self, thread: Thread, repository: Path, username: str) -> list[str]:
        """`replay` of the sample thread's first request with `historical` and `empty`,
        judged offline by the sample repository's own tests (no model is asked)."""
        verify = f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml={{junit_xml}}"
        return [
            "replay", "--thread", str(thread.pk),
            "--from", thread.turns.get(index=0).message_uuid,
            "--model", "historical", "--model", "empty",
            "--repository", str(repository), "--verify-command", verify,
            "--evaluator", "tests", "--user", username, "--yes", "--wait",
        ]  # fmt: skip

    def sample_campaign(self, thread: Thread, repository: Path, username: str) -> list[str]:
        """`campaign` over the samples' last three gradable requests (their tests see their
        change) with `historical` and `empty`, judged by the sample's own tests, so the
        calibration is checked: the sessions were recorded in a folder this machine does
        not have, so the clone is said to be where it is."""
        verify = f"{sys.executable} -m pytest -q -p no:cacheprovider --junitxml={{junit_xml}}"
        return [
            "campaign", "--last", "3", "--gradable-only", "--model", "historical",
            "--model", "empty",
            "--evaluator", "tests", "--clone", f"{thread.cwd}={repository}",
            "--verify-command", f"{repository}={verify}", "--user", username, "--yes", "--wait",
        ]  # fmt: skip

    def sample_repository(self) -> Path | None:
        """The repository the sample sessions worked in, cloned from its bundle (once)."""
        target = settings.REPLAYS_VAR_DIR / "sample-repo"
        if not (target / ".git").exists():
            cloned = subprocess.run(
                ["git", "clone", "-q", str(SAMPLE_BUNDLE), str(target)],
                capture_output=True,
                text=True,
            )
            if cloned.returncode != 0:
                self.stderr.write(
                    self.style.WARNING(f"Could not clone the sample repository: {cloned.stderr}")
                )
                return None
            # A local branch for every branch the sessions used (the clone makes only main).
            subprocess.run(
                ["git", "-C", str(target), "branch", "-q", "feature/cli", "origin/feature/cli"],
                capture_output=True,
            )
        return target
