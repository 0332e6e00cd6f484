"""``z_image``: Z-Image and Z-Image-Turbo from a local diffusers folder (``ZImagePipeline`` layout).

Parts, loaded as diffusers' pipeline would: ``ZImageTransformer2DModel`` (trained; a single-stream
DiT of 30 blocks, 6B parameters in the release, with a 2-block noise refiner for the image tokens and
a 2-block context refiner for the caption tokens), ``AutoencoderKL`` (16 latent channels, 8x,
``(z - shift_factor) * scaling_factor``), the text encoder ``Qwen3Model`` (Qwen3-4B) and its
``Qwen2Tokenizer``. Z-Image-Turbo is the same architecture distilled to 8 steps without CFG; the two
differ only in their weights, their scheduler config and the settings a recipe gives them.

Prompts are encoded as ``ZImagePipeline._encode_prompt``: the prompt goes into the tokenizer's chat
template as a user turn (``add_generation_prompt=True, enable_thinking=True``), is padded and cut to
``max_sequence_length`` tokens, and the second-to-last hidden state of the valid tokens is kept. The
pipeline hands the transformer a *list* of variable-length embeddings; diffrl keeps each prompt's
valid tokens first in a zero-padded ``(max_sequence_length, D)`` row with ``prompt_mask`` (1 valid,
0 padding), so prompts encoded apart stack, and :meth:`ZImageFamily.forward` slices every row back
to its own length before the call. The transformer pads each caption and each image to a multiple of
32 tokens with learned pad tokens (attended to, per sample) and masks only the padding between
samples of a batch, so a batch mixing caption lengths gives each row what a batch of rows of its own
length gives (bit for bit when measured on the CPU): rows need no grouping by caption length.

diffrl keeps a sample's latent as the VAE makes it, ``(C, H/8, W/8)``; the transformer takes one
``(C, 1, H/8, W/8)`` tensor per sample (it patchifies 2 x 2, channels last, itself), so ``H`` and
``W`` must be multiples of 16. It takes ``t = (1000 - 1000 sigma) / 1000`` (1 - sigma, as the
pipeline computes it from the scheduler's timesteps; ``t_scale`` 1000 inside) and predicts
``x0 - noise``, so diffrl's velocity is its output negated, as the pipeline negates it. Sigmas are
the pipeline's: ``torch.linspace(1, 1/N, N)`` through the folder's ``FlowMatchEulerDiscreteScheduler``
with ``mu`` from the number of image tokens (used only when the scheduler has
``use_dynamic_shifting``; Z-Image-Turbo's config is a static ``shift`` of 3).

Guidance, as ``ZImagePipeline``: ``pos + s * (pos - neg)`` with ``sampling.negative_prompt`` (the
pipeline's default negative is ""), on whenever ``s > 0`` (:attr:`ZImageDescription.no_guidance_scale` is
0: Z-Image-Turbo samples with ``sampling.guidance_scale: 0``), the conditional and negative rows in
one forward in the pipeline's order. ``model.options.cfg_normalization`` caps the guided velocity's
norm (per sample) at that multiple of the conditional one's; ``model.options.cfg_truncation`` turns
CFG off at the steps whose ``t = 1 - sigma`` exceeds it (1, the default: never).

A user's checkpoint: ``model: {family: z_image, path: /models/Z-Image-Turbo}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
from diffusers import AutoencoderKL, ZImageTransformer2DModel
from diffusers.pipelines.z_image.pipeline_z_image import get_default_z_image_sigmas
from torch import nn
from transformers import AutoTokenizer, Qwen3Model

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
from diffrl.models.flux import folder_setting, resolution_shifted_sigmas, sample_size
from diffrl.models.sd3 import vae_decode, vae_encode

SEQ_MULTI_OF = 32
"""The transformer pads every caption and image to a multiple of this many tokens
(``transformer_z_image.SEQ_MULTI_OF``)."""

# Attention and SwiGLU projections of every block: the 30 main ones (`layers.N`) and the refiners
# (`noise_refiner.N`, `context_refiner.N`), whose modules carry the same names
Z_IMAGE_LORA_TARGETS = [
    "attention.to_q",
    "attention.to_k",
    "attention.to_v",
    "attention.to_out.0",
    "feed_forward.w1",
    "feed_forward.w2",
    "feed_forward.w3",
]


def z_image_time(sigma: torch.Tensor, num_train_timesteps: int) -> torch.Tensor:
    """``sigma (B,)`` -> the transformer's ``t (B,)`` float32 as ``ZImagePipeline`` computes it from
    the scheduler's timesteps: ``(1000 - sigma * num_train_timesteps) / 1000``, 1 - sigma up to
    rounding (the transformer multiplies by its ``t_scale``, 1000)."""
    timesteps = sigma.float() * num_train_timesteps
    return (1000 - timesteps) / 1000


def z_image_forward(
    module: nn.Module,
    x_t: torch.Tensor,
    t: torch.Tensor,
    cond: Conditioning,
    lengths: list[int] | None = None,
) -> torch.Tensor:
    """One ``ZImageTransformer2DModel`` call: ``x_t (B, C, H, W)`` at the model time ``t (B,)``
    (:func:`z_image_time`) -> velocity ``(B, C, H, W)``. Each row of ``cond``'s ``prompt_embeds``
    is sliced back to its caption's length (the pipeline's list of variable-length embeddings):
    ``lengths`` when the caller knows them (``diffrl plan``, whose fake tensors hold no mask
    values to count), else the sums of ``prompt_mask``. The latents go in the transformer's dtype,
    the caption embeddings in the text encoder's (as the pipeline gives them), ``t`` in float32."""
    dtype = next(module.parameters()).dtype
    embeds = cond.tensors["prompt_embeds"].to(x_t.device)
    if lengths is None:
        lengths = cond.tensors["prompt_mask"].sum(dim=1).tolist()
    captions = [e[:n] for e, n in zip(embeds, lengths)]
    out = module(list(x_t.to(dtype).unsqueeze(2).unbind(0)), t, captions, return_dict=False)[0]
    return -torch.stack(out).squeeze(2)  # x0 - noise -> noise - x0


