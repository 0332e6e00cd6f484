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
from diffrl.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals

GHUBER_DELTA = 1e-10


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
        kl_beta: KlBeta = 0.0
        """Weight of the velocity-space KL to the reference (the base model: LoRA disabled)."""
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

    def train_cost(self) -> TrainCost:
        """``num_timesteps`` drawn per sample, each replayed once without gradient before the
        update (the old log-likelihood) and, when kept, by the reference; CFG only with ``train_cfg``."""
        return TrainCost(
            self.params.num_timesteps, self.params.train_cfg, 1 + int(bool(self.needs_reference))
        )

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

    def _velocity(self, policy, examples: AWMExamples, reference: bool = False) -> torch.Tensor:
        x_t = noised(examples.x0, examples.noise, examples.t)
        forward = policy.reference_velocity if reference else policy.velocity
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

    def compute_loss(self, policy, examples: AWMExamples) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        if torch.isnan(examples.old_log_prob).any():
            raise RuntimeError("AWM: old log-likelihoods missing; the loop must call before_update first")
        v = self._velocity(policy, examples)
        log_prob = self._log_prob(v, examples)
        terms = ppo_clip_loss(
            log_prob, examples.old_log_prob, examples.advantages.double(), p.clip_range, p.adv_clip_max
        )
        loss = terms.policy_loss
        kl = torch.zeros((), dtype=loss.dtype)
        if p.kl_beta > 0:
            v_ref = self._velocity(policy, examples, reference=True)
            kl = (v - v_ref).pow(2).flatten(1).mean(1).mean().double()
            loss = loss + p.kl_beta * kl
        return loss, {
            **terms.metrics(kl),
            "train/awm_log_prob": log_prob.detach().mean().item(),
        }
