"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval -> save."""

from __future__ import annotations

import json
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diffrl.algorithms.base import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config, dump_config
from diffrl.logging import MetricsLogger, Progress
from diffrl.seeding import generator
from diffrl.train.evaluate import plot_eval_curve, save_grid
from diffrl.train.runner import Runner, build_runner

SHOWN = [
    "rollout/reward/raw_mean",
    "train/loss",
    "train/grad_norm",
    "train/log_prob_mean_abs_diff",
    "perf/iteration_time",
]


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Path
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


def describe_batches(config: Config, spec: CollectionSpec, runner: Runner) -> str:
    t, r = config.train, config.rollout
    lines = [
        f"{runner.describe()} ({'LoRA r=' + str(config.model.lora.rank) if config.model.lora else 'full transformer'}); {t.iterations} iterations"
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


def rollout_metrics(batch: RolloutBatch, failed: int) -> dict[str, float]:
    if batch.rewards is None:
        return {}
    ok = torch.isfinite(batch.rewards)  # failed samples are counted, not averaged
    if not ok.any():
        return {"rollout/reward_failed": float(failed)}
    r, group_id = batch.rewards[ok], batch.group_id[ok]
    groups = group_id.unique()
    zero = sum(bool((r[group_id == g] == r[group_id == g][0]).all()) for g in groups)
    return {
        "rollout/reward/raw_mean": r.mean().item(),
        "rollout/reward/raw_std": r.std(unbiased=False).item(),
        "rollout/reward/raw_min": r.min().item(),
        "rollout/reward/raw_max": r.max().item(),
        "rollout/zero_std_ratio": zero / len(groups),
        "rollout/reward_failed": float(failed),
    }


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
    """Average each metric over the optimizer steps of one iteration."""
    return {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]} if rows else {}


def run_eval(step: int, runner: Runner, config: Config, out: Path, logger: MetricsLogger, train_time: float):
    result = runner.evaluate()
    if result is None:
        return None
    save_grid(result.images[: config.eval.grid_images], out / "eval" / f"step_{step:05d}.png")
    metrics = result.metrics()
    logger.log(step, metrics)
    return {"step": step, "train_time_s": round(train_time, 2), **metrics}


def _earlier_evals(out: Path, start: int) -> list[dict[str, float]]:
    """The evals a resumed run had made up to its checkpoint (from the output folder's eval curve)."""
    curve = out / "eval_curve.json"
    if not curve.is_file():
        return []
    return [e for e in json.loads(curve.read_text()) if e["step"] <= start]


def train(config: Config) -> TrainResult:
    torch.manual_seed(config.run.seed)
    out = config.run.resolved_output_dir()
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    logger = MetricsLogger(out / "metrics.jsonl")

    algorithm = build_algorithm(config)
    spec = algorithm.collection_spec()
    try:
        runner = build_runner(config, algorithm, spec)  # a runner that fails to start cleans up itself
    except BaseException:
        logger.close()
        raise
    n_steps = config.rollout.num_steps_per_rollout if spec.online else 1
    print(f"diffrl: {algorithm.name} on {config.model.family} ({config.model.path}) -> {out}", flush=True)
    print(describe_batches(config, spec, runner), flush=True)

    result = TrainResult(out, out / "checkpoints" / "final")
    t = config.train

    def evaluate(step: int, train_time: float) -> None:
        point = run_eval(step, runner, config, out, logger, train_time)
        if point is not None:
            result.evals.append(point)

    try:
        start = 0
        if t.resume is not None:
            start = runner.resume(Path(t.resume).expanduser())
            result.evals = _earlier_evals(out, start)
            print(f"resumed from {t.resume} at iteration {start}", flush=True)
        else:
            evaluate(0, 0.0)
        progress = Progress("train", t.iterations, "iter")
        budget = t.time_budget_minutes * 60 if t.time_budget_minutes else float("inf")
        # a resumed run's eval curve continues from its last earlier eval; its budget counts this
        # process's training time only
        offset = result.evals[-1]["train_time_s"] if result.evals else 0.0
        train_time = offset
        step = start
        for it in range(start, t.iterations):
            t0 = time.time()
            batch, stats = runner.collect(it)
            metrics = rollout_metrics(batch, stats.reward_failed)
            metrics.update(stats.metrics)
            if stats.errors:
                warnings.warn(
                    f"iteration {it}: {stats.reward_failed} sample(s) dropped: {stats.errors[0]}",
                    stacklevel=1,
                )
            if batch.rewards is not None:
                batch = batch.select(torch.nonzero(torch.isfinite(batch.rewards)).flatten())
            if len(batch):
                signals = algorithm.postprocess_rewards(batch, batch.rewards)
                examples = algorithm.build_train_data(batch, signals, it)
                chunks = optimizer_steps(batch, examples, n_steps, config.run.seed, it)
                metrics.update(mean_metrics(runner.optimize(chunks)))
            metrics.update(runner.end_iteration())  # old policy update, weight sync
            metrics["perf/rollout_time"] = stats.sampling_time
            metrics["perf/reward_wait_time"] = stats.reward_wait_time
            metrics["perf/iteration_time"] = time.time() - t0
            train_time += metrics["perf/iteration_time"]
            step = it + 1
            result.history.append({"step": step, **metrics})
            logger.log(
                step, metrics, keys=SHOWN, echo=step % config.run.log_every == 0 or step == t.iterations
            )
            progress.update(step)
            last = step == t.iterations or train_time - offset >= budget
            if t.save_every and step % t.save_every == 0 and not last:
                runner.save(out / "checkpoints" / f"step_{step:05d}", step)
            if t.eval_every and step % t.eval_every == 0 and not last:
                evaluate(step, train_time)
            if last:
                if step < t.iterations:
                    print(
                        f"time budget of {t.time_budget_minutes} min reached after {step} iterations",
                        flush=True,
                    )
                break
        runner.save(result.checkpoint, step)
        evaluate(step, train_time)
    finally:
        runner.close()
        logger.close()
    if result.evals:
        (out / "eval_curve.json").write_text(json.dumps(result.evals, indent=1))
        plot_eval_curve(result.evals, out / "eval_curve.png")
    return result
