"""HPSv2.1 (Wu et al. 2023, "Human Preference Score v2"): an open_clip ViT-H-14 fine-tuned on
human preferences, loaded into a transformers ``CLIPModel``.

Score as HPSv2's ``hpsv2/img_score.py`` (tgxs002/HPSv2; flow_grpo's ``flow_grpo/hpsv2_scorer.py``
is the same): the model returns L2-normalised features and

    score = <e_i, e_t>          e_i, e_t: (B, D) unit norm; the cosine, no logit scale

(``logits_per_image = image_features @ text_features.T``, its diagonal), about 0.2-0.35.

Why not open_clip: open_clip imports torchvision, whose PyPI wheels are CUDA builds that do not
import against a CPU torch. The checkpoint (``HPS_v2.1_compressed.pt``, a dict whose
``"state_dict"`` is an open_clip ``CLIP`` state dict) converts to a ``CLIPModel`` key by key
(:func:`open_clip_to_transformers`): both are the OpenAI-CLIP architecture. The architecture is
open_clip's ``model_configs/ViT-H-14.json`` (vision head width 80, 16 text heads, GELU, LayerNorm
eps 1e-5), with the widths, depths, patch and image size read from the state dict (so a smaller
checkpoint of the same layout loads too).

Preprocessing as open_clip's ViT-H-14 eval transform (``image_transform(224, is_train=False)``:
shortest side to 224 bicubic, center crop 224, OpenAI mean / std), expressed as a
``CLIPImageProcessorPil`` with exactly those settings (:func:`open_clip_image_processor`). Two
known, sub-pixel differences: HPSv2's copy of open_clip resizes the float tensor (torchvision) where
this resizes the uint8 picture (PIL, rounded to uint8), and torchvision's center crop rounds an odd
margin up where this rounds it down (only for non-square images). Tokenisation as open_clip's
(``tokenize``): start token, CLIP BPE of the lower-cased text, end token, cut to 77 with the end
token kept last, zero-padded, no padding mask (the causal text tower pools the end token, which
has the largest id: ``text.argmax(-1)``). open_clip also runs ``ftfy.fix_text`` on prompts; that
only changes mis-encoded text (mojibake), and it is not done here. HTML entities are unescaped as
open_clip does.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

import torch
from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPTokenizer
from transformers.image_utils import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD, PILImageResampling

from diffrl.config.schema import ImagesPerForward
from diffrl.rewards import clip_embed
from diffrl.rewards.base import Reward
from diffrl.rewards.pretrained import device_and_dtype, file_problems, load_state_dict, pil_images

VISION_HEAD_WIDTH = 80
"""open_clip ViT-H-14: ``vision_cfg.head_width`` (1280 wide = 16 heads)."""
TEXT_HEADS = 16
"""open_clip ViT-H-14: ``text_cfg.heads``."""

_BLOCK = re.compile(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$")
_BLOCK_PARTS = {
    "ln_1.weight": "layer_norm1.weight",
    "ln_1.bias": "layer_norm1.bias",
    "ln_2.weight": "layer_norm2.weight",
    "ln_2.bias": "layer_norm2.bias",
    "attn.out_proj.weight": "self_attn.out_proj.weight",
    "attn.out_proj.bias": "self_attn.out_proj.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight",
    "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight",
    "mlp.c_proj.bias": "mlp.fc2.bias",
}
_PLAIN = {
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",  # sic: transformers' name
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {  # open_clip multiplies x @ proj with proj (width, dim); a Linear's weight is (dim, width)
    "visual.proj": "visual_projection.weight",
    "text_projection": "text_projection.weight",
}


def open_clip_to_transformers(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """An open_clip ``CLIP`` state dict (OpenAI-CLIP layout) -> ``CLIPModel`` keys.

    ``[visual.]transformer.resblocks.N.attn.in_proj_{weight,bias}`` (q, k and v stacked on dim 0,
    as ``nn.MultiheadAttention`` keeps them) split into ``q_proj``, ``k_proj``, ``v_proj``; the
    projections transpose; every other tensor is renamed. A key not named here is an error."""
    out, unknown = {}, []
    for key, value in state.items():
        if key in _PLAIN:
            out[_PLAIN[key]] = value
        elif key in _TRANSPOSED:
            out[_TRANSPOSED[key]] = value.t().contiguous()
        elif match := _BLOCK.match(key):
            visual, n, part = match.groups()
            prefix = f"{'vision_model' if visual else 'text_model'}.encoder.layers.{n}."
            if part in ("attn.in_proj_weight", "attn.in_proj_bias"):
                kind = part.rsplit("_", 1)[1]  # weight or bias
                for name, piece in zip(("q", "k", "v"), value.chunk(3, dim=0)):
                    out[f"{prefix}self_attn.{name}_proj.{kind}"] = piece.contiguous()
            elif part in _BLOCK_PARTS:
                out[prefix + _BLOCK_PARTS[part]] = value
            else:
                unknown.append(key)
        else:
            unknown.append(key)
    if unknown:
        raise ValueError(
            f"keys that are not part of an open_clip ViT CLIP: {unknown[:8]}"
            + (f" and {len(unknown) - 8} more" if len(unknown) > 8 else "")
        )
    return out


def _depth(state: dict[str, torch.Tensor], prefix: str) -> int:
    blocks = {
        int(m.group(2)) for k in state if (m := _BLOCK.match(k)) and bool(m.group(1)) == (prefix == "visual.")
    }
    return max(blocks) + 1 if blocks else 0


def open_clip_config(state: dict[str, torch.Tensor]) -> CLIPConfig:
    """The ``CLIPConfig`` of an open_clip ViT-H-14-layout state dict: head counts and activation
    from ViT-H-14.json, every size from the tensors."""
    try:
        conv, positions = state["visual.conv1.weight"], state["visual.positional_embedding"]
        vision_width, patch = conv.shape[0], conv.shape[-1]
        text_width, embed = state["text_projection"].shape
        vision_mlp = state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
        text_mlp = state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0]
        vocab, context = state["token_embedding.weight"].shape[0], state["positional_embedding"].shape[0]
    except KeyError as e:
        raise ValueError(f"not an open_clip ViT CLIP state dict: no {e.args[0]!r}") from None
    grid = round((positions.shape[0] - 1) ** 0.5)
    if grid * grid + 1 != positions.shape[0]:
        raise ValueError(f"visual.positional_embedding has {positions.shape[0]} rows, not a square grid + 1")
    if vision_width % VISION_HEAD_WIDTH or text_width % TEXT_HEADS:
        raise ValueError(
            f"widths {vision_width} (image) and {text_width} (text) do not fit ViT-H-14's heads "
            f"(image head width {VISION_HEAD_WIDTH}, {TEXT_HEADS} text heads): not a ViT-H-14 checkpoint"
        )
    common = {"hidden_act": "gelu", "layer_norm_eps": 1e-5}  # ViT-H-14 is not a QuickGELU model
    return CLIPConfig(
        projection_dim=embed,
        vision_config={
            "hidden_size": vision_width,
            "intermediate_size": vision_mlp,
            "num_hidden_layers": _depth(state, "visual."),
            "num_attention_heads": vision_width // VISION_HEAD_WIDTH,
            "image_size": grid * patch,
            "patch_size": patch,
            **common,
        },
        text_config={
            "vocab_size": vocab,
            "hidden_size": text_width,
            "intermediate_size": text_mlp,
            "num_hidden_layers": _depth(state, ""),
            "num_attention_heads": TEXT_HEADS,
            "max_position_embeddings": context,
            # 2 is transformers' switch for pooling at input_ids.argmax(-1), open_clip's rule
            "eos_token_id": 2,
            **common,
        },
    )


def load_checkpoint(path: str) -> dict[str, torch.Tensor]:
    """The open_clip state dict in ``path``: HPSv2's ``.pt`` (``{"state_dict": ...}``), a bare
    state dict, or a ``.safetensors`` file (:func:`~diffrl.rewards.pretrained.load_state_dict`)."""
    return load_state_dict(path, "an open_clip state dict")


def open_clip_model(state: dict[str, torch.Tensor]) -> CLIPModel:
    """A ``CLIPModel`` holding exactly the open_clip state dict's weights (a missing or extra
    tensor is an error). Built on the meta device and given the checkpoint's tensors: a random
    init of ViT-H-14's 1B parameters would cost ~15 s and 4 GB only to be overwritten."""
    with torch.device("meta"):
        model = CLIPModel(open_clip_config(state))
    missing, unexpected = model.load_state_dict(open_clip_to_transformers(state), strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"conversion left tensors missing {missing[:8]} / unexpected {unexpected[:8]}")
    for embeddings in (model.vision_model.embeddings, model.text_model.embeddings):
        # the one buffer a CLIPModel does not save (open_clip has none): positions 0..n-1
        n = embeddings.position_ids.shape[-1]
        embeddings.register_buffer("position_ids", torch.arange(n).expand(1, -1), persistent=False)
    return model


