"""diffrl's GenEval rules against GenEval's own code on the same detections: 240 random cases (every
tag, scores around the thresholds, nearly coinciding boxes, other max_objects / max_overlap /
position_threshold settings) and 200 box pairs, decided by ``evaluate_images.py``'s
``evaluate_image``, ``relative_position`` and ``compute_iou`` (tests/data/reference/geneval_rules.json,
written by make_geneval_rules.py beside it)."""

from __future__ import annotations

import json

import pytest

from diffrl.bench.geneval import (
    Detection,
    GenevalSettings,
    compute_iou,
    judge,
    keep_detections,
    relative_position,
)
from tests.conftest import REFERENCE

GOLDEN = json.loads((REFERENCE / "geneval_rules.json").read_text())


def test_the_cases_cover_every_tag_both_ways():
    seen = {(c["metadata"]["tag"], c["correct"]) for c in GOLDEN["cases"]}
    tags = ("single_object", "two_object", "counting", "colors", "position", "color_attr")
    assert seen == {(t, ok) for t in tags for ok in (True, False)}


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: c["metadata"]["prompt"])
def test_verdicts_and_reasons_are_genevals(case):
    settings = GenevalSettings(**case["settings"])
    found = {name: [Detection(tuple(b[:4]), b[4]) for b in boxes] for name, boxes in case["boxes"].items()}
    colour = {(tuple(b[:4]), b[4]): b[5] for boxes in case["boxes"].values() for b in boxes}
    objects = keep_detections(found, case["metadata"]["tag"], settings)
    verdict = judge(
        objects, case["metadata"], lambda ds, name: [colour[(d.box, d.score)] for d in ds], settings
    )
    assert verdict[0] == case["correct"] and relations_unordered(verdict[1]) == relations_unordered(
        case["reason"]
    )


def relations_unordered(reason: str) -> list:
    """GenEval joins a set of relations ("found right of and below target") in the set's order,
    which Python's string hashing changes from process to process; diffrl sorts them."""
    lines = []
    for line in reason.split("\n"):
        head, found, rest = line.partition(" target, found ")
        lines.append((head, frozenset(rest.removesuffix(" target").split(" and "))) if found else line)
    return lines


def test_relations_and_ious_are_genevals():
    for p in GOLDEN["positions"]:
        assert sorted(relative_position(tuple(p["a"]), tuple(p["b"]), 0.1)) == p["relations"], p
        assert compute_iou(p["a"], p["b"]) == pytest.approx(p["iou"], abs=1e-12), p
