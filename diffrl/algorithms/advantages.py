"""Group-relative advantages, shared by the online algorithms.

GRPO (Shao et al. 2024, "DeepSeekMath", Sec. 4.1.2) as used by Flow-GRPO (flow_grpo
``scripts/train_sd3.py``, ``PerPromptStatTracker``): each sample's reward minus the mean of its
prompt group, divided by the population std (ddof = 0) of its group or of the whole batch, plus
eps = 1e-4. Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training") drops the division.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

EPS = 1e-4


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
