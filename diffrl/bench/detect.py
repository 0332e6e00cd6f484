"""The models GenEval's scoring runs, from transformers and local folders: an open-vocabulary
object detector (OWL-ViT or OWLv2) in place of GenEval's mmdet Mask2Former, and CLIP for the
colour of each detected object (GenEval: open_clip ViT-L-14, zero-shot over its colour list).

How this differs from the benchmark's detector (docs/bench.md says it for users):

- Mask2Former (COCO panoptic, closed set of 80 classes) gives each instance one class, a box and a
  mask; here every box of OWL-ViT is scored against text queries for the 80 COCO class names
  GenEval uses plus any other class the prompt names, and takes the best query as its class (so a
  dog is not also counted as a cat, as with a closed-set detector).
- OWL-ViT predicts a box per image patch: overlapping boxes of one object are merged by class-wise
  non-maximum suppression (``nms`` IoU, 0.5 by default) before GenEval's own rules, which expect
  one detection per instance.
- No instance masks: the colour of an object is CLIP's on its box crop, background included
  (GenEval pastes the masked object on grey first).
- Scores are OWL-ViT's sigmoid confidences, not Mask2Former's: GenEval's thresholds (0.3, 0.9 for
  counting) are kept by default and are options of the command.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from pathlib import Path

import torch
from PIL import Image
from transformers import (
    AutoTokenizer,
    Owlv2ForObjectDetection,
    Owlv2ImageProcessorPil,
    Owlv2Processor,
    OwlViTForObjectDetection,
    OwlViTImageProcessorPil,
    OwlViTProcessor,
)

from diffrl.bench.geneval import Detection, compute_iou
from diffrl.bench.suites import COLORS
from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import read_json_object
from diffrl.rewards.clip_embed import (
    image_embeddings,
    load_clip_model,
    load_image_processor,
    load_tokenizer,
    loading,
    text_embeddings,
    tokens,
    unit,
)
from diffrl.rewards.pretrained import folder_problems

COCO_CLASSES = (
    "person", "bicycle", "car", "motorcycle", "airplane", "bus", "train", "truck", "boat",
    "traffic light", "fire hydrant", "stop sign", "parking meter", "bench", "bird", "cat", "dog",
    "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe", "backpack", "umbrella",
    "handbag", "tie", "suitcase", "frisbee", "skis", "snowboard", "sports ball", "kite",
    "baseball bat", "baseball glove", "skateboard", "surfboard", "tennis racket", "bottle",
    "wine glass", "cup", "fork", "knife", "spoon", "bowl", "banana", "apple", "sandwich", "orange",
    "broccoli", "carrot", "hot dog", "pizza", "donut", "cake", "chair", "couch", "potted plant",
    "bed", "dining table", "toilet", "tv", "laptop", "computer mouse", "tv remote",
    "computer keyboard", "cell phone", "microwave", "oven", "toaster", "sink", "refrigerator",
    "book", "clock", "vase", "scissors", "teddy bear", "hair drier", "toothbrush",
)  # fmt: skip
"""The 80 COCO class names as GenEval's prompts spell them (its ``object_names.txt``)."""

DETECTORS = {
    "owlvit": (OwlViTForObjectDetection, OwlViTProcessor, OwlViTImageProcessorPil),
    "owlv2": (Owlv2ForObjectDetection, Owlv2Processor, Owlv2ImageProcessorPil),
}
"""model_type -> the model, its processor and its image processor's PIL backend (named: without
torchvision transformers 5 falls back to it with a warning)."""
DETECTOR_WHAT = "an OWL-ViT or OWLv2 detector (OwlViTForObjectDetection / Owlv2ForObjectDetection)"
CLIP_WHAT = "a CLIPModel with its tokenizer and preprocessor_config.json"
COLOUR_TEMPLATES = ("a photo of a {c} {name}", "a photo of a {c}-colored {name}", "a photo of a {c} object")
"""GenEval's prompts for the colour classifier (``color_classification``)."""
QUERY = "a photo of a {name}"
"""How a class is asked of the detector (OWL-ViT's own prompt form)."""


