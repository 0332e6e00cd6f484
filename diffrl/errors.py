"""User-facing errors: the CLI prints their message (no traceback unless ``--debug``).

Every error a user can cause with a config, a file or a command-line argument derives from
:class:`DiffrlError`; anything else reaching the CLI is a bug in diffrl and is reported as one.
"""

from __future__ import annotations

EXIT_USER_ERROR = 2
"""Bad input: a config, file or argument the run cannot use."""
EXIT_RUN_STOPPED = 3
"""The run started and stopped itself: rewards failed, non-finite gradients, a dead trainer rank."""
EXIT_INTERRUPTED = 75
"""SIGTERM/SIGINT: the current step finished, a checkpoint was saved; ``train.resume=latest``
continues (75 is sysexits' EX_TEMPFAIL: try again later)."""
EXIT_BUG = 70
"""An unexpected exception: a bug in diffrl (sysexits' EX_SOFTWARE)."""


class Abandoned(BaseException):
    """A rollout given up because a stop signal arrived (it is recomputed exactly on resume). A
    ``BaseException``, so code that catches ``Exception`` (a reward's error handling) lets it by."""


class DiffrlError(Exception):
    """A problem the user can fix; the message says what is wrong and what to do."""

    exit_code = EXIT_USER_ERROR


class RunStopped(DiffrlError):
    """The run stopped itself because continuing would waste compute or save garbage."""

    exit_code = EXIT_RUN_STOPPED


class Interrupted(DiffrlError):
    """SIGTERM or SIGINT arrived; the run saved ``checkpoint`` and stopped."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str, checkpoint: str | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint
