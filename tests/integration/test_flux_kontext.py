"""The ``flux_kontext`` family on a tiny random FLUX.1 Kontext written to a temp dir by
``FluxKontextPipeline.save_pretrained``: faithful to the pipeline with source images (distilled
guidance, true CFG, the preferred-resolution resize), Flow-GRPO, DiffusionNFT, AWM and SFT (on edit
pairs) iterations, rewards that see the source, the exported LoRA, and a tiny checkpoint refused."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest
import torch
from diffusers.pipelines.flux import pipeline_flux_kontext
from PIL import Image

from diffrl.data.prompts import load_source
from diffrl.models.flux import pack, unpack
from diffrl.models.registry import load_family
from diffrl.sampling.sampler import initial_noise, sample_ode
from tests.integration.family_checks import (
    Family,
    FamilyChecks,
    assert_does_not_split,
    assert_exported_lora_matches,
    assert_plan_runs,
    assert_planned_is_the_familys,
    edit_config,
    pretend_sequence_ranks,
    settings,
    tiny_folder,
    train_one,
)
from tests.integration.test_flux import write_tiny_flux

SIZE = 16  # pixels: 8 x 8 latents, 16 noisy tokens; a 16 px source adds 16 more
TINY_RESOLUTIONS = [(32, 32), (48, 16), (16, 48)]
"""Kontext's preferred resolutions scaled down for a CPU (the real ones are ~1 megapixel)."""


kontext_dir = tiny_folder("kontext_dir", write_tiny_flux, pipeline="FluxKontextPipeline")


def kontext_config(tmp_path, folder, options="{max_sequence_length: 16, auto_resize: false}", **extra):
    return edit_config(tmp_path, settings("flux_kontext", folder, options, 1.0, SIZE), SIZE, **extra)


class TestFamilyChecks(FamilyChecks):
    """The shared checks on the tiny Kontext (SFT on edit pairs)."""

    case = Family(kontext_config, "kontext_dir", edits=True)


def write_sources(tmp_path, shape=(SIZE, SIZE)):
    """Two different source images of ``shape`` (h, w), as PNG files."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(3)
    paths = []
    for k in range(2):
        pixels = (torch.rand(*shape, 3, generator=gen) * 255).to(torch.uint8).numpy()
        paths.append(tmp_path / f"source_{k}.png")
        Image.fromarray(pixels).save(paths[-1])
    return paths


@pytest.mark.parametrize(
    "auto_resize, true_cfg",
    [(False, 1.0), (False, 2.0), (True, 1.0)],
    ids=["own_size", "true_cfg", "preferred"],
)
def test_ode_sampling_matches_the_diffusers_pipeline(
    tmp_path, kontext_dir, monkeypatch, auto_resize, true_cfg
):
    """Same noise, prompts, source images, steps, size and guidance: diffrl's ODE sampler gives
    ``FluxKontextPipeline``'s latents to 1e-5 (float32, CPU), with the source at its own size, with
    true CFG, and resized to the preferred resolution nearest its aspect (the list scaled down:
    both read the pipeline module's)."""
    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", TINY_RESOLUTIONS)
    options = f"{{max_sequence_length: 16, auto_resize: {str(auto_resize).lower()}}}"
    family = load_family(kontext_config(tmp_path, kontext_dir, options, **{"model.lora": "null"}))
    paths = write_sources(tmp_path)
    sources = [load_source(p, SIZE, SIZE) for p in paths]
    prompts = ['replace the number with "12"', 'replace the number with "345"']
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], SIZE, SIZE)
    sigmas = family.sigmas(4, None, SIZE, SIZE)
    cond = family.encode_prompts(prompts, sources)
    expected = (32 // 2) if auto_resize else (SIZE // 2)  # latent side of the source
    assert cond.tensors["image_latents"].shape == (2, 4, expected, expected)
    negative = family.negative(" ", true_cfg, cond)
    ours = sample_ode(family, noise, cond, sigmas, true_cfg, negative)

    cfg = {"true_cfg_scale": true_cfg, "negative_prompt": " "} if true_cfg > 1 else {}
    packed = family.pipeline()(
        image=[Image.open(p).convert("RGB") for p in paths],
        prompt=prompts,
        latents=pack(noise.clone()),
        num_inference_steps=4,
        height=SIZE,
        width=SIZE,
        max_area=SIZE * SIZE,  # else the pipeline rescales the output to 1024^2
        max_sequence_length=16,
        guidance_scale=3.5,
        output_type="latent",
        _auto_resize=auto_resize,
        **cfg,
    ).images
    theirs = unpack(packed, *noise.shape[-2:])
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    # the source conditions the result: another source, another edit
    other = family.encode_prompts(prompts, sources[::-1])
    assert (
        sample_ode(family, noise, other, sigmas) - sample_ode(family, noise, cond, sigmas)
    ).abs().max() > 1e-3


def test_sources_of_different_sizes_are_refused_before_loading_and_when_given(tmp_path, kontext_dir):
    """Rows are batched, so a run's sources must resize to one size: preflight reads the image
    headers (a prompt file with a 16 px and a 32 px image is refused at its own size, accepted
    when both go to one preferred resolution); sources given directly are refused as they come."""
    import json

    from diffrl.config import ConfigError
    from diffrl.core.errors import DiffrlError

    small, big = write_sources(tmp_path)[0], write_sources(tmp_path / "big", (32, 32))[0]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        "".join(
            json.dumps({"prompt": f'write "{k}"', "image": str(p)}) + "\n" for k, p in enumerate([small, big])
        )
    )
    with pytest.raises(ConfigError, match=r"resize to different sizes .* to \(16, 16\), .* to \(32, 32\)"):
        kontext_config(tmp_path, kontext_dir, **{"data.prompts": str(mixed)})
    kontext_config(
        tmp_path, kontext_dir, "{auto_resize: true}", **{"data.prompts": str(mixed)}
    )  # both 1024^2
    family = load_family(kontext_config(tmp_path, kontext_dir, **{"model.lora": "null"}))
    family.encode_prompts(["a"], [load_source(small, SIZE, SIZE)])
    with pytest.raises(DiffrlError, match="need one size"):  # a user's error (exit 2), not a bug
        family.encode_prompts(["a"], [load_source(big, SIZE, SIZE)])


