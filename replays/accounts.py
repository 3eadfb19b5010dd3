"""API tokens: made here, kept as their sha256 only, and looked up by the key a client
sends. The key is shown once, to whoever made it (the admin, `manage.py api_token`)."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser

from replays.models import ApiToken

# What secrets.token_hex(20) gives (40 hex characters, as DRF's keys were); a longer key
# is no key of ours and is not even hashed.
MAX_KEY_CHARS = 200
PREFIX_CHARS = 6


def key_sha256(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", errors="surrogateescape")).hexdigest()


def create_api_token(*, user: AbstractBaseUser) -> tuple[ApiToken, str]:
    """A new token for `user`, and its key (the only time it exists in the clear)."""
    key = secrets.token_hex(20)
    token = ApiToken.objects.create(
        user=user, key_sha256=key_sha256(key), prefix=key[:PREFIX_CHARS]
    )
    return token, key


def token_for_key(key: str) -> ApiToken | None:
    """The token a client's key opens (its user with it), None for an unknown key."""
    if not key or len(key) > MAX_KEY_CHARS:
        return None
    return ApiToken.objects.select_related("user").filter(key_sha256=key_sha256(key)).first()
