"""Refuse oversized request bodies up front with 413 and the API's error shape."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from replays.api.errors import error_body

MAX_BODY_BYTES = 2 * 1024 * 1024
# Transcript uploads may be as large as the transcript limit, plus room for the multipart envelope.
UPLOAD_PATHS = ("/api/threads/import", "/threads/upload/")
MULTIPART_ALLOWANCE = 64 * 1024


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
            message = f"The request body is {length:,} bytes; the limit is {limit:,} bytes."
            if request.path.startswith("/api/"):
                return JsonResponse(
                    error_body("too_large", message, {"size": length, "limit": limit}), status=413
                )
            return HttpResponse(message, status=413, content_type="text/plain")
        return self.get_response(request)
