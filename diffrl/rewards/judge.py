"""Judge reward: a vision-language model is asked a yes/no question about each image, and the score
is the probability it gives the answer "Yes" (VQAScore).

Follows VQAScore (Lin et al. 2024, "Evaluating Text-to-Visual Generation with Image-to-Text
Generation"), as linzhiqiu/t2v_metrics scores it with Qwen models
(``t2v_metrics/models/vqascore_models/qwen2vl_model.py`` and ``qwen3vl_model.py``): the question
``Does this figure show "{prompt}"? Please answer yes or no.`` (the template of
``clip_t5_model.py``, the paper's) goes in a user turn after the image, the chat template adds the
assistant prefix (``<|im_start|>assistant\\n``), and the score is read from the next-token
distribution there::

    score = softmax(logits[last])[yes]                     normalize: false (VQAScore)
    score = P(yes) / (P(yes) + P(no)) = sigmoid(l_yes - l_no)   normalize: true

t2v_metrics runs ``generate(max_new_tokens=1)`` and reads the first step's scores; one forward
pass gives those logits, before any logits processors a folder's ``generation_config.json`` would
add in ``generate`` (a repetition penalty, say), which a score should not depend on. Judge fine-tunes of the same models (UnifiedReward's
``UnifiedReward-qwen-*``, GenRM-style yes/no judges, an OCR judge asked whether the image shows
the quoted text) are used the same way with their own ``question`` and ``answer``; a judge that
writes a score as text (flow_grpo's ``unifiedreward_score_sglang`` parses "Final Score: 4") is a
different reward, not this one.

Inputs are built as the model's processor builds them for images (transformers 5.24,
``Qwen2_5_VLProcessor`` / ``Qwen3VLProcessor``: ``replace_image_token``): the image processor
resizes each image (``smart_resize``: sides rounded to multiples of ``patch_size * merge_size``,
pixel count kept within ``min_pixels`` .. ``max_pixels``) and patchifies it, and the chat
template's one ``<|image_pad|>`` is expanded to ``t * h * w / merge_size**2`` copies. The
processor class itself is not used: in transformers 5.24 it needs a video processor, which needs
torchvision. ``mm_token_type_ids`` (1 on image tokens) is passed too: without it Qwen2.5-VL
silently falls back to 1-D positions instead of its 3-D (M-RoPE) ones (Qwen3-VL raises).

Batches are left-padded, so every row's last position is its assistant prefix and only that
position's logits are computed (``logits_to_keep=1``: a full-vocabulary row per token would be
hundreds of MB per image).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText, AutoTokenizer

from diffrl.config import Range
from diffrl.config.schema import MAX_SIDE, ImagesPerForward
from diffrl.core.user_files import UserFileError, read_json_object, read_text
from diffrl.rewards.base import Reward, RewardError
from diffrl.rewards.clip_embed import loading
from diffrl.rewards.pretrained import (
    chunks,
    device_and_dtype,
    device_dtype_problems,
    folder_problems,
    pil_images,
)

VQASCORE_QUESTION = 'Does this figure show "{prompt}"? Please answer yes or no.'

MODEL_TYPES = ("qwen2_5_vl", "qwen3_vl")
"""``config.json`` model types whose processors build image inputs as above (tested: both)."""

WHAT = "a Qwen2.5-VL or Qwen3-VL model (e.g. Qwen/Qwen2.5-VL-7B-Instruct or a judge fine-tune of it)"

Pixels = Annotated[int, Range(1, MAX_SIDE**2, hint="pixels of an image, or null")]


class JudgeReward(Reward):
    """``images (B, 3, H, W)`` in [0, 1] + prompts -> ``(B,)`` P(answer | image, question)."""

    name = "judge"

    def __init__(
        self,
        model: str,
        processor: str | None = None,
        question: str = VQASCORE_QUESTION,
        answer: str = "Yes",
        normalize: bool = False,
        negative: str = "No",
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: ImagesPerForward = 8,
        max_pixels: Pixels | None = None,
        min_pixels: Pixels | None = None,
    ):
        self.question, self.normalize, self.batch_size = question, normalize, batch_size
        folder = Path(processor or model).expanduser()
        self.tokenizer = loading(
            self.name, "a tokenizer", str(folder), lambda: AutoTokenizer.from_pretrained(folder)
        )
        self.image_processor = loading(
            self.name, "an image processor", str(folder), lambda: AutoImageProcessor.from_pretrained(folder)
        )
        self.chat_template = chat_template(folder, self.tokenizer)
        # checked before the weights load: a bad answer should not cost a 7B model load
        self.answer_id = single_token(self.tokenizer, answer, "answer")
        self.negative_id = single_token(self.tokenizer, negative, "negative") if normalize else None
        self.image_token = getattr(self.tokenizer, "image_token", None) or "<|image_pad|>"
        self.image_token_id = self.tokenizer.convert_tokens_to_ids(self.image_token)
        self.size = dict(self.image_processor.size)
        if max_pixels is not None:
            self.size["longest_edge"] = max_pixels
        if min_pixels is not None:
            self.size["shortest_edge"] = min_pixels
        self.device, torch_dtype = device_and_dtype(device, dtype)
        self.model = loading(
            self.name,
            WHAT,
            model,
            lambda: AutoModelForImageTextToText.from_pretrained(Path(model).expanduser(), dtype=torch_dtype),
        )
        self.model.to(self.device).eval().requires_grad_(False)

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        model = params.get("model")
        problems = folder_problems(cls.name, "model", model, MODEL_TYPES, WHAT, check_files)
        processor = params.get("processor")
        if processor is not None:
            problems += processor_problems("processor", processor, check_files)
        elif not problems and check_files:  # the usual layout: one folder holds both
            problems += processor_problems("model", model, check_files)
        question = params.get("question", VQASCORE_QUESTION)
        if not template_ok(question):
            problems.append(
                f"question must be a template holding {{prompt}} (other braces doubled: {{{{ }}}}), got "
                f"{question!r}; e.g. {VQASCORE_QUESTION!r}"
            )
        for name, default in (("answer", "Yes"), ("negative", "No")):
            value = params.get(name, default)
            if not isinstance(value, str) or not value:
                problems.append(
                    f"{name} must be a non-empty string (one token of the tokenizer), got {value!r}"
                )
        if params.get("normalize", False) and params.get("answer", "Yes") == params.get("negative", "No"):
            problems.append("answer and negative are the same token; normalize would always give 0.5")
        if not isinstance(params.get("normalize", False), bool):
            problems.append(f"normalize must be true or false, got {params['normalize']!r}")
        problems += device_dtype_problems(params.get("device", "cpu"), params.get("dtype", "float32"))
        batch_size = params.get("batch_size", 8)
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            problems.append(f"batch_size must be an integer >= 1, got {batch_size!r}")
        for name in ("max_pixels", "min_pixels"):
            value = params.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                problems.append(f"{name} must be a number of pixels (an integer >= 1) or null, got {value!r}")
        low, high = params.get("min_pixels"), params.get("max_pixels")
        if isinstance(low, int) and isinstance(high, int) and low > high:
            problems.append(f"min_pixels ({low}) is above max_pixels ({high})")
        return problems

    def __call__(self, images: torch.Tensor, prompts: Sequence[str], metadata) -> torch.Tensor:
        pictures = pil_images(images)
        questions = [self.question.format(prompt=p) for p in prompts]
        return torch.cat(
            [self.score(pictures[s], questions[s]) for s in chunks(len(pictures), self.batch_size)]
        )

    def inputs(self, pictures: list, questions: list[str]) -> dict[str, torch.Tensor]:
        """The model inputs for one batch, as the processor makes them (left-padded):
        ``input_ids, attention_mask, mm_token_type_ids (B, L)``, ``pixel_values (patches, C * T * P * P)``,
        ``image_grid_thw (B, 3)``."""
        vision = self.image_processor(images=pictures, size=self.size, return_tensors="pt")
        merge = self.image_processor.merge_size**2
        texts = []
        for question, grid in zip(questions, vision["image_grid_thw"]):
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
            text = self.tokenizer.apply_chat_template(
                messages, chat_template=self.chat_template, tokenize=False, add_generation_prompt=True
            )
            if text.count(self.image_token) != 1:
                raise RewardError(
                    f"reward 'judge': the chat template put {text.count(self.image_token)} "
                    f"{self.image_token} tokens in a one-image question, expected 1; is it a Qwen-VL template?"
                )
            texts.append(text.replace(self.image_token, self.image_token * int(grid.prod() // merge)))
        text = self.tokenizer(
            texts, padding=True, padding_side="left", add_special_tokens=False, return_tensors="pt"
        )
        return {
            "input_ids": text["input_ids"],
            "attention_mask": text["attention_mask"],
            "mm_token_type_ids": (text["input_ids"] == self.image_token_id).int(),
            "pixel_values": vision["pixel_values"],
            "image_grid_thw": vision["image_grid_thw"],
        }

    @torch.no_grad()
    def score(self, pictures: list, questions: list[str]) -> torch.Tensor:
        """``(b,)`` scores for one batch of at most ``batch_size`` pictures."""
        inputs = {k: v.to(self.device) for k, v in self.inputs(pictures, questions).items()}
        logits = self.model(**inputs, logits_to_keep=1, use_cache=False).logits[:, -1].float()  # (b, V)
        if self.normalize:
            return torch.sigmoid(logits[:, self.answer_id] - logits[:, self.negative_id]).cpu()
        return torch.softmax(logits, dim=-1)[:, self.answer_id].cpu()


def template_ok(question: Any) -> bool:
    """Whether ``question.format(prompt=...)`` works and uses the prompt."""
    if not isinstance(question, str) or "{prompt}" not in question:
        return False
    try:
        question.format(prompt="")
    except (ValueError, KeyError, IndexError):
        return False
    return True


def single_token(tokenizer, text: str, param: str) -> int:
    """The id of ``text`` if the tokenizer reads it as exactly one token (and decodes it back)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1 or tokenizer.decode(ids) != text:
        pieces = tokenizer.convert_ids_to_tokens(ids)
        raise RewardError(
            f"reward 'judge': {param} {text!r} is not one token of this tokenizer (it reads as {pieces}); "
            "the score is one next-token probability, so give a word the tokenizer has whole, e.g. 'Yes' "
            "(case and a leading space make different tokens)"
        )
    return ids[0]


