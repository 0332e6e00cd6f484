"""Advantage Weighted Matching (Xue et al. 2025, arXiv 2509.25050; scxue/advantage_weighted_matching
``scripts/train_sd3_awm.py``).

AWM replaces the sampler's transition log-prob of Flow-GRPO by the flow-matching likelihood
surrogate of the clean sample, so it needs no trajectory: for fresh ``x_t = (1 − t)·x0 + t·ε``,

    mse   = mean((v_θ(x_t, t) − (ε − x0))²)                        (over all non-batch dims)
    log p = −mse  (``uniform``),  −t·mse  (``t``),  −t·((mse + δ)^p − δ^p)/p  (``ghuber``, δ = 1e-10)

and optimises PPO's clipped surrogate of ``exp(log p − log p_old)`` with the group advantage,
``log p_old`` taken with the weights at the start of the update (ratio = 1 on-policy, where the
gradient is the advantage-weighted flow-matching gradient), plus an optional velocity-space KL
``kl_beta·mean((v_θ − v_ref)²)`` to the reference (LoRA disabled). Timesteps are stratified: one per
stratum of a logit-normal (shifted), a uniform (shifted) or the sampler's own grid.

Two options of the reference's training loop (its shipped configs, ``config/dgx_awm.py``, set both;
here they are off by default, which keeps the shipped tiny results):

- ``advantage_max`` (the reference's ``train.advantage_max``): the clamped advantage is rescaled
  to ``[−advantage_max, advantage_max]``, ``A ← clamp(A, ±adv_clip_max) / adv_clip_max ·
  advantage_max`` (:func:`scaled_advantages`).
- EMA-KL (``ema_kl_beta``, the reference's ``train.ema_beta``): a second copy of the trainable
  weights (its ``"ema"`` LoRA adapter, a copy of the starting ones) moves after every iteration
  as ``θ_ema ← d·θ_ema + (1 − d)·θ`` with ``d = min(ema_kl_decay, 0.001·step)`` (``linear``,
  ``step`` the optimizer steps so far) or ``d = ema_kl_decay`` (``constant``), and the loss adds
  ``ema_kl_beta·mean((v_θ − v_ema)²)`` (its ``kl_ema_weight: Uniform``). Rollouts still sample
  with the live weights (the reference's ``off_policy: False``). The reference adds it only inside
  ``if beta > 0``; with ``kl_beta = 0`` it applies here too, an extension (not the reference's).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from diffrl.algorithms.advantages import aggregation_problems, batch_advantages
from diffrl.algorithms.base import (
    AdvClip,
    ClipRange,
    DiffusionAlgorithm,
    KlBeta,
    LogitMean,
    LogitStd,
    NoiseLevel,
    TimeShift,
    TimestepFraction,
    Timesteps,
    TrainCost,
    x0_collection_problems,
    x0_only_spec,
)
from diffrl.algorithms.flow_grpo import ppo_clip_loss
from diffrl.algorithms.forward_process import expand_timesteps, noised
from diffrl.config import Range
from diffrl.config.binding import value_problems
from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals

GHUBER_DELTA = 1e-10
EMA_KL_RAMP = 0.001
"""``linear`` EMA-KL decay: ``min(ema_kl_decay, 0.001·step)``, as the reference's loop."""


def awm_log_prob(
    v: torch.Tensor,
    x0: torch.Tensor,
    noise: torch.Tensor,
    t: torch.Tensor,
    weighting: str = "uniform",
    power: float = 0.25,
) -> torch.Tensor:
    """The flow-matching likelihood surrogate ``(B,)`` (float64) of ``v, x0, noise: (B, *latent)``
    at ``t: (B,)``."""
    mse = (v.double() - (noise - x0).double()).square().flatten(1).mean(1)
    t = t.double()
    if weighting == "uniform":
        return -mse
    if weighting == "t":
        return -t * mse
    return -t * ((mse + GHUBER_DELTA) ** power - GHUBER_DELTA**power) / power


