"""``qwen_image_edit``: Qwen-Image-Edit (instruction editing) from a local diffusers folder.

The folder's ``model_index.json`` names the pipeline: ``QwenImageEditPlusPipeline``
(Qwen-Image-Edit-2509 and -2511) or ``QwenImageEditPipeline`` (the first Qwen-Image-Edit); both
are read, each as its own pipeline does. Parts, loaded as the pipeline would: the
``QwenImageTransformer2DModel`` (trained; 2511's transformer config sets ``zero_cond_t``, which the
transformer's forward applies by itself from ``img_shapes``), ``AutoencoderKLQwenImage``, the
Qwen2.5-VL-7B ``text_encoder`` (here a vision-language encoder: it sees the source image), its
``tokenizer`` and ``processor`` (Qwen2VLProcessor: an image processor and a tokenizer).

Every prompt comes with a source image (:class:`~diffrl.core.rollout.Source`, centre-cropped to the
output's aspect ratio); :meth:`QwenImageEditFamily._encode_edits` prepares it as the pipeline:

- the VL encoder's picture: the source resized with Lanczos (``VaeImageProcessor.resize``) to
  ``calculate_dimensions(model.options.condition_image_area, aspect)`` (the pipeline's
  ``CONDITION_IMAGE_SIZE``, a 384 x 384 area, sides rounded to 32 px; the first Qwen-Image-Edit
  shows it the VAE's image instead);
- the prompt goes into the chat template below after ``"Picture 1: "`` and the picture's vision
  tokens (the first Qwen-Image-Edit: the vision tokens alone), the last hidden state is kept and
  its first 64 tokens (the system turn) dropped; the rest, the picture's tokens among them, is the
  text the transformer attends to;
- the VAE's image: the source resized to ``calculate_dimensions(model.options.vae_image_area,
  aspect)`` (``VAE_IMAGE_SIZE``, a 1024 x 1024 area), encoded by the VAE's mode and normalised
  with ``latents_mean`` / ``latents_std``: ``image_latents (C, h, w)``, the reference.

The conditioning holds ``encoder_hidden_states (B, L, D)`` zero-padded to ``L =
model.options.max_sequence_length`` with ``encoder_hidden_states_mask (B, L)`` (the pipeline pads
nothing: it runs one prompt at a time, and cuts none, so a longer one is an error here), the
reference ``image_latents (B, C, h, w)`` and the VL picture ``condition_pixels (B, 3, h', w')``
uint8: the negative prompt is encoded with each row's picture, as the pipeline's is
(:meth:`QwenImageEditFamily.negative`).

The VL inputs are built as ``Qwen2VLProcessor.__call__`` builds them (the image processor's
patches, the vision token repeated ``t * h * w / merge_size**2`` times), from the processor
folder's image processor and tokenizer: transformers 5's ``Qwen2VLProcessor`` class needs a video
processor, which needs torchvision (the integration test compares with the processor class). The
encoder is given ``mm_token_type_ids`` too, as diffusers' fix for transformers 5 does (diffusers
issue 14194): without it Qwen2.5-VL silently gives the image tokens 1-D positions instead of the
3-D (M-RoPE) ones the model was trained with, as diffusers 0.42.1 does under transformers 5.

The forward, as the pipeline's denoising loop: the noise tokens (the sample's latent packed 2 x 2,
as ``qwen_image``) and then the reference's packed tokens (never noised) go in as one sequence,
``img_shapes`` one entry per image (the text's RoPE positions start after the larger of the two),
and the velocity is the prediction's noise tokens. The sigma schedule is ``qwen_image``'s, its
``mu`` from the noise tokens alone; the output's size is ``sampling.height`` / ``width`` (the
pipeline's ``height`` / ``width``). Guidance is ``qwen_image``'s true CFG, norm-rescaled per token,
whenever ``sampling.guidance_scale > 1`` (the pipeline's ``true_cfg_scale`` with a negative prompt).

A user's checkpoint: ``model: {family: qwen_image_edit, path: /models/Qwen-Image-Edit-2509}``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Self

import numpy as np
import torch
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
from diffusers.image_processor import VaeImageProcessor
from diffusers.pipelines.qwenimage.pipeline_qwenimage_edit_plus import calculate_dimensions
from PIL import Image
from torch import nn
from transformers import AutoImageProcessor, AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from diffrl.config import ConfigError, Range
from diffrl.config.schema import MAX_SIDE
from diffrl.core.rollout import Conditioning, Source
from diffrl.models.base import DTYPES, Planned, SourceError, TextTokens
from diffrl.models.diffusers_folder import load_part, read_json
from diffrl.models.flux import sample_size, sequence_ranks
from diffrl.models.qwen_image import (
    QwenImageDescription,
    QwenImageFamily,
    planned_qwen_transformer,
    qwen_conditioning,
    qwen_image_forward,
)

# QwenImageEditPlusPipeline's constants (the integration test checks they still match)
EDIT_TEMPLATE = (
    "<|im_start|>system\nDescribe the key features of the input image (color, shape, size, texture, "
    "objects, background), then explain how the user's text instruction should alter or modify the "
    "image. Generate a new image that meets the user's requirements while maintaining consistency "
    "with the original input where appropriate.<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n"
    "<|im_start|>assistant\n"
)
EDIT_DROP_TOKENS = 64
"""Template tokens before the user's turn (the system turn), dropped from the embedding."""
IMAGE_TOKEN = "<|image_pad|>"
VISION = f"<|vision_start|>{IMAGE_TOKEN}<|vision_end|>"
"""A picture in the user's turn: the processor repeats the image token once per merged patch."""
CONDITION_IMAGE_AREA = 384 * 384
"""The pipeline's ``CONDITION_IMAGE_SIZE``: the VL encoder's picture area, in pixels."""
VAE_IMAGE_AREA = 1024 * 1024
"""The pipeline's ``VAE_IMAGE_SIZE``: the reference image's area, in pixels."""
MIN_AREA = 32 * 32
"""``calculate_dimensions`` rounds sides to 32 px: a smaller area rounds a side to nothing."""
Area = Annotated[
    int, Range(MIN_AREA, MAX_SIDE**2, hint="pixels; at least 32 x 32, as the pipeline rounds sides to 32 px")
]


