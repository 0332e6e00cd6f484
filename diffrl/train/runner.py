"""Runners: where the loop's parts live. The driver (``train/loop.py``) reads the same for all.

``runner:`` in a recipe names one in :data:`diffrl.launch.RUNNERS` (the composition root, which
hands the class to the session), or gives a dotted path to a user's class:

- ``local`` (:class:`LocalRunner`): one process; the built-in engine samples with the actor's own
  module, so there is nothing to sync (a serving engine, ``rollout.engine: sglang``, takes the
  sampling weights at the start of each rollout).
- ``ray`` (:class:`diffrl.distributed.ray.runner.RayRunner`): rollout engines, reward workers and
  FSDP2 trainer ranks as Ray actors.
- ``my_pkg.my_runner:MyRunner``: a class built as ``MyRunner(config, algorithm, spec)`` that
  follows :class:`Runner` (subclassing :class:`LocalRunner` is the short way).

Each iteration the driver calls ``sample`` (and ``score`` on each micro-group as it arrives) ->
(the algorithm's signals and examples) -> ``optimize`` -> ``end_iteration``; and ``evaluate`` /
``save`` between iterations. A runner class may also have ``validate(config, check_files) ->
list[str]`` (its own config checks, run with all the others before anything loads) and
``uses_local_devices(config) -> bool`` (whether ``run.device`` names a device of this machine) and
``driver_device(config) -> str`` (the device of the driver process, where the monitors run; the
CPU for a runner without it) and ``layout(config) -> ParallelConfig`` (the ranks and engines it
places, which ``diffrl plan`` sizes; ``parallel:`` as the recipe says for a runner without it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, ParallelConfig
from diffrl.core.rollout import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.evaluation.evaluate import EvalResult, evaluate
from diffrl.logging import console
from diffrl.models.numerics import peak_flops
from diffrl.models.registry import load_family
from diffrl.rewards.base import PendingRewards, RewardOutput, RewardSet, SharedRewards
from diffrl.sampling.engine import build_collector
from diffrl.sampling.prompt_cache import encode_once
from diffrl.train.actor import Actor
from diffrl.train.checkpoint import load_resume_state, save_checkpoint


class PendingScore(Protocol):
    def result(self) -> RewardOutput:
        """The micro-group's scores; failures and missed deadlines are NaN with a message."""


class Runner(Protocol):
    def describe(self) -> str:
        """One line: the trainable parameters, where the parts run, how the forwards run (and a
        note line per speed option the device could not do)."""

    def peak_flops(self) -> float | None:
        """The device's peak FLOP/s for ``perf/*_mfu`` (None: not known yet). Optional: a runner
        without it logs no MFU."""

    def sample(self, iteration: int, should_stop: Callable[[], bool] | None = None) -> Iterator[RolloutBatch]:
        """Sample one rollout with the current sampling policy, yielding its micro-groups as they
        finish (in any order); raise :class:`~diffrl.core.errors.Abandoned` once ``should_stop()``."""

    def score(self, part: RolloutBatch) -> PendingScore | None:
        """Start scoring one micro-group (None when the algorithm needs no reward)."""

    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        """One optimizer step per chunk (after the algorithm's ``before_update``); their metrics."""

    def end_iteration(self) -> dict[str, float]:
        """Update the old policy (if kept), send the sampling weights where rollouts run, and
        report the runner's own counters of the iteration. (With ``train.off_policy_steps: 1`` a
        rollout is in flight meanwhile: the sending is :meth:`end_rollout`'s.)"""

    def end_rollout(self) -> dict[str, float]:
        """``train.off_policy_steps: 1`` only (a runner without it refuses that setting): the
        rollout just finished and none is in flight; send the trainer's sampling weights where
        rollouts run (the next rollout draws with them) and report the rollout side's counters."""

    def evaluate(self) -> EvalResult | None:
        """Eval with the weights to evaluate (EMA if enabled); None when eval is off."""

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict[str, Any]) -> Path:
        """Write a checkpoint (atomically; ``loop_state``: what the driver needs to continue)."""

    def resume(self, path: Path) -> None:
        """Restore the training state of the (verified) checkpoint at ``path``."""

    def close(self) -> None: ...


