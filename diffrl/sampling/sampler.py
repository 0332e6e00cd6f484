"""Sampling prompts to images with the family's velocity and a transition kernel."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from diffrl.config import Config
from diffrl.models.base import Conditioning, ModelFamily
from diffrl.sampling.kernels import ode_step
from diffrl.seeding import randn_batch


def image_size(config: Config, family: ModelFamily) -> tuple[int, int]:
    h, w = family.default_size
    return config.sampling.height or h, config.sampling.width or w


def sampling_sigmas(config: Config, family: ModelFamily) -> torch.Tensor:
    """The ``(num_steps + 1,)`` sigma schedule of this run's sampling (on the family's device)."""
    s = config.sampling
    return family.sigmas(s.num_steps, s.shift, *image_size(config, family)).to(family.device)


DETERMINISTIC = ("ode", "heun")
"""Samplers without a stochastic kernel: Euler and Heun (2nd order)."""


def heun_step(
    family: ModelFamily,
    x: torch.Tensor,
    v: torch.Tensor,
    sigma: torch.Tensor,
    sigma_next: torch.Tensor,
    cond: Conditioning,
    guidance_scale: float = 1.0,
    negative: Conditioning | None = None,
    module: nn.Module | None = None,
) -> torch.Tensor:
    """Heun's 2nd-order step (Karras et al. 2022, Alg. 1): Euler, then the trapezoid of the two
    velocities; the last step to sigma = 0 stays Euler. ``x, v: (B, *latent)``, ``sigma: (B,)``."""
    x_euler = ode_step(x, v, sigma, sigma_next)
    if bool((sigma_next == 0).all()):
        return x_euler
    v2 = family.velocity(x_euler, sigma_next, cond, guidance_scale, negative, module=module)
    dt = (sigma_next - sigma).view(-1, *[1] * (x.ndim - 1))
    return x + dt * 0.5 * (v + v2)


def initial_noise(family: ModelFamily, keys: Sequence[tuple], height: int, width: int) -> torch.Tensor:
    """``(B, *latent)`` noise, one independent draw per identity key (layout-independent)."""
    return randn_batch(family.latent_shape(height, width), keys).to(family.device)


@torch.no_grad()
def sample_ode(
    family: ModelFamily,
    noise: torch.Tensor,
    cond: Conditioning,
    sigmas: torch.Tensor,
    guidance_scale: float = 1.0,
    negative: Conditioning | None = None,
    module: nn.Module | None = None,
) -> torch.Tensor:
    """Deterministic Euler sampling from ``noise (B, *latent)`` to clean latents ``(B, *latent)``
    along ``sigmas (num_steps + 1,)``."""
    sigmas = sigmas.to(noise.device)
    num_steps = len(sigmas) - 1
    x = noise
    b = noise.shape[0]
    if negative is not None and len(negative) == 1:
        negative = negative.repeat(b)
    for i in range(num_steps):
        sigma, sigma_next = sigmas[i].expand(b), sigmas[i + 1].expand(b)
        v = family.velocity(x, sigma, cond, guidance_scale, negative, module=module)
        x = ode_step(x, v, sigma, sigma_next)
    return x
