"""The ``flux2`` family on tiny random FLUX.2 [dev] and [klein] folders written to a temp dir by the
pipelines' own ``save_pretrained`` (the path a user's FLUX.2 folder takes): faithful to
``Flux2Pipeline`` (distilled guidance) and ``Flux2KleinPipeline`` (true CFG, and a step-distilled
one without), the VAE's encode and decode as the pipelines', Flow-GRPO, DiffusionNFT, AWM and SFT
iterations, the exported LoRA, a checkpoint of another family refused and bad folders and options
reported before loading."""

from __future__ import annotations

import importlib.util
import inspect
import json
import shutil
from functools import partial

import pytest
import torch

from diffrl.models import flux2
from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration.family_checks import (
    SEQUENCE_2,
    Family,
    PlanCheck,
    assert_does_not_split,
    assert_exported_lora_matches,
    assert_merged_matches,
    assert_planned_is_the_familys,
    family_config,
    other_pipelines_folder,
    settings,
    tiny_folder,
    train_one,
)
from tests.integration.tiny_parts import byte_tokenizer

SIZE = 16  # pixels: the tiny VAE halves them to 8 x 8, patchified 2 x 2 -> 4 x 4 = 16 tokens
LAYERS = [1, 2, 3]  # text_encoder_out_layers of the 3-layer tiny text encoders
TEXT_TOKENS = {"dev": 256, "klein": 96}  # byte-level: [dev]'s template takes ~180 of them, [klein]'s ~40

# FLUX.2's scheduler_config.json: the shift from compute_empirical_mu, exponential time shift
SCHEDULER = dict(shift=3.0, use_dynamic_shifting=True, time_shift_type="exponential")

# Mistral Small 3's chat template, cut to the turns the pipeline sends (system + user, text only)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{%- if message['content'] is string %}{%- set text = message['content'] %}"
    "{%- else %}{%- set text = message['content'] | selectattr('type', 'equalto', 'text') "
    "| map(attribute='text') | join('') %}{%- endif %}"
    "{%- if message['role'] == 'system' %}{{- '[SYSTEM_PROMPT]' + text + '[/SYSTEM_PROMPT]' }}"
    "{%- elif message['role'] == 'user' %}{{- '[INST]' + text + '[/INST]' }}"
    "{%- else %}{{- text + eos_token }}{%- endif %}"
    "{%- endfor %}"
)
# Qwen3's chat template, cut to the user turn and the generation prompt with its empty think block
QWEN3_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def tiny_vae():
    """A 2-level ``AutoencoderKLFlux2`` (halves the side, 4 latent channels) whose ``bn`` holds
    running statistics away from (0, 1), so the normalisation is exercised."""
    from diffusers import AutoencoderKLFlux2

    vae = AutoencoderKLFlux2(
        down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2,
        block_out_channels=(16, 32),
        layers_per_block=1,
        latent_channels=4,
        norm_num_groups=8,
        sample_size=SIZE,
    )
    with torch.no_grad():
        vae.bn.running_mean.copy_(torch.randn(16) * 0.5)
        vae.bn.running_var.copy_(torch.rand(16) + 0.5)
    return vae


def tiny_transformer(guidance_embeds: bool):
    from diffusers import Flux2Transformer2DModel

    return Flux2Transformer2DModel(
        patch_size=1,
        in_channels=16,  # 4 latent channels x a 2 x 2 patch
        num_layers=1,
        num_single_layers=2,
        attention_head_dim=16,
        num_attention_heads=2,
        joint_attention_dim=48,  # 3 stacked layers x 16 text features
        timestep_guidance_channels=32,
        axes_dims_rope=(4, 4, 4, 4),
        guidance_embeds=guidance_embeds,
    )


