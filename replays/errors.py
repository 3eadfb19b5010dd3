"""One base for the errors a service refuses a request with.

A service says what kind of refusal it is (the input is invalid, not allowed, not found,
in conflict with the state, gone, too large), a code and a message a person reads, and
details as data; it knows nothing of HTTP. The doors answer each kind their own way: the
API's one exception handler maps the kind to a status and the error shape, the pages to a
page's status and a message, the commands to their error. Ground layer: plain Python.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, ClassVar


class ErrorKind(StrEnum):
    INVALID = "invalid"
    NOT_ALLOWED = "not_allowed"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    GONE = "gone"
    TOO_LARGE = "too_large"


class ServiceError(Exception):
    """A refusal: `code` names it for programs, `message` says it to people."""

    kind: ClassVar[ErrorKind] = ErrorKind.INVALID

    def __init__(
        self,
        message: str,
        *,
        code: str = "invalid",
        kind: ErrorKind | None = None,
        details: Any = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.details = details
        if kind is not None:
            self.kind = kind  # type: ignore[misc] - this instance's own kind


# How the doors that speak HTTP (the API, the pages) answer each kind.
HTTP_STATUS = {
    ErrorKind.INVALID: 400,
    ErrorKind.NOT_ALLOWED: 403,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.CONFLICT: 409,
    ErrorKind.GONE: 410,
    ErrorKind.TOO_LARGE: 413,
}


def http_status(error: ServiceError) -> int:
    return HTTP_STATUS[error.kind]
