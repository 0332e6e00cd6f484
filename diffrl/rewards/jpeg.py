"""JPEG (in)compressibility: the size of the image saved as a JPEG (Black et al. 2023, "DDPO").

As DDPO's ``ddpo_pytorch/rewards.py`` (kvablack/ddpo-pytorch): the rollout's uint8 image saved
with PIL at ``quality=95`` (PIL's other defaults: 4:2:0 chroma subsampling, no optimisation), and

    jpeg_incompressibility = size in kB (bytes / 1000)
    jpeg_compressibility   = -size in kB

flow_grpo's copy (``flow_grpo/rewards.py``) divides compressibility by a further 500; a reward
``weight: 0.002`` gives the same signal here. No weights, nothing to load.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import Any

import torch

from diffrl.rewards.base import Reward
from diffrl.rewards.pretrained import pil_images

QUALITY = 95


def jpeg_kilobytes(images: torch.Tensor) -> torch.Tensor:
    """``images (B, 3, H, W)`` in [0, 1] -> ``(B,)`` JPEG sizes in kB."""
    sizes = []
    for picture in pil_images(images):
        buffer = io.BytesIO()
        picture.save(buffer, format="JPEG", quality=QUALITY)
        sizes.append(buffer.tell() / 1000)
    return torch.tensor(sizes, dtype=torch.float32)


class JpegIncompressibility(Reward):
    """Higher for images that compress worse (detail, texture, noise)."""

    name = "jpeg_incompressibility"

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        return jpeg_kilobytes(images)


class JpegCompressibility(Reward):
    """Higher for images that compress better (flat, smooth)."""

    name = "jpeg_compressibility"

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        return -jpeg_kilobytes(images)