def write_tiny_flux2(path, variant: str, is_distilled: bool = False) -> None:
    """A random FLUX.2 [dev] (``variant="dev"``) or [klein] with every part of the real one, sized
    for a CPU, saved by its pipeline. [dev]'s tokenizer is a plain tokenizer with Mistral's chat
    template: FLUX.2-dev's PixtralProcessor needs torchvision, and for text it runs the same
    template through the same tokenizer."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline, Flux2Pipeline
    from transformers import Mistral3Config, Mistral3ForConditionalGeneration, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    text = dict(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=512,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(**SCHEDULER)
    if variant == "dev":
        specials = [
            "<pad>",
            "<s>",
            "</s>",
            "[INST]",
            "[/INST]",
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[IMG]",
        ]
        tok = byte_tokenizer(
            specials,
            template=MISTRAL_TEMPLATE,
            bos_token="<s>",
            eos_token="</s>",
            pad_token="<pad>",
            unk_token=None,
        )
        vision = dict(
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            head_dim=8,
            patch_size=4,
            image_size=16,
        )
        encoder = Mistral3ForConditionalGeneration(
            Mistral3Config(
                text_config=dict(
                    model_type="mistral",
                    vocab_size=len(tok),
                    pad_token_id=0,
                    bos_token_id=1,
                    eos_token_id=2,
                    **text,
                ),
                vision_config=dict(model_type="pixtral", **vision),
                image_token_index=specials.index("[IMG]"),
            )
        )
        pipeline, own = Flux2Pipeline, {}
    else:
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
        tok = byte_tokenizer(
            specials, template=QWEN3_TEMPLATE, pad_token="<|endoftext|>", eos_token="<|im_end|>"
        )
        encoder = Qwen3ForCausalLM(
            Qwen3Config(vocab_size=len(tok), pad_token_id=0, eos_token_id=2, bos_token_id=None, **text)
        )
        pipeline, own = Flux2KleinPipeline, {"is_distilled": is_distilled}
    pipeline(
        scheduler=scheduler,
        vae=tiny_vae(),
        text_encoder=encoder,
        tokenizer=tok,
        transformer=tiny_transformer(guidance_embeds=variant == "dev"),  # [klein] embeds none
        **own,
    ).save_pretrained(path)


dev_dir = tiny_folder("dev_dir", write_tiny_flux2, "dev")
klein_dir = tiny_folder("klein_dir", write_tiny_flux2, "klein")


def distilled_copy(klein_dir, tmp_path):
    """The tiny [klein] with ``is_distilled: true`` in its ``model_index.json`` (what the step-distilled
    FLUX.2-klein-4B ships)."""
    folder = tmp_path / "klein_distilled"
    shutil.copytree(klein_dir, folder)
    index = folder / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "is_distilled": True}))
    return folder


def flux2_config(tmp_path, folder, variant: str, guidance: float = 1.0, **extra):
    """[dev]: embedded guidance, the default 4.0."""
    options = f"{{max_sequence_length: {TEXT_TOKENS[variant]}, text_encoder_out_layers: {LAYERS}}}"
    return family_config(tmp_path, settings("flux2", folder, options, guidance, SIZE), **extra)


def klein_cfg_config(tmp_path, folder, **extra):
    """The tiny [klein] base with CFG (the recipe's)."""
    return flux2_config(tmp_path, folder, "klein", 4.0, **extra)


class TestFamilyChecks(PlanCheck):
    """The shared checks on the tiny [klein] base with CFG (the recipe's); [dev]'s planned forward
    and the exported LoRAs of both: below."""

    case = Family(klein_cfg_config, "klein_dir")


def test_the_pipelines_defaults_are_the_familys():
    """The constants diffrl keeps are still the pipelines' (``__call__`` defaults)."""
    dev = inspect.signature(flux2.Flux2Pipeline.__call__).parameters
    klein = inspect.signature(flux2.Flux2KleinPipeline.__call__).parameters
    assert dev["text_encoder_out_layers"].default == flux2.DEV.text_layers
    assert klein["text_encoder_out_layers"].default == flux2.KLEIN.text_layers
    assert dev["guidance_scale"].default == flux2.Flux2Description.Options.guidance
    assert dev["max_sequence_length"].default == flux2.Flux2Description.Options.max_sequence_length
    assert klein["max_sequence_length"].default == flux2.Flux2Description.Options.max_sequence_length


@pytest.mark.parametrize(
    "variant, guidance",
    [("dev", 1.0), ("klein", 4.0), ("klein_distilled", 1.0)],
    ids=["dev_distilled_guidance", "klein_true_cfg", "klein_distilled_no_cfg"],
)
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, dev_dir, klein_dir, variant, guidance):
    """Same noise (the pipeline's ``latents``: diffrl's per-sample latent is its patchified shape),
    prompts, steps, size and guidance: diffrl's ODE sampler over the family's sigmas gives the
    pipeline's latents to 1e-5 (float32, CPU). [dev] embeds ``model.options.guidance`` (4.0, the
    pipeline's ``guidance_scale``); [klein] runs true CFG with the negative prompt "" at 4.0; the
    step-distilled [klein] is called with the pipeline's default ``guidance_scale`` 4.0, which it
    ignores, as diffrl samples without CFG. The VAE decode of diffrl's latents equals the
    pipeline's images."""
    folder = {"dev": dev_dir, "klein": klein_dir}.get(variant) or distilled_copy(klein_dir, tmp_path)
    kind = variant.split("_")[0]
    family = load_family(flux2_config(tmp_path, folder, kind, guidance, **{"model.lora": "null"}))
    pipe = family.pipeline()
    assert family.variant is (flux2.DEV if kind == "dev" else flux2.KLEIN)
    assert family.is_distilled == (variant == "klein_distilled") == pipe.config.get("is_distilled", False)
    prompts = ['the word "cat"', 'a sign that reads "42" on a wall']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    assert noise.shape == (2, 16, 4, 4)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    cond = family.encode_prompts(prompts)  # cached one by one: prompts encoded apart stack
    negative = family.negative("", guidance, cond)
    assert (negative is None) == (guidance == 1.0)
    ours = sample_ode(family, noise, cond, sigmas, guidance, negative)

    def run(output_type):
        return pipe(
            prompt=prompts,
            latents=noise,
            num_inference_steps=4,
            height=SIZE,
            width=SIZE,
            guidance_scale=4.0,  # [dev]: embedded; [klein]: CFG; distilled [klein]: ignored
            max_sequence_length=TEXT_TOKENS[kind],
            text_encoder_out_layers=tuple(LAYERS),
            output_type=output_type,
        ).images

    theirs = run("latent")
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    # [dev] returns the packed, normalised latent (B, h * w, 4C); [klein] the VAE's z (B, C, H/8, W/8)
    mine = ours if kind == "dev" else family.vae_latents(ours)
    theirs = theirs.transpose(1, 2).reshape(ours.shape) if kind == "dev" else theirs
    print(
        f"{variant}: max abs diff {(mine - theirs).abs().max().item():.2e} of max {theirs.abs().max().item():.2f}"
    )
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1
    torch.testing.assert_close(images, run("pt"), rtol=0, atol=1e-5)
    if kind == "dev":  # the embedded guidance is an input of every forward (training's too)
        with pytest.raises(ValueError, match="no classifier-free guidance"):  # the config check refuses it
            family.negative("", 4.0)
        family.options.guidance = 1.0
        assert (sample_ode(family, noise, cond, sigmas) - ours).abs().max() > 1e-2
    if variant == "klein":  # and the CFG changes the result
        assert (sample_ode(family, noise, cond, sigmas) - ours).abs().max() > 1e-2


