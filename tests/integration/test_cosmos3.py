"""The ``cosmos3`` family on a tiny random Cosmos 3 written to a temp dir by
``Cosmos3OmniPipeline.save_pretrained`` (the path a user's folder takes), with the UniPC scheduler
Cosmos3 Nano / Super ship (Karras flow sigmas): diffrl's ODE sampler equals the pipeline stepping
the same sigmas with Euler (text-to-image and text-to-video, with CFG; the native schedule of
Cosmos3 Edge too), the decode is the pipeline's, a batch equals its rows, the SDE's first step stays
finite, Flow-GRPO replays exactly, DiffusionNFT / AWM / SFT run, the exported LoRA loads the diffusers
way (and merges into a whole folder), and a checkpoint of another family is refused."""

from __future__ import annotations

import pytest
import torch

from diffrl.models.registry import load_family
from diffrl.sampling.kernels import sde_step
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    Family,
    FamilyChecks,
    export_lora,
    family_config,
    settings,
    tiny_folder,
    train_one,
)

SIZE = 32  # pixels: the tiny VAE divides by 8, patch 2 -> 2 x 2 tokens per latent frame
FRAMES = 5  # -> 2 latent frames
PROMPT_TOKENS = 320  # the byte-level tokenizer: one token per byte of the chat template and prompt
ATOL = 1e-5  # float32 on CPU
PROMPTS = ['the word "cat"', "a red square on a blue background, photographed"]

# Qwen's chat template, cut to the text turns the pipeline builds (no vision ids)
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    """A byte-level tokenizer with the special tokens the pipeline asks for (``<|vision_start|>``,
    ``<|im_end|>`` as eos) and a chat template."""
    specials = ["<|im_start|>", "<|im_end|>", "<|vision_start|>"]
    return tiny_parts.byte_tokenizer(["<|endoftext|>"], specials, CHAT_TEMPLATE, eos_token="<|im_end|>")


def write_tiny_cosmos3(path) -> None:
    """A random Cosmos 3 with every part the text-to-video pipeline uses, sized for a CPU, saved by
    the pipeline (no safety checker: it cannot be built offline)."""
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    transformer = Cosmos3OmniTransformer(
        head_dim=8,
        hidden_size=32,
        intermediate_size=64,
        latent_channel=16,
        num_attention_heads=4,
        num_hidden_layers=2,
        num_key_value_heads=2,
        patch_latent_dim=64,  # 2 x 2 patch x 16 channels
        vocab_size=len(tokenizer),
        rope_axes_dim=[2, 1, 1],  # head_dim / 2 frequencies over (t, h, w)
    )  # enable_fps_modulation (the default): float mRoPE positions scaled by the frame rate
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    scheduler = UniPCMultistepScheduler(  # what Cosmos3 Nano / Super folders ship
        use_karras_sigmas=True,
        use_flow_sigmas=True,
        prediction_type="flow_prediction",
        sigma_max=200.0,
        sigma_min=0.147,
    )
    Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=tokenizer,
        vae=vae,
        scheduler=scheduler,
        enable_safety_checker=False,
    ).save_pretrained(path)


cosmos3_dir = tiny_folder("cosmos3_dir", write_tiny_cosmos3)


def options(frames: int) -> str:
    return f"{{num_frames: {frames}, height: {SIZE}, width: {SIZE}, max_prompt_tokens: {PROMPT_TOKENS}}}"


def cosmos3_config(tmp_path, folder, frames: int = FRAMES, **extra):
    """The reward is an image reward: each video is scored frame by frame, then averaged."""
    return family_config(tmp_path, settings("cosmos3", folder, options(frames), 3.0, SIZE), **extra)


class TestFamilyChecks(FamilyChecks):
    """The shared checks on text-to-video; SFT on still images (text-to-image, ``num_frames: 1``)."""

    case = Family(cosmos3_config, "cosmos3_dir", sft={"model.options": options(1)})


def euler_along(sigmas: torch.Tensor):
    """A ``FlowMatchEulerDiscreteScheduler`` (shift 1: no change) that steps ``sigmas`` whatever
    ``set_timesteps`` the pipeline asks for: the pipeline's loop with Euler on the given grid."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    class EulerAlong(FlowMatchEulerDiscreteScheduler):
        def set_timesteps(self, num_inference_steps=None, device=None, **_):
            super().set_timesteps(sigmas=sigmas[:-1].tolist(), device=device)

    return EulerAlong(shift=1.0)


def pipeline_latents(pipe, noise, guidance, frames, steps):
    """The pipeline's output latents for each prompt (it runs one sample per call)."""
    rows = []
    for prompt, x in zip(PROMPTS, noise):
        out = pipe(
            prompt=prompt,
            negative_prompt="",
            latents=x[None].clone(),
            num_frames=frames,
            height=SIZE,
            width=SIZE,
            num_inference_steps=steps,
            guidance_scale=guidance,
            output_type="latent",
        )
        rows.append(out.video)
    return torch.cat(rows)


