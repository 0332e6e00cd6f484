"""``flux_kontext``: FLUX.1 Kontext [dev], instruction editing, from a local diffusers folder
(``FluxKontextPipeline`` layout).

The parts are FLUX.1's (see :mod:`diffrl.models.flux`): ``FluxTransformer2DModel`` (trained),
``AutoencoderKL``, CLIP-L (pooled) and T5. Each prompt comes with a source image
(:class:`~diffrl.core.rollout.Source`, the prompt file's ``"image"``), and the conditioning holds it as
``FluxKontextPipeline`` prepares it:

- the source is resized to the Kontext resolution nearest its aspect ratio
  (``PREFERRED_KONTEXT_RESOLUTIONS``, about 1 megapixel, floored to multiples of 16) with the
  pipeline's ``VaeImageProcessor``; ``model.options.auto_resize: false`` keeps its own size, as the
  pipeline's ``_auto_resize=False`` (then every source of a run must have one size: rows are batched);
- it is encoded by the VAE (the mode, ``sample_mode="argmax"``) and normalised as the latents,
  ``(z - shift_factor) * scaling_factor``: ``image_latents (B, C, h', w')`` in the conditioning.

:meth:`FluxKontextFamily.forward` packs the noisy latent and the source latent into 2 x 2 tokens,
appends the source's after the noisy ones along the sequence (ids ``(1, row, column)``: the first
axis tells them apart from the noisy tokens' ``(0, row, column)``), runs the transformer and keeps
the velocity of the noisy tokens. The source is never noised. Sigmas are FLUX.1's, with ``mu`` from
the noisy tokens only (the pipeline's ``image_seq_len``).

Guidance, as ``FluxPipeline``: Kontext [dev] is guidance-distilled, so every forward embeds
``model.options.guidance`` (the pipeline's ``guidance_scale``, 3.5); ``sampling.guidance_scale`` is
true CFG with ``sampling.negative_prompt`` (``true_cfg_scale``, off by default). The negative
prompt is text only: its rows share the source latents of the rows they guide.

The output size is ``sampling.height x sampling.width`` as given; the pipeline instead rescales
the requested size to ``max_area`` (1024², keeping the aspect ratio): pass ``max_area=height *
width`` to it for the same size. Sources are centre-cropped to the output's aspect ratio when the
prompt file is read (:func:`~diffrl.data.prompts.load_source`), so the rows of a run share one
Kontext resolution.

A user's checkpoint: ``model: {family: flux_kontext, path: /models/FLUX.1-Kontext-dev}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.flux import pipeline_flux_kontext
from PIL import Image
from torch import nn

from diffrl.core.rollout import Conditioning, Source
from diffrl.models.base import Planned, SourceError
from diffrl.models.flux import (
    FluxDescription,
    FluxFamily,
    flux_conditioning,
    flux_forward_tokens,
    image_ids,
    pack,
    sample_size,
    sequence_ranks,
    unpack,
)


def kontext_size(width: int, height: int, multiple: int, auto_resize: bool) -> tuple[int, int]:
    """The ``(height, width)`` ``FluxKontextPipeline`` resizes a ``width x height`` image to:
    floored to ``multiple`` (``VaeImageProcessor.get_default_height_width``), then, with
    ``auto_resize``, the preferred Kontext resolution nearest that aspect, floored again."""
    width, height = width - width % multiple, height - height % multiple
    if not min(width, height):
        raise SourceError(
            f"flux_kontext: a {width}x{height} source (after the crop to the output's aspect ratio) is "
            f"smaller than {multiple} px on a side; give larger images"
        )
    if auto_resize:
        aspect = width / height
        # read at call time: the module's list is what the pipeline uses
        resolutions = pipeline_flux_kontext.PREFERRED_KONTEXT_RESOLUTIONS
        _, width, height = min((abs(aspect - w / h), w, h) for w, h in resolutions)
    return height // multiple * multiple, width // multiple * multiple


def kontext_forward(
    module: nn.Module,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    cond: Conditioning,
    guidance: float | None,
    vae_scale_factor: int,
) -> torch.Tensor:
    """One ``FluxTransformer2DModel`` call as ``FluxKontextPipeline``'s denoising loop:
    ``x_t (B, C, H, W)``, ``sigma (B,)`` -> velocity ``(B, C, H, W)``; the noisy tokens, then the
    source's ``(B, h'/2 * w'/2, 4C)`` (``cond``'s ``image_latents``, ids with first axis 1), the
    noisy tokens' output kept. ``vae_scale_factor`` only sizes the error for a sequence that does
    not split over the sequence-parallel ranks."""
    h, w = x_t.shape[-2:]
    source = cond.tensors["image_latents"].to(x_t.device)
    sh, sw = source.shape[-2:]
    ids = image_ids(h, w, x_t.device, torch.float32)
    source_ids = image_ids(sh, sw, x_t.device, torch.float32)
    source_ids[:, 0] = 1
    tokens = torch.cat([pack(x_t), pack(source.to(x_t.dtype))], dim=1)
    noise_tokens, source_tokens = (h // 2) * (w // 2), (sh // 2) * (sw // 2)
    ranks = sequence_ranks(module)
    if (noise_tokens + source_tokens) % ranks:  # before diffusers' bare assert in its split
        v = vae_scale_factor
        raise SourceError(
            f"flux_kontext: {noise_tokens} output tokens and {source_tokens} source tokens "
            f"({sw * v}x{sh * v} px) do not split over parallel.sequence={ranks} ranks; "
            f"their sum must be a multiple of {ranks}: change sampling.height/width, the "
            "sources' size, or set model.options.auto_resize: true"
        )
    out = flux_forward_tokens(module, tokens, torch.cat([ids, source_ids]), sigma, cond, guidance)
    return unpack(out[:, :noise_tokens], h, w)


class FluxKontextDescription(FluxDescription):
    """What :class:`FluxKontextFamily` declares (static): FLUX.1 Kontext's: an editing FLUX.1, its
    sources' size and the source tokens in its sequence and plan."""

    name = "flux_kontext"
    pipeline_class = "FluxKontextPipeline"
    edits = True
    sequence_parallel = True
    """FLUX.1's plan (``FluxTransformer2DModel._cp_plan``, see :attr:`FluxDescription.sequence_parallel`):
    the image sequence it splits is the noisy tokens followed by the source's (with their ids),
    so their sum must split; the text tokens and the heads as FLUX.1's."""

    @dataclass
    class Options(FluxDescription.Options):
        auto_resize: bool = True
        """Resize each source to the Kontext resolution nearest its aspect ratio (the pipeline's
        ``_auto_resize``); false: keep its size (floored to a multiple of 16)."""

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """FLUX.1's, the image tokens counting the source's too: with ``auto_resize``, those of
        the Kontext resolution nearest the output's aspect ratio (the sources are cropped to it);
        without, a source keeps its own size, which only the images tell: then the image tokens
        are left out here, and :meth:`forward` reports a sum that does not split."""
        lengths = super().sequence_lengths(config, check_files)
        if lengths is None:
            return None
        if not config.model.options.get("auto_resize", cls.Options.auto_resize):
            del lengths["image tokens"]
            return lengths
        rule = cls.size_rule(config, check_files)  # known: FLUX.1's lengths needed it
        height, width = sample_size(config, rule)
        m = rule.multiple
        if min(height, width) >= m:  # smaller: a size error (size_problems)
            sh, sw = kontext_size(width, height, m, True)
            lengths["image tokens"] += (sh // m) * (sw // m)
        return lengths

    @classmethod
    def source_size(cls, config, width: int, height: int) -> tuple[int, int] | None:
        blocks = cls.component_setting(config, True, "vae", "AutoencoderKL", "block_out_channels")
        if blocks is None:
            return None
        auto = config.model.options.get("auto_resize", cls.Options.auto_resize)
        return kontext_size(width, height, 2 ** (len(blocks) - 1) * 2, bool(auto))

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """FLUX.1's transformer (:meth:`FluxDescription.planned_transformer`) with each row's source:
        with ``auto_resize``, the Kontext resolution nearest the output's aspect ratio (the sources
        are cropped to it); without, a source keeps its own size, which only the images tell: then
        one of the output's size is planned. Conditioning as :meth:`_encode_edits` gives it:
        FLUX.1's text tensors and ``image_latents (B, C, h', w')``."""
        built = cls.planned_transformer(config, folder)
        if built is None:
            return None
        module, options, vae, height, width = built
        source_h, source_w = kontext_size(width, height, vae * 2, options.auto_resize)
        channels = module.config.in_channels // 4
        latent = (channels, height // vae, width // vae)
        guidance = float(options.guidance) if module.config.guidance_embeds else None
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            cond = flux_conditioning(m, x_t, tokens)
            cond["image_latents"] = x_t.new_zeros(len(x_t), channels, source_h // vae, source_w // vae)
            return kontext_forward(m, x_t, sigma, Conditioning(cond), guidance, vae)

        return Planned(module, latent, forward, f"FluxTransformer2DModel (+ a {source_w}x{source_h} source)")


class FluxKontextFamily(FluxFamily):
    """FLUX.1 Kontext loaded: each prompt's source image encoded beside it, its tokens after the noise's."""

    description = FluxKontextDescription

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.image_processor = VaeImageProcessor(
            vae_scale_factor=self.vae_scale_factor * 2
        )  # as the pipeline
        self._source_size: tuple[int, int] | None = None

    # ---- the source image ----------------------------------------------------------------------

    def source_pixels(self, source: Source) -> torch.Tensor:
        """``source`` resized and normalised as the pipeline preprocesses its ``image``:
        ``(1, 3, h, w)`` in [-1, 1]; every source of a run has the same ``(h, w)``."""
        image = Image.fromarray(source.pixels.permute(1, 2, 0).numpy())
        height, width = kontext_size(
            image.width, image.height, self.vae_scale_factor * 2, self.options.auto_resize
        )
        if self._source_size is None:
            self._source_size = (height, width)
        elif self._source_size != (height, width):
            h0, w0 = self._source_size
            raise SourceError(
                f"{self.description.name}: source {source.key} resizes to {width}x{height}, earlier ones to "
                f"{w0}x{h0}; the rows of a run are batched, so their sources need one size "
                "(give images of one size, or model.options.auto_resize: true)"
            )
        image = self.image_processor.resize(image, height, width)
        return self.image_processor.preprocess(image, height, width)

    # ---- text and source -----------------------------------------------------------------------
    def _encode_edits(self, prompts: list[str], sources: list[Source]) -> dict[str, torch.Tensor]:
        """FLUX.1's text tensors and ``image_latents (B, C, h', w')``: each source's normalised
        VAE latent (:meth:`source_pixels`, the VAE's mode)."""
        text = self._encode_prompts(prompts)
        pixels = torch.cat([self.source_pixels(s) for s in sources]).to(self.device, self.vae.dtype)
        latents = torch.cat([self.vae.encode(p[None]).latent_dist.mode() for p in pixels])
        config = self.vae.config
        text["image_latents"] = ((latents - config.shift_factor) * config.scaling_factor).float()
        return text

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """``x_t (B, C, H, W)``, ``sigma (B,)`` -> velocity ``(B, C, H, W)`` (:func:`kontext_forward`)."""
        return kontext_forward(module, x_t, sigma, cond, self.embedded_guidance, self.vae_scale_factor)
