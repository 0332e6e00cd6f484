"""Held-out judges (``eval.watch``) and the reward-hacking alarm (``eval.watch_alarm``).

Every eval samples the same prompts with the same noise (:func:`diffrl.evaluation.evaluate.generate`),
so two evals of one run are paired sample by sample: the difference of their per-sample scores
has a standard error far smaller than either mean's (:func:`paired`). :class:`Watch` keeps the
per-sample scores of the run's first eval (the base, for each curve's gain and SE band) and of the
last ``window`` evals (for the alarm), and saves them in the checkpoint, so a resumed run decides
exactly as an uninterrupted one.

The alarm is the comparison reward-hacking reports make by eye (a trained reward that climbs while
a held-out judge of the same images drops, e.g. flow_grpo's GARDO discussion; DDPO's
jpeg-compressibility runs): at an eval, paired against the run's first eval (the base: a slow
slide) and against the eval ``window`` evals earlier (a sudden one), the eval total rose by more
than ``k_se`` paired SE while a watched reward fell by more than ``k_se`` paired SE **and** by more
than ``min_drop`` (in its own units). Significance alone is not enough: an eval of a few hundred
samples resolves falls of a few thousandths, and a trained reward that trades off against a judge
(brightness against contrast on the tiny world) makes such a fall in every run, regularised ones
included; ``min_drop`` is the size of fall a user calls hacking (``docs/results/hacking.md``
measures the default's false alarms and detections).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from diffrl.config.schema import WatchAlarmConfig

TOTAL = "eval/reward_mean"
"""The per-sample key of the eval total (the trained reward, as eval weighs it)."""
WATCH_PREFIX = "eval/watch/"
ALARM_METRIC = "alarm/reward_hacking"
MAX_PAIRED = 100_000
"""The most samples whose per-sample scores an eval keeps for pairing (in ``checkpoint.json``,
about 20 bytes each per reward and eval kept): a larger eval logs no paired gains, and
``train.keep_best`` / ``eval.watch_alarm`` refuse it."""


def paired(scores: torch.Tensor, baseline: torch.Tensor) -> tuple[float, float, int]:
    """Two evals' per-sample scores ``(N,)`` of the same prompts and noise -> the mean of their
    difference, its standard error and the pairs counted: samples a reward failed (NaN in either)
    are left out. The SE is NaN for fewer than 2 pairs, the mean for none."""
    if scores.shape != baseline.shape:
        raise ValueError(
            f"paired scores need equal shapes, got {tuple(scores.shape)} and {tuple(baseline.shape)}"
        )
    d = (scores.double() - baseline.double())[torch.isfinite(scores) & torch.isfinite(baseline)]
    n = len(d)
    mean = d.mean().item() if n else float("nan")
    se = d.std(unbiased=True).item() / n**0.5 if n > 1 else float("nan")
    return mean, se, n


def gain_name(key: str) -> str:
    """``eval/watch/aesthetic_mean`` -> ``eval/watch/aesthetic_gain`` (its paired gain's metric)."""
    return key.removesuffix("_mean") + "_gain"


def to_json(scores: torch.Tensor) -> list[float | None]:
    """Per-sample scores for ``checkpoint.json``: floats (float32 values round-trip exactly), None
    for a failed sample (JSON has no NaN)."""
    return [v if math.isfinite(v) else None for v in scores.double().tolist()]


def from_json(values: list[float | None]) -> torch.Tensor:
    return torch.tensor([float("nan") if v is None else float(v) for v in values], dtype=torch.float64)


@dataclass
class Alarm:
    """One firing: at ``step``, over the evals since ``since`` (the base's step or the eval
    ``window`` back), the trained reward rose by ``trained_gain`` while ``watched`` fell by
    ``-watched_gain`` (``watched_se`` its paired SE)."""

    step: int
    since: int
    watched: str
    trained_gain: float
    trained_se: float
    watched_gain: float
    watched_se: float

    def message(self, config: WatchAlarmConfig, trained: str = "") -> str:
        """The warning line; ``trained``: what the eval total sums (``eval.rewards``' names)."""
        total = f"eval total: {trained}" if trained else "eval total"
        return (
            f"reward-hacking alarm at iteration {self.step}: since iteration {self.since} the trained "
            f"reward ({total}) rose {self.trained_gain:+.4f} ± {self.trained_se:.4f} while the watched "
            f"reward {self.watched!r} fell {self.watched_gain:+.4f} ± {self.watched_se:.4f} (more than "
            f"{config.k_se:g} SE and more than min_drop {config.min_drop:g}, paired on the same prompts "
            "and seeds)"
        )


@dataclass
class Watch:
    """The per-sample scores the watch curves and the alarm compare (see the module docstring)."""

    alarm: WatchAlarmConfig | None
    base: dict[str, list[float | None]] | None = None
    base_step: int = 0
    recent: list[tuple[int, dict[str, list[float | None]]]] = field(default_factory=list)
    fired: list[dict[str, Any]] = field(default_factory=list)
    stop: bool = False
    """Set by :meth:`observe` when an alarm with ``stop: true`` fired: the driver ends the run."""

    @classmethod
    def resumed(cls, alarm: WatchAlarmConfig | None, saved: dict[str, Any] | None) -> Watch:
        if not saved:
            return cls(alarm)
        recent = [(int(s), dict(v)) for s, v in saved.get("recent", [])]
        return cls(
            alarm, saved.get("base"), int(saved.get("base_step", 0)), recent, list(saved.get("fired", []))
        )

    def state(self) -> dict[str, Any]:
        return {"base": self.base, "base_step": self.base_step, "recent": self.recent, "fired": self.fired}

    def observe(self, step: int, scores: dict[str, torch.Tensor]) -> tuple[dict[str, float], list[Alarm]]:
        """An eval at ``step`` with its per-sample ``scores`` (metric key -> ``(N,)``: the total
        under :data:`TOTAL`, watched rewards under ``eval/watch/<label>_mean``): the paired gains
        over the base (``..._gain``, ``..._gain_se``), ``alarm/reward_hacking`` when an alarm is
        set, and the alarms that fired."""
        keys = [
            k for k in scores if (k == TOTAL or k.startswith(WATCH_PREFIX)) and len(scores[k]) <= MAX_PAIRED
        ]
        now = {k: to_json(scores[k]) for k in keys}
        metrics: dict[str, float] = {}
        if self.base is None:
            self.base, self.base_step = now, step
        else:
            for k in keys:
                if k in self.base and len(self.base[k]) == len(now[k]):
                    gain, se, _ = paired(scores[k], from_json(self.base[k]))
                    metrics[gain_name(k)], metrics[gain_name(k) + "_se"] = gain, se
        alarms: list[Alarm] = []
        if self.alarm is not None:
            references = [] if self.base is now else [(self.base_step, self.base)]
            if len(self.recent) >= self.alarm.window:
                references.append(self.recent[-self.alarm.window])
            alarms = _strongest(_check(self.alarm, step, since, scores, then) for since, then in references)
            metrics[ALARM_METRIC] = 1.0 if alarms else 0.0
            self.recent = [*self.recent, (step, now)][-self.alarm.window :]
        for a in alarms:
            self.fired.append({"step": a.step, "since": a.since, "watched": a.watched})
        self.stop = bool(alarms) and self.alarm is not None and self.alarm.stop
        return metrics, alarms


def _check(
    alarm: WatchAlarmConfig,
    step: int,
    since: int,
    scores: dict[str, torch.Tensor],
    then: dict[str, list[float | None]],
) -> list[Alarm]:
    """The alarms of an eval at ``step`` (``scores``) against the one at ``since`` (``then``): the
    total rose by more than ``k_se`` paired SE, a watched reward fell by more than ``k_se`` of its
    paired SE and more than ``min_drop``."""
    if TOTAL not in scores or TOTAL not in then or len(then[TOTAL]) != len(scores[TOTAL]):
        return []
    t_gain, t_se, n = paired(scores[TOTAL], from_json(then[TOTAL]))
    if not (n > 1 and math.isfinite(t_se) and t_gain > alarm.k_se * t_se):
        return []
    out = []
    for k, now in scores.items():
        if not k.startswith(WATCH_PREFIX) or k not in then or len(then[k]) != len(now):
            continue
        w_gain, w_se, n = paired(now, from_json(then[k]))
        if n > 1 and math.isfinite(w_se) and -w_gain > max(alarm.k_se * w_se, alarm.min_drop):
            label = k.removeprefix(WATCH_PREFIX).removesuffix("_mean")
            out.append(Alarm(step, since, label, t_gain, t_se, w_gain, w_se))
    return out


def _strongest(found: Iterable[list[Alarm]]) -> list[Alarm]:
    """One alarm per watched reward, of the comparisons that fired for it the one with the largest
    fall (against the base, or the eval ``window`` back), in the order the rewards first fired."""
    best: dict[str, Alarm] = {}
    for alarms in found:
        for a in alarms:
            if a.watched not in best or a.watched_gain < best[a.watched].watched_gain:
                best[a.watched] = a
    return list(best.values())
