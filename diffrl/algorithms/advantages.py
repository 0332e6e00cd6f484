"""Group-relative advantages, shared by the online algorithms.

GRPO (Shao et al. 2024, "DeepSeekMath", Sec. 4.1.2) as used by Flow-GRPO (flow_grpo
``scripts/train_sd3.py``, ``PerPromptStatTracker``): each sample's reward minus the mean of its
prompt group, divided by the population std (ddof = 0) of its group or of the whole batch, plus
eps = 1e-4. Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops the division.

With several rewards, ``advantage_aggregation`` says how they combine:

- ``sum``: the weighted sum of the rewards is normalised as one reward (flow_grpo's way);
- ``per_reward``: each reward is normalised within its group first, then the weighted sum of those
  advantages is normalised over the batch (GDPO, as Flow-Factory's
  ``advantage/advantage_processor.py: compute_gdpo``), so that one reward's scale cannot drown
  another's: ``A = norm_batch(Σ_k w_k · norm_group(r_k))``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from diffrl.config import RewardConfig
from diffrl.rewards.base import reward_labels
from diffrl.rollout import RolloutBatch

EPS = 1e-4
AGGREGATIONS = ("sum", "per_reward")


@dataclass
class GroupAdvantages:
    """``advantages (B,)``; ``zero_std (B,)`` bool: the sample's group scored all the same."""

    advantages: torch.Tensor
    zero_std: torch.Tensor


def group_advantages(
    rewards: torch.Tensor,
    group_id: torch.Tensor,
    global_std: bool = False,
    scale_by_std: bool = True,
    clip: float | None = None,
) -> GroupAdvantages:
    """``rewards, group_id: (B,)`` -> advantages in the rewards' dtype."""
    groups, inverse = torch.unique(group_id, return_inverse=True)
    n = len(groups)
    counts = torch.zeros(n, dtype=rewards.dtype).index_add_(0, inverse, torch.ones_like(rewards))
    mean = torch.zeros(n, dtype=rewards.dtype).index_add_(0, inverse, rewards) / counts
    centred = rewards - mean[inverse]
    var = torch.zeros(n, dtype=rewards.dtype).index_add_(0, inverse, centred**2) / counts
    group_std = var.sqrt()[inverse]
    zero_std = group_std == 0
    if scale_by_std:
        std = rewards.std(unbiased=False) if global_std else group_std
        adv = centred / (std + EPS)
    else:
        adv = centred
    if clip is not None:
        adv = adv.clamp(-clip, clip)
    return GroupAdvantages(adv, zero_std)


def aggregation_problems(aggregation: str, scale_by_std: bool = True) -> list[str]:
    """Config problems of ``algorithm.params.advantage_aggregation``."""
    if aggregation not in AGGREGATIONS:
        return [
            f"algorithm.params.advantage_aggregation must be one of {', '.join(AGGREGATIONS)}, got {aggregation!r}"
        ]
    if aggregation == "per_reward" and not scale_by_std:
        return [
            "algorithm.params.advantage_aggregation=per_reward normalises each reward by its std; "
            "with scale_by_std=false it would equal the plain sum: use advantage_aggregation=sum"
        ]
    return []


def batch_advantages(
    batch: RolloutBatch,
    rewards: torch.Tensor,
    rewards_config: Sequence[RewardConfig],
    aggregation: str = "sum",
    global_std: bool = False,
    scale_by_std: bool = True,
) -> GroupAdvantages:
    """A rollout's advantages, float64 ``(B,)``: of the weighted ``rewards (B,)`` (``sum``), or of
    each reward of ``batch.reward_scores`` normalised on its own (``per_reward``, see the module
    docstring; ``global_std``: each reward's std over the batch instead of its group's).
    ``zero_std``: the sample's group scored all the same on every reward."""
    if aggregation == "sum":
        return group_advantages(rewards.double(), batch.group_id, global_std, scale_by_std)
    if batch.reward_scores is None:
        raise ValueError(
            "per-reward advantages need each reward's scores; the batch has none (reward_scores)"
        )
    scores = batch.reward_scores.scores
    combined = torch.zeros(len(batch), dtype=torch.float64)
    zero_std = torch.ones(len(batch), dtype=torch.bool)
    for label, cfg in zip(reward_labels(rewards_config), rewards_config):
        part = group_advantages(scores[label].double(), batch.group_id, global_std)
        combined += cfg.weight * part.advantages
        zero_std &= part.zero_std
    centred = combined - combined.mean()
    return GroupAdvantages(centred / (centred.std(unbiased=False) + EPS), zero_std)
