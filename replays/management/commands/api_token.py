"""`manage.py api_token --user NAME`: a new API token for NAME, printed once (only its
sha256 is kept)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import CommandParser

from replays import accounts
from replays.management.base import ReplaysCommand, command_user


class Command(ReplaysCommand):
    help = "Make a new API token for a user and print it (it is shown this once)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--user", help="Whose token (default: the only superuser).")

    def handle(self, *args: Any, **options: Any) -> None:
        user = command_user(options["user"], acting="gets the token")
        _, key = accounts.create_api_token(user=user)
        self.stdout.write(key)
        self.stderr.write(
            f"A new API token for {user.get_username()}: send it as "
            "'Authorization: Token <key>'. Only its sha256 is kept; it is not shown again."
        )
