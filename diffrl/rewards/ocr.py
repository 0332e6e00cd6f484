"""OCR reward: how well the text in the image matches the quoted text in the prompt.

Formula as flow_grpo's ``flow_grpo/ocr.py`` (Liu et al. 2025, "Flow-GRPO"): the target is the text
between the first pair of double quotes; target and recognised text are lower-cased with spaces
removed; the distance is 0 if the target occurs in the recognised text, else their Levenshtein
distance capped at the target's length; reward = 1 - distance / len(target).

Recognition uses PP-OCR through ``rapidocr-onnxruntime`` (its models ship inside the wheel, no
download), in a small pool of worker processes so it does not block the trainer; the workers die
with the trainer (:class:`~diffrl.transport.workers.ProcessPool`). With one worker or none it runs
in this process, on the reward's call thread. The pool is sized to the cores this process may use
(:func:`default_num_workers`) and started when the reward is built into a reward set
(:meth:`OCRReward.start`), so that the first scoring call (often the eval before training) does not
wait for the workers to start; a worker imports only :mod:`diffrl.rewards.ocr_worker`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

import torch

from diffrl.config import Range
from diffrl.core.rollout import quantize
from diffrl.rewards.base import Pending, Reward
from diffrl.rewards.ocr_worker import recognize, worker_init
from diffrl.transport.workers import ProcessPool, pool_size


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


OCR_MAX_WORKERS = 4
"""The most OCR workers a pool gets by default: each holds its own PP-OCR engine (~140 MB), and
one scoring call is split into at most as many jobs as it has images (16 per micro-group in the
main job), so more workers would mostly wait."""
OCR_WORKER_BYTES = 256 * 2**20
"""The memory budgeted per OCR worker when sizing the pool (~140 MB measured, and the images in
flight)."""


def default_num_workers() -> int:
    """The OCR pool's size when ``num_workers`` is not given (see :func:`pool_size`): one worker
    per core this process may use, at most :data:`OCR_MAX_WORKERS`, no more than fit in half the
    memory available; 1 (no pool: OCR runs in this process) on a single core."""
    return pool_size(OCR_WORKER_BYTES, OCR_MAX_WORKERS)


class OCRReward(Reward):
    name = "ocr"

    def __init__(
        self,
        num_workers: Annotated[int, Range(0, 256, hint="0 or 1: none, OCR runs in this process")]
        | None = None,
    ):
        """``num_workers``: worker processes (0 or 1: none, OCR runs in this process); ``None``:
        :func:`default_num_workers`."""
        self.num_workers = default_num_workers() if num_workers is None else num_workers
        self._pool: ProcessPool | None = None

    def use_in_process(self) -> None:
        self.num_workers = 1

    def start(self) -> None:
        if self.num_workers > 1:
            self._get_pool().start()

    def _get_pool(self) -> ProcessPool:
        if self._pool is None:
            self._pool = ProcessPool(self.num_workers, worker_init, name="ocr")
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
