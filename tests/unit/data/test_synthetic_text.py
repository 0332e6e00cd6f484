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


def test_edit_pairs_change_only_the_number_and_the_edit_set_holds_them():
    from diffrl.data.synthetic_text import SyntheticEditDataset

    prompts = ['the number "12"', 'the number "345"', 'the number "67"']
    data = SyntheticEditDataset(prompts, 6, seed=0, height=32, width=32)
    target, instruction, source = data[4]
    source_text, target_text_, _ = data.pair(4)
    assert instruction == f'replace the number with "{target_text_}"' and target_text(instruction) == "345"
    assert source_text != target_text_ and source_text in ("12", "67")
    assert target.shape == (3, 32, 32) and source.pixels.shape == (3, 32, 32)
    assert source.pixels.dtype == torch.uint8
    # one style: the background (top-left corner) is the same in both, the text differs
    assert torch.equal((target[:, 0, 0] * 255).round().to(torch.uint8), source.pixels[:, 0, 0])
    assert not torch.equal((target * 255).round().to(torch.uint8), source.pixels)
    assert torch.equal(data[4][2].pixels, SyntheticEditDataset(prompts, 6, 0, 32, 32)[4][2].pixels)


def test_an_edit_set_is_a_prompt_file_with_its_source_images(tmp_path):
    from diffrl.data.synthetic_text import SyntheticEditDataset, write_edit_set

    prompts = ['the number "12"', 'the number "345"']
    path = write_edit_set(tmp_path / "set", prompts, seed=0, height=16, width=16)
    ps = load_prompts(path)
    assert ps.prompts == ['replace the number with "12"', 'replace the number with "345"']
    assert ps.metadata[0]["source_text"] == "345" and ps.edits
    (source,) = ps.sources([1], 16, 16)
    assert torch.equal(source.pixels, SyntheticEditDataset(prompts, None, 0, 16, 16)[1][2].pixels)
