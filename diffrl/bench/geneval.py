"""GenEval's correctness rules, on detections of any detector.

Written from GenEval's ``evaluation/evaluate_images.py`` (djghosh13/geneval; Ghosh et al. 2023,
"GenEval: An Object-Focused Framework for Evaluating Text-to-Image Alignment"): functions
``evaluate_image`` (which detections are kept), ``compute_iou``, ``relative_position`` and
``evaluate`` (the include / exclude / colour / position decision), and ``summary_scores.py`` (the
score: each tag's share of correct images, then their mean). What differs is only where the
detections and colours come from (:mod:`diffrl.bench.detect`; docs/bench.md says how).

Boxes are ``(x1, y1, x2, y2)`` in pixels, y growing downwards; scores in [0, 1].
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from diffrl.bench.suites import COLORS

Box = tuple[float, float, float, float]


@dataclass(frozen=True)
class Detection:
    box: Box
    score: float


@dataclass(frozen=True)
class GenevalSettings:
    """GenEval's options (``evaluate_images.py --options``), its defaults."""

    threshold: float = 0.3
    """A detection is kept above this score (``threshold``)..."""
    counting_threshold: float = 0.9
    """... or above this one for the ``counting`` tag (``counting_threshold``)."""
    max_objects: int = 16
    """Detections kept per class, the most confident first (``max_objects``)."""
    max_overlap: float = 1.0
    """A detection overlapping (IoU) a more confident kept one of its class by this much or more is
    dropped; 1.0: none is (``max_overlap``)."""
    position_threshold: float = 0.1
    """The margin of the position rule, a share of the two boxes' sizes (``position_threshold``)."""


def compute_iou(a: Sequence[float], b: Sequence[float]) -> float:
    """Intersection over union of two boxes, in GenEval's inclusive-pixel convention (a box's width
    is ``x2 - x1 + 1``)."""

    def area(box: Sequence[float]) -> float:
        return max(box[2] - box[0] + 1, 0) * max(box[3] - box[1] + 1, 0)

    inter = area([max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])])
    union = area(a) + area(b) - inter
    return inter / union if union else 0.0


def keep_detections(
    detections: Mapping[str, Sequence[Detection]], tag: str, settings: GenevalSettings
) -> dict[str, list[Detection]]:
    """Class -> the detections GenEval judges: above the tag's threshold, the most confident first,
    at most ``max_objects``, then greedily those overlapping a kept one by ``max_overlap`` or more
    dropped (``evaluate_image``). A class with none kept is absent."""
    threshold = settings.counting_threshold if tag == "counting" else settings.threshold
    kept: dict[str, list[Detection]] = {}
    for name, found in detections.items():
        # numpy's ascending argsort reversed, as GenEval orders them: of equal scores the later
        # detection comes first (the same ties GenEval breaks, the same objects judged)
        scores = np.array([d.score for d in found], dtype=np.float64)
        ranked = np.argsort(scores)[::-1]
        order = [found[i] for i in ranked if scores[i] > threshold][: settings.max_objects]
        chosen: list[Detection] = []
        while order:
            best = order.pop(0)
            chosen.append(best)
            if settings.max_overlap != 1:
                order = [d for d in order if compute_iou(best.box, d.box) < settings.max_overlap]
        if chosen:
            kept[name] = chosen
    return kept


def relative_position(a: Box, b: Box, position_threshold: float) -> set[str]:
    """Where box ``a`` lies relative to box ``b``: a subset of ``left of``, ``right of``, ``above``,
    ``below``. The centres' offset is shrunk on each axis by ``position_threshold`` times the two
    boxes' summed extent on it; a relation holds where the shrunk offset, over the offset's length,
    passes 0.5 (``relative_position``)."""
    boxes = np.array([a, b], dtype=np.float64).reshape(2, 2, 2)
    center_a, center_b = boxes.mean(axis=-2)
    dim_a, dim_b = np.abs(np.diff(boxes, axis=-2))[..., 0, :]
    offset = center_a - center_b
    revised = np.maximum(np.abs(offset) - position_threshold * (dim_a + dim_b), 0) * np.sign(offset)
    if np.all(np.abs(revised) < 1e-3):
        return set()
    dx, dy = revised / np.linalg.norm(offset)
    relations = set()
    if dx < -0.5:
        relations.add("left of")
    if dx > 0.5:
        relations.add("right of")
    if dy < -0.5:
        relations.add("above")
    if dy > 0.5:
        relations.add("below")
    return relations


ColourOf = Callable[[list[Detection], str], list[str]]
"""``(detections, class name) -> the colour of each`` (one of :data:`COLORS`)."""


def judge(
    objects: Mapping[str, list[Detection]],
    metadata: Mapping[str, Any],
    colour_of: ColourOf,
    settings: GenevalSettings,
) -> tuple[bool, str]:
    """GenEval's verdict on one image: ``objects`` as :func:`keep_detections` gives them,
    ``metadata`` the prompt's line. Include clauses are ANDed, exclude clauses ORed; colour and
    position are checked on the ``count`` most confident detections of a class only; a position
    is checked against every detection of the earlier clause it names, which must itself have
    matched. Returns (correct, the reasons it is not, one a line) (``evaluate``)."""
    correct = True
    reasons: list[str] = []
    matched_groups: list[list[Detection] | None] = []
    for req in metadata.get("include", []):
        name, count = req["class"], req["count"]
        matched = True
        found = objects.get(name, [])[:count]
        if len(found) < count:
            correct = matched = False
            reasons.append(f"expected {name}>={count}, found {len(found)}")
        else:
            if "color" in req:
                colours = colour_of(found, name)
                if colours.count(req["color"]) < count:
                    correct = matched = False
                    seen = ", ".join(f"{colours.count(c)} {c}" for c in COLORS if c in colours)
                    reasons.append(
                        f"expected {req['color']} {name}>={count}, found "
                        f"{colours.count(req['color'])} {req['color']}; and {seen}"
                    )
            if "position" in req and matched:
                relation, group = req["position"]
                targets = matched_groups[group]
                if targets is None:
                    correct = matched = False
                    reasons.append(f"no target for {name} to be {relation}")
                else:
                    for obj in found:
                        for target in targets:
                            true = relative_position(obj.box, target.box, settings.position_threshold)
                            if relation not in true:
                                correct = matched = False
                                reasons.append(
                                    f"expected {name} {relation} target, found {' and '.join(sorted(true))} target"
                                )
                                break
                        if not matched:
                            break
        matched_groups.append(found if matched else None)
    for req in metadata.get("exclude", []):
        name = req["class"]
        if len(objects.get(name, [])) >= req["count"]:
            correct = False
            reasons.append(f"expected {name}<{req['count']}, found {len(objects[name])}")
    return correct, "\n".join(reasons)


def classes(metadata: Mapping[str, Any]) -> list[str]:
    """The object classes a GenEval line names (include then exclude, each once, in order)."""
    names = [c["class"] for key in ("include", "exclude") for c in metadata.get(key, [])]
    return list(dict.fromkeys(names))


def geneval_score(correct_by_tag: Mapping[str, Sequence[float]]) -> float:
    """GenEval's overall score: the mean over tags of each tag's share of correct images
    (``summary_scores.py``: "Overall score (avg. over tasks)")."""
    shares = [float(np.mean(v)) for v in correct_by_tag.values() if len(v)]
    return float(np.mean(shares)) if shares else float("nan")
