"""The ``flux`` family on a tiny random FLUX.1 written to a temp dir in diffusers layout (the path a
user's FLUX.1 folder takes): faithful to ``FluxPipeline`` (distilled guidance, and true CFG for a
model without guidance embeddings), Flow-GRPO and DiffusionNFT iterations, the exported LoRA, and a
checkpoint of another family refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from diffrl.train.actor import trainable_parameters
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    SEQUENCE_2,
    ExportedLoraCheck,
    Family,
    PlanCheck,
    assert_does_not_split,
    family_config,
    other_pipelines_folder,
    settings,
    tiny_folder,
    train_one,
)

SIZE = 16  # pixels: the tiny VAE halves them to 8 x 8 latents, packed 2 x 2 -> 16 tokens


def write_tiny_flux(
    path, guidance_embeds: bool = True, pipeline: str = "FluxPipeline", size: int = SIZE, **transformer
) -> None:
    """A random FLUX.1 with every part of the real one, sized for a CPU, saved by the pipeline
    (``pipeline``: FluxPipeline, or FluxKontextPipeline, whose parts are the same; ``transformer``:
    settings of the transformer's over the tiny ones; ``size``: the VAE's pixels)."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    torch.manual_seed(0)
    tok = tiny_parts.tokenizer()
    clip = CLIPTextModel(tiny_parts.clip_config(len(tok)))
    t5 = T5EncoderModel(tiny_parts.t5_config(len(tok), d_model=32))
    settings = {
        "patch_size": 1,
        "in_channels": 16,  # 4 latent channels x a 2 x 2 patch
        "num_layers": 1,
        "num_single_layers": 1,
        "attention_head_dim": 16,
        "num_attention_heads": 2,
        "joint_attention_dim": 32,
        "pooled_projection_dim": 32,
        "guidance_embeds": guidance_embeds,
        "axes_dims_rope": (4, 6, 6),
    }
    transformer = FluxTransformer2DModel(**{**settings, **transformer})
    vae = tiny_parts.autoencoder_kl(4, scaling_factor=0.3611, shift_factor=0.1159, size=size)
    scheduler = FlowMatchEulerDiscreteScheduler(  # FLUX.1-dev's scheduler config
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    getattr(diffusers, pipeline)(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok,
    ).save_pretrained(path)


flux_dir = tiny_folder("flux_dir", write_tiny_flux)


def flux_config(tmp_path, flux_dir, **extra):
    """Embedded guidance (the default 3.5), no true CFG (guidance 1, as FluxPipeline's default)."""
    return family_config(
        tmp_path, settings("flux", flux_dir, "{max_sequence_length: 16}", 1.0, SIZE), **extra
    )


class TestFamilyChecks(ExportedLoraCheck, PlanCheck):
    """The shared checks on the tiny FLUX.1: the exported LoRA, and ``--merge``'s whole
    ``FluxPipeline`` folder with the adapter fused; the planned forward with the distilled guidance
    (3.5) embedded, 16 T5 tokens, 16 image tokens."""

    case = Family(flux_config, "flux_dir", latent=(4, 8, 8), merge="FluxPipeline")


def _pipeline_latents(family, prompts, noise, steps, **kw):
    from diffrl.models.flux import pack, unpack

    packed = family.pipeline()(
        prompt=prompts,
        latents=pack(noise.clone()),
        num_inference_steps=steps,
        height=SIZE,
        width=SIZE,
        max_sequence_length=16,
        output_type="latent",
        **kw,
    ).images
    return unpack(packed, *noise.shape[-2:])


@pytest.mark.parametrize(
    "guidance_embeds, true_cfg",
    [(True, 1.0), (True, 2.0), (False, 3.5)],
    ids=["distilled", "distilled_and_true_cfg", "true_cfg"],
)
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, flux_dir, guidance_embeds, true_cfg):
    """Same noise, prompts, steps, size and guidance: diffrl's ODE sampler over the family's sigmas
    (resolution-shifted like the pipeline's) gives ``FluxPipeline``'s latents to 1e-5 (float32,
    CPU). A distilled transformer embeds ``model.options.guidance`` (the pipeline's guidance_scale,
    3.5); ``sampling.guidance_scale`` is true CFG with the negative prompt (its true_cfg_scale)."""
    folder = flux_dir
    if not guidance_embeds:
        folder = tmp_path / "flux_cfg"
        write_tiny_flux(folder, guidance_embeds=False)
    family = load_family(flux_config(tmp_path, folder, **{"model.lora": "null"}))
    prompts = ['the word "cat"', 'the number "42"']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    assert noise.shape == (2, 4, 8, 8)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    negative = family.negative(" ", true_cfg)

    def sample():  # with the family's current options (its embedded guidance)
        neg = None if negative is None else negative.repeat(2)
        return sample_ode(family, noise, family.encode_prompts(prompts), sigmas, true_cfg, neg)

    ours = sample()
    cfg = {"true_cfg_scale": true_cfg, "negative_prompt": " "} if true_cfg > 1 else {}
    theirs = _pipeline_latents(family, prompts, noise, 4, guidance_scale=3.5, **cfg)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    # the schedule is shifted by image size (mu from 16 tokens), unlike SD3's static shift
    assert not torch.allclose(sigmas, family.sigmas(4, 3.0, SIZE, SIZE))
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1
    if guidance_embeds:  # the embedded guidance is an input of every forward (training's too)
        family.options.guidance = 1.0
        assert (sample() - ours).abs().max() > 1e-2


