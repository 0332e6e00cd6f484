"""``flux``: FLUX.1 [dev] / [schnell] from a local diffusers folder (``FluxPipeline`` layout).

Parts, loaded as diffusers' pipeline would: ``FluxTransformer2DModel`` (trained), ``AutoencoderKL``
(16 latent channels, ``(z - shift_factor) * scaling_factor``), CLIP-L (``CLIPTextModel``: only its
pooled output) and T5 (``T5EncoderModel``: the token embeddings, ``max_sequence_length`` tokens).

diffrl keeps a sample's latent unpacked, ``(C, H/8, W/8)``; :meth:`FluxFamily.forward` packs 2 x 2
patches into ``(B, H/16 * W/16, 4C)`` tokens with their image ids (row, column) and text ids (zeros),
as ``FluxPipeline`` does, and unpacks the velocity. The transformer takes ``timestep = sigma``
(it multiplies by 1000 itself).

Guidance, as ``FluxPipeline``: FLUX.1 [dev] is guidance-distilled (``guidance_embeds``): every
forward — sampling, training, eval, the reference — embeds ``model.options.guidance`` (the pipeline's
``guidance_scale``, 3.5), a model input like the timestep. ``sampling.guidance_scale`` is true CFG
with ``sampling.negative_prompt`` (the pipeline's ``true_cfg_scale``), 1 (off) by default, as for
[schnell]. Sigmas are the pipeline's: ``linspace(1, 1/N, N)`` shifted by
``mu`` computed from the number of image tokens (``sampling.shift`` replaces that with a static shift).

A user's checkpoint: ``model: {family: flux, path: /models/FLUX.1-dev}``.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar

import diffusers
import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import calculate_shift
from torch import nn
from transformers import AutoTokenizer, CLIPTextModel, T5EncoderModel

from diffrl.config import Config, Range
from diffrl.core.rollout import Conditioning
from diffrl.models.base import DTYPES, Planned, SizeRule
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    load_part,
    meta_transformer,
    read_json,
)
from diffrl.models.sd3 import SD3_LORA_TARGETS, vae_decode, vae_encode


def pack(latents: torch.Tensor) -> torch.Tensor:
    """``(B, C, H, W)`` -> ``(B, H/2 * W/2, 4C)``: 2 x 2 patches as tokens (``FluxPipeline._pack_latents``;
    ``QwenImagePipeline`` packs the same way)."""
    b, c, h, w = latents.shape
    x = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(b, (h // 2) * (w // 2), c * 4)


def unpack(tokens: torch.Tensor, h: int, w: int) -> torch.Tensor:
    """``(B, H/2 * W/2, 4C)`` -> ``(B, C, H, W)`` (``FluxPipeline._unpack_latents``)."""
    b, _, d = tokens.shape
    x = tokens.view(b, h // 2, w // 2, d // 4, 2, 2).permute(0, 3, 1, 4, 2, 5)
    return x.reshape(b, d // 4, h, w)


def image_ids(h: int, w: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """``(H/2 * W/2, 3)`` position ids of the packed tokens: (0, row, column)."""
    ids = torch.zeros(h // 2, w // 2, 3)
    ids[..., 1] = torch.arange(h // 2)[:, None]
    ids[..., 2] = torch.arange(w // 2)[None, :]
    return ids.reshape(-1, 3).to(device=device, dtype=dtype)


def sequence_ranks(module: nn.Module) -> int:
    """The ranks ``module``'s tokens are split over: the context-parallel degree (Ulysses x ring)
    that diffusers' ``ModelMixin.enable_parallelism`` (``models/modeling_utils.py``) records on
    the model as ``_parallel_config``; 1 for a model without (every forward but sequence-parallel
    training). ``tests/integration/test_sequence_parallel.py`` notices if diffusers moves it: its
    Qwen-Image prompts are padded only through this."""
    config = getattr(module, "_parallel_config", None)
    cp = getattr(config, "context_parallel_config", None)
    return 1 if cp is None else cp.ulysses_degree * cp.ring_degree


def sample_size(config: Config, rule: SizeRule) -> tuple[int, int]:
    """``(sampling.height, sampling.width)``, where unset the pipelines' default: 128 latents a
    side (``default_sample_size``), 64 tokens of ``rule.multiple`` px."""
    default = 64 * rule.multiple
    return config.sampling.height or default, config.sampling.width or default


def folder_setting(folder: Path, sub: str, class_name: str, key: str) -> Any:
    """``key`` of ``folder/sub/config.json``, else the default of diffusers' ``class_name`` (what
    ``from_pretrained`` builds where the file leaves it out, or where there is no file): what
    :meth:`~diffrl.models.base.FamilyDescription.planned` reads a model's shape from."""
    settings = read_json(folder / sub / "config.json") or {}
    if key in settings:
        return settings[key]
    return inspect.signature(getattr(diffusers, class_name).__init__).parameters[key].default


