"""The ``wan`` family on tiny random Wan 2.1 (one transformer) and Wan 2.2 A14B-style (two experts,
``boundary_ratio``) models written to temp dirs by ``WanPipeline.save_pretrained`` (the path a
user's folder takes): ODE sampling equals ``WanPipeline`` with ``FlowMatchEulerDiscreteScheduler``,
rows of mixed experts are routed, Flow-GRPO replays exactly and trains both experts, DiffusionNFT
runs, the exported LoRA loads into the pipeline, and a checkpoint of another family is refused."""

from __future__ import annotations

import os

import av
import pytest
import torch

from diffrl.cli import main
from diffrl.core.rollout import Conditioning
from diffrl.models.registry import load_family
from diffrl.models.tiny import build_tokenizer
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration import tiny_parts
from tests.integration.family_checks import (
    Family,
    FamilyChecks,
    export_lora,
    family_config,
    other_pipelines_folder,
    pipeline_latents,
    settings,
    tiny_folder,
    train_one,
)
from tests.ranks import run_ranks

SIZE = 32  # pixels: the VAE divides by 8, patch 2 -> 2 x 2 tokens per latent frame
FRAMES = 5  # -> 2 latent frames
BOUNDARY = 0.7  # with shift 3: sigmas 1, .86 | .6, .003 (4 steps), 1, .86 | .6 (3 steps): both experts work
ATOL = 1e-5  # float32 on CPU


def write_tiny_wan(path, two_experts: bool, **transformer) -> None:
    """A random Wan with every part of the real one, sized for a CPU, saved by the pipeline
    (``transformer``: each expert's settings over the tiny ones)."""
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline
    from transformers import UMT5EncoderModel

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    umt5 = UMT5EncoderModel(tiny_parts.t5_config(len(tokenizer), d_model=32, d_ff=32, umt5=True))

    # the real 16-channel latent statistics (AutoencoderKLWan's defaults) on a 3-wide VAE
    vae = AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1)
    WanPipeline(
        tokenizer=tokenizer,
        text_encoder=umt5,
        vae=vae,
        # what Wan folders ship; diffrl reads its flow_shift
        scheduler=UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, num_train_timesteps=1000, flow_shift=3.0
        ),
        transformer=tiny_parts.wan_transformer(**transformer),
        transformer_2=tiny_parts.wan_transformer(**transformer) if two_experts else None,
        boundary_ratio=BOUNDARY if two_experts else None,
    ).save_pretrained(path)


wan21_dir = tiny_folder("wan21_dir", write_tiny_wan, two_experts=False)
wan22_dir = tiny_folder("wan22_dir", write_tiny_wan, two_experts=True)


def wan_config(tmp_path, wan_dir, **extra):
    """All 3 steps trained (both experts); the reward is an image reward: each video is scored
    frame by frame, then averaged."""
    family = settings("wan", wan_dir, f"{{num_frames: {FRAMES}, max_sequence_length: 16}}", 5.0, SIZE)
    return family_config(tmp_path, {**family, "algorithm.params": "{step_strategy: {name: all}}"}, **extra)


class TestFamilyChecks(FamilyChecks):
    """The shared checks on Wan 2.2 (both experts); SFT on still images (``num_frames: 1``)."""

    case = Family(wan_config, "wan22_dir", sft={"model.options": "{num_frames: 1, max_sequence_length: 16}"})


