"""The ``z_image`` family on a tiny random Z-Image written to a temp dir in diffusers layout (the path
a user's Z-Image / Z-Image-Turbo folder takes): faithful to ``ZImagePipeline`` (without CFG as
Z-Image-Turbo samples, with CFG and a negative prompt, with cfg_normalization and cfg_truncation),
caption lengths mixed in a batch, Flow-GRPO, DiffusionNFT, AWM and SFT iterations, the exported
LoRA, and a checkpoint of another family refused."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    ExportedLoraCheck,
    Family,
    PlanCheck,
    family_config,
    pipeline_latents,
    settings,
    tiny_folder,
)

HEIGHT, WIDTH = 16, 24  # pixels: the tiny VAE halves them to 8 x 12 latents, 4 x 6 = 24 patches
TEXT_TOKENS = 128  # the byte-level tokenizer: 19 template tokens + one per byte of the prompt

# The end of Qwen3's chat template: with enable_thinking (as the pipeline asks) no empty think block
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)

# Z-Image-Turbo's scheduler_config.json: a static shift (the pipeline's mu is unused)
TURBO_SCHEDULER = dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=False)

PROMPTS = ["a", 'a sign that reads "42" on a brick wall, seen at dusk from across the street']
"""20 and 94 templated tokens: the transformer pads them to 32 and 96, so a batch of the two masks."""


def write_tiny_z_image(path, scheduler: dict = TURBO_SCHEDULER) -> None:
    """A random Z-Image with every part of the real one, sized for a CPU, saved by the pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler, ZImagePipeline, ZImageTransformer2DModel
    from transformers import Qwen3Config, Qwen3Model

    torch.manual_seed(0)
    tokenizer = tiny_parts.byte_tokenizer(["<|endoftext|>"], ["<|im_start|>", "<|im_end|>"], CHAT_TEMPLATE)
    text_encoder = Qwen3Model(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=8,
            max_position_embeddings=TEXT_TOKENS,
            bos_token_id=None,
            eos_token_id=0,
            pad_token_id=0,
        )
    )
    transformer = ZImageTransformer2DModel(
        all_patch_size=(2,),
        all_f_patch_size=(1,),
        in_channels=4,
        dim=32,
        n_layers=1,
        n_refiner_layers=1,
        n_heads=2,
        n_kv_heads=2,
        qk_norm=True,
        cap_feat_dim=16,  # the text encoder's hidden size
        rope_theta=256.0,
        t_scale=1000.0,
        axes_dims=[4, 6, 6],
        axes_lens=[1024, 64, 64],
    )
    with torch.no_grad():  # zeros at init: random, so that padding handled wrongly shows
        transformer.x_pad_token.normal_()
        transformer.cap_pad_token.normal_()
    vae = tiny_parts.autoencoder_kl(4, scaling_factor=0.3611, shift_factor=0.1159, size=HEIGHT)
    ZImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**scheduler),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    ).save_pretrained(path)


z_dir = tiny_folder("z_dir", write_tiny_z_image)


def z_config(tmp_path, z_dir, options: str = "", guidance: float = 0.0, **extra):
    """Z-Image-Turbo's way by default: no CFG (guidance 0)."""
    options = f"{{max_sequence_length: {TEXT_TOKENS}{', ' + options if options else ''}}}"
    family = settings("z_image", z_dir, options, guidance, HEIGHT, WIDTH)
    return family_config(tmp_path, {**family, "sampling.negative_prompt": "blurry"}, **extra)


