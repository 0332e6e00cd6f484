"""The paired comparison behind ``diffrl eval --baseline``."""

import pytest
import torch

from diffrl.train.evaluate import paired_difference


def test_paired_difference_is_the_mean_difference_and_its_standard_error():
    scores = torch.tensor([1.0, 0.5, 0.0, 1.0])
    baseline = torch.tensor([0.5, 0.5, 0.0, 0.0])
    diff, se = paired_difference(scores, baseline)
    d = torch.tensor([0.5, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert diff == pytest.approx(0.375)
    assert se == pytest.approx((d.std() / 2).item())


def test_pairing_removes_the_variation_both_models_share():
    # per-sample difficulty dominates both means; the difference is a constant 0.1
    difficulty = torch.linspace(0, 0.8, 50)
    diff, se = paired_difference(difficulty + 0.1, difficulty)
    assert diff == pytest.approx(0.1) and se == pytest.approx(0.0, abs=1e-7)


def test_unpaired_shapes_are_refused():
    with pytest.raises(ValueError, match="equal shapes"):
        paired_difference(torch.zeros(3), torch.zeros(4))
