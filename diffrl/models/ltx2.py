"""``ltx2``: LTX-2 joint audio + video generation from a local diffusers folder (``LTX2Pipeline`` layout).

Parts, loaded as diffusers' ``LTX2Pipeline`` (0.42) would (``pipelines/ltx2/pipeline_ltx2.py:241``):

- ``LTX2VideoTransformer3DModel`` (trained): one transformer with a video and an audio stream per
  block (self-attention, text cross-attention, audio-to-video and video-to-audio cross-attention,
  FFN); it returns a velocity for each stream.
- Gemma 3 (``text_encoder``, the class ``model_index.json`` names, e.g.
  ``Gemma3ForConditionalGeneration``) and its tokenizer: prompts are stripped, left-padded to
  ``max_sequence_length`` (1024, the ``__call__`` default) and every layer's hidden states are
  stacked (``pipeline_ltx2.py:330-355``); ``LTX2TextConnectors`` turn them into the video and the
  audio text embeddings and their mask (``pipeline_ltx2.py:1251``, ``connectors.py:399``).
  Both are frozen and run once per prompt (cached).
- ``AutoencoderKLLTX2Video``: ``num_frames`` frames (``(num_frames - 1) % 8 == 0`` for LTX-2's
  8x temporal compression; 32x spatial) -> ``(128, (num_frames - 1) // 8 + 1, H / 32, W / 32)``,
  normalised ``(z - latents_mean) * scaling_factor / latents_std`` per channel
  (``pipeline_ltx2.py:687``).
- ``AutoencoderKLLTX2Audio`` (mel spectrogram <-> ``(8, L, 16)`` latents, normalised per packed
  feature, ``pipeline_ltx2.py:707``) and the vocoder (``LTX2Vocoder``: mel -> stereo waveform at
  ``output_sampling_rate``). A clip of ``num_frames / frame_rate`` seconds has
  ``L = round(seconds * sample_rate / mel_hop_length / 4)`` audio latent frames
  (``pipeline_ltx2.py:1306-1310``).

**The latent state.** A sample's ``x_t`` is one flat tensor, ``latent_shape(h, w) = (N,)``: the
packed video tokens ``(F' * H' * W', C)`` (``LTX2Pipeline._pack_latents``) flattened, then the
packed audio tokens ``(L, C_a * M')`` (``_pack_audio_latents``) flattened, both in the pipeline's
normalised space. The two streams have different token widths, hence one flat vector;
:meth:`LTX2Family.forward` unpacks it into the transformer's ``hidden_states`` and
``audio_hidden_states`` and packs the two velocities back the same way. Everything that reduces
over a latent therefore reduces over both streams: Flow-GRPO's per-step Gaussian log-prob is the
mean over all ``N`` elements (the audio counts by its share of the elements: 121 frames at
512 x 768 are 6,144 x 128 video and 126 x 128 audio numbers, 2%), and so are the forward-process
losses of DiffusionNFT, AWM and SFT. The flat length does not say the frame's aspect, so the family
remembers the grid of each size it was asked for (:meth:`latent_shape`, :meth:`sigmas`, which every
sampler, trainer and eval call first) and refuses a state of a length it has not seen.

Schedule: ``FlowMatchEulerDiscreteScheduler`` (LTX-2 folders: ``use_dynamic_shifting``,
``shift_terminal`` 0.1) with ``sigmas = linspace(1, 1/N, N)`` and ``mu`` from the number of video
tokens (``pipeline_ltx2.py:1345-1370``); the audio stream steps on the same sigmas (the pipeline's
``audio_scheduler`` is a copy). Timesteps are ``sigma * 1000`` in float32, given to the transformer
as ``timestep`` and ``sigma`` (``pipeline_ltx2.py:1412-1421``); ``frame_rate / motion_speed`` and the
latent grid set the RoPE positions.

Guidance, as ``LTX2Pipeline.__call__`` at its defaults (``pipeline_ltx2.py:945-953``): on the x0
predictions ``x0 = x_t - sigma * v`` of each stream, the guided
``x0 = pos + (g - 1)(pos - neg) + s (pos - stg) + (m - 1)(pos - iso)``, where ``neg`` is the
negative prompt's prediction (CFG, ``sampling.guidance_scale``, default 3.0), ``stg`` the prediction
with the self-attention of ``stg_blocks`` replaced by its values (spatio-temporal guidance,
``stg_scale`` 1.0, blocks ``[28]``) and ``iso`` the prediction without the audio <-> video
cross-attention (modality isolation, ``modality_scale`` 3.0); then guidance rescale (0.7,
``rescale_noise_cfg``) and back to a velocity ``(x_t - x0) / sigma`` (``pipeline_ltx2.py:1441-1590``).
The audio stream has its own scales (``model.options.audio_*``: CFG 7.0, STG 1.0, modality 3.0,
rescale 0.7); as in the pipeline, an audio scale of null or 0 takes the video one. One guided
velocity is up to four transformer calls: ``[neg, pos]`` batched, then ``stg`` and ``iso``. Every
call that asks for guidance (``negative`` given) gets all of it, in sampling and in training alike;
``negative is None`` is the plain conditional velocity (what DiffusionNFT and SFT train).

Differences from the pipeline: (1) the transformer's inputs are cast to the transformer's dtype,
where the pipeline casts them to the text encoder's (the same whenever the pipeline runs); (2) on a
transformer without ``perturbed_attn`` (LTX-2.0) the STG blocks change nothing
(``transformer_ltx2.py:644``: the perturbation mask only reaches ``LTX2PerturbedAttnProcessor``), so
the pipeline's STG forward repeats the conditional one and its term is zero up to rounding; diffrl
skips that forward; (3) the optional ``processor``, ``prompt_enhancer`` and ``duration_head``
(LTX-2.5) are not loaded: diffrl always sets ``num_frames`` and never enhances prompts, so the
pipeline would not use them either (``save_pretrained`` writes the folder without them).

Sequence parallel (``parallel.sequence``): the video and the audio tokens split over the ranks
through diffrl's context-parallel plan, not the class's (:mod:`diffrl.models.ltx2_sequence_parallel`).

``diffrl plan``: :meth:`LTX2Description.planned` builds the transformer on the meta device from the folder's
JSON files and runs :meth:`LTX2Family.call_transformer`, the very call of :meth:`LTX2Family.forward`, on
zero conditioning of the shapes a prompt encodes to. The planner counts CFG's two rows; a guided
velocity's modality-isolation (and LTX-2.3's STG) transformer calls are not in its FLOPs.

A user's checkpoint: ``model: {family: ltx2, path: /models/LTX-2, options: {num_frames: 121}}``.
For an SFT on still images set ``num_frames: 1`` (the audio of a still is the audio VAE's encoding of
silence, see :meth:`LTX2Family.encode_images`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import diffusers.pipelines.ltx2.vocoder as ltx2_vocoders
import torch
import transformers
from diffusers import (
    AutoencoderKLLTX2Audio,
    AutoencoderKLLTX2Video,
    LTX2Pipeline,
    LTX2VideoTransformer3DModel,
)
from diffusers.models.autoencoders.autoencoder_kl_ltx2_audio import LATENT_DOWNSAMPLE_FACTOR
from diffusers.pipelines.ltx2 import LTX2TextConnectors
from diffusers.pipelines.ltx2.pipeline_ltx2 import rescale_noise_cfg
from diffusers.pipelines.ltx2.utils import conditioning_frame_rate
from torch import nn
from transformers import AutoTokenizer

from diffrl.config import Range
from diffrl.core.rollout import Audio, Conditioning, Media
from diffrl.models.base import DTYPES, FrameRate, Frames, Planned, SizeRule, TextTokens, meta_model
from diffrl.models.diffusers_folder import (
    DiffusersFolderDescription,
    DiffusersFolderFamily,
    as_videos,
    load_part,
    read_json,
    read_pipeline_config,
)
from diffrl.models.flux import resolution_shifted_sigmas
from diffrl.models.ltx2_sequence_parallel import prepare_sequence_parallel

PIPELINE_CLASS = "LTX2Pipeline"
DEFAULT_SIZE = (512, 768)
"""``LTX2Pipeline.__call__``'s default height x width."""
PIPELINE_MULTIPLE = 32
"""``LTX2Pipeline.check_inputs`` refuses a height or width that is not a multiple of 32
(``pipeline_ltx2.py:476``)."""
SILENCE_LOG_MEL = math.log(1e-5)
"""The log-mel spectrogram's floor, the value of digital silence (LTX-2's audio processing takes
``log(clamp(mel, min=1e-5))``, as diffusers' ``MelSTFT``, ``pipelines/ltx2/vocoder.py:475``)."""
VOCODERS = ("LTX2Vocoder", "LTX2VocoderWithBWE")
"""The vocoder classes of ``LTX2Pipeline`` (``pipelines/ltx2/vocoder.py``)."""