@pytest.mark.parametrize("version", ["2.1", "2.2"])
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, wan21_dir, wan22_dir, version):
    """Same noise, prompts, steps, size, frames and CFG (negative prompt ""): diffrl's ODE sampler
    and ``WanPipeline`` with ``FlowMatchEulerDiscreteScheduler(shift=flow_shift)`` give the same
    latents to 1e-5 (float32, CPU); 2.2 switches experts between steps 1 and 2, as the pipeline."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    folder = wan21_dir if version == "2.1" else wan22_dir
    cfg = wan_config(tmp_path, folder, **{"model.lora": "null", "model.options": f"{{num_frames: {FRAMES}}}"})
    family = load_family(cfg)
    assert family.default_shift == 3.0 and family.options.max_sequence_length == 512
    assert len(family.transformer.experts) == (1 if version == "2.1" else 2)
    prompts = ['the word "cat"', '  a  <b>dog</b> &amp; "42" ']  # prompt_clean: html and spaces
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    assert noise.shape == (2, 16, 2, SIZE // 8, SIZE // 8)
    cond = family.encode_prompts(prompts)
    negative = family.encode_prompts([""]).repeat(2)
    ours = sample_ode(family, noise, cond, family.sigmas(4, None, SIZE, SIZE), 5.0, negative)
    pipe = family.pipeline()
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=family.default_shift)
    call = dict(prompt=prompts, negative_prompt="", guidance_scale=5.0, num_frames=FRAMES)
    theirs = pipeline_latents(pipe, noise.clone(), 4, SIZE, **call).frames
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)
    videos = family.decode(ours)
    assert videos.shape == (2, 3, FRAMES, SIZE, SIZE) and videos.min() >= 0 and videos.max() <= 1
    with torch.no_grad():  # the pipeline's own decode (output_type="pt") from the same latents
        frames = pipe(
            prompt_embeds=cond.tensors["encoder_hidden_states"],
            guidance_scale=1.0,
            latents=ours.clone(),
            num_inference_steps=1,
            num_frames=FRAMES,
            height=SIZE,
            width=SIZE,
            output_type="pt",
            callback_on_step_end=lambda p, i, t, kw: {"latents": ours.clone()},
        ).frames
    torch.testing.assert_close(videos, frames.transpose(1, 2).float(), rtol=0, atol=ATOL)
    x0 = family.encode_images(videos)
    assert x0.shape == ours.shape
    with pytest.raises(ValueError, match="num_frames: 1"):  # stills would train one frame of a video
        family.encode_images(videos[:, :, 0])


def test_per_token_timesteps_match_the_pipeline(tmp_path, wan21_dir):
    """``expand_timesteps`` (Wan 2.2 TI2V-5B's ``WanPipeline``): one timestep per token, as there."""
    from diffusers import FlowMatchEulerDiscreteScheduler

    family = load_family(wan_config(tmp_path, wan21_dir, **{"model.lora": "null"}))
    family.expand_timesteps = True
    pipe = family.pipeline()
    pipe.register_to_config(expand_timesteps=True)
    pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=family.default_shift)
    noise = initial_noise(family, [(0, "test", 0)], SIZE, SIZE)
    cond = family.encode_prompts(["a"])
    shapes = []  # every token has the same t here, so the numbers alone cannot tell: check the shape
    hook = family.transformer.transformer.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["timestep"].shape)), with_kwargs=True
    )
    ours = sample_ode(family, noise, cond, family.sigmas(2, None, SIZE, SIZE))
    hook.remove()
    tokens = noise[0, 0, :, ::2, ::2].numel()  # latent frames x (H/2) x (W/2) patches
    assert shapes == [(1, tokens)] * 2
    call = dict(prompt_embeds=cond.tensors["encoder_hidden_states"], guidance_scale=1.0, num_frames=FRAMES)
    theirs = pipeline_latents(pipe, noise.clone(), 2, SIZE, **call).frames
    torch.testing.assert_close(ours, theirs, rtol=0, atol=ATOL)


