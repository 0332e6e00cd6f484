"""The paired comparison behind ``diffrl eval --baseline``, and the stills of videos in eval grids."""

import pytest
import torch

from diffrl.train.evaluate import paired_difference, save_grid, still


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


def test_eval_grids_show_first_middle_and_last_frames(tmp_path):
    v = torch.rand(2, 3, 5, 4, 6)
    s = still(v)
    assert s.shape == (2, 3, 4, 18)
    torch.testing.assert_close(s[..., 6:12], v[:, :, 2])
    image = v[:, :, 0]
    assert still(v[:, :, :1]).shape == (2, 3, 4, 6) and still(image) is image
    assert save_grid(v, tmp_path / "grid.png").is_file()


def every_other_nan(images, prompts, metadata):
    return [float("nan") if i % 2 else 0.25 for i in range(len(prompts))]


def test_a_failing_eval_reward_costs_its_samples_not_the_run(tmp_path):
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.rewards.base import RewardSet
    from diffrl.train.evaluate import evaluate
    from tests.conftest import tiny_overrides

    here = "tests.unit.train.test_evaluate:every_other_nan"
    config = load_config(
        "recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **{"eval.rewards": f"[{{name: {here}}}]"})
    )
    rewards = RewardSet(config.eval.rewards)
    with pytest.warns(UserWarning, match=r"eval: 1 sample\(s\) unscored: .*non-finite"):
        result = evaluate(load_family(config), config, rewards)
    rewards.close()
    assert result.errors and result.metrics() == {
        "eval/reward_mean": 0.25,  # over the scored sample
        "eval/reward_failed": 1.0,
        f"eval/{here}_mean": 0.25,
    }


def test_an_edit_grid_sets_each_result_beside_its_source(tmp_path):
    import numpy as np
    from PIL import Image

    results = torch.zeros(3, 3, 4, 4)  # black results
    sources = torch.full((3, 3, 4, 4), 255, dtype=torch.uint8)  # white sources
    sources[1] = 128
    path = save_grid(results, tmp_path / "grid.png", columns=8, scale=1, sources=sources)
    grid = np.asarray(Image.open(path))
    assert grid.shape == (6, 6 * 6, 3)  # one row of 3 pairs, each cell 4 px + a 2 px border
    cells = [grid[1:5, c * 6 + 1 : c * 6 + 5] for c in range(6)]
    assert [int(cell.mean()) for cell in cells] == [255, 0, 128, 0, 255, 0]
