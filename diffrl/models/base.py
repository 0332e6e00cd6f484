"""The model-family adapter: everything model-specific lives behind this interface.

A family (``tiny``, SD3/SD3.5, FLUX.1, Qwen-Image, Wan, ...) is one file implementing two classes
plus a registry entry: a :class:`ModelFamily`, the loaded model, which provides :class:`FamilyRuntime`
(the calls the loop makes: encode, velocity, decode, latents, LoRA targets, export), and beside it a
:class:`FamilyDescription`, the static half (class attributes and classmethods only, nothing
loaded): what the family declares (its name, options, defaults, capabilities) for the checks, the
planner's sizes and the parallel hooks. The runtime class names its description
(``ModelFamily.description``). The trainer, the samplers and the algorithms only call these;
nothing outside ``models/`` branches on a family's name.

Conventions (as diffusers' flow-matching pipelines):
- ``x_t = (1 - sigma) * x0 + sigma * noise`` with sigma in [0, 1]; sigma = 1 is pure noise.
- The transformer predicts the velocity ``v = noise - x0``; an Euler step is
  ``x_{next} = x_t + (sigma_next - sigma) * v``.
"""

from __future__ import annotations

import gc
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Protocol, Self

import torch
from torch import nn

from diffrl.config import Config, ConfigError, Range, bind_dataclass
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.rollout import Conditioning, Media, Source
from diffrl.core.user_code import is_diffrl_module, kind, returned_wrong
from diffrl.core.user_files import UserFileError, layer_count_problem, read_text
from diffrl.models.numerics import ForwardMeter, Numerics, autocast, prepare
from diffrl.models.schedules import flow_sigmas

FAMILY_FILE = "diffrl_model.json"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
"""The dtypes a recipe names (``model.dtype``, ``model.options.*_dtype``, ``diffrl export --dtype``)."""


# The ranges of options several families share (each ``Options`` declares its own; the binder checks
# them, naming the key and the range).
TextTokens = Annotated[int, Range(1, 32_768, hint="text tokens per prompt")]
"""Tokens of a prompt for a family whose text encoder is a language model (32k: their context)."""
Frames = Annotated[int, Range(1, 10_001, hint="frames per video; 1: stills")]
"""Frames per video: 10,001 is minutes of video at any frame rate, and fits every VAE's 4k + 1 / 8k + 1."""
FrameRate = Annotated[float, Range(0, 1000, lo_open=True, hint="frames per second, e.g. 24")]


class FamilyMismatchError(DiffrlError, ValueError):
    """Weights or a checkpoint made for one model family given to another."""


class SourceError(DiffrlError, ValueError):
    """A source image an editing family cannot take (e.g. one that resizes to another size than
    the run's other sources: rows are batched)."""


@dataclass(frozen=True)
class SizeRule:
    """What ``sampling.height`` and ``sampling.width`` must be for a family's model."""

    multiple: int
    """Both must be multiples of this many pixels (VAE downsampling x patch size)."""
    why: str
    """Where the multiple comes from, for the error message, e.g. ``"its patch size 4"``."""
    max_side: int | None = None
    """The largest side the model takes (a learned position embedding's extent), if any."""
    max_why: str = ""


SHIPPED_CONFIGS = Path(__file__).resolve().parent / "assets" / "configs"
"""Real models' JSON files without weights (``assets/configs/README.md``), for ``diffrl plan``."""


def _length_fix(what: str) -> str:
    """What to change when ``what`` (a :meth:`FamilyDescription.sequence_lengths` entry) does not split:
    nothing for the model's heads, the named setting where the entry names one, else the size."""
    if what == "attention heads" or "(" in what:
        return ""
    return "; change sampling.height/width or the frame count"


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _config_files_problem(e: Exception | None, what: str = "") -> str:
    """model.path's JSON files hold values of the wrong type for the size rules (``patch_size: "x"``)."""
    detail = " ".join(f"{type(e).__name__}: {e}".split())[:300] if e is not None else what
    return (
        f"model.path: the model's config.json files give no size rule ({detail}): a value of the wrong "
        "type; replace the folder with the model's own files"
    )


