"""GenEval's rules (djghosh13/geneval evaluation/evaluate_images.py) on hand-made detections: the
expected verdicts and relations are worked out by hand from its formulas, written beside each
case."""

from __future__ import annotations

import pytest

from diffrl.bench.geneval import (
    Detection,
    GenevalSettings,
    classes,
    compute_iou,
    geneval_score,
    judge,
    keep_detections,
    relative_position,
)

GENEVAL = GenevalSettings()


def test_settings_are_genevals_defaults():
    # evaluate_images.py: threshold 0.3, counting_threshold 0.9, max_objects 16, max_overlap 1.0,
    # position_threshold 0.1
    assert (GENEVAL.threshold, GENEVAL.counting_threshold, GENEVAL.max_objects) == (0.3, 0.9, 16)
    assert (GENEVAL.max_overlap, GENEVAL.position_threshold) == (1.0, 0.1)


def test_iou_counts_pixels_inclusively():
    assert compute_iou((0, 0, 9, 9), (0, 0, 9, 9)) == 1.0
    assert compute_iou((0, 0, 9, 9), (20, 20, 29, 29)) == 0.0
    # 10x10 boxes overlapping on a 5x5 corner: 25 / (100 + 100 - 25)
    assert compute_iou((0, 0, 9, 9), (5, 5, 14, 14)) == pytest.approx(25 / 175)
    # touching edges share a pixel row in GenEval's convention: 1x10 / (100 + 100 - 10)
    assert compute_iou((0, 0, 9, 9), (9, 0, 18, 9)) == pytest.approx(10 / 190)


@pytest.mark.parametrize(
    "a, b, threshold, expected",
    [
        ((0, 0, 10, 10), (50, 0, 60, 10), 0.1, {"left of"}),  # dx = -38/50 < -0.5
        ((50, 0, 60, 10), (0, 0, 10, 10), 0.1, {"right of"}),
        ((0, 0, 10, 10), (0, 50, 10, 60), 0.1, {"above"}),  # y grows downwards
        ((0, 50, 10, 60), (0, 0, 10, 10), 0.1, {"below"}),
        # diagonal: offset (-30, -30) shrunk by 0.1 * 20 = 2 -> (-28, -28) / 42.43 = -0.66 each
        ((0, 0, 10, 10), (30, 30, 40, 40), 0.1, {"left of", "above"}),
        # mostly left, a little up: (-40, -10) shrunk by 2 -> (-38, -8) / 41.2: dx -0.92, dy -0.19
        ((0, 0, 10, 10), (40, 10, 50, 20), 0.1, {"left of"}),
        # centres 1 px apart, inside the 2 px margin: no relation at all
        ((0, 0, 10, 10), (1, 1, 11, 11), 0.1, set()),
        # tall boxes side by side: (-12, 0) shrunk by 0.1 * 20 -> -10 / 12 = -0.83: left of ...
        ((0, 0, 10, 100), (12, 0, 22, 100), 0.1, {"left of"}),
        # ... but a margin of 0.6 * 20 = 12 swallows the whole offset
        ((0, 0, 10, 100), (12, 0, 22, 100), 0.6, set()),
    ],
)
def test_relative_position(a, b, threshold, expected):
    assert relative_position(a, b, threshold) == expected


def det(x: float, score: float, y: float = 0, size: float = 10) -> Detection:
    return Detection((x, y, x + size, y + size), score)


def test_kept_detections_follow_the_tags_threshold_count_and_order():
    found = {"dog": [det(0, 0.5), det(20, 0.95), det(40, 0.3), det(60, 0.91)], "cat": [det(0, 0.2)]}
    kept = keep_detections(found, "two_object", GENEVAL)
    # above 0.3 strictly, most confident first; a class with nothing left is absent
    assert [d.score for d in kept["dog"]] == [0.95, 0.91, 0.5] and "cat" not in kept
    counting = keep_detections(found, "counting", GENEVAL)
    assert [d.score for d in counting["dog"]] == [0.95, 0.91]  # above 0.9 for counting
    many = {"dog": [det(20 * i, 0.4 + i / 100) for i in range(20)]}
    assert len(keep_detections(many, "single_object", GENEVAL)["dog"]) == 16  # max_objects
    top3 = keep_detections(many, "single_object", GenevalSettings(max_objects=3))["dog"]
    assert [d.box[0] for d in top3] == [380, 360, 340]  # the three most confident