def scaled_advantages(
    advantages: torch.Tensor, adv_clip_max: float, advantage_max: float | None
) -> torch.Tensor:
    """``advantages (B,)`` clamped to ``±adv_clip_max`` and, with ``advantage_max``, rescaled to
    ``±advantage_max``: the reference's ``clamp(A, −c, c) / c · advantage_max``."""
    clamped = advantages.clamp(-adv_clip_max, adv_clip_max)
    return clamped if advantage_max is None else clamped / adv_clip_max * advantage_max


def velocity_kl(v: torch.Tensor, v_other: torch.Tensor) -> torch.Tensor:
    """``v, v_other: (B, *latent)`` -> the batch mean of each row's ``mean((v − v_other)²)``,
    float64: the reference's ``Uniform`` KL (to the base model, or to the EMA)."""
    return (v - v_other).pow(2).flatten(1).mean(1).mean().double()


def ema_kl_decay(schedule: str, decay: float, step: int) -> float:
    """``d`` of the EMA-KL anchor after ``step`` optimizer steps: ``linear`` ``min(decay,
    0.001·step)`` (near 0 early: the anchor is about the last iteration's weights), ``constant``
    ``decay``."""
    return min(decay, EMA_KL_RAMP * step) if schedule == "linear" else decay


def stratified_timesteps(
    gen: torch.Generator,
    k: int,
    scheme: str,
    shift: float,
    logit_mean: float = 0.0,
    logit_std: float = 1.0,
    grid: torch.Tensor | None = None,
) -> list[float]:
    """``k`` timesteps in (0, 1], one per stratum of the scheme's distribution.

    ``logit_normal``: ``sigmoid(mean + std·Φ⁻¹(u))``; ``uniform``: ``u``; both then shifted like the
    sampler (``shift·t / (1 + (shift − 1)·t)``) and kept >= 0.01. ``discrete``: a grid index drawn
    in each of ``k`` equal index bins of ``grid``."""
    u = (torch.arange(k, dtype=torch.float64) + torch.rand(k, generator=gen, dtype=torch.float64)) / k
    if scheme == "discrete":
        edges = torch.linspace(0, len(grid), k + 1).long()
        idx = [int(lo + (u[i] * k - i) * (hi - lo)) for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:]))]
        return [grid[min(j, len(grid) - 1)].item() for j in idx]
    if scheme == "logit_normal":
        z = torch.special.ndtri(u.clamp(1e-6, 1 - 1e-6))
        t = torch.sigmoid(logit_mean + logit_std * z)
    else:
        t = u
    t = shift * t / (1 + (shift - 1) * t)
    return t.clamp(min=0.01).tolist()


@dataclass
class AWMExamples(TrainExamples):
    """One (sample, timestep) pair per row: ``x0, noise (N, *latent)``; ``t, advantages (N,)``;
    ``old_log_prob (N,)`` float64, NaN until :meth:`AWM.before_update` fills it."""

    sample_id: torch.Tensor
    x0: torch.Tensor
    noise: torch.Tensor
    t: torch.Tensor
    advantages: torch.Tensor
    old_log_prob: torch.Tensor
    cond: Conditioning


