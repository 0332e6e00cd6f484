import json

import pytest
import torch
from PIL import Image

from diffrl.data.offline import DatasetError, ImageFolderDataset
from diffrl.data.prompts import PromptFileError, load_prompts
from diffrl.data.synthetic_text import SyntheticTextDataset, make_splits, target_text


def test_txt_and_jsonl(tmp_path):
    (tmp_path / "p.txt").write_text('the text "AB"\nthe number "12"\n')
    assert load_prompts(tmp_path / "p.txt").prompts == ['the text "AB"', 'the number "12"']
    rows = [{"prompt": "a", "metadata": {"k": 1}}, {"prompt": "b"}]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    ps = load_prompts(tmp_path / "p.jsonl")
    assert ps.prompts == ["a", "b"] and ps.metadata == [{"k": 1}, {}]


def test_malformed_lines_are_all_reported(tmp_path):
    (tmp_path / "p.txt").write_text("a\n\nb\n   \nc\n")
    with pytest.raises(PromptFileError) as e:
        load_prompts(tmp_path / "p.txt")
    assert "line 2" in str(e.value) and "line 4" in str(e.value)
    (tmp_path / "p.jsonl").write_text('{"prompt": "a"}\n{not json}\n{"text": "b"}\n')
    with pytest.raises(PromptFileError) as e:
        load_prompts(tmp_path / "p.jsonl")
    assert "line 2: not valid JSON" in str(e.value) and "line 3" in str(e.value)
    with pytest.raises(PromptFileError, match="does not exist"):
        load_prompts(tmp_path / "missing.txt")


def test_shipped_splits_are_disjoint_and_rebuildable():
    train = load_prompts("builtin:tiny_text/train.txt").prompts
    test = load_prompts("builtin:tiny_text/test.txt").prompts
    assert not set(train) & set(test)
    assert (train, test) == make_splits(len(train), len(test))


def test_synthetic_examples_depend_only_on_seed_and_index():
    prompts = ['the text "AB3"', 'the number "42"']
    a = SyntheticTextDataset(prompts, 10, seed=0, height=32, width=64)
    b = SyntheticTextDataset(prompts, 10, seed=0, height=32, width=64)
    c = SyntheticTextDataset(prompts, 10, seed=1, height=32, width=64)
    img, prompt = a[3]
    assert img.shape == (3, 32, 64) and 0 <= img.min() and img.max() <= 1
    assert prompt == prompts[1] and target_text(prompt) == "42"
    assert torch.equal(a[3][0], b[3][0]) and not torch.equal(a[3][0], c[3][0])


def test_image_folder(tmp_path):
    Image.new("RGB", (64, 64), (255, 0, 0)).save(tmp_path / "a.png")
    (tmp_path / "a.txt").write_text("a red square")
    Image.new("RGB", (32, 32), (0, 255, 0)).save(tmp_path / "b.jpg")
    (tmp_path / "metadata.jsonl").write_text(json.dumps({"file_name": "b.jpg", "text": "green"}) + "\n")
    ds = ImageFolderDataset(tmp_path, 32, 64)
    assert len(ds) == 2
    img, cap = ds[0]
    assert img.shape == (3, 32, 64) and cap == "a red square" and img[0].mean() > 0.99


def test_image_folder_errors(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        ImageFolderDataset(tmp_path / "nope", 32, 64)
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    with pytest.raises(DatasetError, match="no caption"):
        ImageFolderDataset(tmp_path, 32, 64)
    (tmp_path / "a.txt").write_text("cap")
    (tmp_path / "broken.png").write_bytes(b"not a png")
    (tmp_path / "broken.txt").write_text("cap")
    ds = ImageFolderDataset(tmp_path, 32, 64)
    with pytest.raises(DatasetError, match="cannot decode image .*broken.png"):
        ds[1]
