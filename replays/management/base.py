"""What every Replays command shares: output that imported or agent text cannot steer.

Titles, prompts, paths and error messages come from transcripts and agents; printed as
they are, an escape sequence in one (an OSC title, a cursor move, a bidi override) drives
the reader's terminal. Our commands print through SafeOutput, which removes them; the few
lines that draw on purpose (a live display) use `raw`.
"""

from __future__ import annotations

import re
from typing import Any

from django.core.management.base import BaseCommand, OutputWrapper

from replays.processes import plain_text

# C1 controls (0x80-0x9f: CSI among them) and the bidirectional overrides and isolates.
_MORE_CONTROLS = re.compile("[\x80-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text that cannot drive a terminal: no escape sequences or control characters but
    tab and newline, no bidi overrides."""
    return _MORE_CONTROLS.sub("", plain_text(text))


class SafeOutput(OutputWrapper):
    def write(self, msg: str = "", style_func: Any = None, ending: str | None = None) -> None:
        super().write(printable(msg), style_func, ending)

    def raw(self, msg: str) -> None:
        """Our own drawing (cursor moves of a live display), written as it is."""
        self._out.write(msg)


class ReplaysCommand(BaseCommand):
    stdout: SafeOutput
    stderr: SafeOutput

    def __init__(self, stdout: Any = None, stderr: Any = None, **kwargs: Any) -> None:
        super().__init__(stdout=stdout, stderr=stderr, **kwargs)
        self.stdout = SafeOutput(self.stdout._out)
        self.stderr = SafeOutput(self.stderr._out)
        self.stderr.style_func = self.style.ERROR

    def execute(self, *args: Any, **options: Any) -> Any:
        # Given streams (call_command(stdout=...)) are wrapped here, not by BaseCommand.
        for name in ("stdout", "stderr"):
            stream = options.pop(name, None)
            if stream is not None:
                setattr(self, name, SafeOutput(stream))
        if options.get("no_color"):
            self.stderr.style_func = None
        return super().execute(*args, **options)
