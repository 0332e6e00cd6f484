"""``runner: ray``: a reward worker still busy at its reward's deadline is killed and replaced, and
that micro-group's samples fail (NaN, "timed out", counted); the rollout goes on."""

from __future__ import annotations

import time

import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.distributed.ray.dispatch import Dispatch
from diffrl.distributed.ray.runner import RayRunner
from diffrl.preflight import load_config
from diffrl.train.gather import collect_rollout
from tests.conftest import ROOT, SMALL_ROLLOUT, tiny_overrides
from tests.rewards import WARM_UP

ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")


def warm_up(worker) -> None:
    """Wait until a reward worker is up: its start-up must not eat the test's short deadline."""
    ray.get(worker.score.remote(torch.zeros(1, 3, 8, 8), [WARM_UP], [{}]))


@pytest.mark.slow  # tests/unit/rewards/test_deadlines.py holds the deadlines in one process
def test_a_reward_worker_past_its_deadline_is_replaced_and_its_samples_fail(tmp_path, ray_cluster):
    overrides = {
        "runner": "ray",
        **SMALL_ROLLOUT,  # two micro-groups of 4, sampled and scored in order
        "sampling.num_steps": 2,
        "eval.enabled": "false",
        "rewards": "[{name: tests.rewards:hangs_on_second_call, timeout_s: 5}]",
    }
    cfg = load_config(str(ROOT / "recipes" / "tiny_nft_ocr.yaml"), tiny_overrides(tmp_path, **overrides))
    algorithm = build_algorithm(cfg)
    runner = RayRunner(cfg, algorithm, algorithm.collection_spec())
    try:
        for rollout in range(2):  # the replacement worker scores the next rollout (and hangs too)
            worker = runner.dispatch.reward_pools[0].actors[0]
            warm_up(worker)
            batch, stats = collect_rollout(runner, rollout)
            assert batch.rewards[:4].tolist() == [1.0] * 4 and batch.rewards[4:].isnan().all()
            assert stats.reward_failed == 4 and stats.metrics["rollout/reward_timed_out"] == 4.0
            assert "timed out after 5 s" in stats.errors[0]
            assert runner.dispatch.reward_pools[0].actors[0] is not worker
    finally:
        runner.close()


@pytest.mark.slow
def test_a_worker_that_timed_out_its_own_call_is_replaced_when_the_driver_comes_late(
    tmp_path, ray_cluster, monkeypatch
):
    """The worker enforces the deadline too: a driver that waits only after the worker answered
    "timed out" itself gets that answer, and must still replace the worker (its thread is stuck)."""
    overrides = {
        "runner": "ray",
        **SMALL_ROLLOUT,
        "sampling.num_steps": 2,
        "eval.enabled": "false",
        "rewards": "[{name: tests.rewards:hangs_on_second_call, timeout_s: 2}]",
    }
    cfg = load_config(str(ROOT / "recipes" / "tiny_nft_ocr.yaml"), tiny_overrides(tmp_path, **overrides))
    algorithm = build_algorithm(cfg)
    runner = RayRunner(cfg, algorithm, algorithm.collection_spec())
    wait = Dispatch._score_result

    def late(self, part, jobs, last_checkpoint):
        if part.micro_group[0].item() == 1:
            ray.get(jobs[0][2])  # the worker's own "timed out" answer is in before the driver waits
            time.sleep(0.5)
        return wait(self, part, jobs, last_checkpoint)

    monkeypatch.setattr(Dispatch, "_score_result", late)
    try:
        worker = runner.dispatch.reward_pools[0].actors[0]
        warm_up(worker)
        batch, stats = collect_rollout(runner, 0)
        assert batch.rewards[:4].tolist() == [1.0] * 4 and batch.rewards[4:].isnan().all()
        assert stats.metrics["rollout/reward_timed_out"] == 4.0
        assert runner.dispatch.reward_pools[0].actors[0] is not worker
    finally:
        runner.close()
