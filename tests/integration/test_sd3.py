"""The ``sd3`` family on a tiny random SD3 written to a temp dir in diffusers layout (the path a
user's SD3/SD3.5 folder takes): faithful to ``StableDiffusion3Pipeline``, Flow-GRPO and DiffusionNFT
iterations, and a checkpoint of another family refused."""

from __future__ import annotations

import torch

from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    ExportedLoraCheck,
    Family,
    family_config,
    pipeline_latents,
    settings,
    tiny_folder,
)

SIZE = 16  # pixels: the tiny VAE halves them, patch 2 -> 4 x 4 tokens


def write_tiny_sd3(path, size: int = SIZE, **transformer) -> None:
    """A random SD3 with every part of the real one, sized for a CPU, saved by the pipeline
    (``transformer``: settings of the transformer's over the tiny ones; ``size``: the VAE's pixels)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection, T5EncoderModel

    torch.manual_seed(0)
    tok = tiny_parts.tokenizer()
    settings = {
        "sample_size": 8,
        "patch_size": 2,
        "in_channels": 16,
        "out_channels": 16,
        "num_layers": 2,
        "attention_head_dim": 8,
        "num_attention_heads": 2,
        "joint_attention_dim": 64,
        "caption_projection_dim": 16,
        "pooled_projection_dim": 64,
        "pos_embed_max_size": 16,
    }
    transformer = SD3Transformer2DModel(**{**settings, **transformer})
    StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),
        vae=tiny_parts.autoencoder_kl(16, scaling_factor=1.5305, shift_factor=0.0609, size=size),
        text_encoder=CLIPTextModelWithProjection(tiny_parts.clip_config(len(tok))),
        tokenizer=tok,
        text_encoder_2=CLIPTextModelWithProjection(tiny_parts.clip_config(len(tok))),
        tokenizer_2=tok,
        text_encoder_3=T5EncoderModel(tiny_parts.t5_config(len(tok), d_model=64)),
        tokenizer_3=tok,
    ).save_pretrained(path)


sd3_dir = tiny_folder("sd3_dir", write_tiny_sd3)


def sd3_config(tmp_path, sd3_dir, **extra):
    return family_config(tmp_path, settings("sd3", sd3_dir, "{max_sequence_length: 16}", 4.5, SIZE), **extra)


class TestFamilyChecks(ExportedLoraCheck):
    """The shared checks on the tiny SD3."""

    case = Family(sd3_config, "sd3_dir", latent=(16, 8, 8))


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
    call = dict(prompt=prompts, negative_prompt="", guidance_scale=4.5)
    theirs = pipeline_latents(pipe, noise.clone(), 4, SIZE, **call).images
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1
