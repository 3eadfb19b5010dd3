"""Which repositories this server may open: only those under REPLAYS_REPOSITORY_ROOTS.

Paths are resolved (symlinks followed) before the check, so a link under a root that
points elsewhere is outside. The refusal says the same for a path that exists and one
that does not: a user learns nothing about the server's disk from it.
"""

from __future__ import annotations

from pathlib import Path

from django.conf import settings

OUTSIDE_ROOTS = (
    "is not under the folders this server may open (REPLAYS_REPOSITORY_ROOTS): "
    "use a clone under one of them"
)


def repository_roots() -> list[Path]:
    return [Path(root).resolve() for root in settings.REPLAYS_REPOSITORY_ROOTS]


def under_roots(path: Path | str) -> bool:
    """True when `path`, resolved, is one of the roots or inside one."""
    try:
        resolved = Path(path).expanduser().resolve()
    except (OSError, RuntimeError, ValueError):
        return False
    return any(resolved == root or root in resolved.parents for root in repository_roots())
