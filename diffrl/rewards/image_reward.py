"""ImageReward (Xu et al. 2023, "ImageReward: Learning and Evaluating Human Preferences for
Text-to-Image Generation"): BLIP's image-grounded text encoder and an MLP head, trained on 137k
expert comparisons.

Score as THUDM/ImageReward's ``ImageReward/ImageReward.py`` (``ImageReward.score`` and
``inference_rank``, the ``image-reward`` 1.5 package; flow_grpo's ``imagereward_scorer.py`` calls
``inference_rank`` on one image at a time):

    e = ViT(image)                                       (B, 1 + P, Dv)  BLIP's ViT-L/16, last norm
    h = BertEncoder(ids, mask, cross-attention to e)     (B, 35, Dt)     BLIP_Pretrain.text_encoder
    score = (MLP(h[:, 0]) - 0.16717362830052426) / 1.0333394966054072

``ids`` are BERT (bert-base-uncased) word pieces with ``[DEC]`` and ``[ENC]`` added as BLIP's
``init_tokenizer`` adds them, ``[CLS]`` first (left as is: ImageReward does not swap it for
``[ENC]``), padded to 35 and truncated at 35; every image token is attended. The MLP is
``Linear(768, 1024), Dropout, Linear(1024, 128), Dropout, Linear(128, 64), Dropout, Linear(64, 16),
Linear(16, 1)``: no activations between them, dropouts idle in eval, run in float32 here.

The image transform is ImageReward's ``_transform(224)`` on a PIL picture, written out with PIL and
numpy (:func:`pixel_values`), identical to torchvision's: shortest side to 224 (bicubic, the long
side ``int(224 * long / short)``, no resize when already that size), center crop 224 at
``round((side - 224) / 2)``, / 255, CLIP's mean / std.

transformers' BLIP classes hold the network: ``BlipForImageTextRetrieval``'s ``vision_model``
(timm's ViT as BLIP's ``vit.py`` has it: pre-norm blocks with fused qkv, LayerNorm eps 1e-6, exact
GELU, a final norm) and ``text_encoder`` (a ``BlipTextModel``, BLIP's ``med.py`` BERT with a
cross-attention in each layer, called as BLIP's ``text_encoder(input_ids, attention_mask,
encoder_hidden_states=image_embeds, encoder_attention_mask=ones)``, bidirectional). Its
``vision_proj`` / ``text_proj`` come from the checkpoint and its ``itm_head`` (ImageReward has none)
is zeros; none of the three is used. The published weights (``ImageReward.pt`` and ``med_config.json``
of THUDM/ImageReward) become a local folder once, with :func:`convert_checkpoint` or::

    python -m diffrl.rewards.image_reward convert ImageReward.pt OUT --tokenizer BERT_FOLDER

(``BERT_FOLDER``: bert-base-uncased's tokenizer files). The folder holds:

    config.json, model.safetensors     the BlipForImageTextRetrieval (model_type "blip")
    image_reward_head.safetensors      the MLP: layers.{0,2,4,6,7}.{weight,bias}
    tokenizer.json, tokenizer_config.json   bert-base-uncased + [DEC] + [ENC]

Sizes come from the checkpoint's tensors; head counts from BLIP's 64-wide heads (ViT-L 16, BERT 12),
which is what BLIP's ``create_vit`` and ImageReward's ``med_config.json`` give.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertTokenizer, BlipConfig, BlipForImageTextRetrieval
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD

from diffrl.config.schema import ImagesPerForward
from diffrl.core.errors import EXIT_USER_ERROR, DiffrlError
from diffrl.core.user_files import UserFileError, check_file
from diffrl.logging.quiet import quiet_libraries
from diffrl.rewards import clip_embed
from diffrl.rewards.base import Reward, RewardError
from diffrl.rewards.pretrained import device_and_dtype, folder_problems, load_state_dict, pil_images

MEAN = 0.16717362830052426
STD = 1.0333394966054072
"""ImageReward's normalisation of the head's output (``ImageReward.mean`` / ``.std``)."""
TEXT_LENGTH = 35
"""Prompts are padded and truncated to 35 tokens (``max_length=35`` in ``ImageReward.score``)."""
HEAD_WIDTH = 64
"""Width of an attention head in BLIP's ViTs and BERT: heads = width // 64."""
VISION_LAYER_NORM_EPS = 1e-6
"""BLIP's ViT: ``partial(nn.LayerNorm, eps=1e-6)``."""
HEAD_FILE = "image_reward_head.safetensors"
HEAD_LINEAR_LAYERS = (0, 2, 4, 6, 7)
"""Indices of the Linear layers in ImageReward's ``MLP.layers`` (dropouts between)."""
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt")
"""A BERT tokenizer folder holds a ``tokenizers`` serialisation or the word-piece vocabulary."""
CONVERT = "python -m diffrl.rewards.image_reward convert ImageReward.pt OUT --tokenizer BERT_FOLDER"
WHAT = f"an ImageReward folder (made from THUDM/ImageReward's ImageReward.pt by `{CONVERT}`)"