SEQUENCE_HINTS = {
    "video tokens": "; change sampling.height/width or model.options.num_frames",
    "audio tokens": "; change model.options.num_frames or frame_rate",
    "video attention heads": "",
    "audio attention heads": "",
}
"""What to change when a length of :meth:`LTX2Description.sequence_lengths` does not split."""

# Every attention projection of every block: the video and audio self-attention (attn1,
# audio_attn1), text cross-attention (attn2, audio_attn2) and the audio <-> video cross-attention
# (audio_to_video_attn, video_to_audio_attn): what diffusers' LoRA scripts' to_q/k/v/out.0 hit.
LTX2_LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def audio_frames(num_frames: int, frame_rate: float, latents_per_second: float) -> int:
    """The audio latent frames of a clip of ``num_frames`` at ``frame_rate``
    (``pipeline_ltx2.py:1306-1310``)."""
    return round(num_frames / frame_rate * latents_per_second)


@dataclass(frozen=True)
class Grid:
    """The latent geometry of one sample: the video's latent ``frames x height x width`` of
    ``channels`` and the audio's ``audio_frames`` tokens of ``audio_width`` features."""

    frames: int
    height: int
    width: int
    channels: int
    audio_frames: int
    audio_width: int

    @property
    def video_size(self) -> int:
        return self.frames * self.height * self.width * self.channels

    @property
    def size(self) -> int:
        return self.video_size + self.audio_frames * self.audio_width


@dataclass(frozen=True)
class Geometry:
    """What a model's parts say about its latents: the video VAE's ``spatial`` and ``temporal``
    compression, the transformer's latent ``channels``, the audio VAE's latent frames per second
    and its latent mel bins (its packed tokens are ``latent channels x latent mel bins`` wide)."""

    spatial: int
    temporal: int
    channels: int
    audio_latents_per_second: float
    latent_mel_bins: int
    audio_width: int

    @classmethod
    def of(cls, transformer_config: Any, vae: nn.Module, audio_vae: nn.Module) -> Geometry:
        """From the transformer's config and the two VAEs (loaded, or built on the meta device by
        :meth:`LTX2Description.planned`), as the pipeline reads them (``pipeline_ltx2.py:1272-1310``)."""
        audio = audio_vae.config
        mel_bins = audio.mel_bins // audio_vae.mel_compression_ratio
        return cls(
            spatial=int(vae.spatial_compression_ratio),
            temporal=int(vae.temporal_compression_ratio),
            channels=int(transformer_config.in_channels),
            audio_latents_per_second=audio.sample_rate
            / audio.mel_hop_length
            / float(audio_vae.temporal_compression_ratio),
            latent_mel_bins=mel_bins,
            audio_width=audio.latent_channels * mel_bins,
        )

    def grid(self, height: int, width: int, num_frames: int, frame_rate: float) -> Grid:
        """The latent :class:`Grid` of a ``height x width`` video of ``num_frames`` frames at
        ``frame_rate`` (the pipeline's ``latent_num_frames``, ``latent_height``, ``latent_width`` and
        ``audio_num_frames``)."""
        if (
            height % PIPELINE_MULTIPLE
            or width % PIPELINE_MULTIPLE
            or height % self.spatial
            or width % self.spatial
        ):
            step = math.lcm(PIPELINE_MULTIPLE, self.spatial)
            raise ValueError(f"ltx2: height and width must be multiples of {step}, got {height}x{width}")
        if num_frames < 1 or (num_frames - 1) % self.temporal:
            raise ValueError(
                f"ltx2: model.options.num_frames={num_frames}; this VAE needs num_frames = {self.temporal}k + 1"
            )
        return Grid(
            frames=(num_frames - 1) // self.temporal + 1,
            height=height // self.spatial,
            width=width // self.spatial,
            channels=self.channels,
            audio_frames=audio_frames(num_frames, frame_rate, self.audio_latents_per_second),
            audio_width=self.audio_width,
        )


