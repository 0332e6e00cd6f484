"""The ``sd3`` family on a tiny random SD3 written to a temp dir in diffusers layout (the path a
user's SD3/SD3.5 folder takes): faithful to ``StableDiffusion3Pipeline``, Flow-GRPO and DiffusionNFT
iterations, and a checkpoint of another family refused."""

from __future__ import annotations

import pytest
import torch

from diffrl.config import load_config
from diffrl.models.base import FamilyMismatchError
from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from diffrl.train.loop import train
from tests.conftest import ROOT
from tests.integration import tiny_parts

SIZE = 16  # pixels: the tiny VAE halves them, patch 2 -> 4 x 4 tokens


def write_tiny_sd3(path) -> None:
    """A random SD3 with every part of the real one, sized for a CPU, saved by the pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    torch.manual_seed(0)
    tok = tiny_parts.tokenizer()
    transformer = SD3Transformer2DModel(
        sample_size=8,
        patch_size=2,
        in_channels=16,
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=64,
        caption_projection_dim=16,
        pooled_projection_dim=64,
        pos_embed_max_size=16,
    )
    StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_parts.autoencoder_kl(16, scaling_factor=1.5305, shift_factor=0.0609, size=SIZE),
        text_encoder=CLIPTextModelWithProjection(tiny_parts.clip_config(len(tok))),
        tokenizer=tok,
        text_encoder_2=CLIPTextModelWithProjection(tiny_parts.clip_config(len(tok))),
        tokenizer_2=tok,
        text_encoder_3=T5EncoderModel(tiny_parts.t5_config(len(tok), d_model=64)),
        tokenizer_3=tok,
    ).save_pretrained(path)


@pytest.fixture(scope="module")
def sd3_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_sd3")
    write_tiny_sd3(path)
    return path


def sd3_config(tmp_path, sd3_dir, **extra):
    overrides = {
        "run.output_dir": str(tmp_path / "run"),
        "model.family": "sd3",
        "model.path": str(sd3_dir),
        "model.options": "{max_sequence_length: 16}",
        "model.lora": "{rank: 4}",
        "algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 3]}}",
        "sampling.num_steps": 3,
        "sampling.guidance_scale": 4.5,
        "sampling.height": SIZE,
        "sampling.width": SIZE,
        "rollout.batch_size": 2,
        "rollout.n_samples_per_prompt": 2,
        "rollout.micro_group_size": 2,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "train.iterations": 1,
        "rewards": "[{name: tests.integration.test_flow_grpo:brightness}]",
        "eval.enabled": "false",
        **extra,
    }
    return load_config(
        str(ROOT / "recipes" / "tiny_grpo_ocr.yaml"), [f"{k}={v}" for k, v in overrides.items()]
    )


def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, sd3_dir):
    """Same noise, prompts, steps, size and CFG (negative prompt ""): diffrl's ODE sampler and
    ``StableDiffusion3Pipeline`` give the same latents to 1e-5 (float32, CPU)."""
    cfg = sd3_config(
        tmp_path, sd3_dir, **{"model.lora": "null", "model.options": "{max_sequence_length: 256}"}
    )
    family = load_family(cfg)
    prompts = ['the word "cat"', 'the number "42"']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    cond = family.encode_prompts(prompts)
    negative = family.encode_prompts([""]).repeat(2)
    ours = sample_ode(family, noise, cond, family.sigmas(4, None, SIZE, SIZE), 4.5, negative)
    pipe = family.pipeline()
    theirs = pipe(
        prompt=prompts,
        negative_prompt="",
        latents=noise.clone(),
        num_inference_steps=4,
        guidance_scale=4.5,
        height=SIZE,
        width=SIZE,
        output_type="latent",
    ).images
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1


def test_flow_grpo_iteration_replays_exactly_and_nft_iteration_runs(tmp_path, sd3_dir):
    grpo = train(sd3_config(tmp_path / "grpo", sd3_dir))
    m = grpo.history[0]
    assert m["train/log_prob_mean_abs_diff"] == 0.0 and m["train/grad_norm"] > 0
    _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, sd3_dir, grpo.checkpoint)
    nft = sd3_config(
        tmp_path / "nft", sd3_dir, **{"algorithm.name": "diffusion_nft", "algorithm.params": "{}"}
    )
    m = train(nft).history[0]
    assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0


@pytest.mark.parametrize(
    "algorithm, extra",
    [
        ("awm", {}),
        ("sft", {"data.dataset": "synthetic_text", "data.dataset_size": 8, "rewards": "[]"}),
    ],
)
def test_awm_and_sft_iterations_run(tmp_path, sd3_dir, algorithm, extra):
    """AWM (online, forward process) and SFT (offline images through the family's VAE)."""
    config = sd3_config(tmp_path, sd3_dir, **{"algorithm.name": algorithm, "algorithm.params": "{}", **extra})
    m = train(config).history[0]
    assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0


def test_a_tiny_checkpoint_is_refused_by_the_sd3_family(tmp_path, sd3_dir, tiny_checkpoint):
    from diffrl.train.checkpoint import load_weights_into

    family = load_family(sd3_config(tmp_path, sd3_dir))
    with pytest.raises(FamilyMismatchError, match="tiny"):
        load_weights_into(family, tiny_checkpoint)


def _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, sd3_dir, checkpoint):
    """``diffrl export`` writes the LoRA as diffusers reads it: ``load_lora_weights`` on the base
    pipeline gives the velocity of diffrl's policy with that LoRA (to 1e-5)."""
    from safetensors.torch import load_file, save_file

    from diffrl.cli import _load_for_inference, _resolve_target, main

    # make the adapter matter: one small GRPO step barely moves B away from its zero init
    weights = load_file(str(checkpoint / "trainable.safetensors"))
    gen = torch.Generator().manual_seed(1)
    weights = {
        k: torch.randn(v.shape, generator=gen) * 0.1 if "lora_B" in k else v for k, v in weights.items()
    }
    save_file(weights, str(checkpoint / "trainable.safetensors"))
    out = tmp_path / "lora"
    assert main(["export", str(checkpoint), str(out)]) == 0
    config, ckpt = _resolve_target(str(checkpoint), [])
    ours = _load_for_inference(config, ckpt)
    base = load_family(sd3_config(tmp_path, sd3_dir, **{"model.lora": "null"}))
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    cond = ours.encode_prompts(["a", "b"])
    with torch.no_grad():
        v_plain = base.velocity(x, sigma, cond)
        pipe = base.pipeline()
        pipe.load_lora_weights(str(out))  # into base.transformer, as a user would
        v_diffusers = base.forward(pipe.transformer, x, sigma, cond).float()
        v_ours = ours.velocity(x, sigma, cond)
    torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=1e-5)
    assert (v_plain - v_ours).abs().max() > 1e-3  # the adapter changes the velocity: it was applied
