"""A small mixin that lets boundary dataclasses be sliced and concatenated by sample.

Every field is either a tensor with the batch on dim 0, a list with one item per sample, an object
with its own ``select``/``cat`` (e.g. :class:`~diffrl.core.rollout.Conditioning`), or ``None``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Self

import torch


class Batch:
    """Mixin for dataclasses whose fields are per-sample."""

    def __len__(self) -> int:
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) or isinstance(v, list):
                return len(v)
            if hasattr(v, "select") and hasattr(v, "__len__"):
                return len(v)
        return 0

    def select(self, index: Sequence[int] | torch.Tensor) -> Self:
        idx = torch.as_tensor(index, dtype=torch.long)
        values = {f.name: _select(getattr(self, f.name), idx) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return type(self)(**values)

    @classmethod
    def cat(cls, parts: Sequence[Self]) -> Self:
        values = {}
        for f in dataclasses.fields(cls):  # type: ignore[arg-type]
            items = [getattr(p, f.name) for p in parts]
            values[f.name] = _cat(items)
        return cls(**values)

    def to(self, device: torch.device | str) -> Self:
        """The same examples with every tensor on ``device`` (lists and ``None`` unchanged)."""
        values = {f.name: _to(getattr(self, f.name), device) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        return type(self)(**values)

    def micro_batches(self, size: int) -> list[Self]:
        return [self.select(range(i, min(i + size, len(self)))) for i in range(0, len(self), size)]

    def split(self, count: int) -> list[Self]:
        """``count`` contiguous parts whose sizes differ by at most one (``count <= len(self)``)."""
        n = len(self)
        bounds = [n * k // count for k in range(count + 1)]
        return [self.select(range(bounds[k], bounds[k + 1])) for k in range(count)]


def _select(v: Any, idx: torch.Tensor) -> Any:
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return v[idx.to(v.device)]
    if isinstance(v, list):
        return [v[i] for i in idx.tolist()]
    if hasattr(v, "select"):
        return v.select(idx)
    return v


def _to(v: Any, device: torch.device | str) -> Any:
    if isinstance(v, torch.Tensor) or (hasattr(v, "to") and hasattr(v, "select")):
        return v.to(device)
    return v


def _cat(items: list[Any]) -> Any:
    first = items[0]
    if first is None:
        return None
    if isinstance(first, torch.Tensor):
        return torch.cat(items)
    if isinstance(first, list):
        return [x for item in items for x in item]
    if hasattr(type(first), "cat"):
        return type(first).cat(items)
    return first
