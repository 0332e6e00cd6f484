"""The driver's stage helpers: gathering a rollout's scored micro-groups, its metrics, splitting it
into optimizer steps, the eval/save schedule, the state a checkpoint keeps for the driver, and the
batch arithmetic printed at start-up."""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from diffrl.config import Config, TrainConfig
from diffrl.config.schema import MonitorConfig
from diffrl.core.errors import Interrupted
from diffrl.core.rollout import CollectionSpec, RewardScores, RolloutBatch, RolloutStats, TrainExamples
from diffrl.core.seeding import generator
from diffrl.logging import MetricsLogger, Progress
from diffrl.rewards.base import RewardOutput
from diffrl.train.evaluate import EvalResult, eval_grid_path
from diffrl.train.guard import Guard
from diffrl.train.monitors import clip_metrics, collapse_warning, diversity_metrics
from diffrl.train.run_folder import write_atomic
from diffrl.train.runner import PendingScore, Runner


class Rollout:
    """A rollout's micro-groups and their pending scores, added as they arrive (in any order)."""

    def __init__(self) -> None:
        self.start = time.time()
        self.parts: list[tuple[RolloutBatch, PendingScore | None]] = []

    def add(self, part: RolloutBatch, pending: PendingScore | None) -> None:
        self.parts.append((part, pending))

    def finish(self, bars: bool = True) -> tuple[RolloutBatch, RolloutStats]:
        """The rollout in micro-group order, with the rewards attached once every score is in
        (``bars``: show the scoring's progress; off for a rollout drawn in the background)."""
        stats = RolloutStats(sampling_time=time.time() - self.start)
        parts = sorted(self.parts, key=lambda p: int(p[0].micro_group[0]))
        batch = RolloutBatch.cat([part for part, _ in parts])
        if parts and parts[0][1] is not None:
            t0 = time.time()
            scored = []
            bar = Progress("scoring", len(parts), "group") if bars else None
            try:
                for _, pending in parts:  # the micro-groups' scores awaited
                    scored.append(pending.result())
                    if bar is not None:
                        bar.update(len(scored))
            finally:
                if bar is not None:
                    bar.close()
            out = RewardOutput.cat(scored)
            stats.reward_wait_time = time.time() - t0
            batch.rewards = out.total
            batch.reward_scores = RewardScores(out.per_reward)
            stats.errors = list(out.errors)
            stats.reward_failed = int((~torch.isfinite(out.total)).sum())
            # of the failed samples, those a reward's deadline failed (a hung or too slow reward)
            stats.metrics["rollout/reward_timed_out"] = float(out.timed_out.sum())
            stats.metrics.update(out.metrics("rollout/reward"))  # each reward's raw scores
        return batch, stats


def collect_rollout(
    runner: Runner, iteration: int, should_stop: Callable[[], bool] | None = None, bars: bool = True
) -> tuple[RolloutBatch, RolloutStats]:
    """Sample and score one rollout (the pipelined driver's background rollout; tests, benchmarks
    and tools)."""
    rollout = Rollout()
    for part in runner.sample(iteration, should_stop):
        rollout.add(part, runner.score(part))
    return rollout.finish(bars)


def rollout_metrics(
    batch: RolloutBatch,
    stats: RolloutStats,
    iteration: int,
    monitor: MonitorConfig | None = None,
    base_spread: float | None = None,
) -> dict[str, float]:
    """The rollout's reward statistics (failed samples are counted, not averaged) and its
    diversity monitors (:mod:`diffrl.train.monitors`, thresholds ``monitor`` and ``base_spread``,
    the run's first rollout's ``monitor/within_group_std``; a warning when the collapse alarm
    fires)."""
    metrics = {
        **reward_metrics(batch, stats, iteration),
        **diversity(batch, iteration, monitor, base_spread),
    }
    line = collapse_warning(metrics, iteration, monitor)
    if line is not None:
        warnings.warn(line, stacklevel=2)
    return metrics


def diversity(
    batch: RolloutBatch,
    iteration: int,
    monitor: MonitorConfig | None = None,
    base_spread: float | None = None,
) -> dict[str, float]:
    """The monitors of the samples whose reward could be had (all of them without rewards); the
    CLIP ones on the iterations ``monitor.clip_every`` picks."""
    if batch.images is None:
        return {}
    ok = (
        torch.isfinite(batch.rewards)
        if batch.rewards is not None
        else torch.ones(len(batch), dtype=torch.bool)
    )
    images, group_id = batch.images[ok], batch.group_id[ok]
    return {
        **diversity_metrics(images, group_id, monitor, base_spread),
        **clip_metrics(images, group_id, iteration, monitor),
    }


