"""``monitor.kl_every`` end to end: a tiny Flow-GRPO run without a KL logs ``monitor/kl_to_base``
on every kl_every-th iteration, and measuring it changes nothing the run computes (with LoRA
dropout, whose forwards draw random numbers: the measurement must not shift the run's draws); a
resume with another kl_every measures where the whole run did, the same number."""

import math

import torch
from safetensors.torch import load_file

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides
from tests.integration.test_hacking import HACKING

WORLD = {
    **HACKING,
    "rollout.batch_size": 1,  # one prompt's 4 samples: one optimizer step of them
    "train.batch_size": 4,
    "train.micro_batch_size": 4,
    "model.lora": "{rank: 4, dropout: 0.1}",
    "sampling.num_steps": 2,
    "train.iterations": 3,
}


def run(tmp_path, kl_every: int, **extra):
    overrides = tiny_overrides(tmp_path, **{**WORLD, "monitor.kl_every": kl_every, **extra})
    result = train(load_config("recipes/tiny_grpo_ocr_small.yaml", overrides))
    return result.history, load_file(str(result.checkpoint / "trainable.safetensors"))


def test_a_run_without_kl_measures_its_drift_every_kl_every_iterations_and_nothing_else(tmp_path):
    measured, weights = run(tmp_path / "measured", kl_every=2)
    plain, plain_weights = run(tmp_path / "plain", kl_every=0, **{"train.save_every": 1})
    drift = {m["step"]: m["monitor/kl_to_base"] for m in measured if "monitor/kl_to_base" in m}
    assert list(drift) == [2]  # measured before the update of iteration 2 (after one update)
    assert drift[2] > 0
    assert all("monitor/kl_to_base" not in m for m in plain)
    # the same run bit for bit: weights, losses, metrics (times aside)
    assert weights.keys() == plain_weights.keys()
    assert all(torch.equal(weights[k], plain_weights[k]) for k in weights)
    for a, b in zip(measured, plain, strict=True):
        ours = {k: v for k, v in a.items() if not k.startswith("perf/") and k != "monitor/kl_to_base"}
        theirs = {k: v for k, v in b.items() if not k.startswith("perf/")}
        assert ours.keys() == theirs.keys()
        assert all(ours[k] == theirs[k] or (math.isnan(ours[k]) and math.isnan(theirs[k])) for k in ours)
    # a resume may change kl_every (it keeps no state): it measures where the whole run did, the same
    step_1 = tmp_path / "plain" / "run" / "checkpoints" / "step_00001"
    resumed, resumed_weights = run(tmp_path / "resumed", kl_every=2, **{"train.resume": str(step_1)})
    assert [m["step"] for m in resumed] == [2, 3]
    assert resumed[0]["monitor/kl_to_base"] == drift[2] and "monitor/kl_to_base" not in resumed[1]
    assert all(torch.equal(resumed_weights[k], weights[k]) for k in weights)
