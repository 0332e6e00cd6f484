"""The ``ltx2`` family on a tiny random LTX-2 (Gemma 3, connectors, the audio-video transformer with
perturbed attention, video VAE, audio VAE, vocoder) written by ``LTX2Pipeline.save_pretrained``:
ODE sampling equals ``LTX2Pipeline`` (video and audio latents, with the pipeline's full guidance and
without), ``decode_media`` gives the pipeline's frames and waveform, Flow-GRPO replays exactly,
DiffusionNFT, AWM and SFT run, the exported LoRA loads into the pipeline, and a checkpoint of another
family or a bad option is refused."""

from __future__ import annotations

import json
import math

import av
import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.cli import main
from diffrl.cli.inference import load_target
from diffrl.config import ConfigError
from diffrl.data.prompts import PromptSet
from diffrl.evaluation.evaluate import generate
from diffrl.models.registry import load_family
from diffrl.models.tiny import build_tokenizer
from diffrl.rewards.base import RewardSet
from diffrl.sampling.engine import build_collector
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration.family_checks import (
    Family,
    FamilyChecks,
    assert_merged_matches,
    export_lora,
    family_config,
    other_pipelines_folder,
    settings,
    tiny_folder,
    train_one,
)
from tests.integration.test_flow_grpo import REWARD
from tests.unit.rewards.test_clap import formula
from tests.unit.rewards.tiny_clap import write_clap

SIZE = 32  # pixels: LTX2Pipeline takes multiples of 32; the tiny VAE divides by 4 -> 8 x 8 latents
FRAMES = 5  # the tiny VAE's 2x temporal compression -> 3 latent frames; 5/24 s -> 5 audio latents
OPTIONS = f"{{num_frames: {FRAMES}, max_sequence_length: 16, stg_blocks: [1]}}"  # 2 blocks: STG on the last
ATOL = 1e-5  # float32 on CPU
ATTENTIONS = ("attn1", "audio_attn1", "attn2", "audio_attn2", "audio_to_video_attn", "video_to_audio_attn")
"""Every attention of both streams of the LTX-2 transformer: where its LoRA goes."""


