"""The ``qwen_image_edit`` family on tiny random Qwen-Image-Edit folders written to a temp dir in
diffusers layout (the path a user's folder takes): faithful to ``QwenImageEditPlusPipeline`` (2509;
2511's ``zero_cond_t``; with and without true CFG) and ``QwenImageEditPipeline``, the exported
LoRA, and a checkpoint of another family, bad folders and bad options refused."""

from __future__ import annotations

import contextlib
import json
import shutil
from functools import partial

import numpy as np
import pytest
import torch
from PIL import Image

from diffrl.config import ConfigError
from diffrl.data.prompts import load_source
from diffrl.models import qwen_image_edit
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
    train_one,
)
from tests.integration.test_qwen_image import qwen_image_parts
from tests.integration.tiny_parts import byte_tokenizer

HEIGHT, WIDTH = 16, 24  # the output: the tiny VAE halves it to 8 x 12 latents, packed 2 x 2 -> 24 tokens
CONDITION_AREA = 32 * 32  # the VL picture of a 2:3 source: 32 x 32 px (sides rounded to 32), 4 x 4 tokens
VAE_AREA = 48 * 48  # the reference of a 2:3 source: 64 x 32 px (w x h) -> 16 x 32 latents, 128 tokens
TEXT_TOKENS = 512  # the byte-level tokenizer leaves ~330 tokens of the template after the drop
PATCH = 4  # the tiny vision encoder's patch (x merge 2: the processor rounds sides to 8 px)
OPTIONS = f"{{max_sequence_length: {TEXT_TOKENS}, condition_image_area: {CONDITION_AREA}, vae_image_area: {VAE_AREA}}}"
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
VARIANTS = {  # folder name: (pipeline class, transformer's zero_cond_t)
    "2509": ("QwenImageEditPlusPipeline", False),
    "2511": ("QwenImageEditPlusPipeline", True),
    "v1": ("QwenImageEditPipeline", False),
}


def build_tokenizer():
    """A byte-level tokenizer with the chat template's and the vision prompt's special tokens, as
    the real tokenizer treats them."""
    return byte_tokenizer(["<|endoftext|>"], SPECIAL)


def write_tiny_qwen_image_edit(path, pipeline_class: str, zero_cond_t: bool) -> None:
    """A random Qwen-Image-Edit with every part of the real one, sized for a CPU, saved by the
    pipeline (without a processor object, which transformers 5 cannot build without torchvision;
    its parts are written as ``Qwen2VLProcessor`` lays them out)."""
    import diffusers
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    torch.manual_seed(0)
    tokenizer = build_tokenizer()
    ids = {
        name: tokenizer.convert_tokens_to_ids(f"<|{token}|>")
        for name, token in [
            ("image_token_id", "image_pad"),
            ("video_token_id", "video_pad"),
            ("vision_start_token_id", "vision_start"),
            ("vision_end_token_id", "vision_end"),
        ]
    }
    vision = dict(patch_size=PATCH, window_size=16)
    parts = qwen_image_parts(tokenizer, 1024, vision, ids, zero_cond_t=zero_cond_t)
    getattr(diffusers, pipeline_class)(**parts, processor=None).save_pretrained(path)
    images = Qwen2VLImageProcessorPil(patch_size=PATCH, merge_size=2, min_pixels=8 * 8, max_pixels=64 * 64)
    qwen_image_edit.write_processor(path, images, tokenizer)


@pytest.fixture(scope="module")
def edit_dirs(tmp_path_factory):
    """``edit_dirs(name)``: the tiny folder of :data:`VARIANTS` ``name``, written on first use."""
    made = {}

    def get(name: str):
        if name not in made:
            made[name] = tmp_path_factory.mktemp(f"tiny_qwen_image_edit_{name}")
            write_tiny_qwen_image_edit(made[name], *VARIANTS[name])
        return made[name]

    return get


@pytest.fixture(scope="module")
def edit_dir(edit_dirs):
    return edit_dirs("2509")


