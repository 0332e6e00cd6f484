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
