from pathlib import Path

import pytest
import torch

REFERENCE = Path(__file__).parent / "data" / "reference"
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _threads():
    torch.set_num_threads(2)


@pytest.fixture
def reference_dir() -> Path:
    return REFERENCE


def tiny_overrides(tmp_path: Path, **extra) -> list[str]:
    """Small, fast settings for end-to-end runs on a random tiny model."""
    base = {
        "run.output_dir": str(tmp_path / "run"),
        "model.path": "random",
        "train.iterations": 2,
        "train.batch_size": 4,
        "train.micro_batch_size": 2,
        "sampling.num_steps": 2,
        "sampling.guidance_scale": 1.0,  # tests that exercise CFG set it themselves
        "eval.num_prompts": 2,
        "eval.batch_size": 2,
        "eval.rewards": "[{name: ocr, params: {num_workers: 0}}]",
    }
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]