_VISION_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")
_VISION_BLOCK_PARTS = {
    "norm1": "layer_norm1",
    "norm2": "layer_norm2",
    "attn.qkv": "self_attn.qkv",
    "attn.proj": "self_attn.projection",
    "mlp.fc1": "mlp.fc1",
    "mlp.fc2": "mlp.fc2",
}
_VISION_PLAIN = {
    "cls_token": "embeddings.class_embedding",
    "pos_embed": "embeddings.position_embedding",
    "patch_embed.proj.weight": "embeddings.patch_embedding.weight",
    "patch_embed.proj.bias": "embeddings.patch_embedding.bias",
    "norm.weight": "post_layernorm.weight",
    "norm.bias": "post_layernorm.bias",
}
_TEXT_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.")


def _vision_key(key: str) -> str | None:
    """A key of BLIP's ``visual_encoder`` (timm names) -> ``vision_model``'s, or None."""
    if key in _VISION_PLAIN:
        return "vision_model." + _VISION_PLAIN[key]
    if match := _VISION_BLOCK.match(key):
        n, part = match.groups()
        module, _, kind = part.rpartition(".")
        if module in _VISION_BLOCK_PARTS and kind in ("weight", "bias"):
            return f"vision_model.encoder.layers.{n}.{_VISION_BLOCK_PARTS[module]}.{kind}"
    return None