def source_distance(images, prompts, metadata):
    """An edit-fidelity reward of the kind the source in the metadata is for: minus the mean
    absolute pixel difference between the result and its source (uint8, laid out as the result).
    It checks that each row got its own prompt's source: the file the prompt set names for it,
    with that file's pixels."""
    import json
    from pathlib import Path

    out = []
    for image, prompt, meta in zip(images, prompts, metadata):
        source, file = meta["source_image"], Path(meta["source_file"])
        rows = [json.loads(line) for line in (file.parent.parent / "prompts.jsonl").read_text().splitlines()]
        assert {r["prompt"]: r["image"] for r in rows}[prompt] == f"images/{file.name}", (prompt, file)
        assert torch.equal(source, load_source(file, SIZE, SIZE).resized(*image.shape[-2:]))
        assert source.dtype == torch.uint8 and source.shape == image.shape, (source.shape, image.shape)
        out.append(-(image.float() - source.float() / 255).abs().mean().item())
    return out


def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(
    tmp_path, kontext_dir, monkeypatch
):
    """Rewards get each sample's source (``metadata["source_image"]``), in rollouts and in eval,
    whose grid pairs source | result (as ``diffrl sample --image`` does); the exported LoRA, loaded
    by ``FluxKontextPipeline.load_lora_weights``, gives diffrl's velocity."""
    from diffrl.cli import main

    reward = "[{name: tests.integration.test_flux_kontext:source_distance}]"
    evals = {"eval.enabled": "true", "eval.num_prompts": 3, "eval.rewards": reward, "eval.grid_images": 3}
    grpo = train_one(kontext_config(tmp_path / "grpo", kontext_dir, rewards=reward, **evals))
    assert grpo.history[0]["rollout/reward/raw_mean"] < 0  # scored against the sources
    assert grpo.evals[-1]["eval/reward_mean"] < 0
    grid = Image.open(tmp_path / "grpo" / "run" / "eval" / "step_00001.png")
    assert grid.width == 6 * (SIZE + 2) * 2 and grid.height > (SIZE + 2) * 2  # 3 pairs x2, captioned
    first = (tmp_path / "grpo" / "edits" / "images" / "0000.png").resolve()  # eval prompt 0's source
    cell = torch.from_numpy(np.array(grid))[2 : 2 + 2 * SIZE : 2, 2 : 2 + 2 * SIZE : 2].permute(2, 0, 1)
    assert torch.equal(cell, load_source(first, SIZE, SIZE).pixels)  # the grid's first cell
    paths = write_sources(tmp_path)
    monkeypatch.chdir(tmp_path)
    argv = ["sample", str(grpo.checkpoint), "--prompt", "a", "--image", paths[0].name, "--out", "samples"]
    assert main(argv) == 0
    sampled = Image.open(tmp_path / "samples" / "grid.png")
    assert sampled.width == 2 * (SIZE + 2) * 2 and sampled.height > (SIZE + 2) * 2  # one pair, captioned
    assert main(["sample", str(grpo.checkpoint), "--prompt", "a", "--out", "samples2"]) == 2  # no image
    base = load_family(kontext_config(tmp_path, kontext_dir, **{"model.lora": "null"}))
    sources = [load_source(p, SIZE, SIZE) for p in write_sources(tmp_path)]
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(0))
    assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x, sources=sources)


