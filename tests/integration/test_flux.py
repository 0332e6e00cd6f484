"""The ``flux`` family on a tiny random FLUX.1 written to a temp dir in diffusers layout (the path a
user's FLUX.1 folder takes): faithful to ``FluxPipeline`` (distilled guidance, and true CFG for a
model without guidance embeddings), Flow-GRPO and DiffusionNFT iterations, the exported LoRA, and a
checkpoint of another family refused."""

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

SIZE = 16  # pixels: the tiny VAE halves them to 8 x 8 latents, packed 2 x 2 -> 16 tokens


def write_tiny_flux(path, guidance_embeds: bool = True) -> None:
    """A random FLUX.1 with every part of the real one, sized for a CPU, saved by the pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    torch.manual_seed(0)
    tok = tiny_parts.tokenizer()
    clip = CLIPTextModel(tiny_parts.clip_config(len(tok)))
    t5 = T5EncoderModel(tiny_parts.t5_config(len(tok), d_model=32))
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 latent channels x a 2 x 2 patch
        num_layers=1,
        num_single_layers=1,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=32,
        pooled_projection_dim=32,
        guidance_embeds=guidance_embeds,
        axes_dims_rope=(4, 6, 6),
    )
    vae = tiny_parts.autoencoder_kl(4, scaling_factor=0.3611, shift_factor=0.1159, size=SIZE)
    scheduler = FlowMatchEulerDiscreteScheduler(  # FLUX.1-dev's scheduler config
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    FluxPipeline(
        transformer=transformer,
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=tok,
        text_encoder_2=t5,
        tokenizer_2=tok,
    ).save_pretrained(path)


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_flux")
    write_tiny_flux(path)
    return path


def flux_config(tmp_path, flux_dir, **extra):
    overrides = {
        "run.output_dir": str(tmp_path / "run"),
        "model.family": "flux",
        "model.path": str(flux_dir),
        "model.options": "{max_sequence_length: 16}",
        "model.lora": "{rank: 4}",
        "algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 3]}}",
        "sampling.num_steps": 3,
        "sampling.guidance_scale": 3.5,
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


@pytest.mark.parametrize("guidance_embeds", [True, False], ids=["distilled", "true_cfg"])
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, flux_dir, guidance_embeds):
    """Same noise, prompts, steps, size and guidance: diffrl's ODE sampler over the family's sigmas
    (resolution-shifted like the pipeline's) gives ``FluxPipeline``'s latents to 1e-5 (float32,
    CPU). Distilled guidance is one forward per step with the scale embedded; a model without
    guidance embeddings takes the scale as true CFG with the negative prompt."""
    folder = flux_dir
    if not guidance_embeds:
        folder = tmp_path / "flux_cfg"
        write_tiny_flux(folder, guidance_embeds=False)
    family = load_family(flux_config(tmp_path, folder, **{"model.lora": "null"}))
    prompts = ['the word "cat"', 'the number "42"']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    assert noise.shape == (2, 4, 8, 8)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    negative = family.negative(" ", 3.5)
    assert (negative is None) == guidance_embeds
    ours = sample_ode(
        family,
        noise,
        family.encode_prompts(prompts),
        sigmas,
        3.5,
        None if negative is None else negative.repeat(2),
    )
    if guidance_embeds:
        theirs = _pipeline_latents(family, prompts, noise, 4, guidance_scale=3.5)
    else:
        theirs = _pipeline_latents(family, prompts, noise, 4, true_cfg_scale=3.5, negative_prompt=" ")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    # the schedule is shifted by image size (mu from 16 tokens), unlike SD3's static shift
    assert not torch.allclose(sigmas, family.sigmas(4, 3.0, SIZE, SIZE))
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1


def test_flow_grpo_iteration_replays_exactly_and_nft_iteration_runs(tmp_path, flux_dir):
    grpo = train(flux_config(tmp_path / "grpo", flux_dir))
    m = grpo.history[0]
    assert m["train/log_prob_mean_abs_diff"] == 0.0 and m["train/grad_norm"] > 0
    _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, flux_dir, grpo.checkpoint)
    nft = flux_config(
        tmp_path / "nft", flux_dir, **{"algorithm.name": "diffusion_nft", "algorithm.params": "{}"}
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
def test_awm_and_sft_iterations_run(tmp_path, flux_dir, algorithm, extra):
    """AWM (online, forward process) and SFT (offline images through the family's VAE)."""
    config = flux_config(
        tmp_path, flux_dir, **{"algorithm.name": algorithm, "algorithm.params": "{}", **extra}
    )
    m = train(config).history[0]
    assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0


def test_a_tiny_checkpoint_is_refused_by_the_flux_family(tmp_path, flux_dir, tiny_checkpoint):
    from diffrl.train.checkpoint import load_weights_into

    family = load_family(flux_config(tmp_path, flux_dir))
    with pytest.raises(FamilyMismatchError, match="tiny"):
        load_weights_into(family, tiny_checkpoint)


def _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, flux_dir, checkpoint):
    """``diffrl export`` writes the LoRA as diffusers reads it: ``load_lora_weights`` on the base
    ``FluxPipeline`` gives the velocity of diffrl's policy with that LoRA (to 1e-5)."""
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
    base = load_family(flux_config(tmp_path, flux_dir, **{"model.lora": "null"}))
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    cond = ours.encode_prompts(["a", "b"])
    with torch.no_grad():
        v_plain = base.velocity(x, sigma, cond, 3.5)
        pipe = base.pipeline()
        pipe.load_lora_weights(str(out))  # into base.transformer, as a user would
        v_diffusers = base.velocity(x, sigma, cond, 3.5, module=pipe.transformer)
        v_ours = ours.velocity(x, sigma, cond, 3.5)
    torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=1e-5)
    assert (v_plain - v_ours).abs().max() > 1e-3  # the adapter changes the velocity: it was applied
    # --merge writes a whole FluxPipeline folder with the adapter fused into the transformer
    merged = tmp_path / "merged"
    assert main(["export", str(checkpoint), str(merged), "--merge"]) == 0
    from diffusers import FluxPipeline

    pipe = FluxPipeline.from_pretrained(merged)
    with torch.no_grad():
        v_merged = base.velocity(x, sigma, cond, 3.5, module=pipe.transformer)
    torch.testing.assert_close(v_merged, v_ours, rtol=0, atol=1e-5)