def qwen_edit_forward(
    module: nn.Module,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    cond: Conditioning,
    vae_scale_factor: int,
    longest: int | None = None,
) -> torch.Tensor:
    """One ``QwenImageTransformer2DModel`` call as the edit pipelines' denoising loop:
    ``x_t (B, C, H, W)``, ``sigma (B,)`` -> velocity ``(B, C, H, W)``; the packed noise tokens
    ``(B, H/2 * W/2, 4C)`` are followed by the reference's (``cond``'s ``image_latents``), and the
    prediction is cut to the noise tokens (:func:`~diffrl.models.qwen_image.qwen_image_forward`,
    ``longest`` passed on). ``vae_scale_factor`` only sizes the error for a sequence that does not
    split over the sequence-parallel ranks."""
    h, w = x_t.shape[-2:]
    reference = cond.tensors["image_latents"]
    rh, rw = reference.shape[-2:]
    noise_tokens, reference_tokens = (h // 2) * (w // 2), (rh // 2) * (rw // 2)
    ranks = sequence_ranks(module)
    if (noise_tokens + reference_tokens) % ranks:  # before diffusers' bare assert in its split
        v = vae_scale_factor
        raise SourceError(
            f"qwen_image_edit: {noise_tokens} output tokens and {reference_tokens} reference tokens "
            f"({rw * v}x{rh * v} px) do not split over parallel.sequence={ranks} ranks; "
            f"their sum must be a multiple of {ranks}: change sampling.height/width or "
            "model.options.vae_image_area"
        )
    # the text is the batch's longest edit (the rest is padding)
    return qwen_image_forward(module, x_t, sigma, cond, reference=reference, longest=longest)


class QwenImageEditDescription(QwenImageDescription):
    """What :class:`QwenImageEditFamily` declares (static): an editing Qwen-Image, its sources'
    sizes, the folder's variant (:meth:`variant`), the reference tokens in its sequence and plan."""

    name = "qwen_image_edit"
    pipeline_class = "QwenImageEditPlusPipeline"
    edits = True
    own_condition_size: ClassVar[bool] = True
    """True: the VL encoder's picture is resized to ``condition_image_area``; False: it is the VAE's
    image (the first Qwen-Image-Edit)."""
    sequence_parallel = True
    """Qwen-Image's plan (see :attr:`QwenImageDescription.sequence_parallel`): the image sequence it
    splits is the noise tokens followed by the reference's (``pos_embed`` gives both their rotary
    embedding, 2511's ``modulate_index`` marks them), so their sum must split; the text is padded
    as Qwen-Image's."""

    @dataclass
    class Options:
        max_sequence_length: TextTokens = 512
        """Text tokens after the template's system turn, the picture's vision tokens among them
        (~200 for a 384 x 384 area; the first Qwen-Image-Edit's 1024 x 1024 picture has ~1350, so
        it needs 1536 or so); an edit that encodes to more is an error (the pipeline cuts none).
        Each cached prompt holds this many embeddings; the forward takes only the batch's longest."""
        condition_image_area: Area = CONDITION_IMAGE_AREA
        """Pixels of the VL encoder's picture (``QwenImageEditPlusPipeline``'s 384 x 384)."""
        vae_image_area: Area = VAE_IMAGE_AREA
        """Pixels of the reference image the VAE encodes (the pipelines' 1024 x 1024)."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoder and VAE (``bfloat16`` for the 7B encoder)."""

    @classmethod
    def edit_sizes(cls, width: int, height: int, options: Any) -> tuple[int, int, int, int]:
        """``(vae_w, vae_h, picture_w, picture_h)``: what the pipeline resizes a ``width x height``
        source to for the VAE and for the VL encoder (``calculate_dimensions`` of the areas at the
        source's aspect ratio; the first release's picture is the VAE's image)."""
        ratio = width / height
        vae_w, vae_h = calculate_dimensions(options.vae_image_area, ratio)
        if not cls.own_condition_size:
            return vae_w, vae_h, vae_w, vae_h
        return (vae_w, vae_h, *calculate_dimensions(options.condition_image_area, ratio))

    @classmethod
    def source_size(cls, config, width: int, height: int) -> tuple[int, int, int, int] | None:
        path = Path(config.model.path)
        if config.model.path in ("base", "random") or not path.is_dir():
            return None
        try:
            options = cls.parse_options(config.model.options)
        except ConfigError:
            return None  # reported with the other option problems
        return cls.variant(path).edit_sizes(width, height, options)

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """Qwen-Image's, the image tokens counting the reference's: ``vae_image_area`` at the
        output's aspect ratio (the sources are cropped to it), packed 2 x 2 after the 8x VAE."""
        lengths = super().sequence_lengths(config, check_files)
        rule = cls.size_rule(config, check_files)
        if lengths is None or rule is None:
            return lengths
        height, width = sample_size(config, rule)
        sizes = cls.source_size(config, width, height)
        if sizes is None:
            return lengths
        vae_w, vae_h, _, _ = sizes
        lengths["image tokens"] += (vae_h // rule.multiple) * (vae_w // rule.multiple)
        return lengths

    @classmethod
    def variant(cls, folder: Path) -> type[QwenImageEditDescription]:
        """The description for ``folder``'s pipeline (``model_index.json``'s ``_class_name``):
        :class:`QwenImageEditV1Description` for a ``QwenImageEditPipeline`` folder, else this one."""
        found = (read_json(folder / "model_index.json") or {}).get("_class_name")
        return QwenImageEditV1Description if found == QwenImageEditV1Description.pipeline_class else cls

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        variant = cls.variant(folder)
        if variant is not cls:
            return variant.folder_problems(folder)
        problems = super().folder_problems(folder)
        if not problems and not (folder / "processor" / "preprocessor_config.json").is_file():
            problems.append(
                f"{str(folder)!r} has no processor/preprocessor_config.json: the pipeline's Qwen2VLProcessor "
                "(image processor and tokenizer files) is missing; copy the folder's processor/ too"
            )
        return problems

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """Qwen-Image's transformer (:func:`~diffrl.models.qwen_image.planned_qwen_transformer`) at
        ``sampling.height x width``, with each row's reference at ``vae_image_area`` and the
        output's aspect ratio (the sources are cropped to it; :meth:`edit_sizes` of the folder's
        pipeline). Conditioning as :meth:`_encode_edits` gives it for edits of the full
        ``max_sequence_length`` (the picture's vision tokens among them), which the forward keeps
        whole (its cut to the batch's longest edit reads the mask's values, which fake tensors do
        not hold: the length is given instead); the VL picture (``condition_pixels``) is left
        out, as the transformer never reads it."""
        options = cls.parse_options(config.model.options)
        built = planned_qwen_transformer(config, folder, options)
        if built is None:
            return None
        module, vae, height, width = built
        reference_w, reference_h, _, _ = cls.variant(folder).edit_sizes(width, height, options)
        channels = module.config.in_channels // 4
        latent = (channels, height // vae, width // vae)
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            cond = qwen_conditioning(m, x_t, tokens)
            cond["image_latents"] = x_t.new_zeros(len(x_t), channels, reference_h // vae, reference_w // vae)
            return qwen_edit_forward(m, x_t, sigma, Conditioning(cond), vae, longest=tokens)

        return Planned(
            module,
            latent,
            forward,
            f"QwenImageTransformer2DModel (+ a {reference_w}x{reference_h} reference)",
        )


class QwenImageEditFamily(QwenImageFamily):
    """``QwenImageEditPlusPipeline`` (Qwen-Image-Edit-2509 / 2511); a ``QwenImageEditPipeline``
    folder loads as :class:`QwenImageEditV1Family`."""

    description = QwenImageEditDescription

    components = ("vae", "text_encoder", "tokenizer", "transformer")
    """The pipeline's parts but ``processor``, which :meth:`pipeline_components` adds (None: see
    :meth:`load_parts`)."""
    picture_label: ClassVar[str] = "Picture 1: "
    """What comes before the picture's vision tokens in the user's turn."""

    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, options: Any) -> Self:
        if cls.description.variant(Path(path)) is not cls.description:  # a QwenImageEditPipeline folder
            return QwenImageEditV1Family.load(path, device, dtype, options)
        return super().load(path, device, dtype, options)

    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        """The pipeline's parts; of ``processor/`` its image processor and tokenizer, loaded as
        ``Qwen2VLProcessor.from_pretrained`` loads them (by their auto classes), not the processor
        itself (transformers 5 builds it with a video processor, which needs torchvision)."""
        frozen = DTYPES[options.text_encoder_dtype]
        return {
            "transformer": load_part(folder, "transformer", QwenImageTransformer2DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKLQwenImage, frozen),
            "text_encoder": load_part(folder, "text_encoder", Qwen2_5_VLForConditionalGeneration, frozen),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
            "image_processor": load_part(folder, "processor", AutoImageProcessor),
            "processor_tokenizer": load_part(folder, "processor", AutoTokenizer),
        }

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.vae_image_processor = VaeImageProcessor(vae_scale_factor=self.vae_scale_factor * 2)
        """The pipeline's ``image_processor`` (its resizing of the source)."""
        self.image_token_id = self.processor_tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
        self._sizes: tuple[int, int, int, int] | None = None
        """The first source's (VAE image, picture) sizes: every row of a run must share them."""

    def pipeline_components(self) -> dict[str, Any]:
        """The pipeline's parts with ``processor=None`` (no processor object is loaded; a test
        that runs the pipeline gives it one)."""
        return {**super().pipeline_components(), "processor": None}

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        super().save_pretrained(path, dtype)
        write_processor(Path(path), self.image_processor, self.processor_tokenizer)

    # ---- text and source images ----------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        raise ValueError(
            f"the {self.description.name} family edits images: every prompt needs a source image (a prompt "
            'file whose lines carry "image")'
        )

    def _encode_edits(self, prompts: list[str], sources: list[Source]) -> dict[str, torch.Tensor]:
        """``encoder_hidden_states (B, L, D)``, ``encoder_hidden_states_mask (B, L)`` (long),
        ``image_latents (B, C, h, w)`` and ``condition_pixels (B, 3, h', w')`` uint8: one row per
        (prompt, source), each encoded alone as the pipeline does (it takes one prompt a call)."""
        rows: dict[str, list[torch.Tensor]] = {
            k: [] for k in ("encoder_hidden_states", "encoder_hidden_states_mask")
        }
        latents, pixels = [], []
        for prompt, source in zip(prompts, sources):
            picture, vae_image = self._prepare(source)
            embeds, mask = self._embed(prompt, picture)
            rows["encoder_hidden_states"].append(embeds)
            rows["encoder_hidden_states_mask"].append(mask)
            latents.append(self._encode_reference(vae_image))
            pixels.append(torch.from_numpy(np.array(picture)).permute(2, 0, 1))
        return {
            **{k: torch.stack(v) for k, v in rows.items()},
            "image_latents": torch.cat(latents),
            "condition_pixels": torch.stack(pixels).to(self.device),
        }

    def _prepare(self, source: Source) -> tuple[Image.Image, torch.Tensor]:
        """The source as the pipeline prepares its image: the VL encoder's picture (RGB) and the
        VAE's image ``(1, 3, H, W)`` in [-1, 1]."""
        image = Image.fromarray(source.pixels.permute(1, 2, 0).contiguous().numpy())
        sizes = self.description.edit_sizes(image.width, image.height, self.options)
        vae_w, vae_h, cond_w, cond_h = sizes
        if not min(sizes):
            raise SourceError(
                f"{self.description.name}: "
                f"the source image {source.key!r} ({image.width} x {image.height}) is too "
                f"narrow for the image areas (a side rounds to 0 px at 32-px steps); use a less extreme "
                "aspect ratio (sampling.height : sampling.width) or larger model.options.*_image_area"
            )
        if self._sizes is None:
            self._sizes = sizes
        elif sizes != self._sizes:
            raise SourceError(
                f"{self.description.name}: source {source.key} ({image.width} x {image.height}) resizes to a "
                f"{vae_w}x{vae_h} reference and a {cond_w}x{cond_h} picture, earlier ones to "
                f"{self._sizes[0]}x{self._sizes[1]} and {self._sizes[2]}x{self._sizes[3]}; the rows of "
                "a run are batched, so their sources need one size: give images of one aspect ratio "
                "(the pipeline sizes both from it, in 32-px steps)"
            )
        picture = self.vae_image_processor.resize(image, cond_h, cond_w)
        return picture, self.vae_image_processor.preprocess(image, vae_h, vae_w)

    def _embed(self, prompt: str, picture: Image.Image) -> tuple[torch.Tensor, torch.Tensor]:
        """One prompt with its picture -> ``(L, D)`` embeddings zero-padded to ``L`` and the
        ``(L,)`` mask: the pipeline's ``_get_qwen_prompt_embeds`` (with ``mm_token_type_ids``)."""
        vision = self.image_processor(images=[picture], return_tensors="pt")
        merge = self.image_processor.merge_size**2
        n_image = int(vision["image_grid_thw"][0].prod()) // merge
        text = EDIT_TEMPLATE.format(self.picture_label + VISION + prompt).replace(
            IMAGE_TOKEN, IMAGE_TOKEN * n_image
        )
        ids = self.processor_tokenizer([text], return_tensors="pt").input_ids.to(self.device)
        hidden = self.text_encoder(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            pixel_values=vision["pixel_values"].to(self.device),
            image_grid_thw=vision["image_grid_thw"].to(self.device),
            mm_token_type_ids=(ids == self.image_token_id).long(),
            output_hidden_states=True,
        ).hidden_states[-1][0, EDIT_DROP_TOKENS:]
        n = self.options.max_sequence_length
        if len(hidden) > n:
            raise SourceError(
                f"{self.description.name}: "
                f"the edit {prompt!r} with its source image encodes to {len(hidden)} tokens "
                f"after the template's system turn ({n_image} of them the picture's), more than "
                f"model.options.max_sequence_length={n} (the pipeline cuts none); set it to at least "
                f"{len(hidden)}"
            )
        embeds = hidden.new_zeros(n, hidden.shape[-1])
        embeds[: len(hidden)] = hidden
        mask = torch.zeros(n, dtype=torch.long, device=hidden.device)
        mask[: len(hidden)] = 1
        return embeds, mask

    def _encode_reference(self, image: torch.Tensor) -> torch.Tensor:
        """``image (1, 3, H, W)`` in [-1, 1] -> ``(1, C, H/8, W/8)``: the VAE's mode, normalised as
        the pipeline's ``_encode_vae_image`` (``(z - mean) / std``)."""
        z = self.vae.encode(image[:, :, None].to(self.device, self.vae.dtype)).latent_dist.mode()
        shape = (1, self.vae.config.z_dim, 1, 1, 1)
        mean = torch.tensor(self.vae.config.latents_mean).view(shape).to(z.device, z.dtype)
        std = torch.tensor(self.vae.config.latents_std).view(shape).to(z.device, z.dtype)
        return ((z - mean) / std)[:, :, 0]

    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None:
        """The negative prompt encoded with each row's picture (``condition_pixels``), as the
        pipeline encodes it, and the row's reference latents; cached by prompt and picture.
        None when ``guidance_scale`` is at most 1 (no CFG)."""
        if guidance_scale <= self.description.no_guidance_scale:
            return None
        if cond is None:
            raise ValueError(
                f"the {self.description.name} family "
                "encodes the negative prompt with each row's source image "
                "(the VL encoder sees it): pass the rows' conditioning to negative()"
            )
        pixels = cond.tensors["condition_pixels"]
        keys = [(prompt, "picture:" + hashlib.sha256(p.cpu().numpy().tobytes()).hexdigest()) for p in pixels]
        with torch.no_grad():
            for key, p in zip(keys, pixels):
                if key not in self._prompt_cache:
                    picture = Image.fromarray(p.permute(1, 2, 0).cpu().numpy())
                    embeds, mask = self._embed(prompt, picture)
                    self._prompt_cache[key] = {
                        "encoder_hidden_states": embeds,
                        "encoder_hidden_states_mask": mask,
                    }
        out = {}
        for name in ("encoder_hidden_states", "encoder_hidden_states_mask"):
            like = cond.tensors[name]
            out[name] = torch.stack([self._prompt_cache[k][name] for k in keys]).to(like.device, like.dtype)
        return Conditioning(
            {**out, "image_latents": cond.tensors["image_latents"], "condition_pixels": pixels}
        )

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One ``QwenImageTransformer2DModel`` call (:func:`qwen_edit_forward`): ``x_t (B, C, H, W)``,
        ``sigma (B,)`` -> velocity ``(B, C, H, W)``, the reference's tokens after the noise's."""
        return qwen_edit_forward(module, x_t, sigma, cond, self.vae_scale_factor)


class QwenImageEditV1Description(QwenImageEditDescription):
    """What :class:`QwenImageEditV1Family` declares: the first Qwen-Image-Edit's pipeline, whose
    VL encoder sees the VAE's image."""

    pipeline_class = "QwenImageEditPipeline"
    own_condition_size = False


class QwenImageEditV1Family(QwenImageEditFamily):
    """``QwenImageEditPipeline`` (the first Qwen-Image-Edit): the VL encoder sees the VAE's image
    (a 1024 x 1024 area: ``model.options.vae_image_area``; ``condition_image_area`` is unused) and
    the user's turn is the vision tokens and the prompt, without ``"Picture 1: "``."""

    description = QwenImageEditV1Description

    picture_label = ""


def write_processor(path: Path, image_processor: Any, tokenizer: Any) -> None:
    """Write the pipeline's ``processor/`` folder from its parts (the image processor's
    ``preprocessor_config.json`` and the tokenizer's files, as ``Qwen2VLProcessor.save_pretrained``
    lays them out) and name it in ``model_index.json``, for a pipeline saved without a processor
    object (``save_pretrained`` skips a None part)."""
    image_processor.save_pretrained(path / "processor")
    tokenizer.save_pretrained(path / "processor")
    index = path / "model_index.json"
    meta = json.loads(index.read_text())
    meta["processor"] = ["transformers", "Qwen2VLProcessor"]
    index.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