def model_problems(detector: str | None, clip: str | None) -> list[str]:
    """What is wrong with the ``--detector`` and ``--clip`` folders (read bounded; nothing loads)."""
    problems = []
    for flag, folder, types, what in (
        ("--detector", detector, set(DETECTORS), DETECTOR_WHAT),
        ("--clip", clip, {"clip"}, CLIP_WHAT),
    ):
        if folder is None:
            problems.append(
                f"--suite geneval needs {flag} FOLDER: a local folder of {what} (diffrl downloads nothing; "
                "docs/bench.md names the models)"
            )
        else:
            problems += folder_problems("geneval", flag, folder, types, what, True)
    return problems


class Detector:
    """An OWL-ViT / OWLv2 folder: ``detect(image, classes)`` -> class -> its detections."""

    def __init__(self, folder: str, device: torch.device, nms: float = 0.5):
        if problems := folder_problems("geneval", "--detector", folder, set(DETECTORS), DETECTOR_WHAT, True):
            raise DiffrlError(problems[0])
        path = str(Path(folder).expanduser())
        model_type = read_json_object(Path(path, "config.json"), "--detector", DETECTOR_WHAT)["model_type"]
        model_class, processor_class, image_processor_class = DETECTORS[model_type]
        if model_type == "owlv2" and importlib.util.find_spec("scipy") is None:
            raise DiffrlError(
                f"--detector {folder!r} is an OWLv2 folder, whose image processor needs scipy, which is "
                "not installed: pip install scipy, or give an OWL-ViT folder (e.g. google/owlvit-base-patch32)"
            )
        self.padded = model_type == "owlv2"  # OWLv2 pads to a square, OWL-ViT stretches
        what = f"{DETECTOR_WHAT} (its processor: tokenizer and preprocessor_config.json)"
        self.model = loading("geneval --detector", what, path, lambda: model_class.from_pretrained(path))
        self.model = self.model.to(device).eval().requires_grad_(False)
        self.processor = loading(
            "geneval --detector",
            what,
            path,
            lambda: processor_class(
                image_processor=image_processor_class.from_pretrained(path),
                tokenizer=AutoTokenizer.from_pretrained(path),
            ),
        )
        self.device, self.nms = device, nms

    def detect(self, image: Image.Image, classes: Sequence[str]) -> dict[str, list[Detection]]:
        """Every box the detector proposes, labelled with its best query among ``classes`` and
        the COCO classes, with that query's sigmoid score; per class, the most confident first,
        boxes overlapping a more confident one by ``nms`` IoU or more dropped."""
        return self.detect_many([image], classes)[0]

    @torch.no_grad()
    def detect_many(
        self, images: Sequence[Image.Image], classes: Sequence[str]
    ) -> list[dict[str, list[Detection]]]:
        """:meth:`detect` of each image, in one batched forward (a prompt's samples ask the same
        classes; OWL-ViT's forward still encodes the queries once per image of the batch)."""
        names = list(dict.fromkeys([*classes, *COCO_CLASSES]))
        queries = [QUERY.format(name=n) for n in names]
        inputs = self.processor(
            text=[queries] * len(images), images=list(images), return_tensors="pt", truncation=True
        )
        out = self.model(**{k: v.to(self.device) for k, v in inputs.items()})
        # the best query on the logits (a sigmoid saturated at 1.0 would tie), then its confidence
        best, labels = out.logits.float().max(-1)  # (B, patches, queries) -> (B, patches)
        return [
            self._found(image, best[b].sigmoid(), labels[b], out.pred_boxes[b], names, set(classes))
            for b, image in enumerate(images)
        ]

    def _found(
        self,
        image: Image.Image,
        scores: torch.Tensor,
        labels: torch.Tensor,
        pred_boxes: torch.Tensor,
        names: list[str],
        wanted: set[str],
    ) -> dict[str, list[Detection]]:
        """One image's boxes ``(patches, 4)`` (centre, size; relative) in pixels, by class."""
        w, h = image.size
        sx, sy = (max(w, h), max(w, h)) if self.padded else (w, h)
        cx, cy, bw, bh = pred_boxes.float().cpu().unbind(-1)
        boxes = torch.stack(
            [(cx - bw / 2) * sx, (cy - bh / 2) * sy, (cx + bw / 2) * sx, (cy + bh / 2) * sy], -1
        )
        boxes[:, 0::2] = boxes[:, 0::2].clamp(0, w)
        boxes[:, 1::2] = boxes[:, 1::2].clamp(0, h)
        found: dict[str, list[Detection]] = {}
        for box, score, label in zip(boxes.tolist(), scores.tolist(), labels.tolist()):
            if names[label] in wanted:
                found.setdefault(names[label], []).append(Detection(tuple(box), score))
        return {name: suppress(ds, self.nms) for name, ds in found.items()}


