"""DiffusionNFT: online RL on the forward process (Zheng et al. 2025, arXiv 2509.16117, Eq. 5 and
Algorithm 1; NVlabs/DiffusionNFT ``scripts/train_nft_sd3.py``).

Only the clean sample x0 of each rollout and its reward are needed. For a fresh
``x_t = (1 − t)·x0 + t·ε``, with the current velocity v_θ and the old (sampling) policy's v_old:

    r   = clamp(clamp(A, ±C) / C / 2 + 0.5, 0, 1)                     (C = adv_clip_max)
    v⁺  = β·v_θ + (1 − β)·v_old,      v⁻ = (1 + β)·v_old − β·v_θ      (implicit policies)
    x0± = x_t − t·v±,                 w± = mean|x0± − x0|  (detached, float64, ≥ 1e-5)
    L   = C · mean_b[(r·mean((x0⁺ − x0)²/w⁺) + (1 − r)·mean((x0⁻ − x0)²/w⁻)) / β]
        + kl_beta · mean((v_θ − v_ref)²)

The old policy is a trailing copy of the weights (``θ_old ← d·θ_old + (1 − d)·θ`` after each
rollout, the reference's ``return_decay`` schedules); rollouts sample from it. Timesteps are the
sampler's own sigma grid, a per-sample shuffled fraction of it, with fresh noise per (sample, t).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from diffrl.algorithms.advantages import aggregation_problems, batch_advantages
from diffrl.algorithms.base import (
    AdvClip,
    DiffusionAlgorithm,
    KlBeta,
    NoiseLevel,
    TimestepFraction,
    TrainCost,
    x0_collection_problems,
    x0_only_spec,
)
from diffrl.algorithms.forward_process import expand_timesteps, noised
from diffrl.config import Range
from diffrl.config.binding import value_problems
from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals

DECAY_SCHEDULES = ("none", "ramp", "flat_ramp")
ADV_MODES = ("all", "positive_only", "negative_only", "binary")


def old_policy_decay(schedule: str, step: int) -> float:
    """The reference's ``return_decay``: ``none`` 0 (old = live after every rollout);
    ``ramp`` min(0.001·step, 0.5); ``flat_ramp`` 0 for 75 steps, then +0.0075 a step up to 0.999."""
    flat, rate, cap = {"none": (0, 0.0, 0.0), "ramp": (0, 0.001, 0.5), "flat_ramp": (75, 0.0075, 0.999)}[
        schedule
    ]
    return 0.0 if step < flat else min((step - flat) * rate, cap)


def nft_reward_weight(advantages: torch.Tensor, adv_clip_max: float, mode: str = "all") -> torch.Tensor:
    """``advantages (B,)`` -> r in [0, 1]: the optimality probability of each sample."""
    a = advantages.clamp(-adv_clip_max, adv_clip_max)
    if mode == "positive_only":
        a = a.clamp(min=0.0)
    elif mode == "negative_only":
        a = a.clamp(max=0.0)
    elif mode == "binary":
        a = torch.sign(a) * adv_clip_max
    return (a / adv_clip_max / 2.0 + 0.5).clamp(0.0, 1.0)


@dataclass
class NFTTerms:
    """``loss, policy_loss, kl_loss``: scalars; ``per_sample (B,)``; ``pos_loss, neg_loss (B,)``
    the unweighted positive / negative x0 errors."""

    loss: torch.Tensor
    policy_loss: torch.Tensor
    kl_loss: torch.Tensor
    per_sample: torch.Tensor
    pos_loss: torch.Tensor
    neg_loss: torch.Tensor


def _adaptive_x0_loss(x0_pred: torch.Tensor, x0: torch.Tensor) -> torch.Tensor:
    dims = tuple(range(1, x0.ndim))
    with torch.no_grad():
        weight = (x0_pred.double() - x0.double()).abs().mean(dims, keepdim=True).clamp(min=1e-5)
    return ((x0_pred - x0) ** 2 / weight).mean(dims)


def nft_loss(
    x0: torch.Tensor,
    x_t: torch.Tensor,
    t: torch.Tensor,
    v_new: torch.Tensor,
    v_old: torch.Tensor,
    r: torch.Tensor,
    beta: float,
    adv_clip_max: float,
    v_ref: torch.Tensor | None = None,
    kl_beta: float = 0.0,
) -> NFTTerms:
    """The DiffusionNFT objective. ``x0, x_t, v_new, v_old, v_ref: (B, *latent)``, ``t, r: (B,)``."""
    t_ = t.view(-1, *[1] * (x0.ndim - 1)).to(v_new.dtype)
    v_old = v_old.detach()
    v_pos = beta * v_new + (1.0 - beta) * v_old
    v_neg = (1.0 + beta) * v_old - beta * v_new
    pos = _adaptive_x0_loss(x_t - t_ * v_pos, x0)
    neg = _adaptive_x0_loss(x_t - t_ * v_neg, x0)
    per_sample = (r * pos + (1.0 - r) * neg) / beta
    policy_loss = adv_clip_max * per_sample.mean()
    kl = torch.zeros((), dtype=policy_loss.dtype)
    if v_ref is not None:
        kl = (v_new - v_ref.detach()).pow(2).flatten(1).mean(1).mean()
    return NFTTerms(policy_loss + kl_beta * kl, policy_loss, kl, per_sample, pos.detach(), neg.detach())


@dataclass
class NFTExamples(TrainExamples):
    """One (sample, timestep) pair per row. ``x0, noise: (N, *latent)``; ``t, r, sample_id: (N,)``."""

    sample_id: torch.Tensor
    x0: torch.Tensor
    noise: torch.Tensor
    t: torch.Tensor
    r: torch.Tensor
    cond: Conditioning


class DiffusionNFT(DiffusionAlgorithm):
    name = "diffusion_nft"
    requires = frozenset({"sigmas"})
    keeps_old_policy = True

    @dataclass
    class Params:
        beta: Annotated[
            float, Range(0, 100, lo_open=True, hint="it divides the loss; e.g. 1.0 (the reference's), 0.1")
        ] = 1.0
        """Mix of the current and old policy in the implicit positive / negative policies (> 0)."""
        adv_clip_max: AdvClip = 5.0
        adv_mode: Literal["all", "positive_only", "negative_only", "binary"] = "all"
        kl_beta: KlBeta = 0.0
        """Weight of the velocity-space KL to the reference (the base model: LoRA disabled)."""
        decay_schedule: Literal["none", "ramp", "flat_ramp"] = "ramp"
        """Old-policy decay: ``none`` (0), ``ramp`` (min(0.001·step, 0.5)), ``flat_ramp``
        (0 for 75 steps, then +0.0075 a step up to 0.999)."""
        timestep_fraction: TimestepFraction = 1.0
        """Train on this fraction of the sampler's timesteps per sample (a shuffled subset)."""
        global_std: bool = False
        """Divide advantages by the std of the whole batch instead of the prompt group."""
        advantage_aggregation: Literal["sum", "per_reward"] = "sum"
        """Several rewards: ``sum`` normalises their weighted sum; ``per_reward`` normalises each
        within its group before the weighted sum (GDPO; see :mod:`diffrl.algorithms.advantages`)."""
        sampler: str = "ode"
        """How rollouts are drawn: any sampler works, NFT needs only x0."""
        noise_level: NoiseLevel = 0.7
        """For ``sde`` / ``cps`` collection only."""
        train_cfg: bool = False
        """Train the CFG-combined velocity (``sampling.guidance_scale``) instead of the conditional
        one. Off, as the reference: NFT trains the conditional model (CFG-free), from samples
        drawn with whatever guidance the recipe sets."""

    def validate(self, config) -> list[str]:
        p = self.params
        errors = value_problems(p, "algorithm.params")
        if not errors and int(config.sampling.num_steps * p.timestep_fraction) < 1:
            errors.append(
                f"algorithm.params.timestep_fraction={p.timestep_fraction} of sampling.num_steps="
                f"{config.sampling.num_steps} trains on no timestep; raise it"
            )
        errors += aggregation_problems(p.advantage_aggregation)
        return errors + x0_collection_problems(p.sampler, p.global_std, config)

    @property
    def needs_reference(self) -> bool:
        return self.params.kl_beta > 0

    def old_policy_decay(self, optimizer_step: int) -> float:
        return old_policy_decay(self.params.decay_schedule, optimizer_step)

    def train_cost(self) -> TrainCost:
        """``timestep_fraction`` of the sampling steps per sample, each with the old policy's
        forward (and the reference's when kept); CFG only with ``train_cfg``."""
        k = int(self.config.sampling.num_steps * self.params.timestep_fraction)
        return TrainCost(max(1, k), self.params.train_cfg, 1 + int(bool(self.needs_reference)))

    def collection_spec(self) -> CollectionSpec:
        return x0_only_spec(self.params.sampler, self.params.noise_level)

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        p = self.params
        adv = batch_advantages(batch, rewards, self.config.rewards, p.advantage_aggregation, p.global_std)
        r = nft_reward_weight(adv.advantages.float(), self.params.adv_clip_max, self.params.adv_mode)
        return TrainSignals({"advantages": adv.advantages.float(), "r": r})

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> NFTExamples:
        s = self.config.sampling
        seed = self.config.run.seed
        grid = batch.sigmas[0, :-1].cpu()  # the sampler's timesteps, t = 1 first
        k = int(s.num_steps * self.params.timestep_fraction)
        rows = expand_timesteps(
            batch,
            seed,
            "nft",
            lambda gen: grid[torch.randperm(len(grid), generator=gen)[:k]].tolist(),
        )
        idx = rows.idx
        return NFTExamples(
            sample_id=idx,
            x0=batch.x0[idx],
            noise=rows.noise,
            t=rows.t,
            r=signals.values["r"][idx].to(batch.x0.device),
            cond=batch.cond.select(idx),
        )

    def _velocities(self, policy, examples: NFTExamples, *of: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``x_t`` of the examples and the velocities there of the ``live`` policy (with
        gradients), the ``old`` one and the ``reference``, in the order asked."""
        x_t = noised(examples.x0, examples.noise, examples.t)
        guidance = self.config.sampling.guidance_scale if self.params.train_cfg else 1.0
        negative = policy.negative(examples.cond) if self.params.train_cfg else None
        forwards = {
            "live": policy.velocity,
            "old": policy.old_velocity,
            "reference": policy.reference_velocity,
        }
        return x_t, [
            forwards[name](x_t, examples.t, examples.cond, guidance_scale=guidance, negative=negative)
            for name in of
        ]

    def drift(self, policy, examples: NFTExamples) -> dict[str, float]:
        """``monitor/kl_to_base`` of a run without ``kl_beta``: the velocity KL of the live policy
        to the base on the examples' timesteps and noise, ``mean((v_θ − v_ref)²)`` as
        :func:`nft_loss`'s ``kl_loss``."""
        _, (v_new, v_ref) = self._velocities(policy, examples, "live", "reference")
        return {"monitor/kl_to_base": (v_new - v_ref).pow(2).flatten(1).mean(1).mean().item()}

    def compute_loss(self, policy, examples: NFTExamples) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        x_t, (v_old, v_new, *ref) = self._velocities(
            policy, examples, "old", "live", *(["reference"] if p.kl_beta > 0 else [])
        )
        v_ref = ref[0] if ref else None
        terms = nft_loss(
            examples.x0, x_t, examples.t, v_new, v_old, examples.r, p.beta, p.adv_clip_max, v_ref, p.kl_beta
        )
        metrics = {
            "train/policy_loss": terms.policy_loss.item(),
            "train/nft_pos_loss": terms.pos_loss.mean().item(),
            "train/nft_neg_loss": terms.neg_loss.mean().item(),
            "train/nft_r_mean": examples.r.mean().item(),
            "train/old_deviate": (v_new.detach() - v_old).pow(2).mean().item(),
            "train/kl_loss": terms.kl_loss.item(),
        }
        if p.kl_beta > 0:  # the drift from the base, for free here (drift() for other runs)
            metrics["monitor/kl_to_base"] = terms.kl_loss.item()
        return terms.loss, metrics