class LocalRunner:
    """Everything in this process: the family, the actor, the collector and the rewards."""

    @classmethod
    def validate(cls, config: Config, check_files: bool = True) -> list[str]:
        errors, sp = [], config.parallel.sequence
        if sp != 1:
            errors.append(
                f"parallel.sequence={sp} splits each sample over trainer ranks, and runner=local "
                "is one process: set runner: ray (with parallel.trainer_ranks a multiple of it), or "
                "parallel.sequence: 1"
            )
        if config.train.off_policy_steps > 0:
            errors.append(
                f"train.off_policy_steps={config.train.off_policy_steps} draws the next rollout while "
                "the ranks train, and runner=local samples and trains with one module on the same "
                "device and cores: the two would only take turns (no faster, one update staler). Set "
                "runner: ray (engines and trainer ranks on their own devices or cores), or "
                "train.off_policy_steps: 0"
            )
        return errors

    @classmethod
    def driver_device(cls, config: Config) -> str:
        """Everything runs in the driver: on ``run.device``."""
        return config.run.device

    @classmethod
    def layout(cls, config: Config) -> ParallelConfig:
        """One process: one rank, one engine (``parallel.trainer_ranks`` and ``engines`` are for a
        runner that places parts; ``parallel.sequence`` > 1 is refused by :meth:`validate`)."""
        return ParallelConfig()

    def __init__(self, config: Config, algorithm: DiffusionAlgorithm, spec: CollectionSpec):
        self.config, self.algorithm = config, algorithm
        self.family = load_family(config)
        if config.model.encode_once:
            console(encode_once(self.family, config).describe())
        self.actor = Actor(
            self.family,
            config,
            keep_reference=algorithm.needs_reference,
            keep_old=algorithm.keeps_old_policy,
            sample_with_old=algorithm.samples_with_old_policy,
        )
        self.collector = build_collector(config, self.family, spec)
        self.online = spec.online
        # one reward per name and params for training and eval: OCR's worker pool starts once
        # (here, in the background, so the first eval does not wait for it) and closes once
        self.rewards = SharedRewards()
        try:
            self.train_rewards = RewardSet(config.rewards, shared=self.rewards) if spec.needs_reward else None
            self.eval_rewards = (
                RewardSet(config.eval.rewards, shared=self.rewards) if config.eval.enabled else None
            )
            self.watch_rewards = (  # held-out judges: scored at each eval, never trained on
                RewardSet(config.eval.watch, shared=self.rewards)
                if config.eval.enabled and config.eval.watch
                else None
            )
        except BaseException:  # a reward that fails to build: no workers or servers left behind
            self.rewards.close()
            self.collector.close()
            raise
        self._peak: tuple[float | None, str] = (None, "")
        self._compiled_s = 0.0

    def describe(self) -> str:
        n = self.family.numerics
        return (
            f"{self.actor.num_trainable():,} trainable parameters, one process on {self.family.device}, "
            f"forwards {n.describe()}" + "".join(f"\n  note: {note}" for note in n.notes)
        )

    def peak_flops(self) -> float | None:
        return self._peak[0]

    def sample(self, iteration: int, should_stop: Callable[[], bool] | None = None) -> Iterator[RolloutBatch]:
        self.family.transformer.eval()
        with self.actor.policy.sampling_weights() as module:  # the old policy when the algorithm keeps one
            for part in self.collector.micro_groups(iteration, module, should_stop):
                if self.online:  # drawn with the weights of `iteration` updates
                    part.policy_version = torch.full((len(part),), iteration, dtype=torch.long)
                yield part

    def score(self, part: RolloutBatch) -> PendingRewards | None:
        if self.train_rewards is None:
            return None
        groups = part.group_id  # a prompt's samples: rewards that judge groups need them whole
        return self.train_rewards.submit(part.images, part.prompts, part.metadata, part.audio, groups)

    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        return self.actor.optimize(chunks, self.algorithm)

    def end_iteration(self) -> dict[str, float]:
        # the built-in engine samples with the actor's own module; a serving engine takes the
        # sampling weights at the start of each rollout (its sync is in its metrics)
        metrics = {**self.collector.take_metrics(), **self.actor.update_old_policy(self.algorithm)}
        meter = self.family.meter
        if self.family.numerics.compile:
            metrics["perf/compile_time"], self._compiled_s = (
                meter.compile_seconds - self._compiled_s,
                meter.compile_seconds,
            )
        if self._peak[0] is None and meter.flops:  # measured once, after the first iteration's forwards
            self._peak = peak_flops(self.family.device, self.family.numerics, self.config.run.peak_tflops)
            console(f"MFU peak: {self._peak[1]}")  # above the progress bars
        return metrics

    def evaluate(self) -> EvalResult | None:
        if self.eval_rewards is None:
            return None
        with self.actor.eval_weights():
            return evaluate(self.family, self.config, self.eval_rewards, self.watch_rewards)

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict[str, Any]) -> Path:
        return save_checkpoint(path, self.actor, self.config, iteration, run_id=run_id, loop_state=loop_state)

    def resume(self, path: Path) -> None:
        load_resume_state(self.actor, path)

    def close(self) -> None:
        try:
            self.rewards.close()
        finally:
            self.collector.close()