def qedit_config(tmp_path, folder, **extra):
    """The family's settings on the tiny recipe with an editing prompt set of 24 px signs (cropped
    to the output's 2:3: 24 x 16)."""
    family = settings("qwen_image_edit", folder, OPTIONS, 4.0, HEIGHT, WIDTH)
    return edit_config(tmp_path, family, WIDTH, **extra)


class TestFamilyChecks(FamilyChecks):
    """The shared checks on the tiny 2509 (SFT on edit pairs)."""

    case = Family(qedit_config, "edit_dir", edits=True)


def write_sources(folder, n: int = 2) -> list:
    """``n`` random 32 x 48 PNGs (the output's 2:3 aspect) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    gen = np.random.default_rng(0)
    paths = []
    for i in range(n):
        paths.append(folder / f"{i:04d}.png")
        Image.fromarray(gen.integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(paths[-1])
    return paths


def processor(family):
    """The real ``Qwen2VLProcessor`` over the family's processor parts, without a video processor
    (transformers 5.24 checks every part's class, and the video processor's needs torchvision;
    images never use it)."""
    from transformers import Qwen2VLProcessor
    from transformers.processing_utils import ProcessorMixin

    check = ProcessorMixin.check_argument_for_proper_class
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(
            ProcessorMixin,
            "check_argument_for_proper_class",
            lambda self, name, arg: None if name == "video_processor" else check(self, name, arg),
        )
        return Qwen2VLProcessor(
            image_processor=family.image_processor, tokenizer=family.processor_tokenizer, video_processor=None
        )


def pipeline(family):
    """The folder's diffusers pipeline over the family's modules, with a real processor."""
    pipe = family.pipeline()
    pipe.processor = processor(family)
    return pipe


@contextlib.contextmanager
def small_images(pipe):
    """The pipeline's image areas set to the tiny test's (its module's globals; the first
    Qwen-Image-Edit hard-codes 1024 x 1024 in its ``calculate_dimensions`` calls)."""
    import sys

    module = sys.modules[type(pipe).__module__]
    with pytest.MonkeyPatch.context() as mp:
        if hasattr(module, "VAE_IMAGE_SIZE"):
            mp.setattr(module, "VAE_IMAGE_SIZE", VAE_AREA)
            mp.setattr(module, "CONDITION_IMAGE_SIZE", CONDITION_AREA)
        else:
            dimensions = module.calculate_dimensions
            mp.setattr(module, "calculate_dimensions", lambda area, ratio: dimensions(VAE_AREA, ratio))
        yield


@contextlib.contextmanager
def with_mm_token_type_ids(pipe):
    """The pipeline's text encoder given the processor's ``mm_token_type_ids``, as diffusers' fix
    for transformers 5 does (issue 14194, PR 14189): diffusers 0.42.1 drops them, so Qwen2.5-VL
    gives the picture's tokens 1-D positions instead of its 3-D ones."""
    seen = {}
    call = type(pipe.processor).__call__

    def recording(self, *args, **kwargs):
        out = call(self, *args, **kwargs)
        seen["ids"] = out["mm_token_type_ids"]
        return out

    forward = pipe.text_encoder.forward

    def forwarding(*args, **kwargs):
        if "mm_token_type_ids" not in kwargs:  # the pipeline's call (the family passes them itself)
            kwargs["mm_token_type_ids"] = seen["ids"].to(kwargs["input_ids"].device)
        return forward(*args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(pipe.processor), "__call__", recording)
        mp.setattr(pipe.text_encoder, "forward", forwarding)
        yield


