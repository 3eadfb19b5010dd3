"""Helpers every page family uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme

from replays import agents, runfolder


def model_labels(infos: list[agents.ModelInfo] | None = None) -> dict[str, str]:
    """Each model's label, from `infos` when the caller already discovered the models."""
    return {info.id: info.label for info in (infos or agents.discover_models())}


def safe_next(request: HttpRequest, default: str) -> str:
    target = request.POST.get("next", "")
    if target and url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        return target
    return default


def sandbox_notice(request: HttpRequest) -> dict[str, str]:
    """The banner every page shows when runs are not sandboxed (the operator's single-user
    mode) or cannot start here for want of a sandbox (a context processor)."""
    if not runfolder.sandbox_required():
        return {
            "sandbox_notice": (
                "Runs are not sandboxed (REPLAYS_SANDBOX=off): every agent, verify command "
                "and evaluator can read what Replays' account can, the database, the secret "
                "key and every user's data included. Use this mode for a single user on "
                "their own machine only."
            )
        }
    return {"sandbox_notice": runfolder.sandbox_unavailable_reason()}


def locked_out(
    request: HttpRequest, response: HttpResponse | None = None, credentials: Any = None
) -> HttpResponse:
    """What django-axes answers a sign-in made while it is locked out (AXES_LOCKOUT_CALLABLE):
    429, a page that says why and for how long."""
    username = ""
    if isinstance(credentials, dict):
        username = str(credentials.get("username") or "")
    return render(
        request,
        "registration/locked_out.html",
        {
            "username": username or request.POST.get("username", ""),
            "lockout_minutes": settings.REPLAYS_LOGIN_LOCKOUT_MINUTES,
            "failures": settings.REPLAYS_LOGIN_FAILURES,
        },
        status=429,
    )


@dataclass(frozen=True)
class TokenCookie:
    """A prepare token handed to the browser once, in a signed, HTTP-only cookie scoped to
    the pages of what was prepared (a plan's, a campaign's); the server keeps only its hash,
    as with the API (DESIGN.md)."""

    prefix: str  # the cookie's name before the id
    salt: str
    page: str  # the URL name of the page whose path scopes the cookie

    def name(self, pk: int) -> str:
        return f"{self.prefix}{pk}"

    def path(self, pk: int) -> str:
        return reverse(self.page, args=[pk])

    def read(self, request: HttpRequest, pk: int) -> str | None:
        return request.get_signed_cookie(
            self.name(pk),
            default=None,
            salt=self.salt,
            max_age=settings.REPLAYS_PREPARE_TOKEN_SECONDS,
        )

    def give(self, request: HttpRequest, response: HttpResponse, pk: int, token: str) -> None:
        response.set_signed_cookie(
            self.name(pk),
            token,
            salt=self.salt,
            max_age=settings.REPLAYS_PREPARE_TOKEN_SECONDS,
            path=self.path(pk),
            secure=request.is_secure(),
            httponly=True,
            samesite="Strict",
        )

    def forget(self, response: HttpResponse, pk: int) -> None:
        """Single use: once approved, the browser has no more need for the token."""
        response.delete_cookie(self.name(pk), path=self.path(pk), samesite="Strict")
