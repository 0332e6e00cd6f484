"""The ``qwen_image`` family on a tiny random Qwen-Image written to a temp dir in diffusers layout (the
path a user's Qwen-Image folder takes): faithful to ``QwenImagePipeline`` (with and without true CFG),
Flow-GRPO and DiffusionNFT iterations, the exported LoRA, and a checkpoint of another family refused."""

from __future__ import annotations

import pytest
import torch

from diffrl.models.flux import pack, unpack
from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration.family_checks import (
    OTHER_ALGORITHMS,
    assert_exported_lora_matches,
    assert_refuses,
    family_config,
    train_one,
)
from tests.integration.test_flux import assert_plan_runs, assert_planned_is_the_familys

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
    """A byte-level BPE ``Qwen2Tokenizer`` (no merges: one token per byte) with the chat template's
    special tokens, as the real tokenizer treats them."""
    from transformers import Qwen2Tokenizer
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {"<|endoftext|>": 0}
    for ch in bytes_to_unicode().values():
        vocab[ch] = len(vocab)
    return Qwen2Tokenizer(vocab=vocab, merges=[], additional_special_tokens=["<|im_start|>", "<|im_end|>"])


def write_tiny_qwen_image(path) -> None:
    """A random Qwen-Image with every part of the real one, sized for a CPU, saved by the pipeline."""
    from diffusers import (
        AutoencoderKLQwenImage,
        FlowMatchEulerDiscreteScheduler,
        QwenImagePipeline,
        QwenImageTransformer2DModel,
    )
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    torch.manual_seed(0)
    tokenizer = build_qwen_tokenizer()
    text_encoder = Qwen2_5_VLForConditionalGeneration(
        Qwen2_5_VLConfig(
            text_config=dict(
                vocab_size=len(tokenizer),
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                rope_parameters={"rope_type": "default", "mrope_section": [1, 1, 2], "rope_theta": 1e6},
                bos_token_id=None,
                eos_token_id=0,
                pad_token_id=0,
            ),
            vision_config=dict(
                depth=1,
                hidden_size=16,
                intermediate_size=32,
                num_heads=2,
                out_hidden_size=32,
                fullatt_block_indexes=[0],
            ),
        )
    )
    transformer = QwenImageTransformer2DModel(
        patch_size=2,
        in_channels=64,  # 16 latent channels x a 2 x 2 patch
        out_channels=16,
        num_layers=2,
        attention_head_dim=8,
        num_attention_heads=2,
        joint_attention_dim=32,
        axes_dims_rope=(2, 2, 4),
    )
    vae = AutoencoderKLQwenImage(
        base_dim=8, z_dim=16, dim_mult=[1, 1], num_res_blocks=1, temperal_downsample=[False]
    )
    QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        transformer=transformer,
    ).save_pretrained(path)


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_qwen_image")
    write_tiny_qwen_image(path)
    return path


def qwen_config(tmp_path, qwen_dir, **extra):
    family = {
        "model.family": "qwen_image",
        "model.path": str(qwen_dir),
        "model.options": f"{{max_sequence_length: {TEXT_TOKENS}}}",
        "sampling.guidance_scale": 4.0,
        "sampling.height": SIZE,
        "sampling.width": SIZE,
    }
    return family_config(tmp_path, family, **extra)


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
    theirs = pipe(
        prompt=prompts,
        negative_prompt="" if guidance > 1 else None,
        true_cfg_scale=guidance,
        latents=pack(noise),
        num_inference_steps=4,
        height=SIZE,
        width=SIZE,
        max_sequence_length=TEXT_TOKENS,
        output_type="latent",
    ).images
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    torch.testing.assert_close(ours, unpack(theirs, SIZE // 2, SIZE // 2), rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, SIZE, SIZE) and images.min() >= 0 and images.max() <= 1
    if guidance == 1.0:
        assert family.encode_images(images).shape == noise.shape


def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, qwen_dir):
    grpo = train_one(qwen_config(tmp_path / "grpo", qwen_dir))
    base = load_family(qwen_config(tmp_path, qwen_dir, **{"model.lora": "null"}))
    x = torch.randn(2, 16, 8, 8, generator=torch.Generator().manual_seed(0))
    assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x)


@OTHER_ALGORITHMS
def test_other_algorithms_run_an_iteration(tmp_path, qwen_dir, algorithm):
    train_one(qwen_config(tmp_path, qwen_dir, **algorithm))


def test_a_tiny_checkpoint_is_refused(tmp_path, qwen_dir, tiny_checkpoint):
    assert_refuses(load_family(qwen_config(tmp_path, qwen_dir)), tiny_checkpoint)


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
    from diffrl.config import ConfigError
    from diffrl.models.qwen_image import text_tokens
    from tests.integration.test_flux import SEQUENCE_2, SEQUENCE_3, pretend_sequence_ranks

    with pytest.raises(ConfigError) as e:
        qwen_config(tmp_path, qwen_dir, **SEQUENCE_3)
    msg = str(e.value)
    for what in ("image tokens (16)", "attention heads (2)"):
        assert f"parallel.sequence=3: the qwen_image model's {what} do not split over 3 ranks" in msg
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


def test_plan_runs_the_familys_own_transformer_and_forward(tmp_path, qwen_dir):
    """``diffrl plan`` of the tiny Qwen-Image with true CFG runs, and the planned forward is the
    family's: prompts of the full ``max_sequence_length`` (a mask of ones, the text kept whole)."""
    config = qwen_config(tmp_path, qwen_dir)
    assert_plan_runs(config)
    assert_planned_is_the_familys(config, qwen_dir, masks=("encoder_hidden_states_mask",))
