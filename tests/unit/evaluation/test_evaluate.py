"""The paired comparison behind ``diffrl eval --baseline``, the stills of videos in eval grids, and
the grids' captions."""

import pytest
import torch
from PIL import Image

from diffrl.evaluation.evaluate import (
    Caption,
    EvalResult,
    GridNote,
    caption_font,
    caption_lines,
    grid_scale,
    paired_difference,
    read_grid_note,
    sample_keys,
    save_grid,
    still,
)


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
    from diffrl.evaluation.evaluate import evaluate
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.rewards.base import RewardSet
    from tests.conftest import tiny_overrides

    here = "tests.unit.evaluation.test_evaluate:every_other_nan"
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

    results = torch.zeros(3, 3, 4, 4)  # black results
    sources = torch.full((3, 3, 4, 4), 255, dtype=torch.uint8)  # white sources
    sources[1] = 128
    path = save_grid(results, tmp_path / "grid.png", columns=8, scale=1, sources=sources)
    grid = np.asarray(Image.open(path))
    assert grid.shape == (6, 6 * 6, 3)  # one row of 3 pairs, each cell 4 px + a 2 px border
    cells = [grid[1:5, c * 6 + 1 : c * 6 + 5] for c in range(6)]
    assert [int(cell.mean()) for cell in cells] == [255, 0, 128, 0, 255, 0]


def _dark(region) -> int:
    """The pixels of ``region (H, W, 3)`` that are not (near) white: drawn text."""
    return int((region.min(axis=-1) < 200).sum())


def test_captions_add_a_strip_under_each_cell_with_its_text(tmp_path):
    import numpy as np

    images = torch.ones(2, 3, 8, 16)  # white tiles: any dark pixel below them is text
    plain = np.asarray(Image.open(save_grid(images, tmp_path / "plain.png")))
    path = save_grid(images, tmp_path / "captioned.png", captions=['the number "42"', ""])
    grid = np.asarray(Image.open(path))
    row_h, cell_w = (8 + 2) * 2, (16 + 2) * 2
    assert grid.shape[1] == plain.shape[1] and grid.shape[0] > plain.shape[0] == row_h
    np.testing.assert_array_equal(grid[:row_h], plain)  # the tiles as they were, the strip beneath
    assert _dark(grid[row_h:, :cell_w]) > 0  # the first cell's prompt
    assert _dark(grid[row_h:, cell_w:]) == 0  # an empty caption draws nothing


def test_an_edit_pair_gets_one_caption_under_both_images(tmp_path):
    import numpy as np

    results = torch.ones(3, 3, 8, 8)
    sources = torch.full((3, 3, 8, 8), 255, dtype=torch.uint8)
    captions = ["", Caption("make it red", 0.5), ""]
    grid = np.asarray(Image.open(save_grid(results, tmp_path / "g.png", sources=sources, captions=captions)))
    row_h, pair_w = (8 + 2) * 2, 2 * (8 + 2) * 2
    strip = grid[row_h:]
    assert grid.shape[1] == 3 * pair_w
    assert [_dark(strip[:, k * pair_w : (k + 1) * pair_w]) > 0 for k in range(3)] == [False, True, False]


def test_a_caption_is_two_lines_of_prompt_at_most_then_its_reward():
    font = caption_font(132)
    long = "a watercolor painting of a lighthouse on a cliff above a stormy sea at dusk, seagulls"
    lines = caption_lines(Caption(long, 0.5312), font, 120)
    assert len(lines) == 3 and lines[1].endswith("…") and lines[2] == "r=0.531"
    assert all(font.getlength(line) <= 120 for line in lines)
    assert long.startswith(f"{lines[0]} {lines[1][:-1]}".rstrip())  # the prompt from its start
    assert caption_lines(Caption('the text "AB3"', float("nan")), font, 120) == [
        'the text "AB3"',
        "r=nan (failed)",
    ]
    assert caption_lines('the text "AB3"', font, 120) == ['the text "AB3"']  # a prompt alone: no reward line
    word = caption_lines("x" * 200, font, 60)  # a word wider than the cell is split, then cut
    assert len(word) == 2 and word[1].endswith("…") and all(font.getlength(w) <= 60 for w in word)


def test_eval_captions_carry_each_samples_total_and_need_one_per_image(tmp_path):
    result = EvalResult(["a", "b"], torch.ones(2, 3, 4, 4), total=torch.tensor([0.25, float("nan")]))
    caps = result.captions()
    assert (
        caps[0] == Caption("a", 0.25) and caps[1].prompt == "b" and caps[1].reward_line() == "r=nan (failed)"
    )
    assert [c.reward for c in EvalResult(["a"], torch.ones(1, 3, 4, 4)).captions()] == [None]
    with pytest.raises(ValueError, match="one per image"):
        save_grid(torch.ones(2, 3, 4, 4), tmp_path / "g.png", captions=["only one"])