def test_prompts_without_images_and_text_datasets_are_refused_before_loading(tmp_path, kontext_dir):
    from diffrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        kontext_config(tmp_path, kontext_dir, **{"data.prompts": "builtin:tiny_text/train.txt"})
    assert "data.prompts: model family 'flux_kontext' edits images" in str(e.value)
    sft = {
        "algorithm.name": "sft",
        "algorithm.params": "{}",
        "data.dataset": "synthetic_text",
        "rewards": "[]",
    }
    with pytest.raises(ConfigError, match="data.dataset=synthetic_edit"):
        kontext_config(tmp_path, kontext_dir, **sft)


def test_offline_preference_pairs_are_refused_for_an_editing_family(tmp_path, kontext_dir):
    from diffrl.config import ConfigError

    dpo = {"algorithm.name": "dpo", "algorithm.params": "{pairs: offline}", "data.dataset": str(tmp_path)}
    with pytest.raises(ConfigError, match="a folder of preference pairs has no source images"):
        kontext_config(tmp_path, kontext_dir, **dpo)


def test_sequence_parallel_lengths_that_do_not_split_are_errors(tmp_path, kontext_dir):
    """``parallel.sequence: 3``: with ``auto_resize`` the image tokens are the 16 noisy ones and
    the 1024 x 1024 source's 65536 (the tiny VAE halves, 2 x 2 packing), 65552, which with the 16
    T5 tokens and 2 heads do not split over 3 ranks; without, a source keeps its own size, so its
    tokens are counted at the forward: 16 + 16 refused there, before diffusers' assert."""
    from diffrl.models.base import SourceError

    auto = partial(
        kontext_config, tmp_path, kontext_dir, options="{max_sequence_length: 16, auto_resize: true}"
    )
    lengths = (
        "image tokens (65552)",
        "text tokens (model.options.max_sequence_length) (16)",
        "attention heads (2)",
    )
    assert_does_not_split(auto, "flux_kontext", *lengths)
    msg = assert_does_not_split(
        partial(kontext_config, tmp_path, kontext_dir), "flux_kontext", "attention heads (2)"
    )
    assert "image tokens" not in msg
    family = load_family(kontext_config(tmp_path, kontext_dir, **{"model.lora": "null"}))
    sources = [load_source(p, SIZE, SIZE) for p in write_sources(tmp_path / "sources")]
    cond = family.encode_prompts(["a", "b"], sources)
    pretend_sequence_ranks(family.transformer, 3)
    with pytest.raises(
        SourceError,
        match=r"16 output tokens and 16 source tokens \(16x16 px\) do not split over parallel.sequence=3",
    ):
        family.velocity(torch.zeros(2, 4, 8, 8), torch.tensor([0.9, 0.4]), cond)


@pytest.mark.parametrize("auto_resize", [False, True], ids=["own_size", "preferred"])
def test_plan_runs_the_familys_own_transformer_and_forward(tmp_path, kontext_dir, monkeypatch, auto_resize):
    """``diffrl plan`` of the tiny Kontext with ``auto_resize`` (the recipe's) runs, and the planned
    forward is the family's, the sources' tokens after the 16 noisy ones: resized to the preferred
    resolution nearest the output's aspect (the tiny 32 x 32: 64 tokens), or, without
    ``auto_resize``, of the output's size (what the plan assumes then: 16 tokens)."""
    monkeypatch.setattr(pipeline_flux_kontext, "PREFERRED_KONTEXT_RESOLUTIONS", TINY_RESOLUTIONS)
    options = f"{{max_sequence_length: 16, auto_resize: {str(auto_resize).lower()}}}"
    config = kontext_config(tmp_path, kontext_dir, options)
    if auto_resize:
        assert_plan_runs(config)
    sources = [load_source(p, SIZE, SIZE) for p in write_sources(tmp_path / "sources")]
    assert_planned_is_the_familys(config, kontext_dir, sources)
