"""Collectors turn the algorithm's :class:`CollectionSpec` into a :class:`RolloutBatch`."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from diffrl.algorithms.base import CollectionSpec, RolloutBatch
from diffrl.config import Config
from diffrl.data.offline import OfflineDataset
from diffrl.data.prompts import PromptSet
from diffrl.errors import Abandoned
from diffrl.models.base import ModelFamily
from diffrl.rewards.base import RewardOutput, RewardSet, quantize
from diffrl.sampling.kernels import ode_step, stochastic_kernel
from diffrl.sampling.sampler import DETERMINISTIC, heun_step, image_size, initial_noise, sampling_sigmas
from diffrl.seeding import EpochStream, randn_batch


@dataclass
class RolloutStats:
    reward_failed: int = 0
    errors: list[str] = field(default_factory=list)
    sampling_time: float = 0.0
    reward_wait_time: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    """Runner-specific rollout metrics (e.g. ``rollout/reissued``)."""


@dataclass
class RolloutPlan:
    """``micro_groups[g]``: the ``(slot, prompt, sample)`` jobs sampled together in micro-group g."""

    rollout_id: int
    micro_groups: list[list[tuple[int, int, int]]]
    steps: list[int]


class RolloutPlanner:
    """Which prompts and samples a rollout holds, split into micro-groups, and which of its steps
    are stochastic; needs no model (a Ray driver plans, its engines sample)."""

    def __init__(self, config: Config, spec: CollectionSpec, num_prompts: int):
        r = config.rollout
        self.n_prompts, self.n_samples = r.batch_size, r.n_samples_per_prompt
        self.micro_group_size = r.micro_group_size or config.train.micro_batch_size
        self.seed, self.num_steps = config.run.seed, config.sampling.num_steps
        self.stream = EpochStream(num_prompts, self.seed, "prompts")
        self.spec = spec

    def stochastic_steps(self, rollout_id: int) -> list[int]:
        if self.spec.sampler in DETERMINISTIC or self.spec.step_strategy is None:
            return []
        return list(self.spec.step_strategy(self.num_steps, rollout_id, self.seed))

    def plan(self, rollout_id: int) -> RolloutPlan:
        """The rollout's micro-groups of ``(slot, prompt, sample)`` jobs and its stochastic steps."""
        first_slot = rollout_id * self.n_prompts
        prompt_ids = self.stream.take(first_slot, self.n_prompts)
        # the slot is the prompt's position in the endless prompt stream, unique even when an
        # epoch boundary brings a prompt twice into one rollout
        jobs = [(first_slot + q, p, j) for q, p in enumerate(prompt_ids) for j in range(self.n_samples)]
        m = self.micro_group_size
        return RolloutPlan(
            rollout_id, [jobs[i : i + m] for i in range(0, len(jobs), m)], self.stochastic_steps(rollout_id)
        )


def attach_rewards(batch: RolloutBatch, out: RewardOutput, stats: RolloutStats) -> None:
    batch.rewards = out.total
    stats.errors = list(out.errors)
    stats.reward_failed = int((~torch.isfinite(out.total)).sum())
    # of the failed samples, those a reward's deadline failed (a hung or too slow reward)
    stats.metrics["rollout/reward_timed_out"] = float(out.timed_out.sum())