def open_clip_image_processor(image_size: int) -> CLIPImageProcessorPil:
    """open_clip's eval transform for a square ``image_size`` with the OpenAI mean / std."""
    return CLIPImageProcessorPil(
        do_resize=True,
        size={"shortest_edge": image_size},
        resample=PILImageResampling.BICUBIC,
        do_center_crop=True,
        crop_size={"height": image_size, "width": image_size},
        do_rescale=True,
        rescale_factor=1 / 255,
        do_normalize=True,
        image_mean=OPENAI_CLIP_MEAN,
        image_std=OPENAI_CLIP_STD,
        do_convert_rgb=True,
    )


def open_clip_tokens(tokenizer: CLIPTokenizer, prompts: Sequence[str], context_length: int) -> torch.Tensor:
    """``(B, context_length)`` ids as open_clip's ``tokenize``: start + BPE + end, cut to
    ``context_length`` keeping the end token last, then zeros."""
    texts = [html.unescape(html.unescape(p)).strip() for p in prompts]
    ids = tokenizer(texts, truncation=True, max_length=context_length)["input_ids"]
    out = torch.zeros(len(ids), context_length, dtype=torch.long)
    for row, seq in zip(out, ids):
        row[: len(seq)] = torch.tensor(seq)
    return out


class HPSv2(Reward):
    """``checkpoint``: ``HPS_v2.1_compressed.pt`` from xswu/HPSv2 (or a ``.safetensors`` of its
    ``state_dict``); ``tokenizer``: a folder with the CLIP tokenizer (e.g. the
    laion/CLIP-ViT-H-14-laion2B-s32B-b79K folder: ``tokenizer.json`` or ``vocab.json`` +
    ``merges.txt``)."""

    name = "hpsv2"

    def __init__(
        self,
        checkpoint: str,
        tokenizer: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: ImagesPerForward = 32,
    ):
        self.batch_size = batch_size
        torch_device, torch_dtype = device_and_dtype(device, dtype)

        def load() -> CLIPModel:
            return open_clip_model(load_checkpoint(checkpoint))

        model = clip_embed.loading(self.name, "an open_clip ViT-H-14 (HPSv2) checkpoint", checkpoint, load)
        self.model = model.to(torch_device, torch_dtype).eval().requires_grad_(False)
        self.tokenizer = clip_embed.load_tokenizer(self.name, tokenizer)
        self.image_processor = open_clip_image_processor(self.model.config.vision_config.image_size)
        self.context_length = self.model.config.text_config.max_position_embeddings

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        problems = file_problems(
            "checkpoint",
            params.get("checkpoint"),
            "the HPSv2 checkpoint (HPS_v2.1_compressed.pt from xswu/HPSv2)",
            {".pt", ".pth", ".safetensors"},
            check_files,
        )
        problems += clip_embed.processor_problems(
            cls.name, "tokenizer", params.get("tokenizer"), check_files, image=False
        )
        return problems + clip_embed.runtime_problems(params)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B,)`` cosines."""
        pictures = pil_images(images)

        def score(part: slice) -> torch.Tensor:
            pixels = clip_embed.pixel_values(self.image_processor, pictures[part])
            ids = open_clip_tokens(self.tokenizer, prompts[part], self.context_length)
            image_emb = clip_embed.image_embeddings(self.model, pixels)
            return (image_emb * clip_embed.text_embeddings(self.model, ids)).sum(-1)

        return clip_embed.in_batches(len(pictures), self.batch_size, score)
