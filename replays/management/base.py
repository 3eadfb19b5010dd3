"""What every Replays command shares: output that imported or agent text cannot steer.

Titles, prompts, paths and error messages come from transcripts and agents; printed as
they are, an escape sequence in one (an OSC title, a cursor move, a bidi override) drives
the reader's terminal. Our commands print through SafeOutput, which removes them; the few
lines that draw on purpose (a live display) use `raw`.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management.base import BaseCommand, CommandError, OutputWrapper
from django.core.serializers.json import DjangoJSONEncoder

from replays.processes import plain_text

# C1 controls (0x80-0x9f: CSI among them) and the bidirectional overrides and isolates.
_MORE_CONTROLS = re.compile("[\x80-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text that cannot drive a terminal: no escape sequences or control characters but
    tab and newline, no bidi overrides."""
    return _MORE_CONTROLS.sub("", plain_text(text))


class NumbersEncoder(DjangoJSONEncoder):
    """JSON as the API writes it: money (Decimal) as numbers, not strings."""

    def default(self, o: Any) -> Any:
        if isinstance(o, Decimal):
            return float(o)
        return super().default(o)


def json_text(body: Any) -> str:
    """A command's --json output."""
    return json.dumps(body, indent=2, cls=NumbersEncoder)


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


def command_user(username: str | None, *, acting: str) -> AbstractBaseUser:
    """Who a command acts for, by one rule for every command: `--user NAME`, else the one
    active superuser (an error naming what to do when there is none or several).
    `acting` says what for, in the error ("owns the plan", "imports the threads")."""
    users = get_user_model().objects
    if username:
        user = users.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username}.")
        return user
    superusers = list(users.filter(is_superuser=True, is_active=True)[:2])
    if len(superusers) != 1:
        raise CommandError(
            f"Say who {acting} with --user NAME "
            "(or create one superuser: manage.py createsuperuser)."
        )
    return superusers[0]
