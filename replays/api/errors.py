"""One error shape for the whole API: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, JsonResponse
from django.urls import Resolver404, resolve
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from replays.errors import ServiceError, http_status


class ApiError(exceptions.APIException):
    """An error with our own code and details, raised by API views."""

    def __init__(
        self, *, code: str, message: str, status_code: int = 400, details: Any = None
    ) -> None:
        super().__init__(detail=message, code=code)
        self.status_code = status_code
        self.error_code = code
        self.details = details


_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_413_REQUEST_ENTITY_TOO_LARGE: "too_large",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    if isinstance(exc, ServiceError):
        # A service's refusal: its kind says the status, its code and message the body.
        return Response(error_body(exc.code, exc.message, exc.details), status=http_status(exc))
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ApiError):
        response.data = error_body(exc.error_code, str(exc.detail), exc.details)
        return response
    detail = response.data
    if isinstance(exc, exceptions.ValidationError):
        response.data = error_body("invalid", "The request is not valid.", detail)
    else:
        message = detail.get("detail", str(exc)) if isinstance(detail, dict) else str(detail)
        code = _CODES.get(response.status_code, getattr(exc, "default_code", "error"))
        details = None
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            details = {"retry_after": exc.wait}  # seconds, as in the Retry-After header
        response.data = error_body(code, str(message), details)
    return response


@csrf_exempt  # it answers a POST too, and has nothing to protect
def unknown_path(request: HttpRequest, path: str = "") -> JsonResponse:
    """Every /api/ path that names no endpoint, whatever the method: 404 in the error shape
    (not Django's HTML page), with a hint when only the final slash is missing."""
    message = f"There is no API endpoint at {request.path}."
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.func is not unknown_path:
            message += f" Did you mean {request.path}/?"
    return JsonResponse(error_body("not_found", message), status=status.HTTP_404_NOT_FOUND)
