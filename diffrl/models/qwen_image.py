"""``qwen_image``: Qwen-Image from a local diffusers folder (``QwenImagePipeline`` layout).

Parts, loaded as diffusers' pipeline would: ``QwenImageTransformer2DModel`` (trained, an MMDiT of
60 double-stream blocks in the 20B release), ``AutoencoderKLQwenImage`` (a video VAE: 5-D
``(B, C, 1, H, W)`` tensors, 8x spatial compression, ``z_dim = 16`` channels normalised per channel
with the config's ``latents_mean`` / ``latents_std``), the text encoder
``Qwen2_5_VLForConditionalGeneration`` (Qwen2.5-VL-7B, text only) and its ``Qwen2Tokenizer``.

Prompts are encoded as ``QwenImagePipeline._get_qwen_prompt_embeds``: the prompt goes into the chat
template below, the last hidden state is kept for the valid tokens, and the first 34 (the system
prompt) are dropped. The pipeline pads a batch to its longest prompt; diffrl pads every prompt with
zeros to ``max_sequence_length`` tokens and keeps ``encoder_hidden_states_mask`` (1 valid, 0 padding)
in the conditioning, so prompts encoded apart stack and concatenate. The transformer masks the
padded keys and gives text tokens their RoPE positions by index, so this matches the pipeline's
padding up to float error (the integration test measures it).

diffrl keeps a sample's latent unpacked, ``(C, H/8, W/8)``; :meth:`QwenImageFamily.forward` packs
2 x 2 patches into ``(B, H/16 * W/16, 4C)`` tokens as the pipeline does and unpacks the velocity.
The transformer takes ``timestep = sigma`` (the pipeline passes ``t / 1000``). Sigmas are the
pipeline's: ``linspace(1, 1/N, N)`` shifted by ``mu`` from the number of image tokens through the
scheduler's config (exponential time shift, ``shift_terminal``). Guidance is Qwen's "true CFG":
``neg + s * (pos - neg)`` rescaled per packed token to the norm of the conditional velocity; the
pipeline runs it whenever a negative prompt is given (even ``""``) and ``true_cfg_scale > 1``.

A user's checkpoint: ``model: {family: qwen_image, path: /models/Qwen-Image}``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKLQwenImage, QwenImageTransformer2DModel
from torch import nn
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from diffrl.config import Range
from diffrl.core.rollout import Conditioning
from diffrl.models.base import DTYPES, Planned, SizeRule, meta_model
from diffrl.models.diffusers_folder import DiffusersFolderDescription, latent_stats, load_part, read_json
from diffrl.models.flux import (
    PackedLatentFamily,
    folder_setting,
    pack,
    packed_lengths,
    sample_size,
    sequence_ranks,
    unpack,
)

# QwenImagePipeline.__init__'s constants (the integration test checks they still match)
PROMPT_TEMPLATE = (
    "<|im_start|>system\nDescribe the image by detailing the color, shape, size, texture, quantity, "
    "text, spatial relationships of the objects and background:<|im_end|>\n<|im_start|>user\n{}"
    "<|im_end|>\n<|im_start|>assistant\n"
)
PROMPT_DROP_TOKENS = 34
"""Template tokens before the prompt (the system turn), dropped from the embedding."""
TOKENIZER_MAX_LENGTH = 1024
"""The pipeline's ``tokenizer_max_length`` (and the most ``max_sequence_length`` may be)."""

# The attention projections of every double-stream block, image stream (to_*) and text stream (add_*)
QWEN_IMAGE_LORA_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
]


