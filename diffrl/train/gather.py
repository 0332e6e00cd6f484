"""Gathering a rollout: its micro-groups as they arrive with their pending scores, the
reward statistics of the whole (failed samples counted, not averaged), and the samples that can be
trained on."""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable

import torch

from diffrl.core.rollout import RewardScores, RolloutBatch, RolloutStats
from diffrl.logging import Progress
from diffrl.rewards.base import RewardOutput
from diffrl.train.runner import PendingScore, Runner


class Rollout:
    """A rollout's micro-groups and their pending scores, added as they arrive (in any order)."""

    def __init__(self) -> None:
        self.start = time.time()
        self.parts: list[tuple[RolloutBatch, PendingScore | None]] = []

    def add(self, part: RolloutBatch, pending: PendingScore | None) -> None:
        self.parts.append((part, pending))

    def finish(self, bars: bool = True) -> tuple[RolloutBatch, RolloutStats]:
        """The rollout in micro-group order, with the rewards attached once every score is in
        (``bars``: show the scoring's progress; off for a rollout drawn in the background)."""
        stats = RolloutStats(sampling_time=time.time() - self.start)
        parts = sorted(self.parts, key=lambda p: int(p[0].micro_group[0]))
        batch = RolloutBatch.cat([part for part, _ in parts])
        if parts and parts[0][1] is not None:
            t0 = time.time()
            scored = []
            bar = Progress("scoring", len(parts), "group") if bars else None
            try:
                for _, pending in parts:  # the micro-groups' scores awaited
                    scored.append(pending.result())
                    if bar is not None:
                        bar.update(len(scored))
            finally:
                if bar is not None:
                    bar.close()
            out = RewardOutput.cat(scored)
            stats.reward_wait_time = time.time() - t0
            batch.rewards = out.total
            batch.reward_scores = RewardScores(out.per_reward)
            stats.errors = list(out.errors)
            stats.reward_failed = int((~torch.isfinite(out.total)).sum())
            # of the failed samples, those a reward's deadline failed (a hung or too slow reward)
            stats.metrics["rollout/reward_timed_out"] = float(out.timed_out.sum())
            stats.metrics.update(out.metrics("rollout/reward"))  # each reward's raw scores
        return batch, stats


def collect_rollout(
    runner: Runner, iteration: int, should_stop: Callable[[], bool] | None = None, bars: bool = True
) -> tuple[RolloutBatch, RolloutStats]:
    """Sample and score one rollout (the pipelined driver's background rollout; tests, benchmarks
    and tools)."""
    rollout = Rollout()
    for part in runner.sample(iteration, should_stop):
        rollout.add(part, runner.score(part))
    return rollout.finish(bars)


def rollout_metrics(batch: RolloutBatch, stats: RolloutStats, iteration: int) -> dict[str, float]:
    if stats.errors:
        late = int(stats.metrics.get("rollout/reward_timed_out", 0))
        warnings.warn(
            f"iteration {iteration}: {stats.reward_failed} sample(s) dropped: {stats.errors[0]}"
            + (f" (and {len(stats.errors) - 1} more error(s))" if len(stats.errors) > 1 else "")
            + (
                f"; {late} of them missed a reward's deadline (rewards[].timeout_s): which ones do "
                "depends on the machine's load, so from here this run does not reproduce bit for bit"
                if late
                else ""
            ),
            stacklevel=2,
        )
    metrics = dict(stats.metrics)
    if batch.policy_version is not None and len(batch):
        stale = iteration - batch.policy_version
        metrics["rollout/staleness_mean"] = stale.double().mean().item()
        metrics["rollout/staleness_max"] = float(stale.max())
    if batch.rewards is None:
        return metrics
    ok = torch.isfinite(batch.rewards)
    failed = {
        "rollout/reward_failed": float(stats.reward_failed),
        "rollout/reward_failed_frac": stats.reward_failed / max(len(batch), 1),
    }
    if not ok.any():
        return {**failed, **metrics}
    r, group_id = batch.rewards[ok], batch.group_id[ok]
    groups = group_id.unique()
    zero = sum(bool((r[group_id == g] == r[group_id == g][0]).all()) for g in groups)
    return {
        "rollout/reward/raw_mean": r.mean().item(),
        "rollout/reward/raw_std": r.std(unbiased=False).item(),
        "rollout/reward/raw_min": r.min().item(),
        "rollout/reward/raw_max": r.max().item(),
        "rollout/zero_std_ratio": zero / len(groups),
        **failed,
        **metrics,
    }


def scored_samples(batch: RolloutBatch) -> RolloutBatch:
    """The samples whose reward could be had (all of them for reward-free algorithms)."""
    if batch.rewards is None:
        return batch
    return batch.select(torch.nonzero(torch.isfinite(batch.rewards)).flatten())
