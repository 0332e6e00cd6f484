"""``wan``: Wan 2.1 / 2.2 text-to-video from a local diffusers folder (``WanPipeline`` layout).

Parts, loaded as diffusers' ``WanPipeline`` (0.42) would:

- ``WanTransformer3DModel`` (trained). Wan 2.2 A14B has two experts: ``transformer`` denoises the
  high-noise steps (timestep ``t >= boundary_ratio * 1000``, ``boundary_ratio`` from
  ``model_index.json``, 0.875 for T2V-A14B) and ``transformer_2`` the low-noise rest. Both sit in one
  :class:`WanExperts` module that routes each row of a batch to the expert owning its timestep, so
  the trainer, the samplers and the algorithms see one transformer (see :class:`WanExperts`).
- ``AutoencoderKLWan``: latents are ``(z - latents_mean) / latents_std`` per channel, as the
  pipeline; a video of ``num_frames`` frames (``(num_frames - 1) % 4 == 0``) is
  ``(C, (num_frames - 1) // 4 + 1, H / 8, W / 8)`` (the VAE's scale factors; Wan 2.2 TI2V-5B: 16x).
- UMT5 (``UMT5EncoderModel``): the prompt is cleaned by diffusers' own ``prompt_clean`` (ftfy when
  installed, else skipped, as diffusers does), padded to ``max_sequence_length`` (512, the
  pipeline's ``__call__`` default) and the hidden states after each prompt's true length are zeros.

Timesteps are ``sigma * 1000`` in float32 whatever the transformer's dtype (the pipeline passes the
scheduler's float32 ``t``); Wan 2.2 TI2V-5B folders (``expand_timesteps``) get it per token, as
there. Sigma schedule: Wan folders ship ``UniPCMultistepScheduler(flow_shift=...)`` (3.0 for 480p,
5.0 for 720p); diffrl samples with its Euler / SDE kernels along
``FlowMatchEulerDiscreteScheduler(shift=flow_shift)``'s sigmas, so ODE sampling equals ``WanPipeline``
with that scheduler swapped in (not UniPC, a multistep solver on a slightly different grid).

Guidance: ``WanPipeline`` runs CFG ``v_neg + g (v_pos - v_neg)`` with ``guidance_scale`` (default
5.0) on the high-noise expert and ``guidance_scale_2`` on the low-noise one; ``guidance_scale_2``
defaults to ``guidance_scale``, which is what diffrl does (one ``sampling.guidance_scale``).

A user's checkpoint: ``model: {family: wan, path: /models/Wan2.2-T2V-A14B-Diffusers,
options: {num_frames: 81}}``. For an SFT on still images set ``num_frames: 1``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import torch
import torch.distributed as dist
from diffusers import AutoencoderKLWan, WanTransformer3DModel
from diffusers.loaders import PeftAdapterMixin
from diffusers.pipelines.wan.pipeline_wan import prompt_clean
from peft.utils import get_peft_model_state_dict
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import AutoTokenizer, UMT5EncoderModel

from diffrl.config import Range
from diffrl.core.rollout import Conditioning
from diffrl.models.base import DTYPES, Frames, Planned, SizeRule, meta_model
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    encode_normalised_videos,
    latent_stats,
    load_part,
    read_json,
    read_pipeline_config,
    read_scheduler_config,
)

# The attention projections of every block, self-attention (attn1) and cross-attention to the text
# (attn2): flow_grpo's choice (attention projections only) and what diffusers' LoRA scripts'
# ["to_k", "to_q", "to_v", "to_out.0"] hit in a Wan block. The FFN (``ffn.net.0.proj``,
# ``ffn.net.2``) would double the adapter; add it through ``model.lora.target_modules`` if needed.
WAN_LORA_TARGETS = [
    f"{attn}.{proj}" for attn in ("attn1", "attn2") for proj in ("to_q", "to_k", "to_v", "to_out.0")
]

PIPELINE_CLASS = "WanPipeline"
TEMPORAL_FACTOR = 4
"""Frames per latent frame in every Wan VAE (checked again against the loaded VAE's config)."""


class WanExperts(nn.Module, PeftAdapterMixin):
    """One or two ``WanTransformer3DModel`` experts behind one module, routed by timestep.

    ``forward`` takes and returns what ``WanTransformer3DModel.forward`` does. With two experts, row
    ``i`` goes to ``transformer`` when ``timestep[i] >= boundary_timestep`` (the pipeline's test),
    else to ``transformer_2``; a batch whose rows belong to both is split, each part runs through
    its expert and the outputs are scattered back. A recorded denoising step is therefore replayed
    and trained by the expert that sampled it.

    LoRA: ``add_adapter`` here (diffusers' ``PeftAdapterMixin``) injects the adapter into both
    experts (the targets are module-name suffixes); each adapter only gets gradient from the rows
    its expert ran. The peft state dict names tensors ``transformer.<...>`` and
    ``transformer_2.<...>``.

    Under FSDP2 (``fully_shard`` of this module and of the experts' blocks) every rank must run the
    same experts, else one rank all-gathers an expert's block while another gathers the other's
    (same shapes: the collectives pair up silently, with wrong data). The ranks agree on the set
    with an all-reduce, and a rank that has no row for an agreed expert runs it on a stand-in row
    with a zero weight, so its all-gathers and gradient reduce-scatters take part.
    """

    def __init__(
        self,
        transformer: nn.Module,
        transformer_2: nn.Module | None = None,
        boundary_timestep: float | None = None,
    ):
        super().__init__()
        if (transformer_2 is None) != (boundary_timestep is None):
            raise ValueError("WanExperts: give both transformer_2 and boundary_timestep, or neither")
        self.transformer = transformer
        self.transformer_2 = transformer_2
        self.boundary_timestep = boundary_timestep

    @property
    def experts(self) -> list[nn.Module]:
        return [m for m in (self.transformer, self.transformer_2) if m is not None]

    @property
    def config(self):
        return self.transformer.config

    @property
    def dtype(self) -> torch.dtype:
        return self.transformer.patch_embedding.weight.dtype

    def enable_gradient_checkpointing(self) -> None:
        """Gradient checkpointing in every expert."""
        for expert in self.experts:
            expert.enable_gradient_checkpointing()

    def owner(self, timestep: torch.Tensor) -> torch.Tensor:
        """``timestep (B,)`` or ``(B, L)`` -> ``(B,)`` long: 0 for ``transformer``, 1 for
        ``transformer_2``."""
        t = timestep if timestep.ndim == 1 else timestep.amax(dim=1)
        if self.transformer_2 is None:
            return torch.zeros(t.shape[0], dtype=torch.long, device=t.device)
        return (t < self.boundary_timestep).long()

    def _agree(self, used: list[bool], device: torch.device) -> list[bool]:
        """The experts any rank needs, when FSDP2 shards this module (else ``used`` as is)."""
        # fully_shard makes this module an FSDPModule (inside forward its parameters are unsharded
        # plain tensors, so they cannot tell)
        if not (isinstance(self, FSDPModule) and dist.is_initialized()):
            return used
        flags = torch.tensor([int(u) for u in used], dtype=torch.int64, device=device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        return [bool(f) for f in flags.tolist()]

    def forward(
        self,
        hidden_states: torch.Tensor,
        timestep: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        return_dict: bool = False,
        expert: int | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor]:
        """``hidden_states (B, C, F, H, W)``, ``timestep (B,)`` or ``(B, L)``,
        ``encoder_hidden_states (B, S, D)`` -> ``(velocity (B, C, F, H, W),)``. ``expert``: every
        row to that expert, unread timesteps (``diffrl plan``'s fake tensors hold no values)."""
        if return_dict:
            raise ValueError("WanExperts returns a tuple only (return_dict=False)")
        inputs = dict(
            hidden_states=hidden_states,
            timestep=timestep,
            encoder_hidden_states=encoder_hidden_states,
            **kwargs,
        )
        if expert is not None:
            return self.experts[expert](**inputs, return_dict=False)
        owner = self.owner(timestep)
        used = self._agree([bool((owner == k).any()) for k in range(len(self.experts))], owner.device)
        if sum(used) == 1 and bool((owner == used.index(True)).all()):
            return self.experts[used.index(True)](**inputs, return_dict=False)
        out = None
        for k, expert in enumerate(self.experts):
            if not used[k]:
                continue
            rows = torch.nonzero(owner == k).flatten()
            idle = rows.numel() == 0
            take = rows.new_zeros(1) if idle else rows  # idle: a stand-in row
            part = {
                key: v[take] if torch.is_tensor(v) and v.shape[:1] == owner.shape else v
                for key, v in inputs.items()
            }
            y = expert(**part, return_dict=False)[0]
            if out is None:
                out = y.new_zeros(owner.shape[0], *y.shape[1:])
            if idle:  # another rank needs this expert: take part in its collectives, change nothing
                out = out + 0.0 * torch.nan_to_num(y).sum()
            else:
                out = out.index_copy(0, rows, y)
        return (out,)


class WanDescription(DiffusersFolderDescription):
    """What :class:`WanFamily` declares (static): the Wan folders' checks (2.1, 2.2's two experts), the
    frame, size and sequence rules, the FSDP2 units and the plan."""

    name = "wan"
    pipeline_class = PIPELINE_CLASS
    transformer_class = "WanTransformer3DModel"
    default_guidance = 5.0
    """``WanPipeline``'s default ``guidance_scale`` (its ``guidance_scale_2`` defaults to it)."""
    default_lora_targets = WAN_LORA_TARGETS
    fps = 16.0
    """Wan's frame rate (diffusers' Wan examples export with ``export_to_video(..., fps=16)``)."""
    sequence_parallel = True
    """``WanTransformer3DModel._cp_plan`` splits the video tokens after the patch embedding (and
    the rope, and Wan 2.2 TI2V's per-token timesteps) and gathers ``proj_out``'s output; the
    text cross-attention's keys stay whole."""

    @dataclass
    class Options:
        num_frames: Frames = 81
        """Frames per video (the pipeline's default; ``(num_frames - 1) % 4 == 0``; 1: still images)."""
        max_sequence_length: Annotated[int, Range(1, 4096, hint="UMT5 tokens, e.g. 512")] = 512
        """UMT5 tokens (the pipeline's ``__call__`` default)."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen UMT5 (``bfloat16`` saves memory: UMT5-XXL is 5.7B parameters)."""
        vae_dtype: str = "float32"
        """dtype of the frozen VAE (diffusers' Wan examples keep it in float32)."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        problems = super().folder_problems(folder)
        if problems:
            return problems
        boundary = read_pipeline_config(folder).get("boundary_ratio")
        subs = ("text_encoder", "tokenizer", "vae") + (("transformer_2",) if boundary is not None else ())
        return [
            f"{str(folder)!r} has no {sub}/ folder"
            + (f" (boundary_ratio={boundary} asks for two experts)" if sub == "transformer_2" else "")
            for sub in subs
            if not (folder / sub).is_dir()
        ]

    @classmethod
    def makes_videos(cls, config) -> bool:
        return True  # (B, 3, F, H, W) even for num_frames: 1

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        frames = cls.bound_options(config).num_frames
        if (frames - 1) % TEMPORAL_FACTOR:
            errors.append(
                f"model.options.num_frames: {frames} frames do not fit Wan's VAE, which needs "
                f"num_frames = 4k + 1 (e.g. 1, 5, 33, 81)"
            )
        elif (most := cls.max_frames(config, check_files)) is not None and frames > most:
            errors.append(
                f"model.options.num_frames={frames} is more than the wan model takes: at most {most} "
                f"frames (its RoPE table has {cls._rope_positions(config, check_files)} positions, each "
                f"{TEMPORAL_FACTOR} frames after the VAE); e.g. model.options.num_frames={most}"
            )
        return errors

    @classmethod
    def _rope_positions(cls, config, check_files: bool) -> int | None:
        """Positions of the transformer's RoPE table on each axis (``rope_max_seq_len``): latent
        frames, rows and columns of patches beyond it have no position (diffusers fails on a
        reshape)."""
        n = cls.component_setting(
            config, check_files, "transformer", cls.transformer_class, "rope_max_seq_len"
        )
        return int(n) if n else None

    @classmethod
    def max_frames(cls, config, check_files: bool = True) -> int | None:
        """The most frames the transformer's RoPE table places (4k + 1), None when unknown."""
        positions = cls._rope_positions(config, check_files)
        patch = cls.component_setting(config, check_files, "transformer", cls.transformer_class, "patch_size")
        if positions is None or patch is None:
            return None
        return (positions * int(patch[0]) - 1) * TEMPORAL_FACTOR + 1

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        spatial = cls.component_setting(
            config, check_files, "vae", "AutoencoderKLWan", "scale_factor_spatial"
        )
        patch = cls.component_setting(
            config, check_files, "transformer", "WanTransformer3DModel", "patch_size"
        )
        if spatial is None or patch is None:
            return None
        step = int(spatial) * int(patch[1])
        positions = cls._rope_positions(config, check_files)
        return SizeRule(
            step,
            f"the VAE's {spatial}x spatial compression times the patch size {patch[1]}",
            positions * step if positions else None,
            f"its RoPE table has {positions} positions a side, each {step} pixels",
        )

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """The video tokens, ``(num_frames - 1) / 4 + 1`` latent frames x ``H / 16`` x ``W / 16``
        (VAE 8x, patch 2x2), and the attention heads."""
        spatial = cls.component_setting(
            config, check_files, "vae", "AutoencoderKLWan", "scale_factor_spatial"
        )
        patch = cls.component_setting(config, check_files, "transformer", cls.transformer_class, "patch_size")
        heads = cls.component_setting(
            config, check_files, "transformer", cls.transformer_class, "num_attention_heads"
        )
        frames = config.model.options.get("num_frames", cls.Options.num_frames)
        s = config.sampling
        height, width = s.height or 480, s.width or 832  # the pipeline's default size
        if None in (spatial, patch, heads) or not isinstance(frames, int) or frames < 1:
            return None
        tokens = ((frames - 1) // TEMPORAL_FACTOR + 1) // int(patch[0])
        tokens *= height // (int(spatial) * int(patch[1])) * (width // (int(spatial) * int(patch[2])))
        return {"video tokens": tokens, "attention heads": int(heads)}

    @classmethod
    def sequence_parallel_modules(cls, module: nn.Module) -> list[nn.Module]:
        """Each expert of a :class:`WanExperts` (each a ``WanTransformer3DModel``)."""
        return module.experts if isinstance(module, WanExperts) else [module]

    @classmethod
    def fsdp_blocks(cls, module: nn.Module) -> list[nn.Module]:
        """Every block of both experts (the experts' embeddings and heads form the root unit)."""
        if isinstance(module, WanExperts):
            return [block for expert in module.experts for block in expert.blocks]
        return super().fsdp_blocks(module)

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """Both experts when ``model_index.json`` sets ``boundary_ratio`` (each a
        ``WanTransformer3DModel`` from its folder's ``config.json``), as :meth:`load_parts` holds
        them; conditioning: ``max_sequence_length`` UMT5 tokens, as :meth:`_encode_prompts` pads."""
        settings = read_json(folder / "transformer" / "config.json")
        if settings is None:
            return None
        boundary = (read_json(folder / "model_index.json") or {}).get("boundary_ratio")
        steps = int(
            (read_json(folder / "scheduler" / "scheduler_config.json") or {}).get("num_train_timesteps", 1000)
        )
        dtype = DTYPES[config.model.dtype]
        high = meta_model(WanTransformer3DModel, settings, dtype)
        low = None
        if boundary is not None:
            low_settings = read_json(folder / "transformer_2" / "config.json") or settings
            low = meta_model(WanTransformer3DModel, low_settings, dtype)
        module = WanExperts(high, low, boundary * steps if boundary is not None else None)
        options = cls.parse_options(config.model.options)
        if options.gradient_checkpointing:
            module.enable_gradient_checkpointing()
        vae = read_json(folder / "vae" / "config.json") or {}
        spatial, temporal = int(vae.get("scale_factor_spatial", 8)), int(vae.get("scale_factor_temporal", 4))
        height, width = config.sampling.height or 480, config.sampling.width or 832
        frames = (options.num_frames - 1) // temporal + 1
        latent = (high.config.in_channels, frames, height // spatial, width // spatial)
        tokens = options.max_sequence_length

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            text = x_t.new_zeros(len(x_t), tokens, high.config.text_dim, dtype=dtype)
            timestep = sigma.float() * steps  # the high-noise expert's (both are the same size)
            return m(hidden_states=x_t.to(dtype), timestep=timestep, encoder_hidden_states=text, expert=0)[0]

        experts = f" x {len(module.experts)} experts" if low is not None else ""
        return Planned(module, latent, forward, f"WanTransformer3DModel{experts}")


class WanFamily(DiffusersFolderFamily):
    """Wan 2.1 / 2.2 loaded: UMT5 prompts, the forward through one expert or two (:class:`WanExperts`),
    the video VAE."""

    description = WanDescription

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        self.boundary_ratio = self.pipeline_config.get("boundary_ratio")
        self.expand_timesteps = bool(self.pipeline_config.get("expand_timesteps") or False)
        self.num_train_timesteps = int(self.scheduler_config.get("num_train_timesteps", 1000))
        # UniPC (what Wan folders ship) calls the shift flow_shift; FlowMatchEuler calls it shift
        shift = self.scheduler_config.get("flow_shift") or self.scheduler_config.get("shift") or 3.0
        self.default_shift = float(shift)
        self.spatial_factor = int(self.vae.config.scale_factor_spatial)
        self.temporal_factor = int(self.vae.config.scale_factor_temporal)

    # ---- construction --------------------------------------------------------------------------

    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        """As the pipeline's, but ``transformer`` is a :class:`WanExperts` holding the folder's
        ``transformer`` and, when ``model_index.json`` sets ``boundary_ratio``, ``transformer_2``."""
        boundary = read_pipeline_config(folder).get("boundary_ratio")
        if boundary is None:  # Wan 2.1, Wan 2.2 TI2V-5B; the pipeline ignores a transformer_2 then
            experts = WanExperts(load_part(folder, "transformer", WanTransformer3DModel, dtype))
        else:
            steps = int(read_scheduler_config(folder).get("num_train_timesteps", 1000))
            experts = WanExperts(
                load_part(folder, "transformer", WanTransformer3DModel, dtype),
                load_part(folder, "transformer_2", WanTransformer3DModel, dtype),
                boundary * steps,
            )
        return {
            "transformer": experts,
            "vae": load_part(folder, "vae", AutoencoderKLWan, DTYPES[options.vae_dtype]),
            "text_encoder": load_part(
                folder, "text_encoder", UMT5EncoderModel, DTYPES[options.text_encoder_dtype]
            ),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
        }

    def pipeline_components(self) -> dict[str, Any]:
        """With the folder's own scheduler in :meth:`pipeline` (UniPC for Wan folders): set
        ``pipe.scheduler = FlowMatchEulerDiscreteScheduler(shift=family.default_shift)`` to get what
        diffrl's ODE sampler computes."""
        return dict(
            tokenizer=self.tokenizer,
            text_encoder=self.text_encoder,
            vae=self.vae,
            transformer=self.transformer.transformer,
            transformer_2=self.transformer.transformer_2,
            boundary_ratio=self.boundary_ratio,
            expand_timesteps=self.expand_timesteps,
        )

    def save_lora(self, out_dir: str | Path) -> str:
        """Write the LoRA as ``WanPipeline.load_lora_weights`` reads it: the (high-noise)
        ``transformer``'s adapter in ``out_dir``; for Wan 2.2 A14B the low-noise expert's in
        ``out_dir/transformer_2``, loaded with
        ``pipe.load_lora_weights(out_dir / "transformer_2", load_into_transformer_2=True)``."""
        state = get_peft_model_state_dict(self.transformer)
        out = Path(out_dir)
        how = [f"pipe = WanPipeline.from_pretrained(BASE); pipe.load_lora_weights({str(out)!r})"]
        for name, folder in (("transformer", out), ("transformer_2", out / "transformer_2")):
            prefix = f"{name}."
            layers = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
            if layers:
                self.write_lora(folder, layers)
        if self.transformer.transformer_2 is not None:
            low = out / "transformer_2"
            how.append(f"pipe.load_lora_weights({str(low)!r}, load_into_transformer_2=True)")
        return "; ".join(how)

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        return (480, 832)  # the pipeline's default height x width

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """``(C, (num_frames - 1) // 4 + 1, H / 8, W / 8)`` with the VAE's scale factors."""
        step = self.spatial_factor * self.transformer.config.patch_size[1]
        if height % step or width % step:
            raise ValueError(f"wan: height and width must be multiples of {step}, got {height}x{width}")
        frames = self.options.num_frames
        if frames < 1 or (frames - 1) % self.temporal_factor:
            raise ValueError(
                f"wan: model.options.num_frames={frames}; this VAE needs num_frames = "
                f"{self.temporal_factor}k + 1"
            )
        return (
            self.transformer.config.in_channels,
            (frames - 1) // self.temporal_factor + 1,
            height // self.spatial_factor,
            width // self.spatial_factor,
        )

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """-> ``{"encoder_hidden_states": (B, max_sequence_length, D)}``, zeros after each prompt."""
        n = self.options.max_sequence_length
        inputs = self.tokenizer(
            [prompt_clean(p) for p in prompts],
            padding="max_length",
            max_length=n,
            truncation=True,
            add_special_tokens=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        mask = inputs.attention_mask.to(self.device)
        hidden = self.text_encoder(inputs.input_ids.to(self.device), mask).last_hidden_state
        seq_lens = mask.gt(0).sum(dim=1)
        after = torch.arange(n, device=self.device)[None, :] >= seq_lens[:, None]
        return {"encoder_hidden_states": hidden.masked_fill(after[..., None], 0.0)}

    # ---- the velocity forward ------------------------------------------------------------------
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """``x_t (B, C, F, H, W)``, ``sigma (B,)`` -> velocity ``(B, C, F, H, W)``; ``module`` is a
        :class:`WanExperts` or one ``WanTransformer3DModel``."""
        inner = module.transformer if isinstance(module, WanExperts) else module
        dtype = inner.patch_embedding.weight.dtype
        timestep = sigma.float() * self.num_train_timesteps  # the scheduler's float32 timesteps
        if self.expand_timesteps:  # Wan 2.2 TI2V: one timestep per token (the pipeline's mask[:, ::2, ::2])
            timestep = timestep[:, None].expand(-1, x_t[0, 0, :, ::2, ::2].numel())
        return module(
            hidden_states=x_t.to(dtype),
            timestep=timestep,
            encoder_hidden_states=cond.tensors["encoder_hidden_states"].to(x_t.device, dtype),
            return_dict=False,
        )[0]

    # ---- pixels <-> latents --------------------------------------------------------------------
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` (one-frame videos) or videos ``(B, 3, F, H, W)`` in [0, 1] ->
        ``x0 (B, C, F', H / 8, W / 8)``; one video at a time (VAE memory grows with frames x pixels)."""
        return encode_normalised_videos(self, self.vae, images)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, C, F', h, w)`` -> videos ``(B, 3, F, H, W)`` in [0, 1], one at a time."""
        z = latents.to(self.device, self.vae.dtype)
        mean, inv_std = latent_stats(self.vae.config, z)
        z = z / inv_std + mean  # the pipeline's exact arithmetic
        video = torch.cat([self.vae.decode(v[None], return_dict=False)[0] for v in z])
        return (video.float() * 0.5 + 0.5).clamp(0.0, 1.0)
