"""Scoring a suite's samples as its benchmark does, and a benchmark run: sample a model on the
suite's prompts with fixed seeds (as ``diffrl eval``: noise keyed by (seed, prompt, sample)),
score, and tabulate per category against a baseline drawn with the same prompts and seeds.

- ``ocr``: flow_grpo's OCR accuracy (``flow_grpo/ocr.py``, ``OcrScorer.__call__``): the quoted
  text and the recognised text lower-cased without spaces, distance 0 when the target occurs in
  the text, else their Levenshtein distance capped at the target's length; accuracy =
  1 - distance / len(target) (:func:`diffrl.rewards.ocr.ocr_reward_from_text`), on the OCR
  reward's PP-OCR engine.
- ``geneval``: each image correct or not by GenEval's rules (:mod:`diffrl.bench.geneval`) on
  OWL-ViT detections and CLIP colours (:mod:`diffrl.bench.detect`); the overall score is the mean
  over tags of each tag's share of correct images.
- ``drawbench``: every reward of ``eval.rewards`` (PickScore, CLIPScore, aesthetic, ...), each
  its own table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from diffrl.bench.detect import ColourClassifier, Detector
from diffrl.bench.geneval import Detection, GenevalSettings, classes, judge, keep_detections
from diffrl.bench.suites import BenchPrompts
from diffrl.bench.table import OVERALL_MEAN, OVERALL_OF_CATEGORIES, Row, rows_json, table
from diffrl.config import Config
from diffrl.core.errors import DiffrlError
from diffrl.data.prompts import PromptSet
from diffrl.evaluation.evaluate import generate
from diffrl.models.base import FamilyRuntime
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.ocr import OCRReward, default_num_workers, ocr_reward_from_text
from diffrl.rewards.pretrained import pil_images


@dataclass
class Scored:
    """Per-sample scores: ``metrics`` name -> ``(N,)``; ``notes``: why each sample lost (GenEval's
    reasons, one string a sample, empty for none)."""

    metrics: dict[str, torch.Tensor]
    notes: list[str] = field(default_factory=list)


class Scorer(Protocol):
    overall: str
    """How the overall row is made (:data:`~diffrl.bench.table.OVERALL_MEAN` or ``_OF_CATEGORIES``)."""

    def score(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict], groups: Sequence[int]
    ) -> Scored:
        """``groups``: each sample's prompt index (rewards that judge a prompt's samples together
        group by it, never by the prompt's text)."""
        ...

    def close(self) -> None: ...


class OcrScorer:
    """flow_grpo's OCR accuracy on PP-OCR (the ``ocr`` reward's engine and pool)."""

    overall = OVERALL_MEAN

    IMAGES_PER_WORKER = 16
    """A worker's PP-OCR engine takes seconds to load: a pool worker per 16 images at least."""

    def __init__(self, num_images: int):
        """``num_images``: how many images will be read (the pool is sized to them: a handful are
        read in this process)."""
        workers = min(default_num_workers(), num_images // self.IMAGES_PER_WORKER)
        self.ocr = OCRReward(max(1, workers))
        self.ocr.start()

    def score(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict], groups: Sequence[int]
    ) -> Scored:
        texts = self.ocr.recognize(images)
        accuracy = [ocr_reward_from_text(t, p) for t, p in zip(texts, prompts, strict=True)]
        return Scored(
            {"accuracy": torch.tensor(accuracy, dtype=torch.float64)}, [f"read {t!r}" for t in texts]
        )

    def close(self) -> None:
        self.ocr.close()


