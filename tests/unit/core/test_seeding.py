"""Every random draw derives from the run seed and the identity of what it is for
(:mod:`diffrl.core.seeding`): the same key gives the same draw in any process, another key another
draw, and a sample's draw does not depend on the batch it is drawn in."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from diffrl.core.seeding import EpochStream, derive_seed, generator, randn, randn_batch

KEY = (0, "rollout", 3, 7, 1)


def test_derive_seed_is_a_63_bit_function_of_the_key():
    seed = derive_seed(*KEY)
    assert isinstance(seed, int) and 0 <= seed < 2**63
    assert derive_seed(*KEY) == seed
    torch.Generator().manual_seed(seed)  # a seed torch takes


def test_derive_seed_is_the_same_in_another_process():
    """Stable across processes: not Python's salted ``hash``."""
    code = f"from diffrl.core.seeding import derive_seed; print(derive_seed(*{KEY!r}))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert int(out.stdout) == derive_seed(*KEY)


@pytest.mark.parametrize(
    "other",
    [
        (1, "rollout", 3, 7, 1),  # another run seed
        (0, "eval", 3, 7, 1),  # another purpose
        (0, "rollout", 4, 7, 1),  # another rollout
        (0, "rollout", 3, 8, 1),  # another prompt
        (0, "rollout", 3, 7, 0),  # another sample
        (0, "rollout", 3, 7),  # a shorter key
        (0, "rollout", 3, 1, 7),  # the same parts in another order
    ],
)
def test_every_part_of_the_key_changes_the_seed_and_the_draw(other):
    assert derive_seed(*other) != derive_seed(*KEY)
    assert not torch.equal(randn((16,), *other), randn((16,), *KEY))


def test_generator_and_randn_are_reproducible_and_on_the_cpu():
    g1, g2 = generator(*KEY), generator(*KEY)
    assert g1.device.type == "cpu" and g1.initial_seed() == derive_seed(*KEY)
    assert torch.equal(torch.rand(8, generator=g1), torch.rand(8, generator=g2))
    a = randn((2, 3), *KEY)
    assert a.shape == (2, 3) and a.dtype == torch.float32 and a.device.type == "cpu"
    assert torch.equal(a, randn((2, 3), *KEY))
    assert torch.equal(a, torch.randn(2, 3, generator=generator(*KEY)))
    assert randn((2, 3), *KEY, dtype=torch.float64).dtype == torch.float64


def test_a_row_of_randn_batch_depends_only_on_its_key():
    keys = [(0, "rollout", 1, p, s) for p in range(3) for s in range(2)]
    full = randn_batch((3, 4), keys)
    assert full.shape == (6, 3, 4)
    for i, k in enumerate(keys):
        assert torch.equal(full[i], randn((3, 4), *k))
    # another layout of the same samples: a sub-batch, another order, among other samples
    part = randn_batch((3, 4), [keys[4], keys[1]])
    assert torch.equal(part, full[[4, 1]])
    mixed = randn_batch((3, 4), [(9, "other", 0), keys[2], (9, "other", 1)])
    assert torch.equal(mixed[1], full[2])
    # and what was drawn before does not matter (no shared generator state)
    torch.manual_seed(123)
    torch.randn(100)
    assert torch.equal(randn_batch((3, 4), keys), full)
    assert not torch.equal(full[0], full[1])


@pytest.mark.parametrize("n", [1, 5, 12])
def test_each_epoch_is_a_permutation_and_epochs_differ(n):
    stream = EpochStream(n, seed=0, name="prompts")
    epochs = [stream.take(e * n, n) for e in range(4)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(n))
    if n >= 5:
        assert len({tuple(e) for e in epochs}) > 1  # reshuffled each epoch


def test_a_position_maps_to_the_same_index_whatever_was_read_before():
    n = 7
    reference = EpochStream(n, seed=3, name="prompts").take(0, 6 * n)
    stream = EpochStream(n, seed=3, name="prompts")
    for position in [40, 2, 23, 0, 41, 15, 9, 30]:  # out of order, across epochs
        assert stream[position] == reference[position]
    assert EpochStream(n, seed=3, name="prompts").take(30, 5) == reference[30:35]


def test_take_across_an_epoch_boundary_continues_in_the_next_epoch():
    n = 5
    stream = EpochStream(n, seed=0, name="data")
    first, second = stream.take(0, n), stream.take(n, n)
    assert stream.take(3, 4) == first[3:] + second[:2]
    assert (
        stream.take(2, 3 * n)
        == (first + second + stream.take(2 * n, n) + stream.take(3 * n, n))[2 : 2 + 3 * n]
    )


def test_the_stream_is_keyed_by_seed_and_name():
    n = 20
    a = EpochStream(n, seed=0, name="prompts").take(0, n)
    assert EpochStream(n, seed=0, name="prompts").take(0, n) == a
    assert EpochStream(n, seed=1, name="prompts").take(0, n) != a
    assert EpochStream(n, seed=0, name="eval").take(0, n) != a


def test_an_epoch_is_the_permutation_keyed_by_seed_name_and_epoch():
    n = 9
    stream = EpochStream(n, seed=4, name="prompts")
    for epoch in (0, 1, 5):
        want = torch.randperm(n, generator=generator(4, "prompts", epoch)).tolist()
        assert stream.take(epoch * n, n) == want
