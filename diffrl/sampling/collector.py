"""Collectors turn the algorithm's :class:`~diffrl.core.rollout.CollectionSpec` into rollout batches.

A collector samples (or reads); it does not score. It yields a rollout's micro-groups one by one,
as they are drawn, so the driver can hand each to the rewards at once (scoring in other processes
overlaps the sampling of the next): see :class:`~diffrl.train.gather.Rollout`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from diffrl.config import Config
from diffrl.core.errors import Abandoned
from diffrl.core.rollout import Audio, CollectionSpec, Conditioning, RolloutBatch, quantize
from diffrl.core.seeding import EpochStream, randn_batch
from diffrl.data.offline import OfflineDataset
from diffrl.data.prompts import PromptSet
from diffrl.models.base import FamilyRuntime
from diffrl.models.numerics import ForwardMeter
from diffrl.sampling.kernels import resolve_kernel
from diffrl.sampling.sampler import denoise, image_size, initial_noise, sampling_sigmas


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
        self.kernel = resolve_kernel(spec.sampler)

    def stochastic_steps(self, rollout_id: int) -> list[int]:
        if not self.kernel.stochastic or self.spec.step_strategy is None:
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


class StageClock:
    """Seconds a collector spent per stage since the last :meth:`take` (the driver logs them as
    ``perf/rollout_<stage>_time`` each iteration)."""

    def __init__(self, device: torch.device | str, meter: ForwardMeter | None = None):
        self.device = torch.device(device)
        self.meter = meter
        self.seconds: dict[str, float] = {}
        self.flops = 0.0

    def __call__(self, stage: str, fn: Callable[[], Any]) -> Any:
        """``fn()``, its time added to ``stage``'s (once the device is done: CUDA runs ahead)."""
        t0, flops0 = time.perf_counter(), self.meter.flops if self.meter else 0.0
        out = fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.seconds[stage] = self.seconds.get(stage, 0.0) + time.perf_counter() - t0
        if self.meter is not None:
            self.flops += self.meter.flops - flops0
        return out

    def take(self) -> dict[str, float]:
        """``{"perf/rollout_<stage>_time": seconds}`` since the last take, and the model FLOPs
        of those stages (``perf/rollout_flops``, when counted); starts afresh."""
        seconds, flops, self.seconds, self.flops = self.seconds, self.flops, {}, 0.0
        out = {f"perf/rollout_{stage}_time": t for stage, t in seconds.items()}
        if flops:
            out["perf/rollout_flops"] = flops
        return out


