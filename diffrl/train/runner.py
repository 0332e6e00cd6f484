"""Runners: where the loop's parts live. The driver (``train/loop.py``) reads the same for all.

- :class:`LocalRunner` (``runner: local``): one process; the collector samples with the actor's
  own module, so there is nothing to sync.
- :class:`~diffrl.distributed.ray_runner.RayRunner` (``runner: ray``): rollout engines, reward
  workers and FSDP2 trainer ranks as Ray actors.

Both take the same calls, in this order each iteration: ``collect`` -> (the driver computes the
algorithm's signals and examples) -> ``optimize`` -> ``end_iteration``; and ``evaluate``/``save``
between iterations.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from diffrl.algorithms.base import CollectionSpec, DiffusionAlgorithm, RolloutBatch, TrainExamples
from diffrl.config import Config
from diffrl.data.offline import build_offline_dataset
from diffrl.data.prompts import load_prompts
from diffrl.models.base import ModelFamily
from diffrl.rewards.base import RewardSet
from diffrl.sampling.collector import OfflineCollector, OnlineCollector, RolloutStats
from diffrl.sampling.sampler import image_size
from diffrl.train.checkpoint import load_resume_state, save_checkpoint
from diffrl.train.evaluate import EvalResult, evaluate


class Runner(Protocol):
    def describe(self) -> str:
        """One line: the trainable parameters and where the parts run."""

    def collect(
        self, iteration: int, should_stop: Callable[[], bool] | None = None
    ) -> tuple[RolloutBatch, RolloutStats]:
        """Sample (and score) one rollout with the current sampling policy; raise
        :class:`~diffrl.errors.Abandoned` between micro-groups once ``should_stop()`` is true."""

    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        """One optimizer step per chunk (after the algorithm's ``before_update``); their metrics."""

    def end_iteration(self) -> dict[str, float]:
        """Update the old policy (if kept) and send the sampling weights where rollouts run."""

    def evaluate(self) -> EvalResult | None:
        """Eval with the weights to evaluate (EMA if enabled); None when eval is off."""

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict[str, Any]) -> Path:
        """Write a checkpoint (atomically; ``loop_state``: what the driver needs to continue)."""

    def resume(self, path: Path) -> None:
        """Restore the training state of the (verified) checkpoint at ``path``."""

    def close(self) -> None: ...


def build_collector(config: Config, family: ModelFamily, spec: CollectionSpec, rewards: RewardSet | None):
    if spec.online:
        return OnlineCollector(config, family, spec, load_prompts(config.data.prompts), rewards)
    height, width = image_size(config, family)
    return OfflineCollector(
        build_offline_dataset(config, height, width), family, config.train.batch_size, config.run.seed
    )


def build_runner(config: Config, algorithm: DiffusionAlgorithm, spec: CollectionSpec) -> Runner:
    if config.runner == "ray":
        from diffrl.distributed.ray_runner import RayRunner

        return RayRunner(config, algorithm, spec)
    return LocalRunner(config, algorithm, spec)


class LocalRunner:
    def __init__(self, config: Config, algorithm: DiffusionAlgorithm, spec: CollectionSpec):
        from diffrl.models.registry import load_family
        from diffrl.train.actor import Actor

        self.config, self.algorithm = config, algorithm
        self.family = load_family(config)
        self.actor = Actor(
            self.family,
            config,
            keep_reference=algorithm.needs_reference,
            keep_old=algorithm.keeps_old_policy,
        )
        self.train_rewards = RewardSet(config.rewards) if spec.needs_reward else None
        self.eval_rewards = RewardSet(config.eval.rewards) if config.eval.enabled else None
        self.collector = build_collector(config, self.family, spec, self.train_rewards)

    def describe(self) -> str:
        return f"{self.actor.num_trainable():,} trainable parameters, one process on {self.family.device}"

    def collect(
        self, iteration: int, should_stop: Callable[[], bool] | None = None
    ) -> tuple[RolloutBatch, RolloutStats]:
        self.family.transformer.eval()
        with self.actor.policy.sampling_weights() as module:  # the old policy when the algorithm keeps one
            return self.collector.collect(iteration, module, should_stop)

    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        chunks = [self.actor.before_update(chunk, self.algorithm) for chunk in chunks]
        return [self.actor.train_step(chunk, self.algorithm) for chunk in chunks]

    def end_iteration(self) -> dict[str, float]:
        # the collector samples with the actor's own module: nothing to sync
        return self.actor.update_old_policy(self.algorithm)

    def evaluate(self) -> EvalResult | None:
        if self.eval_rewards is None:
            return None
        with self.actor.eval_weights():
            return evaluate(self.family, self.config, self.eval_rewards)

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict[str, Any]) -> Path:
        return save_checkpoint(path, self.actor, self.config, iteration, run_id=run_id, loop_state=loop_state)

    def resume(self, path: Path) -> None:
        load_resume_state(self.actor, path)

    def close(self) -> None:
        for r in (self.train_rewards, self.eval_rewards):
            if r is not None:
                r.close()