def test_encode_images_is_the_pipelines_vae_encode(tmp_path, klein_dir):
    """SFT's clean latents: ``Flux2Pipeline._encode_vae_image`` (the VAE's mode, patchified and
    ``bn``-normalised) of the same images in [-1, 1]; decode inverts the normalisation."""
    family = load_family(flux2_config(tmp_path, klein_dir, "klein", **{"model.lora": "null"}))
    images = torch.rand(2, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    ours = family.encode_images(images)
    assert ours.shape == (2, 16, 4, 4)
    with torch.no_grad():
        theirs = family.pipeline()._encode_vae_image(images * 2 - 1, generator=None)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    mean, std = family._bn_stats(ours)
    assert (mean.abs().max() > 0.1) and ((std - 1).abs().max() > 0.1)  # the bn is not the identity
    with torch.no_grad():
        z = family.vae.encode(images * 2 - 1).latent_dist.mode()
    torch.testing.assert_close(family.vae_latents(ours), z, rtol=0, atol=1e-5)


@pytest.mark.parametrize("variant, guidance", [("dev", 1.0), ("klein", 4.0)], ids=["dev", "klein_cfg"])
def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(
    tmp_path, dev_dir, klein_dir, variant, guidance
):
    """The replayed log-prob equals the rollout's; the exported LoRA (double- and single-stream
    targets) read by the pipeline's ``load_lora_weights`` gives diffrl's velocity (with CFG for
    [klein])."""
    folder = dev_dir if variant == "dev" else klein_dir
    grpo = train_one(flux2_config(tmp_path / "grpo", folder, variant, guidance))
    base = load_family(flux2_config(tmp_path, folder, variant, guidance, **{"model.lora": "null"}))
    x = torch.randn(2, 16, 4, 4, generator=torch.Generator().manual_seed(0))
    ours = assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x, guidance)
    lora = {n.rsplit(".lora_", 1)[0] for n, _ in ours.transformer.named_parameters() if "lora_" in n}
    assert (
        "single_transformer_blocks.1.attn.to_out" in lora and "transformer_blocks.0.attn.add_q_proj" in lora
    )
    assert "single_transformer_blocks.0.attn.to_qkv_mlp_proj" in lora
    if variant == "klein":  # --merge: a whole Flux2KleinPipeline folder with the adapter fused
        pipe = assert_merged_matches(tmp_path, grpo.checkpoint, base, ours, x, "Flux2KleinPipeline")
        assert pipe.config.is_distilled is False