def image_reward_to_transformers(
    state: dict[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """ImageReward's state dict -> (``BlipForImageTextRetrieval`` keys, the head's ``layers.N.*``).

    ``blip.visual_encoder.*`` is renamed (timm -> transformers, the fused qkv kept as it is: both
    split it as (3, heads, head_dim)); ``blip.text_encoder.*`` keeps its names (transformers' BLIP
    text model is BLIP's ``med.py``) less the ``position_ids`` buffer; ``blip.{vision,text}_proj``
    lose the ``blip.`` prefix; ``mlp.layers.*`` is the head. Any other key is an error."""
    model, head, unknown = {}, {}, []
    for key, value in state.items():
        name = None
        if key.startswith("blip.visual_encoder."):
            name = _vision_key(key.removeprefix("blip.visual_encoder."))
        elif key.startswith("blip.text_encoder."):
            if key == "blip.text_encoder.embeddings.position_ids":
                continue  # 0..n-1, rebuilt by the model
            name = "text_encoder." + key.removeprefix("blip.text_encoder.")
        elif key.startswith(("blip.vision_proj.", "blip.text_proj.")):
            name = key.removeprefix("blip.")
        elif key.startswith("mlp.layers."):
            head[key.removeprefix("mlp.")] = value
            continue
        if name is None:
            unknown.append(key)
        else:
            model[name] = value
    if unknown:
        raise ValueError(
            f"keys that are not part of an ImageReward checkpoint: {unknown[:8]}"
            + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        )
    return model, head


def _count(state: dict[str, torch.Tensor], pattern: re.Pattern[str]) -> int:
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    return max(found) + 1 if found else 0


def _heads(width: int, what: str) -> int:
    if width % HEAD_WIDTH:
        raise ValueError(f"the {what} is {width} wide, not a multiple of BLIP's {HEAD_WIDTH}-wide heads")
    return width // HEAD_WIDTH


def blip_config(model_state: dict[str, torch.Tensor], token_ids: dict[str, int]) -> BlipConfig:
    """The ``BlipConfig`` of converted ImageReward weights (:func:`image_reward_to_transformers`):
    every size from the tensors, 64-wide heads, BLIP's ViT and BERT settings; ``token_ids`` the
    tokenizer's ``pad_token_id``, ``bos_token_id``, ... (none is used in scoring)."""
    vision = {
        k.removeprefix("vision_model."): v for k, v in model_state.items() if k.startswith("vision_model.")
    }
    text = {
        k.removeprefix("text_encoder."): v for k, v in model_state.items() if k.startswith("text_encoder.")
    }
    try:
        width, patch = (
            vision["embeddings.patch_embedding.weight"].shape[0],
            vision["embeddings.patch_embedding.weight"].shape[-1],
        )
        positions = vision["embeddings.position_embedding"].shape[1]
        vision_mlp = vision["encoder.layers.0.mlp.fc1.weight"].shape[0]
        vocab, hidden = text["embeddings.word_embeddings.weight"].shape
        max_positions = text["embeddings.position_embeddings.weight"].shape[0]
        text_mlp = text["encoder.layer.0.intermediate.dense.weight"].shape[0]
        encoder_width = text["encoder.layer.0.crossattention.self.key.weight"].shape[1]
        joint = model_state["vision_proj.weight"].shape[0]
    except KeyError as e:
        raise ValueError(f"not an ImageReward checkpoint: it has no {e.args[0]!r} (after renaming)") from None
    grid = round((positions - 1) ** 0.5)
    if grid * grid + 1 != positions:
        raise ValueError(f"blip.visual_encoder.pos_embed has {positions} rows, not a square grid + 1")
    if encoder_width != width:
        raise ValueError(
            f"the text encoder cross-attends to {encoder_width}-wide image features but the ViT is {width} wide"
        )
    if max_positions < TEXT_LENGTH:
        raise ValueError(f"the text encoder has {max_positions} positions; ImageReward uses {TEXT_LENGTH}")
    vision_layers = _count(vision, re.compile(r"^encoder\.layers\.(\d+)\."))
    return BlipConfig(
        image_text_hidden_size=joint,
        vision_config={
            "hidden_size": width,
            "intermediate_size": vision_mlp,
            "num_hidden_layers": vision_layers,
            "num_attention_heads": _heads(width, "ViT"),
            "image_size": grid * patch,
            "patch_size": patch,
            "hidden_act": "gelu",
            "layer_norm_eps": VISION_LAYER_NORM_EPS,
        },
        text_config={
            "vocab_size": vocab,
            "hidden_size": hidden,
            "encoder_hidden_size": encoder_width,
            "intermediate_size": text_mlp,
            "num_hidden_layers": _count(text, _TEXT_LAYER),
            "num_attention_heads": _heads(hidden, "text encoder"),
            "max_position_embeddings": max_positions,
            "hidden_act": "gelu",
            "layer_norm_eps": 1e-12,
            "is_decoder": True,  # transformers' switch for the cross-attention layers; called bidirectional
            **token_ids,
        },
    )


def head_mlp(state: dict[str, torch.Tensor], where: str) -> nn.Sequential:
    """ImageReward's ``MLP.layers`` with the widths of ``state`` (keys ``layers.N.weight`` /
    ``.bias``), loaded; dropouts where the original has them (identity in eval)."""
    expected = {f"layers.{i}.{p}" for i in HEAD_LINEAR_LAYERS for p in ("weight", "bias")}
    if set(state) != expected:
        raise ValueError(
            f"{where} is not ImageReward's MLP head: expected keys {sorted(expected)}, got {sorted(state)[:12]}"
        )
    modules: list[nn.Module] = []
    for i in range(HEAD_LINEAR_LAYERS[-1] + 1):
        if i in HEAD_LINEAR_LAYERS:
            weight = state[f"layers.{i}.weight"]
            if weight.dim() != 2:
                raise ValueError(f"{where}: layers.{i}.weight has shape {tuple(weight.shape)}, not (out, in)")
            modules.append(nn.Linear(weight.shape[1], weight.shape[0]))
        else:
            modules.append(nn.Dropout(0.0))
    mlp = nn.Sequential(*modules)
    holder = nn.Module()  # the original's attribute name: its keys are "layers.N.weight"
    holder.layers = mlp
    try:
        holder.load_state_dict({k: v.float() for k, v in state.items()})
    except RuntimeError as e:
        raise ValueError(
            f"{where}: the head's layer shapes do not chain: {' '.join(str(e).split())[:300]}"
        ) from e
    if mlp[HEAD_LINEAR_LAYERS[-1]].out_features != 1:
        raise ValueError(f"{where}: the head ends in {mlp[-1].out_features} outputs, not one score")
    return mlp.eval().requires_grad_(False)


def load_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """ImageReward's state dict in ``path``: the published ``ImageReward.pt``, one under
    ``"state_dict"``, or a ``.safetensors`` file (:func:`~diffrl.rewards.pretrained.load_state_dict`)."""
    return load_state_dict(path, "ImageReward's state dict")


def blip_model(model_state: dict[str, torch.Tensor], token_ids: dict[str, int]) -> BlipForImageTextRetrieval:
    """A ``BlipForImageTextRetrieval`` holding exactly ``model_state`` (a missing or extra tensor is
    an error) and a zero ``itm_head``. Built on the meta device and given the tensors: a random init
    of ViT-L + BERT-base would only be overwritten."""
    config = blip_config(model_state, token_ids)
    with torch.device("meta"):
        model = BlipForImageTextRetrieval(config)
    hidden = config.text_config.hidden_size
    tensors = {
        **model_state,
        "itm_head.weight": torch.zeros(2, hidden),
        "itm_head.bias": torch.zeros(2),
    }
    try:
        missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    except RuntimeError as e:  # a shape that does not fit the sizes read from the other tensors
        raise ValueError(f"inconsistent tensor shapes: {' '.join(str(e).split())[:400]}") from e
    if missing or unexpected:
        raise ValueError(
            f"not an ImageReward checkpoint: tensors missing {['blip.' + k for k in missing[:8]]} / "
            f"not expected {unexpected[:8]} (names after conversion)"
        )
    embeddings = model.text_encoder.embeddings  # the one buffer not saved: positions 0..n-1
    n = embeddings.position_ids.shape[-1]
    embeddings.register_buffer("position_ids", torch.arange(n).expand(1, -1), persistent=False)
    return model


def blip_tokenizer(folder: str) -> BertTokenizer:
    """bert-base-uncased's tokenizer from ``folder`` with the tokens BLIP's ``init_tokenizer``
    adds: ``[DEC]`` (its bos token), then ``[ENC]``."""
    tokenizer = BertTokenizer.from_pretrained(str(Path(folder).expanduser()))
    if "[DEC]" not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"bos_token": "[DEC]"})
    if "[ENC]" not in tokenizer.get_vocab():
        tokenizer.add_special_tokens({"additional_special_tokens": ["[ENC]"]})
    return tokenizer


