"""``cosmos3``: NVIDIA Cosmos 3 text-to-image and text-to-video from a local diffusers folder
(``Cosmos3OmniPipeline`` layout, diffusers 0.42: ``pipelines/cosmos/pipeline_cosmos3_omni.py``).

Parts, loaded as the pipeline would, without its optional ``safety_checker`` (the Cosmos guardrail:
its weights are gated and cannot be loaded offline; diffrl never builds it, and :meth:`pipeline`
passes ``enable_safety_checker=False``) and without the ``sound_tokenizer`` (diffrl generates the
video stream only; a merged export therefore holds no ``sound_tokenizer/``):

- ``Cosmos3OmniTransformer`` (trained): a Mixture-of-Transformers over one packed sequence, the
  prompt's token ids (a causal "understanding" pathway) followed by the noisy vision tokens (a
  full-attention "generation" pathway, ``add_*`` projections and ``mlp_moe_gen``). There is no
  separate text encoder: the transformer embeds the token ids itself. Its attention runs over the
  whole packed sequence with no mask (``transformer_cosmos3.py:94-116``), so one call holds one
  sample, as the pipeline calls it (``pipeline_cosmos3_omni.py:1512``); :meth:`Cosmos3Family.forward`
  runs the rows of a batch one by one, each exactly as the pipeline packs it.
- ``AutoencoderKLWan`` (Wan 2.2's, 16x spatial, 4x temporal, 48 channels in the release): latents
  are ``(z - latents_mean) / latents_std`` (``_encode_video``, ``:507``; the decode, ``:1913``). A
  video of ``num_frames = 4k + 1`` frames is ``(C, (num_frames - 1) // 4 + 1, H / 16, W / 16)``;
  ``num_frames = 1`` is text-to-image (one latent frame; :meth:`decode` returns ``(B, 3, H, W)``).
- The ``text_tokenizer`` (Qwen3-VL's) and its chat template.

Prompts, as ``Cosmos3OmniPipeline.tokenize_prompt`` (``:1132``; diffrl calls it): the prompt gets
"This image is of HxW resolution." (videos: "This video is of ...", after "The video is D seconds
long and is of F FPS."), goes into the chat template with the image or video system prompt
(``default_use_system_prompt`` in ``model_index.json``), and ``<eos> <|vision_start|>`` end it. The
negative prompt gets the inverse sentences ("This image is not of HxW resolution."), which is why
:meth:`negative` is its own encoding. Because the prompt names the size, the frame count and the
frame rate, these are ``model.options`` (``height``, ``width``, ``num_frames``, ``fps``) and
``sampling.height`` / ``sampling.width`` must equal them (or be left unset). The conditioning holds
the token ids, padded to ``max_prompt_tokens`` so prompts stack (``input_ids (B, L)``, long, and
``prompt_length (B,)``); the forward keeps each row's own tokens only, so the transformer sees the
pipeline's exact ids. mRoPE positions are the pipeline's own functions
(``get_3d_mrope_ids_text_tokens`` / ``get_3d_mrope_ids_vae_tokens``, with fps modulation).

The schedule: the pipeline samples with the folder's ``UniPCMultistepScheduler``, a multistep
predictor-corrector solver, not Euler. Its sigmas are whatever that scheduler's ``set_timesteps``
gives (``:1693-1701``): with ``use_native_flow_schedule`` (Cosmos3 Edge) the sigmas
``linspace(1 - 1/1000, 0, N + 1)[:-1]`` through the scheduler (its ``flow_shift``, 5.0 in diffusers'
``scripts/convert_cosmos3_to_diffusers.py`` for Edge); else the scheduler's own grid (that script
writes Nano / Super folders with ``use_karras_sigmas``, ``sigma_max=200``, ``sigma_min=0.147``: Karras
sigmas mapped to flow sigmas ``s / (1 + s)``, 0.995 down to 0.128, then 0). :meth:`Cosmos3Family.sigmas` builds that scheduler from ``scheduler_config.json`` and returns
exactly those sigmas; diffrl steps them with its own Euler / SDE kernels. ODE sampling therefore
equals ``Cosmos3OmniPipeline`` with a ``FlowMatchEulerDiscreteScheduler`` stepping the same sigmas
(the integration test), not the UniPC solver. Two more differences from UniPC, both small: UniPC
hands the transformer integer timesteps ``int(1000 sigma)`` (``scheduling_unipc_multistep.py:466``)
where diffrl, as the Euler scheduler, passes ``1000 sigma`` (a difference below 0.001 of the
transformer's ``timestep_scale``-ed time); and the first sigma is below 1 (0.995 or 0.9998) while
the pipeline's initial latent is pure noise (``:951``), which diffrl's sampler starts from too. The
SDE kernel uses ``sigmas[1]`` in ``1 - sigma`` at that first step, as at sigma = 1, so its noise
stays finite (see :func:`diffrl.sampling.kernels.sde_step`). ``sampling.shift`` set to a number
replaces all this with ``FlowMatchEulerDiscreteScheduler(shift=...)``'s schedule from 1.

Guidance: ``v_neg + g (v_pos - v_neg)`` whenever ``guidance_scale != 1`` (``:1314``, ``:1851``;
default 6.0), the negative prompt ``""`` unless ``sampling.negative_prompt`` says otherwise.

LoRA: ``Cosmos3OmniPipeline`` has no ``load_lora_weights``. :meth:`save_lora` writes the adapter with
diffusers' ``CosmosLoraLoaderMixin.save_lora_weights`` (keys ``transformer.*``, the peft config in
the metadata); ``pipe.transformer.load_lora_adapter(folder, prefix="transformer", use_safetensors=True)``
reads it back.
The default targets are the generation pathway's attention (``add_q_proj``, ``add_k_proj``,
``add_v_proj``, ``to_add_out``): the weights only the vision tokens go through, so the prompt's
understanding pathway (the VLM's language model, shared with Cosmos 3's reasoning) stays as it is.

A user's checkpoint: ``model: {family: cosmos3, path: /models/Cosmos3-Nano, options: {num_frames:
33, height: 480, width: 832}}``; ``num_frames: 1`` for text-to-image.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import diffusers
import numpy as np
import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer
from diffusers.loaders.lora_pipeline import CosmosLoraLoaderMixin
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)
from peft.utils import get_peft_model_state_dict
from torch import nn
from transformers import AutoTokenizer

from diffrl.config import Range
from diffrl.config.schema import MAX_SIDE
from diffrl.core.rollout import Conditioning, Media
from diffrl.models.base import DTYPES, FrameRate, Frames, SizeRule, TextTokens
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    encode_normalised_videos,
    latent_stats,
    load_part,
)

PIPELINE_CLASS = "Cosmos3OmniPipeline"
TEMPORAL_FACTOR = 4
"""Frames per latent frame of the Wan VAE (checked again against the loaded VAE's config)."""

# The generation pathway's attention projections in every Cosmos3VLTextMoTDecoderLayer
COSMOS3_LORA_TARGETS = [
    "self_attn.add_q_proj",
    "self_attn.add_k_proj",
    "self_attn.add_v_proj",
    "self_attn.to_add_out",
]


class Cosmos3Description(DiffusersFolderDescription):
    """What :class:`Cosmos3Family` declares (static): the Cosmos 3 folder's checks, its frame and size
    rules."""

    name = "cosmos3"
    pipeline_class = PIPELINE_CLASS
    transformer_class = "Cosmos3OmniTransformer"
    default_guidance = 6.0
    """``Cosmos3OmniPipeline.__call__``'s default ``guidance_scale``."""
    default_lora_targets = COSMOS3_LORA_TARGETS

    @dataclass
    class Options:
        num_frames: Frames = 189
        """Frames per video (the pipeline's default; ``num_frames = 4k + 1``; 1: text-to-image)."""
        height: Annotated[int, Range(1, MAX_SIDE, hint="pixels, e.g. 720")] = 720
        """Pixels (the pipeline's default); the prompt states it, so ``sampling.height`` must equal it."""
        width: Annotated[int, Range(1, MAX_SIDE, hint="pixels, e.g. 1280")] = 1280
        """Pixels (the pipeline's default); ``sampling.width`` must equal it."""
        fps: FrameRate = 24.0
        """Frame rate: in the prompt's duration sentence and the mRoPE fps modulation (the
        pipeline's default); the decoded videos carry it."""
        max_prompt_tokens: TextTokens = 1024
        """Token ids kept per prompt, chat template and size sentences included (the pipeline never
        cuts a prompt: a longer one is an error)."""
        use_system_prompt: bool | None = None
        """None: ``model_index.json``'s ``default_use_system_prompt``, as the pipeline."""
        add_resolution_template: bool = True
        """The "This image is of HxW resolution." sentence (the pipeline's default)."""
        add_duration_template: bool = True
        """The "The video is D seconds long and is of F FPS." sentence for videos (the pipeline's default)."""
        gradient_checkpointing: bool = False
        vae_dtype: str = "float32"
        """dtype of the frozen VAE."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        problems = super().folder_problems(folder)
        if problems:
            return problems
        return [
            f"{str(folder)!r} has no {sub}/ folder"
            for sub in ("text_tokenizer", "vae")
            if not (folder / sub).is_dir()
        ]

    @classmethod
    def makes_videos(cls, config) -> bool:
        return cls.bound_options(config).num_frames != 1  # 1: still images

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        options = cls.bound_options(config)  # a value out of its range is reported above, once
        frames = options.num_frames
        if (frames - 1) % TEMPORAL_FACTOR:
            errors.append(
                f"model.options.num_frames: {frames} frames do not fit Cosmos 3's Wan VAE, which needs "
                f"num_frames = 4k + 1 (e.g. 1 for text-to-image, 33, 93, 189)"
            )
        rule = cls.size_rule(config, check_files)
        for side in ("height", "width"):
            value = getattr(options, side)
            if config.model.options.get(side, value) != value:
                continue  # it did not bind: reported above
            if rule is not None and value % rule.multiple:
                errors.append(
                    f"model.options.{side}={value} does not fit the cosmos3 model: it must be a positive "
                    f"multiple of {rule.multiple} ({rule.why})"
                )
            given = getattr(config.sampling, side)
            if isinstance(given, int) and given != value:
                errors.append(
                    f"sampling.{side}={given} differs from model.options.{side}={value}: Cosmos 3's prompt "
                    f"states the resolution, so the size is set in model.options; set "
                    f"model.options.{side}={given} and leave sampling.{side} unset (or equal)"
                )
        return errors

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        """The VAE's spatial compression (the pipeline's own check, ``:1066``); the transformer pads
        an odd latent side to its patch size and crops the output, as the pipeline's."""
        spatial = cls.component_setting(
            config, check_files, "vae", "AutoencoderKLWan", "scale_factor_spatial"
        )
        if spatial is None:
            return None
        return SizeRule(int(spatial), f"the VAE's {spatial}x spatial compression")

    @classmethod
    def fsdp_blocks(cls, module: nn.Module) -> list[nn.Module]:
        """The decoder layers (``Cosmos3OmniTransformer.layers``)."""
        return list(getattr(module, "layers", None) or []) or super().fsdp_blocks(module)


