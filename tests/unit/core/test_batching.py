"""The :class:`~diffrl.core.batching.Batch` mixin: a dataclass of per-sample fields (tensors with the
batch on dim 0, lists, objects with their own ``select``/``cat`` such as
:class:`~diffrl.core.rollout.Conditioning`, or ``None``) sliced, concatenated, split and moved by sample."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from diffrl.core.batching import Batch
from diffrl.core.rollout import Conditioning


@dataclass
class Examples(Batch):
    x: torch.Tensor
    names: list[str]
    cond: Conditioning
    extra: torch.Tensor | None = None


@dataclass
class OptionalFirst(Batch):
    """Its first field is ``None``: the length comes from the next one."""

    maybe: torch.Tensor | None
    names: list[str]


def examples(n: int = 5, extra: bool = False) -> Examples:
    return Examples(
        x=torch.arange(n * 3, dtype=torch.float32).view(n, 3),
        names=[f"s{i}" for i in range(n)],
        cond=Conditioning({"h": torch.arange(n * 2).view(n, 2), "p": -torch.arange(n)}),
        extra=torch.arange(n) * 10 if extra else None,
    )


def assert_same(a: Examples, b: Examples) -> None:
    assert torch.equal(a.x, b.x)
    assert a.names == b.names
    assert a.cond.tensors.keys() == b.cond.tensors.keys()
    for k in a.cond.tensors:
        assert torch.equal(a.cond.tensors[k], b.cond.tensors[k])
    assert (a.extra is None) == (b.extra is None)
    if a.extra is not None:
        assert torch.equal(a.extra, b.extra)


def test_len_is_the_number_of_samples():
    assert len(examples(5)) == 5
    assert len(OptionalFirst(None, ["a", "b", "c"])) == 3
    assert len(OptionalFirst(None, [])) == 0


@pytest.mark.parametrize("index", [[3, 0, 3], torch.tensor([3, 0, 3])], ids=["list", "tensor"])
@pytest.mark.parametrize("extra", [False, True], ids=["none-field", "tensor-field"])
def test_select_takes_the_rows_in_the_given_order_from_every_field(index, extra):
    b = examples(5, extra=extra)
    s = b.select(index)
    assert type(s) is Examples and len(s) == 3
    assert torch.equal(s.x, b.x[[3, 0, 3]])
    assert s.names == ["s3", "s0", "s3"]
    assert torch.equal(s.cond.tensors["h"], b.cond.tensors["h"][[3, 0, 3]])
    assert torch.equal(s.cond.tensors["p"], b.cond.tensors["p"][[3, 0, 3]])
    if extra:
        assert torch.equal(s.extra, b.extra[[3, 0, 3]])
    else:
        assert s.extra is None


def test_select_does_not_change_the_batch():
    b = examples(4)
    b.select([1])
    assert_same(b, examples(4))


def test_cat_joins_the_parts_in_order():
    a, b = examples(2, extra=True), examples(3, extra=True).select([2, 1, 0])
    joined = Examples.cat([a, b])
    assert len(joined) == 5
    assert torch.equal(joined.x, torch.cat([a.x, b.x]))
    assert joined.names == a.names + b.names
    assert torch.equal(joined.cond.tensors["h"], torch.cat([a.cond.tensors["h"], b.cond.tensors["h"]]))
    assert torch.equal(joined.extra, torch.cat([a.extra, b.extra]))
    assert Examples.cat([examples(2), examples(1)]).extra is None  # None fields stay None


@pytest.mark.parametrize("extra", [False, True], ids=["none-field", "tensor-field"])
def test_cat_then_select_round_trips(extra):
    b = examples(7, extra=extra)
    parts = [b.select([4, 0]), b.select([6]), b.select([1, 5, 2, 3])]
    order = [4, 0, 6, 1, 5, 2, 3]
    joined = Examples.cat(parts)
    assert_same(joined, b.select(order))
    back = [order.index(i) for i in range(7)]  # where each original row landed
    assert_same(joined.select(back), b)


@pytest.mark.parametrize("n, size", [(7, 3), (6, 2), (4, 4), (3, 5), (5, 1)])
def test_micro_batches_are_contiguous_and_of_the_given_size_but_the_last(n, size):
    b = examples(n)
    parts = b.micro_batches(size)
    assert [len(p) for p in parts[:-1]] == [size] * (len(parts) - 1)
    assert 1 <= len(parts[-1]) <= size
    assert_same(Examples.cat(parts), b)


@pytest.mark.parametrize("n, count", [(7, 3), (6, 3), (5, 5), (5, 1), (10, 4)])
def test_split_gives_count_contiguous_parts_whose_sizes_differ_by_at_most_one(n, count):
    b = examples(n)
    parts = b.split(count)
    sizes = [len(p) for p in parts]
    assert len(parts) == count and sum(sizes) == n
    assert max(sizes) - min(sizes) <= 1
    assert_same(Examples.cat(parts), b)


def test_to_moves_every_tensor_and_leaves_lists_and_none_alone():
    b = examples(3)
    moved = b.to("meta")  # a device every machine has; it holds shapes, not values
    assert moved.x.device.type == "meta" and moved.x.shape == b.x.shape
    assert all(t.device.type == "meta" for t in moved.cond.tensors.values())
    assert moved.names == b.names and moved.extra is None
    assert b.x.device.type == "cpu"  # the original stays where it was
    assert_same(b.to("cpu"), b)