def meta_model(model_cls: type, settings: dict[str, Any], dtype: torch.dtype) -> nn.Module:
    """A diffusers model built from its ``config.json`` settings on the meta device (no weights,
    no memory) in ``dtype``, but for the modules its class keeps in float32
    (``_keep_in_fp32_modules``), as ``from_pretrained(torch_dtype=dtype)`` loads them."""
    if problem := layer_count_problem(settings):
        raise DiffrlError(
            f"model.path: the transformer's config.json cannot build a {model_cls.__name__} ({problem}); "
            "replace the folder with the model's own files"
        )
    try:
        with torch.device("meta"):
            model = model_cls.from_config(settings)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, ZeroDivisionError) as e:
        # a config.json of the user's folder with values of the wrong type (patch_size "x")
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:300]
        raise DiffrlError(
            f"model.path: the transformer's config.json cannot build a {model_cls.__name__} ({detail}); "
            "replace the folder with the model's own files"
        ) from e
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    for name, p in model.named_parameters():
        wanted = torch.float32 if any(k in name for k in keep) else dtype
        if p.is_floating_point():
            p.data = p.data.to(wanted)
    return model


@dataclass(frozen=True)
class Exported:
    """What :meth:`ModelFamily.export` wrote."""

    adapter: bool
    """True: the LoRA adapter alone, for the base model's pipeline; False: a whole model folder."""
    load: str | None
    """How diffusers loads it, as ``; ``-separated Python statements (``diffrl export`` prints them
    one a line); None when no diffusers class reads it."""


@dataclass
class Planned:
    """A family's trainable transformer built on the meta device for ``diffrl plan`` (no weights),
    and how to run it at a recipe's size on synthetic conditioning shaped as the family's."""

    module: nn.Module
    """What the actor trains (e.g. both Wan 2.2 experts), on the meta device, in ``model.dtype``."""
    latent_shape: tuple[int, ...]
    """One sample's latent ``(C, ...)`` at the recipe's size."""
    forward: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    """``(module, x_t (B, *latent_shape), sigma (B,)) -> velocity``: the family's forward with
    zero conditioning of the shapes its prompts encode to (the text length of a full prompt)."""
    description: str
    """The model in words, e.g. ``WanTransformer3DModel x 2 experts``."""
    guided_rows: int = 2
    """Transformer rows of one guided velocity of one sample: the negative and the positive
    prompt's; more where the family's guidance adds passes (LTX-2's modality isolation, STG)."""
    guided: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor] | None = None
    """``(module, x_t (B, *latent_shape), sigma (B,)) -> velocity``: the guided velocity of B samples
    as training runs it, every pass with gradient, on the zero conditioning, where the family's
    guidance is more than one batched forward of [negative, positive] rows (LTX-2's STG and
    modality-isolation passes); None: ``forward`` of the ``guided_rows x B`` rows."""


