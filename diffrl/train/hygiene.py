"""Plugin hygiene around the driver's calls: what an algorithm (a user's dotted path, or diffrl's
own) does to torch's process-wide settings, and what its methods return, is checked where the
driver calls it, so a plugin's mistake is named as the plugin's and stops the run at that call.

- :class:`CheckedAlgorithm`: the algorithm's two driver-side calls (``postprocess_rewards``,
  ``build_train_data``) under :func:`diffrl.core.torch_state.guarding` and the return checks of
  :mod:`diffrl.algorithms.returns`; the session builds it around the run's algorithm.
- :func:`settings_kept`: the catch-all for code that runs in no guarded call (a model family's
  forward, a callback of a plugin's own): torch's settings after an iteration are those before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.algorithms.returns import checked_examples, checked_signals
from diffrl.core import torch_state
from diffrl.core.rollout import RolloutBatch, TrainExamples, TrainSignals
from diffrl.core.user_code import plugin_named, plugin_paths


class CheckedAlgorithm:
    """The driver's view of ``algorithm``: the same calls, each guarded and its return checked."""

    def __init__(self, algorithm: DiffusionAlgorithm):
        self.algorithm = algorithm

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        with torch_state.guarding(lambda: plugin_named(self.algorithm)):
            signals = self.algorithm.postprocess_rewards(batch, rewards)
        return checked_signals(self.algorithm, signals, len(batch))

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> TrainExamples:
        with torch_state.guarding(lambda: plugin_named(self.algorithm)):
            examples = self.algorithm.build_train_data(batch, signals, iteration)
        return checked_examples(self.algorithm, "build_train_data()", examples)


@contextmanager
def settings_kept(iteration: int) -> Iterator[None]:
    """Around iteration ``iteration``: torch's process-wide settings are what they were before it,
    or they are put back and the run stops naming the plugins it imported."""
    before = torch_state.current()
    yield
    what = torch_state.changes(before, torch_state.current())
    if what:
        torch_state.restore(before)
        plugins = ", ".join(repr(p) for p in plugin_paths()) or "none: a bug in diffrl"
        raise torch_state.changed_error(
            f"code run in iteration {iteration} (the run's plugins: {plugins})", what
        )
