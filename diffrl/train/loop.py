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
from diffrl.data.offline import build_offline_dataset
from diffrl.data.prompts import load_prompts
from diffrl.logging import MetricsLogger, Progress
from diffrl.models.base import ModelFamily
from diffrl.models.registry import load_family
from diffrl.rewards.base import RewardSet
from diffrl.sampling.collector import OfflineCollector, OnlineCollector
from diffrl.sampling.sampler import image_size
from diffrl.seeding import generator
from diffrl.train.actor import Actor
from diffrl.train.checkpoint import save_checkpoint
from diffrl.train.evaluate import evaluate, plot_eval_curve, save_grid

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


def describe_batches(config: Config, spec: CollectionSpec, actor: Actor) -> str:
    t, r = config.train, config.rollout
    lines = [
        f"{actor.num_trainable():,} trainable parameters ({'LoRA r=' + str(config.model.lora.rank) if config.model.lora else 'full transformer'}); {t.iterations} iterations"
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


def build_collector(config: Config, family: ModelFamily, spec: CollectionSpec, rewards: RewardSet | None):
    if spec.online:
        return OnlineCollector(config, family, spec, load_prompts(config.data.prompts), rewards)
    height, width = image_size(config, family)
    return OfflineCollector(
        build_offline_dataset(config, height, width), family, config.train.batch_size, config.run.seed
    )


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


def run_eval(
    step: int,
    actor: Actor,
    config: Config,
    rewards: RewardSet | None,
    out: Path,
    logger: MetricsLogger,
    train_time: float,
):
    with actor.eval_weights():
        result = evaluate(actor.family, config, rewards)
    save_grid(result.images[: config.eval.grid_images], out / "eval" / f"step_{step:05d}.png")
    metrics = result.metrics()
    logger.log(step, metrics)
    return {"step": step, "train_time_s": round(train_time, 2), **metrics}


def train(config: Config) -> TrainResult:
    torch.manual_seed(config.run.seed)
    out = config.run.resolved_output_dir()
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    logger = MetricsLogger(out / "metrics.jsonl")

    algorithm = build_algorithm(config)
    spec = algorithm.collection_spec()
    family = load_family(config)
    actor = Actor(
        family, config, keep_reference=algorithm.needs_reference, keep_old=algorithm.keeps_old_policy
    )
    train_rewards = RewardSet(config.rewards) if spec.needs_reward else None
    eval_rewards = RewardSet(config.eval.rewards) if config.eval.enabled else None
    collector = build_collector(config, family, spec, train_rewards)
    n_steps = config.rollout.num_steps_per_rollout if spec.online else 1
    print(f"diffrl: {algorithm.name} on {family.name} ({config.model.path}) -> {out}", flush=True)
    print(describe_batches(config, spec, actor), flush=True)

    result = TrainResult(out, out / "checkpoints" / "final")
    t = config.train
    try:
        if eval_rewards is not None:
            result.evals.append(run_eval(0, actor, config, eval_rewards, out, logger, 0.0))
        progress = Progress("train", t.iterations, "iter")
        budget = t.time_budget_minutes * 60 if t.time_budget_minutes else float("inf")
        train_time = 0.0
        step = 0
        for it in range(t.iterations):
            t0 = time.time()
            family.transformer.eval()
            with actor.policy.sampling_weights() as module:  # the old policy when the algorithm keeps one
                batch, stats = collector.collect(it, module)
            metrics = rollout_metrics(batch, stats.reward_failed)
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
                chunks = [actor.before_update(chunk, algorithm) for chunk in chunks]
                metrics.update(mean_metrics([actor.train_step(chunk, algorithm) for chunk in chunks]))
            if actor.policy.old is not None:
                decay = algorithm.old_policy_decay(actor.step)
                actor.policy.old.update(decay)
                metrics["train/old_policy_decay"] = decay
            # single process: the collector samples with the actor's own module, nothing to sync
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
            last = step == t.iterations or train_time >= budget
            if t.save_every and step % t.save_every == 0 and not last:
                save_checkpoint(out / "checkpoints" / f"step_{step:05d}", actor, config, step)
            if eval_rewards is not None and t.eval_every and step % t.eval_every == 0 and not last:
                result.evals.append(run_eval(step, actor, config, eval_rewards, out, logger, train_time))
            if last:
                if step < t.iterations:
                    print(
                        f"time budget of {t.time_budget_minutes} min reached after {step} iterations",
                        flush=True,
                    )
                break
        save_checkpoint(result.checkpoint, actor, config, step)
        if eval_rewards is not None:
            result.evals.append(run_eval(step, actor, config, eval_rewards, out, logger, train_time))
    finally:
        for r in (train_rewards, eval_rewards):
            if r is not None:
                r.close()
        logger.close()
    if result.evals:
        (out / "eval_curve.json").write_text(json.dumps(result.evals, indent=1))
        plot_eval_curve(result.evals, out / "eval_curve.png")
    return result
