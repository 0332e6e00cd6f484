"""Each suite's scorer, by the suite's name: the torch side of :data:`diffrl.bench.suites.SUITES`
(which stays free of torch, so the command line checks a user's inputs before torch loads).

``diffrl bench`` calls ``SCORERS[suite](setup)`` with what the command line gave
(:class:`ScorerSetup`); a suite without an entry here is a bug the tests catch (one table each
way, the same names).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from diffrl.bench.detect import ColourClassifier, Detector, model_problems
from diffrl.bench.geneval import GenevalSettings
from diffrl.bench.score import GenevalScorer, OcrScorer, RewardsScorer, Scorer
from diffrl.config import RewardConfig
from diffrl.core.errors import DiffrlError
from diffrl.rewards.base import RewardSet


@dataclass(frozen=True)
class ScorerSetup:
    """What a suite's scorer is made from."""

    num_images: int
    """Images the bench will score in all (the target's and any baseline's)."""
    rewards: list[RewardConfig]
    """``eval.rewards`` (DrawBench scores with them)."""
    device: torch.device
    """Where GenEval's detector and colour classifier run."""
    detector: str | None = None
    clip: str | None = None
    nms: float = 0.5
    geneval: GenevalSettings = GenevalSettings()


def _ocr(setup: ScorerSetup) -> Scorer:
    return OcrScorer(setup.num_images)


def _geneval(setup: ScorerSetup) -> Scorer:
    if problems := model_problems(setup.detector, setup.clip):
        raise DiffrlError("; ".join(problems))
    detector = Detector(setup.detector, setup.device, setup.nms)
    return GenevalScorer(detector, ColourClassifier(setup.clip, setup.device), setup.geneval)


def _drawbench(setup: ScorerSetup) -> Scorer:
    return RewardsScorer(RewardSet(setup.rewards))


SCORERS: dict[str, Callable[[ScorerSetup], Scorer]] = {
    "ocr": _ocr,
    "geneval": _geneval,
    "drawbench": _drawbench,
}
"""Each suite's scorer factory (the suites: :data:`diffrl.bench.suites.SUITES`)."""
