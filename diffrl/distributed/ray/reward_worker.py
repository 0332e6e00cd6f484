"""The reward worker actor: a plain class that :class:`~diffrl.distributed.ray.runner.RayRunner`
wraps with ``ray.remote``; it scores with a :class:`~diffrl.rewards.base.RewardSet` in its process.

A module of its own because a Ray worker imports the module of its actor's class: this one needs
torch and the rewards, not diffusers, peft or the models (measured on 2 CPU cores: 1.7 s and
~230 MB to import, against 4.9 s and ~390 MB for :mod:`.actors`)."""

from __future__ import annotations

import torch

from diffrl.config import RewardConfig
from diffrl.core import determinism
from diffrl.core.rollout import Audio
from diffrl.distributed.ray.actor_errors import names_user_errors
from diffrl.rewards.base import RewardOutput, RewardSet


@names_user_errors("in a Ray reward worker")
class RewardWorker:
    """Scores images with one reward type, in this process."""

    def __init__(
        self,
        reward: RewardConfig,
        threads: int,
        label: str | None = None,
        deterministic: bool | str = "portable",
    ):
        """``label``: the reward's key in the run's outputs (:func:`~diffrl.rewards.base.reward_labels`);
        ``deterministic``: the run's ``run.deterministic`` (the environment pins came with the process)."""
        determinism.apply(deterministic, threads, "cuda" if torch.cuda.is_available() else "cpu")
        self.rewards = RewardSet([reward], in_process=True, labels=[label or reward.name])

    def score(
        self,
        images: torch.Tensor,
        prompts: list[str],
        metadata: list[dict],
        audio: Audio | None = None,
        groups: list[int] | None = None,
    ) -> RewardOutput:
        """``audio``: the rollout's sound (reaches the reward only if it hears); ``groups``: each
        sample's prompt group, the rollout's ``group_id`` (reaches the reward only if it judges
        groups)."""
        return self.rewards.submit(images, prompts, metadata, audio, groups).result()
