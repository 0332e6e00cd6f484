"""GenEval's models on tiny random folders: the detector's boxes and scores are OWL-ViT's own
(as transformers' post-processing gives them), merged per class; the colour of a box is CLIP's
zero-shot choice over GenEval's colours with its three templates."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image
from transformers import CLIPModel, CLIPTokenizer, OwlViTForObjectDetection, OwlViTProcessor

from diffrl.bench.detect import (
    COCO_CLASSES,
    COLOUR_TEMPLATES,
    QUERY,
    ColourClassifier,
    Detector,
    crop_box,
    model_problems,
)
from diffrl.bench.geneval import Detection, compute_iou
from diffrl.bench.suites import COLORS
from diffrl.rewards.clip_embed import load_image_processor
from tests.unit.bench.tiny_detector import write_models

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return write_models(tmp_path_factory.mktemp("geneval_models"))


def picture(width: int = 48, height: int = 64, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype(np.uint8))


def test_detections_are_owlvits_boxes_and_scores(folders):
    detector_folder, _ = folders
    image, asked = picture(), ["unicorn", *COCO_CLASSES[:40]]  # a class outside COCO is queried too
    found = Detector(str(detector_folder), CPU, nms=1.0).detect(image, asked)
    # transformers' own post-processing of the same forward: best query per box, its sigmoid
    names = list(dict.fromkeys([*asked, *COCO_CLASSES]))
    processor = OwlViTProcessor.from_pretrained(detector_folder)
    model = OwlViTForObjectDetection.from_pretrained(detector_folder).eval()
    inputs = processor(
        text=[[QUERY.format(name=n) for n in names]], images=image, return_tensors="pt", truncation=True
    )
    with torch.no_grad():
        out = model(**inputs)
    ref = processor.post_process_grounded_object_detection(out, threshold=0.0, target_sizes=[(64, 48)])[0]
    for k, name in enumerate(asked):
        mine = found.get(name, [])
        theirs = [
            (box.clamp(min=0).tolist(), s.item())
            for box, s, label in zip(ref["boxes"], ref["scores"], ref["labels"])
            if label == k
        ]
        assert len(mine) == len(theirs)
        for d in mine:  # the same box (clamped into the 48 x 64 image) with the same score
            assert any(
                abs(d.score - s) < 1e-5 and np.allclose(d.box, np.minimum(b, [48, 64, 48, 64]), atol=1e-3)
                for b, s in theirs
            )
    assert set(found) <= set(asked)  # COCO's other classes only compete for the boxes
    assert sum(map(len, found.values())) > 0


def test_boxes_of_a_class_are_merged_most_confident_first(folders):
    detector_folder, _ = folders
    everything = Detector(str(detector_folder), CPU, nms=1.0).detect(picture(seed=1), list(COCO_CLASSES))
    merged = Detector(str(detector_folder), CPU, nms=0.3).detect(picture(seed=1), list(COCO_CLASSES))
    assert sum(map(len, merged.values())) < sum(map(len, everything.values()))  # 16 patches, 80 classes
    for name, kept in merged.items():
        assert [d.score for d in kept] == sorted((d.score for d in kept), reverse=True)
        assert all(compute_iou(a.box, b.box) < 0.3 for i, a in enumerate(kept) for b in kept[i + 1 :])
        assert kept[0] == max(everything[name], key=lambda d: d.score)


def test_the_colour_is_clips_zero_shot_choice_on_the_box(folders):
    _, clip_folder = folders
    image = picture(40, 40, seed=2)
    boxes = [Detection((0, 0, 20, 40), 0.9), Detection((10.4, 5.6, 39.6, 30.2), 0.8)]
    colours = ColourClassifier(str(clip_folder), CPU).colours(image, boxes, "car")
    # CLIPModel's forward: unit embeddings of the crops and of every colour's three templates,
    # each colour's templates averaged and made unit again (clip_benchmark's zero_shot_classifier)
    model, tokenizer = (
        CLIPModel.from_pretrained(clip_folder).eval(),
        CLIPTokenizer.from_pretrained(clip_folder),
    )
    texts = [t.format(c=c, name="car") for c in COLORS for t in COLOUR_TEMPLATES]
    crops = [image.crop((0, 0, 20, 40)), image.crop((10, 6, 40, 30))]
    pixels = load_image_processor("test", str(clip_folder))(images=crops, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        out = model(**tokenizer(texts, padding=True, return_tensors="pt"), pixel_values=pixels)
    weights = out.text_embeds.reshape(len(COLORS), 3, -1).mean(1)
    weights = weights / weights.norm(dim=-1, keepdim=True)
    expected = [COLORS[i] for i in (out.image_embeds @ weights.T).argmax(1).tolist()]
    assert colours == expected


def test_crop_box_is_whole_pixels_inside_the_image():
    assert crop_box((10.4, 5.6, 39.6, 30.2), 40, 40) == (10, 6, 40, 30)
    assert crop_box((5, 5, 5, 5), 40, 40) == (5, 5, 6, 6)  # never empty
    assert crop_box((-3, 50, 80, 60), 40, 40) == (0, 39, 40, 40)


def test_model_folders_that_are_not_ones(folders, tmp_path):
    detector_folder, clip_folder = folders
    assert model_problems(str(detector_folder), str(clip_folder)) == []
    missing = model_problems(None, None)
    assert "--suite geneval needs --detector FOLDER" in missing[0] and "needs --clip FOLDER" in missing[1]
    swapped = model_problems(str(clip_folder), str(detector_folder))
    assert "--detector" in swapped[0] and "holds a 'clip' model" in swapped[0] and "OWL-ViT" in swapped[0]
    assert "--clip" in swapped[1] and "holds a 'owlvit' model" in swapped[1]
    (tmp_path / "empty").mkdir()
    assert "has no config.json" in model_problems(str(tmp_path / "empty"), str(clip_folder))[0]


def test_a_batch_detects_as_one_image_at_a_time(folders):
    detector = Detector(str(folders[0]), CPU)
    images, asked = [picture(seed=3), picture(seed=4)], list(COCO_CLASSES[:20])
    for batched, alone in zip(
        detector.detect_many(images, asked), [detector.detect(i, asked) for i in images]
    ):
        assert batched.keys() == alone.keys()
        for name in alone:
            assert len(batched[name]) == len(alone[name])
            for a, b in zip(batched[name], alone[name]):
                assert a.score == pytest.approx(b.score, abs=1e-5) and np.allclose(a.box, b.box, atol=1e-3)
