"""The LoRA-only weight sync of the sglang engine (``rollout.engine_options.sync: lora``): the
sampling adapter as a diffusers-format LoRA folder, and what an sglang-diffusion server holds once
it took that folder with ``POST /v1/set_lora`` (``merge_mode: dynamic``), so that the sync can be
checked tensor for tensor (sglang 0.5.23, ``python/sglang/multimodal_gen/``):

- ``runtime/pipelines_core/lora/pipeline.py`` ``LoRAPipeline.set_lora``: the first call wraps the
  transformer's layers (``convert_to_lora_layers``: every layer ``wrap_with_lora_layer`` knows,
  i.e. every ``nn.Linear`` and sglang linear, whose name holds none of the model's
  ``exclude_lora_layers``); each wrapper keeps the layer as ``base_layer`` and the adapter as
  parameters ``lora_A`` / ``lora_B`` (``runtime/layers/lora/linear.py``
  ``BaseLayerWithLoRA.set_lora_weights``). ``dynamic`` leaves the base weights untouched and adds
  ``strength * alpha / rank * B @ A @ x`` in the forward, as peft does in diffrl's (``merge`` would
  round ``W + delta`` on the server, bits diffrl cannot reproduce). A path it loaded already is not
  read again: every sync is a new folder.
- ``load_lora_adapter``: the adapter file's tensors keep their dtype; names lose ``.weight`` and
  the ``transformer.`` prefix (``configs/models/dits/flux.py`` ``param_names_mapping``); alpha is
  the diffusers metadata's ``lora_alpha``, which must be a positive integer
  (``pipelines_core/lora/peft_adapter.py`` ``get_peft_lora_alpha``).
- ``/get_weights_checksum`` (``runtime/loader/weight_utils.py`` ``compute_weights_checksum``): sha256
  over the transformer's parameters sorted by name, after the wrap, so the base weights appear as
  ``<layer>.base_layer.weight`` and the adapter as ``<layer>.lora_A``: :func:`served_state` builds
  the same dict here (measured equal on the tiny FLUX.1, ``tests/data/sglang/flux_lora.json``).
- ``/update_weights_from_tensor_checker`` (``runtime/post_training/tensor_update_checker.py``): a
  sha256 per named tensor (dtype, shape, bytes: :func:`tensor_sha256`), compared for the names given
  only; ``/v1/list_loras``: the adapter each module applies, its path, mode and strength.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers.loaders.lora_base import LoraBaseMixin
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict
from torch import nn

SGLANG_EXCLUDED = (
    "time_guidance_embed.timestep_embedder.linear_1",
    "time_guidance_embed.timestep_embedder.linear_2",
    "time_guidance_embed.guidance_embedder.linear_1",
    "time_guidance_embed.guidance_embedder.linear_2",
)
"""Layers sglang's FLUX never wraps (``configs/models/dits/flux.py``
``FluxArchConfig.exclude_lora_layers``; FLUX.2's names: no FLUX.1 layer holds them)."""
NICKNAME = "diffrl"
"""The adapter's name on the server: one name, so each sync replaces the adapter before."""
TARGET = "transformer"


@dataclass
class Adapter:
    """The sampling adapter, copied off the live weights.

    ``layers``: peft's state dict of the active adapter (``<layer>.lora_A.weight``: ``(r, in)``,
    ``<layer>.lora_B.weight``: ``(out, r)``), in the dtype it trains in; ``config``: that adapter's
    peft ``LoraConfig`` as a dict (``r``, ``lora_alpha``, ...)."""

    layers: dict[str, torch.Tensor]
    config: dict[str, Any]

    @property
    def alpha(self) -> float:
        return float(self.config["lora_alpha"])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.layers.values())

    def served(self) -> dict[str, torch.Tensor]:
        """The adapter under the server's names (``<layer>.lora_A``, ``<layer>.lora_B``)."""
        return {k.removesuffix(".weight"): v for k, v in self.layers.items()}

    def write(self, folder: Path) -> Path:
        """A diffusers-format LoRA folder (``pytorch_lora_weights.safetensors``, keys
        ``transformer.<layer>.lora_A.weight``, the config in its ``lora_adapter_metadata``), as
        ``FluxPipeline.save_lora_weights`` writes it and ``load_lora_weights`` / sglang read it."""
        LoraBaseMixin.write_lora_layers(
            state_dict={f"{TARGET}.{k}": v for k, v in self.layers.items()},
            save_directory=str(folder),
            is_main_process=True,
            weight_name=None,
            save_function=None,
            safe_serialization=True,
            lora_adapter_metadata={f"{TARGET}.{k}": v for k, v in self.config.items()},
        )
        return folder


def active_adapter(module: nn.Module) -> str:
    """The one peft adapter the transformer samples with (``default``, or DiffusionNFT's ``old``)."""
    names = {a for m in module.modules() if isinstance(m, LoraLayer) for a in m.active_adapters}
    if len(names) != 1:
        raise ValueError(
            f"the transformer samples with adapters {sorted(names)}; a LoRA sync sends exactly one"
        )
    return names.pop()


@torch.no_grad()
def sampling_adapter(module: nn.Module) -> Adapter:
    """The adapter ``module`` samples with, copied to the CPU (the live weights go on training)."""
    name = active_adapter(module)
    layers = get_peft_model_state_dict(module, adapter_name=name)
    config = module.peft_config[name].to_dict()
    return Adapter({k: v.detach().to("cpu", copy=True).contiguous() for k, v in layers.items()}, config)


def wrapped_layers(module: nn.Module) -> set[str]:
    """The layers sglang wraps for LoRA, under diffusers' names: every linear layer (peft's
    ``base_layer`` of the layers diffrl adapts), none of :data:`SGLANG_EXCLUDED`."""
    out = set()
    for name, m in module.named_modules():
        if not isinstance(m, nn.Linear) or ".lora_" in f".{name}":
            continue
        name = name.removesuffix(".base_layer")
        if not any(x in name for x in SGLANG_EXCLUDED):
            out.add(name)
    return out


@torch.no_grad()
def served_state(module: nn.Module, adapter: Adapter, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """What the server's transformer holds after ``/v1/set_lora`` of ``adapter`` (dynamic) on the
    base weights of ``module`` loaded in ``dtype``: its parameters under sglang's names (see the
    module), whose :func:`~diffrl.core.parallel.state_checksum` is its ``/get_weights_checksum``."""
    wrapped = wrapped_layers(module)
    state: dict[str, torch.Tensor] = {}
    for name, p in module.named_parameters():
        if "lora_" in name:
            continue
        clean = name.replace(".base_layer.", ".")
        owner, _, leaf = clean.rpartition(".")
        key = f"{owner}.base_layer.{leaf}" if owner in wrapped else clean
        state[key] = p.detach().to("cpu", dtype).contiguous()
    return {**state, **adapter.served()}


def tensor_sha256(t: torch.Tensor) -> str:
    """sglang's ``compute_tensor_sha256`` (``runtime/post_training/tensor_update_checker.py``):
    the dtype's name, the shape's repr, then the raw bytes."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256()
    h.update(str(t.dtype).encode())
    h.update(repr(tuple(t.shape)).encode())
    h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
