"""Writes ``geneval_rules.json``: GenEval's own decisions on random detections, for
``tests/unit/bench/test_geneval_reference.py``.

Run with the path of GenEval's ``evaluation/evaluate_images.py`` (djghosh13/geneval, commit
af4902f): ``python tests/data/reference/make_geneval_rules.py PATH``. Its functions
``compute_iou``, ``relative_position``, ``evaluate`` and ``evaluate_image`` are taken from that file
as they are (by ``ast``) and run here with mmdet, open_clip and the colour model replaced by the
random detections of each case and a colour given to each box; nothing else of GenEval is needed.
"""

from __future__ import annotations

import ast
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white"]
CLASSES = ["dog", "cat", "car", "chair", "umbrella", "apple"]
POSITIONS = ["left of", "right of", "above", "below"]
SIZE = 64


def reference_functions(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    wanted = {"compute_iou", "relative_position", "evaluate", "evaluate_image"}
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in wanted]
    namespace: dict = {"np": np, "json": json, "Image": Image, "ImageOps": ImageOps, "COLORS": COLORS}
    exec(compile(ast.Module(nodes, []), str(path), "exec"), namespace)
    return namespace


def random_metadata(rng: np.random.Generator) -> dict:
    tag = ["single_object", "two_object", "counting", "colors", "position", "color_attr"][rng.integers(6)]
    a, b = rng.choice(len(CLASSES), 2, replace=False)
    one = {"class": CLASSES[a], "count": 1}
    if tag == "single_object":
        return {"tag": tag, "include": [one]}
    if tag == "two_object":
        return {"tag": tag, "include": [one, {"class": CLASSES[b], "count": 1}]}
    if tag == "counting":
        n = int(rng.integers(2, 5))
        return {
            "tag": tag,
            "include": [{"class": CLASSES[a], "count": n}],
            "exclude": [{"class": CLASSES[a], "count": n + 1}],
        }
    if tag == "colors":
        return {"tag": tag, "include": [{**one, "color": COLORS[rng.integers(3)]}]}
    if tag == "position":
        relation = POSITIONS[rng.integers(4)]
        return {
            "tag": tag,
            "include": [{"class": CLASSES[b], "count": 1}, {**one, "position": [relation, 0]}],
        }
    return {
        "tag": tag,
        "include": [
            {**one, "color": COLORS[rng.integers(3)]},
            {"class": CLASSES[b], "count": 1, "color": COLORS[rng.integers(3)]},
        ],
    }


def random_boxes(rng: np.random.Generator) -> dict[str, list[list]]:
    """Class -> [x1, y1, x2, y2, score, colour]: a few classes, 0-6 boxes each, scores often near
    the thresholds, a few boxes nearly coinciding (for max_overlap)."""
    out = {}
    for name in CLASSES:
        boxes = []
        for _ in range(int(rng.integers(0, 7))):
            x, y = rng.uniform(0, SIZE - 8, 2)
            w, h = rng.uniform(4, 32, 2)
            choices = [rng.uniform(0, 1), rng.uniform(0.25, 0.35), rng.uniform(0.85, 1), rng.uniform(0.9, 1)]
            score = round(float(rng.choice(choices)), 3)
            corners = [round(float(v), 1) for v in (x, y, min(x + w, SIZE), min(y + h, SIZE))]
            boxes.append([*corners, score, COLORS[rng.integers(3)]])
            if rng.random() < 0.2:  # a near copy
                x1, y1, x2, y2, _, c = boxes[-1]
                boxes.append([x1 + 1, y1, x2 + 1, y2, round(score * 0.9, 3), c])
        out[name] = boxes
    return out


def main(path: Path, out: Path) -> None:
    ref = reference_functions(path)
    rng = np.random.default_rng(37)
    image = Path(tempfile.mkdtemp()) / "image.png"
    Image.new("RGB", (SIZE, SIZE)).save(image)
    cases = []
    for i in range(240):
        settings = {
            "threshold": 0.3,
            "counting_threshold": 0.9,
            "max_objects": 16 if i % 4 else int(rng.integers(1, 4)),
            "max_overlap": 1.0 if i % 3 else 0.5,
            "position_threshold": 0.1 if i % 5 else 0.3,
        }
        meta = random_metadata(rng)
        meta["prompt"] = f"case {i}"
        named = {c["class"] for key in ("include", "exclude") for c in meta.get(key, [])}
        boxes = {c: b if c in named else [] for c, b in random_boxes(rng).items()}  # others never matter
        colour = {tuple(b[:5]): b[5] for bs in boxes.values() for b in bs}
        ref.update(
            THRESHOLD=settings["threshold"],
            COUNTING_THRESHOLD=settings["counting_threshold"],
            MAX_OBJECTS=settings["max_objects"],
            NMS_THRESHOLD=settings["max_overlap"],
            POSITION_THRESHOLD=settings["position_threshold"],
            classnames=CLASSES,
            object_detector=None,
            inference_detector=lambda _, __, b=boxes: [
                np.array([x[:5] for x in b[c]], dtype=np.float64).reshape(-1, 5) for c in CLASSES
            ],
            color_classification=lambda img, found, name, c=colour: [
                c[tuple(float(v) for v in f[0][:5])] for f in found
            ],
        )
        result = ref["evaluate_image"](str(image), meta)
        cases.append(
            {
                "settings": settings,
                "metadata": meta,
                "boxes": boxes,
                "correct": bool(result["correct"]),
                "reason": result["reason"],
            }
        )
    positions = []
    ref["POSITION_THRESHOLD"] = 0.1
    for _ in range(200):
        a, b = (
            [round(float(v), 1) for v in [*sorted(rng.uniform(0, SIZE, 2)), *sorted(rng.uniform(0, SIZE, 2))]]
            for _ in range(2)
        )
        a, b = [a[0], a[2], a[1], a[3]], [b[0], b[2], b[1], b[3]]
        positions.append({"a": a, "b": b, "relations": sorted(ref["relative_position"]((a,), (b,)))})
    for p in positions:
        p["iou"] = float(ref["compute_iou"](p["a"], p["b"]))
    out.write_text(
        json.dumps(
            {
                "source": "djghosh13/geneval af4902f evaluation/evaluate_images.py",
                "cases": cases,
                "positions": positions,
            },
            separators=(",", ":"),
        )
    )


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(__file__).with_name("geneval_rules.json"))
