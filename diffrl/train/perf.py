"""The driver's metrics helpers: an iteration's times and MFU, the end-of-run stage summary, the
metrics echoed to the terminal and the training bar's postfix."""

from __future__ import annotations

import time

from diffrl.core.rollout import RolloutStats
from diffrl.logging import console


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric over the optimizer steps of one iteration: the mean, but for times
    (``perf/...``), which add up."""
    if not rows:
        return {}
    return {k: sum(r[k] for r in rows) / (1 if k.startswith("perf/") else len(rows)) for k in rows[0]}


STAGES = (
    (
        "rollout",
        "perf/rollout_time",
        (
            ("encode", "perf/rollout_encode_time"),
            ("denoise", "perf/rollout_denoise_time"),
            ("decode", "perf/rollout_decode_time"),
        ),
    ),
    ("reward wait", "perf/reward_wait_time", ()),
    (
        "training",
        None,
        (
            ("before update", "perf/before_update_time"),
            ("forward+backward", "perf/train_forward_backward_time"),
            ("optimizer", "perf/optimizer_time"),
        ),
    ),
    ("weight sync", "perf/weight_sync_time", ()),
    ("waiting for the rollout ahead", "perf/rollout_wait_time", ()),  # train.off_policy_steps: 1
)
"""The stages of an iteration in the end-of-run summary: (name, its metric or None for the sum of
its parts, its parts)."""


MFU_PARTS = (
    ("rollout", "perf/rollout_flops", "perf/rollout_denoise_time"),
    ("train", "perf/train_flops", "perf/train_forward_backward_time"),
)
"""Each ``perf/<name>_mfu``: model FLOPs over the seconds of the stage that did them."""


MFU_STAGES = {"rollout": "rollout", "training": "train"}
"""The MFU part (:data:`MFU_PARTS`) shown with each stage of :func:`stage_summary`."""


def stage_rates(metrics: dict[str, float]) -> dict[str, float]:
    """The model FLOP/s of each stage of :data:`MFU_PARTS` that did FLOPs in ``metrics``
    (engine-seconds on Ray: a per-device figure)."""
    return {
        name: metrics[flops] / metrics[seconds]
        for name, flops, seconds in MFU_PARTS
        if metrics.get(flops) and metrics.get(seconds)
    }


def mfu_metrics(metrics: dict[str, float], peak_flops: float | None) -> dict[str, float]:
    """``perf/rollout_mfu`` and ``perf/train_mfu``: the model FLOPs an iteration's stage did per
    second, as a fraction of the device's peak."""
    if not peak_flops:
        return {}
    return {f"perf/{name}_mfu": rate / peak_flops for name, rate in stage_rates(metrics).items()}


def rate_text(flops: float) -> str:
    return f"{flops / 1e12:.1f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


class MfuPeak:
    """The yardstick of ``perf/*_mfu``: the runner's peak FLOP/s (``run.peak_tflops``, a GPU's
    datasheet, or matmuls measured after the first iteration: ``models.numerics.peak_flops``), raised
    to the rate a stage achieved whenever one beats it, so no MFU reads above 100%.

    A utilisation above 100% says only that the yardstick is wrong: a measured peak reads low on a
    busy machine, and a stated one can be off, or the FLOPs overcounted. A stage that ran faster
    than the peak proves the peak was at least that rate, so the peak becomes that rate (that
    stage's MFU is 100%) and every later MFU is against it; the first raise prints one line saying
    so. The rows logged before a raise keep their MFU against the lower peak of their time (each
    at most 100%); the end-of-run :func:`stage_summary` recomputes every iteration's MFU against the
    final peak, so its means share one yardstick. The driver owns one for a run (a resumed run
    starts again from the runner's figure)."""

    def __init__(self, runner: object):
        self.runner = runner
        self.stated: float | None = None
        """The runner's own figure (None: it gives none, or not yet)."""
        self.flops: float | None = None
        """What MFU is against: the highest of the runner's figure and the stages' rates so far."""
        self.said = False
        """Whether the raise was said (the line prints once)."""

    @property
    def raised(self) -> bool:
        """Whether a stage's rate beat the runner's figure."""
        return self.flops is not None and self.stated is not None and self.flops > self.stated

    def update(self, metrics: dict[str, float]) -> float | None:
        """The peak for an iteration's ``metrics``: raised to its stages' rates where they beat it."""
        self.stated = peak_of(self.runner)
        if self.stated is None:
            return self.flops
        before = max(self.stated, self.flops or 0.0)
        rates = stage_rates(metrics)
        self.flops = max([before, *rates.values()])
        if self.flops > before and not self.said:
            self.said = True
            stage = max(rates, key=rates.get)
            console(  # above the progress bars
                f"MFU peak raised from {rate_text(before)} to {rate_text(self.flops)}: the {stage} stage "
                "ran faster than the peak, which was low (a measured one reads low on a busy machine); "
                "perf/*_mfu are against the fastest rate seen from here on, never above 100%"
            )
        return self.flops