class OfflineCollector:
    """Reads ``batch_size`` examples per iteration from an offline dataset (no sampling, no reward).

    Iteration ``k`` takes positions ``[k*B, (k+1)*B)`` of an endless stream of epochs, each a
    permutation keyed by (seed, epoch): the data order depends only on the seed.
    """

    def __init__(self, dataset: OfflineDataset, family: FamilyRuntime, batch_size: int, seed: int):
        self.dataset, self.family, self.batch_size = dataset, family, batch_size
        self.stream = EpochStream(len(dataset), seed, "epoch")
        self.clock = StageClock(family.device)
        """Seconds per stage: ``encode`` (the images to latents and the prompts)."""

    def micro_groups(
        self, iteration: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[RolloutBatch]:
        """The iteration's examples, as one part."""
        yield self.collect(iteration)

    def take_metrics(self) -> dict[str, float]:
        """Seconds per stage since the last call (:meth:`StageClock.take`)."""
        return self.clock.take()

    def close(self) -> None:
        pass

    def collect(self, iteration: int, module: nn.Module | None = None) -> RolloutBatch:
        """One row per image. An item of one image: ``group_id`` its dataset index,
        ``sample_index`` its stream position (unique per draw). An item of K images (a preference
        pair): K rows with ``group_id`` its stream position, ``sample_index`` 0..K-1 (0 = best),
        laid out as an online rollout's prompt groups."""
        start = iteration * self.batch_size
        indices = self.stream.take(start, self.batch_size)
        items = [self.dataset[i] for i in indices]
        grouped = items[0][0].ndim == 4  # (K, 3, H, W): K images of one caption
        k = len(items[0][0]) if grouped else 1
        images = (torch.cat if grouped else torch.stack)([item[0] for item in items])
        prompts = [item[1] for item in items for _ in range(k)]
        edits = len(items[0]) == 3  # (target, instruction, source): an edit pair
        sources = [item[2] for item in items for _ in range(k)] if edits else None
        x0 = self.clock("encode", lambda: self.family.encode_images(images.to(self.family.device)))
        cond = self.clock("encode", lambda: self.family.encode_prompts(prompts, sources))
        idx = torch.tensor(indices).repeat_interleave(k)
        position = torch.arange(start, start + self.batch_size)
        h, w = images.shape[-2:]
        return RolloutBatch(
            prompts=prompts,
            metadata=[{"source_image": s.resized(h, w)} for s in sources]
            if sources
            else [{} for _ in prompts],
            prompt_index=idx,
            sample_index=torch.arange(k).repeat(len(items)) if grouped else position,
            group_id=position.repeat_interleave(k) if grouped else idx,
            micro_group=torch.zeros_like(idx),
            x0=x0,
            cond=cond,
            sources=sources,
        )


class OnlineCollector:
    """The built-in rollout engine (``rollout.engine: diffrl``, see :mod:`diffrl.sampling.engine`):
    samples ``rollout.batch_size`` prompts x ``rollout.n_samples_per_prompt`` from the policy.

    Driven by the algorithm's :class:`CollectionSpec`: a stochastic kernel steps the steps the step
    strategy picks for the rollout, the others are Euler ODE steps (a deterministic kernel steps
    them all); the trajectory and log-probs of the stochastic steps are recorded only when the
    spec asks for them. Samples are drawn in micro-groups.

    Every draw is keyed by (seed, prompt slot, sample index[, step]), where the slot
    ``rollout_id * rollout.batch_size + q`` is the q-th prompt of the rollout: the result does not
    depend on the micro-group size or on how the rollout is split between workers.
    """

    def __init__(self, config: Config, family: FamilyRuntime, spec: CollectionSpec, prompts: PromptSet):
        self.config, self.family, self.spec, self.prompts = config, family, spec, prompts
        self.planner = RolloutPlanner(config, spec, len(prompts))
        self.seed = config.run.seed
        s = config.sampling
        self.num_steps, self.guidance = s.num_steps, s.guidance_scale
        self.sigmas = sampling_sigmas(config, family)
        self.height, self.width = image_size(config, family)
        self.kernel = self.planner.kernel
        self.clock = StageClock(family.device, family.meter)
        """Seconds per stage: ``encode`` (prompts), ``denoise``, ``decode`` (VAE, to uint8)."""

    def plan(self, rollout_id: int) -> RolloutPlan:
        return self.planner.plan(rollout_id)

    def negative(self, cond: Conditioning) -> Conditioning | None:
        """The negative-prompt conditioning for CFG of the rows of ``cond`` (None when CFG is off)."""
        return self.family.negative(self.config.sampling.negative_prompt, self.guidance, cond)

    def sample(self, plan: RolloutPlan, micro_group: int, module: nn.Module | None = None) -> RolloutBatch:
        """Sample one micro-group of ``plan`` (what a rollout engine does for its share)."""
        return self._sample(plan.micro_groups[micro_group], micro_group, plan.rollout_id, plan.steps, module)

    def micro_groups(
        self, rollout_id: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[RolloutBatch]:
        """Sample rollout ``rollout_id`` micro-group by micro-group; ``should_stop`` is asked before
        each (a stop signal: the rollout is abandoned with :class:`~diffrl.core.errors.Abandoned`)."""
        plan = self.plan(rollout_id)
        for g, chunk in enumerate(plan.micro_groups):
            if should_stop is not None and should_stop():
                raise Abandoned
            # sampled before the yield: the consumer between two parts runs in its own grad mode
            yield self._sample(chunk, g, rollout_id, plan.steps, module)

    def collect(self, rollout_id: int, module: nn.Module | None = None) -> RolloutBatch:
        """The whole rollout in one batch, unscored."""
        return RolloutBatch.cat(list(self.micro_groups(rollout_id, module)))

    def sync(self, module: nn.Module | None = None) -> dict[str, float]:
        """Nothing to send: this engine samples with the module each call is given."""
        return {}

    def take_metrics(self) -> dict[str, float]:
        """Seconds per stage since the last call (:meth:`StageClock.take`)."""
        return self.clock.take()

    def close(self) -> None:
        pass

    @torch.no_grad()
    def _sample(self, chunk, micro_group, rollout_id, steps, module) -> RolloutBatch:
        family, b = self.family, len(chunk)
        index = [p for _, p, _ in chunk]
        prompts = [self.prompts.prompts[p] for p in index]
        sources = self.prompts.sources(index, self.height, self.width)
        cond = self.clock("encode", lambda: family.encode_prompts(prompts, sources))
        neg = self.negative(cond)
        same = self.config.rollout.same_latent
        keys = [(self.seed, "init", q, 0 if same else j) for q, _, j in chunk]
        x = initial_noise(family, keys, self.height, self.width)

        def step_noise(i: int) -> torch.Tensor:
            return randn_batch(x.shape[1:], [(self.seed, "sde", q, j, i) for q, _, j in chunk]).to(x.device)

        out = self.clock(
            "denoise",
            lambda: denoise(
                family,
                x,
                cond,
                self.sigmas,
                kernel=self.kernel,
                stochastic_steps=steps,
                noise_level=self.spec.noise_level,
                step_noise=step_noise,
                guidance_scale=self.guidance,
                negative=neg,
                module=module,
                record=self.spec.keep_trajectory,
                record_mean=self.spec.keep_mean,
            ),
        )
        k = len(steps)
        step_idx = torch.tensor(steps, dtype=torch.long).expand(b, k)
        batch = RolloutBatch(
            prompts=prompts,
            metadata=self.prompts.reward_metadata(index, self.height, self.width),
            prompt_index=torch.tensor(index),
            sample_index=torch.tensor([j for _, _, j in chunk]),
            group_id=torch.tensor([q for q, _, _ in chunk]),
            micro_group=torch.full((b,), micro_group),
            x0=out.x0,
            cond=cond,
            sigmas=self.sigmas.expand(b, -1).clone(),
        )

        def decode() -> tuple[torch.Tensor, Audio | None]:  # what a rollout keeps: uint8, float16
            media = family.decode_media(out.x0)
            return quantize(media.images), media.audio.compact() if media.audio is not None else None

        batch.images, batch.audio = self.clock("decode", decode)
        if self.spec.keep_trajectory and k:
            batch.traj_x = torch.stack(out.traj_x, 1)
            batch.traj_next = torch.stack(out.traj_next, 1)
            batch.traj_step = step_idx.clone()
            batch.traj_sigma = self.sigmas[step_idx]
            batch.traj_sigma_next = self.sigmas[step_idx + 1]
            if self.spec.keep_log_prob:
                batch.traj_log_prob = torch.stack(out.traj_log_prob, 1)
            if self.spec.keep_mean:
                batch.traj_mean = torch.stack(out.traj_mean, 1)
        return batch
