"""CLIP pieces the preference rewards share (``pickscore``, ``clip_score``, ``aesthetic``, ``hpsv2``):
loading a transformers ``CLIPModel`` folder, its image processor and tokenizer from local folders,
checking those folders before anything loads, and unit-norm embeddings of images and prompts.

Images go through the folder's image processor config (resize, center crop, rescale,
normalise: ``preprocessor_config.json``, or the ``image_processor`` section of the
``processor_config.json`` that transformers 5's ``CLIPProcessor.save_pretrained`` writes instead) with :class:`~transformers.CLIPImageProcessorPil`, the PIL backend, named explicitly:
``CLIPImageProcessor`` is the torchvision backend in transformers 5, and without torchvision
``AutoProcessor`` falls back to the PIL class with a warning. The PIL class resizes the uint8
picture with PIL (bicubic for CLIP's ``resample: 3``), crops at ``(size - crop) // 2``, then
rescales by 1/255 and normalises with the config's mean / std.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from transformers import CLIPImageProcessorPil, CLIPModel, CLIPTokenizer

from diffrl.core.user_files import UserFileError, check_model_files, read_json_object
from diffrl.rewards.base import RewardError
from diffrl.rewards.pretrained import chunks, device_dtype_problems, pil_images

TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"))
"""A CLIP tokenizer folder holds a ``tokenizers`` serialisation or the BPE vocab + merges."""
IMAGE_PROCESSOR_FILE = "preprocessor_config.json"
PROCESSOR_FILE = "processor_config.json"
"""transformers 5's processors save their image processor's settings in this file's
``image_processor`` section (and no ``preprocessor_config.json``)."""


def loading(reward: str, what: str, path: str, load: Callable[[], Any]) -> Any:
    """``load()``, with any failure (missing or corrupt files, a wrong format) turned into a
    :class:`RewardError` that names the reward, the path and what was expected there. A folder's
    files are checked first (:func:`~diffrl.core.user_files.check_model_files`: a FIFO there would hang
    the load, JSON nested 100,000 deep crash it)."""
    if Path(path).expanduser().is_dir():
        try:
            check_model_files(
                Path(path).expanduser(),
                f"reward {reward!r}: could not load {what} from {path!r}: the file",
                f"give a folder of {what}",
            )
        except UserFileError as e:
            raise RewardError(str(e)) from e
    try:
        return load()
    except Exception as e:
        hint = ""
        if isinstance(e, pickle.UnpicklingError):  # torch.load(weights_only=True) refused an object
            hint = (
                "; the file holds objects other than tensors, which diffrl does not unpickle: where you "
                "trust the file, convert its state dict once with safetensors.torch.save_file to a "
                ".safetensors file and point the param at that"
            )
        raise RewardError(
            f"reward {reward!r}: could not load {what} from {path!r}: {type(e).__name__}: "
            f"{' '.join(str(e).split())[:300]}{hint}"
        ) from e


def load_clip_model(reward: str, folder: str, device: torch.device, dtype: torch.dtype) -> CLIPModel:
    """A ``CLIPModel`` folder on ``device`` in ``dtype``, in eval mode, without gradients."""
    model = loading(
        reward,
        "a CLIPModel",
        folder,
        lambda: CLIPModel.from_pretrained(str(Path(folder).expanduser()), dtype=dtype),
    )
    return model.to(device).eval().requires_grad_(False)


def load_image_processor(reward: str, folder: str) -> CLIPImageProcessorPil:
    return loading(
        reward,
        "a CLIP image processor (preprocessor_config.json, or processor_config.json)",
        folder,
        lambda: CLIPImageProcessorPil.from_pretrained(str(Path(folder).expanduser())),
    )


def load_tokenizer(reward: str, folder: str) -> CLIPTokenizer:
    return loading(
        reward,
        "a CLIP tokenizer (tokenizer.json, or vocab.json + merges.txt)",
        folder,
        lambda: CLIPTokenizer.from_pretrained(str(Path(folder).expanduser())),
    )


def pixel_values(processor: CLIPImageProcessorPil, images: Sequence[Image.Image]) -> torch.Tensor:
    """B pictures -> ``(B, 3, S, S)`` float32, exactly as ``processor(images=...)`` prepares them."""
    return processor(images=list(images), return_tensors="pt")["pixel_values"]


def image_embeddings(model: CLIPModel, pixels: torch.Tensor) -> torch.Tensor:
    """``pixels (B, 3, S, S)`` -> unit-norm image embeddings ``(B, D)`` float32 (CLIP's projected
    pooled class token; normalised in float32 so a bfloat16 model's scores are not rounded twice)."""
    pooled = model.vision_model(pixel_values=pixels.to(model.device, model.dtype)).pooler_output
    return unit(model.visual_projection(pooled).float())


def text_embeddings(
    model: CLIPModel, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Token ids ``(B, L)`` -> unit-norm text embeddings ``(B, D)`` float32 (the projected
    end-of-text token)."""
    if attention_mask is not None:
        attention_mask = attention_mask.to(model.device)
    pooled = model.text_model(
        input_ids=input_ids.to(model.device), attention_mask=attention_mask
    ).pooler_output
    return unit(model.text_projection(pooled).float())


def tokens(tokenizer: CLIPTokenizer, prompts: Sequence[str], context_length: int) -> dict[str, torch.Tensor]:
    """``input_ids`` and ``attention_mask`` ``(B, L)``: start + text + end token, cut to
    ``context_length`` (CLIP's 77) and padded to the longest prompt. Padding is masked and comes
    after the end token CLIP pools, so it does not change a prompt's embedding."""
    out = tokenizer(
        list(prompts), padding=True, truncation=True, max_length=context_length, return_tensors="pt"
    )
    return {"input_ids": out["input_ids"], "attention_mask": out["attention_mask"]}


def scaled_cosines(
    model: CLIPModel,
    image_processor: CLIPImageProcessorPil,
    tokenizer: CLIPTokenizer,
    images: torch.Tensor,
    prompts: Sequence[str],
    batch_size: int,
    divisor: float,
) -> torch.Tensor:
    """``images (B, 3, H, W)`` in [0, 1] + prompts -> ``(B,)`` ``exp(logit_scale) * cos(e_i, e_t) /
    divisor``: CLIP's ``logits_per_image`` diagonal, scaled (PickScore's and CLIPScore's formula)."""
    pictures = pil_images(images)
    context_length = model.config.text_config.max_position_embeddings

    def score(part: slice) -> torch.Tensor:
        image_emb = image_embeddings(model, pixel_values(image_processor, pictures[part]))
        cosine = (image_emb * text_embeddings(model, **tokens(tokenizer, prompts[part], context_length))).sum(
            -1
        )
        return model.logit_scale.exp().float() * cosine / divisor

    return in_batches(len(pictures), batch_size, score)


def unit(x: torch.Tensor) -> torch.Tensor:
    return x / x.norm(p=2, dim=-1, keepdim=True)


def in_batches(n: int, batch_size: int, score: Callable[[slice], torch.Tensor]) -> torch.Tensor:
    """``score(part)`` for consecutive slices of ``range(n)`` of at most ``batch_size``, joined
    into ``(n,)`` float32 on the CPU."""
    if n == 0:
        return torch.zeros(0)
    return torch.cat([score(part).float().cpu() for part in chunks(n, batch_size)])


def processor_problems(
    reward: str, param: str, folder: Any, check_files: bool, image: bool = True, text: bool = True
) -> list[str]:
    """Problems with ``params[param]``, a folder expected to hold a CLIP image processor config
    (``image``) and a CLIP tokenizer (``text``), e.g. the laion/CLIP-ViT-H-14-laion2B-s32B-b79K folder."""
    what = " and ".join(
        w
        for w, needed in (
            ("a CLIP image processor config (preprocessor_config.json, or processor_config.json)", image),
            ("a CLIP tokenizer", text),
        )
        if needed
    )
    if not isinstance(folder, str) or not folder:
        return [f"{param} must be the path of a local folder holding {what}, got {folder!r}"]
    if not check_files:
        return []
    path = Path(folder).expanduser()
    if not path.is_dir():
        return [f"{param}: reward {reward!r} needs {what} in a local folder; {folder!r} is not a folder"]
    problems = image_processor_problems(reward, param, folder, path) if image else []
    if text and not any(all((path / f).is_file() for f in files) for files in TOKENIZER_FILES):
        problems.append(
            f"{param}: {folder!r} has no CLIP tokenizer (tokenizer.json, or vocab.json + merges.txt)"
        )
    return problems


def image_processor_problems(reward: str, param: str, folder: str, path: Path) -> list[str]:
    """Whether ``path`` holds the settings :func:`load_image_processor` loads, found as transformers'
    ``ImageProcessingMixin.get_image_processor_dict`` looks for them: a ``processor_config.json``
    with an ``image_processor`` section first (what transformers 5 saves), else
    ``preprocessor_config.json`` (what transformers 4 saved, and the hub's CLIP folders hold)."""
    nested = path / PROCESSOR_FILE
    if nested.exists() or nested.is_symlink():
        fix = "save the processor again with save_pretrained, or remove the file"
        try:
            settings = read_json_object(nested, f"{param}: the processor config", fix)
        except UserFileError as e:
            return [str(e)]
        if "image_processor" in settings:  # transformers then reads this section, whatever else is there
            if isinstance(settings["image_processor"], dict):
                return []
            return [
                f"{param}: the image_processor section of {str(nested)!r} is not a JSON object "
                f"(the CLIP image processor settings reward {reward!r} needs); {fix}"
            ]
    if (path / IMAGE_PROCESSOR_FILE).is_file():
        return []
    return [
        f"{param}: {folder!r} has no {IMAGE_PROCESSOR_FILE} (nor a {PROCESSOR_FILE} with an "
        f"image_processor section, as transformers 5's CLIPProcessor.save_pretrained writes): the CLIP "
        f"image processor reward {reward!r} needs"
    ]


def runtime_problems(params: dict[str, Any]) -> list[str]:
    """The ``device``, ``dtype`` and ``batch_size`` params every CLIP reward takes."""
    problems = device_dtype_problems(params.get("device", "cpu"), params.get("dtype", "float32"))
    return problems + batch_size_problems(params.get("batch_size", 32))


def batch_size_problems(batch_size: Any) -> list[str]:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        return [f"batch_size must be a whole number >= 1 (images per forward pass), got {batch_size!r}"]
    return []
