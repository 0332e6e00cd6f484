"""Transition kernels x_t -> x_{t+Δ} of the reverse process, with the log-prob of the transition.

One contract (:class:`Kernel`): ``step(x_t, velocity, sigma, sigma_next, ...) -> StepOutput``, a
``stochastic`` flag (a stochastic kernel draws ``noise`` and scores a transition's log-prob; a
deterministic one leaves ``log_prob`` None) and ``second_evaluation`` (Heun asks for the velocity
at its Euler point through ``velocity_at``). Kernels are found by name in :data:`KERNELS`:
``ode | sde | cps | heun``, or a dotted path to a user's :class:`Kernel` subclass (as miles'
``--sde-step-backend-path``). Rollouts, eval and Flow-GRPO's replay all step through the same
kernel object, so the replayed log-prob equals the recorded one.

Shapes: ``x_t, velocity: (B, *latent)`` (image ``(B, C, H, W)`` or video ``(B, C, F, H, W)``);
``sigma, sigma_next: (B,)`` (per-element timesteps). All math runs in float32.

- ``ode``: the Euler step of diffusers' ``FlowMatchEulerDiscreteScheduler.step``,
  ``x_next = x_t + (sigma_next - sigma) * v``.
- ``sde``: Flow-GRPO's marginal-preserving SDE (Liu et al. 2025, "Flow-GRPO", Eq. 8-9;
  flow_grpo ``diffusers_patch/sd3_sde_with_logprob.py::sde_step_with_logprob``, ``sde_type="sde"``).
  std = η·sqrt(σ / (1 − σ)) with σ_max = sigmas[1] in the denominator where σ == 1; the log-prob is
  the full Gaussian log-density with standard deviation std·sqrt(−dt). The denominator takes
  min(σ, σ_max): the same at σ == 1 and below σ_max, and it also covers a schedule whose first σ
  lies just below 1 (Cosmos 3's 0.995 or 0.9998, where 1 − σ ≈ 0 would make std explode).
- ``cps``: coefficients-preserving sampling (Wang & Yu 2025, "Coefficients-Preserving Sampling for
  Reinforcement Learning with Flow Matching"; flow_grpo ``sde_type="cps"``): std = σ'·sin(η·π/2),
  the log-prob is −(x' − μ)² with all constants dropped.

The log-prob is the per-element **mean** over all non-batch dims, as the reference implementations.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

import torch

from diffrl.core.registry import Registry, RegistryError, override_problems


@dataclass
class StepOutput:
    """``prev_sample, mean: (B, *latent)``; ``log_prob, std: (B,)`` (None for a deterministic step)."""

    prev_sample: torch.Tensor
    log_prob: torch.Tensor | None = None
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None


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
    std = torch.sqrt(s / (1 - torch.clamp(s, max=sigma_max))) * noise_level  # sigma_max at the first step
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


class Kernel(ABC):
    """A transition kernel of the reverse process (see the module docstring for the contract).

    ``step``: ``x_t, velocity (B, *latent)``, ``sigma, sigma_next (B,)``. A stochastic kernel takes
    ``noise (B, *latent)`` to sample, or ``prev_sample`` to score a recorded transition (then its
    ``prev_sample`` is the given one), with ``noise_level`` (η) and ``sigma_max`` (the schedule's
    ``sigmas[1]``, for σ = 1). ``velocity_at(x, sigma) -> velocity`` is given to kernels with
    ``second_evaluation``.
    """

    stochastic: ClassVar[bool] = False
    second_evaluation: ClassVar[bool] = False

    @abstractmethod
    def step(
        self,
        x_t: torch.Tensor,
        velocity: torch.Tensor,
        sigma: torch.Tensor,
        sigma_next: torch.Tensor,
        *,
        noise_level: float = 0.0,
        sigma_max: float = 1.0,
        noise: torch.Tensor | None = None,
        prev_sample: torch.Tensor | None = None,
        velocity_at: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> StepOutput: ...


class Euler(Kernel):
    """``ode``: deterministic Euler (:func:`ode_step`)."""

    def step(self, x_t, velocity, sigma, sigma_next, **_) -> StepOutput:
        return StepOutput(ode_step(x_t, velocity, sigma, sigma_next))


class _GaussianStep(Kernel):
    """A stochastic kernel given by one of the step functions above, ``fn(x_t, velocity, sigma,
    sigma_next, noise_level, sigma_max, noise, prev_sample) -> StepOutput``."""

    stochastic = True
    fn: ClassVar[Callable[..., StepOutput]]

    def step(
        self,
        x_t,
        velocity,
        sigma,
        sigma_next,
        *,
        noise_level=0.0,
        sigma_max=1.0,
        noise=None,
        prev_sample=None,
        **_,
    ) -> StepOutput:
        return type(self).fn(x_t, velocity, sigma, sigma_next, noise_level, sigma_max, noise, prev_sample)


class FlowSDE(_GaussianStep):
    """``sde``: Flow-GRPO's marginal-preserving SDE (:func:`sde_step`)."""

    fn = staticmethod(sde_step)


