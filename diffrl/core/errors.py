"""User-facing errors: the CLI prints their message (no traceback unless ``--debug``).

Every error a user can cause with a config, a file or a command-line argument derives from
:class:`DiffrlError`; anything else reaching the CLI is a bug in diffrl and is reported as one.
"""

from __future__ import annotations

import reprlib

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


class RewardError(DiffrlError, RuntimeError):
    """A reward raised or returned something unusable."""


QUOTE_LIMIT = 200
"""The most characters of a user's value an error message quotes (a value may be megabytes)."""


def quoted(value: object, limit: int = QUOTE_LIMIT) -> str:
    """``repr(value)`` for an error message, cut to about ``limit`` characters with the length of
    what was left out (``'aaaa...' (+999,800 characters)``). Never expands a huge value first: a
    string is cut before its repr, a container's repr is built by :mod:`reprlib` (bounded by
    its element and depth limits), so a YAML alias bomb or a megabyte override costs nothing."""
    if isinstance(value, str):
        if len(value) <= limit:
            return repr(value)
        return f"{value[:limit]!r}... (+{len(value) - limit:,} characters)"
    if isinstance(value, bytes | bytearray):
        if len(value) <= limit:
            return repr(value)
        return f"{bytes(value[:limit])!r}... (+{len(value) - limit:,} bytes)"
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 3 * limit:
        # str() of a huge int is slow, and refused past 4,300 digits
        return f"an integer of about {int(value.bit_length() * 0.30103) + 1:,} digits"
    text = _SHORT.repr(value) if isinstance(value, list | tuple | dict | set | frozenset) else repr(value)
    return text if len(text) <= limit + 20 else f"{text[:limit]}... ({len(text):,} characters)"


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxtuple, _SHORT.maxdict = 3, 8, 8, 8
_SHORT.maxset, _SHORT.maxfrozenset, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 8, 8, 60, 60, 60
