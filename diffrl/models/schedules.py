"""Sigma schedules, exactly as diffusers' ``FlowMatchEulerDiscreteScheduler``."""

from __future__ import annotations

import functools

import torch
from diffusers import FlowMatchEulerDiscreteScheduler


@functools.cache
def _sigmas(num_steps: int, shift: float) -> tuple[float, ...]:
    scheduler = FlowMatchEulerDiscreteScheduler(shift=shift)
    scheduler.set_timesteps(num_steps)
    return tuple(scheduler.sigmas.tolist())


def flow_sigmas(num_steps: int, shift: float) -> torch.Tensor:
    """``(num_steps + 1,)`` float32 sigmas from 1 down to 0 (the scheduler's ``sigmas``)."""
    return torch.tensor(_sigmas(num_steps, float(shift)), dtype=torch.float32)


def resolution_shifted_sigmas(scheduler_config: dict, num_steps: int, image_seq_len: int) -> torch.Tensor:
    """``(num_steps + 1,)`` float32 sigmas as ``FluxPipeline`` / ``QwenImagePipeline`` set them:
    ``linspace(1, 1/N, N)`` given to the folder's ``FlowMatchEulerDiscreteScheduler`` with
    ``mu = calculate_shift(image_seq_len, ...)`` (the shift grows with the number of image tokens when
    the scheduler has ``use_dynamic_shifting``; otherwise its static ``shift`` applies)."""
    import numpy as np
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift

    cfg = dict(scheduler_config)
    mu = calculate_shift(
        image_seq_len,
        cfg.get("base_image_seq_len", 256),
        cfg.get("max_image_seq_len", 4096),
        cfg.get("base_shift", 0.5),
        cfg.get("max_shift", 1.15),
    )
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return scheduler.sigmas.float().cpu()
