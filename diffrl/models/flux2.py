"""``flux2``: FLUX.2 [dev] and FLUX.2 [klein] from a local diffusers folder (``Flux2Pipeline`` or
``Flux2KleinPipeline`` layout, diffusers 0.42: ``pipelines/flux2/``).

The folder's ``model_index.json`` ``_class_name`` picks the variant (:data:`VARIANTS`); both share
every part but the text encoder:

- ``Flux2Transformer2DModel`` (trained): 8 double-stream blocks then 48 single-stream blocks in
  the 32B [dev] (5 + 20 in [klein] 4B), RoPE over 4-axis position ids ``(t, h, w, l)``, no text mask.
- ``AutoencoderKLFlux2``: 32 latent channels, 8x compression. The pipelines' latent is the VAE's
  ``z`` cut into 2 x 2 patches, channel-major (``c * 4 + py * 2 + px``: ``_patchify_latents``), then
  normalised by the VAE's ``bn`` running statistics, ``(z - mean) / sqrt(var + batch_norm_eps)``
  (``vae.bn`` is a ``BatchNorm2d(128, affine=False)``; it is never run as a layer).
- [dev]: ``Mistral3ForConditionalGeneration`` (Mistral Small 3.x, 24B) and its ``PixtralProcessor``
  (loaded with ``AutoProcessor``; transformers builds it only with torchvision installed). The
  prompt goes into a chat with the pipeline's ``SYSTEM_MESSAGE``
  (``Flux2Pipeline._get_mistral_3_small_prompt_embeds``).
  [klein]: ``Qwen3ForCausalLM`` (Qwen3 4B / 8B) and its tokenizer; the prompt is the user turn of
  Qwen3's chat template with an empty think block (``enable_thinking=False``,
  ``Flux2KleinPipeline._get_qwen3_prompt_embeds``).

Prompts: diffrl calls those two static methods of the pipelines, so the embedding is theirs: the
hidden states after the layers ``text_encoder_out_layers`` ((10, 20, 30) for [dev], (9, 18, 27)
for [klein]) stacked on the features, ``encoder_hidden_states (B, L, 3 D)``, every prompt padded
to ``L = max_sequence_length`` (512) tokens. The transformer gets no text mask: the padding
tokens' hidden states are part of the condition, exactly as in the pipelines, and since every
prompt has the same length, prompts encoded apart stack. Text ids are ``(0, 0, 0, l)``.

diffrl's per-sample latent is the pipelines' patchified, normalised latent before packing,
``(128, H/16, W/16)`` (``in_channels`` channels): initial noise drawn in that shape is the
pipeline's ``latents``. :meth:`Flux2Family.forward` flattens it into ``(B, H/16 * W/16, 128)``
tokens with ids ``(0, row, column, 0)`` and reshapes the output back. The transformer takes
``timestep = sigma`` (it multiplies by 1000 itself) and predicts ``noise - x0``, the scheduler's
Euler step ``x + (sigma_next - sigma) v``: diffrl's velocity as it is.

Sigmas, as both pipelines: ``linspace(1, 1/N, N)`` given to the folder's
``FlowMatchEulerDiscreteScheduler`` with ``mu = compute_empirical_mu(H/16 * W/16, N)`` (FLUX.2's
own fit of the shift to the token count *and* the number of steps), then the final 0;
``sampling.shift`` set to a number replaces that with a static shift.

Guidance:
- [dev] is guidance-distilled: every forward embeds ``model.options.guidance`` (``Flux2Pipeline``'s
  ``guidance_scale``, default 4.0) as a model input, like the timestep. ``Flux2Pipeline`` has no
  classifier-free guidance, so ``sampling.guidance_scale`` must stay 1 (refused above 1).
- [klein] embeds no guidance (the pipeline passes none). A base (undistilled) [klein] runs true CFG
  ``neg + g (pos - neg)`` when ``sampling.guidance_scale`` g > 1, the negative prompt ``""``
  (``sampling.negative_prompt``; the pipeline always uses ``""``), two forwards batched into one
  here. ``Flux2KleinPipeline`` ignores ``guidance_scale`` for a step-distilled [klein]
  (``is_distilled: true`` in ``model_index.json``): diffrl refuses it above 1 there.
- ``sampling.guidance_scale`` defaults to 1 (no CFG) for the whole family, what [dev] and the
  distilled [klein] need; ``Flux2KleinPipeline``'s own default 4.0 for a base [klein] is set in
  the recipe.

Images: :meth:`Flux2Family.encode_images` is ``Flux2Pipeline._encode_vae_image`` (the VAE's mode,
patchified, ``bn``-normalised: how the pipelines encode reference images); :meth:`Flux2Family.decode`
is the pipelines' decode (``bn`` inverse, unpatchify, ``vae.decode``). Height and width must be
multiples of 16 (the pipelines floor them).

LoRA: exported with ``Flux2LoraLoaderMixin.save_lora_weights`` (either pipeline's
``load_lora_weights`` reads it). Default targets, after diffusers' FLUX.2 LoRA scripts: the
double-stream blocks' attention projections (image and text stream) and the single-stream blocks'
fused projections ``attn.to_qkv_mlp_proj`` and ``attn.to_out`` (named per block, since ``attn.to_out``
of a double-stream block is a ``ModuleList``).

A user's checkpoint: ``model: {family: flux2, path: /models/FLUX.2-klein-base-4B}`` (or
``/models/FLUX.2-dev``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2KleinPipeline,
    Flux2Pipeline,
    Flux2Transformer2DModel,
)
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from torch import nn
from transformers import AutoProcessor, AutoTokenizer, Mistral3ForConditionalGeneration, Qwen3ForCausalLM

from diffrl.config import Range
from diffrl.core.rollout import Conditioning
from diffrl.models.base import DTYPES, Planned, SizeRule, TextTokens
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    load_part,
    meta_transformer,
    read_json,
)
from diffrl.models.flux import folder_setting, packed_lengths, sample_size
from diffrl.models.sd3 import SD3_LORA_TARGETS


def _dev_embeds(family: Flux2Family, prompts: list[str], layers: tuple[int, ...]) -> torch.Tensor:
    return Flux2Pipeline._get_mistral_3_small_prompt_embeds(
        text_encoder=family.text_encoder,
        tokenizer=family.tokenizer,
        prompt=prompts,
        device=family.device,
        max_sequence_length=family.options.max_sequence_length,
        system_message=SYSTEM_MESSAGE,  # Flux2Pipeline.system_message
        hidden_states_layers=layers,
    )


def _klein_embeds(family: Flux2Family, prompts: list[str], layers: tuple[int, ...]) -> torch.Tensor:
    return Flux2KleinPipeline._get_qwen3_prompt_embeds(
        text_encoder=family.text_encoder,
        tokenizer=family.tokenizer,
        prompt=prompts,
        device=family.device,
        max_sequence_length=family.options.max_sequence_length,
        hidden_states_layers=layers,
    )


@dataclass(frozen=True)
class Variant:
    """What differs between FLUX.2 [dev] and [klein]: the pipeline, its text encoder and prompt
    encoding, and whether the transformer is given the guidance scale."""

    label: str
    pipeline_class: str
    text_encoder_class: type
    tokenizer_class: type
    text_layers: tuple[int, ...]
    """The pipeline's default ``text_encoder_out_layers``."""
    embeds_guidance: bool
    """True: the pipeline passes ``guidance_scale`` to the transformer as ``guidance`` ([dev])."""
    prompt_embeds: Callable[[Flux2Family, list[str], tuple[int, ...]], torch.Tensor]
    """``(family, prompts, layers) -> (B, max_sequence_length, len(layers) * D)``: the pipeline's own."""


