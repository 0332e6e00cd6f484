"""A run's trust in one object the session owns (``docs/trust.md``): what tells a user whether to
believe the gains a run prints, and what stops a run that wastes its compute.

```
rollout    rollout_monitors(batch, it)   the diversity monitors (monitors.py) and the collapse alarm;
                                          the first rollout's spread is the alarm's reference
           rollout(usable, errors)       every sample's reward failing N iterations in a row: stop (guard.py)
optimise   optimized(steps, last_saved)  N non-finite optimizer steps in a row: stop (guard.py)
eval       after_eval(step, result)      the watched rewards' paired gains and the reward-hacking
                                          alarm (alarms.py), keep-best (best.py): a Verdict
end        finished(iterations)          a run that took no optimizer step writes no final checkpoint
save       state()                       what a checkpoint keeps of all of the above
```

The driver calls these at its stages; each decision is the object's, so a resumed run (built from
the checkpoint's ``state()``) decides exactly as an uninterrupted one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from diffrl.config import Config
from diffrl.core.errors import quoted
from diffrl.core.rollout import RolloutBatch
from diffrl.evaluation.evaluate import EvalResult
from diffrl.trust.alarms import Watch
from diffrl.trust.best import Best
from diffrl.trust.guard import Guard
from diffrl.trust.monitors import clip_metrics, collapse_warning, diversity_metrics


@dataclass
class Verdict:
    """What an eval decided (:meth:`Trust.after_eval`)."""

    metrics: dict[str, float] = field(default_factory=dict)
    """The paired gains of the eval total and the watched rewards, ``alarm/reward_hacking``,
    ``keep_best/*`` (also added to the eval's own metrics)."""
    moved: bool = False
    """``checkpoints/best`` moves to this eval's weights (``train.keep_best``)."""


class Trust:
    """The watched rewards and their alarm, keep-best, the monitors and the guard of one run."""

    def __init__(self, config: Config, loop: dict[str, Any] | None = None):
        """``loop``: the ``loop`` state of the checkpoint a run resumes from (None: a fresh run)."""
        t, e = config.train, config.eval
        self.config = config
        saved = loop or {}
        self.guard = Guard(t.max_failed_iterations, t.max_nonfinite_steps, saved.get("guard"))
        # a checkpoint written before the reference was kept: its run's first rollout is gone,
        # and a later one may be collapsed already: 0.0, no relative threshold for this run
        spread = saved.get("base_spread", 0.0 if loop is not None else None)
        self.base_spread = float(spread) if isinstance(spread, int | float) else None
        """The first rollout's ``monitor/within_group_std`` (the collapse alarm's reference)."""
        self.watch = Watch.resumed(e.watch_alarm, saved.get("watch"))
        self.best = Best.resumed(t.keep_best, saved.get("best")) if t.keep_best is not None else None

    # ---- rollout and optimise ---------------------------------------------------------------------
    def rollout_monitors(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """The diversity monitors (``monitor/*``, ``alarm/collapse``) of the samples whose reward
        could be had (all of them without rewards); the CLIP ones on the iterations
        ``monitor.clip_every`` picks; a warning when the collapse alarm fires."""
        if batch.images is None:
            return {}
        monitor = self.config.monitor
        ok = (
            torch.isfinite(batch.rewards)
            if batch.rewards is not None
            else torch.ones(len(batch), dtype=torch.bool)
        )
        images, group_id = batch.images[ok], batch.group_id[ok]
        metrics = {
            **diversity_metrics(images, group_id, monitor, self.base_spread),
            **clip_metrics(images, group_id, iteration, monitor),
        }
        line = collapse_warning(metrics, iteration, monitor)
        if line is not None:
            warnings.warn(line, stacklevel=2)
        if self.base_spread is None and "monitor/within_group_std" in metrics:
            self.base_spread = metrics["monitor/within_group_std"]
        return metrics

    def rollout(self, usable: int, errors: list[str]) -> None:
        """Stop the run when every sample's reward failed too many iterations in a row."""
        self.guard.rollout(usable, errors)

    def optimized(self, steps: list[dict[str, float]], last_saved: Path | None) -> None:
        """Stop the run after too many non-finite optimizer steps in a row."""
        self.guard.optimized(steps, last_saved)

    def finished(self, iterations: int) -> None:
        """``iterations``: how many this process ran; none of them trained: the run stops."""
        self.guard.finished(iterations)

    # ---- eval -------------------------------------------------------------------------------------
    def eval_due(self, step: int) -> bool:
        """Whether keep-best wants an eval after ``step`` (besides ``train.eval_every``'s)."""
        return self.best is not None and self.best.due(step)

    def after_eval(self, step: int, result: EvalResult) -> Verdict:
        """The eval at ``step`` against the run's others: the watch curves' paired gains and the
        alarm (a warning per alarm fired), and whether it is the new best; its metrics are added
        to ``result.extra``."""
        scores = result.per_sample()
        metrics, alarms = self.watch.observe(step, scores)
        e = self.config.eval
        for alarm in alarms:  # alarms exist only with eval.watch_alarm set
            trained = ", ".join(quoted(r.name, 60) for r in e.rewards)
            warnings.warn(alarm.message(e.watch_alarm, trained), stacklevel=2)
        moved, best = False, self.best
        if best is not None and (best.due(step) or best.iteration < 0):
            moved, kept = best.consider(step, scores)
            metrics.update(kept)
        result.extra.update(metrics)
        return Verdict(metrics, moved)

    @property
    def stop(self) -> bool:
        """The reward-hacking alarm fired with ``eval.watch_alarm.stop``: the run ends as at its
        time budget (eval, save, report)."""
        return self.watch.stop

    # ---- save -------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (``checkpoint.json``'s ``loop``, beside the driver's own)."""
        best = {"best": self.best.state()} if self.best is not None else {}
        return {
            "guard": self.guard.state(),
            "base_spread": self.base_spread,
            "watch": self.watch.state(),
            **best,
        }