class TestFamilyChecks(ExportedLoraCheck, PlanCheck):
    """The shared checks on the tiny Z-Image: the Flow-GRPO iteration with CFG; ``diffrl plan``
    without CFG (the recipe's), whose planned forward takes captions of the full
    ``max_sequence_length`` (a mask of ones) and the model time from the scheduler's
    ``num_train_timesteps``."""

    case = Family(
        z_config, "z_dir", latent=(4, HEIGHT // 2, WIDTH // 2), grpo={"guidance": 5.0}, masks=("prompt_mask",)
    )


@pytest.mark.parametrize(
    "guidance, options",
    [
        (0.0, {}),
        (5.0, {}),
        (5.0, {"cfg_normalization": 1.0}),
        (5.0, {"cfg_truncation": 0.2}),
    ],
    ids=["turbo_no_cfg", "cfg", "cfg_normalization", "cfg_truncation"],
)
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, z_dir, guidance, options):
    """Same noise, prompts (of different lengths), steps, size, guidance and negative prompt:
    diffrl's ODE sampler over the family's sigmas and ``ZImagePipeline`` give the same latents to
    1e-5 (float32, CPU; bit-identical when measured). With 4 steps of Turbo's schedule
    ``t = 1 - sigma`` is 0, 0.1, 0.25, 0.5: ``cfg_truncation`` 0.2 guides the first two steps only.
    cfg_normalization 1 (the pipeline's True) caps the guided norm at the conditional one's."""
    opts = ", ".join(f"{k}: {v}" for k, v in options.items())
    family = load_family(z_config(tmp_path, z_dir, opts, guidance, **{"model.lora": "null"}))
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], HEIGHT, WIDTH)
    assert noise.shape == (2, 4, HEIGHT // 2, WIDTH // 2)
    cond = family.encode_prompts(PROMPTS)
    assert cond.tensors["prompt_mask"].sum(dim=1).tolist() == [20, 94]
    negative = family.negative("blurry", guidance, cond)
    assert (negative is None) == (guidance == 0)
    sigmas = family.sigmas(4, None, HEIGHT, WIDTH)

    def sample():  # with the family's current options
        return sample_ode(family, noise, cond, sigmas, guidance, negative)

    ours = sample()
    pipe = family.pipeline()
    call = dict(prompt=list(PROMPTS), negative_prompt=["blurry"] * 2, max_sequence_length=TEXT_TOKENS)
    theirs = pipeline_latents(
        pipe, noise.clone(), 4, HEIGHT, WIDTH, guidance_scale=guidance, **call, **options
    ).images
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    if options:  # the option changed the result (it was applied)
        family.options = family.description.Options(max_sequence_length=TEXT_TOKENS)
        assert (sample() - ours).abs().max() > 1e-3
    images = family.decode(ours)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.min() >= 0 and images.max() <= 1
    if guidance == 0.0:
        assert family.encode_images(images).shape == noise.shape


def test_a_dynamically_shifted_schedule_is_the_pipelines(tmp_path, z_dir):
    """A scheduler config with ``use_dynamic_shifting``: the pipeline's ``mu`` from the number of
    image patches shifts the sigmas, and the family's are the same."""
    folder = tmp_path / "dynamic"
    shutil.copytree(z_dir, folder)
    config_file = folder / "scheduler" / "scheduler_config.json"
    settings = {**json.loads(config_file.read_text()), "use_dynamic_shifting": True, "shift": 1.0}
    config_file.write_text(json.dumps(settings))
    family = load_family(z_config(tmp_path, folder, **{"model.lora": "null"}))
    pipe = family.pipeline()
    noise = torch.randn(1, 4, HEIGHT // 2, WIDTH // 2, generator=torch.Generator().manual_seed(0))
    pipe(prompt="a", guidance_scale=0.0, latents=noise, num_inference_steps=3, height=HEIGHT,
         width=WIDTH, max_sequence_length=TEXT_TOKENS, output_type="latent")  # fmt: skip
    sigmas = family.sigmas(3, None, HEIGHT, WIDTH)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    static = load_family(z_config(tmp_path, z_dir, **{"model.lora": "null"}))
    assert not torch.allclose(sigmas, static.sigmas(3, None, HEIGHT, WIDTH))


def test_caption_lengths_mixed_in_a_batch_and_cfg_truncation_per_row(tmp_path, z_dir):
    """A batch of a short and a long caption gives each row what a batch of its own caption gives
    (the transformer masks only the padding between samples; bit-identical when measured). Rows at
    different steps (a training batch): CFG on the rows whose ``t = 1 - sigma`` is within
    ``cfg_truncation``, the conditional velocity on the others, each as at its own step."""
    family = load_family(z_config(tmp_path, z_dir, "cfg_truncation: 0.5", **{"model.lora": "null"}))
    x = torch.randn(2, 4, HEIGHT // 2, WIDTH // 2, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.8, 0.8])
    mixed = family.encode_prompts(PROMPTS)
    with torch.no_grad():
        v = family.velocity(x, sigma, mixed)
        for row, prompt in enumerate(PROMPTS):
            alone = family.velocity(x, sigma, family.encode_prompts([prompt, prompt]))
            torch.testing.assert_close(v[row], alone[row], rtol=0, atol=1e-6)
        negative = family.negative("blurry", 5.0, mixed)
        steps = torch.tensor([0.8, 0.3])  # t = 0.2 (guided) and 0.7 (past the truncation)
        both = family.velocity(x, steps, mixed, 5.0, negative)
        guided = family.velocity(x[:1], steps[:1], mixed.select([0]), 5.0, negative.select([0]))
        plain = family.velocity(x[1:], steps[1:], mixed.select([1]), 5.0, negative.select([1]))
        conditional = family.velocity(x[:1], steps[:1], mixed.select([0]))
    torch.testing.assert_close(both, torch.cat([guided, plain]), rtol=0, atol=0)
    torch.testing.assert_close(plain, family.velocity(x[1:], steps[1:], mixed.select([1])), rtol=0, atol=0)
    assert (guided - conditional).abs().max() > 1e-3


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"options": "cfg_truncation: 1.5"}, "cfg_truncation must be in"),
        ({"options": "cfg_normalization: -1"}, r"cfg_normalization must be in \[0, 10\]"),
        ({"model.options": "{max_sequence_length: 1000}"}, "max_sequence_length=1000 is longer"),
        ({"sampling.height": 18}, "multiples of 4"),
        ({"sampling.width": 512}, "at most 256 pixels"),
        ({"guidance": -1.0}, r"in \[0, 100\]"),
        ({"model.lora": "{rank: 4, target_modules: [attn.to_q]}"}, "attn.to_q"),
    ],
    ids=["truncation", "normalization", "text_tokens", "height", "rope_extent", "guidance", "lora"],
)
def test_bad_settings_are_refused_before_loading(tmp_path, z_dir, overrides, message):
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError, match=message):
        z_config(tmp_path, z_dir, **overrides)