def test_rows_of_both_experts_are_routed_to_their_own(tmp_path, wan22_dir):
    """A batch whose rows straddle the boundary equals each row through its own expert."""
    family = load_family(wan_config(tmp_path, wan22_dir, **{"model.lora": "null"}))
    experts = family.transformer
    x = torch.randn(3, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    sigma = torch.tensor([0.9, 0.3, BOUNDARY])  # high, low, high (t >= boundary is the high expert)
    cond = family.encode_prompts(["a", "b", "c"])
    with torch.no_grad():
        mixed = family.forward(experts, x, sigma, cond)
        for i, expert in enumerate([experts.transformer, experts.transformer_2, experts.transformer]):
            alone = family.forward(expert, x[i : i + 1], sigma[i : i + 1], cond.select([i]))
            torch.testing.assert_close(mixed[i : i + 1], alone, rtol=0, atol=ATOL)


def test_flow_grpo_trains_both_experts_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, wan22_dir):
    from safetensors.torch import load_file

    grpo = train_one(wan_config(tmp_path / "grpo", wan22_dir))
    lora = load_file(str(grpo.checkpoint / "trainable.safetensors"))
    for expert in ("transformer.", "transformer_2."):  # lora_B starts at 0: moved iff it had gradient
        moved = [v.abs().max().item() for k, v in lora.items() if k.startswith(expert) and "lora_B" in k]
        assert moved and max(moved) > 0, expert
    _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, wan22_dir, grpo.checkpoint)


def test_other_folders_and_bad_options_are_refused(tmp_path, wan21_dir):
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError, match="WanPipeline"):
        wan_config(tmp_path, other_pipelines_folder(tmp_path / "other", "FluxPipeline"))
    with pytest.raises(ConfigError, match="num_frames = 4k"):
        wan_config(tmp_path, wan21_dir, **{"model.options": "{num_frames: 6}"})


