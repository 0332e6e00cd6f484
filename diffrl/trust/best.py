"""Keep the best checkpoint (``train.keep_best``): ``checkpoints/best`` moves only on a paired win.

Every ``every`` iterations the run evaluates (the eval that runs anyway when it falls there), and
the new weights' per-sample scores of ``metric`` are paired with the current best's (same prompts,
same noise: :func:`diffrl.trust.alarms.paired`). The best moves when the mean difference exceeds
its standard error: a gain within the noise keeps the earlier checkpoint, so the last of many
equally good checkpoints is not taken for an improvement. The first eval (the base model, or where
a run began keeping the best) is the first best, with no checkpoint: ``checkpoints/best`` appears
when some iteration beats it. The record (iteration, gain, SE, the best's scores) is saved in each
checkpoint, so a resumed run decides exactly as an uninterrupted one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from diffrl.config.schema import KeepBestConfig
from diffrl.core.errors import DiffrlError
from diffrl.trust.alarms import MAX_PAIRED, from_json, paired, to_json

BEST = "best"
"""The folder name under ``checkpoints/`` (and the target ``diffrl eval`` / ``export`` accept)."""


def beats(scores: torch.Tensor, best: torch.Tensor) -> tuple[bool, float, float]:
    """Whether ``scores`` beat ``best`` (paired per-sample scores ``(N,)``): their mean difference
    is above its standard error; with it the difference and the SE. Fewer than 2 scored pairs (no
    SE) never move the best."""
    gain, se, n = paired(scores, best)
    return n > 1 and math.isfinite(se) and gain > se, gain, se


@dataclass
class Best:
    """The current best of a run (see the module docstring): ``iteration`` -1 until the first eval."""

    config: KeepBestConfig
    iteration: int = -1
    gain: float = 0.0
    se: float = 0.0
    scores: list[float | None] | None = None
    saved: bool = False
    """Whether ``checkpoints/best`` holds it (False while the first eval's weights are the best)."""

    @classmethod
    def resumed(cls, config: KeepBestConfig, saved: dict[str, Any] | None) -> Best:
        if not saved:
            return cls(config)
        return cls(
            config,
            int(saved["iteration"]),
            float(saved["gain"]),
            float(saved["se"]),
            saved.get("scores"),
            bool(saved.get("saved", False)),
        )

    def state(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "gain": self.gain,
            "se": self.se,
            "scores": self.scores,
            "saved": self.saved,
        }

    def due(self, step: int) -> bool:
        """Whether iteration ``step`` is one to compare (an eval runs there)."""
        return step % self.config.every == 0

    def consider(self, step: int, scores: dict[str, torch.Tensor]) -> tuple[bool, dict[str, float]]:
        """The eval at ``step`` (per-sample ``scores`` by metric key): whether it becomes the best
        (the caller then saves ``checkpoints/best``), and the metrics to log (``keep_best/gain``,
        ``keep_best/gain_se``: this eval against the best before it; ``keep_best/iteration``)."""
        key = self.config.metric
        if key not in scores:  # the config names only metrics evals have: a run lacking it is a bug
            raise KeyError(f"train.keep_best.metric {key!r}: the eval has no such metric ({sorted(scores)})")
        now = scores[key]
        if (
            len(now) > MAX_PAIRED
        ):  # num_prompts: null over a long prompt file (a set size is refused up front)
            raise DiffrlError(
                f"train.keep_best pairs at most {MAX_PAIRED:,} eval samples and this eval drew {len(now):,}: "
                "set eval.num_prompts (or fewer eval.samples_per_prompt)"
            )
        if self.scores is None or len(self.scores) != len(now):
            self.iteration, self.scores, self.gain, self.se = step, to_json(now), 0.0, 0.0
            return False, {"keep_best/iteration": float(step)}
        moved, gain, se = beats(now, from_json(self.scores))
        if moved:
            self.iteration, self.scores, self.gain, self.se, self.saved = step, to_json(now), gain, se, True
        return moved, {
            "keep_best/gain": gain,
            "keep_best/gain_se": se,
            "keep_best/iteration": float(self.iteration),
        }