class AWM(DiffusionAlgorithm):
    name = "awm"
    requires = frozenset({"sigmas"})

    @dataclass
    class Params:
        timestep_sampling: Literal["logit_normal", "uniform", "discrete"] = "logit_normal"
        num_timesteps: Timesteps = 4
        """Timesteps per sample (one per stratum)."""
        time_shift: TimeShift = 3.0
        """Shift of ``logit_normal`` / ``uniform`` timesteps (as the sampler's schedule)."""
        logit_mean: LogitMean = 0.0
        logit_std: LogitStd = 1.0
        timestep_fraction: TimestepFraction = 0.9
        """``discrete``: draw from the first fraction of the sampler's grid, its first step excluded."""
        weighting: Literal["uniform", "t", "ghuber"] = "uniform"
        ghuber_power: Annotated[
            float, Range(0, 2, lo_open=True, hint="p of ghuber, e.g. 0.25; 1: the t weighting")
        ] = 0.25
        clip_range: ClipRange = 1.0
        adv_clip_max: AdvClip = 5.0
        advantage_max: Annotated[float, Range(0, 1e4, lo_open=True, hint="e.g. 1.0, or null")] | None = None
        """Rescale the clamped advantages to ``±advantage_max`` (the reference's ``advantage_max``:
        1 in its shipped configs); null: not rescaled."""
        kl_beta: KlBeta = 0.0
        """Weight of the velocity-space KL to the reference (the base model: LoRA disabled)."""
        ema_kl_beta: Annotated[float, Range(0, 100, hint="0: no KL to the EMA; e.g. 1.0")] = 0.0
        """Weight of the velocity-space KL to an EMA of the policy (the reference's ``ema_beta``:
        1 in its shipped configs); > 0 keeps that EMA, a second copy of the trainable weights."""
        ema_kl_decay: Annotated[float, Range(0, 1, hint="the EMA's decay, e.g. 0.3")] = 0.3
        """Cap (``linear``) or value (``constant``) of the EMA's decay (the reference's ``kl_ema_decay``)."""
        ema_kl_decay_schedule: Literal["linear", "constant"] = "linear"
        """``linear``: ``min(ema_kl_decay, 0.001·step)``; ``constant``: ``ema_kl_decay`` (the
        reference's ``kl_ema_decay_type``)."""
        global_std: bool = True
        """Divide advantages by the std of the whole batch (the reference's OCR setting)."""
        advantage_aggregation: Literal["sum", "per_reward"] = "sum"
        """Several rewards: ``sum`` normalises their weighted sum; ``per_reward`` normalises each
        within its group before the weighted sum (GDPO; see :mod:`diffrl.algorithms.advantages`)."""
        sampler: str = "ode"
        """How rollouts are drawn: any sampler works, AWM needs only x0."""
        noise_level: NoiseLevel = 0.7
        """For ``sde`` / ``cps`` collection only."""
        train_cfg: bool = False
        """Use the CFG-combined velocity (``sampling.guidance_scale``) in the likelihood surrogate
        instead of the conditional one (the reference's ``train.cfg``, off by default)."""

    def validate(self, config) -> list[str]:
        p = self.params
        errors = value_problems(p, "algorithm.params")
        if not errors and p.timestep_sampling == "discrete":
            usable = int(config.sampling.num_steps * p.timestep_fraction) - 1
            if usable < p.num_timesteps:
                errors.append(
                    f"algorithm.params: discrete timesteps use {usable} grid step(s) (sampling.num_steps="
                    f"{config.sampling.num_steps} x timestep_fraction={p.timestep_fraction}, first excluded) "
                    f"but num_timesteps={p.num_timesteps}; lower num_timesteps or raise timestep_fraction"
                )
        errors += aggregation_problems(p.advantage_aggregation)
        return errors + x0_collection_problems(p.sampler, p.global_std, config)

    @property
    def needs_reference(self) -> bool:
        return self.params.kl_beta > 0

    @property
    def keeps_old_policy(self) -> bool:
        """The EMA-KL anchor is the actor's old-policy copy, kept only for the loss."""
        return self.params.ema_kl_beta > 0

    samples_with_old_policy = False

    def old_policy_decay(self, optimizer_step: int) -> float:
        p = self.params
        return ema_kl_decay(p.ema_kl_decay_schedule, p.ema_kl_decay, optimizer_step)

    def train_cost(self) -> TrainCost:
        """``num_timesteps`` drawn per sample, each replayed once without gradient before the
        update (the old log-likelihood) and, when kept, by the reference and the EMA; CFG only
        with ``train_cfg``."""
        extra = 1 + int(bool(self.needs_reference)) + int(bool(self.keeps_old_policy))
        return TrainCost(self.params.num_timesteps, self.params.train_cfg, extra)

    def collection_spec(self) -> CollectionSpec:
        return x0_only_spec(self.params.sampler, self.params.noise_level)

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        p = self.params
        adv = batch_advantages(batch, rewards, self.config.rewards, p.advantage_aggregation, p.global_std)
        return TrainSignals({"advantages": adv.advantages.float()})

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> AWMExamples:
        p, s = self.params, self.config.sampling
        seed = self.config.run.seed
        grid = None
        if p.timestep_sampling == "discrete":
            grid = batch.sigmas[0, 1 : int(s.num_steps * p.timestep_fraction)].cpu()
        rows = expand_timesteps(
            batch,
            seed,
            "awm",
            lambda gen: stratified_timesteps(
                gen, p.num_timesteps, p.timestep_sampling, p.time_shift, p.logit_mean, p.logit_std, grid
            ),
        )
        idx, device = rows.idx, batch.x0.device
        return AWMExamples(
            sample_id=idx,
            x0=batch.x0[idx],
            noise=rows.noise,
            t=rows.t,
            advantages=signals.values["advantages"][idx].to(device),
            old_log_prob=torch.full((len(idx),), math.nan, dtype=torch.float64, device=device),
            cond=batch.cond.select(idx),
        )

    def _velocity(self, policy, examples: AWMExamples, of: str = "live") -> torch.Tensor:
        """The velocity of the ``live`` policy (with gradients), the ``reference`` or the ``ema``."""
        x_t = noised(examples.x0, examples.noise, examples.t)
        forward = {
            "live": policy.velocity,
            "reference": policy.reference_velocity,
            "ema": policy.old_velocity,
        }[of]
        if not self.params.train_cfg:
            return forward(x_t, examples.t, examples.cond)
        return forward(
            x_t,
            examples.t,
            examples.cond,
            guidance_scale=self.config.sampling.guidance_scale,
            negative=policy.negative(examples.cond),
        )

    def _log_prob(self, v: torch.Tensor, examples: AWMExamples) -> torch.Tensor:
        p = self.params
        return awm_log_prob(v, examples.x0, examples.noise, examples.t, p.weighting, p.ghuber_power)

    def before_update(self, policy, examples: AWMExamples) -> AWMExamples:
        # same micro-batches as the update that follows, so the first ratio is exactly 1
        parts = [self._log_prob(self._velocity(policy, mb), mb) for mb in policy.micro_batches(examples)]
        examples.old_log_prob = torch.cat(parts)
        return examples

    def drift(self, policy, examples: AWMExamples) -> dict[str, float]:
        """``monitor/kl_to_base`` of a run without ``kl_beta``: the velocity KL to the base on the
        examples' drawn timesteps and noise (:func:`velocity_kl`), as a ``kl_beta`` run's loss."""
        v = self._velocity(policy, examples)
        return {"monitor/kl_to_base": velocity_kl(v, self._velocity(policy, examples, "reference")).item()}

    def compute_loss(self, policy, examples: AWMExamples) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        if torch.isnan(examples.old_log_prob).any():
            raise RuntimeError("AWM: old log-likelihoods missing; the loop must call before_update first")
        v = self._velocity(policy, examples)
        log_prob = self._log_prob(v, examples)
        advantages = scaled_advantages(examples.advantages.double(), p.adv_clip_max, p.advantage_max)
        clip = p.adv_clip_max if p.advantage_max is None else p.advantage_max  # already within it
        terms = ppo_clip_loss(log_prob, examples.old_log_prob, advantages, p.clip_range, clip)
        loss = terms.policy_loss
        kl = torch.zeros((), dtype=loss.dtype)
        if p.kl_beta > 0:
            kl = velocity_kl(v, self._velocity(policy, examples, "reference"))
            loss = loss + p.kl_beta * kl
        metrics = {**terms.metrics(kl), "train/awm_log_prob": log_prob.detach().mean().item()}
        if p.kl_beta > 0:
            metrics["monitor/kl_to_base"] = kl.detach().item()  # the drift from the base, for free here
        if p.ema_kl_beta > 0:
            ema_kl = velocity_kl(v, self._velocity(policy, examples, "ema"))
            loss = loss + p.ema_kl_beta * ema_kl
            metrics["train/ema_kl_loss"] = ema_kl.detach().item()
        return loss, metrics
