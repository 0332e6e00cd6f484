"""The algorithm plugin interface, and the :class:`Policy` an algorithm's loss sees.

```
Collector --RolloutBatch--> rewards --> postprocess_rewards --TrainSignals-->
build_train_data --TrainExamples--> Actor (micro-batches) --> compute_loss
```

An algorithm is one file under ``algorithms/`` implementing :class:`DiffusionAlgorithm`; a user's
own is a dotted path (``my_pkg.my_algo:MyAlgo``). Its :meth:`~DiffusionAlgorithm.collection_spec`
decides what the collector produces, so an algorithm never pays for data it does not use. The
types passing between the stages live at the bottom of the layers, in :mod:`diffrl.core.rollout`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Protocol

import torch

from diffrl.config import Config, Range
from diffrl.core.registry import RegistryError
from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals
from diffrl.models.base import FamilyRuntime
from diffrl.sampling.kernels import kernel_problems, resolve_kernel
from diffrl.sampling.step_strategies import AllSteps

# The ranges of params several algorithms share (each ``Params`` declares its own; the binder checks
# them, naming the key and the range). Bounds are wide enough for every published setting.
NoiseLevel = Annotated[float, Range(0, 5, hint="η of the sde / cps steps, e.g. 0.7")]
ClipRange = Annotated[float, Range(0, 10, lo_open=True, hint="PPO's ε, e.g. 1e-4 for Flow-GRPO, 1.0 for AWM")]
AdvClip = Annotated[float, Range(0, 1e4, lo_open=True, hint="advantages are clamped to ± this, e.g. 5.0")]
KlBeta = Annotated[float, Range(0, 100, hint="0: no KL to the base model; e.g. 0.04")]
LogitMean = Annotated[float, Range(-10, 10, hint="of the logit-normal timesteps, e.g. 0.0")]
LogitStd = Annotated[float, Range(0, 10, lo_open=True, hint="of the logit-normal timesteps, e.g. 1.0")]
TimeShift = Annotated[float, Range(0, 100, lo_open=True, hint="1: none; e.g. 3.0, as sampling.shift")]
Timesteps = Annotated[int, Range(1, 1000, hint="timesteps drawn per sample; each a forward and backward")]
TimestepFraction = Annotated[float, Range(0, 1, lo_open=True, hint="of the sampler's timesteps")]


class Policy(Protocol):
    """What ``compute_loss`` and ``before_update`` may call: the trainable velocity, the reference
    (base model) and old (sampling) velocities, and the run's sampling settings. The trainer's
    :class:`diffrl.train.actor.Policy` is one; a test may pass its own.

    Shapes: ``x_t (B, *latent)``, ``sigma (B,)`` -> velocity ``(B, *latent)`` float32.
    """

    family: FamilyRuntime
    sigmas: torch.Tensor
    """The ``(num_steps + 1,)`` sampling schedule."""
    guidance_scale: float

    def velocity(self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw) -> torch.Tensor:
        """The trainable policy's velocity, with gradients."""

    def reference_velocity(
        self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw
    ) -> torch.Tensor:
        """The base model's velocity (no gradient); needs ``needs_reference``."""

    def old_velocity(self, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, **kw) -> torch.Tensor:
        """The old policy's velocity (no gradient); needs ``keeps_old_policy``."""

    def negative(self, cond: Conditioning) -> Conditioning | None:
        """The negative-prompt conditioning for CFG of the rows of ``cond``, one row each (None
        when CFG is off)."""

    def micro_batches(self, examples: TrainExamples) -> list[TrainExamples]:
        """The micro-batches an update runs (a ``before_update`` pass uses the very same)."""


def x0_only_spec(sampler: str, noise_level: float) -> CollectionSpec:
    """Online collection for forward-process algorithms (DiffusionNFT, AWM): any sampler kernel —
    ``ode``, ``heun``, or a stochastic one (``sde``, ``cps``) on every step — and nothing kept but x0, the conditioning, the
    sample identity and its sigma schedule (no per-step latents: memory per sample grows with the
    number of steps only by one float per step)."""
    try:
        stochastic = resolve_kernel(sampler).stochastic
    except RegistryError:  # reported by x0_collection_problems with the other config problems
        stochastic = False
    return CollectionSpec(
        online=True,
        needs_reward=True,
        sampler=sampler,
        noise_level=noise_level if stochastic else 0.0,
        step_strategy=AllSteps() if stochastic else None,
    )


def x0_collection_problems(sampler: str, global_std: bool, config: Config) -> list[str]:
    """The checks DiffusionNFT and AWM share: any known sampler kernel, and groups of at least two
    samples unless advantages are normalised over the whole batch."""
    errors = kernel_problems("algorithm.params.sampler", sampler)
    if config.rollout.n_samples_per_prompt < 2 and not global_std:
        errors.append("rollout.n_samples_per_prompt must be >= 2 for group-relative advantages")
    return errors