class CPS(_GaussianStep):
    """``cps``: coefficients-preserving sampling (:func:`cps_step`)."""

    fn = staticmethod(cps_step)


class Heun(Kernel):
    """``heun``: Heun's 2nd-order step (Karras et al. 2022, "Elucidating the Design Space of
    Diffusion-Based Generative Models", Alg. 1): Euler, then the trapezoid of the two velocities;
    the last step to sigma = 0 stays Euler."""

    second_evaluation = True

    def step(self, x_t, velocity, sigma, sigma_next, *, velocity_at=None, **_) -> StepOutput:
        x_euler = ode_step(x_t, velocity, sigma, sigma_next)
        if bool((sigma_next == 0).all()):
            return StepOutput(x_euler)
        v2 = velocity_at(x_euler, sigma_next)
        dt = (sigma_next - sigma).view(-1, *[1] * (x_t.ndim - 1))
        return StepOutput(x_t + dt * 0.5 * (velocity + v2))


KERNELS = Registry(
    "sampler kernel",
    {
        "ode": "diffrl.sampling.kernels:Euler",
        "sde": "diffrl.sampling.kernels:FlowSDE",
        "cps": "diffrl.sampling.kernels:CPS",
        "heun": "diffrl.sampling.kernels:Heun",
    },
    check=lambda obj: (
        "; ".join(override_problems(obj, Kernel)) or None
        if isinstance(obj, type) and issubclass(obj, Kernel)
        else None  # not a subclass at all: resolve_kernel says so
    ),
)


def resolve_kernel(name: str) -> Kernel:
    """``ode | sde | cps | heun`` or a dotted path to a :class:`Kernel` subclass -> an instance;
    raises :class:`~diffrl.core.registry.RegistryError` naming the known ones."""
    obj = KERNELS.resolve(name)
    if isinstance(obj, type) and issubclass(obj, Kernel):
        return obj()
    if isinstance(obj, Kernel):
        return obj
    raise RegistryError(
        f"sampler {name!r} resolves to {obj!r}, not a diffrl.sampling.kernels.Kernel subclass "
        "(one with step(x_t, velocity, sigma, sigma_next, ...) -> StepOutput and a stochastic flag)"
    )


def kernel_problems(where: str, name: str, stochastic: bool | None = None) -> list[str]:
    """Config problems with a sampler name (unknown, not a kernel, or, with ``stochastic``, not of
    the kind an algorithm needs)."""
    try:
        kernel = resolve_kernel(name)
    except RegistryError as e:
        return [f"{where}: {e}"]
    if stochastic and not kernel.stochastic:
        return [
            f"{where}={name!r} is deterministic: this algorithm needs a stochastic sampler to have "
            "log-probs to optimise; use sde or cps (or a stochastic Kernel of your own)"
        ]
    return []
