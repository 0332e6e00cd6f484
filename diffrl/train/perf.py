"""The driver's metrics helpers: an iteration's times and MFU, the end-of-run stage summary, the
metrics echoed to the terminal and the training bar's postfix."""

from __future__ import annotations

import time

from diffrl.core.rollout import RolloutStats


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


MFU_KEYS = {"rollout": "perf/rollout_mfu", "training": "perf/train_mfu"}
"""The MFU shown with each stage of :func:`stage_summary`."""


def mfu_metrics(metrics: dict[str, float], peak_flops: float | None) -> dict[str, float]:
    """``perf/rollout_mfu`` and ``perf/train_mfu``: the model FLOPs an iteration's stage did per
    second, as a fraction of the device's peak (engine-seconds on Ray: a per-device figure)."""
    out = {}
    for name, flops, seconds in MFU_PARTS:
        if peak_flops and metrics.get(flops) and metrics.get(seconds):
            out[f"perf/{name}_mfu"] = metrics[flops] / metrics[seconds] / peak_flops
    return out


def stage_summary(history: list[dict[str, float]], evals: list[dict[str, float]]) -> str:
    """One line: the mean seconds per iteration of each stage (and of its parts, those of at least
    5 ms) over ``history`` (the iterations' metrics), then the mean seconds per eval. Stages a run
    did not have are left out (no weight sync in one process, no reward wait for SFT)."""
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
        mfu = [row[k] for row in history if (k := MFU_KEYS.get(name)) and k in row]
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