@pytest.mark.parametrize("frames", [1, FRAMES], ids=["text_to_image", "text_to_video"])
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, cosmos3_dir, frames):
    """Same noise, prompts, steps, size, frames and CFG (negative prompt ""): diffrl's ODE sampler
    along the folder's UniPC sigmas equals ``Cosmos3OmniPipeline`` stepping them with
    ``FlowMatchEulerDiscreteScheduler``, to 1e-5 (float32, CPU), at guidance 3 and 1; the sigmas are
    the ones the pipeline's own UniPC run used; the decode is the pipeline's."""
    family = load_family(cosmos3_config(tmp_path, cosmos3_dir, frames, **{"model.lora": "null"}))
    assert family.options.max_prompt_tokens == PROMPT_TOKENS
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    latent_frames = 1 if frames == 1 else 2
    assert noise.shape == (2, 16, latent_frames, SIZE // 8, SIZE // 8)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    pipe = family.pipeline()
    pipeline_latents(pipe, noise[:1], 3.0, frames, 4)  # its own UniPC, to read the sigmas it used
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=0)
    assert 0.99 < sigmas[0] < 1  # Karras: 200 / 201
    cond = family.encode_prompts(PROMPTS)
    pipe.scheduler = euler_along(sigmas)
    for guidance in (3.0, 1.0):
        negative = family.negative("", guidance)
        assert (negative is None) == (guidance == 1.0)
        ours = sample_ode(family, noise, cond, sigmas, guidance, negative)
        theirs = pipeline_latents(pipe, noise, guidance, frames, 4)
        err = (ours - theirs).abs().max().item()
        print(f"cosmos3 ODE parity, {frames} frame(s), guidance {guidance}: max |diff| = {err:.2e}")
        torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    media = family.decode_media(ours)
    shape = (2, 3, SIZE, SIZE) if frames == 1 else (2, 3, frames, SIZE, SIZE)
    assert media.images.shape == shape and media.images.min() >= 0 and media.images.max() <= 1
    assert media.fps == (None if frames == 1 else 24.0)
    with torch.no_grad():  # the pipeline's own decode (output_type="pt") from the same latents
        frames_pt = [
            pipe(
                prompt=prompt,
                num_frames=frames,
                height=SIZE,
                width=SIZE,
                num_inference_steps=1,
                guidance_scale=1.0,
                latents=x[None].clone(),
                output_type="pt",
                callback_on_step_end=lambda p, i, t, kw, x=x: {"latents": x[None].clone()},
            ).video
            for prompt, x in zip(PROMPTS, ours)
        ]  # each (frames, 3, H, W)
    theirs = torch.stack(frames_pt).transpose(1, 2).float()
    torch.testing.assert_close(media.images, theirs[:, :, 0] if frames == 1 else theirs, rtol=0, atol=ATOL)
    x0 = family.encode_images(media.images)
    assert x0.shape == ours.shape


def test_the_native_flow_schedule_matches_the_pipeline(tmp_path, cosmos3_dir):
    """``use_native_flow_schedule`` (Cosmos3 Edge: UniPC with ``flow_shift`` 5): the sigmas are
    ``linspace(0.999, 0, N + 1)[:-1]`` through the scheduler, as the pipeline's UniPC run, and ODE
    sampling equals the pipeline with a plain ``FlowMatchEulerDiscreteScheduler(shift=5)``, which
    the pipeline hands the same native sigmas."""
    from diffusers import FlowMatchEulerDiscreteScheduler, UniPCMultistepScheduler

    family = load_family(cosmos3_config(tmp_path, cosmos3_dir, **{"model.lora": "null"}))
    edge = UniPCMultistepScheduler(use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=5.0)
    family.scheduler_config = {**edge.config, "_class_name": "UniPCMultistepScheduler"}
    family.use_native_flow_schedule = True
    pipe = family.pipeline()
    assert pipe.config.use_native_flow_schedule
    sigmas = family.sigmas(3, None, SIZE, SIZE)
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    pipeline_latents(pipe, noise[:1], 3.0, FRAMES, 3)
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas.float(), rtol=0, atol=1e-7)
    assert 0.9997 < sigmas[0] < 1
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=5.0)
    cond = family.encode_prompts(PROMPTS)
    ours = sample_ode(family, noise, cond, sigmas, 3.0, family.negative("", 3.0))
    theirs = pipeline_latents(pipe, noise, 3.0, FRAMES, 3)
    print(f"cosmos3 ODE parity, native schedule: max |diff| = {(ours - theirs).abs().max().item():.2e}")
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_a_batch_equals_its_rows_and_the_prompt_is_the_pipelines(tmp_path, cosmos3_dir):
    """Rows of different prompt lengths in one call give each row's own velocity (the transformer
    runs one packed sequence per row); the conditioning holds the pipeline's token ids."""
    family = load_family(cosmos3_config(tmp_path, cosmos3_dir, **{"model.lora": "null"}))
    prompts = ["a", *PROMPTS]
    cond = family.encode_prompts(prompts)
    pipe = family.pipeline()
    for i, p in enumerate(prompts):
        ids, neg = pipe.tokenize_prompt(p, None, num_frames=FRAMES, height=SIZE, width=SIZE)
        n = int(cond.tensors["prompt_length"][i])
        assert cond.tensors["input_ids"][i, :n].tolist() == ids and n == len(ids)
        assert cond.tensors["input_ids"][i, n:].abs().max() == 0
    negative = family.negative("", 3.0)
    assert negative.tensors["input_ids"][0, : int(negative.tensors["prompt_length"][0])].tolist() == neg
    x = torch.randn(3, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.5, 0.1])
    with torch.no_grad():
        batched = family.forward(family.transformer, x, sigma, cond)
        for i in range(3):
            alone = family.forward(family.transformer, x[i : i + 1], sigma[i : i + 1], cond.select([i]))
            torch.testing.assert_close(batched[i : i + 1], alone, rtol=0, atol=0)


