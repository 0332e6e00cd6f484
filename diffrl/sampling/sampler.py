"""The one sampling loop: prompts' noise to clean latents with the family's velocity and a kernel.

Eval (every step Euler, :func:`sample_ode`) and rollouts (the algorithm's kernel on the steps its
step strategy picks, :class:`~diffrl.sampling.collector.OnlineCollector`) both run :func:`denoise`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from diffrl.config import Config
from diffrl.core.rollout import Conditioning
from diffrl.core.seeding import randn_batch
from diffrl.models.base import FamilyRuntime
from diffrl.sampling.kernels import Euler, Kernel


def image_size(config: Config, family: FamilyRuntime) -> tuple[int, int]:
    h, w = family.default_size
    return config.sampling.height or h, config.sampling.width or w


def sampling_sigmas(config: Config, family: FamilyRuntime) -> torch.Tensor:
    """The ``(num_steps + 1,)`` sigma schedule of this run's sampling (on the family's device)."""
    s = config.sampling
    return family.sigmas(s.num_steps, s.shift, *image_size(config, family)).to(family.device)


def initial_noise(family: FamilyRuntime, keys: Sequence[tuple], height: int, width: int) -> torch.Tensor:
    """``(B, *latent)`` noise, one independent draw per identity key (layout-independent)."""
    return randn_batch(family.latent_shape(height, width), keys).to(family.device)


@dataclass
class Denoised:
    """``x0 (B, *latent)``; for the K recorded stochastic steps, lists of K tensors:
    ``traj_x, traj_next (B, *latent)``, ``traj_log_prob (B,)`` and, with ``record_mean``,
    ``traj_mean (B, *latent)``."""

    x0: torch.Tensor
    traj_x: list[torch.Tensor] = field(default_factory=list)
    traj_next: list[torch.Tensor] = field(default_factory=list)
    traj_log_prob: list[torch.Tensor] = field(default_factory=list)
    traj_mean: list[torch.Tensor] = field(default_factory=list)


EULER = Euler()


@torch.no_grad()
def denoise(
    family: FamilyRuntime,
    x: torch.Tensor,
    cond: Conditioning,
    sigmas: torch.Tensor,
    kernel: Kernel = EULER,
    stochastic_steps: Collection[int] = (),
    noise_level: float = 0.0,
    step_noise: Callable[[int], torch.Tensor] | None = None,
    guidance_scale: float = 1.0,
    negative: Conditioning | None = None,
    module: nn.Module | None = None,
    record: bool = False,
    record_mean: bool = False,
) -> Denoised:
    """Run the reverse process from ``x (B, *latent)`` along ``sigmas (num_steps + 1,)``.

    A stochastic ``kernel`` steps the ``stochastic_steps`` with the noise ``step_noise(i)`` (and,
    with ``record``, keeps their transitions and log-probs, and with ``record_mean`` also the
    transitions' means); every other step is Euler. A
    deterministic kernel (``ode``, ``heun``) steps every step. ``negative``: one row or ``B``.
    """
    b = x.shape[0]
    sigmas = sigmas.to(x.device)
    if negative is not None and len(negative) == 1:
        negative = negative.repeat(b)
    sigma_max = sigmas[1].item()
    out = Denoised(x)

    def velocity_at(latents: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        return family.velocity(latents, sigma, cond, guidance_scale, negative, module=module)

    for i in range(len(sigmas) - 1):
        sigma, sigma_next = sigmas[i].expand(b), sigmas[i + 1].expand(b)
        v = velocity_at(x, sigma)
        if kernel.stochastic and i in stochastic_steps:
            step = kernel.step(
                x, v, sigma, sigma_next, noise_level=noise_level, sigma_max=sigma_max, noise=step_noise(i)
            )
            if record:
                out.traj_x.append(x)
                out.traj_next.append(step.prev_sample)
                out.traj_log_prob.append(step.log_prob)
                if record_mean:
                    out.traj_mean.append(step.mean)
        elif kernel.stochastic:
            step = EULER.step(x, v, sigma, sigma_next)
        else:
            step = kernel.step(x, v, sigma, sigma_next, velocity_at=velocity_at)
        x = step.prev_sample
    out.x0 = x
    return out


def sample_ode(
    family: FamilyRuntime,
    noise: torch.Tensor,
    cond: Conditioning,
    sigmas: torch.Tensor,
    guidance_scale: float = 1.0,
    negative: Conditioning | None = None,
    module: nn.Module | None = None,
) -> torch.Tensor:
    """Deterministic Euler sampling from ``noise (B, *latent)`` to clean latents ``(B, *latent)``."""
    return denoise(
        family, noise, cond, sigmas, guidance_scale=guidance_scale, negative=negative, module=module
    ).x0