@contextlib.contextmanager
def recorded(transformer):
    """The keyword arguments of every call of ``transformer`` inside the block, in order."""
    calls, forward = [], transformer.forward

    def recording(**kwargs):
        calls.append(kwargs)
        return forward(**kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(transformer, "forward", recording)
        yield calls


@pytest.mark.parametrize(
    "variant, guidance",
    [("2509", 4.0), ("2509", 1.0), ("2511", 4.0), ("v1", 4.0)],
    ids=["2509_true_cfg", "2509_no_cfg", "2511_true_cfg", "v1_true_cfg"],
)
def test_ode_sampling_matches_the_diffusers_pipeline(tmp_path, edit_dirs, variant, guidance):
    """Same noise (packed for the pipeline), edits, source images, steps, size and CFG (negative
    prompt "", which the pipeline takes as a negative prompt and so runs true CFG): diffrl's ODE
    sampler on a batch of two edits and the pipeline on each alone give the same latents to 1e-5
    (float32, CPU). The sources are PNGs of the output's 2:3 aspect, given to diffrl as the prompt
    files' sources are (:func:`load_source`) and to the pipeline as PIL images."""
    family = load_family(qedit_config(tmp_path, edit_dirs(variant), **{"model.lora": "null"}))
    assert (type(family).description.pipeline_class, family.transformer.config.zero_cond_t) == VARIANTS[
        variant
    ]
    pipe = pipeline(family)
    ours_text = qwen_image_edit.EDIT_TEMPLATE.format(family.picture_label + qwen_image_edit.VISION + "x")
    assert pipe.prompt_template_encode.format(PIPELINE_USER_TURN[variant].format("x")) == ours_text
    assert pipe.prompt_template_encode_start_idx == qwen_image_edit.EDIT_DROP_TOKENS
    prompts = ['write "42" on the sign', 'make the wall blue and write the word "cat" on it']
    pngs = write_sources(tmp_path / "signs")
    sources = [load_source(p, HEIGHT, WIDTH) for p in pngs]
    noise = initial_noise(family, [(0, "test", i) for i in range(2)], HEIGHT, WIDTH)
    assert noise.shape == (2, 16, HEIGHT // 2, WIDTH // 2)
    cond = family.encode_prompts(prompts, sources)
    assert cond.tensors["image_latents"].shape == (2, 16, 16, 32)  # the 64 x 32 px reference
    negative = family.negative("", guidance, cond)
    sigmas = family.sigmas(4, None, HEIGHT, WIDTH)
    ours = sample_ode(family, noise, cond, sigmas, guidance, negative)
    with small_images(pipe), with_mm_token_type_ids(pipe), recorded(pipe.transformer) as calls:
        theirs = [
            pipe(
                image=Image.open(png).convert("RGB"),
                prompt=prompt,
                negative_prompt="" if guidance > 1 else None,
                true_cfg_scale=guidance,
                latents=pack(noise[i : i + 1]),
                num_inference_steps=4,
                height=HEIGHT,
                width=WIDTH,
                output_type="latent",
            ).images
            for i, (prompt, png) in enumerate(zip(prompts, pngs))
        ]
    torch.testing.assert_close(sigmas, pipe.scheduler.sigmas, rtol=0, atol=0)
    # what the transformer sees, beyond the latents (on the tiny random transformer the text moves
    # them little): each edit's text, the negative's (with the edit's picture), the reference tokens
    per_run = 4 * (2 if guidance > 1 else 1)  # steps x (cond, uncond)
    for i in range(2):
        for call, c in zip(calls[i * per_run : i * per_run + 2], [cond, negative] if negative else [cond]):
            valid = c.tensors["encoder_hidden_states_mask"][i].bool()
            text = c.tensors["encoder_hidden_states"][i][valid]
            torch.testing.assert_close(call["encoder_hidden_states"][0], text, rtol=0, atol=1e-6)
            reference = pack(c.tensors["image_latents"][i : i + 1])[0]
            torch.testing.assert_close(
                call["hidden_states"][0, noise.shape[2] * noise.shape[3] // 4 :], reference
            )
            assert call["img_shapes"] == [[(1, HEIGHT // 4, WIDTH // 4), (1, 8, 16)]]
    theirs = unpack(torch.cat(theirs), HEIGHT // 2, WIDTH // 2)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    images = family.decode(ours)
    assert images.shape == (2, 3, HEIGHT, WIDTH) and images.min() >= 0 and images.max() <= 1
    # the source conditions the result: another source, another edit
    other = family.encode_prompts(prompts, sources[::-1])
    other_negative = family.negative("", guidance, other)
    assert (sample_ode(family, noise, other, sigmas, guidance, other_negative) - ours).abs().max() > 1e-3


PIPELINE_USER_TURN = {
    "2509": "Picture 1: <|vision_start|><|image_pad|><|vision_end|>{}",
    "2511": "Picture 1: <|vision_start|><|image_pad|><|vision_end|>{}",
    "v1": "{}",
}
"""What each pipeline puts into its template's user turn (``_get_qwen_prompt_embeds``): the Plus
pipeline's picture label and vision tokens before the prompt; the first one's template has the
vision tokens in it."""


def test_the_pipeline_areas_and_the_mm_token_type_ids_matter(tmp_path, edit_dir):
    """The image areas default to the pipeline's; the picture's 3-D positions change the embedding
    (diffusers 0.42.1 under transformers 5 drops them: this fails once diffusers passes them, and
    then :func:`with_mm_token_type_ids` can go)."""
    from diffusers.pipelines.qwenimage import pipeline_qwenimage_edit_plus as plus

    assert (plus.CONDITION_IMAGE_SIZE, plus.VAE_IMAGE_SIZE) == (
        qwen_image_edit.QwenImageEditDescription.Options().condition_image_area,
        qwen_image_edit.QwenImageEditDescription.Options().vae_image_area,
    )
    family = load_family(qedit_config(tmp_path, edit_dir, **{"model.lora": "null"}))
    pipe = pipeline(family)
    picture = Image.open(write_sources(tmp_path / "signs", 1)[0]).convert("RGB").resize((32, 32))
    with torch.no_grad():
        dropped, _ = pipe.encode_prompt('write "42"', image=[picture])
        with with_mm_token_type_ids(pipe):
            kept, _ = pipe.encode_prompt('write "42"', image=[picture])
    assert (dropped - kept).abs().max() > 1e-3


def test_flow_grpo_iteration_replays_exactly_and_its_lora_loads_in_diffusers(tmp_path, edit_dir):
    """One Flow-GRPO iteration with true CFG (the negatives encoded with each row's picture, in
    rollouts, training and eval) replays its log-probs exactly; the exported LoRA, loaded by
    ``QwenImageEditPlusPipeline.load_lora_weights``, gives diffrl's velocity."""
    reward = "[{name: tests.rewards:brightness}]"
    evals = {"eval.enabled": "true", "eval.num_prompts": 2, "eval.rewards": reward}
    grpo = train_one(qedit_config(tmp_path / "grpo", edit_dir, **evals))
    assert "eval/reward_mean" in grpo.evals[-1]  # eval samples with the sources and their negatives
    base = load_family(qedit_config(tmp_path, edit_dir, **{"model.lora": "null"}))
    sources = [load_source(p, HEIGHT, WIDTH) for p in write_sources(tmp_path / "signs")]
    x = torch.randn(2, 16, HEIGHT // 2, WIDTH // 2, generator=torch.Generator().manual_seed(0))
    assert_exported_lora_matches(tmp_path, grpo.checkpoint, base, x, sources=sources)


def test_save_pretrained_writes_a_folder_that_loads_back(tmp_path, edit_dir):
    """A full model folder (what ``diffrl export`` writes for a full fine-tune): the pipeline's
    parts and ``processor/`` written from the family's processor parts, named in model_index.json."""
    family = load_family(qedit_config(tmp_path, edit_dir, **{"model.lora": "null"}))
    family.save_pretrained(tmp_path / "saved")
    index = json.loads((tmp_path / "saved" / "model_index.json").read_text())
    assert index["_class_name"] == "QwenImageEditPlusPipeline"
    assert index["processor"] == ["transformers", "Qwen2VLProcessor"]
    again = load_family(qedit_config(tmp_path, tmp_path / "saved", **{"model.lora": "null"}))
    sources = [load_source(p, HEIGHT, WIDTH) for p in write_sources(tmp_path / "signs")]
    for name, tensor in family.encode_prompts(['write "7"'] * 2, sources).tensors.items():
        torch.testing.assert_close(again.encode_prompts(['write "7"'] * 2, sources).tensors[name], tensor)


def test_bad_options_and_folders_are_refused_before_loading(tmp_path, edit_dir):
    with pytest.raises(
        ConfigError, match=r"vae_image_area must be in \[1024, 268_435_456\] \(pixels; at least 32 x 32"
    ):
        qedit_config(tmp_path, edit_dir, **{"model.options": "{vae_image_area: 500}"})
    with pytest.raises(ConfigError, match=r"max_sequence_length must be in \[1, 32768\]"):
        qedit_config(tmp_path, edit_dir, **{"model.options": "{max_sequence_length: 0}"})
    no_processor = tmp_path / "no_processor"
    shutil.copytree(edit_dir, no_processor)
    shutil.rmtree(no_processor / "processor")
    with pytest.raises(ConfigError, match="no processor/preprocessor_config.json"):
        qedit_config(tmp_path, no_processor)
    text_to_image = tmp_path / "text_to_image"
    shutil.copytree(edit_dir, text_to_image)
    index = text_to_image / "model_index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), "_class_name": "QwenImagePipeline"}))
    with pytest.raises(ConfigError, match="holds a QwenImagePipeline"):
        qedit_config(tmp_path, text_to_image)


def test_long_edits_sources_of_another_size_and_prompts_without_sources_are_errors(tmp_path, edit_dir):
    family = load_family(
        qedit_config(tmp_path, edit_dir, **{"model.options": OPTIONS.replace(str(TEXT_TOKENS), "64")})
    )
    sources = [load_source(write_sources(tmp_path / "signs", 1)[0], HEIGHT, WIDTH)]
    with pytest.raises(ValueError, match=r"encodes to \d+ tokens .*16 of them the picture's.*at least"):
        family.encode_prompts(['write "42"'], sources)
    square = load_source(write_sources(tmp_path / "signs", 1)[0], WIDTH, WIDTH)  # a 1:1 crop
    with pytest.raises(
        ValueError,
        match="64x64 reference and a 32x32 picture, earlier ones to 64x32 and 32x32.*need one size",
    ):
        family.encode_prompts(['write "42"'], [square])
    with pytest.raises(ValueError, match="takes one source image per prompt"):
        family.encode_prompts(['write "42"'])
    with pytest.raises(ValueError, match="encodes the negative prompt with each row's source"):
        family.negative("", 4.0)


def test_sequence_parallel_lengths_that_do_not_split_are_errors(tmp_path, edit_dir):
    """``parallel.sequence: 3``: the image tokens are the output's 24 and the reference's 128
    (``vae_image_area`` at the output's 2:3), 152, which with the 2 heads do not split over 3 ranks;
    the forward refuses them too, before diffusers' assert (a source of another aspect than the
    output's brings a reference of another size than the config check counted)."""
    from diffrl.models.base import SourceError

    lengths = ("image tokens (152)", "attention heads (2)")
    assert_does_not_split(partial(qedit_config, tmp_path, edit_dir), "qwen_image_edit", *lengths)
    family = load_family(qedit_config(tmp_path, edit_dir, **{"model.lora": "null"}))
    sources = [load_source(p, HEIGHT, WIDTH) for p in write_sources(tmp_path / "signs")]
    cond = family.encode_prompts(['write "7"'] * 2, sources)
    pretend_sequence_ranks(family.transformer, 3)
    with pytest.raises(
        SourceError, match=r"24 output tokens and 128 reference tokens \(64x32 px\) do not split"
    ):
        family.velocity(torch.zeros(2, 16, 8, 12), torch.tensor([0.9, 0.4]), cond)


@pytest.mark.parametrize("variant", ["2509", "2511", "v1"])
def test_plan_runs_the_familys_own_transformer_and_forward(tmp_path, edit_dirs, variant):
    """``diffrl plan`` of the tiny 2509 with true CFG (the recipe's) runs, and the planned forward
    is the family's for each variant (2511's ``zero_cond_t`` is the transformer's own): edits of
    the full ``max_sequence_length`` (a mask of ones, the text kept whole) and the reference at
    ``vae_image_area`` and the output's 2:3 (64 x 32 px: 128 tokens after the noise's 24)."""
    folder = edit_dirs(variant)
    config = qedit_config(tmp_path, folder)
    if variant == "2509":
        assert_plan_runs(config)
    sources = [load_source(p, HEIGHT, WIDTH) for p in write_sources(tmp_path / "sources")]
    assert_planned_is_the_familys(config, folder, sources, masks=("encoder_hidden_states_mask",))