def test_bf16_forward_with_float32_lora_and_gradient_checkpointing(tmp_path, flux_dir):
    """The memory options of the GPU recipes: a bfloat16 transformer, text encoders and VAE, with
    the LoRA weights (what the optimizer updates) in float32, gradient checkpointing, and the
    log-prob math in float32: the replay still equals the rollout exactly."""
    from diffrl.train.actor import Actor

    config = flux_config(
        tmp_path,
        flux_dir,
        **{
            "model.dtype": "bfloat16",
            "model.options": "{max_sequence_length: 16, gradient_checkpointing: true, text_encoder_dtype: bfloat16}",
        },
    )
    family = load_family(config)
    assert family.transformer.dtype == torch.bfloat16 and family.text_encoder_2.dtype == torch.bfloat16
    assert family.transformer.is_gradient_checkpointing
    actor = Actor(family, config)
    lora = trainable_parameters(family)
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert not any(p.requires_grad for n, p in family.transformer.named_parameters() if "lora_" not in n)
    del actor
    train_one(config)


def test_bad_folders_and_options_are_reported_together_before_loading(tmp_path, flux_dir):
    from diffrl.config import ConfigError

    other = other_pipelines_folder(tmp_path / "sd3", "StableDiffusion3Pipeline")
    bad = "{max_sequence_length: 1024, text_encoder_dtype: float8}"
    with pytest.raises(ConfigError) as e:
        flux_config(tmp_path, other, **{"model.options": bad})
    for problem in ("holds a StableDiffusion3Pipeline", "FluxPipeline's limit", "'float8' is not one of"):
        assert problem in str(e.value)
    with pytest.raises(ConfigError, match="no built-in weights"):
        flux_config(tmp_path, "random")


def test_sequence_parallel_lengths_that_do_not_split_are_config_errors(tmp_path, flux_dir):
    """``parallel.sequence: 3``: 16 image tokens, 16 T5 tokens (``max_sequence_length``) and 2
    heads; none splits over 3 ranks (diffusers would assert mid-forward); over 2 all do."""
    lengths = (
        "image tokens (16)",
        "text tokens (model.options.max_sequence_length) (16)",
        "attention heads (2)",
    )
    assert_does_not_split(partial(flux_config, tmp_path, flux_dir), "flux", *lengths)
    assert flux_config(tmp_path, flux_dir, **SEQUENCE_2).parallel.sequence == 2
