"""What the families loaded from a local diffusers pipeline folder share: finding and checking the
folder, loading its parts, the pipeline over the family's own modules, writing it back, and the LoRA
export."""

from __future__ import annotations

import copy
import inspect
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Self

import diffusers
import torch
from peft.utils import get_peft_model_state_dict
from torch import nn

from diffrl.config import Config
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import UserFileError, check_model_files, read_json_object
from diffrl.models.base import (
    DTYPES,
    SHIPPED_CONFIGS,
    FamilyDescription,
    ModelFamily,
    check_family_dir,
    meta_model,
    write_family_file,
)


def load_part(folder: Path, sub: str, part_class: type, dtype: torch.dtype | None = None) -> Any:
    """``part_class.from_pretrained(folder, subfolder=sub)``, as the pipeline loads its part ``sub``,
    with the weights in ``dtype`` (None: a tokenizer, which has none). diffusers' and transformers'
    models both take ``torch_dtype``. The part's files are checked first (:func:`check_part_files`);
    whatever else the libraries cannot load from them (a config of the wrong shape, weights that do
    not fit it) is the folder's error, naming the part."""
    check_part_files(folder, sub)
    try:
        if dtype is None:
            return part_class.from_pretrained(folder, subfolder=sub)
        return part_class.from_pretrained(folder, subfolder=sub, torch_dtype=dtype)
    except (torch.OutOfMemoryError, MemoryError):
        raise  # the machine's limit, not the folder's
    except Exception as e:  # noqa: BLE001 - a library reading the user's files: the folder's error
        raise DiffrlError(
            f"model.path: {str(folder)!r}: its {sub}/ cannot be loaded as a {part_class.__name__} "
            f"({type(e).__name__}: {_one_line(str(e))}); {PART_FIX}"
        ) from e


PART_FIX = "replace the folder with the model's own files (copy it again)"


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def check_part_files(folder: Path, sub: str) -> None:
    """Refuse the part folder ``folder/sub`` before a library reads it: missing, or a file in it
    that cannot be what a loader reads (:func:`~diffrl.core.user_files.check_model_files`). A
    :class:`DiffrlError` naming the file."""
    if not (folder / sub).is_dir():
        raise DiffrlError(
            f"model.path: {str(folder)!r} has no {sub}/ folder (the model's {sub}); copy the whole "
            "model folder, every part of it"
        )
    check_model_files(folder / sub, f"model.path: the {sub}/ file", PART_FIX)


def read_pipeline_config(folder: Path) -> dict[str, Any]:
    """The folder's ``model_index.json``."""
    return read_json_object(folder / "model_index.json", "the pipeline's file", PART_FIX)


def read_scheduler_config(folder: Path) -> dict[str, Any]:
    """The folder's ``scheduler/scheduler_config.json``, which must name a diffusers scheduler."""
    file = folder / "scheduler" / "scheduler_config.json"
    config = read_json_object(file, "the scheduler's file", PART_FIX)
    name = config.get("_class_name")
    scheduler = getattr(diffusers, name, None) if isinstance(name, str) else None
    if not (isinstance(scheduler, type) and hasattr(scheduler, "from_config") and "Scheduler" in name):
        raise UserFileError(
            f"the scheduler's file {str(file)!r} names no diffusers scheduler (_class_name "
            f"{quoted(name)}); {PART_FIX}"
        )
    return config


