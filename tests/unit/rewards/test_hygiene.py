"""Reward hygiene: every failure is named (reward and prompts) and counted; each reward's raw
scores are reported beside the weighted total."""

import math

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.rewards.base import RewardOutput, RewardSet, prompts_note, reward_labels

HERE = "tests.unit.rewards.test_hygiene"


def wrong_shape(images, prompts, metadata):
    return [0.5] * (len(prompts) + 1)


def ones(images, prompts, metadata):
    return [1.0] * len(prompts)


def half_nan(images, prompts, metadata):
    return [float("nan") if i % 2 else 2.0 for i in range(len(prompts))]


def raises(images, prompts, metadata):
    raise KeyError("no such prompt id")


def test_labels_are_names_unless_shared():
    configs = [RewardConfig("a"), RewardConfig("b"), RewardConfig("a")]
    assert reward_labels(configs) == ["a#0", "b", "a#2"]
    assert reward_labels(configs[:2]) == ["a", "b"]


def test_a_wrong_shape_a_nan_and_a_raise_are_each_named_with_the_prompts_and_counted():
    names = ["wrong_shape", "half_nan", "raises", "ones"]
    rewards = RewardSet([RewardConfig(f"{HERE}:{n}") for n in names])
    prompts = ["a red cube", "a blue ball", "x" * 80, "d"]
    out = rewards.submit(torch.rand(4, 3, 8, 8), prompts, [{}] * 4).result()
    rewards.close()
    where = f"(on prompts 'a red cube', 'a blue ball', '{'x' * 57}...' and 1 more)"
    assert out.errors == [
        f"reward '{HERE}:wrong_shape' raised ValueError: returned shape (5,), expected one score per "
        f"image (4,) {where}",
        f"reward '{HERE}:half_nan' returned 2 non-finite score(s) {where}",
        f"reward '{HERE}:raises' raised KeyError: 'no such prompt id' {where}",
    ]
    m = out.metrics("rollout/reward")
    assert m[f"rollout/reward/{HERE}:wrong_shape/failed"] == 4
    assert m[f"rollout/reward/{HERE}:half_nan/failed"] == 2 and m[f"rollout/reward/{HERE}:ones/failed"] == 0
    assert f"rollout/reward/{HERE}:raises/mean" not in m  # nothing scored: no statistics, only the count
    assert m[f"rollout/reward/{HERE}:half_nan/mean"] == 2.0 == m[f"rollout/reward/{HERE}:half_nan/max"]
    assert m[f"rollout/reward/{HERE}:half_nan/std"] == 0.0
    assert out.total.isnan().all()  # every sample lost a term of its weighted sum


def test_metrics_are_the_statistics_of_the_scored_samples():
    scores = torch.tensor([1.0, float("nan"), 3.0, 4.0])
    out = RewardOutput(scores * 2, {"r": scores})
    m = out.metrics("p")
    std = math.sqrt(((1 - 8 / 3) ** 2 + (3 - 8 / 3) ** 2 + (4 - 8 / 3) ** 2) / 3)
    assert m == {
        "p/r/failed": 1.0,
        "p/r/mean": pytest.approx(8 / 3, rel=1e-12),  # float64 statistics of the float32 scores
        "p/r/std": pytest.approx(std, rel=1e-12),
        "p/r/min": 1.0,
        "p/r/max": 4.0,
    }


def test_prompts_note_shows_all_of_a_short_batch():
    assert prompts_note(["a", "b"]) == "on prompts 'a', 'b'"
