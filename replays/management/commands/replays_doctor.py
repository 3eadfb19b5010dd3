from __future__ import annotations

import json
from typing import Any

from django.core.management.base import CommandError, CommandParser

from replays import doctor
from replays.management.base import ReplaysCommand

MARKS = {doctor.OK: "ok", doctor.WARNING: "warning", doctor.ERROR: "ERROR"}


class Command(ReplaysCommand):
    help = (
        "Check this deployment: the database and its migrations, the broker, the shared "
        "cache, the clusters seen per host, each host's agent binaries and versions, this "
        "machine's run root and repository roots, and clock skew between hosts against the "
        "heartbeat limit and the prepare tokens' lifetime. Exits 1 when something is wrong "
        "(an error); warnings do not change the status."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json",
            action="store_true",
            help='Print {"ok", "checks": [{"name", "host", "ok", "severity", "message"}]}.',
        )

    def handle(self, *args: Any, **options: Any) -> None:
        diagnosis = doctor.diagnose()
        if options["json"]:
            self.stdout.write(json.dumps(diagnosis.as_dict(), indent=2))
        else:
            for check in diagnosis.checks:
                where = f" ({check.host})" if check.host else ""
                self.stdout.write(
                    f"{MARKS[check.severity]:<8} {check.name}{where}: {check.message}"
                )
            errors = sum(check.severity == doctor.ERROR for check in diagnosis.checks)
            warnings = sum(check.severity == doctor.WARNING for check in diagnosis.checks)
            self.stdout.write(
                f"\n{errors} error{'s' if errors != 1 else ''}, "
                f"{warnings} warning{'s' if warnings != 1 else ''}."
            )
        if not diagnosis.ok:
            raise CommandError("The doctor found errors (see above).", returncode=1)
