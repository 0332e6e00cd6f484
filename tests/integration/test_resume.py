"""``train.resume``: a run stopped at a checkpoint and resumed ends exactly where the uninterrupted
run ends (CPU, same process layout): weights, optimizer, LR schedule, EMA, the old policy, and the
rollout stream (prompts and noise keyed by iteration)."""

import json

import pytest
import torch
from safetensors.torch import load_file

from diffrl.config import ConfigError
from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.train.checkpoint import CheckpointError
from diffrl.train.run_folder import RunFolder
from tests.conftest import tiny_overrides

BRIGHTNESS = "[{name: tests.rewards:brightness}]"
SMALL = {
    "model.lora": "{rank: 4, alpha: 8}",
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 2,
    "rollout.micro_group_size": 2,
    "rollout.num_steps_per_rollout": 1,
    "train.iterations": 4,
    "train.save_every": 2,
    "train.eval_every": 2,
    "train.lr": 1e-3,
    "train.lr_schedule": "cosine",
    "train.warmup_steps": 1,
    "train.ema_decay": 0.5,
    "rewards": BRIGHTNESS,
    "eval.rewards": BRIGHTNESS,
}
ALGORITHMS = {
    # DiffusionNFT samples with a trailing old policy (flat_ramp: old = live for 75 steps, so 'ramp')
    "tiny_nft_ocr": {"algorithm.params.decay_schedule": "ramp"},
    "tiny_grpo_ocr_small": {"algorithm.params.step_strategy": "{name: all}"},
}


def _config(tmp_path, recipe, name, **extra):
    overrides = tiny_overrides(tmp_path, **{**SMALL, **ALGORITHMS[recipe], **extra})
    overrides = [o.replace(str(tmp_path / "run"), str(tmp_path / name)) for o in overrides]
    return load_config(f"recipes/{recipe}.yaml", overrides)


def _files(checkpoint):
    return {f.name: load_file(str(f)) for f in sorted(checkpoint.glob("*.safetensors"))}


@pytest.mark.parametrize("recipe", list(ALGORITHMS))
def test_a_resumed_run_ends_exactly_where_the_whole_run_ends(tmp_path, recipe):
    whole = train(_config(tmp_path, recipe, "whole"))
    half = whole.output_dir / "checkpoints" / "step_00002"
    resumed = train(_config(tmp_path, recipe, "resumed", **{"train.resume": str(half)}))

    assert [h["step"] for h in resumed.history] == [3, 4]
    for a, b in zip(whole.history[2:], resumed.history, strict=True):
        assert a["rollout/reward/raw_mean"] == b["rollout/reward/raw_mean"]
        assert a["train/loss"] == b["train/loss"] and a["train/lr"] == b["train/lr"]
    files = _files(whole.checkpoint)
    expected = {"trainable.safetensors", "optimizer.safetensors", "ema.safetensors"}
    if recipe == "tiny_nft_ocr":
        expected.add("old_policy.safetensors")
    assert set(files) == expected
    assert _files(resumed.checkpoint).keys() == files.keys()
    for name, tensors in _files(resumed.checkpoint).items():
        for key, value in tensors.items():
            assert torch.equal(value, files[name][key]), (name, key)
    # the eval history continues from the checkpoint: the same steps with the same results
    assert [e["step"] for e in resumed.evals] == [e["step"] for e in whole.evals] == [0, 2, 4]
    for a, b in zip(whole.evals, resumed.evals, strict=True):
        assert a["eval/reward_mean"] == b["eval/reward_mean"]


def test_resuming_into_the_same_folder_keeps_the_eval_curve(tmp_path):
    first = train(_config(tmp_path, "tiny_nft_ocr", "run", **{"train.iterations": 2}))
    resumed = train(
        _config(
            tmp_path, "tiny_nft_ocr", "run", **{"train.resume": str(first.checkpoint), "train.iterations": 4}
        )
    )
    curve = json.loads((resumed.output_dir / "eval_curve.json").read_text())
    assert [e["step"] for e in curve] == [0, 2, 4]
    assert curve[2]["train_time_s"] >= curve[1]["train_time_s"]


def test_bad_resumes_are_refused_before_anything_loads(tmp_path):
    done = str(train(_config(tmp_path, "tiny_nft_ocr", "whole", **{"train.iterations": 2})).checkpoint)
    cases = [
        ({"train.resume": str(tmp_path / "nowhere")}, CheckpointError, "is not a diffrl checkpoint"),
        ({"train.resume": done}, ConfigError, "at iteration 2, train.iterations is 2"),
        (
            {"train.resume": done, "train.iterations": 4, "model.lora": "{rank: 8}"},
            ConfigError,
            "differs from model.lora",
        ),
    ]
    for extra, error, message in cases:
        config = _config(tmp_path, "tiny_nft_ocr", "again", **{"train.iterations": 2, **extra})
        with pytest.raises(error, match=message):
            train(config)
        # refused before anything loaded or was written: the folder holds no run
        assert not RunFolder(tmp_path / "again").holds_run()
