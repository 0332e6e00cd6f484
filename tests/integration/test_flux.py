"""The ``flux`` family on a tiny random FLUX.1 written to a temp dir in diffusers layout (the path a
user's FLUX.1 folder takes): faithful to ``FluxPipeline`` (distilled guidance, and true CFG for a
model without guidance embeddings), Flow-GRPO and DiffusionNFT iterations, the exported LoRA, and a
checkpoint of another family refused."""

from __future__ import annotations

import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    OTHER_ALGORITHMS,
    assert_exported_lora_matches,
    assert_refuses,
    family_config,
    train_one,
)

SIZE = 16  # pixels: the tiny VAE halves them to 8 x 8 latents, packed 2 x 2 -> 16 tokens
SEQUENCE_3 = {"runner": "ray", "parallel.trainer_ranks": 3, "parallel.sequence": 3}
"""One sequence group of 3 trainer ranks: the tiny models' 16-token images and 2 heads do not split."""
SEQUENCE_2 = {**SEQUENCE_3, "parallel.trainer_ranks": 2, "parallel.sequence": 2}


def pretend_sequence_ranks(module, n: int) -> None:
    """Leave on ``module`` the record of a split over ``n`` ranks that diffusers'
    ``enable_parallelism`` leaves (``_parallel_config``), without its hooks: what a family reads
    (:func:`diffrl.models.flux.sequence_ranks`) to pad its text or refuse its tokens, checked in
    one process (the forward itself stays whole)."""
    from types import SimpleNamespace

    cp = SimpleNamespace(ulysses_degree=n, ring_degree=1)
    module._parallel_config = SimpleNamespace(context_parallel_config=cp)


def write_tiny_flux(path, guidance_embeds: bool = True, pipeline: str = "FluxPipeline") -> None:
    """A random FLUX.1 with every part of the real one, sized for a CPU, saved by the pipeline
    (``pipeline``: FluxPipeline, or FluxKontextPipeline, whose parts are the same)."""
    import diffusers
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
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
    getattr(diffusers, pipeline)(
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
    family = {
        "model.family": "flux",
        "model.path": str(flux_dir),
        "model.options": "{max_sequence_length: 16}",  # embedded guidance: the default 3.5
        "sampling.guidance_scale": 1.0,  # no true CFG, as FluxPipeline's default
        "sampling.height": SIZE,
        "sampling.width": SIZE,
    }
    return family_config(tmp_path, family, **extra)


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


def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, flux_dir):
    """The exported LoRA, and ``--merge``: a whole ``FluxPipeline`` folder with the adapter fused."""
    from diffusers import FluxPipeline

    from diffrl.cli import main

    grpo = train_one(flux_config(tmp_path / "grpo", flux_dir))
    base = load_family(flux_config(tmp_path, flux_dir, **{"model.lora": "null"}))
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    ours = assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x)
    merged = tmp_path / "merged"
    assert main(["export", str(grpo.checkpoint), str(merged), "--merge"]) == 0
    transformer = FluxPipeline.from_pretrained(merged).transformer
    sigma, cond = torch.tensor([0.9, 0.4]), ours.encode_prompts(["a", "b"])
    with torch.no_grad():
        v_merged = base.velocity(x, sigma, cond, module=transformer)
        torch.testing.assert_close(v_merged, ours.velocity(x, sigma, cond), rtol=0, atol=1e-5)


@OTHER_ALGORITHMS
def test_other_algorithms_run_an_iteration(tmp_path, flux_dir, algorithm):
    train_one(flux_config(tmp_path, flux_dir, **algorithm))


def test_a_tiny_checkpoint_is_refused(tmp_path, flux_dir, tiny_checkpoint):
    assert_refuses(load_family(flux_config(tmp_path, flux_dir)), tiny_checkpoint)


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
    lora = family.trainable_parameters()
    assert lora and all(p.dtype == torch.float32 for p in lora)
    assert not any(p.requires_grad for n, p in family.transformer.named_parameters() if "lora_" not in n)
    del actor
    train_one(config)