def text_tokens(
    module: nn.Module, cond: Conditioning, longest: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The text a forward of ``module`` takes from ``cond``: ``encoder_hidden_states (B, n, D)``
    and ``encoder_hidden_states_mask (B, n)``, cut after the batch's longest prompt (the rest is
    padding, masked anyway; the pipeline pads to the batch's longest prompt too, and a short prompt
    saves most of the text). Under sequence parallel the plan splits the text tokens, so ``n`` is
    rounded up to a multiple of the ranks (:func:`~diffrl.models.flux.sequence_ranks`) with more
    masked zeros: masked keys take no attention, and the text's RoPE positions go by index, so the
    prompt's tokens and the image see the same as without (up to float rounding).

    ``longest``: the batch's longest prompt in tokens when the caller knows it (``diffrl plan``,
    whose fake tensors hold no mask values to count); None reads it from the mask."""
    text, mask = cond.tensors["encoder_hidden_states"], cond.tensors["encoder_hidden_states_mask"]
    ranks = sequence_ranks(module)
    if longest is None:
        longest = max(1, int(mask.sum(dim=1).max()))
    n = -(-longest // ranks) * ranks
    if n > mask.shape[1]:  # beyond the cached padding (an odd max_sequence_length)
        extra = n - mask.shape[1]
        text, mask = F.pad(text, (0, 0, 0, extra)), F.pad(mask, (0, extra))
    return text[:, :n], mask[:, :n]


def qwen_image_forward(
    module: nn.Module,
    x_t: torch.Tensor,
    sigma: torch.Tensor,
    cond: Conditioning,
    reference: torch.Tensor | None = None,
    longest: int | None = None,
) -> torch.Tensor:
    """One ``QwenImageTransformer2DModel`` call: ``x_t (B, C, H, W)``, ``sigma (B,)`` -> velocity
    ``(B, C, H, W)``, through the packed ``(B, H/2 * W/2, 4C)`` tokens and the text of
    :func:`text_tokens` (``longest`` passed on). ``reference (B, C, h, w)``: an editing pipeline's
    reference latents, packed after the noise tokens as a second image of ``img_shapes`` (never
    noised); the prediction is cut to the noise tokens."""
    b, _, h, w = x_t.shape
    dtype = next(module.parameters()).dtype
    c = cond.to(x_t.device, dtype)
    text, mask = text_tokens(module, c, longest)
    tokens, shapes = [pack(x_t.to(dtype))], [(1, h // 2, w // 2)]
    if reference is not None:
        rh, rw = reference.shape[-2:]
        tokens.append(pack(reference.to(x_t.device, dtype)))
        shapes.append((1, rh // 2, rw // 2))
    out = module(
        hidden_states=torch.cat(tokens, dim=1),
        timestep=sigma.to(dtype),  # the pipeline's t / 1000
        encoder_hidden_states=text,
        encoder_hidden_states_mask=mask,
        img_shapes=[shapes] * b,
        return_dict=False,
    )[0]
    return unpack(out[:, : (h // 2) * (w // 2)], h, w)


def qwen_conditioning(module: nn.Module, like: torch.Tensor, tokens: int) -> dict[str, torch.Tensor]:
    """Text tensors shaped as :meth:`QwenImageFamily._encode_prompts` gives them for ``len(like)``
    prompts of the full ``tokens`` (``max_sequence_length``): zero embeddings, and a mask of ones
    (every token a prompt's, as a full-length prompt's are)."""
    b = len(like)
    return {
        "encoder_hidden_states": like.new_zeros(b, tokens, module.config.joint_attention_dim),
        "encoder_hidden_states_mask": torch.ones(b, tokens, dtype=torch.long, device=like.device),
    }


def planned_qwen_transformer(config, folder: Path, options) -> tuple[nn.Module, int, int, int] | None:
    """What the Qwen-Image families' :meth:`~diffrl.models.base.FamilyDescription.planned` builds on:
    the transformer from ``folder/transformer/config.json`` on the meta device, the VAE's
    compression ``v`` (``2 ** len(temperal_downsample)``, as the pipelines) and the sample's height
    and width; None without the transformer's config."""
    settings = read_json(folder / "transformer" / "config.json")
    if settings is None:
        return None
    module = meta_model(QwenImageTransformer2DModel, settings, DTYPES[config.model.dtype])
    if options.gradient_checkpointing:
        module.enable_gradient_checkpointing()
    vae = 2 ** len(folder_setting(folder, "vae", "AutoencoderKLQwenImage", "temperal_downsample"))
    height, width = sample_size(config, SizeRule(vae * 2, "the VAE's compression, then 2 x 2 packing"))
    return module, vae, height, width


