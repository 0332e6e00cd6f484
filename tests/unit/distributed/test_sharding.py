"""``runner: ray``'s split of an optimizer step over the trainer ranks (no Ray needed): whole
samples per rank, as even as they go, in order; every rank runs the same number of micro-batches."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from diffrl.core.rollout import TrainExamples
from diffrl.distributed.ray.sharding import micro_batch_count, shard_steps, split_by_samples


@dataclass
class Examples(TrainExamples):
    sample_id: torch.Tensor
    step: torch.Tensor


def examples(sample_ids: list[int], steps_per_sample: int = 1) -> Examples:
    """``steps_per_sample`` consecutive examples per sample (as Flow-GRPO's trained steps)."""
    ids = torch.tensor(sample_ids).repeat_interleave(steps_per_sample)
    return Examples(sample_id=ids, step=torch.arange(steps_per_sample).repeat(len(sample_ids)))


@pytest.mark.parametrize("n_samples, world, want", [(8, 2, [4, 4]), (9, 2, [4, 5]), (5, 3, [1, 2, 2])])
def test_split_by_samples_takes_whole_samples_as_evenly_as_they_go_in_order(n_samples, world, want):
    ids = [10 + 3 * i for i in range(n_samples)]  # sample ids need not be contiguous
    parts = split_by_samples(examples(ids, steps_per_sample=2), world)
    assert [len(set(p.sample_id.tolist())) for p in parts] == want
    assert [len(p) for p in parts] == [2 * n for n in want]  # a sample's examples stay together
    assert torch.cat([p.sample_id for p in parts]).tolist() == torch.tensor(ids).repeat_interleave(2).tolist()
    assert torch.cat([p.step for p in parts]).tolist() == [0, 1] * n_samples


def test_split_by_samples_keeps_the_examples_order_not_sorted_ids():
    parts = split_by_samples(examples([7, 3, 5, 1]), 2)
    assert [p.sample_id.tolist() for p in parts] == [[7, 3], [5, 1]]


def test_split_by_samples_with_fewer_samples_than_ranks_leaves_a_share_empty():
    parts = split_by_samples(examples([0, 1]), 3)
    assert [len(p) for p in parts] == [0, 1, 1]


@pytest.mark.parametrize(
    "sizes, micro_batch_size, want",
    [
        ([4, 4], 4, 1),
        ([8, 8], 4, 2),
        ([5, 4], 4, 2),  # the larger share needs 2 micro-batches of 4; the smaller splits 2 + 2
        ([3, 1], 1, 1),  # no more micro-batches than the smallest share has examples
        ([1], 4, 1),
    ],
)
def test_micro_batch_count(sizes, micro_batch_size, want):
    assert micro_batch_count(sizes, micro_batch_size) == want


def test_shard_steps_gives_each_rank_its_share_the_global_count_and_the_common_micro_batch_count():
    chunks = [examples([0, 1, 2, 3, 4, 5, 6, 7, 8]), examples([9]), examples([10, 11, 12, 13])]
    per_rank, skipped = shard_steps(chunks, 2, micro_batch_size=4)
    assert skipped == 1  # one sample cannot go to two ranks
    assert len(per_rank) == 2 and all(len(steps) == 2 for steps in per_rank)
    (a0, total0, count0), (a1, total1, count1) = per_rank[0][0], per_rank[1][0]
    assert a0.sample_id.tolist() == [0, 1, 2, 3] and a1.sample_id.tolist() == [4, 5, 6, 7, 8]
    assert (total0, count0) == (total1, count1) == (9, 2)
    assert [(len(p), total, count) for p, total, count in (per_rank[0][1], per_rank[1][1])] == [(2, 4, 1)] * 2


def test_shard_steps_with_every_step_skipped_leaves_the_ranks_nothing():
    per_rank, skipped = shard_steps([examples([0])], 2, micro_batch_size=2)
    assert (per_rank, skipped) == ([[], []], 1)


def test_shard_steps_gives_a_sequence_groups_ranks_the_same_share_counted_once():
    """``parallel.sequence: 2`` on 4 ranks: 2 data groups (ranks 0-1, 2-3) split the samples;
    the global count is the step's, not twice it."""
    per_rank, skipped = shard_steps([examples([0, 1, 2, 3, 4, 5], steps_per_sample=2)], 4, 2, sequence=2)
    assert skipped == 0
    shares = [[(p.sample_id.tolist(), total, count) for p, total, count in steps] for steps in per_rank]
    group0 = [([0, 0, 1, 1, 2, 2], 12, 3)]
    group1 = [([3, 3, 4, 4, 5, 5], 12, 3)]
    assert shares == [group0, group0, group1, group1]
    # one sample: one data group's worth, so with 2 groups the step is skipped; with 1 it is not
    assert shard_steps([examples([0])], 4, 2, sequence=2)[1] == 1
    assert shard_steps([examples([0])], 2, 2, sequence=2)[1] == 0
