"""What the rewards that load local weights share: checking a weights folder before anything loads,
the device and dtype params, and the rollout's images as the uint8 pictures processors expect.

diffrl never downloads: every weights param is a local folder (or file) the user fetched; see
docs/rewards.md for where each model's weights come from and the layout expected.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from safetensors.torch import load_file

from diffrl.core.rollout import quantize
from diffrl.core.user_files import UserFileError, read_json_object

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""A reward's ``dtype`` param (the names ``model.dtype`` takes; rewards sit beside models, not on them)."""


def folder_problems(
    reward: str, param: str, folder: Any, model_types: Collection[str], what: str, check_files: bool
) -> list[str]:
    """Problems with ``params[param]``, a transformers folder (``config.json`` + weights) expected to
    hold a model whose ``model_type`` is one of ``model_types``; ``what`` names the model for the
    message (e.g. "PickScore_v1 (a CLIPModel)")."""
    if not isinstance(folder, str) or not folder:
        return [f"{param} must be the path of a local folder holding {what}, got {folder!r}"]
    if not check_files:
        return []
    path = Path(folder).expanduser()
    if not path.is_dir():
        return [f"{param}: reward {reward!r} needs {what} in a local folder; {folder!r} is not a folder"]
    config = path / "config.json"
    if not config.exists() and not config.is_symlink():
        return [f"{param}: {folder!r} has no config.json, so it is not a transformers model folder ({what})"]
    try:  # bounded: a FIFO would wait forever, JSON nested 100,000 deep raise RecursionError
        model_type = read_json_object(config, f"{param}: the model's config", f"give a folder of {what}").get(
            "model_type"
        )
    except UserFileError as e:
        return [str(e)]
    if model_type not in model_types:
        return [
            f"{param}: {folder!r} holds a {model_type!r} model; reward {reward!r} expects {what} "
            f"(model_type {' or '.join(repr(t) for t in sorted(model_types))})"
        ]
    if not any(path.glob("*.safetensors")) and not any(path.glob("*.bin")):
        return [f"{param}: {folder!r} has a config.json but no weights (*.safetensors or *.bin)"]
    return []


def file_problems(
    param: str, file: Any, what: str, suffixes: Collection[str], check_files: bool
) -> list[str]:
    """Problems with ``params[param]``, a local weights file with one of ``suffixes``."""
    if not isinstance(file, str) or not file:
        return [f"{param} must be the path of {what}, got {file!r}"]
    if not any(file.endswith(s) for s in suffixes):
        return [f"{param}: {file!r} should be {what} ({' or '.join(sorted(suffixes))})"]
    if check_files and not Path(file).expanduser().is_file():
        return [f"{param}: {file!r} is not a file ({what})"]
    return []


def device_dtype_problems(device: Any, dtype: Any) -> list[str]:
    problems = []
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        problems.append(f"device must be a torch device such as 'cpu' or 'cuda:0', got {device!r}")
    if dtype not in DTYPES:
        problems.append(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    return problems


def device_and_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    return torch.device(device), DTYPES[dtype]


def pil_images(images: torch.Tensor) -> list[Image.Image]:
    """``images (B, 3, H, W)`` float in [0, 1] -> B RGB pictures, through :func:`quantize`: the
    exact uint8 pixels the rollout kept (the rewards get ``uint8 / 255``)."""
    arrays = quantize(images).permute(0, 2, 3, 1).numpy()  # (B, H, W, 3) uint8
    return [Image.fromarray(np.ascontiguousarray(a)) for a in arrays]


def chunks(n: int, size: int) -> Sequence[slice]:
    """``range(n)`` cut into slices of at most ``size`` (a reward's ``batch_size``)."""
    return [slice(i, min(i + size, n)) for i in range(0, n, size)]


def load_state_dict(path: str, what: str) -> dict[str, torch.Tensor]:
    """The state dict (name -> tensor) in the checkpoint ``path``: a ``.pt`` loaded with
    ``weights_only=True`` (bare, or under ``"state_dict"``), or a ``.safetensors`` file; a
    DistributedDataParallel ``module.`` prefix is dropped. ``what``: the reward's name for its
    weights in the error (e.g. "an open_clip state dict")."""
    file = Path(path).expanduser()
    if file.suffix == ".safetensors":
        state = load_file(str(file))
    else:
        state = torch.load(file, map_location="cpu", weights_only=True)
        if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
            state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"expected {what} (name -> tensor), or a dict with one under 'state_dict'")
    if state and all(k.startswith("module.") for k in state):
        state = {k.removeprefix("module."): v for k, v in state.items()}
    return state