class QwenImageDescription(DiffusersFolderDescription):
    """What :class:`QwenImageFamily` declares (static): Qwen-Image's folder check, size rule, sequence
    lengths and plan."""

    name = "qwen_image"
    pipeline_class = "QwenImagePipeline"
    transformer_class = "QwenImageTransformer2DModel"
    default_guidance = 4.0
    """``QwenImagePipeline``'s ``true_cfg_scale`` (applied with ``sampling.negative_prompt``)."""
    default_lora_targets = QWEN_IMAGE_LORA_TARGETS
    sequence_parallel = True
    """diffusers' ``QwenImageTransformer2DModel._cp_plan``
    (``models/transformers/transformer_qwenimage.py``) splits over the sequence the packed image
    tokens (``hidden_states``) and the text tokens (``encoder_hidden_states``) at the first block's
    input, the text mask (and 2511's ``modulate_index``) at every block's, and the rotary
    embeddings ``pos_embed`` returns for both; it gathers ``proj_out``'s output. The timestep
    embedding stays whole. Each Ulysses attention gathers the ranks' text masks with their keys
    (``TemplatedUlyssesAttention`` in ``models/attention_dispatch.py``). The image tokens are fixed
    by the config; the text tokens are the batch's longest prompt, which :func:`text_tokens` pads
    with masked zeros to a multiple of the ranks."""

    @dataclass
    class Options:
        max_sequence_length: Annotated[
            int, Range(1, TOKENIZER_MAX_LENGTH, hint="text tokens; QwenImagePipeline's limit")
        ] = 512
        """Text tokens after the template's system turn (the pipeline's default; at most 1024).
        Longer prompts are cut, as the pipeline does; fewer save transformer compute."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen text encoder and VAE (``bfloat16`` for the 7B encoder)."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        problems = super().folder_problems(folder)
        config = folder / "transformer" / "config.json"
        if not problems and (read_json(config) or {}).get("guidance_embeds"):
            # diffusers 0.42's QwenImageTransformer2DModel builds no guidance embedder and its forward
            # fails when given `guidance`; no released Qwen-Image checkpoint sets this flag.
            problems.append(
                f"{str(config)!r} sets guidance_embeds=true, which diffusers' QwenImageTransformer2DModel "
                "cannot run; use a Qwen-Image transformer without guidance embeddings (guidance here "
                "is true CFG: sampling.guidance_scale)"
            )
        return problems

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """The packed image tokens (``H / 16 x W / 16`` for the 8x VAE) and the attention heads
        (the text, padded at each forward, always splits)."""
        return packed_lengths(cls, config, check_files, text=False)

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        down = cls.component_setting(
            config, check_files, "vae", "AutoencoderKLQwenImage", "temperal_downsample"
        )
        if down is None:
            return None
        vae = 2 ** len(down)  # as the pipeline's vae_scale_factor
        return SizeRule(vae * 2, f"the VAE's {vae}x compression times the 2 x 2 packing")

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer (:func:`planned_qwen_transformer`) at ``sampling.height x width`` (the
        latent ``(in_channels / 4, H / v, W / v)``); conditioning as :meth:`_encode_prompts` gives
        it for prompts of the full ``max_sequence_length``, which the forward keeps whole (its cut
        to the batch's longest prompt reads the mask's values, which fake tensors do not hold: the
        length is given instead)."""
        options = cls.parse_options(config.model.options)
        built = planned_qwen_transformer(config, folder, options)
        if built is None:
            return None
        module, vae, height, width = built
        latent = (module.config.in_channels // 4, height // vae, width // vae)
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            cond = Conditioning(qwen_conditioning(m, x_t, tokens))
            return qwen_image_forward(m, x_t, sigma, cond, longest=tokens)

        return Planned(module, latent, forward, "QwenImageTransformer2DModel")


class QwenImageFamily(PackedLatentFamily):
    """Qwen-Image loaded: the Qwen2.5-VL prompt embeddings, true CFG with the pipeline's norm rescale,
    the VAE."""

    description = QwenImageDescription
    components = ("vae", "text_encoder", "tokenizer", "transformer")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.vae_scale_factor = 2 ** len(self.vae.temperal_downsample)  # as the pipeline (8 for the release)

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        frozen = DTYPES[options.text_encoder_dtype]
        return {
            "transformer": load_part(folder, "transformer", QwenImageTransformer2DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKLQwenImage, frozen),
            "text_encoder": load_part(folder, "text_encoder", Qwen2_5_VLForConditionalGeneration, frozen),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
        }

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """``encoder_hidden_states (B, L, D)`` zero-padded to ``L = max_sequence_length`` and
        ``encoder_hidden_states_mask (B, L)`` (long, 1 on the prompt's tokens)."""
        tokens = self.tokenizer(
            [PROMPT_TEMPLATE.format(p) for p in prompts],
            max_length=TOKENIZER_MAX_LENGTH + PROMPT_DROP_TOKENS,
            padding=True,
            truncation=True,
            return_tensors="pt",
        ).to(self.device)
        hidden = self.text_encoder(
            input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, output_hidden_states=True
        ).hidden_states[-1]
        n = self.options.max_sequence_length
        embeds = hidden.new_zeros(len(prompts), n, hidden.shape[-1])
        mask = torch.zeros(len(prompts), n, dtype=torch.long, device=hidden.device)
        for i, (h, m) in enumerate(zip(hidden, tokens.attention_mask.bool())):
            valid = h[m][PROMPT_DROP_TOKENS:][:n]  # the pipeline's _extract_masked_hidden, drop, cut
            embeds[i, : len(valid)] = valid
            mask[i, : len(valid)] = 1
        return {"encoder_hidden_states": embeds, "encoder_hidden_states_mask": mask}

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One ``QwenImageTransformer2DModel`` call (:func:`qwen_image_forward`): ``x_t (B, C, H, W)``,
        ``sigma (B,)`` -> velocity ``(B, C, H, W)``, through the packed ``(B, H/2 * W/2, 4C)`` tokens."""
        return qwen_image_forward(module, x_t, sigma, cond)

    def guide(self, v_neg: torch.Tensor, v_pos: torch.Tensor, scale: float) -> torch.Tensor:
        """``QwenImagePipeline``'s true CFG on ``(B, C, H, W)`` velocities: the usual combination,
        rescaled so each packed token (2 x 2 patch x C channels) keeps the conditional norm."""
        h, w = v_pos.shape[-2:]
        neg, pos = pack(v_neg), pack(v_pos)
        comb = neg + scale * (pos - neg)
        cond_norm = torch.norm(pos, dim=-1, keepdim=True)
        noise_norm = torch.norm(comb, dim=-1, keepdim=True)
        return unpack(comb * (cond_norm / noise_norm), h, w)

    # ---- pixels <-> latents --------------------------------------------------------------------
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> ``(B, C, H/8, W/8)``: the VAE's mode, normalised
        as the Qwen-Image img2img / edit pipelines do."""
        x = (images * 2.0 - 1.0).to(self.device, self.vae.dtype)[:, :, None]  # one frame
        z = self.vae.encode(x).latent_dist.mode()
        mean, inv_std = latent_stats(self.vae.config, z)
        return ((z - mean) * inv_std)[:, :, 0].float()

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, C, H/8, W/8)`` -> images ``(B, 3, H, W)`` in [0, 1] (the pipeline's decode)."""
        z = latents.to(self.device, self.vae.dtype)[:, :, None]
        mean, inv_std = latent_stats(self.vae.config, z)
        images = self.vae.decode(z / inv_std + mean, return_dict=False)[0][:, :, 0]
        return (images.float() * 0.5 + 0.5).clamp(0.0, 1.0)
