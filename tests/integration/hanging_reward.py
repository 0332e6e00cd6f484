"""The reward ``test_remote_reward.py``'s server serves, in a module of its own so that the server
process imports it and ``tests.rewards`` only (the test module imports the training world: ~5 CPU
seconds more for the server to start)."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

from tests.rewards import brightness

HANG_AT_ENV = "DIFFRL_TEST_HANG_AT_CALL"
MARKER_ENV = "DIFFRL_TEST_HANG_MARKER"
CALLS = itertools.count(1)


def brightness_until_killed(images, prompts, metadata):
    """brightness; in the server process, call ``$DIFFRL_TEST_HANG_AT_CALL`` writes the marker file
    ``$DIFFRL_TEST_HANG_MARKER`` and hangs (the test kills the server when the marker appears)."""
    if os.environ.get(HANG_AT_ENV) and next(CALLS) == int(os.environ[HANG_AT_ENV]):
        Path(os.environ[MARKER_ENV]).touch()
        time.sleep(600)
    return brightness(images, prompts, metadata)
