import io

import numpy as np
import torch
from PIL import Image

from diffrl.config import RewardConfig
from diffrl.rewards.base import RewardSet
from diffrl.rewards.jpeg import JpegCompressibility, JpegIncompressibility
from tests.unit.rewards.tiny_clip import random_images


def pil_jpeg_kilobytes(image: torch.Tensor) -> float:
    """DDPO's computation on one (3, H, W) image in [0, 1]: uint8, PIL JPEG at quality 95, bytes / 1000."""
    array = (image * 255).round().clamp(0, 255).to(torch.uint8).permute(1, 2, 0).numpy()
    buffer = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(array)).save(buffer, format="JPEG", quality=95)
    return len(buffer.getvalue()) / 1000


def test_value_is_the_pil_jpeg_size_in_kilobytes():
    images = random_images(3, 40, 56, seed=20)
    expected = torch.tensor([pil_jpeg_kilobytes(i) for i in images])
    # both sides are an integer byte count / 1000 rounded once to float32: exactly equal
    assert torch.equal(JpegIncompressibility()(images, [""] * 3, [{}] * 3), expected)
    assert torch.equal(JpegCompressibility()(images, [""] * 3, [{}] * 3), -expected)


def test_a_flat_image_compresses_better_than_noise():
    flat = torch.full((3, 64, 64), 0.5)
    noise = torch.rand(3, 64, 64, generator=torch.Generator().manual_seed(0))
    scores = JpegCompressibility()(torch.stack([flat, noise]), ["", ""], [{}, {}])
    assert scores[0] > scores[1]
    sizes = JpegIncompressibility()(torch.stack([flat, noise]), ["", ""], [{}, {}])
    assert sizes[1] > 3 * sizes[0]  # noise barely compresses: several times the flat image's size


def test_registered_by_name_and_scores_rollout_uint8_images():
    images = random_images(2, 32, 32, seed=21)
    rewards = RewardSet([RewardConfig("jpeg_compressibility"), RewardConfig("jpeg_incompressibility")])
    out = rewards((images * 255).round().to(torch.uint8), ["", ""], [{}, {}])
    expected = torch.tensor([pil_jpeg_kilobytes(i) for i in images])
    assert torch.equal(out.per_reward["jpeg_incompressibility"], expected)
    assert torch.equal(out.per_reward["jpeg_compressibility"], -expected)
    rewards.close()