def crop_box(box: Sequence[float], width: int, height: int) -> tuple[int, int, int, int]:
    """``box`` rounded to whole pixels as PIL's ``crop`` rounds it, at least one pixel wide and
    high and inside the image (a zero-size crop has no colour)."""
    x1, y1, x2, y2 = (round(v) for v in box)
    x1, y1 = min(max(x1, 0), width - 1), min(max(y1, 0), height - 1)
    return x1, y1, min(max(x2, x1 + 1), width), min(max(y2, y1 + 1), height)


def suppress(detections: list[Detection], iou: float) -> list[Detection]:
    """Greedy non-maximum suppression: the most confident first, each dropping the later ones
    that overlap it by ``iou`` or more (1: none)."""
    order = sorted(detections, key=lambda d: -d.score)
    kept: list[Detection] = []
    while order:
        best = order.pop(0)
        kept.append(best)
        if iou < 1:  # 1: none dropped, as GenEval's max_overlap
            order = [d for d in order if compute_iou(best.box, d.box) < iou]
    return kept


class ColourClassifier:
    """CLIP zero-shot over GenEval's :data:`COLORS`: ``colours(image, detections, name)``."""

    def __init__(self, folder: str, device: torch.device):
        if problems := folder_problems("geneval", "--clip", folder, {"clip"}, CLIP_WHAT, True):
            raise DiffrlError(problems[0])
        self.model = load_clip_model("geneval --clip", folder, device, torch.float32)
        self.processor = load_image_processor("geneval --clip", folder)
        self.tokenizer = load_tokenizer("geneval --clip", folder)
        self._classifiers: dict[str, torch.Tensor] = {}

    def classifier(self, name: str) -> torch.Tensor:
        """``(D, colours)``: each colour's templates embedded, each unit-norm, averaged, unit-norm
        again (clip_benchmark's ``zero_shot_classifier``, which GenEval calls)."""
        if name not in self._classifiers:
            context = self.model.config.text_config.max_position_embeddings
            weights = []
            for c in COLORS:
                texts = [t.format(c=c, name=name) for t in COLOUR_TEMPLATES]
                weights.append(
                    unit(text_embeddings(self.model, **tokens(self.tokenizer, texts, context)).mean(0))
                )
            self._classifiers[name] = torch.stack(weights, 1)
        return self._classifiers[name]

    @torch.no_grad()
    def colours(self, image: Image.Image, detections: list[Detection], name: str) -> list[str]:
        """Each detection's colour: CLIP's best colour on the image cropped to its box."""
        if not detections:
            return []
        crops = [image.crop(crop_box(d.box, *image.size)) for d in detections]
        pixels = self.processor(images=crops, return_tensors="pt")["pixel_values"]
        logits = image_embeddings(self.model, pixels) @ self.classifier(name).to(self.model.device)
        return [COLORS[i] for i in logits.argmax(1).tolist()]
