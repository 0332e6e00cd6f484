"""AWM's EMA-KL on the tiny model: the actor keeps the EMA as its old-policy copy, rollouts and the
engines' weight sync still use the live weights (the reference samples with its default adapter),
and a run logs the EMA-KL and the reference's decay ramp. The formula: tests/unit/algorithms/
test_awm_reference.py."""

import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.distributed.ray.weight_sync import sampling_state
from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.train.runner import LocalRunner
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

EMA = "{ema_kl_beta: 1.0, advantage_max: 1.0, num_timesteps: 2}"


def awm(tmp_path, **extra):
    base = {
        "rewards": "[{name: tests.rewards:brightness}]",
        **SMALL_ROLLOUT,
        "rollout.batch_size": 1,
        "rollout.num_steps_per_rollout": 2,
        "train.batch_size": 2,
        "train.micro_batch_size": 2,
        "train.iterations": 1,
        "model.lora": "{rank: 4}",
        "eval.enabled": "false",
        "sampling.num_steps": 3,
        "algorithm.params": EMA,
        **extra,
    }
    return load_config("recipes/tiny_awm_ocr.yaml", tiny_overrides(tmp_path, **base))


def test_the_ema_anchors_the_loss_but_rollouts_sample_with_the_live_weights(tmp_path):
    cfg = awm(tmp_path)
    algorithm = build_algorithm(cfg)
    runner = LocalRunner(cfg, algorithm, algorithm.collection_spec())  # as train() builds its actor
    try:
        actor = runner.actor
    finally:
        runner.close()
    with torch.no_grad():
        for p in actor.params:  # the live weights move away from the EMA
            p.add_(0.05 * torch.randn_like(p))
    assert actor.policy.old is not None and actor.policy.old.deviation() > 0
    with actor.policy.sampling_weights() as module:
        assert module is None  # the collector's default: the live weights
    live = {n: p.detach() for n, p in actor.family.transformer.named_parameters() if ".default." in n}
    synced = sampling_state(actor)
    assert synced.keys() == live.keys()
    assert all(torch.equal(synced[n], live[n]) for n in live)


def test_a_run_logs_the_ema_kl_and_the_decay_ramp(tmp_path):
    m = train(awm(tmp_path)).history[0]
    # two optimizer steps: the second one's live weights have left the EMA (a copy of the start)
    assert m["train/ema_kl_loss"] > 0 and m["train/skipped_nonfinite"] == 0
    assert m["train/old_policy_decay"] == pytest.approx(0.002)  # min(0.3, 0.001 x 2 steps)
