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
