"""Helpers every page family uses."""

from __future__ import annotations

from django.http import HttpRequest
from django.utils.http import url_has_allowed_host_and_scheme

from replays import agents


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
