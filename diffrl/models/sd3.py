"""``sd3``: Stable Diffusion 3 / 3.5 from a local diffusers folder (``StableDiffusion3Pipeline`` layout).

Parts, loaded as diffusers' pipeline would: ``SD3Transformer2DModel`` (trained), ``AutoencoderKL``
(16 latent channels; latents are ``(z - shift_factor) * scaling_factor``), two CLIP text encoders
(``CLIPTextModelWithProjection``: penultimate hidden states + pooled projections) and T5
(``T5EncoderModel``, optional: zeros when the folder has none, as the pipeline does). The prompt
embedding is the pipeline's: ``[CLIP-L | CLIP-G]`` zero-padded to T5's width, then T5's tokens after
them on the sequence axis; the pooled vector is ``[CLIP-L pooled | CLIP-G pooled]``. Timesteps are
``sigma * 1000``; the sigma shift is the scheduler's (3.0 for SD3/SD3.5).

A user's checkpoint: ``model: {family: sd3, path: /models/stable-diffusion-3.5-medium}``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from diffusers import AutoencoderKL, SD3Transformer2DModel
from torch import nn
from transformers import AutoTokenizer, CLIPTextModelWithProjection, T5EncoderModel

from diffrl.config import Range
from diffrl.core.rollout import Conditioning
from diffrl.models.base import DTYPES, Planned, SizeRule
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    load_part,
    meta_transformer,
    read_json,
)

CLIP_MAX_TOKENS = 77

# flow_grpo's SD3 choice: the attention projections incl. the context (add_*) projections
SD3_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


def sd3_forward(
    module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
) -> torch.Tensor:
    """One ``SD3Transformer2DModel`` call: ``x_t (B, C, H, W)``, ``sigma (B,)`` -> velocity."""
    dtype = next(module.parameters()).dtype
    c = cond.to(x_t.device, dtype)
    return module(
        hidden_states=x_t.to(dtype),
        encoder_hidden_states=c.tensors["encoder_hidden_states"],
        pooled_projections=c.tensors["pooled_projections"],
        timestep=(sigma * 1000).to(dtype),  # the scheduler's timesteps: sigma * num_train_timesteps
        return_dict=False,
    )[0]


def sd3_planned_forward(tokens: int) -> Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]:
    """:attr:`~diffrl.models.base.Planned.forward` of an ``SD3Transformer2DModel``: :func:`sd3_forward`
    on zero conditioning of ``tokens`` text tokens and the pooled embedding (a full prompt's shapes)."""

    def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
        b, c = len(x_t), m.config
        cond = {
            "encoder_hidden_states": x_t.new_zeros(b, tokens, c.joint_attention_dim),
            "pooled_projections": x_t.new_zeros(b, c.pooled_projection_dim),
        }
        return sd3_forward(m, x_t, sigma, Conditioning(cond))

    return forward


@torch.no_grad()
def vae_encode(vae: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``images (B, 3, H, W)`` in [0, 1] -> latents ``(z - shift_factor) * scaling_factor`` (float32),
    the mode of an ``AutoencoderKL``'s posterior."""
    cfg = vae.config
    z = vae.encode((images * 2.0 - 1.0).to(vae.dtype)).latent_dist.mode()
    return ((z - (cfg.shift_factor or 0.0)) * cfg.scaling_factor).float()


@torch.no_grad()
def vae_decode(vae: nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Latents ``(B, C, h, w)`` -> images ``(B, 3, H, W)`` in [0, 1] (the inverse scaling of
    :func:`vae_encode`, as the SD3 and FLUX pipelines decode)."""
    cfg = vae.config
    z = latents.to(vae.dtype) / cfg.scaling_factor + (cfg.shift_factor or 0.0)
    return ((vae.decode(z, return_dict=False)[0].float() + 1.0) / 2.0).clamp(0.0, 1.0)


class SD3Description(DiffusersFolderDescription):
    """What :class:`SD3Family` declares (static): SD3 / SD3.5's options, size rule and plan."""

    name = "sd3"
    pipeline_class = "StableDiffusion3Pipeline"
    transformer_class = "SD3Transformer2DModel"
    default_guidance = 4.5
    """flow_grpo's SD3.5 setting (diffusers' pipeline defaults to 7.0)."""
    default_lora_targets = SD3_LORA_TARGETS

    @dataclass
    class Options:
        max_sequence_length: Annotated[
            int, Range(1, 512, hint="T5 tokens; StableDiffusion3Pipeline's limit")
        ] = 256
        """T5 tokens (the pipeline's default)."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoders and VAE (``bfloat16`` / ``float16`` save memory)."""

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        blocks = cls.component_setting(config, check_files, "vae", "AutoencoderKL", "block_out_channels")
        patch = cls.component_setting(
            config, check_files, "transformer", "SD3Transformer2DModel", "patch_size"
        )
        if blocks is None or patch is None:
            return None
        vae = 2 ** (len(blocks) - 1)
        extent = cls.component_setting(
            config, check_files, "transformer", "SD3Transformer2DModel", "pos_embed_max_size"
        )
        return SizeRule(
            vae * patch,
            f"the VAE's {vae}x downsampling times the transformer's patch size {patch}",
            extent * patch * vae if extent else None,
            f"the position embedding spans {extent} patches of {patch * vae} pixels",
        )

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer from ``folder/transformer/config.json``; conditioning as
        :meth:`_encode_prompts` gives it: 77 CLIP tokens then ``max_sequence_length`` T5 tokens."""
        built = meta_transformer(cls, SD3Transformer2DModel, config, folder)
        if built is None:
            return None
        module, options = built
        vae = read_json(folder / "vae" / "config.json") or {}
        factor = 2 ** (len(vae.get("block_out_channels", [128, 256, 512, 512])) - 1)
        height, width = config.sampling.height or 1024, config.sampling.width or 1024
        latent = (module.config.in_channels, height // factor, width // factor)
        forward = sd3_planned_forward(77 + options.max_sequence_length)
        return Planned(module, latent, forward, "SD3Transformer2DModel")


class SD3Family(DiffusersFolderFamily):
    """SD3 / SD3.5 loaded: CLIP-L, CLIP-G and T5 prompts, the forward, the VAE."""

    description = SD3Description
    components = (
        "transformer",
        "vae",
        "text_encoder",
        "tokenizer",
        "text_encoder_2",
        "tokenizer_2",
        "text_encoder_3",
        "tokenizer_3",
    )

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.default_shift = float(self.scheduler_config.get("shift", 3.0))
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        frozen = DTYPES[options.text_encoder_dtype]
        t5 = (folder / "text_encoder_3").is_dir()  # optional, as in the pipeline: zeros without it
        return {
            "transformer": load_part(folder, "transformer", SD3Transformer2DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKL, frozen),
            "text_encoder": load_part(folder, "text_encoder", CLIPTextModelWithProjection, frozen),
            "text_encoder_2": load_part(folder, "text_encoder_2", CLIPTextModelWithProjection, frozen),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
            "tokenizer_2": load_part(folder, "tokenizer_2", AutoTokenizer),
            "text_encoder_3": load_part(folder, "text_encoder_3", T5EncoderModel, frozen) if t5 else None,
            "tokenizer_3": load_part(folder, "tokenizer_3", AutoTokenizer) if t5 else None,
        }

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        side = self.transformer.config.sample_size * self.vae_scale_factor
        return (side, side)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        step = self.vae_scale_factor * self.transformer.config.patch_size
        if height % step or width % step:
            raise ValueError(f"sd3: height and width must be multiples of {step}, got {height}x{width}")
        return (
            self.transformer.config.in_channels,
            height // self.vae_scale_factor,
            width // self.vae_scale_factor,
        )

    # ---- text ----------------------------------------------------------------------------------
    def _clip(self, encoder, tokenizer, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        max_length = getattr(tokenizer, "model_max_length", CLIP_MAX_TOKENS)
        ids = tokenizer(
            prompts, padding="max_length", max_length=max_length, truncation=True, return_tensors="pt"
        ).input_ids.to(self.device)
        out = encoder(ids, output_hidden_states=True)
        return out.hidden_states[-2], out[0]  # penultimate layer (the pipeline's clip_skip=None)

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        h1, p1 = self._clip(self.text_encoder, self.tokenizer, prompts)
        h2, p2 = self._clip(self.text_encoder_2, self.tokenizer_2, prompts)
        clip = torch.cat([h1, h2], dim=-1)
        n = self.options.max_sequence_length
        if self.text_encoder_3 is None:
            t5 = torch.zeros(len(prompts), n, self.transformer.config.joint_attention_dim, device=self.device)
        else:
            ids = self.tokenizer_3(
                prompts,
                padding="max_length",
                max_length=n,
                truncation=True,
                add_special_tokens=True,
                return_tensors="pt",
            ).input_ids.to(self.device)
            t5 = self.text_encoder_3(ids)[0]
        clip = nn.functional.pad(clip, (0, t5.shape[-1] - clip.shape[-1]))
        return {
            "encoder_hidden_states": torch.cat([clip.to(t5.dtype), t5], dim=-2),
            "pooled_projections": torch.cat([p1, p2], dim=-1),
        }

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        return sd3_forward(module, x_t, sigma, cond)

    # ---- pixels <-> latents --------------------------------------------------------------------
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return vae_encode(self.vae, images.to(self.device))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return vae_decode(self.vae, latents)
