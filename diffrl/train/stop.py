"""SIGTERM and SIGINT during training: finish the optimizer step in progress, save, exit.

A preempted job (SLURM, Kubernetes) gets SIGTERM and a grace period; Ctrl-C sends SIGINT. The
first one is noted: an optimizer update in progress runs to the end of its iteration (its
weights cannot be saved half-updated), while a rollout or an eval in progress is abandoned at
once (it is recomputed exactly on resume: every draw is keyed by the iteration). The driver then
saves a checkpoint and raises :class:`~diffrl.errors.Interrupted`. A second signal stops at once
(SIGINT as ``KeyboardInterrupt``, SIGTERM with its default action).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Abandoned(BaseException):
    """Raised inside an interruptible phase when a stop signal arrives. A ``BaseException``, so
    code that catches ``Exception`` (a reward's error handling) does not swallow it."""


class StopSignals:
    def __init__(self):
        self.received: int | None = None
        self._interruptible = 0
        self._previous: dict[int, object] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():  # handlers only work there
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        if self.received is not None:  # the second one: stop now
            signal.signal(signum, signal.SIG_DFL)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.raise_signal(signum)
            return
        self.received = signum
        print(
            f"\n{signal.Signals(signum).name} received: finishing the current step, then saving a "
            "checkpoint (send it again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
        if self._interruptible:
            raise Abandoned

    @contextlib.contextmanager
    def interruptible(self):
        """A phase that a stop signal abandons at once (raising :class:`Abandoned`)."""
        if self.received is not None:
            raise Abandoned
        self._interruptible += 1
        try:
            yield
        finally:
            self._interruptible -= 1
