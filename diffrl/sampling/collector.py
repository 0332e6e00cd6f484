"""Collectors turn the algorithm's :class:`CollectionSpec` into a :class:`RolloutBatch`."""

from __future__ import annotations

import torch

from diffrl.algorithms.base import RolloutBatch
from diffrl.data.offline import OfflineDataset
from diffrl.models.base import ModelFamily
from diffrl.seeding import generator


class OfflineCollector:
    """Reads ``batch_size`` examples per iteration from an offline dataset (no sampling, no reward).

    Iteration ``k`` takes positions ``[k*B, (k+1)*B)`` of an endless stream of epochs, each a
    permutation keyed by (seed, epoch): the data order depends only on the seed.
    """

    def __init__(self, dataset: OfflineDataset, family: ModelFamily, batch_size: int, seed: int):
        self.dataset, self.family, self.batch_size, self.seed = dataset, family, batch_size, seed
        self._perms: dict[int, list[int]] = {}

    def _index(self, position: int) -> int:
        n = len(self.dataset)
        epoch, offset = divmod(position, n)
        if epoch not in self._perms:
            self._perms = {epoch: torch.randperm(n, generator=generator(self.seed, "epoch", epoch)).tolist()}
        return self._perms[epoch][offset]

    def collect(self, iteration: int) -> RolloutBatch:
        start = iteration * self.batch_size
        indices = [self._index(p) for p in range(start, start + self.batch_size)]
        images, prompts = zip(*(self.dataset[i] for i in indices))
        x0 = self.family.encode_images(torch.stack(images).to(self.family.device))
        idx = torch.tensor(indices)
        return RolloutBatch(
            prompts=list(prompts),
            metadata=[{} for _ in prompts],
            prompt_index=idx,
            sample_index=torch.arange(start, start + self.batch_size),  # stream position: unique per draw
            group_id=idx,
            x0=x0,
            cond=self.family.encode_prompts(list(prompts)),
        )
