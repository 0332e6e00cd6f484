"""The ``qwen_image`` family on a tiny random Qwen-Image written to a temp dir in diffusers layout (the
path a user's Qwen-Image folder takes): faithful to ``QwenImagePipeline`` (with and without true CFG),
Flow-GRPO and DiffusionNFT iterations, the exported LoRA, and a checkpoint of another family refused."""

from __future__ import annotations

from functools import partial

import pytest
import torch

from diffrl.models.flux import pack, unpack
from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    SEQUENCE_2,
    ExportedLoraCheck,
    Family,
    PlanCheck,
    assert_does_not_split,
    family_config,
    pipeline_latents,
    pretend_sequence_ranks,
    settings,
    tiny_folder,
)

SIZE = 16  # pixels: the tiny VAE halves them to 8 x 8 latents, packed 2 x 2 -> 16 tokens
TEXT_TOKENS = 256  # the byte-level tokenizer leaves ~150 tokens of the template after the drop

# Qwen-Image's scheduler_config.json: exponential time shift from the image's token count
SCHEDULER = dict(
    base_image_seq_len=256,
    base_shift=0.5,
    max_image_seq_len=8192,
    max_shift=0.9,
    shift=1.0,
    shift_terminal=0.02,
    time_shift_type="exponential",
    use_dynamic_shifting=True,
)


def build_qwen_tokenizer():
    """A byte-level tokenizer with the chat template's special tokens, as the real tokenizer treats them."""
    return tiny_parts.byte_tokenizer(["<|endoftext|>"], ["<|im_start|>", "<|im_end|>"])


def qwen_image_parts(tokenizer, max_positions: int, vision: dict | None = None, ids=None, **transformer):
    """A random Qwen-Image's parts, sized for a CPU, as its pipeline takes them: the Qwen2.5-VL text
    encoder (``max_positions``, its vision tower's ``vision`` settings and token ``ids``), the
    transformer (``transformer``: settings on top), the VAE, the scheduler, ``tokenizer``."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImageTransformer2DModel

    text_encoder = tiny_parts.qwen25_vl(len(tokenizer), max_positions, vision, **(ids or {}))
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,  # 16 latent channels x a 2 x 2 patch
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(2, 2, 4),
        **transformer,
    )
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[False]
    )
    return dict(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    )


def write_tiny_qwen_image(path) -> None:
    """A random Qwen-Image with every part of the real one, sized for a CPU, saved by the pipeline."""
    from diffusers import QwenImagePipeline

    torch.manual_seed(0)
    QwenImagePipeline(**qwen_image_parts(build_qwen_tokenizer(), max_positions=512)).save_pretrained(path)


qwen_dir = tiny_folder("qwen_dir", write_tiny_qwen_image)


def qwen_config(tmp_path, qwen_dir, **extra):
    options = f"{{max_sequence_length: {TEXT_TOKENS}}}"
    return family_config(tmp_path, settings("qwen_image", qwen_dir, options, 4.0, SIZE), **extra)


class TestFamilyChecks(ExportedLoraCheck, PlanCheck):
    """The shared checks on the tiny Qwen-Image; ``diffrl plan`` with true CFG, whose planned
    forward takes prompts of the full ``max_sequence_length`` (a mask of ones, the text kept whole)."""

    case = Family(qwen_config, "qwen_dir", latent=(16, 8, 8), masks=("encoder_hidden_states_mask",))


@pytest.mark.parametrize("guidance", [4.0, 1.0], ids=["true_cfg", "no_cfg"])
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, qwen_dir, guidance):
    """Same noise (packed for the pipeline), prompts, steps, size and CFG (negative prompt "", which
    the pipeline takes as a negative prompt and so runs true CFG): diffrl's ODE sampler and
    ``QwenImagePipeline`` give the same latents to 1e-5 (float32, CPU; bit-identical when measured).
    The prompts differ in length, so the pipeline pads to the longer one and encodes the negative
    alone (no mask), while diffrl pads every prompt to 256 tokens, masks the padding and gives the
    transformer the text up to the batch's longest prompt."""
    from diffrl.models import qwen_image

    family = load_family(qwen_config(tmp_path, qwen_dir, **{"model.lora": "null"}))
    pipe = family.pipeline()
    assert (pipe.prompt_template_encode, pipe.prompt_template_encode_start_idx) == (
        qwen_image.PROMPT_TEMPLATE,
        qwen_image.PROMPT_DROP_TOKENS,
    )
    prompts = ['the word "cat"', 'a sign that reads "42" on a wall']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    assert noise.shape == (2, 16, SIZE // 2, SIZE // 2)
    cond = family.encode_prompts(prompts)
    negative = family.negative("", guidance)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    ours = sample_ode(family, noise, cond, sigmas, guidance, negative)
    cfg = dict(negative_prompt="" if guidance > 1 else None, true_cfg_scale=guidance)
    theirs = pipeline_latents(
        pipe, pack(noise), 4, SIZE, prompt=prompts, max_sequence_length=TEXT_TOKENS, **cfg
    ).images
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    torch.testing.assert_close(ours, unpack(theirs, SIZE // 2, SIZE // 2), rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1
    if guidance == 1.0:
        assert family.encode_images(images).shape == noise.shape


def test_bad_options_and_a_guidance_embedded_transformer_are_refused(tmp_path, qwen_dir):
    import json
    import shutil

    from diffrl.config import ConfigError

    with pytest.raises(ConfigError, match="max_sequence_length must be in"):
        qwen_config(tmp_path, qwen_dir, **{"model.options": "{max_sequence_length: 2048}"})
    guided = tmp_path / "guided"
    shutil.copytree(qwen_dir, guided)
    config_file = guided / "transformer" / "config.json"
    config_file.write_text(json.dumps({**json.loads(config_file.read_text()), "guidance_embeds": True}))
    with pytest.raises(ConfigError, match="guidance_embeds"):  # before any weights load
        qwen_config(tmp_path, guided)


def test_sequence_parallel_config_errors_and_the_text_padded_to_a_multiple_of_the_ranks(tmp_path, qwen_dir):
    """``parallel.sequence: 3``: 16 image tokens and 2 heads do not split over 3 ranks. The text
    is no config error: a forward takes the batch's longest prompt (143 tokens here, a prompt
    ending exactly at ``max_sequence_length``) and, under sequence parallel, pads it with masked
    zeros to a multiple of the ranks (144 for 2); the velocity stays the unpadded one's (masked
    keys get no attention weight: measured 2.4e-7 of velocities up to 1.9, float rounding)."""
    from diffrl.models.qwen_image import text_tokens

    lengths = ("image tokens (16)", "attention heads (2)")
    msg = assert_does_not_split(partial(qwen_config, tmp_path, qwen_dir), "qwen_image", *lengths)
    assert "text tokens" not in msg
    config = qwen_config(tmp_path, qwen_dir, **SEQUENCE_2, **{"model.options": "{max_sequence_length: 143}"})
    family = load_family(config)
    cond = family.encode_prompts(['the word "cats"', "a red square"])  # 143 and 140 text tokens
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    with torch.no_grad():
        whole = family.velocity(x, sigma, cond)
        pretend_sequence_ranks(family.transformer, 2)
        text, mask = text_tokens(family.transformer, cond)
        padded = family.velocity(x, sigma, cond)
    assert text.shape[1] == 144 and mask.sum(dim=1).tolist() == [143, 140]
    torch.testing.assert_close(padded, whole, rtol=0, atol=1e-6)