def flux_forward_tokens(
    module: nn.Module,
    tokens: torch.Tensor,
    ids: torch.Tensor,
    sigma: torch.Tensor,
    cond: Conditioning,
    guidance: float | None,
) -> torch.Tensor:
    """One ``FluxTransformer2DModel`` call on packed image ``tokens (B, N, 4C)`` with their
    position ``ids (N, 3)`` -> its output ``(B, N, 4C)``: the text (T5 tokens, ids zero) and the
    pooled CLIP embedding from ``cond``, ``guidance`` embedded (None: a transformer without
    guidance embeddings)."""
    dtype = next(module.parameters()).dtype
    c = cond.to(tokens.device, dtype)
    embedded = None
    if guidance is not None:  # float32, as the pipeline
        embedded = torch.full((len(tokens),), float(guidance), device=tokens.device, dtype=torch.float32)
    text = c.tensors["encoder_hidden_states"]
    return module(
        hidden_states=tokens.to(dtype),
        timestep=sigma.to(dtype),  # the pipeline's t / 1000
        guidance=embedded,
        pooled_projections=c.tensors["pooled_projections"],
        encoder_hidden_states=text,
        txt_ids=torch.zeros(text.shape[1], 3, device=tokens.device, dtype=dtype),
        img_ids=ids.to(dtype),
        return_dict=False,
    )[0]


def flux_forward(
    module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, guidance: float | None
) -> torch.Tensor:
    """:func:`flux_forward_tokens` on ``x_t (B, C, H, W)`` packed 2 x 2 -> velocity ``(B, C, H, W)``."""
    h, w = x_t.shape[-2:]
    dtype = next(module.parameters()).dtype
    ids = image_ids(h, w, x_t.device, dtype)
    return unpack(flux_forward_tokens(module, pack(x_t), ids, sigma, cond, guidance), h, w)


def flux_conditioning(module: nn.Module, like: torch.Tensor, tokens: int) -> dict[str, torch.Tensor]:
    """Zero text tensors shaped as :meth:`FluxFamily._encode_prompts` gives them for ``len(like)``
    prompts: ``tokens`` T5 embeddings (every prompt is padded to ``max_sequence_length``) and the
    pooled CLIP embedding."""
    b, c = len(like), module.config
    return {
        "encoder_hidden_states": like.new_zeros(b, tokens, c.joint_attention_dim),
        "pooled_projections": like.new_zeros(b, c.pooled_projection_dim),
    }