class GenevalScorer:
    """GenEval's correctness (1 or 0 an image) on a :class:`Detector` and a :class:`ColourClassifier`."""

    overall = OVERALL_OF_CATEGORIES
    BATCH = 16
    """Images detected in one forward at most."""

    def __init__(self, detector: Detector, colour: ColourClassifier, settings: GenevalSettings):
        self.detector, self.colour, self.settings = detector, colour, settings

    def score(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict], groups: Sequence[int]
    ) -> Scored:
        correct, notes = [], []
        pictures = pil_images(images)
        found: list[dict[str, list[Detection]]] = []
        start = 0
        while start < len(pictures):  # a prompt's samples (the same line, one after another) at once
            end = start + 1
            while end < len(pictures) and end - start < self.BATCH and metadata[end] is metadata[start]:
                end += 1
            found += self.detector.detect_many(pictures[start:end], classes(metadata[start]))
            start = end
        for picture, meta, detections in zip(pictures, metadata, found, strict=True):
            objects = keep_detections(detections, meta["tag"], self.settings)
            ok, why = judge(
                objects, meta, lambda ds, name, p=picture: self.colour.colours(p, ds, name), self.settings
            )
            correct.append(float(ok))
            notes.append(why)
        return Scored({"correct": torch.tensor(correct, dtype=torch.float64)}, notes)

    def close(self) -> None:
        pass


class RewardsScorer:
    """Every reward of a :class:`RewardSet`, each its own metric (DrawBench's multi-reward table)."""

    overall = OVERALL_MEAN

    def __init__(self, rewards: RewardSet):
        self.rewards = rewards

    def score(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict], groups: Sequence[int]
    ) -> Scored:
        out = self.rewards.submit(images, list(prompts), list(metadata), groups=groups).result()
        if out.errors:
            raise RewardError(f"bench: {len(out.errors)} reward call(s) failed: " + "; ".join(out.errors[:3]))
        return Scored({name: s.double() for name, s in out.per_reward.items()})

    def close(self) -> None:
        self.rewards.close()


@dataclass
class Drawn:
    """A model's samples of a suite: ``index`` (each sample's prompt), ``images (N, 3, H, W)``."""

    index: list[int]
    images: torch.Tensor
    scored: Scored


def draw_and_score(
    family: FamilyRuntime,
    config: Config,
    prompts: BenchPrompts,
    samples_per_prompt: int,
    scorer: Scorer,
    label: str,
) -> Drawn:
    """Sample every prompt ``samples_per_prompt`` times with ``eval.seed`` (ODE, as ``diffrl eval``)
    and score the samples."""
    e = config.eval
    prompt_set = PromptSet(list(prompts.prompts), source=prompts.source)
    index, media = generate(family, config, prompt_set, samples_per_prompt, e.seed, e.batch_size, label)
    if media.images.ndim != 4:  # (N, 3, F, H, W): the benchmarks judge pictures
        raise DiffrlError(
            f"{prompts.suite} scores images; model family {family.description.name!r} draws videos (frames "
            f"{tuple(media.images.shape[2:3])}): bench a text-to-image model"
        )
    texts = [prompts.prompts[i] for i in index]
    metadata = [prompts.metadata[i] for i in index]
    return Drawn(index, media.images, scorer.score(media.images, texts, metadata, index))


@dataclass
class BenchResult:
    """A suite's tables and samples, as ``bench.json`` keeps them."""

    suite: str
    tables: dict[str, list[Row]]
    info: dict[str, Any]
    samples: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            **self.info,
            "tables": {metric: rows_json(rows) for metric, rows in self.tables.items()},
            "samples": self.samples,
        }


def tabulate(
    prompts: BenchPrompts, target: Drawn, baseline: Drawn | None, overall: str, info: dict[str, Any]
) -> BenchResult:
    """The tables (one per metric) and the per-sample record of a suite's run."""
    categories = [prompts.categories[i] for i in target.index]
    tables = {
        name: table(scores, categories, None if baseline is None else baseline.scored.metrics[name], overall)
        for name, scores in target.scored.metrics.items()
    }
    samples = []
    for k, i in enumerate(target.index):
        sample = {
            "prompt": prompts.prompts[i],
            "category": prompts.categories[i],
            "prompt_index": i,
            "scores": {n: s[k].item() for n, s in target.scored.metrics.items()},
        }
        if target.scored.notes:
            sample["note"] = target.scored.notes[k]
        if baseline is not None:
            sample["baseline_scores"] = {n: s[k].item() for n, s in baseline.scored.metrics.items()}
        samples.append(sample)
    return BenchResult(prompts.suite, tables, info, samples)
