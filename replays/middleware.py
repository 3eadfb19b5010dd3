"""Refuse oversized request bodies up front, before anything reads them: 413 with the API's
error shape for the API; for a page, the page itself says so when its view offers a way to
(`page_for_refused_body`), else a short text."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.urls import reverse
from rest_framework.permissions import SAFE_METHODS

from replays.api.errors import error_body
from replays.api.throttling import WRITE_SCOPE, WriteThrottle

MAX_BODY_BYTES = 2 * 1024 * 1024
# Transcript uploads may be as large as the transcript limit, plus room for the multipart envelope.
UPLOAD_PATHS = ("/api/threads/import", "/threads/upload/")
MULTIPART_ALLOWANCE = 64 * 1024

RefusedPage = Callable[..., HttpResponse]


@dataclass(frozen=True)
class RefusedBody:
    size: int  # the body's Content-Length
    limit: int  # what this path accepts (for uploads: the transcript limit plus the envelope)


def page_for_refused_body(page: RefusedPage) -> Callable[[RefusedPage], RefusedPage]:
    """Mark a view whose page shows a refused body itself: `page(request, refused, *args,
    **kwargs)` renders it (with status 413) instead of the view, which never sees the body.
    The page must check the login itself: it runs before the view's decorators."""

    def mark(view: RefusedPage) -> RefusedPage:
        view.refused_body_page = page  # type: ignore[attr-defined]
        return view

    return mark


class BodySizeLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        limit = MAX_BODY_BYTES
        if request.path.startswith(UPLOAD_PATHS):
            limit = settings.REPLAYS_MAX_TRANSCRIPT_BYTES + MULTIPART_ALLOWANCE
        if length > limit:
            if request.path.startswith("/api/"):
                message = f"The request body is {length:,} bytes; the limit is {limit:,} bytes."
                return JsonResponse(
                    error_body("too_large", message, {"size": length, "limit": limit}), status=413
                )
            # Pages are answered in process_view, once the view (and its own page) is known.
            request.refused_body = RefusedBody(size=length, limit=limit)  # type: ignore[attr-defined]
        return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view: Callable[..., HttpResponse],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> HttpResponse | None:
        refused: RefusedBody | None = getattr(request, "refused_body", None)
        if refused is None:
            return None
        # Answered before the later middleware's views (CSRF's reads the body for its token).
        page = getattr(view, "refused_body_page", None)
        if page is not None:
            return page(request, refused, *args, **kwargs)
        message = (
            f"The request body is {refused.size:,} bytes; the limit is {refused.limit:,} bytes."
        )
        return HttpResponse(message, status=413, content_type="text/plain")


# --- the write limit of the pages ----------------------------------------------------------


class _WriteScope:
    """What DRF's throttle reads of a view: the scope whose rate applies."""

    throttle_scope = WRITE_SCOPE


class PageWriteThrottleMiddleware:
    """Every write through the pages (an upload, prepare, approve, judge, cancel, the admin)
    counts against the same per-user limit as the API's writes (REPLAYS_API_WRITE_RATE,
    one count in the shared cache for both): beyond it, 429 with Retry-After and a page that
    says when to try again. The API counts its own (DRF); signing in and out are limited by
    django-axes instead."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if (
            request.method not in SAFE_METHODS
            and not request.path.startswith("/api/")
            and request.path not in (reverse("login"), reverse("logout"))
            and getattr(request, "user", None) is not None
            and request.user.is_authenticated
        ):
            throttle = WriteThrottle()
            if not throttle.allow_request(request, _WriteScope()):  # type: ignore[arg-type]
                wait = math.ceil(throttle.wait() or 1)
                response = render(
                    request, "replays/throttled.html", {"retry_after": wait}, status=429
                )
                response["Retry-After"] = str(wait)
                return response
        return self.get_response(request)


def client_address(request: HttpRequest) -> str:
    """The address a request came from, for the sign-in lockout (django-axes): behind the
    proxy (REPLAYS_BEHIND_HTTPS_PROXY) the last address of X-Forwarded-For, the one the
    proxy itself added (docs/deployment.md's nginx sets it so); else REMOTE_ADDR. Every
    client would otherwise be the proxy, and one stranger's guesses would lock everyone
    out."""
    if settings.REPLAYS_BEHIND_HTTPS_PROXY:
        forwarded = [
            part.strip()
            for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
            if part.strip()
        ]
        if forwarded:
            return forwarded[-1]
    return str(request.META.get("REMOTE_ADDR", ""))