class FamilyDescription:
    """What a model family declares, static: its name, options, defaults and capabilities, and
    what the checks (preflight), the planner (``diffrl plan``) and the parallel hooks (FSDP2 units,
    sequence parallel) read from the config and the model folder's JSON files before anything
    loads. Class attributes and classmethods only: never instantiated, no state. Each family's file
    defines its description beside its :class:`ModelFamily`, which names it as
    :attr:`ModelFamily.description`."""

    name: ClassVar[str]
    """The family's short name (``model.family``), in every message about it."""
    default_lora_targets: ClassVar[list[str]]
    default_guidance: ClassVar[float] = 1.0
    """``sampling.guidance_scale`` when the recipe does not set it (1: no guidance)."""
    no_guidance_scale: ClassVar[float] = 1.0
    """The guidance scale at and below which there is no CFG (the conditional velocity alone, no
    negative forward): 1 for ``neg + s * (pos - neg)``; 0 for a pipeline that guides as
    ``pos + s * (pos - neg)`` (Z-Image)."""
    fps: ClassVar[float | None] = None
    """The frame rate a video family's videos play at (what ``diffrl sample`` writes into its
    .mp4 files); None: stills, or not known."""
    edits: ClassVar[bool] = False
    """True: an editing family. Every prompt comes with a source image (the prompt file's
    ``"image"``), which :meth:`ModelFamily.encode_prompts` takes as ``sources`` and which conditions
    every forward through the conditioning (:meth:`ModelFamily._encode_edits`)."""
    sound: ClassVar[bool] = False
    """True: an audio-video family, whose :meth:`ModelFamily.decode_media` returns a waveform with
    the frames (its latent state holds the audio stream too); rewards that hear (``Reward.audio``)
    need one."""
    sequence_parallel: ClassVar[bool] = False
    """True: the family's transformer trains with each sample's tokens split over
    ``parallel.sequence`` ranks (Ulysses, through the context-parallel plan diffusers declares
    for its class; ``tests/distributed/test_sequence_parallel.py`` checks each such family)."""
    sequence_hints: ClassVar[dict[str, str]] = {}
    """What to change when a length of :meth:`sequence_lengths` does not split, by what it counts
    (``"; change ..."``); a length not here: nothing for ``"attention heads"`` or a length naming
    its setting in parentheses, else the sample's size."""

    @dataclass
    class Options:
        """Family-specific options (``model.options`` in a recipe)."""

    @classmethod
    def parse_options(cls, options: dict[str, Any]) -> Any:
        """``options`` (``model.options``) bound to :attr:`Options`; a :class:`ConfigError` listing
        every value that does not bind."""
        errors: list[str] = []
        parsed = bind_dataclass(cls.Options, options, "model.options", errors)
        if errors:
            raise ConfigError(errors)
        return parsed

    @classmethod
    def bound_options(cls, config: Config) -> Any:
        """``model.options`` bound to :attr:`Options` for the checks of what the values mean
        together: a value that does not bind (a wrong type, out of its range; :meth:`validate_config`
        reports it) is at its default, so it is reported once."""
        return bind_dataclass(cls.Options, config.model.options, "model.options", [])

    @classmethod
    def validate_config(cls, config: Config, check_files: bool = True) -> list[str]:
        """Problems with ``model.*`` / ``sampling.*`` for this family, before anything loads."""
        errors: list[str] = []
        bind_dataclass(cls.Options, config.model.options, "model.options", errors)
        path = config.model.path
        if check_files and path not in ("base", "random"):
            p = Path(path)
            if not p.is_dir():
                errors.append(
                    f"model.path: {path!r} is not a directory (use 'base', 'random' or a local diffusers folder)"
                )
            else:
                try:
                    check_family_dir(p, cls.name)
                except FamilyMismatchError as e:
                    errors.append(f"model.path: {e}")
        return errors

    @classmethod
    def pipeline_guidance(cls, options: Any, guidance_scale: float) -> dict[str, float]:
        """The guidance arguments of the family's diffusers pipeline call (what a serving engine
        is asked for) for true CFG at ``guidance_scale`` (``sampling.guidance_scale``), given the
        family's bound ``options``; a guidance-distilled family adds the guidance it embeds."""
        return {"guidance_scale": guidance_scale}

    @classmethod
    def one_process_problems(cls, config: Config) -> list[str]:
        """What this config asks of the family that only one process can do (sampling with the
        trainer's own modules: e.g. a text encoder that trains, which no weight sync sends); a
        runner that places the sampler and the trainer apart refuses these. None by default."""
        return []

    @classmethod
    def makes_videos(cls, config: Config) -> bool:
        """Whether this config's samples are videos ``(B, 3, F, H, W)`` (one frame or many), not
        still images ``(B, 3, H, W)``: preflight refuses rewards that compare still images on them."""
        return False

    @classmethod
    def size_rule(cls, config: Config, check_files: bool = True) -> SizeRule | None:
        """The family's :class:`SizeRule` for this config's model, read before any weights load
        (from the family's built-in config or the model folder's JSON files); None when it cannot
        be known yet (e.g. no folder to read). Families override it."""
        return None

    @classmethod
    def size_problems(cls, config: Config, check_files: bool = True) -> list[str]:
        """Problems with ``sampling.height`` / ``sampling.width`` for this family (the sizes the
        family's ``latent_shape`` would refuse only after the model has loaded)."""
        s = config.sampling
        given = {n: v for n in ("height", "width") if isinstance(v := getattr(s, n), int) and v >= 1}
        try:
            rule = cls.size_rule(config, check_files) if given else None
        except (TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError) as e:
            if not cls.__module__.startswith("diffrl."):
                raise  # a user's family: its own error, named as a plugin's
            return [_config_files_problem(e)]
        if rule is None:
            return []
        if not _is_count(rule.multiple) or not (rule.max_side is None or _is_count(rule.max_side)):
            if not cls.__module__.startswith("diffrl."):
                return [
                    f"the {cls.name} family's size_rule() gave multiple={rule.multiple!r}, max_side={rule.max_side!r}"
                ]
            return [
                _config_files_problem(
                    None, f"multiple {quoted(rule.multiple)}, max_side {quoted(rule.max_side)}"
                )
            ]
        errors, m = [], rule.multiple
        for name, v in given.items():
            if v % m:
                below, above = v // m * m, (v // m + 1) * m
                fix = f"{below} or {above}" if below else str(above)
                errors.append(
                    f"sampling.{name}={v} does not fit the {cls.name} model: height and width must be "
                    f"multiples of {m} ({rule.why}); e.g. sampling.{name}={fix}"
                )
            elif rule.max_side is not None and v > rule.max_side:
                errors.append(
                    f"sampling.{name}={v} is larger than the {cls.name} model takes: at most "
                    f"{rule.max_side} pixels ({rule.max_why}); e.g. sampling.{name}={rule.max_side}"
                )
        return errors

    @classmethod
    def source_size(cls, config: Config, width: int, height: int) -> Any:
        """What an editing family resizes a source of ``width x height`` pixels (already cropped
        to the output's aspect) to, as a comparable value (e.g. ``(height, width)``), from the
        config and the model folder's JSON files, before anything loads; None when it cannot be
        known. The rows of a run are batched, so every source must give the same (preflight
        checks the prompt files' images)."""
        return None

    @classmethod
    def module_names(cls, config: Config, check_files: bool = True) -> list[str] | None:
        """The names of the transformer's modules (what ``model.lora.target_modules`` match), from
        a copy built on the meta device (no weights, no memory); None when they cannot be known
        before the model loads. Families override it."""
        return None

    @classmethod
    def lora_problems(cls, config: Config, check_files: bool = True) -> list[str]:
        """``model.lora.target_modules`` that match no module of the transformer (peft matches a
        target to a module name or its dotted end, e.g. ``attn.to_q``)."""
        lora = config.model.lora
        targets = lora.target_modules if lora is not None else None
        names = cls.module_names(config, check_files) if targets else None
        if not targets or names is None:
            return []
        missing = [t for t in targets if not any(n == t or n.endswith(f".{t}") for n in names)]
        if not missing:
            return []
        return [
            f"model.lora.target_modules: {', '.join(map(repr, missing))} "
            f"match{'es' if len(missing) == 1 else ''} no module of the {cls.name} "
            f"transformer (a target is a module name or its dotted end); its default targets are "
            f"{', '.join(cls.default_lora_targets)} (null takes them)"
        ]

    @classmethod
    def lora_targets_of(cls, module: nn.Module, configured: list[str] | None) -> list[str]:
        """:meth:`ModelFamily.lora_targets` for ``module`` (the transformer, or ``diffrl plan``'s meta copy):
        ``configured``, else :attr:`default_lora_targets`."""
        return list(configured) if configured else list(cls.default_lora_targets)

    @classmethod
    def sequence_lengths(cls, config: Config, check_files: bool = True) -> dict[str, int] | None:
        """The lengths the context-parallel plan splits, by what they count (e.g. ``{"video
        tokens": 2048}``), and the attention heads under ``"attention heads"``, from the config and
        the model folder's JSON files before anything loads; None when they cannot be known yet.
        Families with :attr:`sequence_parallel` override it."""
        return None

    @classmethod
    def sequence_problems(cls, config: Config, check_files: bool = True) -> list[str]:
        """Problems with splitting this config's samples over ``parallel.sequence`` ranks:
        every length the plan splits, and the heads Ulysses exchanges for tokens, must be a
        multiple of it (diffusers asserts it mid-forward)."""
        n = config.parallel.sequence
        lengths = cls.sequence_lengths(config, check_files) if n > 1 else None
        return [
            f"parallel.sequence={n}: the {cls.name} model's {what} ({length}) do not split over "
            f"{n} ranks (Ulysses needs a multiple of {n}{cls.sequence_hints.get(what, _length_fix(what))})"
            for what, length in (lengths or {}).items()
            if length % n
        ]

    @classmethod
    def fsdp_blocks(cls, module: nn.Module) -> list[nn.Module]:
        """The units FSDP2 shards one by one inside ``module`` (a transformer): its blocks, under
        the names diffusers gives them; the rest of ``module`` becomes the root unit."""
        names = ("transformer_blocks", "single_transformer_blocks", "blocks")
        return [block for name in names for block in getattr(module, name, None) or []]

    @classmethod
    def sequence_parallel_modules(cls, module: nn.Module) -> list[nn.Module]:
        """The diffusers transformers inside ``module`` (the transformer, or a frozen copy of it)
        that take the context-parallel plan: ``module`` itself unless it wraps several."""
        return [module]

    @classmethod
    def planned(cls, config: Config, folder: Path) -> Planned | None:
        """The trainable transformer of the model whose JSON files are in ``folder`` (a diffusers
        folder, weights not needed), on the meta device, at ``config``'s size and options; None
        when the family cannot be planned yet (``diffrl plan`` says so)."""
        return None