DEV = Variant(
    label="FLUX.2 [dev]",
    pipeline_class="Flux2Pipeline",
    text_encoder_class=Mistral3ForConditionalGeneration,
    tokenizer_class=AutoProcessor,  # a PixtralProcessor in FLUX.2-dev's folder
    text_layers=(10, 20, 30),
    embeds_guidance=True,
    prompt_embeds=_dev_embeds,
)
KLEIN = Variant(
    label="FLUX.2 [klein]",
    pipeline_class="Flux2KleinPipeline",
    text_encoder_class=Qwen3ForCausalLM,
    tokenizer_class=AutoTokenizer,
    text_layers=(9, 18, 27),
    embeds_guidance=False,  # Flux2KleinPipeline passes guidance=None
    prompt_embeds=_klein_embeds,
)
VARIANTS = {v.pipeline_class: v for v in (DEV, KLEIN)}
"""The variant by ``model_index.json``'s ``_class_name``."""

DOUBLE_STREAM_TARGETS = SD3_LORA_TARGETS
"""The attention projections of the double-stream blocks, image stream (to_*) and text stream (add_*)
(SD3's and FLUX.1's names)."""


def patchify(z: torch.Tensor) -> torch.Tensor:
    """``(B, C, h, w)`` -> ``(B, 4C, h/2, w/2)``, channel ``c * 4 + py * 2 + px`` (the pipelines')."""
    return Flux2Pipeline._patchify_latents(z)


