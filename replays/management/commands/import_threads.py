from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from django.core.management.base import CommandError, CommandParser

from replays import importing
from replays.management.base import ReplaysCommand, command_user

MAX_PROBLEMS_SHOWN = 20


class Command(ReplaysCommand):
    help = (
        "Import the sessions of Claude Code, Codex, Gemini CLI, OpenCode and pi. With no path, "
        "look where the tools keep them ($CLAUDE_CONFIG_DIR, ~/.claude/projects, "
        "~/.config/claude/projects, $CODEX_HOME/sessions, ~/.codex/sessions, $GEMINI_DATA_DIR, "
        "~/.gemini/tmp, $OPENCODE_DATA_DIR, ~/.local/share/opencode (its database, read "
        "only), $PI_AGENT_DIR, ~/.pi/agent/sessions). Unchanged files are skipped."
    )

    # Reading files needs no check of URLs, templates or admin classes: skipping them
    # is a third of the time of re-importing unchanged files.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "paths", nargs="*", type=Path, help="Session files or folders to search."
        )
        parser.add_argument(
            "--no-progress", action="store_true", help="Do not draw the progress bar."
        )
        parser.add_argument(
            "--user", help="Whose threads they become (default: the only superuser)."
        )

    def handle(self, *args: Any, paths: list[Path], no_progress: bool, **options: Any) -> None:
        owner = command_user(options["user"], acting="imports the threads")
        for path in paths:
            if not path.exists():
                raise CommandError(f"{path}: no such file or folder.")
        roots = paths or importing.default_transcript_roots()
        if not paths:
            existing = [root for root in roots if root.is_dir()]
            self.stdout.write("Looking in: " + (", ".join(map(str, existing)) or "nothing found"))
            roots = existing
        files = list(importing.find_transcript_files(roots))
        if not files:
            self.stdout.write("No session files found.")
            return
        progress = Progress(len(files), stream=self.stderr._out, enabled=not no_progress)
        summary = importing.ImportSummary()
        progress.show(0, files[0].name)
        # Files are parsed in worker processes; a file that breaks the importer comes back
        # as a failed file, not the end of the run.
        for number, result in enumerate(importing.import_files(paths=files, user=owner), 1):
            summary.add(result)
            progress.clear()
            self._report(result)
            if number < len(files):
                progress.show(number, files[number].name)
        progress.show(len(files), "done")
        progress.finish()
        self.stdout.write(
            f"{summary.files} files: {summary.new} new, {summary.updated} updated, "
            f"{summary.unchanged} unchanged, {summary.failed} failed; "
            f"{summary.turns} turns; {summary.lines_skipped} lines skipped."
        )
        if summary.failed:
            raise CommandError(f"{summary.failed} of {summary.files} files could not be imported.")

    def _report(self, result: importing.ImportResult) -> None:
        if result.outcome == "failed":
            self.stderr.write(self.style.ERROR(f"failed: {result.error}"))
            return
        if result.outcome != "unchanged":
            title = result.thread.title if result.thread else ""
            self.stdout.write(
                f"{result.outcome}: {result.path} ({result.turns} turns) {title[:60]}"
            )
        for problem in result.problems[:MAX_PROBLEMS_SHOWN]:
            self.stderr.write(
                self.style.WARNING(
                    f"skipped {result.path}:{problem.line_number}: {problem.message}"
                )
            )
        if len(result.problems) > MAX_PROBLEMS_SHOWN:
            more = len(result.problems) - MAX_PROBLEMS_SHOWN
            self.stderr.write(
                self.style.WARNING(f"... and {more} more skipped lines in {result.path}")
            )


class Progress:
    """A one-line progress bar on a terminal; silent when output goes to a file or pipe."""

    WIDTH = 30

    def __init__(self, total: int, *, stream: Any = None, enabled: bool = True) -> None:
        self.total = total
        self.stream = stream or sys.stderr
        self.enabled = enabled and hasattr(self.stream, "isatty") and self.stream.isatty()

    def show(self, done: int, label: str) -> None:
        if not self.enabled:
            return
        filled = self.WIDTH * done // max(self.total, 1)
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{bar}] {done}/{self.total} {label[:40]:<40}")
        self.stream.flush()

    def clear(self) -> None:
        if self.enabled:
            self.stream.write("\r" + " " * (self.WIDTH + 60) + "\r")
            self.stream.flush()

    def finish(self) -> None:
        if self.enabled:
            self.stream.write("\n")
            self.stream.flush()