class ZImageDescription(DiffusersFolderDescription):
    """What :class:`ZImageFamily` declares (static): Z-Image's options, guidance off at 0, size rule,
    FSDP2 units and plan."""

    name = "z_image"
    pipeline_class = "ZImagePipeline"
    transformer_class = "ZImageTransformer2DModel"
    default_guidance = 5.0
    """``ZImagePipeline``'s ``guidance_scale`` (Z-Image); Z-Image-Turbo samples with 0 (no CFG)."""
    no_guidance_scale = 0.0
    default_lora_targets = Z_IMAGE_LORA_TARGETS

    @dataclass
    class Options:
        max_sequence_length: TextTokens = 512
        """Tokens of the templated prompt (the pipeline's default); longer prompts are cut, as the
        pipeline cuts them."""
        cfg_normalization: Annotated[float, Range(0, 10, hint="0: off (the pipeline's False); True is 1")] = (
            0.0
        )
        """The pipeline's ``cfg_normalization``: 0 (its ``False``) off; ``r > 0`` scales a guided
        velocity down to ``r`` times the conditional velocity's norm where it is longer
        (``True`` is 1)."""
        cfg_truncation: Annotated[float, Range(0, 1, hint="1: CFG at every step")] = 1.0
        """The pipeline's ``cfg_truncation``: no CFG at the steps whose ``t = 1 - sigma`` is above
        it (1: CFG at every step)."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoder and VAE (``bfloat16`` for the 4B encoder)."""

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        length = cls.bound_options(config).max_sequence_length
        axes = cls.component_setting(config, check_files, "transformer", cls.transformer_class, "axes_lens")
        if axes:
            # a caption of `length` tokens takes RoPE frame positions 1..ceil32(length) and the image
            # the next one; the transformer's table has axes_lens[0] of them
            longest = (axes[0] - 2) // SEQ_MULTI_OF * SEQ_MULTI_OF
            if length > longest:
                errors.append(
                    f"model.options.max_sequence_length={length} is longer than the transformer's "
                    f"positions take (axes_lens[0]={axes[0]}): at most {longest}"
                )
        return errors

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        blocks = cls.component_setting(config, check_files, "vae", "AutoencoderKL", "block_out_channels")
        axes = cls.component_setting(config, check_files, "transformer", cls.transformer_class, "axes_lens")
        if blocks is None or axes is None:
            return None
        vae = 2 ** (len(blocks) - 1)
        return SizeRule(
            vae * 2,
            f"the VAE's {vae}x downsampling, then 2 x 2 patches",
            max_side=min(axes[1], axes[2]) * vae * 2,
            max_why=f"the transformer's RoPE table has {min(axes[1], axes[2])} patch positions a side",
        )

    @classmethod
    def fsdp_blocks(cls, module: nn.Module) -> list[nn.Module]:
        return [*module.noise_refiner, *module.context_refiner, *module.layers]

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer from ``folder/transformer/config.json`` at ``sampling.height x width``
        (the latent ``(in_channels, H / v, W / v)`` for the VAE's ``v``x compression); conditioning
        as :meth:`_encode_prompts` gives it for prompts of the full ``max_sequence_length``, each
        row's caption that long (the forward's slicing to each caption reads the mask's values,
        which fake tensors do not hold: the lengths are given instead)."""
        built = meta_transformer(cls, ZImageTransformer2DModel, config, folder)
        if built is None:
            return None
        module, options = built
        vae = 2 ** (len(folder_setting(folder, "vae", "AutoencoderKL", "block_out_channels")) - 1)
        scheduler = read_json(folder / "scheduler" / "scheduler_config.json") or {}
        steps = int(scheduler.get("num_train_timesteps", 1000))
        height, width = sample_size(config, SizeRule(vae * 2, "the VAE's compression, then 2 x 2 patches"))
        latent = (module.config.in_channels, height // vae, width // vae)
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            b = len(x_t)
            cond = {
                "prompt_embeds": x_t.new_zeros(b, tokens, m.config.cap_feat_dim),
                "prompt_mask": torch.ones(b, tokens, dtype=torch.long, device=x_t.device),
            }
            return z_image_forward(m, x_t, z_image_time(sigma, steps), Conditioning(cond), [tokens] * b)

        return Planned(module, latent, forward, "ZImageTransformer2DModel")


class ZImageFamily(DiffusersFolderFamily):
    """Z-Image loaded: Qwen3 prompt embeddings, the pipeline's ``pos + s (pos - neg)`` guidance with
    CFG truncation, the VAE."""

    description = ZImageDescription
    components = ("vae", "text_encoder", "tokenizer", "transformer")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.vae_scale_factor = 2 ** (len(self.vae.config.block_out_channels) - 1)  # as the pipeline

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        frozen = DTYPES[options.text_encoder_dtype]
        return {
            "vae": load_part(folder, "vae", AutoencoderKL, frozen),
            "text_encoder": load_part(folder, "text_encoder", Qwen3Model, frozen),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
            "transformer": load_part(folder, "transformer", ZImageTransformer2DModel, dtype),
        }

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        return (1024, 1024)  # the pipeline's default height and width

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        step = self.vae_scale_factor * 2  # the VAE's compression, then 2 x 2 patches
        if height % step or width % step:
            raise ValueError(
                f"{self.description.name}: height and width must be multiples of {step}, got {height}x{width}"
            )
        channels = self.transformer.config.in_channels
        return (channels, height // self.vae_scale_factor, width // self.vae_scale_factor)

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """``prompt_embeds (B, L, D)``: each prompt's valid tokens first, zeros after them, for
        ``L = max_sequence_length``, and ``prompt_mask (B, L)`` (long, 1 on the valid tokens)."""
        texts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": p}],
                tokenize=False,
                add_generation_prompt=True,
                enable_thinking=True,
            )
            for p in prompts
        ]
        n = self.options.max_sequence_length
        tokens = self.tokenizer(
            texts, padding="max_length", max_length=n, truncation=True, return_tensors="pt"
        ).to(self.device)
        valid = tokens.attention_mask.bool()
        hidden = self.text_encoder(
            input_ids=tokens.input_ids, attention_mask=valid, output_hidden_states=True
        ).hidden_states[-2]
        embeds = torch.zeros_like(hidden)
        mask = torch.zeros(len(prompts), n, dtype=torch.long, device=hidden.device)
        for i, (h, m) in enumerate(zip(hidden, valid)):
            kept = h[m]  # the pipeline's embeddings_list entry (wherever the tokenizer pads)
            embeds[i, : len(kept)] = kept
            mask[i, : len(kept)] = 1
        return {"prompt_embeds": embeds, "prompt_mask": mask}

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """The pipeline's ``(num_steps + 1,)`` schedule (:func:`~diffrl.models.flux.resolution_shifted_sigmas` from the pipeline's torch linspace); a numeric
        ``shift`` replaces it with a static shift (see :meth:`ModelFamily.sigmas`)."""
        if shift is not None:
            return super().sigmas(num_steps, shift, height, width)
        _, h, w = self.latent_shape(height, width)
        # the pipeline's get_default_z_image_sigmas: torch's float32 linspace, which differs from
        # numpy's float64 one in the last bit
        initial = get_default_z_image_sigmas(num_steps)
        return resolution_shifted_sigmas(self.scheduler_config, num_steps, (h // 2) * (w // 2), initial)

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One ``ZImageTransformer2DModel`` call (:func:`z_image_forward`): ``x_t (B, C, H, W)``,
        ``sigma (B,)`` -> velocity ``(B, C, H, W)``."""
        return z_image_forward(module, x_t, self.model_time(sigma), cond)

    def velocity(
        self,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
        negative: Conditioning | None = None,
        module: nn.Module | None = None,
    ) -> torch.Tensor:
        """:meth:`ModelFamily.velocity` as ``ZImagePipeline`` guides: CFG when ``guidance_scale > 0``
        and a ``negative`` is given, on the rows that ``options.cfg_truncation`` leaves it (all of
        them while sampling: rows share the step), the rest conditional only. ``(B, *latent)``
        float32."""
        module = module or self.transformer
        if guidance_scale <= self.description.no_guidance_scale or negative is None:
            return self._forward(module, x_t, sigma, cond)
        guided = self.guided_rows(sigma)
        if all(guided):
            return self._guided(module, x_t, sigma, cond, negative, guidance_scale)
        if not any(guided):
            return self._forward(module, x_t, sigma, cond)
        # rows at different steps (a training batch): each group as the pipeline runs its step (a
        # group's batch is smaller than the rollout's was, so on the CPU its replay may differ from
        # the rollout in the last bits; with the default cfg_truncation no batch mixes)
        on = torch.tensor([i for i, g in enumerate(guided) if g], device=x_t.device)
        off = torch.tensor([i for i, g in enumerate(guided) if not g], device=x_t.device)
        v = torch.empty(x_t.shape, dtype=torch.float32, device=x_t.device)
        v[on] = self._guided(module, x_t[on], sigma[on], cond.select(on), negative.select(on), guidance_scale)
        v[off] = self._forward(module, x_t[off], sigma[off], cond.select(off))
        return v

    def guided_rows(self, sigma: torch.Tensor) -> list[bool]:
        """For each row of ``sigma (B,)``: whether CFG runs at it, i.e. unless its
        :meth:`model_time` is above ``options.cfg_truncation`` (the pipeline's
        ``_precomputed_t_norms`` test, in the same float32 arithmetic and Python comparison)."""
        truncation = float(self.options.cfg_truncation)
        if truncation >= 1:  # t <= 1 always: no host sync for the default
            return [True] * len(sigma)
        return [t <= truncation for t in self.model_time(sigma).tolist()]

    def model_time(self, sigma: torch.Tensor) -> torch.Tensor:
        """``sigma (B,)`` -> the transformer's ``t (B,)`` float32 (:func:`z_image_time` with the
        scheduler's ``num_train_timesteps``)."""
        return z_image_time(sigma, self.scheduler_config.get("num_train_timesteps", 1000))

    def _guided(
        self,
        module: nn.Module,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        negative: Conditioning,
        scale: float,
    ) -> torch.Tensor:
        """One forward of ``[cond, negative]`` (the pipeline's ``prompt_embeds +
        negative_prompt_embeds``), combined by :meth:`guide`."""
        both = self._joint(cond, negative)  # cond first, as the pipeline batches them
        v = self._forward(module, torch.cat([x_t, x_t]), torch.cat([sigma, sigma]), both)
        v_pos, v_neg = v.chunk(2)
        return self.guide(v_neg, v_pos, scale)

    def guide(self, v_neg: torch.Tensor, v_pos: torch.Tensor, scale: float) -> torch.Tensor:
        """``ZImagePipeline``'s CFG on ``(B, C, H, W)`` velocities: ``pos + s * (pos - neg)``, each
        sample scaled down to ``options.cfg_normalization`` times the conditional norm where it is
        longer. The pipeline combines the negated velocities (its model outputs) the same way;
        negation commutes with every step, so the result is the same to the bit."""
        guided = v_pos + scale * (v_pos - v_neg)
        ratio = float(self.options.cfg_normalization)
        if ratio <= 0:
            return guided
        rows = []
        for pos, pred in zip(v_pos, guided):  # per sample, as the pipeline
            max_norm = torch.linalg.vector_norm(pos) * ratio
            norm = torch.linalg.vector_norm(pred)
            rows.append(pred * (max_norm / norm) if norm > max_norm else pred)
        return torch.stack(rows)

    # ---- pixels <-> latents --------------------------------------------------------------------
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B, C, H/8, W/8)``: the VAE's mode,
        ``(z - shift_factor) * scaling_factor``."""
        return vae_encode(self.vae, images.to(self.device))

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, C, H/8, W/8)`` -> images ``(B, 3, H, W)`` in [0, 1] (the pipeline's decode)."""
        return vae_decode(self.vae, latents)