def stage_summary(
    history: list[dict[str, float]], evals: list[dict[str, float]], peak: MfuPeak | None = None
) -> str:
    """One line: the mean seconds per iteration of each stage (and of its parts, those of at least
    5 ms) over ``history`` (the iterations' metrics), then the mean seconds per eval. Stages a run
    did not have are left out (no weight sync in one process, no reward wait for SFT). With the
    run's ``peak``, the rollout and training stages show their mean MFU, each iteration's against
    the final peak (and the line names it when a stage's rate raised it)."""
    if not history:
        return "stage times: no iteration ran"

    def mean(key: str) -> float | None:
        values = [row[key] for row in history if key in row]
        return sum(values) / len(history) if values else None

    parts_out = []
    for name, key, parts in STAGES:
        measured = [(label, m) for label, k in parts if (m := mean(k)) is not None]
        total = mean(key) if key is not None else (sum(m for _, m in measured) if measured else None)
        if total is None:
            continue
        shown = [(label, m) for label, m in measured if m >= 0.005]  # what rounds to 0.00 is noise
        labels = [f"{label} {m:.2f}" for label, m in shown]
        part, mfu = MFU_STAGES.get(name), []
        if part and peak is not None and peak.flops:  # every iteration against the final peak
            mfu = [rates[part] / peak.flops for rates in map(stage_rates, history) if part in rates]
        if mfu:
            labels.append(f"MFU {sum(mfu) / len(mfu):.1%}")
        detail = f" ({', '.join(labels)})" if labels else ""
        parts_out.append(f"{name} {total:.2f} s{detail}")
    if not parts_out:
        return f"stage times: none recorded in {len(history)} iteration(s)"
    line = f"seconds per iteration (mean of {len(history)}): " + "; ".join(parts_out)
    eval_times = [e["perf/eval_time"] for e in evals if "perf/eval_time" in e]
    if eval_times:
        line += f"; eval {sum(eval_times) / len(eval_times):.2f} s each ({len(eval_times)} evals)"
    if peak is not None and peak.raised:
        line += (
            f"; MFU against {rate_text(peak.flops)}, raised from {rate_text(peak.stated)} by a stage's rate"
        )
    return line


def progress_postfix(metrics: dict[str, float]) -> dict[str, float]:
    """What the training bar shows after it: the rollout's mean reward (the loss, for an algorithm
    without a reward) and the last iteration's seconds (evals left out; the bar's own rate counts them)."""
    shown = {}
    if "rollout/reward/raw_mean" in metrics:
        shown["reward"] = metrics["rollout/reward/raw_mean"]
    elif "train/loss" in metrics:
        shown["loss"] = metrics["train/loss"]
    if "perf/iteration_time" in metrics:
        shown["last_iter_s"] = metrics["perf/iteration_time"]
    return shown


SHOWN = [
    "rollout/reward/raw_mean",
    "train/loss",
    "train/grad_norm",
    "train/log_prob_mean_abs_diff",
    "perf/iteration_time",
]
"""The metrics echoed to the terminal (every metric goes to ``metrics.jsonl``)."""


def iteration_perf(
    metrics: dict[str, float], stats: RolloutStats, peak_flops: float | None, t0: float
) -> dict[str, float]:
    """An iteration's times (``perf/rollout_time``, ``perf/reward_wait_time``, and
    ``perf/iteration_time`` since ``t0``) and its MFU (:func:`mfu_metrics`, from ``metrics``)."""
    out = {"perf/rollout_time": stats.sampling_time, "perf/reward_wait_time": stats.reward_wait_time}
    out.update(mfu_metrics({**metrics, **out}, peak_flops))
    out["perf/iteration_time"] = time.time() - t0
    return out


def peak_of(runner: object) -> float | None:
    """The runner's device peak FLOP/s, when it says (``peak_flops`` is optional for a user's runner)."""
    peak = getattr(runner, "peak_flops", None)
    return peak() if peak else None
