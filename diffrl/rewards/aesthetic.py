"""LAION aesthetic predictor v2 (christophschuhmann/improved-aesthetic-predictor): an MLP on the
L2-normalised CLIP ViT-L/14 image embedding, trained to predict the 1-10 rating of an image.

As flow_grpo's ``flow_grpo/aesthetic_scorer.py`` (yifan123/flow_grpo, after the predictor's
``simple_inference.py``): ``e (B, 768)`` the openai/clip-vit-large-patch14 image embedding,
``e / |e|``, then ``sac+logos+ava1-l14-linearMSE.pth``'s layers

    768 -> 1024 -> 128 -> 64 -> 16 -> 1            (Linear layers, no activations between them)

``score (B,)`` is the last layer's output, the predicted rating (about 4-7 for typical images).
The MLP's dropouts (indices 1, 3, 5) do nothing in eval mode. The MLP is tiny, so it runs in
float32 whatever ``dtype`` the CLIP model uses.

The predictor file is a state dict: loaded with ``torch.load(..., weights_only=True)`` (never a
general unpickle) or from a ``.safetensors`` conversion with the same keys
(``layers.{0,2,4,6,7}.{weight,bias}``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch import nn

from diffrl.config.schema import ImagesPerForward
from diffrl.rewards import clip_embed
from diffrl.rewards.base import Reward, RewardError
from diffrl.rewards.pretrained import (
    device_and_dtype,
    file_problems,
    folder_problems,
    pil_images,
)

LINEAR_LAYERS = (0, 2, 4, 6, 7)
"""Indices of the Linear layers in the predictor's ``layers`` Sequential (dropouts between)."""


def predictor_mlp(state: dict[str, torch.Tensor], path: str) -> nn.Sequential:
    """The predictor's ``layers`` Sequential with the widths of ``state`` (its state dict, keys
    ``layers.N.weight``), loaded; dropouts where the original has them (identity in eval)."""
    expected = {f"layers.{i}.{p}" for i in LINEAR_LAYERS for p in ("weight", "bias")}
    if set(state) != expected:
        raise RewardError(
            f"reward 'aesthetic': {path!r} is not the LAION aesthetic predictor's state dict: expected "
            f"keys {sorted(expected)}, got {sorted(state)[:12]}"
        )
    modules: list[nn.Module] = []
    for i in range(LINEAR_LAYERS[-1] + 1):
        if i in LINEAR_LAYERS:
            out_dim, in_dim = state[f"layers.{i}.weight"].shape
            modules.append(nn.Linear(in_dim, out_dim))
        else:
            modules.append(nn.Dropout(0.0))
    mlp = nn.Sequential(*modules)
    holder = nn.Module()  # the original's attribute name: its keys are "layers.N.weight"
    holder.layers = mlp
    try:
        holder.load_state_dict(state)
    except RuntimeError as e:
        raise RewardError(f"reward 'aesthetic': {path!r} has inconsistent layer shapes: {e}") from e
    return mlp


def load_predictor_state(path: str) -> dict[str, torch.Tensor]:
    file = Path(path).expanduser()
    if file.suffix == ".safetensors":
        return load_file(str(file))
    state = torch.load(file, map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise TypeError(f"expected a state dict, got a {type(state).__name__}")
    return state


class Aesthetic(Reward):
    """``clip``: the openai/clip-vit-large-patch14 folder (``CLIPModel`` + its
    ``preprocessor_config.json``); ``predictor``: ``sac+logos+ava1-l14-linearMSE.pth`` (or a
    ``.safetensors`` conversion of it)."""

    name = "aesthetic"
    clip_folders = ("clip", None)  # the CLIP diversity monitor's default (monitor.clip)

    def __init__(
        self,
        clip: str,
        predictor: str,
        device: str = "cpu",
        dtype: str = "float32",
        batch_size: ImagesPerForward = 32,
    ):
        self.batch_size = batch_size
        torch_device, torch_dtype = device_and_dtype(device, dtype)
        self.clip = clip_embed.load_clip_model(self.name, clip, torch_device, torch_dtype)
        self.image_processor = clip_embed.load_image_processor(self.name, clip)
        state = clip_embed.loading(
            self.name,
            "the aesthetic predictor's state dict",
            predictor,
            lambda: load_predictor_state(predictor),
        )
        self.mlp = predictor_mlp(state, predictor).to(torch_device).eval().requires_grad_(False)
        width, embed = self.mlp[0].in_features, self.clip.config.projection_dim
        if width != embed:
            raise RewardError(
                f"reward 'aesthetic': predictor {predictor!r} takes {width}-d embeddings but the CLIP "
                f"model in {clip!r} makes {embed}-d ones; the predictor needs CLIP ViT-L/14 "
                "(openai/clip-vit-large-patch14, 768-d)"
            )

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        problems = folder_problems(
            cls.name, "clip", params.get("clip"), {"clip"}, "CLIP ViT-L/14 (a CLIPModel)", check_files
        )
        if not problems:
            problems = clip_embed.processor_problems(
                cls.name, "clip", params["clip"], check_files, text=False
            )
        problems += file_problems(
            "predictor",
            params.get("predictor"),
            "the LAION aesthetic predictor state dict (sac+logos+ava1-l14-linearMSE.pth)",
            {".pth", ".pt", ".safetensors"},
            check_files,
        )
        return problems + clip_embed.runtime_problems(params)

    def __call__(
        self, images: torch.Tensor, prompts: Sequence[str], metadata: Sequence[dict[str, Any]]
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> predicted ratings ``(B,)``; prompts are not used."""
        pictures = pil_images(images)

        def score(part: slice) -> torch.Tensor:
            pixels = clip_embed.pixel_values(self.image_processor, pictures[part])
            return self.mlp(clip_embed.image_embeddings(self.clip, pixels)).squeeze(-1)

        return clip_embed.in_batches(len(pictures), self.batch_size, score)
