"""CLIP score: how well an image matches its prompt by CLIP ViT-L/14 (openai/clip-vit-large-patch14).

Scored as flow_grpo's ``flow_grpo/clip_scorer.py`` (yifan123/flow_grpo, ``ClipScorer.__call__``):
it returns ``CLIPModel(...).logits_per_image.diagonal() / 30``, and ``logits_per_image`` is
``exp(logit_scale)`` times the cosine of the L2-normalised image and text embeddings, so

    score = exp(logit_scale) * <e_i, e_t> / 30          e_i, e_t: (B, D), unit norm

(``exp(logit_scale) = 100`` for the OpenAI weights: ``score = cosine * 10 / 3``; ViT-L/14
cosines of a matching pair are typically 0.25-0.35). Prompts are padded to 77 tokens there and to
the longest prompt here; padding is masked and after the pooled end token, so the embeddings are
the same.

One difference, on purpose: flow_grpo resizes the float image tensor with torchvision's default
(bilinear) to 224; here the folder's ``preprocessor_config.json`` prepares the rollout's uint8
pixels as the CLIP processor does (bicubic PIL resize of the shortest side, center crop, OpenAI
mean / std), which is how CLIP's own preprocessing resizes. The two resamplers differ slightly,
so scores are close to flow_grpo's but not bit-equal.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from diffrl.config.schema import ImagesPerForward
from diffrl.rewards import clip_embed
from diffrl.rewards.base import Reward
from diffrl.rewards.pretrained import device_and_dtype, folder_problems

DIVISOR = 30.0
"""flow_grpo's ``ClipScorer`` divides CLIP's logits by 30."""


class ClipScore(Reward):
    """``model``: the openai/clip-vit-large-patch14 folder (a ``CLIPModel`` with its
    ``preprocessor_config.json`` and tokenizer files beside it)."""

    name = "clip_score"
    clip_folders = ("model", None)  # the CLIP diversity monitor's default (monitor.clip)

    def __init__(
        self, model: str, device: str = "cpu", dtype: str = "float32", batch_size: ImagesPerForward = 32
    ):
        self.batch_size = batch_size
        torch_device, torch_dtype = device_and_dtype(device, dtype)
        self.model = clip_embed.load_clip_model(self.name, model, torch_device, torch_dtype)
        self.image_processor = clip_embed.load_image_processor(self.name, model)
        self.tokenizer = clip_embed.load_tokenizer(self.name, model)

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        problems = folder_problems(
            cls.name, "model", params.get("model"), {"clip"}, "CLIP ViT-L/14 (a CLIPModel)", check_files
        )
        if not problems:
            problems = clip_embed.processor_problems(cls.name, "model", params["model"], check_files)
        return problems + clip_embed.runtime_problems(params)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B,)``."""
        return clip_embed.scaled_cosines(
            self.model, self.image_processor, self.tokenizer, images, prompts, self.batch_size, DIVISOR
        )
