"""OCR reward: how well the text in the image matches the quoted text in the prompt.

Formula as flow_grpo's ``flow_grpo/ocr.py`` (Liu et al. 2025, "Flow-GRPO"): the target is the text
between the first pair of double quotes; target and recognised text are lower-cased with spaces
removed; the distance is 0 if the target occurs in the recognised text, else their Levenshtein
distance capped at the target's length; reward = 1 - distance / len(target).

Recognition uses PP-OCR through ``rapidocr-onnxruntime`` (its models ship inside the wheel, no
download), in a small pool of worker processes so it does not block the trainer; the workers die
with the trainer (:class:`~diffrl.rewards.workers.ProcessPool`). With one worker or none it runs
in this process, on the reward's call thread.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch
from rapidocr_onnxruntime import RapidOCR

from diffrl.rewards.base import Pending, Reward
from diffrl.rewards.workers import ProcessPool
from diffrl.rollout import quantize


def levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def ocr_reward_from_text(recognized: str, prompt: str) -> float:
    """The flow_grpo formula on already-recognised text."""
    parts = prompt.split('"')
    if len(parts) < 3:
        raise ValueError(f'OCR reward: prompt {prompt!r} has no quoted target text (e.g. the text "AB12")')
    target = parts[1].replace(" ", "").lower()
    if not target:
        raise ValueError(f"OCR reward: prompt {prompt!r} quotes an empty string")
    text = recognized.replace(" ", "").lower()
    dist = 0 if target in text else min(levenshtein(text, target), len(target))
    return 1.0 - dist / len(target)


_ENGINE = None


def _engine():
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
    engine = _engine()
    out = []
    for img in images:
        result, _ = engine(img, use_det=True, use_cls=False, use_rec=True)
        # flow_grpo keeps every line with a positive confidence, joined in reading order
        out.append("".join(r[1] for r in result if float(r[2]) > 0) if result else "")
    return out


WORKER_NICENESS = 19
"""The OCR workers yield the CPU to the training process. On a CPU the sampler's forwards are
the critical path and their threads synchronise at every op, so a worker that preempts one of them
stalls all: on the 2-core machine the main job's rollout took 6.0-6.6 s per iteration with the
workers at the trainer's priority and 4.4-5.0 s at niceness 19 (bf16 autocast; the scores still
arrive during the rollout's gaps and after its last micro-group)."""


def _worker_init() -> None:
    torch.set_num_threads(1)
    os.nice(WORKER_NICENESS)
    _engine()


class OCRReward(Reward):
    name = "ocr"

    def __init__(self, num_workers: int | None = None):
        self.num_workers = min(2, os.cpu_count() or 1) if num_workers is None else num_workers
        self._pool: ProcessPool | None = None

    def use_in_process(self) -> None:
        self.num_workers = 1

    def _get_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(self.num_workers, _worker_init, name="ocr")
        return self._pool

    def _jobs(self, batch_size: int) -> int:
        """How many pool jobs a batch is split into (0: recognise in this process)."""
        return 0 if self.num_workers <= 1 or batch_size < 2 else min(self.num_workers, batch_size)

    def _send(self, images: torch.Tensor, timeout: float | None):
        """Start recognising ``images (B, 3, H, W)`` in the pool; job i takes images i, i + n, ..."""
        arrays, n = list(quantize(images).permute(0, 2, 3, 1).numpy()), self._jobs(len(images))
        return self._get_pool().map(recognize, [(arrays[i::n],) for i in range(n)], timeout)

    def recognize(self, images: torch.Tensor) -> list[str]:
        """The text found in each image (in the pool if there is one; no deadline)."""
        if not self._jobs(len(images)):
            return recognize(list(quantize(images).permute(0, 2, 3, 1).numpy()))  # HxWx3 uint8 each
        return _interleave(self._send(images, None).result(), len(images))

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata) -> torch.Tensor:
        texts = self.recognize(images)
        return torch.tensor([ocr_reward_from_text(t, p) for t, p in zip(texts, prompts)])

    def submit(
        self, images: torch.Tensor, prompts: Sequence[str], metadata, timeout: float | None = None
    ) -> Pending:
        if not self._jobs(len(images)):  # in this process, on the call thread, with the deadline
            return super().submit(images, prompts, metadata, timeout)
        call, b = self._send(images, timeout), len(images)
        return Pending(
            lambda: [ocr_reward_from_text(t, p) for t, p in zip(_interleave(call.result(), b), prompts)]
        )

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None


def _interleave(parts: list[list[str]], n: int) -> list[str]:
    """The results of jobs that took every ``len(parts)``-th image, back in image order."""
    out = [""] * n
    for i, texts in enumerate(parts):
        out[i :: len(parts)] = texts
    return out