def convert_checkpoint(checkpoint: str, tokenizer: str, out: str) -> Path:
    """Write the ImageReward folder ``out`` (see the module's docstring) from THUDM/ImageReward's
    ``ImageReward.pt`` and bert-base-uncased's tokenizer folder. ``out`` must not exist or be an
    empty folder; it is written beside itself first and renamed into place, so a failure leaves
    nothing behind. A :class:`RewardError` names what is wrong with the inputs."""
    target = Path(out).expanduser()
    if target.exists() and not (target.is_dir() and not any(target.iterdir())):
        raise RewardError(
            f"{out!r} exists and is not an empty folder; give a new folder for the converted model"
        )
    if not target.parent.is_dir():
        raise RewardError(
            f"{out!r}: its parent folder {str(target.parent)!r} does not exist; create it first"
        )
    try:
        check_file(Path(checkpoint).expanduser(), "checkpoint", "give THUDM/ImageReward's ImageReward.pt")
    except UserFileError as e:
        raise RewardError(str(e)) from e
    if not any((Path(tokenizer).expanduser() / f).is_file() for f in TOKENIZER_FILES):
        raise RewardError(
            f"tokenizer: {tokenizer!r} is no folder with bert-base-uncased's tokenizer "
            f"({' or '.join(TOKENIZER_FILES)}); give the folder of the bert-base-uncased download"
        )
    fix = "a torch state dict of THUDM/ImageReward's ImageReward.pt"
    state = clip_embed.loading("image_reward", fix, checkpoint, lambda: load_checkpoint(checkpoint))
    bert = clip_embed.loading(
        "image_reward",
        "bert-base-uncased's tokenizer (vocab.txt or tokenizer.json)",
        tokenizer,
        lambda: blip_tokenizer(tokenizer),
    )
    model_state, head_state = clip_embed.loading(
        "image_reward", fix, checkpoint, lambda: image_reward_to_transformers(state)
    )
    words = model_state.get("text_encoder.embeddings.word_embeddings.weight")
    if words is not None and words.shape[0] != len(bert):
        raise RewardError(
            f"the tokenizer in {tokenizer!r} has {len(bert)} tokens with [DEC] and [ENC] but the checkpoint's "
            f"text encoder has {words.shape[0]} rows; ImageReward needs bert-base-uncased's tokenizer (30522 + 2)"
        )
    ids = {
        "pad_token_id": bert.pad_token_id,
        "bos_token_id": bert.convert_tokens_to_ids("[DEC]"),  # BLIP's decoder starts with [DEC]
        "sep_token_id": bert.sep_token_id,
        "eos_token_id": bert.sep_token_id,
    }
    model, head = clip_embed.loading(
        "image_reward",
        fix,
        checkpoint,
        lambda: (blip_model(model_state, ids), head_mlp(head_state, "the checkpoint's mlp.layers")),
    )
    text = model.config.text_config
    if head[0].in_features != text.hidden_size:
        raise RewardError(
            f"{checkpoint!r}: the head takes {head[0].in_features}-d features but the text encoder makes "
            f"{text.hidden_size}-d ones; not an ImageReward checkpoint"
        )
    staging = target.parent / f".{target.name}.converting-{os.getpid()}"
    staging.mkdir()
    try:
        model.save_pretrained(staging)
        save_file(
            {
                f"layers.{i}.{p}": getattr(head[i], p).contiguous()
                for i in HEAD_LINEAR_LAYERS
                for p in ("weight", "bias")
            },
            str(staging / HEAD_FILE),
        )
        bert.save_pretrained(staging)
        os.replace(staging, target)  # an empty folder is replaced; nothing else is there to lose
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def pixel_values(pictures: Sequence[Image.Image], size: int) -> torch.Tensor:
    """ImageReward's ``_transform(size)`` (torchvision ``Resize(size, BICUBIC)``, ``CenterCrop(size)``,
    ``ToTensor``, ``Normalize`` with CLIP's mean / std) on RGB pictures -> ``(B, 3, size, size)``."""
    mean, std = np.array(OPENAI_CLIP_MEAN, np.float32), np.array(OPENAI_CLIP_STD, np.float32)
    out = []
    for picture in pictures:
        w, h = picture.size
        short, long = (w, h) if w <= h else (h, w)
        new_long = int(size * long / short)
        new_w, new_h = (size, new_long) if w <= h else (new_long, size)
        if (new_w, new_h) != (w, h):
            picture = picture.resize((new_w, new_h), Image.Resampling.BICUBIC)
        top, left = int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))
        crop = (
            np.asarray(picture.convert("RGB"), dtype=np.float32)[top : top + size, left : left + size] / 255
        )
        out.append(torch.from_numpy(((crop - mean) / std).transpose(2, 0, 1).copy()))
    return torch.stack(out)


