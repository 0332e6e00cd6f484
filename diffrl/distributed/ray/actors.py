"""The model-holding actors: plain classes that :class:`~diffrl.distributed.ray.runner.RayRunner`
wraps with ``ray.remote``. Each reuses the single-process code: an engine samples with the
``rollout.engine`` the config names (the built-in collector, or a serving engine it drives), a trainer rank optimises with :class:`~diffrl.train.actor.Actor`. (The reward worker
lives in :mod:`.reward_worker`: a Ray worker imports only the module of its actor's class, and a
reward worker needs no diffusers, peft or model code.)"""

from __future__ import annotations

import os

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config
from diffrl.core import determinism
from diffrl.core.parallel import free_port, init_distributed
from diffrl.core.rollout import RolloutBatch
from diffrl.distributed.ray.actor_errors import names_user_errors
from diffrl.distributed.ray.cluster import import_ray
from diffrl.distributed.ray.sharding import RankPart
from diffrl.distributed.ray.weight_sync import checksum, live_state, load_state, module_state, sampling_state
from diffrl.evaluation.evaluate import EvalResult, evaluate
from diffrl.models.numerics import peak_flops
from diffrl.models.registry import load_family, resolve_device
from diffrl.rewards.base import RewardSet
from diffrl.sampling.collector import RolloutPlan
from diffrl.sampling.engine import build_collector
from diffrl.sampling.prompt_cache import encode_once
from diffrl.train.actor import Actor, apply_lora
from diffrl.train.checkpoint import load_resume_state, save_checkpoint


@names_user_errors("in a Ray rollout engine")
class RolloutEngine:
    """Holds the base model with the sampling weights; samples micro-groups of a plan."""

    def __init__(self, config: Config, threads: int):
        determinism.apply(config.run.deterministic, threads, str(resolve_device(config.run.device)))
        self.config = config
        self.family = load_family(config)
        if config.model.encode_once:
            print(encode_once(self.family, config).describe(), flush=True)  # (the actor's log)
        if config.model.lora is not None:
            apply_lora(self.family, config.model.lora)
        self.family.transformer.requires_grad_(False).eval()
        spec = build_algorithm(config).collection_spec()
        self.collector = build_collector(config, self.family, spec)
        self.state: dict[str, torch.Tensor] = {}
        self.version = 0
        """The version of the sampling weights held (updates they had had), stamped on samples."""
        self.eval_rewards: RewardSet | None = None
        self.watch_rewards: RewardSet | None = None
        """``eval.watch``: held-out judges, scored on each eval's images, never trained on."""

    def sample(self, plan: RolloutPlan, micro_group: int) -> RolloutBatch:
        batch = self.collector.sample(plan, micro_group).to("cpu")
        batch.policy_version = torch.full((len(batch),), self.version, dtype=torch.long)
        return batch

    def stage_times(self) -> dict[str, float]:
        """Seconds per sampling stage since the last call, and a serving engine's own counters
        (see :meth:`~diffrl.sampling.engine.Engine.take_metrics`)."""
        return self.collector.take_metrics()

    def forwards(self) -> tuple[str, tuple[str, ...]]:
        """How this engine's transformer forwards run, and the fallbacks taken (for the driver)."""
        return self.family.numerics.describe(), self.family.numerics.notes

    def peak_flops(self) -> float:
        """This engine's device peak FLOP/s for ``perf/*_mfu`` (see :func:`~diffrl.models.numerics.peak_flops`)."""
        return peak_flops(self.family.device, self.family.numerics, self.config.run.peak_tflops)[0]

    def collect(self, iteration: int) -> RolloutBatch:
        return self.collector.collect(iteration).to("cpu")

    def load(self, state: dict[str, torch.Tensor], version: int) -> str:
        """Take the trainer's sampling weights (of ``version`` updates); returns the checksum of
        what this engine now holds."""
        module = self.family.transformer
        lora = self.config.model.lora is not None
        held = [n for n, _ in module.named_parameters() if not lora or "lora_" in n]
        if sorted(held) != sorted(state):
            odd = sorted(set(held) ^ set(state))[:1]
            raise KeyError(f"weight sync: the engine's trainable tensors and the sent ones differ ({odd})")
        load_state(module, state)
        self.state, self.version = state, version
        self.collector.sync(module)  # a serving engine sends them on to its servers (checked there)
        return checksum(module_state(module, held))

    def evaluate(self, state: dict[str, torch.Tensor]) -> EvalResult:
        """Eval with ``state`` (the live weights), then back to the sampling weights."""
        if self.eval_rewards is None:
            self.eval_rewards = RewardSet(self.config.eval.rewards, in_process=True)
            if self.config.eval.watch:
                self.watch_rewards = RewardSet(self.config.eval.watch, in_process=True)
        load_state(self.family.transformer, state)
        try:
            return evaluate(self.family, self.config, self.eval_rewards, self.watch_rewards)
        finally:
            load_state(self.family.transformer, self.state)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        """Stop what the engine started (a serving engine's servers)."""
        self.collector.close()