def write_tiny_ltx2(path, perturbed_attn: bool = True, rope_type: str = "split") -> None:
    """A random LTX-2 with every part of the real one, sized for a CPU, saved by the pipeline, with
    non-trivial latent statistics; ``perturbed_attn``: LTX-2.3's transformer (STG acts), else
    LTX-2.0's (STG changes nothing); ``rope_type``: the transformer's rope layout ("split", as the
    released checkpoints, or "interleaved")."""
    from diffusers import (
        AutoencoderKLLTX2Audio,
        AutoencoderKLLTX2Video,
        FlowMatchEulerDiscreteScheduler,
        LTX2Pipeline,
        LTX2VideoTransformer3DModel,
    )
    from diffusers.pipelines.ltx2 import LTX2TextConnectors
    from diffusers.pipelines.ltx2.vocoder import LTX2Vocoder
    from transformers import (
        Gemma3Config,
        Gemma3ForConditionalGeneration,
        Gemma3TextConfig,
        SiglipVisionConfig,
    )

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    text = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=16,
        pad_token_id=0,
        bos_token_id=2,
        eos_token_id=3,
    )
    vision = SiglipVisionConfig(
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        image_size=28,
        patch_size=14,
    )
    gemma = Gemma3ForConditionalGeneration(
        Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4)
    )
    connectors = LTX2TextConnectors(  # 2 stacked hidden states (embeddings + 1 layer) of 16
        caption_channels=16,
        text_proj_in_factor=2,
        video_connector_num_attention_heads=2,
        video_connector_attention_head_dim=8,
        video_connector_num_layers=1,
        video_connector_num_learnable_registers=8,
        audio_connector_num_attention_heads=2,
        audio_connector_attention_head_dim=8,
        audio_connector_num_layers=1,
        audio_connector_num_learnable_registers=8,
        connector_rope_base_seq_len=32,
        rope_type="split",
    )
    transformer = LTX2VideoTransformer3DModel(
        in_channels=4,
        out_channels=4,
        num_attention_heads=2,
        attention_head_dim=8,
        cross_attention_dim=16,
        vae_scale_factors=(2, 4, 4),
        audio_in_channels=4,  # 2 audio latent channels x 2 latent mel bins
        audio_out_channels=4,
        audio_num_attention_heads=2,
        audio_attention_head_dim=4,
        audio_cross_attention_dim=8,
        num_layers=2,
        caption_channels=16,
        rope_type=rope_type,
        perturbed_attn=perturbed_attn,
    )
    vae = AutoencoderKLLTX2Video(  # patch 2 x one spatiotemporal block: 4x spatial, 2x temporal
        latent_channels=4,
        block_out_channels=(8,),
        decoder_block_out_channels=(8,),
        layers_per_block=(1, 1),
        decoder_layers_per_block=(1, 1),
        spatio_temporal_scaling=(True,),
        decoder_spatio_temporal_scaling=(True,),
        decoder_inject_noise=(False, False),
        downsample_type=("spatiotemporal",),
        upsample_type=("spatiotemporal",),
        upsample_residual=(False,),
        upsample_factor=(1,),
        patch_size=2,
        patch_size_t=1,
        scaling_factor=0.9,
    )
    # base_channels = latent channels x latent mel bins (the statistics live in packed space)
    audio_vae = AutoencoderKLLTX2Audio(
        base_channels=4, ch_mult=(1, 1, 1), num_res_blocks=1, latent_channels=2, mel_bins=8, resolution=32
    )
    with torch.no_grad():  # statistics that a skipped (de)normalisation would not survive
        vae.latents_mean.copy_(torch.linspace(-0.2, 0.2, 4))
        vae.latents_std.copy_(torch.linspace(0.5, 1.5, 4))
        audio_vae.latents_mean.copy_(torch.linspace(-0.1, 0.3, 4))
        audio_vae.latents_std.copy_(torch.linspace(0.7, 1.3, 4))
    vocoder = LTX2Vocoder(
        in_channels=16,  # 2 mel channels x 8 mel bins
        hidden_channels=32,
        out_channels=2,
        upsample_kernel_sizes=[4, 4],
        upsample_factors=[2, 2],
        resnet_kernel_sizes=[3],
        resnet_dilations=[[1, 3, 5]],
        output_sampling_rate=16000,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(  # LTX-2's: dynamic shift by video tokens, terminal 0.1
        use_dynamic_shifting=True,
        base_shift=0.95,
        max_shift=2.05,
        base_image_seq_len=1024,
        max_image_seq_len=4096,
        shift_terminal=0.1,
    )
    LTX2Pipeline(
        scheduler=scheduler,
        vae=vae,
        audio_vae=audio_vae,
        text_encoder=gemma,
        tokenizer=tokenizer,
        connectors=connectors,
        transformer=transformer,
        vocoder=vocoder,
    ).save_pretrained(path)


ltx2_dir = tiny_folder("ltx2_dir", write_tiny_ltx2)
ltx20_dir = tiny_folder("ltx20_dir", write_tiny_ltx2, perturbed_attn=False)


def ltx2_config(tmp_path, folder, **extra):
    """The reward is an image reward: each video is scored frame by frame, then averaged."""
    return family_config(tmp_path, settings("ltx2", folder, OPTIONS, 3.0, SIZE), **extra)


class TestFamilyChecks(FamilyChecks):
    """The shared checks on the tiny LTX-2.3; SFT on still images (``num_frames: 1``): their audio
    is the encoding of silence."""

    case = Family(
        ltx2_config,
        "ltx2_dir",
        sft={"model.options": "{num_frames: 1, max_sequence_length: 16, stg_blocks: [1]}"},
    )


GUIDANCE = {  # the pipeline's defaults (audio CFG 7, STG 1, modality 3, rescale 0.7), and none at all
    "full": dict(guidance_scale=3.0),
    # LTX-2.0's transformer (no perturbed attention): the pipeline runs an STG pass equal to the
    # conditional one, diffrl skips it
    "full_ltx2.0": dict(guidance_scale=3.0, use_cross_timestep=False),
    "off": dict(
        guidance_scale=1.0,
        audio_guidance_scale=1.0,
        stg_scale=0.0,
        audio_stg_scale=0.0,
        modality_scale=1.0,
        audio_modality_scale=1.0,
        use_cross_timestep=False,
    ),
}


@pytest.mark.parametrize("guidance", list(GUIDANCE))
def test_ode_sampling_and_decoding_match_the_diffusers_pipeline(tmp_path, ltx2_dir, ltx20_dir, guidance):
    """Same noise (handed to the pipeline as its ``latents`` / ``audio_latents``), prompts, steps,
    size, frames and guidance: diffrl's ODE sampler gives ``LTX2Pipeline``'s video and audio latents
    to 1e-5 (float32, CPU); ``decode_media`` gives its frames and its waveform (same length)."""
    settings = dict(GUIDANCE[guidance])
    g = settings.pop("guidance_scale")
    options = {"num_frames": FRAMES, "stg_blocks": [1], **settings}
    folder = ltx20_dir if guidance.endswith("2.0") else ltx2_dir
    family = load_family(
        ltx2_config(tmp_path, folder, **{"model.lora": "null", "model.options": json.dumps(options)})
    )
    assert family.transformer.config.perturbed_attn == (folder == ltx2_dir)
    assert family.options.max_sequence_length == 1024 and family.description.sound
    prompts = ['the word "cat"', "  a dog "]  # stripped, as the pipeline
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    grid = family.grid(SIZE, SIZE)
    assert (grid.frames, grid.height, grid.width, grid.audio_frames) == (3, 8, 8, 5)
    assert noise.shape == (2, 3 * 8 * 8 * 4 + 5 * 4)
    cond = family.encode_prompts(prompts)
    negative = family.negative("", g)
    assert (negative is None) == (guidance == "off")
    sigmas = family.sigmas(3, None, SIZE, SIZE)
    ours = sample_ode(family, noise, cond, sigmas, g, None if negative is None else negative.repeat(2))
    pipe = family.pipeline()
    video_noise, audio_noise = family.unpack(noise)  # the pipeline's (denormalised) latent layout
    call = dict(
        prompt=prompts,
        negative_prompt="",
        latents=video_noise,
        audio_latents=audio_noise,
        num_inference_steps=3,
        height=SIZE,
        width=SIZE,
        num_frames=FRAMES,
        guidance_scale=g,
        spatio_temporal_guidance_blocks=[1],
        max_sequence_length=1024,
        **settings,
    )
    theirs = pipe(**call, output_type="latent")
    video, audio = family.unpack(ours)
    torch.testing.assert_close(video, theirs.frames, rtol=0, atol=ATOL)
    torch.testing.assert_close(audio, theirs.audio, rtol=0, atol=ATOL)
    print(
        f"\n{guidance}: max |video - pipeline| {(video - theirs.frames).abs().max():.2e}, "
        f"max |audio - pipeline| {(audio - theirs.audio).abs().max():.2e}"
    )
    media = family.decode_media(ours)
    decoded = pipe(**call, output_type="pt")
    assert media.images.shape == (2, 3, FRAMES, SIZE, SIZE) and media.fps == 24.0
    assert media.images.min() >= 0 and media.images.max() <= 1
    torch.testing.assert_close(media.images, decoded.frames.transpose(1, 2), rtol=0, atol=1e-4)
    assert media.audio.sample_rate == 16000 and media.audio.waveform.shape == decoded.audio.shape
    torch.testing.assert_close(media.audio.waveform, decoded.audio, rtol=0, atol=1e-4)
    assert torch.equal(family.decode(ours), media.images)


def test_guidance_terms_each_change_the_velocity(tmp_path, ltx2_dir):
    """Each guidance term of the pipeline acts (a no-op one would pass the parity test vacuously):
    switching any of CFG, STG, modality isolation or rescale off changes the guided velocity."""
    family = load_family(ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null"}))
    x = torch.randn(2, *family.latent_shape(SIZE, SIZE), generator=torch.Generator().manual_seed(0))
    sigma, cond = torch.tensor([0.9, 0.5]), family.encode_prompts(["a", "b"])
    negative = family.negative("", 3.0).repeat(2)
    with torch.no_grad():
        full = family.velocity(x, sigma, cond, 3.0, negative)
        for key, off in (("audio_guidance_scale", 1.0), ("stg_scale", 0.0), ("modality_scale", 1.0)):
            before = getattr(family.options, key)
            setattr(family.options, key, off)
            if key != "audio_guidance_scale":  # audio null or 0 takes the video value
                setattr(family.options, f"audio_{key}", off)
            assert (family.velocity(x, sigma, cond, 3.0, negative) - full).abs().max() > 1e-4, key
            setattr(family.options, key, before)
            if key != "audio_guidance_scale":
                setattr(family.options, f"audio_{key}", before)
        family.options.guidance_rescale = family.options.audio_guidance_rescale = 0.0
        assert (family.velocity(x, sigma, cond, 3.0, negative) - full).abs().max() > 1e-4


def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, ltx2_dir):
    """The exported LoRA loaded by ``LTX2Pipeline.load_lora_weights`` into the base transformer gives
    diffrl's policy's velocity (both streams, conditional and fully guided) to 1e-5."""
    grpo = train_one(ltx2_config(tmp_path / "grpo", ltx2_dir))
    out, ours = export_lora(tmp_path, grpo.checkpoint)
    base = load_family(ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null"}))
    x = torch.randn(2, *base.latent_shape(SIZE, SIZE), generator=torch.Generator().manual_seed(0))
    ours.latent_shape(SIZE, SIZE)  # the flat state's grid
    sigma, cond = torch.tensor([0.9, 0.4]), ours.encode_prompts(["a", "b"])
    negative = ours.negative("", 3.0).repeat(2)
    pipe = base.pipeline()
    pipe.load_lora_weights(str(out))  # into base.transformer, as a user would
    with torch.no_grad():
        for kw in ({}, {"guidance_scale": 3.0, "negative": negative}):
            v_diffusers = base.velocity(x, sigma, cond, module=pipe.transformer, **kw)
            v_ours = ours.velocity(x, sigma, cond, **kw)
            torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=ATOL)
        plain = load_family(ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null"}))
        plain.latent_shape(SIZE, SIZE)
        assert (plain.velocity(x, sigma, cond) - ours.velocity(x, sigma, cond)).abs().max() > 1e-3
    names = [n for n, _ in pipe.transformer.named_modules() if n.endswith("lora_A")]
    for attn in ATTENTIONS:
        assert any(f".{attn}.to_q" in n for n in names), attn  # every attention of both streams
    # --merge: a whole LTX2Pipeline folder with the adapter fused, read back by diffusers
    assert_merged_matches(tmp_path, grpo.checkpoint, base, ours, x, "LTX2Pipeline")


def test_bf16_with_float32_lora_and_gradient_checkpointing_replays_exactly(tmp_path, ltx2_dir):
    """The GPU recipes' memory options: a bfloat16 transformer, Gemma and connectors, the LoRA
    weights in float32, gradient checkpointing, the guidance and log-prob math in float32: the
    replay still equals the rollout exactly."""
    options = "{num_frames: 5, max_sequence_length: 16, stg_blocks: [1], gradient_checkpointing: true, text_encoder_dtype: bfloat16}"
    config = ltx2_config(tmp_path, ltx2_dir, **{"model.dtype": "bfloat16", "model.options": options})
    family = load_family(config)
    assert family.transformer.dtype == torch.bfloat16 and family.text_encoder.dtype == torch.bfloat16
    assert family.connectors.dtype == torch.bfloat16 and family.vae.dtype == torch.float32
    assert family.transformer.is_gradient_checkpointing
    del family
    train_one(config)


def test_stills_encode_to_their_frame_and_silence(tmp_path, ltx2_dir):
    config = ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null"})
    family = load_family(config)
    videos = torch.rand(2, 3, FRAMES, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    x0 = family.encode_images(videos)
    assert x0.shape == (2, *family.latent_shape(SIZE, SIZE))
    _, audio = family.split(x0, family.grid(SIZE, SIZE))
    assert torch.equal(audio[0], audio[1]) and torch.equal(audio[:1], family.silence(5))
    with pytest.raises(ValueError, match="num_frames: 1"):
        family.encode_images(videos[:, :, 0])


def test_bad_options_and_other_folders_are_refused(tmp_path, ltx2_dir):
    bad = "{num_frames: 6, max_sequence_length: 12, stg_blocks: [28], guidance_rescale: 2}"
    with pytest.raises(ConfigError) as e:
        ltx2_config(tmp_path, ltx2_dir, **{"model.options": bad, "sampling.height": 48})
    for problem in (
        "num_frames = 2k + 1",
        "not a multiple of the connectors' 8 learnable registers",
        "not blocks of this 2-block transformer",
        "guidance_rescale must be in [0, 1]",
        "sampling.height=48",
    ):
        assert problem in str(e.value)
    with pytest.raises(ConfigError, match="LTX2Pipeline"):
        ltx2_config(tmp_path, other_pipelines_folder(tmp_path / "flux", "FluxPipeline"))


def test_a_rollouts_sound_reaches_clap_and_an_image_reward_still_scores_the_frames(tmp_path, ltx2_dir):
    """The collector keeps uint8 frames and float16 sound; given to a run's rewards, ``clap`` scores
    the sound (the cosine formula on the tiny CLAP, computed from the rollout's audio) and
    ``brightness`` (an image reward) the frames, one by one, averaged per video. A training
    iteration with both scores every sample (clap would fail them if the sound were not passed)."""
    clap_dir = tmp_path / "clap-htsat-unfused"
    clap = write_clap(clap_dir, seed=1)
    rewards = f"[{{name: clap, params: {{model: '{clap_dir}'}}}}, {{name: {REWARD}}}]"
    config = ltx2_config(tmp_path, ltx2_dir, rewards=rewards)
    family = load_family(config)
    batch = build_collector(config, family, build_algorithm(config).collection_spec()).collect(0)
    assert batch.images.dtype == torch.uint8 and batch.images.shape == (4, 3, FRAMES, SIZE, SIZE)
    audio = batch.audio
    assert audio.waveform.dtype == torch.float16 and audio.waveform.device.type == "cpu"
    assert audio.sample_rate == 16000 and audio.waveform.shape[:2] == (4, 2)
    scorer = RewardSet(config.rewards)
    out = scorer.submit(batch.images, batch.prompts, batch.metadata, batch.audio).result()
    scorer.close()
    assert not out.errors
    expected = formula((clap_dir, clap), scorer.rewards[0], audio.float(), batch.prompts)
    torch.testing.assert_close(out.per_reward["clap"], expected, atol=1e-5, rtol=0)
    frames = batch.images.float() / 255.0
    torch.testing.assert_close(
        out.per_reward[REWARD], frames.mean(dim=(1, 3, 4)).mean(dim=1), atol=1e-6, rtol=0
    )

    m = train_one(config).history[0]
    assert m["rollout/reward/clap/failed"] == 0 and m[f"rollout/reward/{REWARD}/failed"] == 0
    assert math.isfinite(m["rollout/reward/clap/mean"])


def test_sample_writes_an_mp4_with_the_sound(tmp_path, ltx2_dir, capsys):
    """``diffrl sample`` on the tiny LTX-2: ``0000.mp4`` read back by FFmpeg (PyAV) has the frames
    sampled, their size and frame rate, and an AAC track as long as the family's waveform."""
    out = tmp_path / "samples"
    settings = [
        "model.family=ltx2",
        f"model.options={OPTIONS}",
        f"sampling.height={SIZE}",
        f"sampling.width={SIZE * 2}",
    ]
    settings.append("sampling.num_steps=2")
    assert main(["sample", str(ltx2_dir), *settings, "--prompt", "a dog barks", "--out", str(out)]) == 0
    assert "wrote 1 video (.mp4 with sound, frames in NNNN/)" in capsys.readouterr().out
    config, _ = load_target(str(ltx2_dir), settings)
    _, media = generate(load_family(config), config, PromptSet(["a dog barks"]), 1, 0, 1)
    with av.open(str(out / "0000.mp4")) as container:
        [video], [sound] = container.streams.video, container.streams.audio
        assert (video.width, video.height, video.average_rate) == (SIZE * 2, SIZE, 24)
        assert (sound.rate, sound.channels) == (16000, 2)
        seconds = float(sound.duration * sound.time_base)
        # the edit list that trims AAC's padding counts in the movie's timescale, 1/1000 s
        assert abs(seconds - media.audio.seconds) <= 1e-3, (seconds, media.audio.seconds)
        assert sum(1 for _ in container.decode(video=0)) == FRAMES
    assert len(list((out / "0000").glob("frame_*.png"))) == FRAMES


def test_a_flat_state_of_a_size_never_asked_for_or_ambiguous_is_refused(tmp_path, ltx2_dir):
    """The flat state does not say its frame's aspect: the family decodes only sizes it was asked
    for, and refuses a second size with the same number of elements."""
    family = load_family(ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null"}))
    wide = torch.zeros(1, family.grid(SIZE, 2 * SIZE).size)
    with pytest.raises(ValueError, match="call family.latent_shape"):
        family.decode_media(wide)
    family.latent_shape(SIZE, 2 * SIZE)
    assert family.decode_media(wide).images.shape == (1, 3, FRAMES, SIZE, 2 * SIZE)
    with pytest.raises(ValueError, match="cannot tell them apart"):
        family.latent_shape(2 * SIZE, SIZE)


def test_plan_runs_and_its_planned_forward_is_the_familys(tmp_path, ltx2_dir, monkeypatch):
    """``diffrl plan`` on the tiny LTX-2 predicts a positive peak and FLOPs; and the transformer call
    it measures is the family's: the meta-built transformer given the loaded one's weights, on the
    same ``x_t`` and sigmas, gives what :meth:`LTX2Family.forward` gives on zero conditioning of the
    shapes :meth:`_encode_prompts` produces (both streams, the grid of 5 frames at 32 x 32)."""
    from diffrl.core.rollout import Conditioning
    from diffrl.models.ltx2 import LTX2Family
    from diffrl.plan.planner import plan

    # a full fine-tune of the conditional velocity: the fewest modules and rows for torch's trackers
    config = ltx2_config(tmp_path, ltx2_dir, **{"model.lora": "null", "sampling.guidance_scale": 1.0})
    result = plan(config, build_algorithm(config))
    assert result.memory.peak > 0 and result.memory.activations > 0
    assert result.forward_flops_per_sample > 0 and result.train_flops > 0

    family = load_family(config)
    planned = LTX2Family.description.planned(config, ltx2_dir)
    assert planned.latent_shape == family.latent_shape(SIZE, SIZE)
    assert not planned.module.is_gradient_checkpointing
    module = planned.module.to_empty(device="cpu")
    module.load_state_dict(family.transformer.state_dict())
    x = torch.randn(2, *planned.latent_shape, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.4])

    seen: dict[str, torch.Tensor] = {}  # the conditioning the planned forward makes
    call = LTX2Family.call_transformer

    def spy(module, x_t, sigma, tensors, *args, **kwargs):
        seen.update(tensors)
        return call(module, x_t, sigma, tensors, *args, **kwargs)

    monkeypatch.setattr(LTX2Family, "call_transformer", staticmethod(spy))
    with torch.no_grad():
        v_planned = planned.forward(module, x, sigma)
    monkeypatch.undo()
    encoded = family.encode_prompts(["a dog barks", "rain"]).tensors
    assert {k: (v.shape, v.dtype) for k, v in seen.items()} == {
        k: (v.shape, v.dtype) for k, v in encoded.items()
    }
    assert torch.equal(seen["encoder_attention_mask"], torch.ones_like(encoded["encoder_attention_mask"]))
    zeros = {k: torch.zeros_like(v) for k, v in encoded.items()}
    zeros["encoder_attention_mask"] = seen["encoder_attention_mask"]
    with torch.no_grad():
        v_family = family.forward(family.transformer, x, sigma, Conditioning(zeros))
    assert v_planned.shape == v_family.shape == x.shape
    torch.testing.assert_close(v_planned, v_family, rtol=0, atol=1e-6)

    checkpointed = ltx2_config(
        tmp_path, ltx2_dir, **{"model.options": OPTIONS[:-1] + ", gradient_checkpointing: true}"}
    )
    assert LTX2Family.description.planned(checkpointed, ltx2_dir).module.is_gradient_checkpointing
