from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser

from replays import importing

SAMPLES = settings.BASE_DIR / "tests" / "fixtures" / "transcripts" / "real"


class Command(BaseCommand):
    help = "Import the bundled sample transcripts and create (or reset) a local demo user."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument("--samples", type=Path, default=SAMPLES)

    def handle(self, *args: Any, username: str, samples: Path, **options: Any) -> None:
        summary = importing.ImportSummary()
        for path in importing.find_transcript_files([samples]):
            summary.add(importing.import_transcript_file(path=path))
        self.stdout.write(
            f"Sample transcripts: {summary.new} new, {summary.updated} updated, "
            f"{summary.unchanged} unchanged, {summary.failed} failed ({summary.turns} turns)."
        )
        for result in summary.results:
            if result.outcome == "failed":
                self.stderr.write(self.style.ERROR(result.error))
        password = secrets.token_urlsafe(9)
        user, created = User.objects.get_or_create(username=username)
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
        verb = "Created" if created else "Reset the password of"
        self.stdout.write(self.style.SUCCESS(
            f"{verb} the local user '{username}'. Log in at http://127.0.0.1:8000/ "
            f"with username {username} and password {password}"
        ))
