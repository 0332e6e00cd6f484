"""Transition kernels x_t -> x_{t+Δ} of the reverse process.

``ode``: the Euler step of diffusers' ``FlowMatchEulerDiscreteScheduler.step``,
``x_next = x_t + (sigma_next - sigma) * v``.
"""

from __future__ import annotations

import torch


def ode_step(x_t: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor) -> torch.Tensor:
    """Euler step. ``x_t, velocity: (B, *latent)``; ``sigma, sigma_next: (B,)`` -> ``(B, *latent)``.

    Computed in float32 whatever the model's dtype (as diffusers' scheduler upcasts).
    """
    dt = (sigma_next - sigma).view(-1, *([1] * (x_t.ndim - 1)))
    return (x_t.float() + dt * velocity.float()).to(x_t.dtype)
