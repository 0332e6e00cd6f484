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

``diversity_bonus`` (GARDO's diversity-aware advantage shaping; He et al. 2025, "GARDO:
Reinforcing Diffusion Models without Reward Hacking", arXiv 2512.24138; tinnerhrhe/GARDO
``flow_grpo/stat_tracking.py: PerPromptStatTracker.update``, type ``gardo``): each sample's
diversity is its distance to the nearest other sample of its group, d_i = min_{j≠i} (1 − cos(f_i, f_j));
a sample scoring at or above its group's mean has its advantage multiplied by d_i / mean_group(d)
(1 for those below the mean), so that the group's good samples that are also unlike the others
are pushed harder (mode coverage). The reference's features f are DINOv3 embeddings; diffrl's are
the decoded images average-pooled to at most 32 x 32 and centred ((pixel − 127.5) / 127.5), which
needs no model (:func:`pixel_features`). The reference applies the weight to (r − mean) with no
std division: ``scale_by_std: false`` reproduces it; with the std division the weight multiplies
the normalised advantage.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from diffrl.config import RewardConfig
from diffrl.core.rollout import RolloutBatch
from diffrl.rewards.base import reward_labels

EPS = 1e-4
AGGREGATIONS = ("sum", "per_reward")
FEATURE_POOL = 32
"""``diversity_bonus``'s features: the images pooled to at most this many pixels per side."""


def pixel_features(images: torch.Tensor, pool: int = FEATURE_POOL) -> torch.Tensor:
    """uint8 ``(B, 3, H, W)`` or ``(B, 3, F, H, W)`` -> float32 ``(B, D)`` in [-1, 1], each frame
    average-pooled to at most ``pool`` x ``pool``."""
    x = images.float()
    b, h, w = x.shape[0], x.shape[-2], x.shape[-1]
    x = x.reshape(b, -1, h, w)
    if h > pool or w > pool:
        x = F.adaptive_avg_pool2d(x, (min(h, pool), min(w, pool)))
    return ((x - 127.5) / 127.5).flatten(1)


def diversity_weights(features: torch.Tensor, rewards: torch.Tensor, group_id: torch.Tensor) -> torch.Tensor:
    """GARDO's diversity weights (see the module docstring): ``features (B, D)``, ``rewards,
    group_id (B,)`` -> ``(B,)`` float64; 1 for samples below their group's mean reward, for
    single-sample groups and for groups whose samples are all identical (mean distance 0)."""
    weights = torch.ones(len(rewards), dtype=torch.float64)
    unit = F.normalize(features.double(), dim=1)
    for g in group_id.unique():
        rows = torch.nonzero(group_id == g).flatten()
        if len(rows) < 2:
            continue
        distance = 1 - (unit[rows] @ unit[rows].T).clamp(-1, 1)
        distance.fill_diagonal_(float("inf"))
        nearest = distance.min(dim=1).values
        mean = nearest.mean()
        if mean <= 0:
            continue
        r = rewards[rows].double()
        weights[rows] = torch.where(r - r.mean() < 0, torch.ones_like(nearest), nearest / mean)
    return weights


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


def descending_ranks(scores: torch.Tensor) -> torch.Tensor:
    """``scores (B,)`` -> ``(B,)`` float64 ranks, 1 for the highest (ties in row order)."""
    order = torch.sort(scores.double(), descending=True, stable=True).indices
    ranks = torch.empty(len(scores), dtype=torch.float64)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    return ranks


def gardo_gate(trained: torch.Tensor, auxiliary: Sequence[torch.Tensor], share: float) -> torch.Tensor:
    """GARDO's gate of the KL penalty (arXiv 2512.24138; tinnerhrhe/GARDO
    ``scripts/train_sd3_grpo_gardo.py``, the ``reward_std`` it computes after the stat tracker):
    ``trained (B,)`` the trained reward, ``auxiliary`` each ``(B,)`` an auxiliary reward's scores ->
    ``(B,)`` bool, the samples the KL applies to.

    As the reference: each reward ranks the whole batch (1 = highest); a sample's uncertainty is
    u = rank_trained − mean_k rank_aux_k; of the samples with u >= 0, those above the
    (1 − share) quantile (linear interpolation, numpy's ``percentile``) are gated. Note the sign:
    with rank 1 the best, u > 0 means the trained reward ranks the sample *lower* than the
    auxiliary rewards do (the reference's arithmetic, kept as it is). The reference adapts
    ``share`` between 0.02 and 0.2 (its ``RiskCompensator``); diffrl keeps it fixed.
    """
    u = descending_ranks(trained) - torch.stack([descending_ranks(a) for a in auxiliary]).mean(0)
    candidates = u[u >= 0]  # never empty: the u of a batch sum to 0
    threshold = torch.quantile(candidates, 1.0 - share)
    return u > threshold