class OfflineCollector:
    """Reads ``batch_size`` examples per iteration from an offline dataset (no sampling, no reward).

    Iteration ``k`` takes positions ``[k*B, (k+1)*B)`` of an endless stream of epochs, each a
    permutation keyed by (seed, epoch): the data order depends only on the seed.
    """

    def __init__(self, dataset: OfflineDataset, family: ModelFamily, batch_size: int, seed: int):
        self.dataset, self.family, self.batch_size = dataset, family, batch_size
        self.stream = EpochStream(len(dataset), seed, "epoch")

    def collect(
        self, iteration: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> tuple[RolloutBatch, RolloutStats]:
        t0 = time.time()
        start = iteration * self.batch_size
        indices = self.stream.take(start, self.batch_size)
        images, prompts = zip(*(self.dataset[i] for i in indices))
        x0 = self.family.encode_images(torch.stack(images).to(self.family.device))
        idx = torch.tensor(indices)
        return RolloutBatch(
            prompts=list(prompts),
            metadata=[{} for _ in prompts],
            prompt_index=idx,
            sample_index=torch.arange(start, start + self.batch_size),  # stream position: unique per draw
            group_id=idx,
            micro_group=torch.zeros_like(idx),
            x0=x0,
            cond=self.family.encode_prompts(list(prompts)),
        ), RolloutStats(sampling_time=time.time() - t0)


class OnlineCollector:
    """Samples ``rollout.batch_size`` prompts x ``rollout.n_samples_per_prompt`` from the policy.

    Driven by the algorithm's :class:`CollectionSpec`: stochastic steps (chosen per rollout by the
    step strategy) use the spec's kernel, the others are Euler ODE steps; the trajectory and log-probs
    of the stochastic steps are recorded only when the spec asks for them. Samples are drawn in
    micro-groups; each micro-group's images go to the rewards at once, so scoring in other processes
    overlaps the sampling of the next one.

    Every draw is keyed by (seed, prompt slot, sample index[, step]), where the slot
    ``rollout_id * rollout.batch_size + q`` is the q-th prompt of the rollout: the result does not
    depend on the micro-group size or on how the rollout is split between workers.
    """

    def __init__(
        self,
        config: Config,
        family: ModelFamily,
        spec: CollectionSpec,
        prompts: PromptSet,
        rewards: RewardSet | None,
    ):
        self.config, self.family, self.spec, self.prompts, self.rewards = (
            config,
            family,
            spec,
            prompts,
            rewards,
        )
        self.planner = RolloutPlanner(config, spec, len(prompts))
        self.seed = config.run.seed
        s = config.sampling
        self.num_steps, self.guidance = s.num_steps, s.guidance_scale
        self.sigmas = sampling_sigmas(config, family)
        self.height, self.width = image_size(config, family)
        self.kernel = stochastic_kernel(spec.sampler) if spec.sampler not in DETERMINISTIC else None
        self.heun = spec.sampler == "heun"

    def plan(self, rollout_id: int) -> RolloutPlan:
        return self.planner.plan(rollout_id)

    def negative(self):
        """The negative-prompt conditioning for CFG (None when CFG is off)."""
        return self.family.negative(self.config.sampling.negative_prompt, self.guidance)

    @torch.no_grad()
    def sample(self, plan: RolloutPlan, micro_group: int, module: nn.Module | None = None) -> RolloutBatch:
        """Sample one micro-group of ``plan`` (what a rollout engine does for its share)."""
        return self._sample(
            plan.micro_groups[micro_group], micro_group, plan.rollout_id, plan.steps, self.negative(), module
        )

    @torch.no_grad()
    def collect(
        self, rollout_id: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> tuple[RolloutBatch, RolloutStats]:
        """Sample and score rollout ``rollout_id``; ``should_stop`` is asked before each micro-group
        (a stop signal: the rollout is abandoned with :class:`~diffrl.errors.Abandoned`)."""
        start = time.time()
        plan = self.plan(rollout_id)
        negative = self.negative()
        parts, pending = [], []
        stats = RolloutStats()
        for g, chunk in enumerate(plan.micro_groups):
            if should_stop is not None and should_stop():
                raise Abandoned
            part = self._sample(chunk, g, rollout_id, plan.steps, negative, module)
            if self.rewards is not None:
                pending.append(self.rewards.submit(part.images, part.prompts, part.metadata))
            parts.append(part)
        stats.sampling_time = time.time() - start
        batch = RolloutBatch.cat(parts)
        if self.rewards is not None:
            t0 = time.time()
            out = RewardOutput.cat([p.result() for p in pending])
            stats.reward_wait_time = time.time() - t0
            attach_rewards(batch, out, stats)
        return batch, stats

    def _sample(self, chunk, micro_group, rollout_id, steps, negative, module) -> RolloutBatch:
        family, b = self.family, len(chunk)
        prompts = [self.prompts.prompts[p] for _, p, _ in chunk]
        cond = family.encode_prompts(prompts)
        neg = negative.repeat(b) if negative is not None else None
        same = self.config.rollout.same_latent
        keys = [(self.seed, "init", q, 0 if same else j) for q, _, j in chunk]
        x = initial_noise(family, keys, self.height, self.width)
        keep = self.spec.keep_trajectory
        traj_x, traj_next, traj_lp = [], [], []
        sigma_max = self.sigmas[1].item()
        for i in range(self.num_steps):
            sigma, sigma_next = self.sigmas[i].expand(b), self.sigmas[i + 1].expand(b)
            v = family.velocity(x, sigma, cond, self.guidance, neg, module=module)
            if i in steps:
                noise = randn_batch(x.shape[1:], [(self.seed, "sde", q, j, i) for q, _, j in chunk]).to(
                    x.device
                )
                out = self.kernel(x, v, sigma, sigma_next, self.spec.noise_level, sigma_max, noise=noise)
                if keep:
                    traj_x.append(x)
                    traj_next.append(out.prev_sample)
                    traj_lp.append(out.log_prob)
                x = out.prev_sample
            elif self.heun:
                x = heun_step(family, x, v, sigma, sigma_next, cond, self.guidance, neg, module)
            else:
                x = ode_step(x, v, sigma, sigma_next)
        k = len(steps)
        step_idx = torch.tensor(steps, dtype=torch.long).expand(b, k)
        batch = RolloutBatch(
            prompts=prompts,
            metadata=[self.prompts.metadata[p] for _, p, _ in chunk],
            prompt_index=torch.tensor([p for _, p, _ in chunk]),
            sample_index=torch.tensor([j for _, _, j in chunk]),
            group_id=torch.tensor([q for q, _, _ in chunk]),
            micro_group=torch.full((b,), micro_group),
            x0=x,
            cond=cond,
            images=quantize(family.decode(x)),
            sigmas=self.sigmas.expand(b, -1).clone(),
        )
        if keep and k:
            batch.traj_x = torch.stack(traj_x, 1)
            batch.traj_next = torch.stack(traj_next, 1)
            batch.traj_step = step_idx.clone()
            batch.traj_sigma = self.sigmas[step_idx]
            batch.traj_sigma_next = self.sigmas[step_idx + 1]
            if self.spec.keep_log_prob:
                batch.traj_log_prob = torch.stack(traj_lp, 1)
        return batch
