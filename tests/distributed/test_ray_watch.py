"""``eval.watch`` under runner=ray: the eval engine scores the held-out judges on the same images
as the eval total, and the driver pairs them across evals as a local run does. Before any update
the engines sample the base's bits (test_ray_runner), so the first eval's watched mean is the
local run's exactly; after the update, to the tolerance of test_ray_runner."""

from __future__ import annotations

import pytest

from diffrl.launch import train
from tests.distributed.test_ray_runner import REWARD_ATOL, config, train_local

pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")

WATCHED = "eval/watch/tests.rewards:contrast_mean"


@pytest.mark.slow
def test_a_ray_run_scores_the_watched_rewards_at_its_evals(tmp_path, ray_cluster):
    extra = {
        "parallel.engines": 1,
        "eval.enabled": "true",
        "eval.num_prompts": 4,
        "eval.batch_size": 4,
        "eval.rewards": "[{name: tests.rewards:brightness}]",
        "eval.watch": "[{name: tests.rewards:contrast}]",
        "eval.watch_alarm": "{k_se: 2.0}",
    }
    local = train_local(config(tmp_path, "flow_grpo", "local", **extra))
    distributed = train(config(tmp_path, "flow_grpo", "ray", **extra))
    assert len(local.evals) == len(distributed.evals) == 2  # before training and at the end
    assert distributed.evals[0][WATCHED] == local.evals[0][WATCHED]
    after, local_after = distributed.evals[1], local.evals[1]
    assert after[WATCHED] == pytest.approx(local_after[WATCHED], rel=0, abs=REWARD_ATOL)
    assert "eval/watch/tests.rewards:contrast_gain_se" in after and "alarm/reward_hacking" in after
