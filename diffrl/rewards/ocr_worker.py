"""What runs inside an OCR worker process: the PP-OCR engine and :func:`recognize`.

Kept apart from :mod:`diffrl.rewards.ocr` so that a worker imports numpy and
``rapidocr-onnxruntime`` only, not torch (nor the rest of diffrl): a spawned worker imports the
module of each function it is sent. Measured on the 2-core machine: such a worker holds ~140 MB
with PP-OCR loaded, and ``import torch`` alone takes ~225 MB. (A spawned worker also imports the
parent's ``__main__``: the ``diffrl`` command's entry point is light for that reason too.)
"""

from __future__ import annotations

import os

import numpy as np
from rapidocr_onnxruntime import RapidOCR

WORKER_NICENESS = 19
"""The OCR workers yield the CPU to the training process. On a CPU the sampler's forwards are
the critical path and their threads synchronise at every op, so a worker that preempts one of them
stalls all: on the 2-core machine the main job's rollout took 6.0-6.6 s per iteration with the
workers at the trainer's priority and 4.4-5.0 s at niceness 19 (bf16 autocast; the scores still
arrive during the rollout's gaps and after its last micro-group)."""

_ENGINE = None


def engine() -> RapidOCR:
    """This process's PP-OCR engine (loaded at the first use)."""
    global _ENGINE
    if _ENGINE is None:
        # Detection sized as PaddleOCR's defaults (what flow_grpo's reward runs): the longest side
        # capped at 960, never upscaled. RapidOCR's own default scales the *shortest* side up to
        # 736, i.e. a 32 x 64 image to 736 x 1472: 16x slower here, for the same mean reward.
        _ENGINE = RapidOCR(
            intra_op_num_threads=1,
            inter_op_num_threads=1,
            det_limit_side_len=960,
            det_limit_type="max",
        )
    return _ENGINE


def recognize(images: list[np.ndarray]) -> list[str]:
    """PP-OCR detection + recognition; ``images``: HxWx3 uint8. Concatenates all found lines."""
    ocr = engine()
    out = []
    for img in images:
        result, _ = ocr(img, use_det=True, use_cls=False, use_rec=True)
        # flow_grpo keeps every line with a positive confidence, joined in reading order
        out.append("".join(r[1] for r in result if float(r[2]) > 0) if result else "")
    return out


def worker_init() -> None:
    """A worker's start: yield the CPU to the trainer, then load the engine (before the first job)."""
    os.nice(WORKER_NICENESS)
    engine()
