"""A benchmark's table: per category, the target's mean score, the baseline's, and their paired
difference with its standard error (the same prompts and seeds drawn by both models), then the
suite's overall row; and the JSON ``diffrl bench`` writes (``bench.json``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from diffrl.evaluation.evaluate import paired_difference

OVERALL_MEAN = "all"
"""The overall row of a suite scored by its plain mean over every sample (OCR, DrawBench)."""
OVERALL_OF_CATEGORIES = "overall (mean of categories)"
"""The overall row of GenEval: the mean over tags of each tag's mean (its summary_scores.py)."""


@dataclass(frozen=True)
class Row:
    category: str
    n: int
    """Samples (prompts x samples per prompt) in the row."""
    target: float
    baseline: float | None = None
    difference: float | None = None
    se: float | None = None
    """The paired difference's standard error (NaN for a single sample)."""


def table(
    scores: torch.Tensor,
    categories: Sequence[str],
    baseline: torch.Tensor | None = None,
    overall: str = OVERALL_MEAN,
) -> list[Row]:
    """Rows of one metric: ``scores (N,)`` (and ``baseline (N,)``, the same samples) grouped by
    ``categories`` (one per sample, rows in order of first appearance), then the overall row:
    :data:`OVERALL_MEAN` over all samples, or :data:`OVERALL_OF_CATEGORIES`, the mean of the
    category means, whose paired difference is the mean of theirs and whose SE is
    ``sqrt(sum se_c^2) / C`` (the categories' samples are disjoint)."""
    if len(categories) != len(scores) or (baseline is not None and baseline.shape != scores.shape):
        raise ValueError(f"{len(scores)} scores, {len(categories)} categories and baseline {baseline}")
    rows = []
    for name in dict.fromkeys(categories):
        index = torch.tensor([c == name for c in categories])
        rows.append(_row(name, scores[index], None if baseline is None else baseline[index]))
    if len(rows) == 1:  # one category: the overall row would repeat it
        return rows
    if overall == OVERALL_MEAN:
        rows.append(_row(overall, scores, baseline))
        return rows
    k = len(rows)
    mean = sum(r.target for r in rows) / k
    if baseline is None:
        rows.append(Row(overall, len(scores), mean))
        return rows
    base = sum(r.baseline for r in rows) / k
    diff = sum(r.difference for r in rows) / k
    se = math.sqrt(sum(r.se**2 for r in rows)) / k
    rows.append(Row(overall, len(scores), mean, base, diff, se))
    return rows


def _row(name: str, scores: torch.Tensor, baseline: torch.Tensor | None) -> Row:
    mean = scores.double().mean().item()
    if baseline is None:
        return Row(name, len(scores), mean)
    diff, se = paired_difference(scores, baseline)
    return Row(name, len(scores), mean, baseline.double().mean().item(), diff, se)


def _num(value: float | None, signed: bool = False) -> str:
    if value is None:
        return ""
    return f"{value:+.4f}" if signed else f"{value:.4f}"


def render(metric: str, rows: list[Row], paired: bool) -> str:
    """One metric's rows as a plain-text table (with the baseline's columns when ``paired``)."""
    width = max(len(metric), *(len(r.category) for r in rows))
    head = f"{metric:<{width}}  {'n':>5}  {'target':>8}"
    if paired:
        head += f"  {'baseline':>8}  difference +- SE (paired)"
    lines = [head]
    for r in rows:
        line = f"{r.category:<{width}}  {r.n:>5}  {_num(r.target):>8}"
        if paired:
            line += f"  {_num(r.baseline):>8}  {_num(r.difference, True)} +- {_num(r.se)}"
        lines.append(line)
    return "\n".join(lines)


def finite(value: Any) -> Any:
    """``value`` with NaN / inf floats as None, recursively (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def rows_json(rows: list[Row]) -> list[dict[str, Any]]:
    return [finite(asdict(r)) for r in rows]