def reward_metrics(batch: RolloutBatch, stats: RolloutStats, iteration: int) -> dict[str, float]:
    if stats.errors:
        late = int(stats.metrics.get("rollout/reward_timed_out", 0))
        warnings.warn(
            f"iteration {iteration}: {stats.reward_failed} sample(s) dropped: {stats.errors[0]}"
            + (f" (and {len(stats.errors) - 1} more error(s))" if len(stats.errors) > 1 else "")
            + (
                f"; {late} of them missed a reward's deadline (rewards[].timeout_s): which ones do "
                "depends on the machine's load, so from here this run does not reproduce bit for bit"
                if late
                else ""
            ),
            stacklevel=2,
        )
    metrics = dict(stats.metrics)
    if batch.policy_version is not None and len(batch):
        stale = iteration - batch.policy_version
        metrics["rollout/staleness_mean"] = stale.double().mean().item()
        metrics["rollout/staleness_max"] = float(stale.max())
    if batch.rewards is None:
        return metrics
    ok = torch.isfinite(batch.rewards)
    failed = {
        "rollout/reward_failed": float(stats.reward_failed),
        "rollout/reward_failed_frac": stats.reward_failed / max(len(batch), 1),
    }
    if not ok.any():
        return {**failed, **metrics}
    r, group_id = batch.rewards[ok], batch.group_id[ok]
    groups = group_id.unique()
    zero = sum(bool((r[group_id == g] == r[group_id == g][0]).all()) for g in groups)
    return {
        "rollout/reward/raw_mean": r.mean().item(),
        "rollout/reward/raw_std": r.std(unbiased=False).item(),
        "rollout/reward/raw_min": r.min().item(),
        "rollout/reward/raw_max": r.max().item(),
        "rollout/zero_std_ratio": zero / len(groups),
        **failed,
        **metrics,
    }


def scored_samples(batch: RolloutBatch) -> RolloutBatch:
    """The samples whose reward could be had (all of them for reward-free algorithms)."""
    if batch.rewards is None:
        return batch
    return batch.select(torch.nonzero(torch.isfinite(batch.rewards)).flatten())


