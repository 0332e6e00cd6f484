"""SIGTERM and SIGINT during training: finish what is safe to finish, save, exit.

A preempted job (SLURM, Kubernetes) gets SIGTERM and a grace period; Ctrl-C sends SIGINT. The
first one is only noted (the handler never raises: an exception landing at an arbitrary bytecode
could leave EMA weights swapped in or an adapter switched). The driver asks at safe points: a
rollout in progress stops before its next micro-group (it is recomputed exactly on resume: every
draw is keyed by the iteration), an optimizer update or an eval in progress runs to the end of
its iteration. The driver then saves a checkpoint and raises :class:`~diffrl.core.errors.Interrupted`.
A second signal stops at once (SIGINT as ``KeyboardInterrupt``, SIGTERM with its default action).
"""

from __future__ import annotations

import signal
import sys
import threading

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopSignals:
    def __init__(self):
        self.received: int | None = None
        self._previous: dict[int, object] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name if self.received else ""

    def requested(self) -> bool:
        """True once a stop signal arrived (what the runners poll between micro-groups)."""
        return self.received is not None

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
            previous = self._previous.get(signum)
            signal.signal(signum, signal.SIG_DFL)
            if signum == signal.SIGINT:
                if callable(previous):  # the command line's (it marks the Ctrl-C as real) or Python's
                    previous(signum, frame)
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
