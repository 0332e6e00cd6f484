"""``train.off_policy_steps: 1``: the next rollout is drawn and scored while the ranks train.

```
iteration i:   take rollout i (drawn with the weights of i-1) -> end_rollout: the engines take
               the weights of i -> launch rollout i+1 (background) -> train on rollout i
```

Rollout i+1 is drawn with the weights the trainer had before its update of iteration i, so
every sample trains one update after the weights that drew it (``rollout/staleness`` 1; the first
rollout is drawn with the initial weights, staleness 0). The engines take new weights only while
no rollout is in flight, so each rollout is drawn with one version, and its draws are keyed by
(seed, prompt slot, sample, step) as always: a pipelined run is as reproducible as a synchronous
one. A checkpoint keeps the weights of the rollout in flight
(:data:`~diffrl.train.checkpoint.ROLLOUT_WEIGHTS`): the resumed run draws it again, bit for bit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from diffrl.core.errors import Abandoned
from diffrl.core.rollout import RolloutBatch, RolloutStats
from diffrl.train.gather import collect_rollout
from diffrl.train.runner import Runner


class RolloutAhead:
    """At most one rollout in flight on a background thread of the driver (Ray's calls are
    thread-safe; the runner's rollout side and training side do not share state)."""

    def __init__(self, runner: Runner, should_stop: Callable[[], bool]):
        self.runner, self.should_stop = runner, should_stop
        self.cancelled = threading.Event()
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="diffrl-rollout")
        self.pending: tuple[int, Future] | None = None

    def _stop(self) -> bool:
        return self.cancelled.is_set() or self.should_stop()

    def launch(self, iteration: int) -> None:
        if self.pending is not None:
            raise RuntimeError(f"rollout {self.pending[0]} is still in flight")
        self.pending = (
            iteration,
            self.pool.submit(collect_rollout, self.runner, iteration, self._stop, False),
        )

    def take(self, iteration: int) -> tuple[RolloutBatch, RolloutStats, float]:
        """Rollout ``iteration`` (launched now if it is not in flight: the first one, or the first
        after a resume), once drawn and scored; and the seconds waited for it."""
        if self.pending is None:
            self.launch(iteration)
        launched, future = self.pending  # type: ignore[misc]
        if launched != iteration:
            raise RuntimeError(f"rollout {launched} is in flight, and iteration {iteration} wants its own")
        t0 = time.time()
        try:
            batch, stats = future.result()
        finally:
            self.pending = None
        return batch, stats, time.time() - t0

    def next(self, iteration: int, iterations: int) -> tuple[RolloutBatch, RolloutStats, dict[str, float]]:
        """Rollout ``iteration`` (:meth:`take`); then, nothing being in flight, the engines take the
        weights of ``iteration`` (``runner.end_rollout``) and rollout ``iteration + 1`` is launched
        (unless ``iteration`` is the run's last of ``iterations``). The rollout side's metrics come
        with the seconds waited (``perf/rollout_wait_time``)."""
        batch, stats, waited = self.take(iteration)
        side = self.runner.end_rollout()
        if iteration + 1 < iterations:
            self.launch(iteration + 1)
        return batch, stats, {**side, "perf/rollout_wait_time": waited}

    def close(self) -> None:
        """Stop the rollout in flight (if any) at its next micro-group and wait for the thread."""
        self.cancelled.set()
        if self.pending is not None:
            try:
                self.pending[1].result()
            except (Exception, Abandoned):  # given up on purpose: its result is not wanted
                pass
            self.pending = None
        self.pool.shutdown(wait=True)
