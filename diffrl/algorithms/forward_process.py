"""What the forward-process algorithms (DiffusionNFT, AWM) share: expanding each rollout sample into
(sample, timestep) rows with fresh noise, and noising x0 along the flow-matching path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffrl.core.rollout import RolloutBatch
from diffrl.core.seeding import generator


@dataclass
class NoisedRows:
    """``idx (N,)`` the rollout row of each example; ``t (N,)``; ``noise (N, *latent)``."""

    idx: torch.Tensor
    t: torch.Tensor
    noise: torch.Tensor


def expand_timesteps(
    batch: RolloutBatch, seed: int, name: str, draw_times: Callable[[torch.Generator], list[float]]
) -> NoisedRows:
    """One row per (sample, drawn timestep). The timesteps of a sample come from a generator keyed
    by (seed, name, prompt slot, sample index), its n-th noise from (seed, name, slot, sample, n):
    independent of batch layout."""
    rows, ts, noise = [], [], []
    for i, (slot, j) in enumerate(zip(batch.group_id.tolist(), batch.sample_index.tolist())):
        for n, t in enumerate(draw_times(generator(seed, f"{name}_t", slot, j))):
            rows.append(i)
            ts.append(t)
            noise.append(
                torch.randn(batch.x0.shape[1:], generator=generator(seed, f"{name}_eps", slot, j, n))
            )
    device = batch.x0.device
    return NoisedRows(
        torch.tensor(rows, dtype=torch.long), torch.tensor(ts, device=device), torch.stack(noise).to(device)
    )


def noised(x0: torch.Tensor, noise: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``x_t = (1 − t)·x0 + t·ε`` for ``x0, noise (B, *latent)``, ``t (B,)``."""
    t_ = t.view(-1, *[1] * (x0.ndim - 1))
    return (1 - t_) * x0 + t_ * noise