def test_bad_folders_and_options_are_reported_together_before_loading(tmp_path, dev_dir, klein_dir):
    from diffrl.config import ConfigError

    other = other_pipelines_folder(tmp_path / "flux1", "FluxPipeline")
    with pytest.raises(ConfigError, match="holds a FluxPipeline"):
        flux2_config(tmp_path, other, "dev")
    with pytest.raises(ConfigError, match="no built-in weights"):
        flux2_config(tmp_path, "random", "dev")
    # [dev]: no CFG, a size the VAE x patches does not divide, text layers the encoder lacks
    with pytest.raises(ConfigError) as e:
        flux2_config(
            tmp_path,
            dev_dir,
            "dev",
            4.0,
            **{"sampling.height": 18, "model.options": "{text_encoder_out_layers: [1, 2, 7]}"},
        )
    for problem in ("has no classifier-free guidance", "multiples of 4", "[7] are out of range"):
        assert problem in str(e.value)
    with pytest.raises(ConfigError, match=r"the FLUX.2 \[dev\] default is \[10, 20, 30\]"):
        flux2_config(tmp_path, dev_dir, "dev", **{"model.options": "{}"})  # the 40-layer default
    with pytest.raises(ConfigError, match="joint_attention_dim is 48; give 3 layer indices"):
        flux2_config(tmp_path, dev_dir, "dev", **{"model.options": "{text_encoder_out_layers: [1, 2]}"})
    # [klein]: no embedded guidance; a step-distilled one takes no CFG
    bad = f"{{guidance: 3.5, text_encoder_out_layers: {LAYERS}}}"
    with pytest.raises(ConfigError, match="embeds no guidance"):
        flux2_config(tmp_path, klein_dir, "klein", **{"model.options": bad})
    with pytest.raises(ConfigError, match="is step-distilled"):
        flux2_config(tmp_path, distilled_copy(klein_dir, tmp_path), "klein", 4.0)
    # the Pixtral processor of a real FLUX.2-dev folder needs torchvision
    pixtral = tmp_path / "pixtral"
    shutil.copytree(dev_dir, pixtral)
    index = pixtral / "model_index.json"
    meta = json.loads(index.read_text())
    index.write_text(json.dumps({**meta, "tokenizer": ["transformers", "PixtralProcessor"]}))
    problems = flux2.Flux2Description.folder_problems(pixtral)
    if importlib.util.find_spec("torchvision") is not None:
        assert problems == []
    else:
        assert problems and "pip install torchvision" in problems[0]


def test_sequence_parallel_lengths_that_do_not_split_are_config_errors(tmp_path, dev_dir):
    """``parallel.sequence: 3``: 16 image tokens, [dev]'s 256 text tokens
    (``max_sequence_length``) and 2 heads; none splits over 3 ranks; over 2 all do."""
    lengths = (
        "image tokens (16)",
        "text tokens (model.options.max_sequence_length) (256)",
        "attention heads (2)",
    )
    assert_does_not_split(partial(flux2_config, tmp_path, dev_dir, "dev"), "flux2", *lengths)
    assert flux2_config(tmp_path, dev_dir, "dev", **SEQUENCE_2).parallel.sequence == 2


def test_the_planned_forward_of_dev_is_the_familys(tmp_path, dev_dir):
    """As the shared plan check's for [klein] (none embedded): [dev] embeds its guidance (4.0)."""
    assert_planned_is_the_familys(flux2_config(tmp_path, dev_dir, "dev"), dev_dir)