def optimizer_steps(batch: RolloutBatch, examples: TrainExamples, n_steps: int, seed: int, iteration: int):
    """Split a rollout's examples into ``n_steps`` optimizer steps by whole micro-groups, in an
    order shuffled by (seed, iteration)."""
    if n_steps == 1:
        return [examples]
    groups = batch.micro_group.unique()
    order = groups[torch.randperm(len(groups), generator=generator(seed, "shuffle", iteration))]
    rank = torch.empty(int(groups.max()) + 1, dtype=torch.long)
    rank[order] = torch.arange(len(order))
    samples = sorted(range(len(batch)), key=lambda i: (rank[batch.micro_group[i]].item(), i))
    per_step = -(-len(samples) // n_steps)
    chunks = [
        torch.tensor(samples[k * per_step : (k + 1) * per_step], dtype=torch.long) for k in range(n_steps)
    ]
    return [
        examples.select(torch.nonzero(torch.isin(examples.sample_id, c)).flatten()) for c in chunks if len(c)
    ]


def mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each metric over the optimizer steps of one iteration: the mean, but for times
    (``perf/...``), which add up."""
    if not rows:
        return {}
    return {k: sum(r[k] for r in rows) / (1 if k.startswith("perf/") else len(rows)) for k in rows[0]}


@dataclass(frozen=True)
class Due:
    """What follows the iteration just finished."""

    last: bool
    """The run ends here (``train.iterations`` reached or the time budget spent): eval and save
    ``final``."""
    eval: bool
    save: bool


def due_after(t: TrainConfig, step: int, train_time_s: float) -> Due:
    """The one schedule of evals and checkpoints: every ``eval_every`` / ``save_every`` iterations,
    and both at the end (``train_time_s``: this process's training time, for the budget)."""
    budget = t.time_budget_minutes * 60 if t.time_budget_minutes else float("inf")
    last = step >= t.iterations or train_time_s >= budget
    return Due(
        last=last,
        eval=last or bool(t.eval_every and step % t.eval_every == 0),
        save=last or bool(t.save_every and step % t.save_every == 0),
    )


def describe_batches(config: Config, spec: CollectionSpec, runner: Runner) -> str:
    """The batch arithmetic, printed at start-up."""
    t, r = config.train, config.rollout
    head, *notes = runner.describe().split("\n")  # the notes: speed options the device could not do
    lines = [
        f"{head} ({'LoRA r=' + str(config.model.lora.rank) if config.model.lora else 'full transformer'}); {t.iterations} iterations",
        *notes,
    ]
    if spec.online:
        k = (
            len(spec.step_strategy(config.sampling.num_steps, 0, config.run.seed))
            if spec.step_strategy and spec.keep_trajectory
            else 0
        )
        mg = r.micro_group_size or t.micro_batch_size
        lines.append(
            f"rollout: {r.batch_size} prompts x {r.n_samples_per_prompt} samples = {r.batch_size * r.n_samples_per_prompt} "
            f"trajectories of {config.sampling.num_steps} steps, in micro-groups of {mg}"
        )
        per_step = f"{t.batch_size} samples" + (
            f" x {k} trained steps = {t.batch_size * k} pairs" if k else ""
        )
        lines.append(
            f"optimizer: {r.num_steps_per_rollout} step(s) per rollout, each {per_step}, in micro-batches of {t.micro_batch_size}"
        )
    else:
        lines.append(
            f"optimizer: 1 step per iteration of {t.batch_size} examples, in micro-batches of {t.micro_batch_size}"
        )
    return "batch arithmetic:\n  " + "\n  ".join(lines)


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


def micro_group_count(config: Config, spec: CollectionSpec) -> int:
    """How many micro-groups a rollout yields (an offline algorithm's examples come as one)."""
    if not spec.online:
        return 1
    r = config.rollout
    mg = r.micro_group_size or config.train.micro_batch_size
    return -(-r.batch_size * r.n_samples_per_prompt // mg)


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


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Path
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


@dataclass
class LoopState:
    """What a checkpoint keeps for the driver (``checkpoint.json``'s ``loop``), so a resumed run
    goes on where it stopped: the eval history, the training time so far, the guard's counters,
    the first rollout's ``monitor/within_group_std`` (the collapse alarm's reference)."""

    evals: list[dict[str, float]]
    train_time_s: float
    guard: Guard
    base_spread: float | None = None

    @classmethod
    def resumed(cls, info: dict[str, Any] | None, t: TrainConfig) -> LoopState:
        loop = info["loop"] if info else {}
        guard = Guard(t.max_failed_iterations, t.max_nonfinite_steps, loop.get("guard"))
        # a checkpoint written before the reference was kept: its run's first rollout is gone,
        # and a later one may be collapsed already: 0.0, no relative threshold for this run
        spread = loop.get("base_spread", 0.0 if info else None)
        return cls(
            list(loop.get("evals", [])),
            float(loop.get("train_time_s", 0.0)),
            guard,
            float(spread) if isinstance(spread, int | float) else None,
        )

    def saved(self, final: bool) -> dict[str, Any]:
        return {
            "evals": self.evals,
            "train_time_s": self.train_time_s,
            "final": final,
            "guard": self.guard.state(),
            "base_spread": self.base_spread,
        }

    def record_eval(
        self,
        step: int,
        result: EvalResult,
        out: Path,
        grid_images: int,
        logger: MetricsLogger,
        seconds: float | None = None,
    ) -> None:
        """Keep an eval point: its grid image (each sample captioned with its prompt and reward),
        its metrics (logged, the grid too) and ``eval_curve.json``; ``seconds``: how long the eval
        took (``perf/eval_time``)."""
        grid = result.save_grid(eval_grid_path(out, step), grid_images)
        logger.log_image(step, "eval/grid", grid)
        metrics = result.metrics()
        if seconds is not None:
            metrics["perf/eval_time"] = seconds
        logger.log(step, metrics)
        self.evals.append({"step": step, "train_time_s": round(self.train_time_s, 2), **metrics})
        write_atomic(out / "eval_curve.json", json.dumps(self.evals, indent=1))


def interrupted_error(signal_name: str, step: int, saved: Path | None) -> Interrupted:
    """The error a stopped run ends with: where it stopped and how to go on."""
    if saved is None:
        return Interrupted(f"{signal_name} received before the first iteration finished: nothing to save")
    return Interrupted(
        f"{signal_name} received: stopped after iteration {step}, checkpoint {saved}; continue with "
        "the same command and train.resume=latest",
        str(saved),
    )
