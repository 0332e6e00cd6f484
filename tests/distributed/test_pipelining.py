"""``train.off_policy_steps: 1`` on the Ray runner: each rollout after the first is drawn with the
weights of one update earlier, and each online algorithm trains on it as it should.

What staleness means per algorithm (:meth:`~diffrl.algorithms.base.DiffusionAlgorithm.off_policy_problems`):
Flow-GRPO's ratio is against the log-probs the rollout recorded (μ, one update old), so the update
replays them with its starting weights (π_old), clips π_θ/π_old (exactly 1 at the first step) and
weights each term by the truncated ρ = π_old/μ, which departs from 1 exactly when the rollout is
stale; AWM's ratio is between the update's own start and now (the samples' policy does not enter),
and online DPO's loss compares the policy with the base on pairs: both take the older samples as
they are. (DiffusionNFT's pipelined run is ``test_ray_resume.py``'s, killed and resumed.)"""

from __future__ import annotations

import pytest

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

PIPELINED = {
    "runner": "ray",
    "parallel.engines": 1,
    "parallel.trainer_ranks": 1,
    "train.off_policy_steps": 1,
    "train.iterations": 2,
    "train.lr": 1e-3,
    "model.lora": "{rank: 4}",
    "eval.enabled": "false",
    "rewards": "[{name: tests.rewards:brightness}]",
}


def run(tmp_path, recipe: str, **extra):
    overrides = tiny_overrides(tmp_path, **{**SMALL_ROLLOUT, **PIPELINED, **extra})
    return train(load_config(f"recipes/{recipe}.yaml", overrides)).history


def test_flow_grpo_replays_a_stale_rollout_and_weights_it_by_the_truncated_ratio(tmp_path, ray_cluster):
    params = "{step_strategy: {name: sde_window, size: 2, range: [0, 2]}, rollout_correction: tis}"
    rows = run(tmp_path, "tiny_grpo_ocr_small", **{"algorithm.params": params, "sampling.num_steps": 3})
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0]
    # the first rollout was drawn with the weights it trains from: the engine's log-probs are the
    # trainer's own, bit for bit (the built-in engine), and every weight is 1
    assert rows[0]["train/rollout_log_prob_abs_diff"] == 0.0 and rows[0]["train/rollout_kl"] == 0.0
    stale = rows[1]  # drawn one update earlier: μ differs from the replay π_old
    assert stale["train/rollout_log_prob_abs_diff"] > 0 and stale["train/rollout_kl"] > 0
    assert stale["train/rollout_is_raw_mean"] != 1.0
    for r in rows:  # the clipped ratio starts from the replay: exactly 1 at the update's first step
        assert r["train/ratio_abs_minus_1"] == 0.0


@pytest.mark.slow  # the default run holds Flow-GRPO's stale rollout
@pytest.mark.parametrize("recipe", ["tiny_awm_ocr", "tiny_dpo_ocr"])
def test_awm_and_online_dpo_train_on_a_rollout_one_update_old(recipe, tmp_path, ray_cluster):
    rows = run(tmp_path, recipe)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0]
    assert all(r["train/grad_norm"] > 0 for r in rows)
