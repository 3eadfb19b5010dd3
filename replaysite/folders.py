"""Where run folders may live: never inside a project.

Tools look for their configuration in the folders above the one they run in: pytest
climbs to the first `pyproject.toml`, `pytest.ini`, `tox.ini` or `setup.cfg` it finds and
takes its settings (and its `tests` package) from there, npm and jest to `package.json`,
cargo to `Cargo.toml`. A verify command or an agent started in a run's worktree must see
the project it tests and nothing of the folders around it: with the run folders inside
Replays' own checkout (`make demo` keeps `var/` there), pytest found Replays' settings
and its `tests` package, and every demo replay ended "not judged".

Plain Python: settings.py reads it before Django is set up, the doctor afterwards.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# Files and folders by which a tool recognises a project root when it climbs.
PROJECT_MARKERS = (
    ".git",
    "pyproject.toml",
    "setup.cfg",
    "setup.py",
    "tox.ini",
    "pytest.ini",
    "package.json",
    "Cargo.toml",
    "go.mod",
)


def project_above(path: Path) -> Path | None:
    """The nearest folder above `path` (or `path` itself) holding a project marker, or
    None. The root folder does not count: nothing is outside it."""
    current = Path(os.path.abspath(path))
    for folder in (current, *current.parents):
        if folder == folder.parent:
            return None
        if any(os.path.lexists(folder / marker) for marker in PROJECT_MARKERS):
            return folder
    return None


def default_run_root(var_dir: Path) -> Path:
    """`var_dir/runs`, unless the var folder lies inside a project (as `make demo`'s
    `var/` does, in the checkout): then a folder of the user's cache, one per var folder
    (`$XDG_CACHE_HOME/replays/runs-<hash>`, `~/.cache` by default), so two installs on
    one machine never share run folders."""
    if project_above(var_dir) is None:
        return var_dir / "runs"
    cache = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    digest = hashlib.sha256(os.fsencode(os.path.abspath(var_dir))).hexdigest()[:12]
    return base / "replays" / f"runs-{digest}"