def _exported_lora_loads_into_the_diffusers_pipeline(tmp_path, wan_dir, checkpoint):
    """``diffrl export`` writes each expert's LoRA as diffusers reads it: ``load_lora_weights``
    (``load_into_transformer_2=True`` for the low-noise expert) on the base pipeline gives the
    velocity of diffrl's policy with that LoRA, at a high- and a low-noise sigma (to 1e-5)."""
    out, ours = export_lora(tmp_path, checkpoint)
    base = load_family(wan_config(tmp_path, wan_dir, **{"model.lora": "null"}))
    x = torch.randn(2, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    cond = ours.encode_prompts(["a", "b"])
    pipe = base.pipeline()
    pipe.load_lora_weights(str(out))  # into base's experts, as a user would
    pipe.load_lora_weights(str(out / "transformer_2"), load_into_transformer_2=True)
    for s, expert in ((0.9, pipe.transformer), (0.3, pipe.transformer_2)):
        sigma = torch.tensor([s, s])
        with torch.no_grad():
            v_diffusers = base.forward(expert, x, sigma, cond).float()
            v_ours = ours.velocity(x, sigma, cond)
        torch.testing.assert_close(v_diffusers, v_ours, rtol=0, atol=ATOL)
    # the adapters changed both experts' velocities: they were applied
    plain = load_family(wan_config(tmp_path, wan_dir, **{"model.lora": "null"}))
    for s in (0.9, 0.3):
        sigma = torch.tensor([s, s])
        with torch.no_grad():
            assert (plain.velocity(x, sigma, cond) - ours.velocity(x, sigma, cond)).abs().max() > 1e-3
    # --merge: a whole WanPipeline folder with both adapters fused into their experts
    from diffrl.cli import main

    merged = tmp_path / "merged"
    assert main(["export", str(checkpoint), str(merged), "--merge"]) == 0
    fused = load_family(wan_config(tmp_path, merged, **{"model.lora": "null"}))
    for s in (0.9, 0.3):
        sigma = torch.tensor([s, s])
        with torch.no_grad():
            torch.testing.assert_close(
                fused.velocity(x, sigma, cond), ours.velocity(x, sigma, cond), rtol=0, atol=ATOL
            )


def test_conditioning_is_one_tensor(tmp_path, wan21_dir):
    family = load_family(wan_config(tmp_path, wan21_dir, **{"model.lora": "null"}))
    cond = family.encode_prompts(["ab", "abcd"])
    assert isinstance(cond, Conditioning) and list(cond.tensors) == ["encoder_hidden_states"]
    h = cond.tensors["encoder_hidden_states"]
    # <bos> a b <eos> = 4 tokens, then zeros to max_sequence_length (16)
    assert h.shape == (2, 16, 32) and h[0, 4:].abs().max() == 0 and h[0, :4].abs().amax(-1).min() > 0
    assert h[1, 6:].abs().max() == 0 and h[1, 5].abs().max() > 0


def test_fsdp_ranks_holding_rows_of_different_experts_match_one_process(tmp_path, wan22_dir):
    """FSDP2 on 2 gloo ranks: whichever rows (of which expert) each rank holds, the LoRA gradients
    equal one process's on the whole batch (to 1e-6; measured <= 2e-8 of a 0.07 scale). Without
    the ranks agreeing on the experts, rank 0 all-gathers one expert's blocks while rank 1 gathers
    the other's: same shapes, so gloo pairs them silently and the gradients are wrong."""
    from diffrl.core.parallel import free_port

    family = _fsdp_family(wan22_dir, tmp_path)
    x, sigma, cond = _fsdp_batch(family)
    family.velocity(x, sigma, cond).square().mean().backward()
    expected = _lora_grads(family)
    splits = [[[0, 1], [2, 3]], [[0, 2], [1, 3]], [[3], [0, 1, 2]]]
    # one pair of forked rank processes runs every split (a fresh sharded model each)
    run_ranks(_fsdp_rank, splits, wan22_dir, tmp_path, free_port())
    for i, split in enumerate(splits):
        got = torch.load(tmp_path / f"grads_{i}.pt")
        assert got.keys() == expected.keys()
        for k, g in expected.items():
            torch.testing.assert_close(got[k], g, rtol=0, atol=1e-6, msg=f"{k} with rows {split}")


def _fsdp_family(wan_dir, tmp_path):
    from diffrl.config import LoraConfig
    from diffrl.train.actor import apply_lora

    family = load_family(wan_config(tmp_path, wan_dir, **{"model.lora": "null"}))
    apply_lora(family, LoraConfig(rank=4))
    with torch.no_grad():  # the same weights in every process; non-zero B: every matrix gets gradient
        gen = torch.Generator().manual_seed(0)
        for name, p in family.transformer.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return family


def _fsdp_batch(family):
    """Rows 0, 1 belong to the high-noise expert, rows 2, 3 to the low-noise one."""
    x = torch.randn(4, 16, 2, 4, 4, generator=torch.Generator().manual_seed(0))
    return x, torch.tensor([0.9, 0.8, 0.3, 0.2]), family.encode_prompts(["a", "b", "c", "d"])


def _lora_grads(family) -> dict[str, torch.Tensor]:
    from diffrl.core.parallel import full_tensor

    return {n: full_tensor(p.grad).clone() for n, p in family.transformer.named_parameters() if "lora_" in n}


def _fsdp_rank(rank, splits, wan_dir, tmp_path, port):
    """Rank ``rank`` of 2: for each split, a freshly sharded model's LoRA gradients on the rows
    ``split[rank]`` (rank 0 saves them as ``grads_<i>.pt``)."""
    from diffrl.core.parallel import init_distributed, shard_module

    init_distributed(rank, 2, "127.0.0.1", port, "gloo", torch.device("cpu"))
    for i, split in enumerate(splits):
        family = _fsdp_family(wan_dir, tmp_path)
        shard_module(family.transformer, family.description.fsdp_blocks(family.transformer))
        x, sigma, cond = _fsdp_batch(family)
        rows = split[rank]
        v = family.velocity(x[rows], sigma[rows], cond.select(rows))
        # this rank's share of the whole batch's mean; FSDP averages the gradients over the 2 ranks
        (v.square().mean() * len(rows) / len(x) * 2).backward()
        grads = _lora_grads(family)  # a collective: both ranks gather
        if rank == 0:
            torch.save(grads, tmp_path / f"grads_{i}.pt")
    torch.distributed.destroy_process_group()
    # skip the interpreter's teardown: gloo's threads racing C++ static destructors there have
    # aborted a child ("terminate called without an active exception") after its work was done
    os._exit(0)


def test_sample_writes_each_video_as_an_mp4_and_its_frames(tmp_path, wan21_dir, capsys):
    """``diffrl sample`` on a video family: ``NNNN.mp4`` (H.264, Wan's 16 fps, no sound track) that
    a decoder reads back with the frame count and size sampled, and the frames as PNGs."""
    out = tmp_path / "samples"
    args = [
        "sample",
        str(wan21_dir),
        "model.family=wan",
        f"model.options={{num_frames: {FRAMES}, max_sequence_length: 16}}",
    ]
    sizes = [f"sampling.height={SIZE}", f"sampling.width={SIZE * 2}", "sampling.num_steps=2"]
    assert main([*args, *sizes, "--prompt", "ab", "--out", str(out)]) == 0
    assert "wrote 1 video (.mp4, frames in NNNN/)" in capsys.readouterr().out
    with av.open(str(out / "0000.mp4")) as container:
        [video] = container.streams.video
        assert not container.streams.audio
        assert (video.width, video.height, video.average_rate) == (SIZE * 2, SIZE, 16)
        assert sum(1 for _ in container.decode(video=0)) == FRAMES
    assert sorted(p.name for p in (out / "0000").iterdir()) == [f"frame_{i:04d}.png" for i in range(FRAMES)]


def test_sequence_parallel_lengths_that_do_not_split_are_config_errors(tmp_path, wan21_dir):
    """``parallel.sequence: 4``: 5 frames of 48 x 48 are 2 x 3 x 3 = 18 video tokens, and the
    tiny transformer has 2 heads; neither splits over 4 ranks (diffusers would assert mid-forward)."""
    from diffrl.config import ConfigError

    sp = {"runner": "ray", "parallel.trainer_ranks": 4, "parallel.sequence": 4}
    with pytest.raises(ConfigError) as e:
        wan_config(tmp_path, wan21_dir, **sp, **{"sampling.height": 48, "sampling.width": 48})
    msg = str(e.value)
    assert "parallel.sequence=4: the wan model's video tokens (18) do not split over 4 ranks" in msg
    assert "the wan model's attention heads (2) do not split over 4 ranks" in msg
    # 2 ranks: 18 tokens and 2 heads split
    assert (
        wan_config(
            tmp_path,
            wan21_dir,
            **{
                **sp,
                "parallel.trainer_ranks": 2,
                "parallel.sequence": 2,
                "sampling.height": 48,
                "sampling.width": 48,
            },
        ).parallel.sequence
        == 2
    )


def test_plan_of_sequence_parallel_ranks_holds_less_activation_per_rank(tmp_path, wan22_dir):
    """``diffrl plan`` of a long tiny Wan 2.2 clip (33 frames at 128 x 128: 9 x 8 x 8 = 576 tokens)
    on 2 FSDP2 ranks: split over the 2 ranks' sequence (Ulysses), a rank holds the same shards and
    less activation memory (the patch embedding, rope, text cross-attention's keys and the gathered
    output stay whole: measured 0.57x)."""
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.plan.planner import plan

    def planned(sp: int):
        options = {"model.options": "{num_frames: 33, max_sequence_length: 16}", "sampling.height": 128}
        ray = {"runner": "ray", "parallel.trainer_ranks": 2, "parallel.sequence": sp}
        cfg = wan_config(tmp_path, wan22_dir, **ray, **options, **{"sampling.width": 128})
        return plan(cfg, build_algorithm(cfg)).memory

    one, two = planned(1), planned(2)
    assert two.parameters == one.parameters and two.optimizer == one.optimizer > 0
    assert 0.4 < two.activations / one.activations < 0.7
