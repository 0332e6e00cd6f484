"""``diffrl plan``: the prediction on fake tensors against what the same step allocated on the real
tiny model (real weights, real prompts through its text encoder, the actor's LoRA and optimizer;
the CPU allocator's high-water mark, not a tracker), the blocks counted as copies against the
trace of every block, and the command's table. The other families, full fine-tunes, FSDP2 and
sequence parallel against what they allocated: ``benchmarks/plan_accuracy.py``."""

from __future__ import annotations

import json
import shutil

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.cli import main
from diffrl.cli.commands.train import SECTIONS
from diffrl.models.base import SHIPPED_CONFIGS
from diffrl.models.registry import load_family
from diffrl.plan.allocated import allocated_rise, storage_bytes
from diffrl.plan.planner import plan
from diffrl.preflight import check_plugins, load_config
from diffrl.preflight.schema import read_config
from diffrl.train.actor import Actor
from tests.conftest import ROOT

RECIPE = str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml")


def _config(tmp_path, *overrides: str):
    return load_config(RECIPE, [f"run.output_dir={tmp_path}", "model.path=random", *overrides])


def test_predicted_peak_is_within_15_percent_of_what_the_step_allocated(tmp_path):
    """The tiny model at 64 x 64 (256 tokens), micro-batch 4 with CFG: the plan's peak (a meta-built
    transformer, zero conditioning, fake tensors) against the real actor's step (its LoRA
    transformer's guided velocity on real encoded prompts, backward, AdamW step): the tensors it
    starts with plus the CPU allocator's high-water mark during it (:mod:`diffrl.plan.allocated`)."""
    micro_batch = 4
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
    negative = actor.policy.negative(cond)
    x = torch.randn(micro_batch, *predicted.latent)
    sigma = torch.full((micro_batch,), 0.9)

    def step() -> None:
        v = actor.policy.velocity(
            x, sigma, cond, guidance_scale=config.sampling.guidance_scale, negative=negative
        )
        v.float().square().mean().backward()
        actor.optimizer.step()
        actor.optimizer.zero_grad(set_to_none=True)

    step()  # AdamW's state as after a first step (the plan counts it so)
    held = [*family.transformer.parameters(), *family.transformer.buffers(), x, sigma]
    held += [*cond.tensors.values(), *negative.tensors.values()]
    held += [v for state in actor.optimizer.state.values() for v in state.values()]
    measured = storage_bytes(held) + allocated_rise(step)
    ratio = predicted.memory.peak / measured
    print(f"predicted {predicted.memory.peak} B, allocated {measured} B, ratio {ratio:.3f}")
    assert 0.85 <= ratio <= 1.15
    assert predicted.memory.activations > 0 and predicted.trainable == actor.num_trainable()


def _sd3_shaped(tmp_path, **transformer) -> str:
    """A folder of SD3.5 Medium's JSON files (no weights) with the transformer's settings changed."""
    folder = tmp_path / "sd3"
    shutil.copytree(SHIPPED_CONFIGS / "stable-diffusion-3.5-medium", folder)
    path = folder / "transformer" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **transformer}))
    return str(folder)


def test_blocks_counted_as_copies_plan_as_every_block_traced(tmp_path):
    """Runs of identical blocks traced in part (``diffrl.plan.planner._Run``: each run's first four
    and last two, the others counted as copies of the fourth) give the very peak, by kind, and FLOPs
    of the trace of every block: a tiny SD3.5-shaped model of three kinds of blocks (7 with dual
    attention, 7 plain, the context-pre-only last), LoRA, gradient checkpointing, FSDP2 over 2 fake
    ranks, whose backward waits for and prefetches the blocks before."""
    folder = _sd3_shaped(
        tmp_path,
        num_layers=15,
        dual_attention_layers=list(range(7)),
        attention_head_dim=8,
        num_attention_heads=2,
        caption_projection_dim=16,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        pos_embed_max_size=16,
        sample_size=8,
    )
    overrides = [
        f"model.path={folder}",
        f"run.output_dir={tmp_path / 'run'}",
        "model.options={max_sequence_length: 8, gradient_checkpointing: true}",
        "sampling.height=32",
        "sampling.width=32",
        "train.micro_batch_size=1",
        "parallel.trainer_ranks=2",
    ]
    config, source = read_config(str(ROOT / "recipes" / "sd35_grpo_ocr.yaml"), overrides, SECTIONS)
    config = check_plugins(config, source, SECTIONS, check_files=False)
    algorithm = build_algorithm(config)
    copied, traced = (plan(config, algorithm, copied=c) for c in (True, False))
    assert copied.copied == 2 and traced.copied == 0  # one block of each run of 7 not traced
    assert vars(copied.memory) == vars(traced.memory)
    assert (copied.train_flops, copied.forward_flops_per_sample) == (
        traced.train_flops,
        traced.forward_flops_per_sample,
    )


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
