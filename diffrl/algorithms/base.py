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
from collections.abc import Callable
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
    """Transition kernel of the stochastic steps: ``sde`` or ``cps``; ``ode``: every step is Euler."""
    noise_level: float = 0.0
    step_strategy: Callable[[int, int, int], list[int]] | None = None
    """``(num_steps, rollout_id, seed) -> stochastic step indices``; None: no stochastic step."""
    keep_trajectory: bool = False
    """Record (x_t, x_{t+Δ}) of the stochastic steps (reverse-process policy gradients only)."""
    keep_log_prob: bool = False
    """Record the log-prob of each recorded transition under the sampling policy."""

    def provides(self) -> frozenset[str]:
        """The optional :class:`RolloutBatch` fields a collector following this spec fills."""
        fields = set()
        if self.online:
            fields |= {"images", "sigmas"} | ({"rewards"} if self.needs_reward else set())
        if self.online and self.keep_trajectory and self.step_strategy is not None:
            fields |= {"traj_x", "traj_next", "traj_step", "traj_sigma", "traj_sigma_next"}
            if self.keep_log_prob:
                fields.add("traj_log_prob")
        return frozenset(fields)


def x0_only_spec(sampler: str, noise_level: float) -> CollectionSpec:
    """Online collection for forward-process algorithms (DiffusionNFT, AWM): any sampler — ``ode``,
    ``heun``, or ``sde``/``cps`` on every step — and nothing kept but x0, the conditioning, the
    sample identity and its sigma schedule (no per-step latents: memory per sample grows with the
    number of steps only by one float per step)."""
    from diffrl.sampling.step_strategies import AllSteps

    stochastic = sampler in ("sde", "cps")
    return CollectionSpec(
        online=True,
        needs_reward=True,
        sampler=sampler,
        noise_level=noise_level if stochastic else 0.0,
        step_strategy=AllSteps() if stochastic else None,
    )


@dataclass
class RolloutBatch(Batch):
    """What the collector produced: one row per sample.

    ``x0``: clean latents ``(B, *latent)``; ``cond``: the prompts' conditioning;
    ``images``: decoded ``(B, 3, H, W)`` (videos ``(B, 3, F, H, W)``), uint8 0..255 (online rollouts;
    :func:`~diffrl.rewards.base.quantize`);
    ``group_id``: samples of the same prompt share a group (group-relative advantages);
    ``micro_group``: which sampling forward batch the sample was in;
    ``rewards``: ``(B,)`` weighted reward (online rollouts);
    ``sigmas``: ``(B, num_steps + 1)`` the sigma schedule the sample was drawn with (online rollouts).
    Trajectory, only when the spec keeps it, for the K stochastic steps:
    ``traj_x, traj_next: (B, K, *latent)``; ``traj_step (B, K)`` step indices;
    ``traj_sigma, traj_sigma_next (B, K)``; ``traj_log_prob (B, K)`` when the spec keeps log-probs.
    """

    prompts: list[str]
    metadata: list[dict[str, Any]]
    prompt_index: torch.Tensor
    sample_index: torch.Tensor
    group_id: torch.Tensor
    micro_group: torch.Tensor
    x0: torch.Tensor
    cond: Conditioning
    images: torch.Tensor | None = None
    rewards: torch.Tensor | None = None
    sigmas: torch.Tensor | None = None
    traj_x: torch.Tensor | None = None
    traj_next: torch.Tensor | None = None
    traj_step: torch.Tensor | None = None
    traj_sigma: torch.Tensor | None = None
    traj_sigma_next: torch.Tensor | None = None
    traj_log_prob: torch.Tensor | None = None


@dataclass
class TrainSignals(Batch):
    """Reward-derived scalars per sample (GRPO advantages, NFT r, AWM weights), ``(B,)`` each."""

    values: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(next(iter(self.values.values()))) if self.values else 0

    def select(self, index) -> TrainSignals:
        idx = torch.as_tensor(index, dtype=torch.long)
        return TrainSignals({k: v[idx] for k, v in self.values.items()})

    @classmethod
    def cat(cls, parts) -> TrainSignals:
        keys = parts[0].values.keys() if parts else ()
        return cls({k: torch.cat([p.values[k] for p in parts]) for k in keys})


class TrainExamples(Batch):
    """Base for an algorithm's own example dataclass (its fields are per-example).

    Subclasses must have a ``sample_id (N,)`` field: the row of the :class:`RolloutBatch` each
    example came from, so the loop can split a rollout into optimizer steps by whole samples.
    """

    sample_id: torch.Tensor


class DiffusionAlgorithm(ABC):
    """One RL/SFT algorithm. Instances are cheap: they are built while validating the config."""

    name: ClassVar[str]
    Params: ClassVar[type]
    """Dataclass of this algorithm's ``algorithm.params``."""

    def __init__(self, params: Any, config: Config):
        self.params = params
        self.config = config

    needs_reference: bool = False
    """True when ``compute_loss`` calls ``policy.reference_velocity`` (a KL to the base model)."""

    keeps_old_policy: bool = False
    """True: the actor keeps a trailing copy of the weights (``policy.old_velocity``), rollouts
    sample from it, and after each iteration it moves towards the live weights by
    :meth:`old_policy_decay`."""

    requires: ClassVar[frozenset[str]] = frozenset()
    """Optional :class:`RolloutBatch` fields ``build_train_data`` reads (e.g. ``traj_log_prob``);
    checked against :meth:`CollectionSpec.provides` before anything loads."""

    def validate(self, config: Config) -> list[str]:
        """Algorithm-specific config problems (reported with all others before anything loads)."""
        return []

    def old_policy_decay(self, optimizer_step: int) -> float:
        """``d`` in ``θ_old ← d·θ_old + (1 − d)·θ``, applied after each iteration."""
        return 0.0

    def before_update(self, policy: Policy, examples: TrainExamples) -> TrainExamples:
        """Called once per iteration, before its optimizer steps, without gradients: fill in what
        needs the weights at the start of the update (e.g. AWM's old log-likelihoods)."""
        return examples

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
