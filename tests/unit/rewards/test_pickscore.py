import re

import pytest
import torch

from diffrl.rewards import clip_embed
from diffrl.rewards.base import RewardError
from diffrl.rewards.pickscore import PickScore
from diffrl.rewards.pretrained import pil_images
from tests.unit.rewards.tiny_clip import (
    PROMPTS,
    clip_pixels,
    preflight_problems,
    random_images,
    write_clip,
    write_processor,
    write_tokenizer,
)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """PickScore_v1-like (a CLIPModel, no processor files) and laion-ViT-H-14-like (processor) folders."""
    root = tmp_path_factory.mktemp("pickscore")
    model = write_clip(root / "PickScore_v1", with_processor=False)
    write_tokenizer(root / "laion")
    write_processor(root / "laion", 32)
    return root, model


@pytest.fixture(scope="module")
def reward(folders):
    root, _ = folders
    return PickScore(str(root / "PickScore_v1"), processor=str(root / "laion"))


def flow_grpo_pickscore(model, tokenizer, pixels, prompts):
    """flow_grpo's formula through CLIPModel.forward: logits_per_image = exp(logit_scale) * cos."""
    text = tokenizer(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")
    out = model(input_ids=text["input_ids"], attention_mask=text["attention_mask"], pixel_values=pixels)
    return out.logits_per_image.diagonal() / 26


def test_score_is_flow_grpos_formula(folders, reward):
    _, model = folders
    images = random_images(5, 32, 32)
    expected = flow_grpo_pickscore(model, reward.tokenizer, clip_pixels(images, 32), PROMPTS)
    # float32 end to end; the reference pixels are computed in float64 then rounded (<= 1e-6 apart)
    torch.testing.assert_close(reward(images, PROMPTS, [{}] * 5), expected, atol=1e-5, rtol=1e-5)
    assert expected.std() > 1e-3  # the prompts and images give different scores: the test can see a swap


def test_non_square_larger_image_is_prepared_as_the_processor_config_says(folders, reward):
    _, model = folders
    images = random_images(2, 45, 70, seed=1)  # shortest side 45 -> 32, long side int(32 * 70 / 45) = 49
    pixels = clip_embed.pixel_values(reward.image_processor, pil_images(images))
    reference = clip_pixels(images, 32)
    assert pixels.shape == (2, 3, 32, 32)
    # same uint8 resize by PIL; the processor normalises in float64 and rounds to float32 like the reference
    torch.testing.assert_close(pixels, reference, atol=1e-6, rtol=0)
    expected = flow_grpo_pickscore(model, reward.tokenizer, reference, PROMPTS[:2])
    torch.testing.assert_close(reward(images, PROMPTS[:2], [{}] * 2), expected, atol=1e-5, rtol=1e-5)


def test_batch_size_does_not_change_scores(folders):
    root, _ = folders
    images = random_images(5, 32, 32, seed=2)
    one = PickScore(str(root / "PickScore_v1"), processor=str(root / "laion"), batch_size=1)
    five = PickScore(str(root / "PickScore_v1"), processor=str(root / "laion"), batch_size=5)
    # different GEMM shapes may sum in another order: float32 rounding, ~1e-7 of values of order 1
    torch.testing.assert_close(
        one(images, PROMPTS, [{}] * 5), five(images, PROMPTS, [{}] * 5), atol=1e-5, rtol=0
    )


def test_processor_defaults_to_the_model_folder(tmp_path):
    write_clip(tmp_path / "both")
    reward = PickScore(str(tmp_path / "both"))
    assert reward.image_processor.crop_size == {"height": 32, "width": 32}
    assert reward(random_images(1, 32, 32), ["cat"], [{}]).shape == (1,)


def test_param_problems_before_anything_loads(folders, tmp_path):
    root, _ = folders
    (tmp_path / "siglip").mkdir()
    (tmp_path / "siglip" / "config.json").write_text('{"model_type": "siglip"}')
    missing = preflight_problems("pickscore", {"model": str(tmp_path / "nope")})
    assert missing == [
        f"rewards[0] (pickscore).params: model: reward 'pickscore' needs PickScore_v1 (a CLIPModel) in a "
        f"local folder; {str(tmp_path / 'nope')!r} is not a folder"
    ]
    [wrong] = preflight_problems("pickscore", {"model": str(tmp_path / "siglip")})
    assert "holds a 'siglip' model; reward 'pickscore' expects PickScore_v1 (a CLIPModel)" in wrong
    # PickScore_v1 ships no processor: without `processor` the model folder must hold one
    no_processor = preflight_problems("pickscore", {"model": str(root / "PickScore_v1")})
    assert [p.split(": ", 2)[1] for p in no_processor] == ["model", "model"]
    assert "no preprocessor_config.json" in no_processor[0] and "no CLIP tokenizer" in no_processor[1]
    bad = preflight_problems(
        "pickscore",
        {
            "model": str(root / "PickScore_v1"),
            "processor": str(root / "laion"),
            "device": "gpu:0",
            "dtype": "fp8",
            "batch_size": 0,
        },
    )
    # "...params: device must ..." (the reward's own check) or "...params.batch_size must ..." (its range)
    assert [re.match(r".*?\.params(?:: |\.)(\w+)", p).group(1) for p in bad] == [
        "device",
        "dtype",
        "batch_size",
    ]
    assert (
        preflight_problems(
            "pickscore", {"model": str(root / "PickScore_v1"), "processor": str(root / "laion")}
        )
        == []
    )
    [typo] = preflight_problems("pickscore", {"modle": "x"})
    assert "unknown param 'modle'. Did you mean 'model'?" in typo


def test_corrupt_weights_are_a_reward_error_naming_the_folder(tmp_path):
    write_clip(tmp_path / "clip")
    (tmp_path / "clip" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(RewardError, match=r"reward 'pickscore': could not load a CLIPModel from '.*clip'"):
        PickScore(str(tmp_path / "clip"))