def test_the_sde_first_step_stays_finite(tmp_path, cosmos3_dir):
    """The schedule starts below 1 (0.995): the SDE kernel takes ``sigmas[1]`` in ``1 - sigma`` at
    that step, as at sigma = 1, so its std is eta sqrt(sigma_0 / (1 - sigma_1)), not eta sqrt(199)."""
    family = load_family(cosmos3_config(tmp_path, cosmos3_dir, **{"model.lora": "null"}))
    sigmas = family.sigmas(3, None, SIZE, SIZE)
    s0, s1 = sigmas[:1], sigmas[1:2]
    x, v, noise = torch.randn(3, 1, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    out = sde_step(x, v, s0, s1, noise_level=0.7, sigma_max=s1.item(), noise=noise)
    torch.testing.assert_close(out.std, 0.7 * torch.sqrt(s0 / (1 - s1)))
    assert out.prev_sample.abs().max() < 20 and torch.isfinite(out.log_prob).all()


def test_flow_grpo_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, cosmos3_dir):
    grpo = train_one(cosmos3_config(tmp_path / "grpo", cosmos3_dir))
    _exported_lora_matches(tmp_path, cosmos3_dir, grpo.checkpoint)


def test_bad_settings_are_refused(tmp_path, cosmos3_dir):
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError, match="num_frames = 4k"):
        cosmos3_config(tmp_path, cosmos3_dir, frames=6)
    with pytest.raises(ConfigError, match="prompt states the resolution"):
        cosmos3_config(tmp_path, cosmos3_dir, **{"sampling.height": 2 * SIZE})
    with pytest.raises(ConfigError, match="matches no module of the cosmos3"):  # read on the meta device
        cosmos3_config(tmp_path, cosmos3_dir, **{"model.lora": "{rank: 4, target_modules: [attn.to_q]}"})
    with pytest.raises(ConfigError, match="multiple of 8"):
        cosmos3_config(tmp_path, cosmos3_dir, **{"sampling.height": 36, "model.options": "{height: 36}"})


def _exported_lora_matches(tmp_path, folder, checkpoint):
    """``diffrl export`` writes the adapter with ``CosmosLoraLoaderMixin.save_lora_weights``;
    ``transformer.load_lora_adapter(folder, prefix="transformer", use_safetensors=True)`` on the base pipeline gives the
    velocity of diffrl's policy with that LoRA, with CFG (to 1e-5), and the adapter changed it."""
    out, ours = export_lora(tmp_path, checkpoint)
    base = load_family(cosmos3_config(tmp_path, folder, **{"model.lora": "null"}))
    x = torch.randn(2, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])
    cond = ours.encode_prompts(PROMPTS)
    with torch.no_grad():
        v_plain = base.velocity(x, sigma, cond, 3.0, base.negative("", 3.0))
        pipe = base.pipeline()
        pipe.transformer.load_lora_adapter(
            str(out), prefix="transformer", use_safetensors=True
        )  # as a user would
        v_diffusers = base.velocity(x, sigma, cond, 3.0, base.negative("", 3.0), module=pipe.transformer)
        v_ours = ours.velocity(x, sigma, cond, 3.0, ours.negative("", 3.0))
    print(f"cosmos3 exported LoRA: max |diff| = {(v_diffusers - v_ours).abs().max().item():.2e}")
    torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=ATOL)
    assert (v_plain - v_ours).abs().max() > 1e-3
    # --merge: a whole Cosmos3OmniPipeline folder with the adapter fused into the transformer
    from diffrl.cli import main

    assert main(["export", str(checkpoint), str(tmp_path / "merged"), "--merge"]) == 0
    fused = load_family(cosmos3_config(tmp_path, tmp_path / "merged", **{"model.lora": "null"}))
    with torch.no_grad():
        v_fused = fused.velocity(x, sigma, cond, 3.0, fused.negative("", 3.0))
    print(f"cosmos3 merged export: max |diff| = {(v_fused - v_ours).abs().max().item():.2e}")
    torch.testing.assert_close(v_fused, v_ours, rtol=0, atol=ATOL)
