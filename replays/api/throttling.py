"""Writes through the API are throttled per user (reads never are), counted in the default
cache, which every process shares (Redis, else the database: see settings.CACHES)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.conf import settings
from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import ScopedRateThrottle

if TYPE_CHECKING:  # DRF's views import this module (DEFAULT_THROTTLE_CLASSES)
    from rest_framework.request import Request
    from rest_framework.views import APIView

WRITE_SCOPE = "write"


class WriteThrottle(ScopedRateThrottle):
    """Views with `throttle_scope = WRITE_SCOPE` allow REPLAYS_API_WRITE_RATE writes per user."""

    def allow_request(self, request: Request, view: APIView) -> bool:
        if request.method in SAFE_METHODS:
            return True
        return super().allow_request(request, view)

    def get_rate(self) -> str | None:
        if self.scope == WRITE_SCOPE:
            # Read at each request (DRF reads its rates once, at import): tests relax it.
            return settings.REPLAYS_API_WRITE_RATE
        return super().get_rate()