class DiffusersFolderDescription(FamilyDescription):
    """The :class:`FamilyDescription` of a :class:`DiffusersFolderFamily`: its pipeline and
    transformer classes, the checks of its folder, and the settings read from the folder's JSON
    files before any weights load."""

    pipeline_class: ClassVar[str]
    """The diffusers pipeline this family reproduces, e.g. ``"FluxPipeline"``."""
    pipeline_classes: ClassVar[tuple[str, ...]] = ()
    """The pipelines whose folders it reads when more than one (variants, e.g. FLUX.2 [dev] and
    [klein]); empty: :attr:`pipeline_class` alone."""
    transformer_class: ClassVar[str]
    """The diffusers class of the folder's ``transformer/``, e.g. ``"FluxTransformer2DModel"``."""

    @classmethod
    def folder_problems(cls, folder: Path) -> list[str]:
        """What makes ``folder`` not a :attr:`pipeline_class` folder this family can load (read
        from its JSON files only: cheap, before any weights load). Families add their own."""
        index = folder / "model_index.json"
        if not index.is_file():
            return [f"{str(folder)!r} has no model_index.json: not a diffusers pipeline folder"]
        try:
            meta = read_json_object(index, "the pipeline's file", PART_FIX)
        except UserFileError as e:
            return [str(e)]
        found = meta.get("_class_name")
        accepted = cls.pipeline_classes or (cls.pipeline_class,)
        if found not in accepted:
            return [
                f"{str(folder)!r} holds a {found} (model_index.json); the {cls.name} family reads "
                f"{' or '.join(accepted)} folders"
            ]
        problems = [
            f"{str(folder)!r} has no {sub}/ folder"
            for sub in ("transformer", "scheduler")
            if not (folder / sub).is_dir()
        ]
        if not problems:
            try:
                read_scheduler_config(folder)
            except UserFileError as e:
                problems.append(str(e))
        return problems

    @classmethod
    def validate_config(cls, config, check_files: bool = True) -> list[str]:
        errors = super().validate_config(config, check_files)
        path = config.model.path
        if path in ("base", "random"):
            errors.append(
                f"model.path: the {cls.name} family has no built-in weights ({path!r}); point it at a "
                f"local {cls.pipeline_class} folder"
            )
        elif check_files and Path(path).is_dir():
            errors += [f"model.path: {p}" for p in cls.folder_problems(Path(path))]
        for key, value in config.model.options.items():
            if key.endswith("_dtype") and value not in DTYPES:
                errors.append(f"model.options.{key}: {value!r} is not one of {', '.join(DTYPES)}")
        return errors

    @classmethod
    def component_setting(cls, config, check_files: bool, sub: str, class_name: str, key: str) -> Any:
        """``key`` of the model folder's ``sub/config.json``, else the default of diffusers'
        ``class_name`` (what ``from_pretrained`` would build), read before any weights load;
        None when the folder cannot be read (then the load reports it)."""
        folder = cls.json_folder(config, check_files, sub)
        if folder is None:
            return None
        settings = read_json(folder / sub / "config.json")
        if settings is None:
            return None
        if key in settings:
            return settings[key]
        default = inspect.signature(getattr(diffusers, class_name).__init__).parameters[key].default
        return None if default is inspect.Parameter.empty else default

    @classmethod
    def json_folder(cls, config, check_files: bool, sub: str) -> Path | None:
        """The folder whose ``sub/config.json`` describes ``model.path``'s model: the folder itself
        when it holds ``sub/``; without ``check_files`` (``diffrl plan``: the weights need not be on
        this machine) else the shipped JSON files of the model of its name
        (``models/assets/configs/<last part>``, as the planner reads them), so the family's size
        and frame rules apply to a plan too; None when there is none."""
        if config.model.path in ("base", "random"):
            return None
        folder = Path(config.model.path)
        if (folder / sub).is_dir():
            return folder
        shipped = SHIPPED_CONFIGS / folder.name
        if not check_files and folder.name and (shipped / sub).is_dir():
            return shipped
        return None

    @classmethod
    def module_names(cls, config, check_files: bool = True) -> list[str] | None:
        folder = cls.json_folder(config, check_files, "transformer")
        settings = read_json(folder / "transformer" / "config.json") if folder is not None else None
        if settings is None:
            return None
        model_cls = getattr(diffusers, cls.transformer_class)
        try:
            with torch.device("meta"):  # the module tree only: no weights are read or allocated
                model = model_cls.from_config(settings)
        except (TypeError, ValueError):
            return None  # a config this diffusers cannot build: the load reports it
        return [name for name, _ in model.named_modules()]