@dataclass(frozen=True)
class Scales:
    """The guidance scales of one guided velocity, per stream (video, audio)."""

    cfg: tuple[float, float]
    stg: tuple[float, float]
    modality: tuple[float, float]
    rescale: tuple[float, float]

    @property
    def do_cfg(self) -> bool:
        return max(self.cfg) > 1.0

    @property
    def do_stg(self) -> bool:
        return max(self.stg) > 0.0

    @property
    def do_modality(self) -> bool:
        return max(self.modality) > 1.0


# The pipeline's guidance settings (CFG, STG, modality isolation: scales as sampling.guidance_scale;
# rescale factors of rescale_noise_cfg); an audio stream's null or 0 takes the video stream's.
StgScale = Annotated[float, Range(0, 100, hint="0: off")]
ModalityScale = Annotated[float, Range(0, 100, hint="1: off")]
Rescale = Annotated[float, Range(0, 1, hint="rescale_noise_cfg's factor; 0: off")]
AudioGuidance = Annotated[float, Range(0, 100, hint="null or 0: sampling.guidance_scale")]
AudioStg = Annotated[float, Range(0, 100, hint="null or 0: stg_scale")]
AudioModality = Annotated[float, Range(0, 100, hint="null or 0: modality_scale")]
AudioRescale = Annotated[float, Range(0, 1, hint="null or 0: guidance_rescale")]


