"""Supervised fine-tuning with the flow-matching objective.

Loss (Lipman et al. 2023, "Flow Matching for Generative Modeling"; rectified-flow form of
Esser et al. 2024, "Scaling Rectified Flow Transformers", Eq. 1-3, as diffusers'
``examples/dreambooth/train_dreambooth_sd3.py``):

    x_t = (1 - t) * x0 + t * eps,    L = || v_θ(x_t, t) - (eps - x0) ||²

with t drawn logit-normal (SD3's default ``weighting_scheme="logit_normal"``) and optionally
shifted like the sampler's schedule. Offline data, no sampling, no reward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch

from diffrl.algorithms.base import DiffusionAlgorithm, LogitMean, LogitStd, TimeShift
from diffrl.config import Range
from diffrl.config.binding import value_problems
from diffrl.core.rollout import CollectionSpec, RolloutBatch, Source, TrainExamples, TrainSignals
from diffrl.core.seeding import generator


@dataclass
class SFTExamples(TrainExamples):
    """``x0, noise: (B, *latent)``; ``sigma: (B,)``; ``prompts``: the captions, "" where dropped
    for CFG; ``sources``: an editing family's source images (kept when the caption is dropped),
    else None. Prompts are encoded in ``compute_loss`` (cached, or with gradients when the family
    trains its text encoder)."""

    sample_id: torch.Tensor
    x0: torch.Tensor
    prompts: list[str]
    noise: torch.Tensor
    sigma: torch.Tensor
    sources: list[Source] | None = None


def flow_matching_loss(velocity: torch.Tensor, x0: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Per-sample ``mean((v - (noise - x0))²)`` over all non-batch dims: ``(B,)``."""
    return (velocity.float() - (noise - x0).float()).square().flatten(1).mean(1)


def draw_timestep(
    gen: torch.Generator, scheme: str, logit_mean: float, logit_std: float, shift: float
) -> float:
    """One t in (0, 1): logit-normal ``sigmoid(N(mean, std))`` or uniform, then ``shift``ed."""
    if scheme == "logit_normal":
        t = torch.sigmoid(logit_mean + logit_std * torch.randn((), generator=gen)).item()
    else:
        t = torch.rand((), generator=gen).item()
    return shift * t / (1 + (shift - 1) * t)


class SFT(DiffusionAlgorithm):
    name = "sft"

    @dataclass
    class Params:
        timestep_sampling: Literal["logit_normal", "uniform"] = "logit_normal"
        logit_mean: LogitMean = 0.0
        logit_std: LogitStd = 1.0
        timestep_shift: TimeShift = 1.0
        cond_dropout: Annotated[float, Range(0, 1, hi_open=True, hint="a probability, e.g. 0.1")] = 0.0
        """Probability of training a sample with the empty prompt (enables CFG at sampling)."""

    def validate(self, config) -> list[str]:
        # the params' ranges (checked when they bind; again here for params built in code)
        return value_problems(self.params, "algorithm.params")

    def collection_spec(self) -> CollectionSpec:
        return CollectionSpec(online=False, needs_reward=False)

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        return TrainSignals()

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> SFTExamples:
        p = self.params
        seed = self.config.run.seed
        noise, sigma, drop = [], [], []
        for idx, position in zip(batch.prompt_index.tolist(), batch.sample_index.tolist()):
            gen = generator(seed, "sft", iteration, idx, position)
            noise.append(torch.randn(batch.x0.shape[1:], generator=gen))
            sigma.append(draw_timestep(gen, p.timestep_sampling, p.logit_mean, p.logit_std, p.timestep_shift))
            drop.append(torch.rand((), generator=gen).item() < p.cond_dropout)
        return SFTExamples(
            sample_id=torch.arange(len(batch)),
            x0=batch.x0,
            prompts=["" if d else prompt for d, prompt in zip(drop, batch.prompts)],
            noise=torch.stack(noise).to(batch.x0.device),
            sigma=torch.tensor(sigma, device=batch.x0.device),
            sources=batch.sources,
        )

    def compute_loss(self, policy, examples: SFTExamples) -> tuple[torch.Tensor, dict[str, float]]:
        cond = policy.family.encode_prompts(examples.prompts, examples.sources)
        s = examples.sigma.view(-1, *[1] * (examples.x0.ndim - 1))
        x_t = (1 - s) * examples.x0 + s * examples.noise
        v = policy.velocity(x_t, examples.sigma, cond)
        loss = flow_matching_loss(v, examples.x0, examples.noise).mean()
        return loss, {"train/fm_loss": loss.item()}
