"""The batch arithmetic: how a rollout splits into micro-groups and optimizer steps, and the
lines that say so at start-up."""

from __future__ import annotations

import torch

from diffrl.config import Config
from diffrl.core.rollout import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.core.seeding import generator
from diffrl.train.runner import Runner


def micro_group_count(config: Config, spec: CollectionSpec) -> int:
    """How many micro-groups a rollout yields (an offline algorithm's examples come as one)."""
    if not spec.online:
        return 1
    r = config.rollout
    mg = r.micro_group_size or config.train.micro_batch_size
    return -(-r.batch_size * r.n_samples_per_prompt // mg)


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
