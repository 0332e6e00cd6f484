"""``diffrl plan``: the prediction on fake tensors against the same step measured on the real tiny
model (real weights, real prompts through its text encoder, the actor's LoRA and optimizer), and
the command's table."""

from __future__ import annotations

import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.cli import main
from diffrl.models.registry import load_family
from diffrl.plan.planner import _FrozenAwareMemTracker, plan
from diffrl.preflight import load_config
from diffrl.train.actor import Actor
from tests.conftest import ROOT

RECIPE = str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml")


def _config(tmp_path, *overrides: str):
    return load_config(RECIPE, [f"run.output_dir={tmp_path}", "model.path=random", *overrides])


@pytest.mark.parametrize("micro_batch", [2, 8])
def test_predicted_peak_is_within_15_percent_of_the_real_step(tmp_path, micro_batch):
    """The tiny model at 64 x 64 (256 tokens) with CFG: the plan's peak (a meta-built transformer,
    zero conditioning, fake tensors) against the peak ``MemTracker`` counts for the same step of the
    real actor: its LoRA transformer's guided velocity on real encoded prompts, backward, AdamW step."""
    config = _config(
        tmp_path,
        f"train.micro_batch_size={micro_batch}",
        "sampling.height=64",
        "sampling.width=64",
        "sampling.guidance_scale=4.5",
    )
    algorithm = build_algorithm(config)
    predicted = plan(config, algorithm)
    assert predicted.rows == 2 * micro_batch  # CFG: negative and positive rows

    torch.manual_seed(0)
    family = load_family(config)
    actor = Actor(family, config)
    cond = family.encode_prompts(['the word "cat"'] * micro_batch)
    x = torch.randn(micro_batch, *predicted.latent)
    sigma = torch.full((micro_batch,), 0.9)
    for p in actor.params:  # AdamW's state as after a first step (the plan counts it so)
        p.grad = torch.zeros_like(p)
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)
    tracker = _FrozenAwareMemTracker()
    tracker.track_external(family.transformer, actor.optimizer, x, sigma)
    with tracker:
        v = actor.policy.velocity(
            x,
            sigma,
            cond,
            guidance_scale=config.sampling.guidance_scale,
            negative=actor.policy.negative(cond),
        )
        v.float().square().mean().backward()
        actor.optimizer.step()
        actor.optimizer.zero_grad(set_to_none=True)
    measured = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
    ratio = predicted.memory.peak / measured
    print(
        f"micro-batch {micro_batch}: predicted {predicted.memory.peak} B, measured {measured} B, ratio {ratio:.3f}"
    )
    assert 0.85 <= ratio <= 1.15
    assert predicted.memory.activations > 0 and predicted.trainable == actor.num_trainable()


def test_plan_prints_the_table_for_a_recipe(tmp_path, capsys):
    code = main(["plan", RECIPE, f"run.output_dir={tmp_path}", "--gpu", "A100", "--mfu", "0.5"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "memory per trainer rank (GiB, tensors)" in out and "peak" in out
    assert "fits in a A100's 80 GB" in out
    assert "rollout" in out and "train" in out and "at MFU 0.5 on A100" in out


def test_plan_refuses_unknown_gpus_and_models_it_has_no_files_for(tmp_path, capsys):
    assert main(["plan", RECIPE, "--gpu", "TPU"]) == 2
    assert "--gpu 'TPU' is not one of H200, H100" in capsys.readouterr().err
    wan = str(ROOT / "recipes" / "wan22_grpo.yaml")
    assert main(["plan", wan, "model.path=/nowhere/My-Wan"]) == 2
    err = capsys.readouterr().err
    assert "no shipped configs are named 'My-Wan'" in err and "Wan2.2-T2V-A14B-Diffusers" in err