def chat_template(folder: Path, tokenizer) -> str:
    """The processor's chat template (``chat_template.jinja``, or the older ``chat_template.json``
    that Qwen's own folders ship), else the tokenizer's."""
    fix = "point processor at the folder of the model's processor"
    try:
        if (path := folder / "chat_template.jinja").is_file():
            return read_text(path, "reward 'judge': the chat template", fix)
        if (path := folder / "chat_template.json").is_file():
            template = read_json_object(path, "reward 'judge': the chat template", fix).get("chat_template")
            if not isinstance(template, str):
                raise RewardError(f"reward 'judge': {str(path)!r} holds no \"chat_template\" text; {fix}")
            return template
    except UserFileError as e:
        raise RewardError(str(e)) from e
    if tokenizer.chat_template:
        return tokenizer.chat_template
    raise RewardError(
        f"reward 'judge': {str(folder)!r} has no chat template (chat_template.jinja, chat_template.json, "
        "or one in tokenizer_config.json); point processor at the folder of the model's processor"
    )


def processor_problems(param: str, folder: Any, check_files: bool) -> list[str]:
    """Problems with a folder expected to hold a saved Qwen-VL processor (image processor + tokenizer)."""
    if not isinstance(folder, str) or not folder:
        return [f"{param} must be the path of a local folder holding the model's processor, got {folder!r}"]
    if not check_files:
        return []
    path = Path(folder).expanduser()
    if not path.is_dir():
        return [f"{param}: {folder!r} is not a folder (it should hold the model's processor files)"]
    missing = [f for f in ("preprocessor_config.json", "tokenizer_config.json") if not (path / f).is_file()]
    if missing:
        return [
            f"{param}: {folder!r} has no {' or '.join(missing)}, so it holds no processor; download the "
            "model's processor files with it, or point processor at a folder that has them"
        ]
    return []
