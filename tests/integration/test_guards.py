"""A run that wastes its compute stops with an error instead of exiting 0 with an untrained
'final' checkpoint: every reward failing, non-finite losses step after step."""

from __future__ import annotations

import pytest
import torch

from diffrl.algorithms.diffusion_nft import DiffusionNFT
from diffrl.core.errors import RunStopped
from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides


def always_fails(images, prompts, metadata):
    raise RuntimeError("scorer unavailable")


class NanLoss(DiffusionNFT):
    """DiffusionNFT whose every loss is NaN (a diverged run)."""

    def compute_loss(self, policy, examples):
        loss, metrics = super().compute_loss(policy, examples)
        return loss * torch.tensor(float("nan")), metrics


def _config(tmp_path, **extra):
    settings = {
        "rollout.batch_size": 2,
        "rollout.n_samples_per_prompt": 2,
        "rollout.micro_group_size": 2,
        "rollout.num_steps_per_rollout": 1,
        "eval.enabled": "false",
        "train.iterations": 6,
        **extra,
    }
    return load_config("recipes/tiny_nft_ocr.yaml", tiny_overrides(tmp_path, **settings))


DROPPED = r"sample\(s\) dropped: reward 'tests.integration.test_guards:always_fails' raised RuntimeError"
"""The warning of an iteration whose reward failed (the run goes on until the guard stops it)."""


def test_every_reward_failing_stops_after_max_failed_iterations(tmp_path):
    config = _config(tmp_path, rewards="[{name: tests.integration.test_guards:always_fails}]")
    with pytest.raises(RunStopped, match=r"failed in 3 consecutive iterations.*scorer unavailable"):
        with pytest.warns(UserWarning, match=DROPPED):  # each failed iteration says what it dropped
            train(config)
    assert not (tmp_path / "run" / "checkpoints" / "final").exists()


def test_a_short_run_without_one_optimizer_step_writes_no_final_checkpoint(tmp_path):
    config = _config(
        tmp_path, rewards="[{name: tests.integration.test_guards:always_fails}]", **{"train.iterations": 2}
    )
    with pytest.raises(RunStopped, match="no optimizer step was taken in 2 iteration"):
        with pytest.warns(UserWarning, match=DROPPED):
            train(config)
    assert not (tmp_path / "run" / "checkpoints" / "final").exists()


def test_consecutive_non_finite_steps_stop_naming_the_last_good_checkpoint(tmp_path):
    config = _config(
        tmp_path,
        rewards="[{name: tests.rewards:brightness}]",
        **{
            "algorithm.name": "tests.integration.test_guards:NanLoss",
            "train.max_nonfinite_steps": 2,
        },
    )
    with (
        pytest.raises(RunStopped, match="2 consecutive optimizer steps had a non-finite.*none was written"),
        # each skipped step says so
        pytest.warns(UserWarning, match="non-finite loss or gradient, optimizer step skipped"),
    ):
        train(config)