def test_bad_folders_and_options_are_reported_together_before_loading(tmp_path, flux_dir):
    import json

    from diffrl.config import ConfigError

    other = tmp_path / "sd3"
    other.mkdir()
    (other / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusion3Pipeline"}))
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
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        flux_config(tmp_path, flux_dir, **SEQUENCE_3)
    msg = str(e.value)
    for what in (
        "image tokens (16)",
        "text tokens (model.options.max_sequence_length) (16)",
        "attention heads (2)",
    ):
        assert f"parallel.sequence=3: the flux model's {what} do not split over 3 ranks" in msg
    assert flux_config(tmp_path, flux_dir, **SEQUENCE_2).parallel.sequence == 2


def _assert_same(ours, theirs, where: str = "input") -> None:
    """``ours`` and ``theirs`` (a forward's arguments: tensors, lists, tuples, dicts, plain values)
    are the same, tensors to the bit and in the same dtype."""
    if isinstance(theirs, torch.Tensor):
        assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype, where
        assert ours.shape == theirs.shape and torch.equal(ours, theirs), where
    elif isinstance(theirs, list | tuple):
        assert type(ours) is type(theirs) and len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _assert_same(a, b, f"{where}[{i}]")
    elif isinstance(theirs, dict):
        assert ours.keys() == theirs.keys(), where
        for k in theirs:
            _assert_same(ours[k], theirs[k], f"{where}.{k}")
    else:
        assert ours == theirs, where


def assert_plan_runs(config) -> None:
    """``diffrl plan`` of ``config`` (the family's ``planned`` from the model folder's JSON files,
    one micro-batch's step on fake tensors) measures memory and FLOPs."""
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.plan.planner import plan
    from diffrl.train.actor import apply_lora

    result = plan(config, build_algorithm(config))
    assert result.memory.peak > 0 and result.memory.activations > 0 and result.train_flops > 0
    if config.model.lora is not None:  # the LoRA the actor trains (the family's own targets)
        family = load_family(config)
        apply_lora(family, config.model.lora)
        assert result.trainable == sum(p.numel() for p in family.trainable_parameters())


def assert_planned_is_the_familys(config, folder, sources=None, masks: tuple[str, ...] = ()) -> None:
    """What ``diffrl plan`` runs is the family's own model and forward: the transformer its
    ``planned`` builds on the meta device from ``folder`` has the loaded transformer's tensors
    (names, shapes, dtypes), and the planned forward, run on the loaded transformer, hands it
    exactly the inputs of the family's forward with real prompts' conditioning (with ``sources``
    for an editing family) zeroed (the ``masks`` set to ones: every token a prompt's, as the plan's
    full-length prompts), and gives the same velocity."""
    from pathlib import Path

    from diffrl.core.rollout import Conditioning

    family = load_family(config)
    planned = type(family).description.planned(config, Path(folder))

    def tensors(module):
        return {k: (tuple(v.shape), v.dtype) for k, v in module.state_dict().items()}

    assert tensors(planned.module) == tensors(family.transformer)
    encoded = family.encode_prompts(["a", "b"], sources).tensors
    cond = Conditioning(
        {k: torch.ones_like(v) if k in masks else torch.zeros_like(v) for k, v in encoded.items()}
    )
    x = torch.randn(2, *planned.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    calls = []
    hook = family.transformer.register_forward_pre_hook(
        lambda _, args, kwargs: calls.append((args, kwargs)), with_kwargs=True
    )
    try:
        with torch.no_grad():
            theirs = family.forward(family.transformer, x, sigma, cond)
            ours = planned.forward(family.transformer, x, sigma)
    finally:
        hook.remove()
    _assert_same(calls[1], calls[0])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_plan_runs_the_familys_own_transformer_and_forward(tmp_path, flux_dir):
    """``diffrl plan`` of the tiny FLUX.1 runs, and its planned forward is the family's: the
    distilled guidance (3.5) embedded, 16 T5 tokens, 16 image tokens."""
    config = flux_config(tmp_path, flux_dir)
    assert_plan_runs(config)
    assert_planned_is_the_familys(config, flux_dir)
