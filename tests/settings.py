"""Settings for the tests and the processes they start (manage.py children inherit
DJANGO_SETTINGS_MODULE): the deployment's settings plus the test-only hooks.

REPLAYS_TEST_HOOKS turns on the crash tests' pause points (REPLAYS_TEST_PAUSE_AT): only
this module sets it, so a pause variable that leaks into a deployment does nothing."""

import tempfile
from pathlib import Path

from replaysite.settings import *  # noqa: F403

REPLAYS_TEST_HOOKS = True

# The tests' repositories live in temporary folders (pytest's tmp_path): allow them, as a
# deployment would list its own checkouts. tests/test_repository_roots.py narrows it.
REPLAYS_REPOSITORY_ROOTS = [*REPLAYS_REPOSITORY_ROOTS, Path(tempfile.gettempdir())]  # noqa: F405

# The sandbox (README, Security model) is on in the tests as in a deployment: every agent,
# verify command and evaluator the tests start runs in it. A machine without a working
# bwrap runs them unsandboxed, unless the tools are required (CI), where a missing bwrap
# fails the runs; tests/test_sandbox.py needs it either way.
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402

from replays import sandbox as _sandbox  # noqa: E402

if not _os.environ.get("REPLAYS_SANDBOX") and _os.environ.get("REPLAYS_REQUIRE_TOOLS") != "1":
    REPLAYS_SANDBOX = "bwrap" if not _sandbox.probe(REPLAYS_SANDBOX_BWRAP) else "off"  # noqa: F405
# What the tests' own command agents, judges and verify commands run: this checkout's
# virtual environment and the Python it was made from, and the scripts in
# tests/agent_scripts. (Nothing else of the checkout is shown.)
_TESTS = Path(__file__).resolve().parent
REPLAYS_SANDBOX_READ_ONLY_PATHS = [
    *REPLAYS_SANDBOX_READ_ONLY_PATHS,  # noqa: F405
    Path(_sys.prefix),
    Path(_sys.base_prefix),
    _TESTS / "agent_scripts",
]
# A test's folder for the marker files its command agents write (where they started, their
# pids), given by the test in REPLAYS_TEST_SANDBOX_WRITABLE: writable in every sandbox of
# the processes it starts. Tests only; no deployment has it.
REPLAYS_TEST_SANDBOX_WRITABLE = [
    Path(path) for path in _os.environ.get("REPLAYS_TEST_SANDBOX_WRITABLE", "").split(":") if path
]