@names_user_errors("in a Ray trainer rank")
class TrainerRank:
    """One FSDP2 rank: the actor (policy + optimizer) on this rank's shard of the weights."""

    def __init__(self, config: Config, rank: int, world_size: int, threads: int):
        determinism.apply(config.run.deterministic, threads, str(resolve_device(config.run.device)))
        self.config, self.rank, self.world_size = config, rank, world_size

    def address(self) -> tuple[str, int]:
        return import_ray().util.get_node_ip_address(), free_port()

    def setup(self, host: str, port: int) -> int:
        config = self.config
        device = resolve_device(config.run.device)
        r = config.ray
        ctx = init_distributed(
            self.rank, self.world_size, host, port, r.backend, device, config.parallel.sequence
        )
        torch.manual_seed(config.run.seed)  # the same LoRA init on every rank as in one process
        self.algorithm = build_algorithm(config)
        family = load_family(config)
        if config.model.encode_once:
            encode_once(family, config)
        self.actor = Actor(
            family,
            config,
            keep_reference=self.algorithm.needs_reference,
            keep_old=self.algorithm.keeps_old_policy,
            dist=ctx,
            sample_with_old=self.algorithm.samples_with_old_policy,
        )
        return self.actor.num_trainable()

    def optimize(self, parts: list[RankPart]) -> list[dict[str, float]]:
        """``parts``: per optimizer step, this rank's share, the step's global example count and
        the number of micro-batches every rank runs."""
        chunks, totals, counts = (list(column) for column in zip(*parts))
        return self.actor.optimize(chunks, self.algorithm, totals, counts)

    def end_iteration(self) -> dict[str, float]:
        return self.actor.update_old_policy(self.algorithm)

    def sampling_state(self) -> dict[str, torch.Tensor] | None:
        state = sampling_state(self.actor)  # every rank gathers; rank 0 sends
        return state if self.rank == 0 else None

    def live_state(self) -> dict[str, torch.Tensor] | None:
        state = live_state(self.actor)
        return state if self.rank == 0 else None

    def save(
        self,
        path: str,
        iteration: int,
        run_id: str,
        loop_state: dict,
        rollout_weights: dict[str, torch.Tensor] | None = None,
    ) -> str:
        """``rollout_weights`` (rank 0, pipelined runs): the engines' sampling weights, kept with
        the checkpoint (see :data:`~diffrl.train.checkpoint.ROLLOUT_WEIGHTS`)."""
        save_checkpoint(
            path,
            self.actor,
            self.config,
            iteration,
            self.rank == 0,
            run_id=run_id,
            loop_state=loop_state,
            rollout_weights=rollout_weights,
        )
        return path

    def resume(self, path: str) -> None:
        """Load the checkpoint into this rank's shards (every rank reads the whole files)."""
        load_resume_state(self.actor, path)