def packed_lengths(
    family: type[DiffusersFolderDescription], config: Config, check_files: bool, text: bool
) -> dict[str, int] | None:
    """What the context-parallel plans of FLUX.1, FLUX.2 and Qwen-Image split, for
    :meth:`~diffrl.models.base.FamilyDescription.sequence_lengths`: the packed image tokens of a
    ``sampling.height x width`` sample (:func:`sample_size`; one token per ``SizeRule.multiple``
    px square: VAE compression x 2 x 2 packing), with ``text`` the text tokens
    (``model.options.max_sequence_length``: every prompt padded to it), and the attention heads
    (Ulysses exchanges them for tokens). None until the model folder can be read."""
    rule = family.size_rule(config, check_files)
    heads = family.component_setting(
        config, check_files, "transformer", family.transformer_class, "num_attention_heads"
    )
    length = config.model.options.get("max_sequence_length", family.Options.max_sequence_length)
    if rule is None or heads is None or not isinstance(length, int):
        return None
    height, width = sample_size(config, rule)
    lengths = {"image tokens": (height // rule.multiple) * (width // rule.multiple)}
    if text:
        lengths["text tokens (model.options.max_sequence_length)"] = length
    lengths["attention heads"] = int(heads)
    return lengths


def resolution_shifted_sigmas(
    scheduler_config: dict, num_steps: int, image_seq_len: int, initial: Any = None
) -> torch.Tensor:
    """``(num_steps + 1,)`` float32 sigmas as ``FluxPipeline`` / ``QwenImagePipeline`` set them:
    ``linspace(1, 1/N, N)`` given to the folder's ``FlowMatchEulerDiscreteScheduler`` with
    ``mu = calculate_shift(image_seq_len, ...)`` (the shift grows with the number of image tokens when
    the scheduler has ``use_dynamic_shifting``; otherwise its static ``shift`` applies).
    ``initial``: the pipeline's own ``(num_steps,)`` sigmas before the shift, where it does not
    use numpy's ``linspace`` (Z-Image: torch's, float32)."""
    cfg = dict(scheduler_config)
    mu = calculate_shift(
        image_seq_len,
        cfg.get("base_image_seq_len", 256),
        cfg.get("max_image_seq_len", 4096),
        cfg.get("base_shift", 0.5),
        cfg.get("max_shift", 1.15),
    )
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    if initial is None:
        initial = np.linspace(1.0, 1 / num_steps, num_steps)
    scheduler.set_timesteps(sigmas=initial, mu=mu)
    return scheduler.sigmas.float().cpu()


class PackedLatentFamily(DiffusersFolderFamily):
    """A family whose transformer takes the latent as 2 x 2 patches packed into tokens (FLUX.1,
    Qwen-Image): the geometry and the sigma schedule their pipelines share. diffrl keeps a sample's
    latent unpacked, ``(in_channels / 4, H / v, W / v)`` for the VAE's ``v``x compression; the
    family's ``forward`` packs it (:func:`pack`) and unpacks the velocity (:func:`unpack`)."""

    default_sample_size: ClassVar[int] = 128
    """Latent pixels per side by default (the pipelines' ``default_sample_size``: 1024 px images)."""
    vae_scale_factor: int
    """The VAE's spatial compression ``v`` (set by the subclass's ``__init__``)."""

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        side = self.default_sample_size * self.vae_scale_factor
        return (side, side)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        step = self.vae_scale_factor * 2  # the VAE's compression, then 2 x 2 packing
        if height % step or width % step:
            raise ValueError(
                f"{self.description.name}: height and width must be multiples of {step}, got {height}x{width}"
            )
        channels = self.transformer.config.in_channels // 4
        return (channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    def unpack_latents(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Packed tokens ``(B, H/2 * W/2, 4C)`` -> ``(B, C, H, W)`` (:func:`unpack`)."""
        _, h, w = self.latent_shape(height, width)
        return unpack(latents, h, w)

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """The pipeline's ``(num_steps + 1,)`` schedule: ``linspace(1, 1/N, N)`` through the
        scheduler with ``mu`` from the image's token count, then the final 0; a numeric ``shift``
        replaces it with a static shift (see :meth:`ModelFamily.sigmas`)."""
        if shift is not None:
            return super().sigmas(num_steps, shift, height, width)
        _, h, w = self.latent_shape(height, width)
        return resolution_shifted_sigmas(self.scheduler_config, num_steps, (h // 2) * (w // 2))


class FluxDescription(DiffusersFolderDescription):
    """What :class:`FluxFamily` declares (static): FLUX.1's options, size rule, sequence lengths and
    meta-device plan."""

    name = "flux"
    pipeline_class = "FluxPipeline"
    transformer_class = "FluxTransformer2DModel"
    default_guidance = 1.0
    """``FluxPipeline``'s ``true_cfg_scale`` (CFG off); the distilled guidance is ``Options.guidance``."""
    default_lora_targets = SD3_LORA_TARGETS
    """The attention projections of the double-stream blocks incl. the text stream's ``add_*``
    (``to_q/k/v`` also match the single-stream blocks' attention), as for SD3."""
    sequence_parallel = True
    """diffusers' ``FluxTransformer2DModel._cp_plan`` (``models/transformers/transformer_flux.py``)
    splits, at the model's input, the packed image tokens (``hidden_states``, with ``img_ids``) and
    the T5 text tokens (``encoder_hidden_states``, with ``txt_ids``), all over the sequence, and
    gathers ``proj_out``'s output; the pooled CLIP embedding, the timestep and the embedded
    guidance stay whole. Each joint attention runs over every rank's text and image tokens (a
    permuted order, which unmasked attention does not see). Both lengths are fixed by the config:
    the image's size and ``max_sequence_length`` (T5 pads every prompt to it)."""

    @dataclass
    class Options:
        guidance: Annotated[float, Range(0, 100, hint="FLUX.1 [dev]'s embedded guidance, e.g. 3.5")] = 3.5
        """The embedded guidance of a guidance-distilled transformer (``FluxPipeline``'s
        ``guidance_scale``); unused by a transformer without guidance embeddings."""
        max_sequence_length: Annotated[int, Range(1, 512, hint="T5 tokens; FluxPipeline's limit")] = 512
        """T5 tokens (the pipeline's default; at most 512)."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoders and VAE (``bfloat16`` saves memory)."""

    @classmethod
    def pipeline_guidance(cls, options: Any, guidance_scale: float) -> dict[str, float]:
        """``FluxPipeline``'s ``guidance_scale`` is the embedded guidance (``options.guidance``);
        true CFG is its ``true_cfg_scale``."""
        return {"guidance_scale": float(options.guidance), "true_cfg_scale": guidance_scale}

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        blocks = cls.component_setting(config, check_files, "vae", "AutoencoderKL", "block_out_channels")
        if blocks is None:
            return None
        vae = 2 ** (len(blocks) - 1)
        return SizeRule(vae * 2, f"the VAE's {vae}x downsampling, then 2 x 2 packing")

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """The packed image tokens (``H / 16 x W / 16`` for the 8x VAE), the T5 text tokens
        (``max_sequence_length``) and the attention heads."""
        return packed_lengths(cls, config, check_files, text=True)

    @classmethod
    def planned_transformer(cls, config, folder: Path) -> tuple[nn.Module, Any, int, int, int] | None:
        """What :meth:`planned` builds on: the transformer from ``folder/transformer/config.json``
        on the meta device, the parsed options, the VAE's compression ``v`` (``folder``'s
        ``vae/config.json``, else ``AutoencoderKL``'s default) and the sample's height and width
        (:func:`sample_size`); None without the transformer's config."""
        built = meta_transformer(cls, FluxTransformer2DModel, config, folder)
        if built is None:
            return None
        module, options = built
        vae = 2 ** (len(folder_setting(folder, "vae", "AutoencoderKL", "block_out_channels")) - 1)
        height, width = sample_size(config, SizeRule(vae * 2, "the VAE's compression, then 2 x 2 packing"))
        return module, options, vae, height, width

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer at ``sampling.height x width`` (the latent ``(in_channels / 4, H / v,
        W / v)``); conditioning as :meth:`_encode_prompts` gives it: ``max_sequence_length`` T5
        tokens and the pooled CLIP embedding, ``options.guidance`` embedded when the transformer is
        distilled."""
        built = cls.planned_transformer(config, folder)
        if built is None:
            return None
        module, options, vae, height, width = built
        latent = (module.config.in_channels // 4, height // vae, width // vae)
        guidance = float(options.guidance) if module.config.guidance_embeds else None
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            cond = Conditioning(flux_conditioning(m, x_t, tokens))
            return flux_forward(m, x_t, sigma, cond, guidance)

        return Planned(module, latent, forward, "FluxTransformer2DModel")


class FluxFamily(PackedLatentFamily):
    """FLUX.1 loaded: CLIP + T5 prompts, packed-token forward with the embedded guidance, the VAE."""

    description = FluxDescription
    components = ("transformer", "vae", "text_encoder", "tokenizer", "text_encoder_2", "tokenizer_2")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)

    @property
    def distilled_guidance(self) -> bool:
        """True when the transformer takes the guidance scale as an input (FLUX.1 [dev])."""
        return bool(self.transformer.config.guidance_embeds)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        frozen = DTYPES[options.text_encoder_dtype]
        return {
            "transformer": load_part(folder, "transformer", FluxTransformer2DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKL, frozen),
            "text_encoder": load_part(folder, "text_encoder", CLIPTextModel, frozen),
            "text_encoder_2": load_part(folder, "text_encoder_2", T5EncoderModel, frozen),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
            "tokenizer_2": load_part(folder, "tokenizer_2", AutoTokenizer),
        }

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        ids = self.tokenizer(
            prompts,
            padding="max_length",
            max_length=self.tokenizer.model_max_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)
        pooled = self.text_encoder(ids, output_hidden_states=False).pooler_output
        ids = self.tokenizer_2(
            prompts,
            padding="max_length",
            max_length=self.options.max_sequence_length,
            truncation=True,
            return_tensors="pt",
        ).input_ids.to(self.device)
        return {
            "encoder_hidden_states": self.text_encoder_2(ids, output_hidden_states=False)[0],
            "pooled_projections": pooled,
        }

    # ---- the velocity forward ------------------------------------------------------------------
    @property
    def embedded_guidance(self) -> float | None:
        """The guidance the transformer embeds: ``options.guidance`` when it is distilled, else None."""
        return float(self.options.guidance) if self.distilled_guidance else None

    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One ``FluxTransformer2DModel`` call (:func:`flux_forward`): ``x_t (B, C, H, W)``,
        ``sigma (B,)`` -> velocity ``(B, C, H, W)``, with ``options.guidance`` embedded when the
        transformer is distilled."""
        return flux_forward(module, x_t, sigma, cond, self.embedded_guidance)

    # ---- pixels <-> latents --------------------------------------------------------------------
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        return vae_encode(self.vae, images.to(self.device))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return vae_decode(self.vae, latents)
