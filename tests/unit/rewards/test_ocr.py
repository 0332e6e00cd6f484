import json
import random

import pytest
import torch

from diffrl.data.synthetic_text import TextStyle, render, to_tensor
from diffrl.rewards.ocr import OCRReward, levenshtein, ocr_reward_from_text


def test_formula_matches_reference(reference_dir):
    rows = json.loads((reference_dir / "ocr_reward.json").read_text())
    for row in rows:
        assert ocr_reward_from_text(row["recognized"], row["prompt"]) == pytest.approx(
            row["reward"], abs=1e-12
        ), row


def test_levenshtein():
    assert levenshtein("kitten", "sitting") == 3
    assert levenshtein("", "abc") == 3


def test_prompt_without_quotes_is_an_error():
    with pytest.raises(ValueError, match="no quoted target"):
        ocr_reward_from_text("abc", "a photo of a cat")


def test_real_ocr_reads_rendered_text_and_not_a_blank_image():
    style = TextStyle("DejaVuSans-Bold.ttf", 16, 4, 6, (10, 10, 10), (240, 240, 240))
    good = to_tensor(render("7K4P", style, 32, 64))
    blank = torch.full((3, 32, 64), 0.9)
    reward = OCRReward(num_workers=0)
    scores = reward(torch.stack([good, blank]), ['the text "7K4P"', 'the text "7K4P"'], [{}, {}])
    assert scores.tolist() == [1.0, 0.0]


def test_process_pool_gives_the_same_scores_as_in_process():
    rng = random.Random(0)
    imgs, prompts = [], []
    for text in ["AB3", "9X1", "KLM4", "204"]:
        style = TextStyle("DejaVuSans.ttf", 15, rng.randint(1, 10), 6, (20, 20, 60), (230, 230, 200))
        imgs.append(to_tensor(render(text, style, 32, 64)))
        prompts.append(f'the text "{text}"')
    images = torch.stack(imgs)
    pooled = OCRReward(num_workers=2)
    try:
        a = pooled(images, prompts, [{}] * 4)
    finally:
        pooled.close()
    b = OCRReward(num_workers=0)(images, prompts, [{}] * 4)
    assert torch.equal(a, b)


def test_rollouts_keep_uint8_images_and_rewards_score_them_as_the_floats():
    """Rollouts quantize decoded images to uint8 (a quarter of the bytes); the reward set hands
    every reward float32 in [0, 1] again, and OCR (which reads uint8 itself) scores them the same."""
    from diffrl.config import RewardConfig
    from diffrl.core.rollout import quantize
    from diffrl.rewards.base import RewardSet

    style = TextStyle("DejaVuSans-Bold.ttf", 16, 4, 6, (10, 10, 10), (240, 240, 240))
    gen = torch.Generator().manual_seed(0)
    clean = torch.stack([to_tensor(render(t, style, 32, 64)) for t in ("7K4P", "A1B2", "Q9")])
    images = (clean + 0.05 * torch.randn(clean.shape, generator=gen)).clamp(0, 1)  # decoder-like floats
    small = quantize(images)
    assert small.dtype == torch.uint8 and small.element_size() * 4 == images.element_size()
    prompts = ['the text "7K4P"', 'the text "A1B2"', 'the text "Q9"']
    rewards = RewardSet(
        [
            RewardConfig("ocr", params={"num_workers": 0}),
            RewardConfig("tests.rewards:brightness"),
        ]
    )
    from_floats, from_uint8 = rewards(images, prompts, [{}] * 3), rewards(small, prompts, [{}] * 3)
    assert torch.equal(from_uint8.per_reward["ocr"], from_floats.per_reward["ocr"])
    brightness = "tests.rewards:brightness"
    torch.testing.assert_close(
        from_uint8.per_reward[brightness], from_floats.per_reward[brightness], atol=1 / 510, rtol=0
    )


@pytest.mark.parametrize("written", [2, 2.0])
def test_a_whole_float_for_num_workers_builds_the_reward_preflight_accepted(written):
    """Preflight binds ``num_workers: 2.0`` as the int 2 (as any config field); the reward built
    for the run gets that int, not the float (a worker count of 2.0 was exit 70 at the pool)."""
    from diffrl.config import RewardConfig
    from diffrl.preflight.rewards import reward_problems
    from diffrl.rewards.base import build_reward

    cfg = RewardConfig("ocr", params={"num_workers": written})
    assert reward_problems("rewards", [cfg], check_files=True) == []
    reward = build_reward(cfg)
    assert reward.num_workers == 2 and type(reward.num_workers) is int
