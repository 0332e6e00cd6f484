"""The training driver: collect -> score -> signals -> examples -> optimise -> sync -> eval -> save."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config, dump_config
from diffrl.data.offline import build_offline_dataset
from diffrl.logging import MetricsLogger, Progress
from diffrl.models.registry import load_family
from diffrl.rewards.base import RewardSet
from diffrl.sampling.collector import OfflineCollector
from diffrl.train.actor import Actor
from diffrl.train.checkpoint import save_checkpoint
from diffrl.train.evaluate import evaluate, image_size, save_grid


@dataclass
class TrainResult:
    output_dir: Path
    checkpoint: Path
    history: list[dict[str, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)


def describe_batches(config: Config, actor: Actor) -> str:
    t = config.train
    return (
        f"batch arithmetic: {t.batch_size} examples per optimizer step = "
        f"{t.batch_size // t.micro_batch_size} micro-batches x {t.micro_batch_size}; "
        f"{t.iterations} iterations; {actor.num_trainable():,} trainable parameters "
        f"({'LoRA r=' + str(config.model.lora.rank) if config.model.lora else 'full transformer'})"
    )


def run_eval(step: int, actor: Actor, config: Config, rewards: RewardSet | None, out: Path, logger: MetricsLogger):
    with actor.eval_weights():
        result = evaluate(actor.family, config, rewards)
    save_grid(result.images[: config.eval.grid_images], out / "eval" / f"step_{step:05d}.png")
    metrics = result.metrics()
    logger.log(step, metrics)
    return {"step": step, **metrics}


def train(config: Config) -> TrainResult:
    torch.manual_seed(config.run.seed)
    out = config.run.resolved_output_dir()
    out.mkdir(parents=True, exist_ok=True)
    dump_config(config, out / "config.yaml")
    logger = MetricsLogger(out / "metrics.jsonl")

    algorithm = build_algorithm(config)
    spec = algorithm.collection_spec()
    family = load_family(config)
    actor = Actor(family, config)
    height, width = image_size(config, family)
    collector = OfflineCollector(build_offline_dataset(config, height, width), family, config.train.batch_size, config.run.seed)
    train_rewards = RewardSet(config.rewards) if spec.needs_reward else None
    eval_rewards = RewardSet(config.eval.rewards) if config.eval.enabled else None
    print(f"diffrl: {algorithm.name} on {family.name} ({config.model.path}) -> {out}", flush=True)
    print(describe_batches(config, actor), flush=True)

    result = TrainResult(out, out / "checkpoints" / "final")
    t = config.train
    try:
        if eval_rewards is not None:
            result.evals.append(run_eval(0, actor, config, eval_rewards, out, logger))
        progress = Progress("train", t.iterations, "iter")
        for it in range(t.iterations):
            t0 = time.time()
            batch = collector.collect(it)
            scores = train_rewards(batch.images, batch.prompts, batch.metadata).total if train_rewards else None
            signals = algorithm.postprocess_rewards(batch, scores)
            examples = algorithm.build_train_data(batch, signals, it)
            metrics = actor.train_step(examples, algorithm)
            metrics["perf/iteration_time"] = time.time() - t0
            step = it + 1
            result.history.append({"step": step, **metrics})
            if step % config.run.log_every == 0 or step == t.iterations:
                logger.log(step, metrics, keys=["train/loss", "train/grad_norm", "train/lr", "perf/iteration_time"])
            progress.update(step)
            if t.save_every and step % t.save_every == 0 and step < t.iterations:
                save_checkpoint(out / "checkpoints" / f"step_{step:05d}", actor, config, step)
            if eval_rewards is not None and t.eval_every and step % t.eval_every == 0 and step < t.iterations:
                result.evals.append(run_eval(step, actor, config, eval_rewards, out, logger))
        save_checkpoint(result.checkpoint, actor, config, t.iterations)
        if eval_rewards is not None:
            result.evals.append(run_eval(t.iterations, actor, config, eval_rewards, out, logger))
    finally:
        for r in (train_rewards, eval_rewards):
            if r is not None:
                r.close()
        logger.close()
    if result.evals:
        (out / "eval_curve.json").write_text(json.dumps(result.evals, indent=1))
    return result