def unpatchify(latents: torch.Tensor) -> torch.Tensor:
    """``(B, 4C, h/2, w/2)`` -> ``(B, C, h, w)``, the inverse of :func:`patchify`."""
    return Flux2Pipeline._unpatchify_latents(latents)


def flux2_sigmas(scheduler_config: dict, num_steps: int, image_seq_len: int) -> torch.Tensor:
    """``(num_steps + 1,)`` float32 sigmas as both FLUX.2 pipelines set them:
    ``linspace(1, 1/N, N)`` through the folder's scheduler with ``mu = compute_empirical_mu``."""
    scheduler = FlowMatchEulerDiscreteScheduler.from_config(dict(scheduler_config))
    mu = compute_empirical_mu(image_seq_len=image_seq_len, num_steps=num_steps)
    scheduler.set_timesteps(sigmas=np.linspace(1.0, 1 / num_steps, num_steps), mu=mu)
    return scheduler.sigmas.float().cpu()


def flux2_forward(
    module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning, guidance: float | None
) -> torch.Tensor:
    """One ``Flux2Transformer2DModel`` call: ``x_t (B, C, h, w)``, ``sigma (B,)`` -> velocity
    ``(B, C, h, w)`` through the ``(B, h * w, C)`` tokens (``Flux2Pipeline._pack_latents``), with
    ``guidance`` embedded ([dev]; None: [klein], whose pipeline passes none)."""
    b, c, h, w = x_t.shape
    dtype = next(module.parameters()).dtype
    text = cond.to(x_t.device, dtype).tensors["encoder_hidden_states"]
    embedded = None
    if guidance is not None:  # float32, as the pipeline
        embedded = torch.full((b,), float(guidance), device=x_t.device, dtype=torch.float32)
    out = module(
        hidden_states=Flux2Pipeline._pack_latents(x_t.to(dtype)),
        timestep=sigma.to(dtype),  # the pipeline's t / 1000
        guidance=embedded,
        encoder_hidden_states=text,
        # (1, L, 4) and (1, N, 4), the pipeline's 3-D layout with one row (the transformer reads
        # row 0): the context-parallel plan splits ids on dim 1 of a 3-D tensor only, and would
        # leave 2-D ones whole (their rotary embedding then twice the split tokens)
        txt_ids=Flux2Pipeline._prepare_text_ids(text[:1]).to(x_t.device),  # (0, 0, 0, l)
        img_ids=Flux2Pipeline._prepare_latent_ids(x_t[:1]).to(x_t.device),  # (0, row, col, 0)
        return_dict=False,
    )[0]
    return out.transpose(1, 2).reshape(b, c, h, w)


def folder_variant(folder: Path) -> Variant | None:
    """The variant of the pipeline folder ``folder`` (None: no readable FLUX.2 ``model_index.json``)."""
    return VARIANTS.get((read_json(folder / "model_index.json") or {}).get("_class_name"))


