"""A CLIP folder saved by transformers 5 (``CLIPProcessor.save_pretrained`` writes
``processor_config.json`` with an ``image_processor`` section, and no ``preprocessor_config.json``):
preflight accepts what the CLIP rewards load, and still refuses a folder they cannot load."""

import json
import os

import pytest
import torch
from transformers import CLIPImageProcessorPil, CLIPProcessor, CLIPTokenizer

from diffrl.rewards.base import RewardError
from diffrl.rewards.clip_score import ClipScore
from diffrl.rewards.pickscore import PickScore
from tests.unit.rewards.tiny_clip import PROMPTS, preflight_problems, random_images, write_clip


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``legacy``: CLIPModel + tokenizer + preprocessor_config.json (as the hub's folders);
    ``saved``: the same model with its processor saved again by transformers 5."""
    root = tmp_path_factory.mktemp("clip5")
    legacy, saved = root / "legacy", root / "saved"
    write_clip(legacy, seed=7)
    write_clip(saved, seed=7, with_processor=False)
    processor = CLIPProcessor(
        image_processor=CLIPImageProcessorPil.from_pretrained(legacy),
        tokenizer=CLIPTokenizer.from_pretrained(legacy),
    )
    processor.save_pretrained(saved)
    return legacy, saved


def test_transformers_5_layout(folders):
    _, saved = folders
    assert (saved / "processor_config.json").is_file() and not (saved / "preprocessor_config.json").exists()
    assert "image_processor" in json.loads((saved / "processor_config.json").read_text())


def test_a_folder_saved_by_transformers_5_passes_preflight_and_scores_as_the_legacy_one(folders):
    legacy, saved = folders
    assert preflight_problems("clip_score", {"model": str(saved)}) == []
    assert preflight_problems("pickscore", {"model": str(legacy), "processor": str(saved)}) == []
    images = random_images(4, 40, 48, seed=8)  # resized and cropped: the processor settings matter
    expected = ClipScore(str(legacy))(images, PROMPTS[:4], [{}] * 4)
    torch.testing.assert_close(ClipScore(str(saved))(images, PROMPTS[:4], [{}] * 4), expected, rtol=0, atol=0)
    pick = PickScore(model=str(legacy), processor=str(saved))
    assert pick(images, PROMPTS[:4], [{}] * 4).isfinite().all()


@pytest.mark.parametrize(
    "processor_config, message",
    [
        (
            {"processor_class": "CLIPProcessor"},
            "has no preprocessor_config.json (nor a processor_config.json with an image_processor section",
        ),
        ({"image_processor": "CLIPImageProcessor"}, "image_processor section of"),
        ([1, 2], "holds a JSON array, not a JSON object"),
    ],
)
def test_a_folder_the_reward_cannot_load_is_still_refused(folders, tmp_path, processor_config, message):
    _, saved = folders
    folder = tmp_path / "broken"
    folder.mkdir()
    for f in saved.iterdir():
        os.symlink(f, folder / f.name)
    (folder / "processor_config.json").unlink()
    (folder / "processor_config.json").write_text(json.dumps(processor_config))
    [problem] = preflight_problems("clip_score", {"model": str(folder)})
    assert problem.startswith("rewards[0] (clip_score).params: model: ") and message in problem
    with pytest.raises(RewardError, match="reward 'clip_score': could not load"):
        ClipScore(str(folder))  # what preflight refuses, the reward cannot load


def test_a_section_in_processor_config_wins_over_preprocessor_config(folders, tmp_path):
    """As transformers reads them: both files there, the nested section is the one loaded (so it is
    the one checked; an unusable preprocessor_config.json beside it does not matter)."""
    _, saved = folders
    folder = tmp_path / "both"
    folder.mkdir()
    for f in saved.iterdir():
        os.symlink(f, folder / f.name)
    (folder / "preprocessor_config.json").write_text('{"size": "not a size"}')
    assert preflight_problems("clip_score", {"model": str(folder)}) == []
    reward = ClipScore(str(folder))
    assert reward.image_processor.size == {"shortest_edge": 32}
