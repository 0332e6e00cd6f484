"""Transition kernels x_t -> x_{t+Δ} of the reverse process, with the log-prob of the transition.

Shapes: ``x_t, velocity: (B, *latent)`` (image ``(B, C, H, W)`` or video ``(B, C, F, H, W)``);
``sigma, sigma_next: (B,)`` (per-element timesteps). All math runs in float32.

- ``ode``: the Euler step of diffusers' ``FlowMatchEulerDiscreteScheduler.step``,
  ``x_next = x_t + (sigma_next - sigma) * v``.
- ``sde``: Flow-GRPO's marginal-preserving SDE (Liu et al. 2025, "Flow-GRPO", Eq. 8-9;
  flow_grpo ``diffusers_patch/sd3_sde_with_logprob.py::sde_step_with_logprob``, ``sde_type="sde"``).
  std = η·sqrt(σ / (1 − σ)) with σ_max = sigmas[1] in the denominator where σ == 1; the log-prob is
  the full Gaussian log-density with standard deviation std·sqrt(−dt).
- ``cps``: coefficients-preserving sampling (Wang & Yu 2025, "Coefficients-Preserving Sampling for
  Reinforcement Learning with Flow Matching"; flow_grpo ``sde_type="cps"``): std = σ'·sin(η·π/2),
  the log-prob is −(x' − μ)² with all constants dropped.

The log-prob is the per-element **mean** over all non-batch dims, as the reference implementations.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

KERNELS = ("ode", "sde", "cps")


@dataclass
class StepOutput:
    """``prev_sample, mean: (B, *latent)``; ``log_prob, std: (B,)``."""

    prev_sample: torch.Tensor
    log_prob: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor


def _bcast(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return v.float().view(-1, *([1] * (like.ndim - 1)))


def ode_step(
    x_t: torch.Tensor, velocity: torch.Tensor, sigma: torch.Tensor, sigma_next: torch.Tensor
) -> torch.Tensor:
    """Euler step -> ``(B, *latent)``, computed in float32 (as diffusers' scheduler upcasts)."""
    dt = _bcast(sigma_next - sigma, x_t)
    return (x_t.float() + dt * velocity.float()).to(x_t.dtype)


def _mean_over_elements(t: torch.Tensor) -> torch.Tensor:
    return t.mean(dim=tuple(range(1, t.ndim)))


def sde_step(
    x_t: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    noise_level: float,
    sigma_max: float,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> StepOutput:
    """Flow-GRPO SDE step. Give ``noise`` to sample, or ``prev_sample`` to score a recorded one."""
    x, v = x_t.float(), velocity.float()
    s, s_next = _bcast(sigma, x), _bcast(sigma_next, x)
    dt = s_next - s
    std = torch.sqrt(s / (1 - torch.where(s == 1, torch.full_like(s, sigma_max), s))) * noise_level
    mean = x * (1 + std**2 / (2 * s) * dt) + v * (1 + std**2 * (1 - s) / (2 * s)) * dt
    scale = std * torch.sqrt(-dt)
    if prev_sample is None:
        prev_sample = mean + scale * noise.float()
    prev = prev_sample.detach().float()
    log_prob = -((prev - mean) ** 2) / (2 * scale**2) - torch.log(scale) - math.log(math.sqrt(2 * math.pi))
    return StepOutput(prev_sample, _mean_over_elements(log_prob), mean, std.flatten())


def cps_step(
    x_t: torch.Tensor,
    velocity: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    noise_level: float,
    sigma_max: float = 1.0,
    noise: torch.Tensor | None = None,
    prev_sample: torch.Tensor | None = None,
) -> StepOutput:
    """Coefficients-preserving step. Give ``noise`` to sample, or ``prev_sample`` to score one."""
    x, v = x_t.float(), velocity.float()
    s, s_next = _bcast(sigma, x), _bcast(sigma_next, x)
    std = s_next * math.sin(noise_level * math.pi / 2)
    x0_pred = x - s * v
    noise_pred = x + v * (1 - s)
    mean = x0_pred * (1 - s_next) + noise_pred * torch.sqrt(s_next**2 - std**2)
    if prev_sample is None:
        prev_sample = mean + std * noise.float()
    log_prob = -((prev_sample.detach().float() - mean) ** 2)
    return StepOutput(prev_sample, _mean_over_elements(log_prob), mean, std.flatten())


def stochastic_kernel(name: str) -> Callable[..., StepOutput]:
    """``sde`` or ``cps``; an unknown name lists the known ones."""
    table = {"sde": sde_step, "cps": cps_step}
    if name not in table:
        raise ValueError(
            f"unknown stochastic kernel {name!r}; known: {', '.join(table)} (ode is deterministic)"
        )
    return table[name]