class Flux2Description(DiffusersFolderDescription):
    """What :class:`Flux2Family` declares (static): the FLUX.2 folders' checks ([dev] and [klein]),
    size rule, sequence lengths, plan and LoRA targets."""

    name = "flux2"
    pipeline_class = "Flux2Pipeline or Flux2KleinPipeline"
    pipeline_classes = ("Flux2Pipeline", "Flux2KleinPipeline")
    """For messages before a folder is read; a loaded family holds its folder's (:attr:`variant`)."""
    transformer_class = "Flux2Transformer2DModel"
    default_guidance = 1.0
    """No CFG: what [dev] (no CFG at all) and a distilled [klein] take; a base [klein]'s recipe sets
    ``sampling.guidance_scale: 4.0`` (``Flux2KleinPipeline``'s default)."""
    default_lora_targets = [*DOUBLE_STREAM_TARGETS, "attn.to_qkv_mlp_proj"]
    """Listed for messages; :meth:`lora_targets` adds every single-stream block's ``attn.to_out``."""
    sequence_parallel = True
    """diffusers' ``Flux2Transformer2DModel._cp_plan`` (``models/transformers/transformer_flux2.py``)
    splits, at the model's input, the image tokens (``hidden_states``) and the text tokens
    (``encoder_hidden_states``) over the sequence, with their position ids (``img_ids`` /
    ``txt_ids``, 3-D ``(1, N, 4)`` as :meth:`forward` passes them: the plan leaves 2-D ids whole),
    and gathers ``proj_out``'s output; the timestep and [dev]'s embedded guidance stay whole. Both
    lengths are fixed by the config: the image's size and ``max_sequence_length`` (the pipelines'
    prompt encoders pad every prompt to it)."""

    @dataclass
    class Options:
        guidance: Annotated[float, Range(0, 100, hint="[dev]'s embedded guidance, e.g. 4.0")] = 4.0
        """[dev] only: the embedded guidance of the guidance-distilled transformer
        (``Flux2Pipeline``'s ``guidance_scale``)."""
        max_sequence_length: TextTokens = 512
        """Text tokens every prompt is padded or cut to (the pipelines' default)."""
        text_encoder_out_layers: (
            list[
                Annotated[
                    int, Range(-1024, 1024, hint="a hidden state of the text encoder; < 0 from the end")
                ]
            ]
            | None
        ) = None
        """The text encoder's hidden states stacked into the prompt embedding; None: the
        pipeline's default, (10, 20, 30) for [dev], (9, 18, 27) for [klein]."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoder and VAE (``bfloat16`` for the 24B / 4B encoders)."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        problems = super().folder_problems(folder)
        if problems:
            return problems
        problems = [
            f"{str(folder)!r} has no {sub}/ folder"
            for sub in ("vae", "text_encoder", "tokenizer")
            if not (folder / sub).is_dir()
        ]
        meta = read_json(folder / "model_index.json") or {}
        processor = (meta.get("tokenizer") or [None, None])[-1]
        if processor == "PixtralProcessor" and importlib.util.find_spec("torchvision") is None:
            problems.append(
                f"{str(folder)!r}: FLUX.2 [dev]'s tokenizer is a PixtralProcessor, which transformers "
                "builds only with torchvision installed; pip install torchvision (the build matching "
                "your torch)"
            )
        return problems

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        options = config.model.options
        folder = Path(config.model.path)
        variant = folder_variant(folder) if check_files and folder.is_dir() else None
        if variant is None:
            return errors
        scale = config.sampling.guidance_scale  # None: the family's default, 1
        distilled = bool((read_json(folder / "model_index.json") or {}).get("is_distilled"))
        if variant is DEV and scale is not None and scale > 1:
            errors.append(
                f"sampling.guidance_scale={scale}: Flux2Pipeline (FLUX.2 [dev]) has no "
                "classifier-free guidance; its guidance_scale is the guidance embedded in the "
                "distilled transformer, model.options.guidance (default 4.0). Set sampling.guidance_scale: 1"
            )
        if variant is KLEIN and "guidance" in options:
            errors.append(
                "model.options.guidance: FLUX.2 [klein] embeds no guidance (Flux2KleinPipeline passes "
                "none to its transformer); its guidance is true CFG, sampling.guidance_scale"
            )
        if variant is KLEIN and distilled and scale is not None and scale > 1:
            errors.append(
                f"sampling.guidance_scale={scale}: this FLUX.2 [klein] is step-distilled (model_index.json "
                "is_distilled: true), and Flux2KleinPipeline ignores guidance_scale for it. "
                "Set sampling.guidance_scale: 1"
            )
        errors += cls._text_layer_problems(folder, variant, options.get("text_encoder_out_layers"))
        return errors

    @classmethod
    def _text_layer_problems(cls, folder: Path, variant: Variant, layers: Any) -> list[str]:
        """``text_encoder_out_layers`` that the folder's text encoder does not have, or whose
        stacked width is not the transformer's ``joint_attention_dim``."""
        if layers is None:
            layers = variant.text_layers
        if not isinstance(layers, list | tuple) or not all(isinstance(k, int) for k in layers):
            return []  # a type error, reported by the binding
        text = read_json(folder / "text_encoder" / "config.json") or {}
        text = text.get("text_config", text)  # Mistral3's language model config is nested
        transformer = read_json(folder / "transformer" / "config.json") or {}
        n, width, joint = (
            text.get("num_hidden_layers"),
            text.get("hidden_size"),
            transformer.get("joint_attention_dim"),
        )
        if not isinstance(n, int):
            return []
        where = "model.options.text_encoder_out_layers"
        shown = list(layers)
        bad = [k for k in layers if not -(n + 1) <= k <= n]
        if bad:
            return [
                f"{where}={shown}: the text encoder has {n} layers (hidden states 0 to {n}), so {bad} "
                f"are out of range; use indices in [0, {n}] (the {variant.label} default is "
                f"{list(variant.text_layers)})"
            ]
        if not isinstance(width, int) or not isinstance(joint, int) or len(layers) * width == joint:
            return []
        if joint % width:
            return [
                f"model.path: the transformer's joint_attention_dim {joint} is no multiple of the text "
                f"encoder's {width} features: the folder's parts do not belong together"
            ]
        return [
            f"{where}={shown}: {len(layers)} layers x the text encoder's {width} features = "
            f"{len(layers) * width}, but the transformer's joint_attention_dim is {joint}; give "
            f"{joint // width} layer indices (the {variant.label} default is {list(variant.text_layers)})"
        ]

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        blocks = cls.component_setting(config, check_files, "vae", "AutoencoderKLFlux2", "block_out_channels")
        if blocks is None:
            return None
        vae = 2 ** (len(blocks) - 1)
        return SizeRule(vae * 2, f"the VAE's {vae}x downsampling, then 2 x 2 patches")

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """The image tokens (``H / 16 x W / 16`` for the 8x VAE), the text tokens
        (``max_sequence_length``) and the attention heads."""
        return packed_lengths(cls, config, check_files, text=True)

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer from ``folder/transformer/config.json`` at ``sampling.height x width``
        (the latent ``(in_channels, H / 16, W / 16)`` for the 8x VAE); conditioning as
        :meth:`_encode_prompts` gives it: ``max_sequence_length`` tokens of the stacked text
        features (``joint_attention_dim``), ``options.guidance`` embedded for [dev] (the variant
        from ``model_index.json``; without one, from the transformer's ``guidance_embeds``)."""
        built = meta_transformer(cls, Flux2Transformer2DModel, config, folder)
        if built is None:
            return None
        module, options = built
        variant = folder_variant(folder) or (DEV if module.config.guidance_embeds else KLEIN)
        blocks = folder_setting(folder, "vae", "AutoencoderKLFlux2", "block_out_channels")
        step = 2 ** (len(blocks) - 1) * 2  # the VAE's compression, then 2 x 2 patches
        height, width = sample_size(config, SizeRule(step, "the VAE's compression, then 2 x 2 patches"))
        latent = (module.config.in_channels, height // step, width // step)
        guidance = float(options.guidance) if variant.embeds_guidance else None
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            text = x_t.new_zeros(len(x_t), tokens, m.config.joint_attention_dim)
            return flux2_forward(m, x_t, sigma, Conditioning({"encoder_hidden_states": text}), guidance)

        return Planned(module, latent, forward, f"Flux2Transformer2DModel ({variant.label})")

    @classmethod
    def lora_targets_of(cls, module: nn.Module, configured: list[str] | None) -> list[str]:
        """``configured``, else :attr:`default_lora_targets` and each single-stream block's
        ``attn.to_out`` by name (diffusers' FLUX.2 LoRA scripts' choice)."""
        if configured:
            return list(configured)
        singles = range(len(module.single_transformer_blocks))
        return [*cls.default_lora_targets, *(f"single_transformer_blocks.{i}.attn.to_out" for i in singles)]


class Flux2Family(DiffusersFolderFamily):
    """FLUX.2 loaded ([dev] or [klein], by the folder's pipeline): the stacked text features, the
    forward, the BatchNorm-normalised VAE latents."""

    description = Flux2Description
    components = ("vae", "text_encoder", "tokenizer", "transformer")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.variant = VARIANTS[self.pipeline_config["_class_name"]]
        self.pipeline_class = self.variant.pipeline_class
        self.is_distilled = bool(self.pipeline_config.get("is_distilled", False))
        """A step-distilled [klein] (``Flux2KleinPipeline``'s ``is_distilled``): no CFG."""
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)  # as the pipelines
        layers = options.text_encoder_out_layers
        self.text_layers = tuple(layers) if layers is not None else self.variant.text_layers

    # ---- the folder and the config, before anything loads --------------------------------------

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        variant = folder_variant(folder)
        frozen = DTYPES[options.text_encoder_dtype]
        return {
            "transformer": load_part(folder, "transformer", Flux2Transformer2DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKLFlux2, frozen),
            "text_encoder": load_part(folder, "text_encoder", variant.text_encoder_class, frozen),
            "tokenizer": load_part(folder, "tokenizer", variant.tokenizer_class),
        }

    def pipeline_components(self) -> dict[str, Any]:
        """The pipeline's ``__init__`` arguments but the scheduler (and [klein]'s ``is_distilled``)."""
        parts = super().pipeline_components()
        return {**parts, "is_distilled": self.is_distilled} if self.variant is KLEIN else parts

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        side = 128 * self.vae_scale_factor  # the pipelines' default_sample_size: 1024 px
        return (side, side)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        step = self.vae_scale_factor * 2
        if height % step or width % step:
            raise ValueError(
                f"{self.description.name}: height and width must be multiples of {step}, got {height}x{width}"
            )
        return (self.transformer.config.in_channels, height // step, width // step)

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """The pipelines' ``(num_steps + 1,)`` schedule (:func:`flux2_sigmas`); a numeric ``shift``
        replaces it with a static shift (see :meth:`ModelFamily.sigmas`)."""
        if shift is not None:
            return super().sigmas(num_steps, shift, height, width)
        _, h, w = self.latent_shape(height, width)
        return flux2_sigmas(self.scheduler_config, num_steps, h * w)

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """``encoder_hidden_states (B, max_sequence_length, len(layers) * D)``, the pipeline's own."""
        return {"encoder_hidden_states": self.variant.prompt_embeds(self, prompts, self.text_layers)}

    # ---- guidance ------------------------------------------------------------------------------
    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None:
        """As :meth:`ModelFamily.negative` for a base [klein]; [dev] and a distilled [klein] have no
        CFG (the config check refuses ``sampling.guidance_scale`` > 1 for them before loading)."""
        if guidance_scale > self.description.no_guidance_scale and (self.variant is DEV or self.is_distilled):
            kind = "FLUX.2 [dev]" if self.variant is DEV else "a step-distilled FLUX.2 [klein]"
            raise ValueError(
                f"{self.description.name}: "
                f"guidance_scale={guidance_scale}, but {kind} has no classifier-free "
                "guidance in its diffusers pipeline; use 1"
            )
        return super().negative(prompt, guidance_scale, cond)

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One ``Flux2Transformer2DModel`` call (:func:`flux2_forward`): ``x_t (B, C, h, w)``,
        ``sigma (B,)`` -> velocity ``(B, C, h, w)``, with ``options.guidance`` embedded for [dev]."""
        guidance = float(self.options.guidance) if self.variant.embeds_guidance else None
        return flux2_forward(module, x_t, sigma, cond, guidance)

    # ---- pixels <-> latents --------------------------------------------------------------------
    def _bn_stats(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The VAE's ``bn`` mean and standard deviation ``(1, 4C, 1, 1)`` on ``like``'s device and dtype."""
        bn = self.vae.bn
        mean = bn.running_mean.view(1, -1, 1, 1).to(like.device, like.dtype)
        std = torch.sqrt(bn.running_var.view(1, -1, 1, 1) + self.vae.config.batch_norm_eps)
        return mean, std.to(like.device, like.dtype)

    def vae_latents(self, latents: torch.Tensor) -> torch.Tensor:
        """diffrl's ``(B, 4C, H/16, W/16)`` -> the VAE's ``z (B, C, H/8, W/8)``: ``bn`` inverse, then
        :func:`unpatchify` (what ``Flux2KleinPipeline`` returns for ``output_type="latent"``)."""
        z = latents.to(self.device, self.vae.dtype)
        mean, std = self._bn_stats(z)
        return unpatchify(z * std + mean)

    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B, 4C, H/16, W/16)`` float32, as
        ``Flux2Pipeline._encode_vae_image``: the VAE's mode, patchified, ``bn``-normalised."""
        x = (images * 2.0 - 1.0).to(self.device, self.vae.dtype)
        z = patchify(self.vae.encode(x).latent_dist.mode())
        mean, std = self._bn_stats(z)
        return ((z - mean) / std).float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, 4C, H/16, W/16)`` -> images ``(B, 3, H, W)`` in [0, 1] (the pipelines' decode)."""
        images = self.vae.decode(self.vae_latents(latents), return_dict=False)[0]
        return (images.float() * 0.5 + 0.5).clamp(0.0, 1.0)

    # ---- LoRA ----------------------------------------------------------------------------------