class DiffusersFolderFamily(ModelFamily):
    """A :class:`ModelFamily` whose ``model.path`` is a folder written by ``<pipeline_class>.save_pretrained``
    (``model_index.json`` and one subfolder per part), e.g. a Hub snapshot on local disk."""

    description: ClassVar[type[DiffusersFolderDescription]]

    components: ClassVar[tuple[str, ...]]
    """The pipeline's ``__init__`` arguments but the scheduler, each an attribute of the family."""

    def __init__(
        self,
        parts: dict[str, Any],
        pipeline_config: dict[str, Any],
        scheduler_config: dict[str, Any],
        device: torch.device,
        options: Any,
    ):
        """``parts`` (from :meth:`load_parts`) become attributes of the family by name;
        ``pipeline_config`` and ``scheduler_config`` are the folder's ``model_index.json`` and
        ``scheduler/scheduler_config.json``."""
        super().__init__(parts["transformer"], device, options)
        for name, part in parts.items():
            setattr(self, name, part)
        self.pipeline_config = dict(pipeline_config)
        self.scheduler_config = dict(scheduler_config)
        self.pipeline_class = self.description.pipeline_class
        """The diffusers pipeline this model runs as (:meth:`pipeline`, the exports): the
        description's, or the folder's variant's (FLUX.2)."""

    # ---- construction --------------------------------------------------------------------------
    @classmethod
    def load(cls, path: str, device: torch.device, dtype: torch.dtype, options: Any) -> Self:
        """The folder's parts as the pipeline loads them (:meth:`load_parts`): the transformer in
        ``dtype`` on ``device`` to train (with gradient checkpointing when
        ``options.gradient_checkpointing``), every other module frozen on ``device``."""
        folder = cls.pipeline_folder(path)
        parts = cls.load_parts(folder, dtype, options)
        transformer = parts["transformer"]
        transformer.to(device)
        cls.freeze(
            [p for name, p in parts.items() if name != "transformer" and isinstance(p, nn.Module)], device
        )
        if options.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()
        pipeline_config = read_pipeline_config(folder)
        return cls(parts, pipeline_config, read_scheduler_config(folder), device, options)

    @classmethod
    @abstractmethod
    def load_parts(cls, folder: Path, dtype: torch.dtype, options: Any) -> dict[str, Any]:
        """The pipeline's parts from ``folder`` by name (each with :func:`load_part`), in the order
        the pipeline loads them: the trained ``transformer`` in ``dtype``, a part the folder may lack
        as None."""

    @classmethod
    def pipeline_folder(cls, path: str) -> Path:
        """``path`` as a folder of the description's ``pipeline_class``; a clear error when it
        is not one, or when diffrl wrote it for another family."""
        folder = Path(path)
        if path in ("base", "random") or not folder.is_dir():
            raise FileNotFoundError(
                f"{cls.description.name}: "
                f"model.path must be a local diffusers folder of {cls.description.pipeline_class}, got {path!r}"
            )
        problems = cls.description.folder_problems(folder)
        if problems:
            raise ValueError(f"{cls.description.name}: " + "; ".join(problems))
        check_family_dir(folder, cls.description.name)
        return folder

    @staticmethod
    def freeze(modules: list[nn.Module | None], device: torch.device) -> None:
        """Move the frozen parts (text encoders, VAE) to ``device`` in eval mode, without gradients."""
        for m in modules:
            if m is not None:
                m.to(device).eval().requires_grad_(False)

    def pipeline_components(self) -> dict[str, Any]:
        """The pipeline's ``__init__`` arguments but the scheduler: these very modules."""
        return {name: getattr(self, name) for name in self.components}

    def pipeline(self):
        """The diffusers :attr:`pipeline_class` over this family's modules, with the folder's scheduler."""
        scheduler = getattr(diffusers, self.scheduler_config["_class_name"]).from_config(
            self.scheduler_config
        )
        return getattr(diffusers, self.pipeline_class)(scheduler=scheduler, **self.pipeline_components())

    def save_pretrained(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        pipe = self.pipeline()
        if dtype is not None:  # a copy: the live transformer keeps its dtype
            for name in ("transformer", "transformer_2"):
                if getattr(pipe, name, None) is not None:
                    setattr(pipe, name, copy.deepcopy(getattr(pipe, name)).to(dtype))
        pipe.save_pretrained(path)
        write_family_file(Path(path), self.description.name)

    def load_snippet(self, path: str | Path) -> str:
        return f"pipe = {self.pipeline_class}.from_pretrained({str(path)!r})"

    def save_lora(self, out_dir: str | Path) -> str:
        """The transformer's adapter via ``<pipeline_class>.save_lora_weights``, with its rank and
        alpha in the metadata (``load_lora_weights(out_dir)`` reads it back)."""
        self.write_lora(out_dir, get_peft_model_state_dict(self.transformer))
        return f"pipe = {self.pipeline_class}.from_pretrained(BASE); pipe.load_lora_weights({str(out_dir)!r})"

    def write_lora(self, out_dir: str | Path, layers: dict[str, torch.Tensor]) -> None:
        """``layers`` (a peft state dict of the transformer's adapter) via
        ``<pipeline_class>.save_lora_weights``, with the adapter's config in the metadata."""
        getattr(diffusers, self.pipeline_class).save_lora_weights(
            out_dir,
            transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=self.transformer.peft_config["default"].to_dict(),
        )


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``; None when the file is missing, unreadable (a FIFO, nested too
    deeply, over 256 MB) or not an object: the load reports it."""
    try:
        return read_json_object(path, "JSON file", PART_FIX)
    except UserFileError:
        return None


def meta_transformer(
    description: type[FamilyDescription], model_cls: type, config: Config, folder: Path
) -> tuple[nn.Module, Any] | None:
    """Where a family's :meth:`~diffrl.models.base.FamilyDescription.planned` starts: the
    transformer of ``folder/transformer/config.json`` on the meta device in ``model.dtype``
    (:func:`~diffrl.models.base.meta_model`), with gradient checkpointing where ``model.options``
    asks for it, and those options bound (``description.parse_options``); None without the file."""
    settings = read_json(folder / "transformer" / "config.json")
    if settings is None:
        return None
    module = meta_model(model_cls, settings, DTYPES[config.model.dtype])
    options = description.parse_options(config.model.options)
    if options.gradient_checkpointing:
        module.enable_gradient_checkpointing()
    return module, options


def latent_stats(vae_config: Any, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A video VAE's per-channel ``latents_mean`` and ``1 / latents_std`` (``AutoencoderKLWan``,
    ``AutoencoderKLQwenImage``: the pipelines' latents are ``(z - mean) / std``), shaped
    ``(1, C, 1, 1, 1)`` on ``like``'s device and dtype."""
    shape = (1, vae_config.z_dim, 1, 1, 1)
    mean = torch.tensor(vae_config.latents_mean).view(shape).to(like.device, like.dtype)
    inv_std = 1.0 / torch.tensor(vae_config.latents_std).view(shape).to(like.device, like.dtype)
    return mean, inv_std


def as_videos(family: ModelFamily, images: torch.Tensor) -> torch.Tensor:
    """``images (B, 3, H, W)`` as one-frame videos ``(B, 3, 1, H, W)`` (only when
    ``family.options.num_frames`` is 1), videos ``(B, 3, F, H, W)`` as they are."""
    if images.ndim == 4:
        if family.options.num_frames != 1:
            raise ValueError(
                f"{family.description.name}: still images (B, 3, H, W) given while model.options.num_frames="
                f"{family.options.num_frames}; train on an image dataset with num_frames: 1"
            )
        images = images.unsqueeze(2)
    return images


def encode_normalised_videos(family: ModelFamily, vae: nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``images (B, 3, H, W)`` (one-frame videos, only when ``family.options.num_frames`` is 1) or
    videos ``(B, 3, F, H, W)`` in [0, 1] -> the VAE's mode normalised by :func:`latent_stats`,
    ``(B, C, F', h, w)`` float32; one video at a time (VAE memory grows with frames x pixels). The
    ``AutoencoderKLWan`` families' ``encode_images``."""
    x = (as_videos(family, images) * 2.0 - 1.0).to(family.device, vae.dtype)
    z = torch.cat([vae.encode(v[None]).latent_dist.mode() for v in x])
    mean, inv_std = latent_stats(vae.config, z)
    return ((z - mean) * inv_std).float()
