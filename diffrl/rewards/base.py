"""The reward interface: a batch of images + prompts + metadata -> one score per image.

A user's reward is a dotted path to either a :class:`Reward` subclass or a plain function with
the signature ``def my_reward(images, prompts, metadata, **params) -> list[float]``, where
``images`` is a float tensor ``(B, 3, H, W)`` in [0, 1], ``prompts`` a ``list[str]`` and
``metadata`` a ``list[dict]``. Params come from the recipe's ``params:`` mapping.

Videos (``(B, 3, F, H, W)``, from video families such as ``wan``): a reward is an image reward
unless it says otherwise (``Reward.video = True``, or a function with ``my_reward.video = True``);
an image reward scores every frame (``(B * F, 3, H, W)``, each video's prompt and metadata
repeated per frame) and each video gets the mean of its frames' scores (:func:`submit_scores`).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from diffrl.config import RewardConfig
from diffrl.registry import RegistryError


class RewardError(RuntimeError):
    """A reward raised or returned something unusable."""


class Pending:
    """A score being computed: ``result()`` returns ``(B,)`` scores or raises what scoring raised."""

    def __init__(self, finish: Callable[[], Any]):
        self._finish = finish

    def result(self) -> torch.Tensor:
        return torch.as_tensor(self._finish(), dtype=torch.float32)


class Reward(ABC):
    name: str = "reward"
    video: bool = False
    """True: ``__call__`` takes videos ``(B, 3, F, H, W)`` whole; False: an image reward (videos
    are scored frame by frame and averaged, see :func:`submit_scores`)."""

    @abstractmethod
    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> scores ``(B,)`` float32."""

    def submit(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> Pending:
        """Start scoring and return at once where the reward runs elsewhere (worker processes,
        a remote server); by default it scores now."""
        try:
            scores = self(images, prompts, metadata)
        except Exception as e:  # re-raised by result(), where the caller decides what a failure costs
            error = e

            def fail():
                raise error

            return Pending(fail)
        return Pending(lambda: scores)

    def use_in_process(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Score in the calling process (a Ray reward worker is already a process of its own)."""

    def close(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release worker processes or remote sessions."""


class FunctionReward(Reward):
    """Adapts ``fn(images, prompts, metadata, **params) -> list[float]``."""

    def __init__(self, fn: Callable[..., Any], name: str, **params: Any):
        self.fn, self.name, self.params = fn, name, params
        self.video = bool(getattr(fn, "video", False))

    def __call__(self, images, prompts, metadata):
        return torch.as_tensor(
            self.fn(images, list(prompts), list(metadata), **self.params), dtype=torch.float32
        )


@dataclass
class RewardOutput:
    """``total (B,)``: weighted sum; ``per_reward``: each reward's raw ``(B,)`` scores.

    A sample whose score could not be had (the reward raised, or returned NaN) has a NaN total;
    ``errors`` says why.
    """

    total: torch.Tensor
    per_reward: dict[str, torch.Tensor]
    errors: list[str] = field(default_factory=list)

    @classmethod
    def cat(cls, parts: Sequence[RewardOutput]) -> RewardOutput:
        """Concatenate the outputs of consecutive chunks of samples."""
        return cls(
            torch.cat([p.total for p in parts]),
            {k: torch.cat([p.per_reward[k] for p in parts]) for k in parts[0].per_reward},
            [e for p in parts for e in p.errors],
        )

    @classmethod
    def combine(cls, outs: Sequence[RewardOutput]) -> RewardOutput:
        """Sum the outputs of several reward sets on the same samples (their totals are weighted)."""
        return cls(
            sum((o.total for o in outs[1:]), outs[0].total.clone()),
            {k: v for o in outs for k, v in o.per_reward.items()},
            [e for o in outs for e in o.errors],
        )


def quantize(images: torch.Tensor) -> torch.Tensor:
    """Images or videos in [0, 1] -> uint8 on the CPU, as an image file holds them (a quarter of
    float32's bytes: what rollouts keep and send to reward workers; OCR reads uint8 anyway)."""
    return (images.detach().clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).cpu()


def submit_scores(
    reward: Reward, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
) -> Pending:
    """``reward.submit`` for images ``(B, 3, H, W)`` or videos ``(B, 3, F, H, W)``: an image reward
    given videos scores their ``B * F`` frames and the ``(B,)`` result is each video's mean."""
    if images.ndim != 5 or reward.video:
        return reward.submit(images, prompts, metadata)
    b, f = images.shape[0], images.shape[2]
    frames = images.transpose(1, 2).flatten(0, 1)  # (B * F, 3, H, W), video-major
    pending = reward.submit(
        frames, [p for p in prompts for _ in range(f)], [m for m in metadata for _ in range(f)]
    )

    def mean_per_video() -> torch.Tensor:
        scores = pending.result()
        if scores.shape != (b * f,):
            raise ValueError(
                f"returned shape {tuple(scores.shape)} for {b} videos of {f} frames, expected one "
                f"score per frame ({b * f},)"
            )
        return scores.view(b, f).mean(dim=1)

    return Pending(mean_per_video)


def build_reward(cfg: RewardConfig) -> Reward:
    from diffrl.rewards.registry import REWARDS

    obj = REWARDS.resolve(cfg.name)
    if isinstance(obj, type) and issubclass(obj, Reward):
        try:
            return obj(**cfg.params)
        except TypeError as e:
            params = ", ".join(p for p in inspect.signature(obj.__init__).parameters if p != "self")
            raise RegistryError(
                f"reward {cfg.name!r}: bad params {cfg.params} ({e}); it takes: {params}"
            ) from e
    if callable(obj):
        return FunctionReward(obj, cfg.name, **cfg.params)
    raise RegistryError(
        f"reward {cfg.name!r} resolves to {obj!r}, which is neither a Reward class nor a function"
    )


class RewardSet:
    """All rewards of a run, combined as a weighted sum."""

    def __init__(self, configs: Sequence[RewardConfig], in_process: bool = False):
        self.configs = list(configs)
        self.rewards = [build_reward(c) for c in self.configs]
        if in_process:
            for r in self.rewards:
                r.use_in_process()

    def submit(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]
    ) -> PendingRewards:
        """Score ``images``: float in [0, 1], or uint8 (:func:`quantize`, what rollouts keep); every
        reward gets float32 in [0, 1] on the CPU."""
        images = images.detach().cpu()
        images = images.float() / 255.0 if images.dtype == torch.uint8 else images.float()
        pending = [submit_scores(r, images, prompts, metadata) for r in self.rewards]
        return PendingRewards(self, len(prompts), pending)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict]
    ) -> RewardOutput:
        """Score now; raise :class:`RewardError` if any reward fails or returns NaN."""
        out = self.submit(images, prompts, metadata).result()
        if out.errors:
            raise RewardError("; ".join(out.errors))
        return out

    def close(self) -> None:
        for r in self.rewards:
            r.close()


class PendingRewards:
    def __init__(self, owner: RewardSet, n: int, pending: list[Pending]):
        self.owner, self.n, self.pending = owner, n, pending

    def result(self) -> RewardOutput:
        """Gather every reward; failures become NaN totals with a message, never an exception."""
        per: dict[str, torch.Tensor] = {}
        total = torch.zeros(self.n)
        errors = []
        for cfg, pending in zip(self.owner.configs, self.pending):
            try:
                scores = pending.result().float().cpu()
                if scores.shape != (self.n,):
                    raise ValueError(f"returned shape {tuple(scores.shape)}, expected ({self.n},)")
            except Exception as e:
                errors.append(f"reward {cfg.name!r} raised {type(e).__name__}: {e}")
                scores = torch.full((self.n,), float("nan"))
            bad = ~torch.isfinite(scores)
            if bad.any() and not errors:
                errors.append(f"reward {cfg.name!r} returned {int(bad.sum())} non-finite score(s)")
            per[cfg.name] = scores
            total = total + cfg.weight * scores
        return RewardOutput(total, per, errors)
