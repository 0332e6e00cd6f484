import torch

from diffrl.data.prompts import load_prompts
from diffrl.data.synthetic_text import SyntheticTextDataset, make_splits, target_text


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
