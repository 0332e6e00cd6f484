"""Every random draw derives from the run seed and the identity of what it is for.

A draw is keyed by a tuple such as ``(seed, "rollout", rollout_id, prompt_index, sample_index)``,
so results do not depend on batch layout, micro-batch size or the number of workers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch


def derive_seed(*key: object) -> int:
    """A 63-bit seed from any tuple of ints/strings (stable across processes and platforms)."""
    text = "\x1f".join(str(k) for k in key)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def generator(*key: object) -> torch.Generator:
    """A CPU generator seeded from ``key``."""
    return torch.Generator(device="cpu").manual_seed(derive_seed(*key))


def randn(shape: Sequence[int], *key: object, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal draw of ``shape`` for one identity ``key`` (always drawn on CPU)."""
    return torch.randn(tuple(shape), generator=generator(*key), dtype=dtype)


def randn_batch(
    shape: Sequence[int], keys: Sequence[tuple], dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Stack one draw of ``shape`` per key: returns ``(len(keys), *shape)``."""
    return torch.stack([randn(shape, *k, dtype=dtype) for k in keys])


class EpochStream:
    """An endless stream of indices into ``n`` items: epoch after epoch, each a permutation keyed
    by (seed, name, epoch). Position ``p`` always maps to the same index, whatever was read before."""

    def __init__(self, n: int, seed: int, name: str):
        self.n, self.seed, self.name = n, seed, name
        self._perms: dict[int, list[int]] = {}

    def __getitem__(self, position: int) -> int:
        epoch, offset = divmod(position, self.n)
        if epoch not in self._perms:
            if len(self._perms) > 2:
                self._perms.clear()
            self._perms[epoch] = torch.randperm(
                self.n, generator=generator(self.seed, self.name, epoch)
            ).tolist()
        return self._perms[epoch][offset]

    def take(self, start: int, count: int) -> list[int]:
        return [self[p] for p in range(start, start + count)]
