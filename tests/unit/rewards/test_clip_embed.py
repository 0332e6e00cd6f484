"""What the CLIP rewards share: the PIL image processor, device and dtype."""

import pytest
import torch
from transformers import CLIPImageProcessorPil

from diffrl.rewards.clip_score import ClipScore
from tests.unit.rewards.tiny_clip import PROMPTS, random_images, write_clip


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("clip_embed") / "clip"
    write_clip(path, seed=30)
    return path


def test_image_processor_is_the_pil_backend_named_explicitly(folder, capfd):
    """No torchvision here: AutoProcessor would warn and fall back to the PIL class; the rewards
    load that class themselves, so nothing is printed (the values are checked per reward)."""
    reward = ClipScore(str(folder))
    assert type(reward.image_processor) is CLIPImageProcessorPil
    assert "falling back" not in capfd.readouterr().err


def test_bfloat16_model_scores_close_to_float32(folder):
    images = random_images(5, 32, 32, seed=31)
    full = ClipScore(str(folder))(images, PROMPTS, [{}] * 5)
    half = ClipScore(str(folder), dtype="bfloat16")
    assert half.model.dtype == torch.bfloat16
    scores = half(images, PROMPTS, [{}] * 5)
    assert scores.dtype == torch.float32
    # bfloat16 keeps 8 significant bits (relative error 2^-9 per rounding): through two layers the
    # scores (exp(logit_scale) / 30 = 1.8 times a cosine) moved by 6e-3 when measured; 0.02 leaves
    # room for other BLAS kernels while still far below the 0.13 spread of these scores
    torch.testing.assert_close(scores, full, atol=0.02, rtol=0)
    assert full.max() - full.min() > 0.1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_scores_match_cpu(folder):
    images = random_images(5, 32, 32, seed=32)
    cpu = ClipScore(str(folder))(images, PROMPTS, [{}] * 5)
    gpu = ClipScore(str(folder), device="cuda")
    assert gpu.model.device.type == "cuda"
    # TF32 may be on for CUDA matmuls (10-bit mantissa): 1e-3 on scores of order 1
    torch.testing.assert_close(gpu(images, PROMPTS, [{}] * 5), cpu, atol=1e-3, rtol=0)


def test_an_empty_batch_scores_nothing(folder):
    assert ClipScore(str(folder))(torch.zeros(0, 3, 32, 32), [], []).shape == (0,)