class ImageReward(Reward):
    """``model``: a folder made by :func:`convert_checkpoint` (``python -m
    diffrl.rewards.image_reward convert``) from THUDM/ImageReward's ``ImageReward.pt``. Loads in
    ``__init__``, so a bad folder fails before training starts."""

    name = "image_reward"

    def __init__(
        self,
        model: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: ImagesPerForward = 32,
    ):
        self.batch_size = batch_size
        self.device, torch_dtype = device_and_dtype(device, dtype)
        folder = str(Path(model).expanduser())
        blip = clip_embed.loading(
            self.name,
            "a BlipForImageTextRetrieval",
            model,
            lambda: BlipForImageTextRetrieval.from_pretrained(folder, dtype=torch_dtype),
        )
        self.model = blip.to(self.device).eval().requires_grad_(False)
        head = clip_embed.loading(
            self.name,
            f"ImageReward's MLP head ({HEAD_FILE})",
            model,
            lambda: load_file(str(Path(folder) / HEAD_FILE)),
        )
        try:
            self.head = head_mlp(head, f"{model!r}/{HEAD_FILE}").to(self.device)
        except ValueError as e:
            raise RewardError(f"reward {self.name!r}: {e}; convert ImageReward.pt again ({CONVERT})") from e
        self.tokenizer = clip_embed.loading(
            self.name, "the BERT tokenizer", model, lambda: BertTokenizer.from_pretrained(folder)
        )
        text = self.model.config.text_config
        if self.head[0].in_features != text.hidden_size or len(self.tokenizer) > text.vocab_size:
            raise RewardError(
                f"reward {self.name!r}: the parts of {model!r} do not fit together (head input "
                f"{self.head[0].in_features}, text width {text.hidden_size}, {len(self.tokenizer)} tokens for "
                f"{text.vocab_size} embeddings); convert ImageReward.pt again ({CONVERT})"
            )
        self.image_size = self.model.config.vision_config.image_size

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        folder = params.get("model")
        problems = folder_problems(cls.name, "model", folder, {"blip"}, WHAT, check_files)
        if problems and isinstance(folder, str) and Path(folder).expanduser().is_file():
            problems = [
                f"model: {folder!r} is a file, not a folder; ImageReward.pt is converted once into the "
                f"folder this reward loads: {CONVERT}"
            ]
        elif not problems and check_files:
            path = Path(folder).expanduser()
            if not (path / HEAD_FILE).is_file():
                problems.append(f"model: {folder!r} has no {HEAD_FILE} (ImageReward's MLP head); {WHAT}")
            if not any((path / f).is_file() for f in TOKENIZER_FILES):
                problems.append(
                    f"model: {folder!r} has no BERT tokenizer (tokenizer.json or vocab.txt); {WHAT}"
                )
        return problems + clip_embed.runtime_problems(params)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B,)`` normalised ImageReward scores."""
        pictures = pil_images(images)

        def score(part: slice) -> torch.Tensor:
            pixels = pixel_values(pictures[part], self.image_size).to(self.device, self.model.dtype)
            text = self.tokenizer(
                list(prompts[part]),
                padding="max_length",
                truncation=True,
                max_length=TEXT_LENGTH,
                return_tensors="pt",
            )
            image_embeds = self.model.vision_model(pixel_values=pixels).last_hidden_state
            features = self.model.text_encoder(
                input_ids=text["input_ids"].to(self.device),
                attention_mask=text["attention_mask"].to(self.device),
                encoder_hidden_states=image_embeds,
                encoder_attention_mask=torch.ones(
                    image_embeds.shape[:-1], dtype=torch.long, device=self.device
                ),
            ).last_hidden_state[:, 0]
            return (self.head(features.float()).squeeze(-1) - MEAN) / STD

        return clip_embed.in_batches(len(pictures), self.batch_size, score)


def main(argv: list[str] | None = None) -> int:
    """``python -m diffrl.rewards.image_reward convert CHECKPOINT OUT --tokenizer FOLDER``."""
    parser = argparse.ArgumentParser(
        prog="python -m diffrl.rewards.image_reward",
        description="Convert THUDM/ImageReward's ImageReward.pt into the folder the image_reward reward loads.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    convert = commands.add_parser(
        "convert", help="ImageReward.pt + bert-base-uncased's tokenizer -> a folder"
    )
    convert.add_argument("checkpoint", help="THUDM/ImageReward's ImageReward.pt")
    convert.add_argument("out", help="the folder to write (new, or an empty folder)")
    convert.add_argument(
        "--tokenizer",
        required=True,
        help="a folder with bert-base-uncased's tokenizer (vocab.txt or tokenizer.json)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse printed its usage and an error line (or --help)
        return e.code if isinstance(e.code, int) else EXIT_USER_ERROR
    quiet_libraries()  # no "Writing model shards" bars of transformers' between the lines
    try:
        out = convert_checkpoint(args.checkpoint, args.tokenizer, args.out)
    except DiffrlError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except OSError as e:  # the output folder could not be written (permissions, a full disk)
        print(
            f"error: could not write {args.out!r}: {e.strerror or e}; free space or choose another folder",
            file=sys.stderr,
        )
        return EXIT_USER_ERROR
    print(f"wrote {out}: set the reward's params to {{model: {str(out)!r}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