class LTX2Description(DiffusersFolderDescription):
    """What :class:`LTX2Family` declares (static): the LTX-2 folder's checks, the frame, size and
    sequence rules of both streams, and the plan."""

    name = "ltx2"
    pipeline_class = PIPELINE_CLASS
    transformer_class = "LTX2VideoTransformer3DModel"
    default_guidance = 3.0
    """``LTX2Pipeline.__call__``'s ``guidance_scale`` (the video stream's CFG)."""
    default_lora_targets = LTX2_LORA_TARGETS
    sound = True
    sequence_parallel = True
    """Through diffrl's plan (:mod:`diffrl.models.ltx2_sequence_parallel`), not the class's: the video
    and the audio tokens split, their self-attentions Ulysses; the text and the audio <-> video
    cross-attentions run locally on each rank (the text whole, the other stream's keys gathered)."""
    sequence_hints = SEQUENCE_HINTS

    @dataclass
    class Options:
        num_frames: Frames = 121
        """Frames per video (the pipeline's default; ``num_frames = 8k + 1`` for LTX-2's VAE, in
        general ``(num_frames - 1)`` a multiple of the VAE's temporal compression; 1: stills)."""
        frame_rate: FrameRate = 24.0
        """Playback frames per second: sets the audio's length and, over ``motion_speed``, the
        RoPE positions (the pipeline's ``frame_rate``)."""
        motion_speed: Annotated[float, Range(0, 100, lo_open=True, hint="e.g. 1.0")] = 1.0
        """The pipeline's ``motion_speed``: the transformer sees ``frame_rate / motion_speed``."""
        max_sequence_length: TextTokens = 1024
        """Gemma tokens (the pipeline's default; a multiple of the connectors' learnable registers)."""
        audio_guidance_scale: AudioGuidance | None = 7.0
        """CFG of the audio stream (the pipeline's default); null or 0: ``sampling.guidance_scale``."""
        stg_scale: StgScale = 1.0
        """Spatio-temporal guidance of the video stream (0: off)."""
        audio_stg_scale: AudioStg | None = 1.0
        """STG of the audio stream; null or 0: ``stg_scale`` (as the pipeline)."""
        stg_blocks: list[Annotated[int, Range(0, 1023, hint="a transformer block")]] = field(
            default_factory=lambda: [28]
        )
        """The blocks whose self-attention STG perturbs (the pipeline's
        ``spatio_temporal_guidance_blocks``; diffusers suggests [29] for LTX-2.0, [28] for 2.3)."""
        modality_scale: ModalityScale = 3.0
        """Modality-isolation guidance of the video stream (1: off)."""
        audio_modality_scale: AudioModality | None = 3.0
        """Of the audio stream; null or 0: ``modality_scale``."""
        guidance_rescale: Rescale = 0.7
        """``rescale_noise_cfg``'s factor for the video stream (0: off)."""
        audio_guidance_rescale: AudioRescale | None = 0.7
        """For the audio stream; null or 0: ``guidance_rescale``."""
        use_cross_timestep: bool = True
        """The pipeline's default (LTX-2.3 and later); false is LTX-2.0's own behaviour."""
        gradient_checkpointing: bool = False
        text_encoder_dtype: str = "float32"
        """dtype of the frozen Gemma 3 and the connectors (``bfloat16`` saves memory: Gemma 3 12B)."""
        vae_dtype: str = "float32"
        """dtype of the frozen video VAE, audio VAE and vocoder."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        problems = super().folder_problems(folder)
        if problems:
            return problems
        subs = ("text_encoder", "tokenizer", "connectors", "vae", "audio_vae", "vocoder")
        problems = [f"{str(folder)!r} has no {sub}/ folder" for sub in subs if not (folder / sub).is_dir()]
        settings = read_json(folder / "transformer" / "config.json") or {}
        for key in ("patch_size", "patch_size_t"):
            if settings.get(key, 1) != 1:
                problems.append(
                    f"{str(folder)!r}: transformer {key}={settings[key]}; diffrl's ltx2 family (and "
                    f"LTX2Pipeline's packing) takes patch size 1, as every LTX-2 checkpoint"
                )
        index = read_pipeline_config(folder)
        text_encoder = (index.get("text_encoder") or [None, None])[1]
        if not (isinstance(text_encoder, str) and hasattr(transformers, text_encoder)):
            problems.append(
                f"{str(folder)!r}: text encoder class {text_encoder!r} (model_index.json) is not a "
                f"class of the installed transformers {transformers.__version__}"
            )
        vocoder = (index.get("vocoder") or [None, None])[1]
        if vocoder not in VOCODERS:
            problems.append(f"{str(folder)!r}: vocoder class {vocoder!r} is not one of {', '.join(VOCODERS)}")
        return problems

    @classmethod
    def _ratios(cls, config, check_files: bool) -> tuple[int, int] | None:
        """The VAE's (spatial, temporal) compression from ``vae/config.json``, as
        ``AutoencoderKLLTX2Video.__init__`` derives them (``autoencoder_kl_ltx2.py:1151-1160``)."""
        setting = lambda key: cls.component_setting(  # noqa: E731
            config, check_files, "vae", "AutoencoderKLLTX2Video", key
        )
        scaling = setting("spatio_temporal_scaling")
        if scaling is None:
            return None
        if isinstance(scaling, bool):  # one flag for every down block (the class's own expansion)
            scaling = [scaling] * (len(setting("layers_per_block")) - 1)
        n = sum(scaling)
        spatial = setting("spatial_compression_ratio") or setting("patch_size") * 2**n
        temporal = setting("temporal_compression_ratio") or setting("patch_size_t") * 2**n
        return int(spatial), int(temporal)

    @classmethod
    def makes_videos(cls, config) -> bool:
        return True

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        o = cls.bound_options(config)  # a value out of its range is reported above, once
        frames, ratios = o.num_frames, cls._ratios(config, check_files)
        temporal = ratios[1] if ratios else None
        if temporal and (frames - 1) % temporal:
            below = (frames - 1) // temporal * temporal + 1
            errors.append(
                f"model.options.num_frames: {frames} frames do not fit this LTX-2 VAE "
                f"({temporal}x temporal compression), which needs num_frames = {temporal}k + 1; "
                f"e.g. {below} or {below + temporal}"
            )
        length = o.max_sequence_length
        registers = {
            cls.component_setting(
                config,
                check_files,
                "connectors",
                "LTX2TextConnectors",
                f"{s}_connector_num_learnable_registers",
            )
            for s in ("video", "audio")
        } - {None}
        bad = [r for r in registers if length % int(r)]
        if bad:
            errors.append(
                f"model.options.max_sequence_length={length} is not a multiple of the connectors' "
                f"{bad[0]} learnable registers (LTX2TextConnectors refuses it); e.g. "
                f"{max(int(bad[0]), length // int(bad[0]) * int(bad[0]))}"
            )
        blocks = o.stg_blocks
        if not blocks and (o.stg_scale > 0 or (o.audio_stg_scale or 0) > 0):
            errors.append(
                "model.options.stg_blocks is empty while STG is on (stg_scale or audio_stg_scale > 0); "
                "name the blocks (e.g. [28]) or set stg_scale: 0 and audio_stg_scale: 0"
            )
        layers = cls.component_setting(
            config, check_files, "transformer", cls.transformer_class, "num_layers"
        )
        if layers is not None:
            outside = [b for b in blocks if not 0 <= b < layers]
            if outside:
                errors.append(
                    f"model.options.stg_blocks: {outside} are not blocks of this {layers}-block "
                    f"transformer (0 to {layers - 1}); STG would silently do nothing there"
                )
        return errors

    @classmethod
    def size_rule(cls, config, check_files: bool = True) -> SizeRule | None:
        ratios = cls._ratios(config, check_files)
        if ratios is None:
            return None
        step = math.lcm(PIPELINE_MULTIPLE, ratios[0])
        return SizeRule(
            step,
            f"LTX2Pipeline takes multiples of {PIPELINE_MULTIPLE}; the VAE's {ratios[0]}x spatial compression",
        )

    @classmethod
    def sequence_lengths(cls, config, check_files: bool = True) -> dict[str, int] | None:
        """The video tokens ``F' x H' x W'`` (patch 1), the audio tokens (:func:`audio_frames`), and
        the heads of the video and the audio self-attention, which go Ulysses; the text is not split
        (the cross-attentions run locally, :mod:`diffrl.models.ltx2_sequence_parallel`)."""
        ratios = cls._ratios(config, check_files)
        setting = lambda sub, name, key: cls.component_setting(  # noqa: E731
            config, check_files, sub, name, key
        )
        heads = setting("transformer", cls.transformer_class, "num_attention_heads")
        audio_heads = setting("transformer", cls.transformer_class, "audio_num_attention_heads")
        rate = setting("audio_vae", "AutoencoderKLLTX2Audio", "sample_rate")
        hop = setting("audio_vae", "AutoencoderKLLTX2Audio", "mel_hop_length")
        o = config.model.options
        frames = o.get("num_frames", cls.Options.num_frames)
        frame_rate = o.get("frame_rate", cls.Options.frame_rate)
        if None in (ratios, heads, audio_heads, rate, hop) or not isinstance(frames, int) or frames < 1:
            return None
        if not isinstance(frame_rate, int | float) or frame_rate <= 0 or (frames - 1) % ratios[1]:
            return None  # validate_config reports it
        height, width = config.sampling.height or DEFAULT_SIZE[0], config.sampling.width or DEFAULT_SIZE[1]
        video = ((frames - 1) // ratios[1] + 1) * (height // ratios[0]) * (width // ratios[0])
        audio = audio_frames(frames, frame_rate, rate / hop / float(LATENT_DOWNSAMPLE_FACTOR))
        return {
            "video tokens": video,
            "audio tokens": audio,
            "video attention heads": int(heads),
            "audio attention heads": int(audio_heads),
        }

    @classmethod
    def sequence_parallel_modules(cls, module: nn.Module) -> list[nn.Module]:
        """The transformer, readied for diffrl's plan (:func:`prepare_sequence_parallel`: its
        ``_cp_plan``, the local cross-attentions' processors and key / value gathers)."""
        return [prepare_sequence_parallel(module)]

    @classmethod
    def planned(cls, config, folder: Path) -> Planned | None:
        """The transformer of ``folder/transformer/config.json`` and one :meth:`call_transformer` at
        ``config``'s size, frames and options: the grid from the VAE's and the audio VAE's settings
        (both built on the meta device, read by :meth:`Geometry.of` as the loaded family reads
        them), ``num_train_timesteps`` from the scheduler's, and zero conditioning as
        :meth:`_encode_prompts` gives it: ``max_sequence_length`` tokens as wide as the connectors'
        outputs, in ``text_encoder_dtype``, and an all-ones int64 mask (a full prompt; the
        connectors' learnable registers fill any padding, so theirs is always all ones)."""
        settings = read_json(folder / "transformer" / "config.json")
        if settings is None:
            return None
        part = lambda sub, name="config.json": read_json(folder / sub / name) or {}  # noqa: E731
        dtype = DTYPES[config.model.dtype]
        module = meta_model(LTX2VideoTransformer3DModel, settings, dtype)
        options = cls.parse_options(config.model.options)
        if options.gradient_checkpointing:
            module.enable_gradient_checkpointing()
        with torch.device("meta"):  # their settings only: no weights, no memory
            vae = AutoencoderKLLTX2Video.from_config(part("vae"))
            audio_vae = AutoencoderKLLTX2Audio.from_config(part("audio_vae"))
            connectors = LTX2TextConnectors.from_config(part("connectors"))
        height, width = config.sampling.height or DEFAULT_SIZE[0], config.sampling.width or DEFAULT_SIZE[1]
        grid = Geometry.of(module.config, vae, audio_vae).grid(
            height, width, options.num_frames, options.frame_rate
        )
        steps = int(part("scheduler", "scheduler_config.json").get("num_train_timesteps", 1000))
        tokens, text_dtype = options.max_sequence_length, DTYPES[options.text_encoder_dtype]
        widths = connectors.video_connector.inner_dim, connectors.audio_connector.inner_dim

        def forward(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, **variant) -> torch.Tensor:
            b = len(x_t)
            tensors = {
                "encoder_hidden_states": x_t.new_zeros(b, tokens, widths[0], dtype=text_dtype),
                "audio_encoder_hidden_states": x_t.new_zeros(b, tokens, widths[1], dtype=text_dtype),
                "encoder_attention_mask": x_t.new_ones(b, tokens, dtype=torch.int64),
            }
            return LTX2Family.call_transformer(m, x_t, sigma, tensors, grid, options, steps, **variant)

        s = LTX2Family.scales_of(options, config.sampling.guidance_scale or cls.default_guidance)
        do_stg = s.do_stg and bool(module.config.perturbed_attn)  # as velocity(): LTX-2.0's STG is no pass

        def guided(m: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor) -> torch.Tensor:
            """:meth:`LTX2Family.velocity`'s passes. The STG pass runs unperturbed: on fake tensors
            diffusers' ``if all_perturbed`` (``transformer_ltx2.py``), by which the STG blocks skip
            their self-attention in that pass, cannot be decided; the plan is that much over."""
            v_neg = None
            if s.do_cfg:
                v_neg, v_pos = forward(m, torch.cat([x_t, x_t]), torch.cat([sigma, sigma])).chunk(2)
            else:
                v_pos = forward(m, x_t, sigma)
            v_stg = forward(m, x_t, sigma) if do_stg else None
            v_iso = forward(m, x_t, sigma, isolate=True) if s.do_modality else None
            return LTX2Family.guide_passes(x_t, sigma, grid, s, v_pos, v_neg, v_stg, v_iso)

        rows = 1 + int(s.do_cfg) + int(do_stg) + int(s.do_modality)  # the guided velocity's passes
        description = "LTX2VideoTransformer3DModel (video + audio streams)"
        return Planned(
            module,
            (grid.size,),
            forward,
            description,
            guided_rows=max(2, rows),
            guided=None if rows == 2 and s.do_cfg else guided,  # CFG alone: one forward of both rows
        )


