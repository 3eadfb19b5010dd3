"""`Authorization: Token <key>`, the key looked up by its sha256 (replays.accounts): the
database holds no key that would open an account."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication

from replays import accounts


class HashedTokenAuthentication(TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str) -> tuple[Any, Any]:
        token = accounts.token_for_key(key)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        return token.user, token
