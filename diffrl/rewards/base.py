"""The reward interface: a batch of images + prompts + metadata -> one score per image.

A user's reward is a dotted path to either a :class:`Reward` subclass or a plain function with
the signature ``def my_reward(images, prompts, metadata, **params) -> list[float]``, where
``images`` is a float tensor ``(B, 3, H, W)`` in [0, 1], ``prompts`` a ``list[str]`` and
``metadata`` a ``list[dict]``. Params come from the recipe's ``params:`` mapping.
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from diffrl.config import RewardConfig
from diffrl.registry import RegistryError


class RewardError(RuntimeError):
    """A reward raised or returned something unusable."""


class Reward(ABC):
    name: str = "reward"

    @abstractmethod
    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> scores ``(B,)`` float32."""

    def close(self) -> None:
        """Release worker processes or remote sessions."""


class FunctionReward(Reward):
    """Adapts ``fn(images, prompts, metadata, **params) -> list[float]``."""

    def __init__(self, fn: Callable[..., Any], name: str, **params: Any):
        self.fn, self.name, self.params = fn, name, params

    def __call__(self, images, prompts, metadata):
        return torch.as_tensor(self.fn(images, list(prompts), list(metadata), **self.params), dtype=torch.float32)


@dataclass
class RewardOutput:
    """``total (B,)``: weighted sum; ``per_reward``: each reward's raw ``(B,)`` scores."""

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]


def build_reward(cfg: RewardConfig) -> Reward:
    from diffrl.rewards.registry import REWARDS

    obj = REWARDS.resolve(cfg.name)
    if isinstance(obj, type) and issubclass(obj, Reward):
        try:
            return obj(**cfg.params)
        except TypeError as e:
            params = ", ".join(p for p in inspect.signature(obj.__init__).parameters if p != "self")
            raise RegistryError(f"reward {cfg.name!r}: bad params {cfg.params} ({e}); it takes: {params}") from e
    if callable(obj):
        return FunctionReward(obj, cfg.name, **cfg.params)
    raise RegistryError(f"reward {cfg.name!r} resolves to {obj!r}, which is neither a Reward class nor a function")


class RewardSet:
    """All rewards of a run, combined as a weighted sum."""

    def __init__(self, configs: Sequence[RewardConfig]):
        self.configs = list(configs)
        self.rewards = [build_reward(c) for c in self.configs]

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]) -> RewardOutput:
        per: dict[str, torch.Tensor] = {}
        total = torch.zeros(len(prompts))
        for cfg, reward in zip(self.configs, self.rewards):
            try:
                scores = reward(images.detach().float().cpu(), prompts, metadata).float().cpu()
            except Exception as e:
                raise RewardError(f"reward {cfg.name!r} raised {type(e).__name__}: {e}") from e
            if scores.shape != (len(prompts),):
                raise RewardError(f"reward {cfg.name!r} returned shape {tuple(scores.shape)}, expected ({len(prompts)},)")
            per[cfg.name] = scores
            total = total + cfg.weight * scores
        return RewardOutput(total, per)

    def close(self) -> None:
        for r in self.rewards:
            r.close()