class LTX2Family(DiffusersFolderFamily):
    """LTX-2 audio + video. ``x_t (B, N)``: the packed, normalised video tokens then audio tokens,
    flattened (see the module docstring); log-probs and losses average over both streams."""

    description = LTX2Description

    components = ("vae", "audio_vae", "text_encoder", "tokenizer", "connectors", "transformer", "vocoder")

    def __init__(self, parts, pipeline_config, scheduler_config, device, options):
        super().__init__(parts, pipeline_config, scheduler_config, device, options)
        if self.tokenizer.pad_token is None:  # as the pipeline (pipeline_ltx2.py:333)
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.tokenizer.padding_side = "left"  # Gemma's chat-style left padding, as the pipeline
        self.num_train_timesteps = int(self.scheduler_config.get("num_train_timesteps", 1000))
        # as sequence_lengths, which reads the same settings before loading
        self.geometry = Geometry.of(self.transformer.config, self.vae, self.audio_vae)
        self._grids: dict[int, Grid] = {}
        self._silence: dict[int, torch.Tensor] = {}

    # ---- construction --------------------------------------------------------------------------

    @classmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options) -> dict[str, Any]:
        index = read_pipeline_config(folder)
        text_dtype, vae_dtype = DTYPES[options.text_encoder_dtype], DTYPES[options.vae_dtype]
        text_encoder_class = getattr(transformers, index["text_encoder"][1])
        return {
            "transformer": load_part(folder, "transformer", LTX2VideoTransformer3DModel, dtype),
            "vae": load_part(folder, "vae", AutoencoderKLLTX2Video, vae_dtype),
            "audio_vae": load_part(folder, "audio_vae", AutoencoderKLLTX2Audio, vae_dtype),
            "text_encoder": load_part(folder, "text_encoder", text_encoder_class, text_dtype),
            "tokenizer": load_part(folder, "tokenizer", AutoTokenizer),
            "connectors": load_part(folder, "connectors", LTX2TextConnectors, text_dtype),
            "vocoder": load_part(folder, "vocoder", getattr(ltx2_vocoders, index["vocoder"][1]), vae_dtype),
        }

    # ---- geometry ------------------------------------------------------------------------------
    @property
    def default_size(self) -> tuple[int, int]:
        return DEFAULT_SIZE

    def grid(self, height: int, width: int) -> Grid:
        """The latent :class:`Grid` of a ``height x width`` video of ``options.num_frames`` frames
        at ``options.frame_rate`` (:meth:`Geometry.grid`)."""
        return self.geometry.grid(height, width, self.options.num_frames, self.options.frame_rate)

    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """``(N,)``: ``N = F' * H' * W' * C`` video numbers, then ``L * C_a * M'`` audio numbers."""
        grid = self.grid(height, width)
        known = self._grids.setdefault(grid.size, grid)
        if known != grid:
            raise ValueError(
                f"ltx2: a {height}x{width} latent has as many numbers ({grid.size}) as the "
                f"{known.height * self.geometry.spatial}x{known.width * self.geometry.spatial} one used "
                f"before; the flat state cannot tell them apart: use one of the two sizes per process"
            )
        return (grid.size,)

    def grid_of(self, latents: torch.Tensor) -> Grid:
        """The :class:`Grid` of ``latents (B, N)``: of a size :meth:`latent_shape` was asked for."""
        n = latents.shape[-1]
        if latents.ndim == 2 and n not in self._grids and self.grid(*self.default_size).size == n:
            self.latent_shape(*self.default_size)  # the pipeline's default size needs no asking
        if latents.ndim != 2 or n not in self._grids:
            raise ValueError(
                f"ltx2: a latent of shape {tuple(latents.shape)} is not (B, N) of a size this family "
                f"was asked for ({sorted(self._grids)}); call family.latent_shape(height, width) first"
            )
        return self._grids[n]

    @staticmethod
    def split(x: torch.Tensor, grid: Grid) -> tuple[torch.Tensor, torch.Tensor]:
        """``x (B, N)`` -> packed video ``(B, F' H' W', C)`` and audio ``(B, L, C_a M')`` tokens."""
        video, audio = x.split([grid.video_size, x.shape[1] - grid.video_size], dim=1)
        return (
            video.reshape(len(x), -1, grid.channels),
            audio.reshape(len(x), grid.audio_frames, grid.audio_width),
        )

    @staticmethod
    def join(video: torch.Tensor, audio: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`split`: ``(B, S_v, C)``, ``(B, L, D)`` -> ``(B, N)``."""
        return torch.cat([video.flatten(1), audio.flatten(1)], dim=1)

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """The pipeline's ``(num_steps + 1,)`` schedule: ``linspace(1, 1/N, N)`` through the folder's
        scheduler with ``mu`` from the video token count, then the final 0 (a numeric ``shift``:
        :meth:`ModelFamily.sigmas`'s static one). Remembers the size's grid (:meth:`latent_shape`)."""
        self.latent_shape(height, width)
        if shift is not None:
            return super().sigmas(num_steps, shift, height, width)
        g = self.grid(height, width)
        return resolution_shifted_sigmas(self.scheduler_config, num_steps, g.frames * g.height * g.width)

    # ---- text ----------------------------------------------------------------------------------
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """-> ``encoder_hidden_states (B, T, D)`` and ``audio_encoder_hidden_states (B, T, D_a)``
        (the connectors' outputs) and their ``encoder_attention_mask (B, T)`` (int64), with
        ``T = max_sequence_length`` (``pipeline_ltx2.py:303-365`` and ``:1248-1253``)."""
        inputs = self.tokenizer(
            [p.strip() for p in prompts],
            padding="max_length",
            max_length=self.options.max_sequence_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        ids, mask = inputs.input_ids.to(self.device), inputs.attention_mask.to(self.device)
        # the decoder stack only (the hidden states the pipeline reads, without the vocabulary head)
        encoder = getattr(self.text_encoder, "model", self.text_encoder)
        states = encoder(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        embeds = torch.stack(states, dim=-1).flatten(2, 3).to(self.text_encoder.dtype)
        video, audio, mask = self.connectors(embeds, mask, padding_side=self.tokenizer.padding_side)
        return {
            "encoder_hidden_states": video,
            "audio_encoder_hidden_states": audio,
            "encoder_attention_mask": mask,
        }

    # ---- the velocity forward ------------------------------------------------------------------
    _variant: tuple[bool, bool] = (False, False)
    """(stg, isolate) of the forward under way: set by :meth:`_pass` for the guidance passes."""

    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One transformer call: ``x_t (B, N)``, ``sigma (B,)`` -> both streams' velocities ``(B, N)``;
        inside :meth:`_pass`, with the STG blocks perturbed or the audio <-> video cross-attention
        off, as the pipeline's extra guidance passes."""
        stg, isolate = self._variant
        return self.call_transformer(
            module,
            x_t,
            sigma,
            cond.tensors,
            self.grid_of(x_t),
            self.options,
            self.num_train_timesteps,
            stg=stg,
            isolate=isolate,
        )

    @classmethod
    def call_transformer(
        cls,
        module: nn.Module,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        tensors: dict[str, torch.Tensor],
        grid: Grid,
        options: LTX2Description.Options,
        num_train_timesteps: int,
        stg: bool = False,
        isolate: bool = False,
    ) -> torch.Tensor:
        """:meth:`forward`'s transformer call on ``x_t (B, N)`` of ``grid``, conditioned on
        ``tensors`` (:meth:`_encode_prompts`'): both streams' velocities ``(B, N)``. Also what
        :meth:`planned` runs, so that ``diffrl plan`` measures this very call."""
        dtype = module.proj_in.weight.dtype
        video, audio = cls.split(x_t, grid)
        timestep = sigma.float() * num_train_timesteps  # the scheduler's float32 timesteps
        mask = tensors["encoder_attention_mask"].to(x_t.device)
        v_video, v_audio = module(
            hidden_states=video.to(dtype),
            audio_hidden_states=audio.to(dtype),
            encoder_hidden_states=tensors["encoder_hidden_states"].to(x_t.device, dtype),
            audio_encoder_hidden_states=tensors["audio_encoder_hidden_states"].to(x_t.device, dtype),
            timestep=timestep,
            sigma=timestep,  # as the pipeline (LTX-2.3's prompt modulation reads it)
            encoder_attention_mask=mask,
            audio_encoder_attention_mask=mask,
            num_frames=grid.frames,
            height=grid.height,
            width=grid.width,
            fps=conditioning_frame_rate(options.frame_rate, options.motion_speed),
            audio_num_frames=grid.audio_frames,
            isolate_modalities=isolate,
            spatio_temporal_guidance_blocks=list(options.stg_blocks) if stg else None,
            use_cross_timestep=options.use_cross_timestep,
            return_dict=False,
        )
        return cls.join(v_video, v_audio)

    def _pass(self, module: nn.Module, x_t, sigma, cond, stg: bool = False, isolate: bool = False):
        """A guidance pass (STG or modality isolation) through the base ``_forward`` (the run's
        numerics and FLOP meter)."""
        self._variant = (stg, isolate)
        try:
            return self._forward(module, x_t, sigma, cond)
        finally:
            self._variant = (False, False)

    def scales(self, guidance_scale: float) -> Scales:
        """The per-stream scales of a guided velocity, the audio ones falling back to the video ones
        when null or 0 (``pipeline_ltx2.py:1157-1160``)."""
        return self.scales_of(self.options, guidance_scale)

    @staticmethod
    def scales_of(o: Any, guidance_scale: float) -> Scales:
        """:meth:`scales` for the options ``o``."""
        return Scales(
            cfg=(guidance_scale, o.audio_guidance_scale or guidance_scale),
            stg=(o.stg_scale, o.audio_stg_scale or o.stg_scale),
            modality=(o.modality_scale, o.audio_modality_scale or o.modality_scale),
            rescale=(o.guidance_rescale, o.audio_guidance_rescale or o.guidance_rescale),
        )

    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None:
        """The negative prompt's conditioning whenever any guidance is on (CFG of either stream,
        STG or modality isolation: the pipeline guides even at ``guidance_scale`` 1); None: off."""
        s = self.scales(guidance_scale)
        if not (s.do_cfg or s.do_stg or s.do_modality):
            return None
        one = self.encode_prompts([prompt])
        return one if cond is None else one.repeat(len(cond))

    def velocity(
        self,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
        negative: Conditioning | None = None,
        module: nn.Module | None = None,
    ) -> torch.Tensor:
        """``(B, N)`` float32: the conditional velocity (``negative`` None), else the pipeline's
        guided one (CFG, STG, modality isolation, rescale on the x0 predictions of each stream;
        ``pipeline_ltx2.py:1404-1590``). ``sigma (B,)`` must be > 0 when guided (every step's is)."""
        module = module or self.transformer
        if negative is None:
            return self._forward(module, x_t, sigma, cond)
        s = self.scales(guidance_scale)
        v_neg = None
        if s.do_cfg:  # one batched forward of [negative, positive], as the pipeline
            both = self._forward(
                module, torch.cat([x_t, x_t]), torch.cat([sigma, sigma]), self._joint(negative, cond)
            )
            v_neg, v_pos = both.chunk(2)
        else:
            v_pos = self._forward(module, x_t, sigma, cond)
        # without perturbed attention (LTX-2.0) the STG blocks change nothing: the pass would be v_pos
        do_stg = s.do_stg and bool(self.transformer.config.perturbed_attn)
        v_stg = self._pass(module, x_t, sigma, cond, stg=True) if do_stg else None
        v_iso = self._pass(module, x_t, sigma, cond, isolate=True) if s.do_modality else None
        return self.guide_passes(x_t, sigma, self.grid_of(x_t), s, v_pos, v_neg, v_stg, v_iso)

    @classmethod
    def guide_passes(
        cls,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        grid: Grid,
        s: Scales,
        v_pos: torch.Tensor,
        v_neg: torch.Tensor | None,
        v_stg: torch.Tensor | None,
        v_iso: torch.Tensor | None,
    ) -> torch.Tensor:
        """The guided velocity ``(B, N)`` float32 from its passes' velocities (None: a pass not run),
        on the x0 predictions of each stream (``pipeline_ltx2.py:1404-1590``)."""
        x, sig = cls.split(x_t.float(), grid), sigma.float().view(-1, 1, 1)
        parts = [cls.split(v, grid) if v is not None else (None, None) for v in (v_pos, v_neg, v_stg, v_iso)]
        out = []
        for k in range(2):  # video, then audio
            pos, neg, stg, iso = (None if p[k] is None else x[k] - p[k] * sig for p in parts)
            x0 = pos
            if neg is not None:
                x0 = x0 + (s.cfg[k] - 1) * (pos - neg)
            if stg is not None:
                x0 = x0 + s.stg[k] * (pos - stg)
            if iso is not None:
                x0 = x0 + (s.modality[k] - 1) * (pos - iso)
            if s.rescale[k] > 0:
                x0 = rescale_noise_cfg(x0, pos, guidance_rescale=s.rescale[k])
            out.append((x[k] - x0) / sig)
        return cls.join(*out)

    # ---- pixels <-> latents --------------------------------------------------------------------
    @torch.no_grad()
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` (one-frame videos) or videos ``(B, 3, F, H, W)`` in [0, 1] ->
        ``x0 (B, N)``: the VAE's mode, normalised and packed, one video at a time; the audio part is
        the audio VAE's encoding of silence (a log-mel spectrogram at its floor,
        :data:`SILENCE_LOG_MEL`) of the clip's length: what a silent clip is to LTX-2, the one
        defensible sound for a still image or a video without a track."""
        images = as_videos(self, images)
        if images.shape[2] != self.options.num_frames:
            raise ValueError(
                f"ltx2: videos of {images.shape[2]} frames given while model.options.num_frames="
                f"{self.options.num_frames}"
            )
        grid = self.grid(images.shape[3], images.shape[4])
        self.latent_shape(images.shape[3], images.shape[4])
        x = (images * 2.0 - 1.0).to(self.device, self.vae.dtype)
        z = torch.cat([self.vae.encode(v[None]).latent_dist.mode() for v in x])
        z = LTX2Pipeline._normalize_latents(
            z.float(), self.vae.latents_mean, self.vae.latents_std, self.vae.config.scaling_factor
        )
        video = LTX2Pipeline._pack_latents(z, 1, 1)
        audio = self.silence(grid.audio_frames).expand(len(images), -1, -1)
        return self.join(video, audio)

    def silence(self, audio_frames: int) -> torch.Tensor:
        """``(1, L, C_a M')``: the packed, normalised latents of ``L`` audio latent frames of silence."""
        if audio_frames not in self._silence:
            ratio = self.audio_vae.temporal_compression_ratio
            mel_frames = (audio_frames - 1) * ratio + 1  # the causal encoder keeps the first frame
            cfg = self.audio_vae.config
            mel = torch.full(
                (1, cfg.in_channels, mel_frames, cfg.mel_bins),
                SILENCE_LOG_MEL,
                device=self.device,
                dtype=self.audio_vae.dtype,
            )
            z = self.audio_vae.encode(mel).latent_dist.mode().float()
            if z.shape[2] != audio_frames:
                raise ValueError(
                    f"ltx2: the audio VAE encodes {mel_frames} mel frames to {z.shape[2]}, not {audio_frames}"
                )
            packed = LTX2Pipeline._pack_audio_latents(z)
            self._silence[audio_frames] = LTX2Pipeline._normalize_audio_latents(
                packed, self.audio_vae.latents_mean, self.audio_vae.latents_std
            )
        return self._silence[audio_frames]

    def unpack(self, latents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``latents (B, N)`` -> the pipeline's ``output_type="latent"`` outputs: denormalised
        video latents ``(B, C, F', H', W')`` and audio latents ``(B, C_a, L, M')``
        (``pipeline_ltx2.py:1614-1633``)."""
        grid = self.grid_of(latents)
        video, audio = self.split(latents.float(), grid)
        video = LTX2Pipeline._unpack_latents(video, grid.frames, grid.height, grid.width, 1, 1)
        video = LTX2Pipeline._denormalize_latents(
            video, self.vae.latents_mean, self.vae.latents_std, self.vae.config.scaling_factor
        )
        audio = LTX2Pipeline._denormalize_audio_latents(
            audio, self.audio_vae.latents_mean, self.audio_vae.latents_std
        )
        audio = LTX2Pipeline._unpack_audio_latents(
            audio, grid.audio_frames, num_mel_bins=self.geometry.latent_mel_bins
        )
        return video, audio

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, N)`` -> videos ``(B, 3, F, H, W)`` in [0, 1], one at a time, as the
        pipeline decodes (``pipeline_ltx2.py:1634-1660``; decode timestep 0, no decode noise)."""
        grid = self.grid_of(latents)
        video, _ = self.split(latents.to(self.device).float(), grid)
        # the pipeline casts to the text encoder's dtype before denormalising, then to the VAE's
        video = LTX2Pipeline._unpack_latents(
            video.to(self.text_encoder.dtype), grid.frames, grid.height, grid.width, 1, 1
        )
        z = LTX2Pipeline._denormalize_latents(
            video, self.vae.latents_mean, self.vae.latents_std, self.vae.config.scaling_factor
        ).to(self.vae.dtype)
        timestep = None
        if self.vae.config.timestep_conditioning:  # decode_timestep 0.0 (the pipeline's default)
            timestep = torch.zeros(1, device=self.device, dtype=z.dtype)
        frames = torch.cat([self.vae.decode(v[None], timestep, return_dict=False)[0] for v in z])
        return (frames.float() * 0.5 + 0.5).clamp(0.0, 1.0)

    @torch.no_grad()
    def decode_media(self, latents: torch.Tensor) -> Media:
        """``latents (B, N)`` -> :class:`~diffrl.core.rollout.Media`: the videos (:meth:`decode`), the
        vocoder's waveform ``(B, channels, samples)`` at its ``output_sampling_rate`` (the pipeline's
        ``audio``, ``pipeline_ltx2.py:1662-1664``) and ``frame_rate`` as the fps."""
        _, audio = self.unpack(latents.to(self.device))
        mel = self.audio_vae.decode(audio.to(self.audio_vae.dtype), return_dict=False)[0]
        waveform = self.vocoder(mel.to(self.vocoder.dtype)).float()
        return Media(
            self.decode(latents),
            Audio(waveform, int(self.vocoder.config.output_sampling_rate)),
            float(self.options.frame_rate),
        )
