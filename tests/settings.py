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
