import pytest
import torch

from diffrl.rewards import clip_embed
from diffrl.rewards.clip_score import ClipScore
from diffrl.rewards.pretrained import pil_images
from tests.unit.rewards.tiny_clip import PROMPTS, clip_pixels, preflight_problems, random_images, write_clip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """An openai/clip-vit-large-patch14-like folder: CLIPModel + tokenizer + preprocessor config."""
    path = tmp_path_factory.mktemp("clip") / "clip-vit-large-patch14"
    model = write_clip(path, seed=3, logit_scale=4.6052, legacy_eos=True)  # exp = 100, as OpenAI's
    return path, model


@pytest.fixture(scope="module")
def reward(folder):
    return ClipScore(str(folder[0]))


def flow_grpo_clip_score(model, tokenizer, pixels, prompts):
    """flow_grpo's ClipScorer: text padded to 77, CLIPModel.forward, logits_per_image diagonal / 30."""
    text = tokenizer(prompts, padding="max_length", truncation=True, max_length=77, return_tensors="pt")
    return model(pixel_values=pixels, **text).logits_per_image.diagonal() / 30


def test_score_is_flow_grpos_formula(folder, reward):
    _, model = folder
    images = random_images(5, 32, 32, seed=4)
    expected = flow_grpo_clip_score(model, reward.tokenizer, clip_pixels(images, 32), PROMPTS)
    # padding to 77 (flow_grpo) vs to the longest prompt (here) is masked: only float32 rounding differs
    torch.testing.assert_close(reward(images, PROMPTS, [{}] * 5), expected, atol=1e-5, rtol=1e-5)
    assert expected.std() > 1e-3


def test_non_square_larger_image_is_prepared_as_the_processor_config_says(folder, reward):
    _, model = folder
    images = random_images(2, 80, 41, seed=5)  # portrait: width 41 -> 32, height int(32 * 80 / 41) = 62
    reference = clip_pixels(images, 32)
    torch.testing.assert_close(
        clip_embed.pixel_values(reward.image_processor, pil_images(images)), reference, atol=1e-6, rtol=0
    )
    expected = flow_grpo_clip_score(model, reward.tokenizer, reference, PROMPTS[:2])
    torch.testing.assert_close(reward(images, PROMPTS[:2], [{}] * 2), expected, atol=1e-5, rtol=1e-5)


def test_batch_size_does_not_change_scores(folder, reward):
    images = random_images(5, 32, 32, seed=6)
    one = ClipScore(str(folder[0]), batch_size=1)
    # float32 rounding of differently shaped GEMMs only
    torch.testing.assert_close(
        one(images, PROMPTS, [{}] * 5), reward(images, PROMPTS, [{}] * 5), atol=1e-5, rtol=0
    )


def test_param_problems(folder, tmp_path):
    (tmp_path / "vit").mkdir()
    (tmp_path / "vit" / "config.json").write_text('{"model_type": "vit"}')
    [missing] = preflight_problems("clip_score", {"model": str(tmp_path / "nope")})
    assert missing.startswith(
        "rewards[0] (clip_score).params: model: reward 'clip_score' needs CLIP ViT-L/14"
    )
    [wrong] = preflight_problems("clip_score", {"model": str(tmp_path / "vit")})
    assert "holds a 'vit' model; reward 'clip_score' expects CLIP ViT-L/14 (a CLIPModel)" in wrong
    (tmp_path / "bare").mkdir()
    write_clip(tmp_path / "bare", with_processor=False)
    bare = preflight_problems("clip_score", {"model": str(tmp_path / "bare")})
    assert len(bare) == 2 and "no preprocessor_config.json" in bare[0] and "no CLIP tokenizer" in bare[1]
    [device] = preflight_problems("clip_score", {"model": str(folder[0]), "device": "tpu"})
    assert "device must be a torch device such as 'cpu' or 'cuda:0', got 'tpu'" in device
    assert preflight_problems("clip_score", {"model": str(folder[0]), "dtype": "bfloat16"}) == []