class Cosmos3Family(DiffusersFolderFamily):
    """Cosmos 3 loaded: its tokenizer-only prompts, the joint token sequence, the VAE."""

    description = Cosmos3Description
    components = ("transformer", "text_tokenizer", "vae")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.use_native_flow_schedule = bool(self.pipeline_config.get("use_native_flow_schedule", False))
        self.default_use_system_prompt = bool(self.pipeline_config.get("default_use_system_prompt", True))
        self.num_train_timesteps = int(self.scheduler_config.get("num_train_timesteps", 1000))
        self.spatial_factor = int(self.vae.config.scale_factor_spatial)
        self.temporal_factor = int(self.vae.config.scale_factor_temporal)
        self._tokenizing = None  # a pipeline over these parts, for its tokenize_prompt
        self._sigma_cache: dict[int, torch.Tensor] = {}
        self._negatives: dict[str, Conditioning] = {}

    # ---- construction --------------------------------------------------------------------------

    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        return {
            "transformer": load_part(folder, "transformer", Cosmos3OmniTransformer, dtype),
            "text_tokenizer": load_part(folder, "text_tokenizer", AutoTokenizer),
            "vae": load_part(folder, "vae", AutoencoderKLWan, DTYPES[options.vae_dtype]),
        }

    def pipeline_components(self) -> dict[str, Any]:
        """These modules and ``model_index.json``'s flags, without the safety checker (see the
        module docstring); :meth:`pipeline` adds the folder's UniPC scheduler. To get what diffrl's
        ODE sampler computes, give the pipeline a ``FlowMatchEulerDiscreteScheduler`` stepping
        :meth:`sigmas` (the integration test shows how)."""
        return dict(
            transformer=self.transformer,
            text_tokenizer=self.text_tokenizer,
            vae=self.vae,
            enable_safety_checker=False,
            default_use_system_prompt=self.default_use_system_prompt,
            use_native_flow_schedule=self.use_native_flow_schedule,
        )

    def save_lora(self, out_dir: str | Path) -> str:
        """The adapter via ``CosmosLoraLoaderMixin.save_lora_weights`` (the pipeline has no LoRA
        loader of its own); returns how diffusers reads it back."""
        self.write_lora(out_dir, get_peft_model_state_dict(self.transformer))
        return (
            f"pipe = {PIPELINE_CLASS}.from_pretrained(BASE, enable_safety_checker=False); "
            f"pipe.transformer.load_lora_adapter({str(out_dir)!r}, prefix='transformer', use_safetensors=True)"
        )

    def write_lora(self, out_dir: str | Path, layers: dict[str, torch.Tensor]) -> None:
        CosmosLoraLoaderMixin.save_lora_weights(
            out_dir,
            transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        return (self.options.height, self.options.width)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """``(C, (num_frames - 1) // 4 + 1, H / 16, W / 16)`` with the VAE's factors (one latent
        frame for text-to-image)."""
        o = self.options
        if (height, width) != (o.height, o.width):
            raise ValueError(
                f"cosmos3: sampling at {height}x{width} but the prompts state {o.height}x{o.width}; set "
                f"model.options.height/width to the sampling size"
            )
        if height % self.spatial_factor or width % self.spatial_factor:
            raise ValueError(
                f"cosmos3: height and width must be multiples of {self.spatial_factor}, got {height}x{width}"
            )
        if o.num_frames < 1 or (o.num_frames - 1) % self.temporal_factor:
            raise ValueError(
                f"cosmos3: model.options.num_frames={o.num_frames}; this VAE needs num_frames = "
                f"{self.temporal_factor}k + 1"
            )
        return (
            int(self.vae.config.z_dim),
            (o.num_frames - 1) // self.temporal_factor + 1,
            height // self.spatial_factor,
            width // self.spatial_factor,
        )

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """``(num_steps + 1,)`` float32: the folder's scheduler's sigmas as the pipeline sets them
        (``:1693-1701``), ending at 0; the first is below 1 (see the module docstring). A numeric
        ``shift`` gives ``FlowMatchEulerDiscreteScheduler(shift=shift)``'s schedule instead."""
        if shift is not None:
            return super().sigmas(num_steps, shift, height, width)
        if num_steps not in self._sigma_cache:
            scheduler = getattr(diffusers, self.scheduler_config["_class_name"]).from_config(
                self.scheduler_config
            )
            if self.use_native_flow_schedule:
                n = scheduler.config.num_train_timesteps
                native = np.linspace(1.0 - 1.0 / n, 0.0, num_steps + 1)[:-1]
                scheduler.set_timesteps(num_steps, device="cpu", sigmas=native)
            else:
                scheduler.set_timesteps(num_steps, device="cpu")
            sigmas = scheduler.sigmas.float().cpu()
            if len(sigmas) != num_steps + 1 or sigmas[-1] != 0 or not bool((sigmas[1:] < sigmas[:-1]).all()):
                raise ValueError(
                    f"cosmos3: the folder's {self.scheduler_config['_class_name']} gives sigmas "
                    f"{sigmas.tolist()} for {num_steps} steps; diffrl needs {num_steps + 1} decreasing "
                    f"sigmas ending at 0 (final_sigmas_type='zero')"
                )
            self._sigma_cache[num_steps] = sigmas
        return self._sigma_cache[num_steps].clone()

    # ---- text ----------------------------------------------------------------------------------
    def _tokenize(self, prompt: str, negative: bool) -> list[int]:
        """The pipeline's ``tokenize_prompt`` with this family's size, frames and fps: the
        prompt's ids, or (``negative``) the negative prompt's."""
        if self._tokenizing is None:
            self._tokenizing = self.pipeline()
        o = self.options
        pos, neg = self._tokenizing.tokenize_prompt(
            "" if negative else prompt,
            prompt if negative else None,
            num_frames=o.num_frames,
            height=o.height,
            width=o.width,
            fps=o.fps,
            use_system_prompt=o.use_system_prompt,
            add_resolution_template=o.add_resolution_template,
            add_duration_template=o.add_duration_template,
        )
        ids = neg if negative else pos
        if len(ids) > o.max_prompt_tokens:
            raise ValueError(
                f"cosmos3: the {'negative ' if negative else ''}prompt {prompt[:60]!r} is {len(ids)} tokens "
                f"with the chat template and the size sentences, more than model.options."
                f"max_prompt_tokens={o.max_prompt_tokens}; raise it (the pipeline never cuts a prompt)"
            )
        return ids

    def _token_tensors(self, prompts: list[str], negative: bool) -> dict[str, torch.Tensor]:
        rows = [self._tokenize(p, negative) for p in prompts]
        ids = torch.zeros(len(rows), self.options.max_prompt_tokens, dtype=torch.long)
        for i, row in enumerate(rows):
            ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        return {"input_ids": ids.to(self.device), "prompt_length": lengths.to(self.device)}

    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """-> ``input_ids (B, max_prompt_tokens)`` (long, zeros after each prompt's ids) and
        ``prompt_length (B,)`` (long)."""
        return self._token_tensors(prompts, negative=False)

    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None:
        """The negative prompt's one row, with the inverse size sentences (``tokenize_prompt``'s
        ``uncond_input_ids``), whenever ``guidance_scale != 1`` (the pipeline's CFG test)."""
        if guidance_scale == 1.0:
            return None
        if prompt not in self._negatives:
            self._negatives[prompt] = Conditioning(self._token_tensors([prompt], negative=True))
        one = self._negatives[prompt]
        return one if cond is None else one.repeat(len(cond))

    # ---- the velocity forward ------------------------------------------------------------------
    def _sequence(self, length: int, latent: tuple[int, int, int]) -> tuple[dict[str, Any], int]:
        """The packed sequence of one sample but its noisy tokens (``length`` prompt tokens, then
        the vision tokens of a ``latent = (T, H, W)`` latent, every frame noisy: text-to-image and
        text-to-video), as ``_prepare_text_segment`` / ``_prepare_vision_segment`` (``:532``,
        ``:561``) build it, and its number of vision tokens."""
        config = self.transformer.config
        text_mrope, offset = get_3d_mrope_ids_text_tokens(
            num_tokens=length, temporal_offset=0, use_float_positions=config.enable_fps_modulation
        )
        t, h, w = latent
        p = config.latent_patch_size
        ph, pw = math.ceil(h / p), math.ceil(w / p)
        n = t * ph * pw
        vision_mrope, _ = get_3d_mrope_ids_vae_tokens(
            grid_t=t,
            grid_h=ph,
            grid_w=pw,
            temporal_offset=offset + config.unified_3d_mrope_temporal_modality_margin,
            reset_spatial_indices=config.unified_3d_mrope_reset_spatial_ids,
            fps=self.options.fps if config.enable_fps_modulation else None,
            base_fps=float(config.base_fps),
            temporal_compression_factor=self.temporal_factor,
        )
        d = self.device
        return dict(
            text_indexes=torch.arange(length, device=d),
            position_ids=torch.cat([text_mrope, vision_mrope], dim=1).to(d),
            und_len=length,
            sequence_length=length + n,
            vision_token_shapes=[(t, ph, pw)],
            vision_sequence_indexes=torch.arange(length, length + n, device=d),
            vision_mse_loss_indexes=torch.arange(length, length + n, device=d),
            vision_noisy_frame_indexes=[torch.arange(t, device=d)],
        ), n

    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """``x_t (B, C, T, H, W)``, ``sigma (B,)`` -> velocity ``(B, C, T, H, W)``: one
        transformer call per row (the transformer packs one sample per sequence), each the
        pipeline's; the timestep is ``1000 sigma`` in float32 (the Euler scheduler's ``t``). Each
        prompt length is its own sequence length: ``model.compile`` builds one graph per length."""
        expected = self.latent_shape(self.options.height, self.options.width)
        if tuple(x_t.shape[1:]) != expected:
            raise ValueError(
                f"cosmos3: latents {tuple(x_t.shape[1:])} but the prompts were encoded for "
                f"{self.options.num_frames} frames of {self.options.height}x{self.options.width} "
                f"(latents {expected})"
            )
        dtype = module.proj_in.weight.dtype
        ids = cond.tensors["input_ids"].to(x_t.device)
        lengths = cond.tensors["prompt_length"].tolist()
        timestep = sigma.float() * self.num_train_timesteps
        rows = []
        for i, length in enumerate(lengths):
            static, n = self._sequence(int(length), tuple(x_t.shape[2:]))
            preds = module(
                input_ids=ids[i, :length],
                vision_tokens=[x_t[i : i + 1].to(dtype)],
                vision_timesteps=timestep[i].expand(n),
                return_dict=False,
                **static,
            )[0]
            rows.append(preds[0])  # (1, C, T, H, W)
        return torch.cat(rows)

    # ---- pixels <-> latents --------------------------------------------------------------------
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` (``num_frames: 1``) or videos ``(B, 3, F, H, W)`` in [0, 1] ->
        ``x0 (B, C, F', H / 16, W / 16)``: the VAE's mode, normalised as ``_encode_video``; one
        sample at a time (VAE memory grows with frames x pixels)."""
        return encode_normalised_videos(self, self.vae, images)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, C, F', h, w)`` -> videos ``(B, 3, F, H, W)`` in [0, 1], or images
        ``(B, 3, H, W)`` for ``num_frames: 1``; one at a time."""
        z = latents.to(self.device, self.vae.dtype)
        mean, inv_std = latent_stats(self.vae.config, z)
        z = z / inv_std + mean  # the pipeline's arithmetic (:1913)
        video = torch.cat([self.vae.decode(v[None], return_dict=False)[0] for v in z])
        video = (video.float() * 0.5 + 0.5).clamp(0.0, 1.0)
        return video[:, :, 0] if self.options.num_frames == 1 else video

    def decode_media(self, latents: torch.Tensor) -> Media:
        """:meth:`decode`'s frames with ``model.options.fps`` for videos (None for images)."""
        return Media(self.decode(latents), fps=None if self.options.num_frames == 1 else self.options.fps)
