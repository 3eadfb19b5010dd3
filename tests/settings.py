"""Settings for the tests and the processes they start (manage.py children inherit
DJANGO_SETTINGS_MODULE): the deployment's settings plus the test-only hooks.

REPLAYS_TEST_HOOKS turns on the crash tests' pause points (REPLAYS_TEST_PAUSE_AT): only
this module sets it, so a pause variable that leaks into a deployment does nothing."""

from replaysite.settings import *  # noqa: F403

REPLAYS_TEST_HOOKS = True