def test_max_overlap_drops_boxes_overlapping_a_more_confident_one():
    found = {"dog": [det(0, 0.9), det(1, 0.8), det(50, 0.7)]}  # the second overlaps the first: IoU 0.69
    assert len(keep_detections(found, "single_object", GENEVAL)["dog"]) == 3  # 1.0: nothing dropped
    kept = keep_detections(found, "single_object", GenevalSettings(max_overlap=0.5))
    assert [d.score for d in kept["dog"]] == [0.9, 0.7]


def no_colour(detections, name):
    raise AssertionError("no colour is asked for")


def test_single_and_two_objects():
    meta = {"tag": "two_object", "include": [{"class": "dog", "count": 1}, {"class": "cat", "count": 1}]}
    assert judge({"dog": [det(0, 0.9)], "cat": [det(50, 0.8)]}, meta, no_colour, GENEVAL) == (True, "")
    ok, why = judge({"dog": [det(0, 0.9)]}, meta, no_colour, GENEVAL)
    assert not ok and why == "expected cat>=1, found 0"


def test_counting_needs_the_count_and_no_more():
    meta = {
        "tag": "counting",
        "include": [{"class": "apple", "count": 3}],
        "exclude": [{"class": "apple", "count": 4}],
    }
    apples = [det(20 * i, 0.95) for i in range(5)]
    assert judge({"apple": apples[:3]}, meta, no_colour, GENEVAL)[0]
    assert judge({"apple": apples[:2]}, meta, no_colour, GENEVAL) == (False, "expected apple>=3, found 2")
    assert judge({"apple": apples[:4]}, meta, no_colour, GENEVAL) == (False, "expected apple<4, found 4")


def test_colour_is_asked_of_the_count_most_confident_detections_only():
    asked = []

    def colours(detections, name):
        asked.append((len(detections), name))
        return ["red"] * len(detections)

    meta = {"tag": "colors", "include": [{"class": "car", "count": 1, "color": "red"}]}
    assert judge({"car": [det(0, 0.9), det(50, 0.8)]}, meta, colours, GENEVAL)[0]
    assert asked == [(1, "car")]
    ok, why = judge({"car": [det(0, 0.9)]}, meta, lambda d, n: ["blue"], GENEVAL)
    assert not ok and why == "expected red car>=1, found 0 red; and 1 blue"


def test_colour_attribution_needs_both_colours():
    meta = {
        "tag": "color_attr",
        "include": [
            {"class": "vase", "count": 1, "color": "blue"},
            {"class": "book", "count": 1, "color": "yellow"},
        ],
    }
    table = {"vase": ["blue"], "book": ["yellow"]}
    objects = {"vase": [det(0, 0.9)], "book": [det(50, 0.9)]}
    assert judge(objects, meta, lambda d, n: table[n], GENEVAL)[0]
    assert not judge(objects, meta, lambda d, n: ["yellow"], GENEVAL)[0]  # a yellow vase


def test_position_is_checked_against_the_named_earlier_group():
    # "an umbrella left of a chair": include [chair, umbrella with position ("left of", 0)]
    meta = {
        "tag": "position",
        "include": [
            {"class": "chair", "count": 1},
            {"class": "umbrella", "count": 1, "position": ["left of", 0]},
        ],
    }
    assert judge({"chair": [det(60, 0.9)], "umbrella": [det(0, 0.9)]}, meta, no_colour, GENEVAL) == (True, "")
    ok, why = judge({"chair": [det(0, 0.9)], "umbrella": [det(60, 0.9)]}, meta, no_colour, GENEVAL)
    assert not ok and why == "expected umbrella left of target, found right of target"
    ok, why = judge({"umbrella": [det(0, 0.9)]}, meta, no_colour, GENEVAL)  # no chair: no target
    assert not ok and why == "expected chair>=1, found 0\nno target for umbrella to be left of"
    # the group holds the target class's first `count` detections only: a second chair on the
    # left does not matter
    chairs = [det(60, 0.9), det(0, 0.5, y=80)]
    assert judge({"chair": chairs, "umbrella": [det(0, 0.9)]}, meta, no_colour, GENEVAL)[0]


def test_classes_and_the_overall_score():
    meta = {
        "include": [{"class": "a", "count": 1}, {"class": "b", "count": 1}],
        "exclude": [{"class": "a", "count": 2}],
    }
    assert classes(meta) == ["a", "b"]
    # summary_scores.py: the mean over tags of each tag's share of correct images
    assert geneval_score({"counting": [1, 0, 0, 0], "colors": [1, 1]}) == pytest.approx((0.25 + 1) / 2)