class FamilyRuntime(Protocol):
    """The calls the loop makes on a loaded model family (the sampler, the actor, the algorithms,
    evaluation, the serving engine, ``diffrl export``), all a :class:`ModelFamily` provides:
    code outside ``models/`` reaches a loaded family through these and nothing else
    (``tests/unit/models/test_runtime.py`` checks it). What a family implements to provide them
    (``_encode_prompts``, ``forward``, ``decode``, ...) is :class:`ModelFamily`'s; what it declares
    is its :attr:`description`'s."""

    description: type[FamilyDescription]
    options: Any
    """The family's bound ``model.options`` (a ``description.Options``)."""
    device: torch.device
    transformer: nn.Module
    """The diffusers transformer that trains."""
    numerics: Numerics
    meter: ForwardMeter

    @property
    def default_size(self) -> tuple[int, int]: ...
    def latent_shape(self, height: int, width: int) -> tuple[int, ...]: ...
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor: ...
    def encode_prompts(
        self, prompts: Sequence[str], sources: Sequence[Source] | None = None
    ) -> Conditioning: ...
    def keep_encoded(self, rows: dict[str, dict[str, torch.Tensor]]) -> int: ...
    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None: ...
    def velocity(
        self,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
        negative: Conditioning | None = None,
        module: nn.Module | None = None,
    ) -> torch.Tensor: ...
    def encode_images(self, images: torch.Tensor) -> torch.Tensor: ...
    def decode_media(self, latents: torch.Tensor) -> Media: ...
    def unpack_latents(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor: ...
    def trainable_module(self) -> nn.Module: ...
    def lora_targets(self, configured: list[str] | None) -> list[str]: ...
    def export(
        self, out: str | Path, *, lora: bool, merge: bool = False, dtype: torch.dtype | None = None
    ) -> Exported: ...


class ModelFamily(ABC):
    """Adapter for one model family: a loaded model, providing :class:`FamilyRuntime` (the calls the
    loop makes) from what a family implements (the abstract methods, and the hooks it overrides).

    Holds the trainable ``transformer`` (a diffusers model) and the frozen parts (text encoders,
    VAE). Subclasses implement the abstract methods; shared behaviour (prompt cache, CFG) lives here.
    What the family declares (name, options, defaults, checks, sizes, parallel hooks) is its
    :attr:`description`'s.
    """

    description: ClassVar[type[FamilyDescription]]
    """The family's static half (a :class:`FamilyDescription` subclass, in the same file)."""
    default_shift: ClassVar[float] = 3.0
    """Sigma-schedule shift used when ``sampling.shift`` is not set (families whose pipeline shifts
    by image size override :meth:`sigmas` instead)."""

    def __init__(self, transformer: nn.Module, device: torch.device, options: Any):
        self.transformer = transformer
        self.device = device
        self.options = options
        self._prompt_cache: dict[Any, dict[str, torch.Tensor]] = {}
        """Encoded rows by prompt (by (prompt, source key) for an editing family)."""
        self.text_encoders_released = False
        """True after :meth:`keep_encoded` (``model.encode_once``)."""
        self.numerics = Numerics()
        """How the transformer forwards run (``model.autocast``, ``model.compile``); set by
        :func:`~diffrl.models.registry.load_family`."""
        self._joint_memo: tuple[Conditioning, Conditioning, Conditioning] | None = None
        self.meter = ForwardMeter()
        """The model FLOPs and compile seconds of the forwards so far (``perf/*_mfu``)."""

    @property
    def text_encoder_trainable(self) -> bool:
        """True when the text encoder trains with the transformer (then prompts are not cached)."""
        return False

    def trainable_module(self) -> nn.Module:
        """The module a full fine-tune optimises (its ``state_dict`` is what checkpoints hold)."""
        return self.transformer

    def save_lora(self, out_dir: str | Path) -> str | None:
        """Write the transformer's LoRA adapter in the format diffusers' ``load_lora_weights``
        reads for this family's pipeline and return how to load it (``diffrl export`` prints it);
        None when the family has no such pipeline (then ``diffrl export`` merges the adapter into a
        full model folder instead)."""
        return None

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    @abstractmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, options: Any) -> Self:
        """Build from ``path``: ``base``, ``random`` or a local directory in diffusers layout."""

    @abstractmethod
    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the whole model in diffusers layout (plus :data:`FAMILY_FILE`)."""

    def load_snippet(self, path: str | Path) -> str | None:
        """How diffusers loads the folder :meth:`save_pretrained` wrote at ``path``, as
        ``; ``-separated Python statements (``diffrl export`` prints them, one a line, as
        :meth:`save_lora`'s); None when no diffusers class reads it."""
        return None

    def export(
        self, out: str | Path, *, lora: bool, merge: bool = False, dtype: torch.dtype | None = None
    ) -> Exported:
        """Write the model for diffusers to ``out`` (``diffrl export``): with a LoRA adapter
        (``lora``) and no ``merge``, the adapter alone where the family's pipeline loads one
        (:meth:`save_lora`); else the whole model folder (:meth:`save_pretrained`, in ``dtype``),
        the adapter merged into the weights first."""
        if lora and not merge:
            how = self.save_lora(out)
            if how is not None:
                return Exported(adapter=True, load=how)
        if lora:  # merge the adapter into the base weights, then drop it
            self.transformer.fuse_lora()
            self.transformer.unload_lora()
        self.save_pretrained(out, dtype=dtype)
        return Exported(adapter=False, load=self.load_snippet(out))

    # ---- geometry ------------------------------------------------------------------------------
    @property
    @abstractmethod
    def default_size(self) -> tuple[int, int]:
        """(height, width) in pixels."""

    @abstractmethod
    def latent_shape(self, height: int, width: int) -> tuple[int, ...]:
        """Shape of one sample's latent, e.g. ``(C, H/8, W/8)`` or ``(C, F, H, W)``."""

    def unpack_latents(self, latents: torch.Tensor, height: int, width: int) -> torch.Tensor:
        """Latents ``(B, ...)`` in the layout the transformer takes (what a serving engine
        returns) -> ``(B, *latent_shape)``; a family that packs its latents into tokens unpacks."""
        return latents.reshape(len(latents), *self.latent_shape(height, width))

    # ---- text --------------------------------------------------------------------------------
    @abstractmethod
    def _encode_prompts(self, prompts: list[str]) -> dict[str, torch.Tensor]:
        """Run the text encoders: tensors with the batch on dim 0."""

    def _encode_edits(self, prompts: list[str], sources: list[Source]) -> dict[str, torch.Tensor]:
        """An editing family's conditioning of ``prompts`` with their source images, one each
        (e.g. the prompt's embedding and the source's latents): tensors with the batch on dim 0."""
        raise NotImplementedError(
            f"the {self.description.name} family does not edit images (it takes no sources)"
        )

    def encode_prompts(self, prompts: Sequence[str], sources: Sequence[Source] | None = None) -> Conditioning:
        """Encode ``prompts`` (with their ``sources``, one each, for an editing family; None
        otherwise) with a cache per (prompt, source) while the encoders are frozen; with
        gradients and no cache while they train."""
        if (sources is not None) != self.description.edits or (
            sources is not None and len(sources) != len(prompts)
        ):
            what = "one source image per prompt" if self.description.edits else "no source images"
            raise ValueError(
                f"the {self.description.name} family "
                f"takes {what}; got {len(sources or [])} for {len(prompts)}"
            )
        if self.text_encoder_trainable:
            return Conditioning(self._encode(list(prompts), None if sources is None else list(sources)))
        with torch.no_grad():
            return self._encode_cached(prompts, sources)

    TEXT_PARTS: ClassVar[tuple[str, ...]] = ("text_encoder", "tokenizer")
    """Name prefixes of the family's attributes that only turn prompts into embeddings (diffusers'
    pipelines name them ``text_encoder``, ``text_encoder_2``, ``tokenizer_3``, ...)."""

    def keep_encoded(self, rows: dict[str, dict[str, torch.Tensor]]) -> int:
        """Encode from ``rows`` only (``model.encode_once``): take the embeddings by prompt (one row
        each, as :meth:`encode_prompts` makes them) into the prompt cache, kept where they are (the
        CPU: a large prompt set's embeddings take host memory, not the device's; each batch moves
        to the device as it is encoded), then drop the text encoders and tokenizers
        (:attr:`TEXT_PARTS`): from now on another prompt is an error naming it. Returns the bytes
        of weights freed."""
        self._prompt_cache.update(rows)
        freed = 0
        for name in [n for n in vars(self) if n.startswith(self.TEXT_PARTS)]:
            part = getattr(self, name)
            if isinstance(part, nn.Module):
                freed += sum(t.numel() * t.element_size() for t in [*part.parameters(), *part.buffers()])
            setattr(self, name, None)
        self.text_encoders_released = True
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return freed

    def _encode(self, prompts: list[str], sources: list[Source] | None) -> dict[str, torch.Tensor]:
        if self.text_encoders_released:
            raise RuntimeError(
                f"model.encode_once: the {self.description.name} family's "
                "text encoders were released after the run's "
                f"prompts were encoded, and {prompts[0]!r:.200} is not one of them"
            )
        return self._encode_prompts(prompts) if sources is None else self._encode_edits(prompts, sources)

    def _encode_cached(self, prompts: Sequence[str], sources: Sequence[Source] | None) -> Conditioning:
        keys = list(prompts) if sources is None else [(p, s.key) for p, s in zip(prompts, sources)]
        first: dict[Any, int] = {}  # the first row of each key not cached yet
        for i, key in enumerate(keys):
            if key not in self._prompt_cache:
                first.setdefault(key, i)
        missing = list(first.values())
        if missing:
            encoded = self._encode(
                [prompts[i] for i in missing], None if sources is None else [sources[i] for i in missing]
            )
            for row, i in enumerate(missing):
                self._prompt_cache[keys[i]] = {k: v[row].detach() for k, v in encoded.items()}
        names = self._prompt_cache[keys[0]].keys()
        return Conditioning(
            {k: torch.stack([self._prompt_cache[key][k] for key in keys]).to(self.device) for k in names}
        )

    # ---- the sigma schedule --------------------------------------------------------------------
    def sigmas(self, num_steps: int, shift: float | None, height: int, width: int) -> torch.Tensor:
        """``(num_steps + 1,)`` float32 sigmas from 1 down to 0 for sampling at ``height x width``.

        ``shift`` (``sampling.shift``) None: the schedule this family's diffusers pipeline uses;
        a number: ``FlowMatchEulerDiscreteScheduler(shift=shift)``'s (SD3's static shift).
        """
        return flow_sigmas(num_steps, self.default_shift if shift is None else shift)

    # ---- the velocity forward ------------------------------------------------------------------
    @abstractmethod
    def forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """One transformer call: ``x_t (B, *latent)``, ``sigma (B,)`` -> velocity ``(B, *latent)``."""

    def velocity(
        self,
        x_t: torch.Tensor,
        sigma: torch.Tensor,
        cond: Conditioning,
        guidance_scale: float = 1.0,
        negative: Conditioning | None = None,
        module: nn.Module | None = None,
    ) -> torch.Tensor:
        """Velocity with optional classifier-free guidance (one batched forward of [neg, pos]).

        ``module`` defaults to the trainable transformer; an algorithm passes another (the EMA or
        the old policy) the same way. Runs under the family's :attr:`numerics` (autocast,
        compile). Returns ``(B, *latent)`` in float32.
        """
        module = module or self.transformer
        if guidance_scale == self.description.no_guidance_scale or negative is None:
            return self._forward(module, x_t, sigma, cond)
        v = self._forward(
            module, torch.cat([x_t, x_t]), torch.cat([sigma, sigma]), self._joint(negative, cond)
        )
        v_neg, v_pos = v.chunk(2)
        return self.guide(v_neg, v_pos, guidance_scale)

    def _joint(self, negative: Conditioning, cond: Conditioning) -> Conditioning:
        """``[negative, cond]`` concatenated on the batch; without gradients (a sampling loop
        calls with the same two at every step) the last one is kept and reused."""
        memo = self._joint_memo
        if not torch.is_grad_enabled() and memo and memo[0] is negative and memo[1] is cond:
            return memo[2]
        both = Conditioning.cat([negative, cond])
        self._joint_memo = (negative, cond, both) if not torch.is_grad_enabled() else None
        return both

    def _forward(
        self, module: nn.Module, x_t: torch.Tensor, sigma: torch.Tensor, cond: Conditioning
    ) -> torch.Tensor:
        """:meth:`forward` under the run's numerics, metered; float32 ``(B, *latent)``."""
        prepare(module, self.numerics)
        with self.meter.compiling(self.numerics), autocast(self.numerics, self.device):
            forward = lambda: self.forward(module, x_t, sigma, cond)  # noqa: E731
            v = self.meter.run(module, x_t, cond, forward, dry=self.numerics.compile)
        if not is_diffrl_module(type(self).__module__) and (
            not isinstance(v, torch.Tensor) or v.shape != x_t.shape
        ):  # a user's family: said here, not by the sampler's arithmetic far from it
            raise returned_wrong(
                self, "forward()", kind(v), f"the velocity, a tensor of x_t's shape {tuple(x_t.shape)}"
            )
        return v.float()

    def guide(self, v_neg: torch.Tensor, v_pos: torch.Tensor, scale: float) -> torch.Tensor:
        """Classifier-free guidance of two velocities ``(B, *latent)`` as this family's pipeline does."""
        return v_neg + scale * (v_pos - v_neg)

    def negative(
        self, prompt: str, guidance_scale: float, cond: Conditioning | None = None
    ) -> Conditioning | None:
        """The negative prompt's conditioning when ``guidance_scale`` asks for CFG (None when it is
        <= the description's ``no_guidance_scale``: no negative forward): one row for each row of ``cond`` (an
        editing family's negative carries each row's source image), or one row without ``cond``."""
        if guidance_scale <= self.description.no_guidance_scale:
            return None
        if not self.description.edits:
            one = self.encode_prompts([prompt])
            return one if cond is None else one.repeat(len(cond))
        if cond is None:
            raise ValueError(
                f"{self.description.name}: an editing family's negative needs the rows' conditioning"
            )
        # the negative prompt's text tensors, each row's source tensors (its latents) as they are;
        # a family whose text encoder sees the source (Qwen-Image-Edit) overrides this
        with torch.no_grad():
            text = self._encode_cached([prompt], None).repeat(len(cond)).tensors
        return Conditioning({**cond.tensors, **text})

    # ---- pixels <-> latents --------------------------------------------------------------------
    @abstractmethod
    def encode_images(self, images: torch.Tensor) -> torch.Tensor:
        """``images (B, 3, H, W)`` in [0, 1] -> clean latents ``x0 (B, *latent)``."""

    @abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """``latents (B, *latent)`` -> images ``(B, 3, H, W)`` (or ``(B, 3, F, H, W)``) in [0, 1]."""

    def decode_media(self, latents: torch.Tensor) -> Media:
        """``latents (B, *latent)`` -> :class:`~diffrl.core.rollout.Media`: :meth:`decode`'s images or
        videos and, for an audio-video family (``description.sound``), the waveform and the frame rate."""
        return Media(self.decode(latents), fps=self.description.fps)

    # ---- LoRA ----------------------------------------------------------------------------------
    def lora_targets(self, configured: list[str] | None) -> list[str]:
        """The module names peft's LoRA targets in this family's transformer."""
        return self.description.lora_targets_of(self.transformer, configured)


def write_family_file(path: Path, family: str, extra: dict[str, Any] | None = None) -> None:
    path.mkdir(parents=True, exist_ok=True)
    (path / FAMILY_FILE).write_text(json.dumps({"family": family, **(extra or {})}, indent=1))


def check_family_dir(path: Path, family: str) -> None:
    """Refuse a model directory written for another family."""
    meta_file = path / FAMILY_FILE
    if meta_file.is_file():
        fix = "export the model again (diffrl export CHECKPOINT DIR)"
        try:  # bounded: diffrl writes a line of JSON (a 2 GB sparse file is no such line)
            meta = json.loads(read_text(meta_file, f"{str(path)!r}: the model's", fix, max_bytes=1 << 20))
        except UserFileError as e:
            raise FamilyMismatchError(str(e)) from e
        except (ValueError, RecursionError) as e:  # not JSON, nested thousands deep
            raise FamilyMismatchError(
                f"{str(path)!r}: {FAMILY_FILE} is not the JSON diffrl writes ({type(e).__name__}); "
                "export the model again (diffrl export CHECKPOINT DIR)"
            ) from e
        found = meta.get("family") if isinstance(meta, dict) else None
        if not isinstance(found, str):
            raise FamilyMismatchError(
                f"{str(path)!r}: {FAMILY_FILE} names no model family (it holds {str(meta)[:100]}); export "
                "the model again (diffrl export CHECKPOINT DIR)"
            )
        if found != family:
            raise FamilyMismatchError(
                f"{str(path)!r} holds a {found!r} model but model.family is {family!r}; "
                f"set model.family={found} or point model.path at a {family!r} model"
            )