@dataclass(frozen=True)
class TrainCost:
    """What an iteration's training asks of the transformer per sample, for ``diffrl plan``."""

    examples_per_sample: int
    """Training examples each sample yields (a trained step, a drawn timestep): each one forward
    and backward of the policy."""
    guided: bool
    """True: those forwards are CFG-combined (two rows each: negative and positive)."""
    no_grad_forwards: int
    """Further forwards per example without gradient (reference, old policy, a replay)."""


class DiffusionAlgorithm(ABC):
    """One RL/SFT algorithm. Instances are cheap: they are built while validating the config."""

    name: ClassVar[str]
    """How messages name it; a subclass that sets none is named by its class name."""
    Params: ClassVar[type]
    """Dataclass of this algorithm's ``algorithm.params``."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("name", getattr(cls, "name", None)), str):
            cls.name = cls.__name__

    def __init__(self, params: Any, config: Config):
        self.params = params
        self.config = config

    needs_reference: bool = False
    """True when ``compute_loss`` calls ``policy.reference_velocity`` (a KL to the base model)."""

    keeps_old_policy: bool = False
    """True: the actor keeps a trailing copy of the weights (``policy.old_velocity``), rollouts
    sample from it (unless :attr:`samples_with_old_policy` is False), and after each iteration it
    moves towards the live weights by :meth:`old_policy_decay`."""

    samples_with_old_policy: bool = True
    """With :attr:`keeps_old_policy`: True, rollouts sample from the old copy (DiffusionNFT's
    sampling policy); False, the copy only anchors the loss (AWM's EMA-KL) and rollouts sample
    from the live weights."""

    requires: ClassVar[frozenset[str]] = frozenset()
    """Optional :class:`RolloutBatch` fields ``build_train_data`` reads (e.g. ``traj_log_prob``);
    checked against :meth:`CollectionSpec.provides` before anything loads."""

    def validate(self, config: Config) -> list[str]:
        """Algorithm-specific config problems (reported with all others before anything loads)."""
        return []

    def off_policy_problems(self, config: Config) -> list[str]:
        """Why this algorithm cannot train on samples drawn one update earlier
        (``train.off_policy_steps: 1``), checked only then. Online algorithms whose loss does not
        use the behaviour policy's own probabilities (DiffusionNFT, AWM, online DPO: a forward-
        process or pair loss on the samples) take them as they are; an offline one has no rollout
        to draw ahead; an algorithm whose ratio uses the recorded log-probs says what it needs."""
        if not self.collection_spec().online:
            return [
                f"train.off_policy_steps={config.train.off_policy_steps}: algorithm {self.name!r} trains on "
                "a fixed dataset (no rollout to draw ahead); set train.off_policy_steps: 0"
            ]
        return []

    def old_policy_decay(self, optimizer_step: int) -> float:
        """``d`` in ``θ_old ← d·θ_old + (1 − d)·θ``, applied after each iteration."""
        return 0.0

    def train_cost(self) -> TrainCost:
        """Per sample: the trained steps of its trajectory (1 without one), with the sampling
        guidance, plus a reference forward when kept (:attr:`needs_reference`) and an old-policy
        one (:attr:`keeps_old_policy`). Algorithms that draw timesteps or replay override it."""
        spec, s = self.collection_spec(), self.config.sampling
        k = 1
        if spec.online and spec.keep_trajectory and spec.step_strategy is not None:
            k = len(spec.step_strategy(s.num_steps, 0, self.config.run.seed))
        extra = int(bool(self.needs_reference)) + int(bool(self.keeps_old_policy))
        return TrainCost(max(1, k), True, extra)

    def before_update(self, policy: Policy, examples: TrainExamples) -> TrainExamples:
        """Called once per iteration, before its optimizer steps, without gradients: fill in what
        needs the weights at the start of the update (e.g. AWM's old log-likelihoods)."""
        return examples

    def drift(self, policy: Policy, examples: TrainExamples) -> dict[str, float]:
        """The policy's drift from the base model on ``examples`` (a micro-batch of this
        iteration's training data), for runs whose loss has no KL: ``{"monitor/kl_to_base": ...}``,
        the KL a ``kl_beta`` run of this algorithm penalises and logs, in the same units. The
        trainer calls it every ``monitor.kl_every`` iterations (not when :attr:`needs_reference`:
        such a loss logs it) on the first micro-batch before the update, under ``torch.no_grad``,
        in training mode, with the random state put back after. It must change no state (no
        random draws of its own: use the examples' noise). Default: ``{}``, nothing measured."""
        return {}

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