def test_grid_tiles_of_small_images_are_enlarged_and_of_large_ones_shrunk(tmp_path):
    assert [grid_scale(s, s) for s in (32, 256, 384, 512, 1024, 2048)] == [2.0, 2.0, 1.0, 1.0, 0.5, 0.25]
    big = torch.rand(2, 3, 1024, 768)
    path = save_grid(big, tmp_path / "big.png", captions=["a", "b"])
    width, height = Image.open(path).size
    assert (
        width == round(2 * 770 * 0.5) and (1026 * 0.5) < height < 1026
    )  # one row of 512-px tiles, captioned


def test_a_caption_says_the_seed_and_index_a_sample_was_drawn_with():
    font = caption_font(132)
    assert caption_lines(Caption('the number "42"', 0.5, 1234, (12, 0)), font, 120) == [
        'the number "42"',
        "r=0.500",
        "seed 1234 · #12",
    ]
    assert Caption("a", None, 7, (3, 1)).seed_line() == "seed 7 · #3.1"  # a prompt's second sample
    assert Caption("a").seed_line() is None and Caption("a", None, 7).seed_line() == "seed 7"
    narrow = caption_lines(Caption("a", 0.5, 1234, (123, 5)), font, 64)  # broken, not cut
    assert len(narrow) == 4 and "".join(narrow[2:]).replace(" ", "") == "seed1234·#123.5"
    assert all(font.getlength(line) <= 64 for line in narrow)


def test_eval_captions_and_note_say_how_each_sample_was_drawn_and_how_many_are_shown():
    assert sample_keys([0, 0, 1, 1, 2]) == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    result = EvalResult(
        ["a", "a", "b", "b"], torch.ones(4, 3, 4, 4), seed=9, index=[0, 0, 1, 1], source="p.txt"
    )
    assert [c.seed_line() for c in result.captions()] == [
        "seed 9 · #0",
        "seed 9 · #0.1",
        "seed 9 · #1",
        "seed 9 · #1.1",
    ]
    assert result.shown(2) == "2 of 4 samples shown" and result.shown(32) == "all 4 samples"
    note = result.grid_note(2)
    assert note.shown == "2 of 4 samples shown"
    assert "--prompts p.txt --num-prompts i+1 --samples-per-prompt j+1 --seed 9" in note.hint
    assert EvalResult(["a"], torch.ones(1, 3, 4, 4)).grid_note(1) == GridNote(
        "all 1 samples"
    )  # no seed: no hint


def test_a_grid_note_is_drawn_under_the_grid_and_kept_in_the_png(tmp_path):
    import numpy as np

    images = torch.ones(2, 3, 8, 16)  # white tiles: any dark pixel below them is text
    plain = np.asarray(Image.open(save_grid(images, tmp_path / "plain.png")))
    note = GridNote("2 of 64 samples shown", "tile #i.j: `diffrl sample ...`")
    path = save_grid(images, tmp_path / "noted.png", note=note)
    grid = np.asarray(Image.open(path))
    assert grid.shape[1] == plain.shape[1] and grid.shape[0] > plain.shape[0]
    np.testing.assert_array_equal(grid[: plain.shape[0]], plain)
    assert _dark(grid[plain.shape[0] :]) > 0  # the note's text
    assert read_grid_note(path) == note and Image.open(path).text["Description"] == note.text()
    assert read_grid_note(tmp_path / "plain.png") is None and read_grid_note(tmp_path / "missing.png") is None


def test_a_tile_is_drawn_again_by_the_command_its_note_gives(tmp_path):
    # tile #i.j is the last image of `diffrl sample --prompts P --num-prompts i+1
    # --samples-per-prompt j+1 --seed S`: the noise eval and sample draw is keyed the same way
    from diffrl.data.prompts import load_prompts
    from diffrl.evaluation.evaluate import evaluate, generate
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from tests.conftest import tiny_overrides

    config = load_config(
        "recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **{"eval.samples_per_prompt": 2, "eval.seed": 77})
    )
    family = load_family(config)
    result = evaluate(family, config, None)
    assert [c.index for c in result.captions()] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert result.seed == 77 and result.source == config.eval.prompts
    for k in (1, 2):
        i, j = result.captions()[k].index
        prompts = load_prompts(result.source).head(i + 1)
        _, again = generate(family, config, prompts, j + 1, result.seed, batch_size=1)
        assert again.images[-1].shape == result.images[k].shape
        torch.testing.assert_close(again.images[-1], result.images[k], atol=1e-5, rtol=1e-5)
