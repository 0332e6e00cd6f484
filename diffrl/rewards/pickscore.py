"""PickScore (Kirstain et al. 2023, "Pick-a-Pic"): a CLIP-ViT-H-14 fine-tuned on human preferences.

Scored as flow_grpo's ``flow_grpo/pickscore_scorer.py`` (yifan123/flow_grpo): image and prompt
embeddings ``e_i, e_t (B, D)`` of the ``PickScore_v1`` ``CLIPModel``, each L2-normalised, and

    score = exp(logit_scale) * <e_i, e_t> / 26

(``exp(logit_scale)`` is about 100 for PickScore_v1, so the score is about ``cosine * 3.85``;
flow_grpo divides by 26 to bring it near [0, 1]). Images and prompts are prepared by the
processor of laion/CLIP-ViT-H-14-laion2B-s32B-b79K (PickScore_v1 ships none): the folder's
``preprocessor_config.json`` (shortest side to 224 bicubic, center crop 224, OpenAI mean / std)
and its CLIP tokenizer (77 tokens, truncated).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from diffrl.config.schema import ImagesPerForward
from diffrl.rewards import clip_embed
from diffrl.rewards.base import Reward
from diffrl.rewards.pretrained import device_and_dtype, folder_problems

DIVISOR = 26.0
"""flow_grpo's normalisation of PickScore ("norm to 0-1")."""


class PickScore(Reward):
    """``model``: the yuvalkirstain/PickScore_v1 folder (a ``CLIPModel``); ``processor``: a folder
    with a CLIP ``preprocessor_config.json`` and tokenizer (laion/CLIP-ViT-H-14-laion2B-s32B-b79K;
    default: ``model``). Loads in ``__init__``, so a bad folder fails before training starts."""

    name = "pickscore"
    clip_folders = ("model", "processor")  # the CLIP diversity monitor's default (monitor.clip)

    def __init__(
        self,
        model: str,
        processor: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: ImagesPerForward = 32,
    ):
        self.batch_size = batch_size
        torch_device, torch_dtype = device_and_dtype(device, dtype)
        processor = processor or model
        self.model = clip_embed.load_clip_model(self.name, model, torch_device, torch_dtype)
        self.image_processor = clip_embed.load_image_processor(self.name, processor)
        self.tokenizer = clip_embed.load_tokenizer(self.name, processor)

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        problems = folder_problems(
            cls.name, "model", params.get("model"), {"clip"}, "PickScore_v1 (a CLIPModel)", check_files
        )
        if params.get("processor") is not None:
            problems += clip_embed.processor_problems(cls.name, "processor", params["processor"], check_files)
        elif not problems:  # a bad model folder is reported once
            problems += [
                f"{p}; PickScore_v1 ships no processor: set processor to the "
                "laion/CLIP-ViT-H-14-laion2B-s32B-b79K folder"
                for p in clip_embed.processor_problems(cls.name, "model", params["model"], check_files)
            ]
        return problems + clip_embed.runtime_problems(params)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B,)``."""
        return clip_embed.scaled_cosines(
            self.model, self.image_processor, self.tokenizer, images, prompts, self.batch_size, DIVISOR
        )
