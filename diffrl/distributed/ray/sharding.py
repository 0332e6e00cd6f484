"""How one optimizer step's examples are split over the trainer ranks: by whole samples, every rank
running the same number of micro-batches (the FSDP2 collectives pair up), each weighting its loss
by its share of the step's global count (see :meth:`diffrl.train.actor.Actor.optimize`)."""

from __future__ import annotations

import torch

from diffrl.core.rollout import TrainExamples

RankPart = tuple[TrainExamples, int, int]
"""One optimizer step on one rank: its share of the examples, the step's global example count
and the number of micro-batches every rank splits its share into."""


def split_by_samples(examples: TrainExamples, world_size: int) -> list[TrainExamples]:
    """Split one optimizer step's examples over ``world_size`` ranks by whole samples, as evenly
    as they go (counts differ by at most one sample), keeping their order: with even counts a
    rank's micro-batches are the rollout's micro-groups."""
    ids = list(dict.fromkeys(examples.sample_id.tolist()))
    bounds = [len(ids) * r // world_size for r in range(world_size + 1)]
    parts = []
    for r in range(world_size):
        mine = torch.tensor(ids[bounds[r] : bounds[r + 1]], dtype=torch.long)
        parts.append(examples.select(torch.nonzero(torch.isin(examples.sample_id, mine)).flatten()))
    return parts


def micro_batch_count(sizes: list[int], micro_batch_size: int) -> int:
    """How many micro-batches every rank splits its share into: enough for the largest share at
    ``micro_batch_size``, but no more than the smallest share has examples."""
    return max(1, min(max(-(-n // micro_batch_size) for n in sizes), min(sizes)))


def shard_steps(
    chunks: list[TrainExamples], world_size: int, micro_batch_size: int, sequence: int = 1
) -> tuple[list[list[RankPart]], int]:
    """Each rank's parts of the optimizer steps ``chunks``, and how many steps are skipped (fewer
    samples left than data groups: failed rewards, dropped groups). The ``world_size / sequence``
    data groups split a step's samples; the ``sequence`` ranks of a group (consecutive ranks) take
    the same part, each running its share of every sample's tokens."""
    groups = world_size // sequence
    per_rank: list[list[RankPart]] = [[] for _ in range(world_size)]
    skipped = 0
    for chunk in chunks:
        parts = split_by_samples(chunk, groups)
        sizes = [len(p) for p in parts]
        if min(sizes) == 0:
            skipped += 1
            continue
        count = micro_batch_count(sizes, micro_batch_size)
        for r in range(world_size):
            per_rank[r].append((parts[r // sequence], sum(sizes), count))
    return per_rank, skipped
