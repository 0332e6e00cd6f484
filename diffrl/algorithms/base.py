"""The algorithm plugin interface and the dataclasses that pass between the loop's stages.

```
Collector --RolloutBatch--> rewards --> postprocess_rewards --TrainSignals-->
build_train_data --TrainExamples--> Actor (micro-batches) --> compute_loss
```

An algorithm is one file under ``algorithms/`` implementing :class:`DiffusionAlgorithm`; a user's
own is a dotted path (``my_pkg.my_algo:MyAlgo``). Its :meth:`~DiffusionAlgorithm.collection_spec`
decides what the collector produces, so an algorithm never pays for data it does not use.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from diffrl.batching import Batch
from diffrl.models.base import Conditioning

if TYPE_CHECKING:
    from diffrl.config import Config
    from diffrl.train.actor import Policy


@dataclass(frozen=True)
class CollectionSpec:
    """What the collector must produce for an algorithm."""

    online: bool
    """True: sample from the policy; False: read ``data.dataset`` (no sampling, no reward)."""
    needs_reward: bool
    sampler: str = "ode"
    """Transition kernel for stochastic steps (``ode`` everywhere for forward-process methods)."""
    noise_level: float = 0.0
    keep_trajectory: bool = False
    """Record (x_t, x_{t+Δ}) of the trained steps (reverse-process policy gradients only)."""
    keep_log_prob: bool = False
    decode_images: bool = False
    """Decode x0 to images (rewards need them)."""


@dataclass
class RolloutBatch(Batch):
    """What the collector produced: one row per sample.

    ``x0``: clean latents ``(B, *latent)``; ``cond``: the prompts' conditioning;
    ``images``: decoded ``(B, 3, H, W)`` in [0, 1] when the spec asked for them.
    ``group_id``: samples of the same prompt share a group (group-relative advantages).
    """

    prompts: list[str]
    metadata: list[dict[str, Any]]
    prompt_index: torch.Tensor
    sample_index: torch.Tensor
    group_id: torch.Tensor
    x0: torch.Tensor
    cond: Conditioning
    images: torch.Tensor | None = None


@dataclass
class TrainSignals(Batch):
    """Reward-derived scalars per sample (GRPO advantages, NFT r, AWM weights), ``(B,)`` each."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0

    def select(self, index):
        idx = torch.as_tensor(index, dtype=torch.long)
        return TrainSignals({k: v[idx] for k, v in self.values.items()})


class TrainExamples(Batch):
    """Base for an algorithm's own example dataclass (its fields are per-example)."""


class DiffusionAlgorithm(ABC):
    """One RL/SFT algorithm. Instances are cheap: they are built while validating the config."""

    name: ClassVar[str]
    Params: ClassVar[type]
    """Dataclass of this algorithm's ``algorithm.params``."""

    def __init__(self, params: Any, config: Config):
        self.params = params
        self.config = config

    def validate(self, config: Config) -> list[str]:
        """Algorithm-specific config problems (reported with all others before anything loads)."""
        return []

    @abstractmethod
    def collection_spec(self) -> CollectionSpec: ...

    @abstractmethod
    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        """``rewards (B,)`` (or None for reward-free algorithms) -> per-sample signals."""

    @abstractmethod
    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> TrainExamples:
        """Turn the batch into examples; all randomness keyed by (seed, iteration, sample identity)."""

    @abstractmethod
    def compute_loss(self, policy: Policy, examples: TrainExamples) -> tuple[torch.Tensor, dict[str, float]]:
        """Mean loss over ``examples`` (a micro-batch) and scalar metrics (``train/...``)."""
