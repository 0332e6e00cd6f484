"""One config schema for every command, validated before anything loads.

Recipes are YAML files that fill :class:`Config`; ``key=value`` overrides on the command line
(``train.lr=3e-4``, ``model.lora.rank=16``) are applied on top. :func:`load_config` reports every
problem at once: unknown keys (with a "did you mean"), wrong types, out-of-range numbers, impossible
batch arithmetic, unreadable files, sizes the model cannot take, unknown registry names and
algorithm-specific checks; ``sections`` says which parts of the config a command uses, so that
``export`` does not need the training rewards installed.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

from diffrl.errors import DiffrlError
from diffrl.registry import RegistryError, did_you_mean


class ConfigError(DiffrlError, ValueError):
    """All problems found in a config, one per line."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source} is not well-formed, found the following errors:\n{lines}")


# --------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------


@dataclass
class RunConfig:
    name: str = "diffrl"
    output_dir: str | None = None
    """Where checkpoints, metrics and images go; default ``runs/<name>``."""
    seed: int = 0
    device: str = "auto"
    """``auto`` (cuda if available, else cpu), ``cpu``, ``cuda`` or ``cuda:N``."""
    log_every: int = 1

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir or f"runs/{self.name}")


@dataclass
class LoraConfig:
    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: list[str] | None = None
    """``None`` takes the model family's default targets."""
    init: Literal["gaussian", "default"] = "gaussian"


@dataclass
class ModelConfig:
    family: str = "tiny"
    path: str = "base"
    """``base`` (the family's shipped weights), ``random`` (initialised from the family's
    built-in config), or a local directory in diffusers layout."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    lora: LoraConfig | None = None
    """LoRA on the transformer; ``null`` trains all transformer weights."""
    options: dict[str, Any] = field(default_factory=dict)
    """Family-specific options, validated by the family's ``Options`` dataclass."""


@dataclass
class SamplingConfig:
    num_steps: int = 10
    shift: float | None = None
    """A static schedule shift (SD3's ``shift``); ``None`` takes the schedule of the family's own
    pipeline (SD3, tiny: 3.0; Wan: the folder's ``flow_shift``; FLUX, Qwen-Image: shifted by the
    image's token count)."""
    guidance_scale: float | None = None
    """Classifier-free guidance with ``negative_prompt`` (1 disables it); ``None`` takes the family's
    default. FLUX.1 [dev]'s distilled guidance is a model option (``model.options.guidance``)."""
    negative_prompt: str = ""
    height: int | None = None
    """``None`` takes the family's default size."""
    width: int | None = None


@dataclass
class AlgorithmConfig:
    name: str = "sft"
    params: dict[str, Any] = field(default_factory=dict)
    """Validated by the algorithm's ``Params`` dataclass."""


@dataclass
class DataConfig:
    prompts: str = "builtin:tiny_text/train.txt"
    """Prompt set for online algorithms: ``.txt`` (one a line) or ``.jsonl``
    (``{"prompt": ..., "metadata": {...}}``). ``builtin:`` names a file shipped in diffrl."""
    dataset: str | None = "synthetic_text"
    """Offline image dataset for SFT: ``synthetic_text`` or a folder of images + captions."""
    dataset_size: int | None = None
    """Synthetic datasets: number of distinct examples (``None``: one per train prompt)."""


@dataclass
class RolloutConfig:
    """Online collection. ``batch_size x n_samples_per_prompt`` samples per rollout must equal
    ``train.batch_size x num_steps_per_rollout`` (samples per optimizer step x optimizer steps)."""

    batch_size: int = 8
    """Prompts per rollout (one group of samples each)."""
    n_samples_per_prompt: int = 4
    micro_group_size: int | None = None
    """Samples per sampling forward; ``None`` takes ``train.micro_batch_size`` (then the first
    replay in training runs the very same forwards as the rollout, bit for bit)."""
    num_steps_per_rollout: int = 1
    """Optimizer steps per rollout."""
    same_latent: bool = False
    """Samples of one prompt group start from the same initial noise (flow_grpo's
    ``sample.same_latent``): their rewards then differ only through the stochastic steps."""


@dataclass
class TrainConfig:
    iterations: int = 10
    batch_size: int = 16
    """Examples per optimizer step (global)."""
    micro_batch_size: int = 8
    """Examples per forward/backward; gradients accumulate over batch_size / micro_batch_size."""
    lr: float = 1e-4
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-8
    grad_clip: float | None = 1.0
    lr_schedule: Literal["constant", "cosine", "linear"] = "constant"
    warmup_steps: int = 0
    ema_decay: float | None = None
    """EMA of the trainable weights (used for eval and saved with checkpoints)."""
    save_every: int = 0
    """Checkpoint every N iterations (0: only the final one)."""
    eval_every: int = 0
    """Evaluate every N iterations (0: only before and after training)."""
    time_budget_minutes: float | None = None
    """Stop after the iteration that passes this much training time (evals not counted), then
    evaluate and save as at the end of ``iterations``."""
    resume: str | None = None
    """A checkpoint of this run to continue from, at its iteration: trainable weights, optimizer
    and LR schedule, EMA and old policy. Rollout ids, prompts and noise continue as if the run
    had not stopped. The time budget counts this process's training time only. ``latest``: the
    newest verified checkpoint in the run's output folder, or a fresh start when there is none."""
    keep_last: int | None = None
    """Keep only the newest N ``step_*`` checkpoints (``final`` is always kept); ``None`` keeps all."""
    max_failed_iterations: int = 3
    """Stop the run (with an error) after this many consecutive iterations in which every
    sample's reward failed."""
    max_nonfinite_steps: int = 5
    """Stop the run (with an error naming the last good checkpoint) after this many consecutive
    optimizer steps skipped for a non-finite loss or gradient."""


@dataclass
class RewardConfig:
    name: str = "ocr"
    weight: float = 1.0
    params: dict[str, Any] = field(default_factory=dict)
    timeout_s: float = 300.0
    """Deadline for one scoring call (a micro-group); late samples are failed and counted."""


@dataclass
class EvalConfig:
    prompts: str = "builtin:tiny_text/test.txt"
    num_prompts: int | None = 64
    samples_per_prompt: int = 1
    seed: int = 1234
    batch_size: int = 32
    grid_images: int = 32
    rewards: list[RewardConfig] = field(default_factory=lambda: [RewardConfig()])
    enabled: bool = True


@dataclass
class RayConfig:
    """``runner: ray``: rollout engines, reward workers and FSDP2 trainer ranks as Ray actors."""

    address: str | None = None
    """``null``: start a local Ray cluster for this run; ``auto``: join the cluster started with
    ``ray start`` on this node; or ``host:port`` of a cluster's head."""
    num_engines: int = 1
    """Rollout engines; the micro-groups of a rollout are shared out among them."""
    num_reward_workers: int = 1
    """Actors per reward type, fed per micro-group as rollouts finish."""
    num_trainer_ranks: int = 1
    """FSDP2 ranks (one Ray actor each, in one placement group)."""
    colocate: bool = True
    """Engine i shares rank i's device (GPU runs); false: engines get devices of their own."""
    backend: str | None = None
    """torch.distributed backend; ``null``: nccl on GPU, gloo on CPU."""
    cpus_per_actor: float = 1.0


@dataclass
class Config:
    runner: Literal["local", "ray"] = "local"
    """``local``: one process; ``ray``: actors on a Ray cluster (see :class:`RayConfig`)."""
    ray: RayConfig = field(default_factory=RayConfig)
    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rewards: list[RewardConfig] = field(default_factory=list)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict[str, Any]:
        return to_plain(self)


# --------------------------------------------------------------------------------------------
# Binding plain data to dataclasses, collecting every error
# --------------------------------------------------------------------------------------------


def to_plain(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple | list):
        return [to_plain(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    return obj


def _type_name(tp: Any) -> str:
    if tp is type(None):
        return "null"
    if isinstance(tp, type):
        return tp.__name__
    return str(tp).replace("typing.", "")


def _bind_value(tp: Any, value: Any, where: str, errors: list[str]) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        options = get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            errors.append(f"{where}: null is not allowed (expected {_type_name(tp)})")
            return None
        non_null = [o for o in options if o is not type(None)]
        if len(non_null) == 1:
            return _bind_value(non_null[0], value, where, errors)
        for option in non_null:
            trial: list[str] = []
            bound = _bind_value(option, value, where, trial)
            if not trial:
                return bound
        errors.append(f"{where}: {value!r} is not a {_type_name(tp)}")
        return None
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            errors.append(f"{where}: {value!r} is not one of {list(allowed)}")
        return value
    if dataclasses.is_dataclass(tp):
        return bind_dataclass(tp, value, where, errors)
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            errors.append(f"{where}: expected a list, got {value!r}")
            return value
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                errors.append(f"{where}: expected {len(args)} values, got {len(value)}")
                return tuple(value)
            return tuple(
                _bind_value(a, v, f"{where}[{i}]", errors) for i, (a, v) in enumerate(zip(args, value))
            )
        item = args[0] if args else Any
        out = [_bind_value(item, v, f"{where}[{i}]", errors) for i, v in enumerate(value)]
        return tuple(out) if origin is tuple else out
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            errors.append(f"{where}: expected a mapping, got {value!r}")
        return value
    if tp is bool:
        if not isinstance(value, bool):
            errors.append(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            errors.append(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{where}: expected a number, got {value!r}")
            return value
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            errors.append(f"{where}: expected a string, got {value!r}")
        return value
    return value


def bind_dataclass(cls: type, data: Any, where: str, errors: list[str]) -> Any:
    """Build ``cls`` from a mapping; unknown keys and wrong types are appended to ``errors``."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        names = [f.name for f in dataclasses.fields(cls)]
        hint = f"; e.g. {{name: {data}}}" if isinstance(data, str) and "name" in names else ""
        errors.append(f"{where or 'config'}: expected a mapping, got {data!r}{hint}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{where}.{key}" if where else str(key)
        if key not in names:
            head, colon, _ = str(key).partition(":")
            hint = (  # YAML reads {rank:4} as the key "rank:4"; a mapping needs "key: value"
                f" YAML needs a space after the colon: write {{{head}: ...}}."
                if colon and head in names
                else did_you_mean(str(key), names)
            )
            errors.append(f"unknown key {path!r}.{hint} Valid keys here: {', '.join(names)}")
            continue
        before = len(errors)
        bound = _bind_value(hints[key], value, path, errors)
        # a bad value keeps the default so later checks still run; a section keeps its good keys
        if len(errors) == before or dataclasses.is_dataclass(bound):
            kwargs[key] = bound
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # a dataclass's own __post_init__ check
        errors.append(f"{where or 'config'}: {e}")
        return cls()


# --------------------------------------------------------------------------------------------
# Loading: YAML + overrides + semantic validation
# --------------------------------------------------------------------------------------------


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``["train.lr=1e-4", "model.lora=null"]`` -> nested dict. Values are parsed as YAML."""
    tree: dict[str, Any] = {}
    problems = []
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            problems.append(f"override {item!r} is not of the form key=value (e.g. train.lr=1e-4)")
            continue
        try:
            value = yaml.safe_load(raw) if raw != "" else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.strip().split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                problems.append(f"override {item!r} conflicts with another override of {part!r}")
                break
        else:
            node[parts[-1]] = _Replace(value) if isinstance(value, dict) else value
    if problems:
        raise ConfigError(problems, "command line")
    return tree


class _Replace(dict):
    """A mapping given whole on the command line: it replaces the recipe's, it is not merged."""


def deep_merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in update.items():
        if isinstance(v, _Replace):
            out[k] = dict(v)
        elif isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = v
    return out


def read_recipe(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        raise ConfigError(
            [
                f"{str(path)!r} is a folder; give a recipe .yaml file (list the shipped ones with 'diffrl recipes')"
            ],
            str(path),
        )
    if not path.is_file():
        hint = ""
        shipped = recipes_dir() / path.name
        if shipped.is_file() and shipped != path:
            hint = f" A shipped recipe of that name is at {shipped}."
        raise ConfigError(
            [f"recipe file {str(path)!r} does not exist.{hint} List them with 'diffrl recipes'."], str(path)
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(
            [f"not a text file (byte {e.start} is not UTF-8); a recipe is a YAML file of sections"], str(path)
        ) from e
    except OSError as e:
        raise ConfigError([f"cannot read the recipe: {e.strerror}"], str(path)) from e
    except yaml.YAMLError as e:
        raise ConfigError([f"not valid YAML: {e}"], str(path)) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            [f"the top level must be a mapping of sections, got {type(data).__name__}"], str(path)
        )
    return data


def recipes_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "recipes"


SECTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(Config))
"""The top-level sections of :class:`Config`; ``load_config(sections=...)`` checks those given."""


def load_config(
    recipe: str | Path | dict[str, Any] | None = None,
    overrides: list[str] | None = None,
    check_files: bool = True,
    sections: Collection[str] = SECTIONS,
) -> Config:
    """Recipe (path or dict) + ``key=value`` overrides -> validated :class:`Config`.

    Every key of the whole config is bound (unknown keys and wrong types are errors everywhere);
    the semantic checks run for the ``sections`` the command uses: training uses them all, ``eval``
    ``("run", "model", "sampling", "eval")``, ``sample`` no eval, ``export`` only ``run`` and
    ``model``. So a checkpoint whose run used a reward of the user's own package exports without
    that package installed. ``check_files`` also checks what the config points at on this machine:
    files and folders, the GPUs ``run.device`` names, the Ray cluster at ``ray.address``.
    """
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:  # a programming error in a command, not a user's
        raise ValueError(f"unknown config sections {unknown}; known: {', '.join(SECTIONS)}")
    source = str(recipe) if isinstance(recipe, str | Path) else "config"
    data = read_recipe(recipe) if isinstance(recipe, str | Path) else dict(recipe or {})
    data = deep_merge(data, parse_overrides(overrides or []))
    errors: list[str] = []
    config = bind_dataclass(Config, data, "", errors)
    errors.extend(validate(config, check_files=check_files, sections=sections))
    if errors:
        raise ConfigError(errors, source)
    if config.sampling.guidance_scale is None:  # resolved once: everything downstream sees a number
        from diffrl.models.registry import FAMILIES

        config.sampling.guidance_scale = float(FAMILIES.resolve(config.model.family).default_guidance)
    return config


def resolve_data_path(path: str) -> Path:
    """``builtin:tiny_text/test.txt`` -> the file shipped in diffrl; anything else as given."""
    if path.startswith("builtin:"):
        return Path(__file__).resolve().parent / "data" / path.removeprefix("builtin:")
    return Path(path).expanduser()


def validate(config: Config, check_files: bool = True, sections: Collection[str] = SECTIONS) -> list[str]:
    """Semantic checks that need more than types, for the ``sections`` a command uses (see
    :func:`load_config`). Returns every problem found."""
    on = set(sections)
    errors: list[str] = []
    if "runner" in on or "ray" in on:
        errors += _ray_checks(config, check_files)
    if "run" in on:
        errors += _run_checks(config, on, check_files)
    if "train" in on:
        errors += _train_checks(config, check_files)
    if "sampling" in on:
        errors += _sampling_checks(config.sampling)
    if "model" in on:
        errors += _model_checks(config, check_files, size="sampling" in on)
    online = False
    if "algorithm" in on:
        algorithm_errors, online = _algorithm_checks(config)
        errors += algorithm_errors
    if "rewards" in on:
        errors += _reward_checks("rewards", config.rewards)
    if "eval" in on and config.eval.enabled:
        errors += _eval_checks(config.eval, check_files)
    if "data" in on:
        errors += _data_checks(config, online, check_files)
    # train.resume is checked by the driver before any model loads (it verifies the checkpoint's
    # files, see train/run_folder.py), after this config is known to be well-formed
    return errors


def _number(where: str, value: float | None, ok: bool, expected: str) -> list[str]:
    """``[f"{where} must be {expected}, got {value}"]`` unless ``value`` is finite and ``ok``
    (``None`` is left to the caller: pass ``ok=True`` for a field where null is allowed)."""
    if value is None:
        return []
    if not math.isfinite(value) or not ok:
        return [f"{where} must be {expected}, got {value}"]
    return []


TORCH_SEEDS = (-(2**63), 2**64 - 1)
"""The seeds ``torch.manual_seed`` takes."""


def _run_checks(config: Config, sections: set[str], check_files: bool) -> list[str]:
    import torch

    run, errors = config.run, []
    if not run.name.strip():
        errors.append("run.name must not be empty (it names the run folder runs/<name>)")
    if not TORCH_SEEDS[0] <= run.seed <= TORCH_SEEDS[1]:
        errors.append(f"run.seed must be in [-2**63, 2**64 - 1] (torch's seed range), got {run.seed}")
    if run.log_every < 1:
        errors.append(f"run.log_every must be >= 1 (print every N iterations), got {run.log_every}")
    device = run.device
    if device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", device):
        errors.append(f"run.device must be auto, cpu, cuda or cuda:N, got {device!r}")
    elif device.startswith("cuda") and check_files and _uses_local_devices(config, sections):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = int(device.partition(":")[2] or 0)
        if count == 0:
            errors.append(
                f"run.device={device}, but torch sees no CUDA GPU on this machine "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'none'}); "
                "use run.device=cpu (or auto), or install a CUDA build of torch on a GPU machine"
            )
        elif index >= count:
            errors.append(
                f"run.device={device}, but this machine has {count} CUDA GPU(s) (cuda:0 to "
                f"cuda:{count - 1}); pick one of them"
            )
    return errors


def _uses_local_devices(config: Config, sections: set[str]) -> bool:
    """True when the model runs on this machine: one process, or Ray on a local cluster (a
    cluster at ``host:port`` has GPUs of its own, checked when it starts)."""
    if "runner" not in sections or config.runner == "local":
        return True
    return config.ray.address in (None, "auto")


def _train_checks(config: Config, check_files: bool) -> list[str]:
    t, errors = config.train, []
    for name in ("iterations", "batch_size", "micro_batch_size"):
        if getattr(t, name) < 1:
            errors.append(f"train.{name} must be >= 1, got {getattr(t, name)}")
    if t.batch_size >= 1 and t.micro_batch_size >= 1 and t.batch_size % t.micro_batch_size:
        errors.append(
            f"train.batch_size ({t.batch_size}) must be a multiple of train.micro_batch_size "
            f"({t.micro_batch_size}); e.g. set train.micro_batch_size={_largest_divisor(t.batch_size, t.micro_batch_size)}"
        )
    errors += _number("train.lr", t.lr, 0 < t.lr <= 1, "in (0, 1] (e.g. 1e-4)")
    errors += _number(
        "train.weight_decay",
        t.weight_decay,
        0 <= t.weight_decay <= 1,
        "in [0, 1] (AdamW's decoupled decay; e.g. 0.01)",
    )
    for i, beta in enumerate(t.adam_betas):
        errors += _number(f"train.adam_betas[{i}]", beta, 0 <= beta < 1, "in [0, 1) (e.g. [0.9, 0.999])")
    errors += _number("train.adam_eps", t.adam_eps, 0 < t.adam_eps < 1, "in (0, 1) (e.g. 1e-8)")
    errors += _number(
        "train.grad_clip",
        t.grad_clip,
        t.grad_clip is None or t.grad_clip > 0,
        "a max gradient norm > 0, or null for none",
    )
    errors += _number(
        "train.ema_decay",
        t.ema_decay,
        t.ema_decay is None or 0 < t.ema_decay < 1,
        "in (0, 1) (e.g. 0.99), or null for no EMA",
    )
    errors += _number(
        "train.time_budget_minutes",
        t.time_budget_minutes,
        t.time_budget_minutes is None or t.time_budget_minutes > 0,
        "> 0 (or null for none)",
    )
    for name in ("warmup_steps", "save_every", "eval_every"):
        if getattr(t, name) < 0:
            errors.append(f"train.{name} must be >= 0 (0: none), got {getattr(t, name)}")
    if t.keep_last is not None and t.keep_last < 1:
        errors.append(f"train.keep_last must be >= 1 or null (keep all), got {t.keep_last}")
    for name in ("max_failed_iterations", "max_nonfinite_steps"):
        if getattr(t, name) < 1:
            errors.append(f"train.{name} must be >= 1, got {getattr(t, name)}")
    if check_files:
        errors += _output_dir_checks(config.run.resolved_output_dir())
    return errors


def _output_dir_checks(out: Path) -> list[str]:
    """``run.output_dir`` must be (or become) a folder: neither it nor a parent may be a file."""
    for p in (out, *out.parents):
        if p.exists():
            if not p.is_dir():
                what = "run.output_dir" if p == out else f"run.output_dir's parent {str(p)!r}"
                return [
                    f"run.output_dir: {str(out)!r} cannot be a folder: {what} is a file; "
                    "set run.output_dir (or run.name) to a folder path"
                ]
            if not os.access(p, os.W_OK):
                return [
                    f"run.output_dir: cannot write in {str(p)!r} (permission denied); choose another folder"
                ]
            break
    return []


def _sampling_checks(s: SamplingConfig) -> list[str]:
    errors = []
    if s.num_steps < 1:
        errors.append(f"sampling.num_steps must be >= 1, got {s.num_steps}")
    errors += _number(
        "sampling.shift",
        s.shift,
        s.shift is None or 0 < s.shift <= 100,
        "in (0, 100] (e.g. 3.0), or null for the family's",
    )
    errors += _number(
        "sampling.guidance_scale",
        s.guidance_scale,
        s.guidance_scale is None or 1 <= s.guidance_scale <= 100,
        "in [1, 100] (1 disables CFG; e.g. 4.5), or null for the family's",
    )
    for name in ("height", "width"):
        value = getattr(s, name)
        if value is not None and value < 1:
            errors.append(
                f"sampling.{name} must be >= 1 pixel, or null for the family's default, got {value}"
            )
    return errors


def _model_checks(config: Config, check_files: bool, size: bool) -> list[str]:
    """``model.*`` and, with ``size``, the family's constraints on ``sampling.height/width``."""
    from diffrl.models.base import ModelFamily
    from diffrl.models.registry import FAMILIES

    errors = []
    lora = config.model.lora
    if lora is not None:
        if lora.rank < 1:
            errors.append(f"model.lora.rank must be >= 1, got {lora.rank}")
        errors += _number("model.lora.alpha", lora.alpha, lora.alpha > 0, "> 0 (e.g. twice the rank)")
        errors += _number("model.lora.dropout", lora.dropout, 0 <= lora.dropout < 1, "in [0, 1)")
    try:
        family_cls = FAMILIES.resolve(config.model.family)
    except RegistryError as e:
        return [*errors, f"model.family: {e}"]
    if not (isinstance(family_cls, type) and issubclass(family_cls, ModelFamily)):
        return [*errors, f"model.family: {config.model.family!r} is not a ModelFamily subclass"]
    errors += family_cls.validate_config(config, check_files=check_files)
    errors += family_cls.lora_problems(config, check_files=check_files)
    if size:
        errors += family_cls.size_problems(config, check_files=check_files)
    return errors


def _algorithm_checks(config: Config) -> tuple[list[str], bool]:
    """The algorithm's own checks and what its collection spec needs; returns (errors, online)."""
    from diffrl.algorithms.registry import build_algorithm

    try:
        algorithm = build_algorithm(config)
    except ConfigError as e:
        return e.problems, False
    except RegistryError as e:
        return [f"algorithm.name: {e}"], False
    errors = []
    spec = algorithm.collection_spec()
    if spec.needs_reward and not config.rewards:
        errors.append(
            f"algorithm {algorithm.name!r} needs a reward; add a 'rewards:' list (e.g. - name: ocr)"
        )
    if spec.online:
        errors.extend(_rollout_arithmetic(config))
    if not spec.online and not config.data.dataset:
        errors.append(
            f"algorithm {algorithm.name!r} trains on an offline dataset; set data.dataset "
            "(synthetic_text or a folder of images + captions)"
        )
    missing = sorted(set(algorithm.requires) - spec.provides())
    if missing:
        errors.append(
            f"algorithm {algorithm.name!r} trains on {', '.join(missing)}, which its collection_spec() "
            "does not collect; have the spec provide it (online collection records images and "
            "sigmas; keep_trajectory / keep_log_prob with a stochastic sampler and step strategy "
            "record the trajectory) or do not require it"
        )
    errors.extend(algorithm.validate(config))
    return errors, spec.online


def _reward_checks(where: str, rewards: list[RewardConfig]) -> list[str]:
    from diffrl.rewards.registry import REWARDS

    errors = []
    for i, r in enumerate(rewards):
        try:
            REWARDS.resolve(r.name)
        except RegistryError as e:
            errors.append(f"{where}[{i}].name: {e}")
        errors += _number(f"{where}[{i}].weight", r.weight, True, "a finite number (e.g. 1.0)")
        if not r.timeout_s > 0 or r.timeout_s == float("inf"):  # NaN fails both
            errors.append(f"{where}[{i}].timeout_s must be a number of seconds > 0, got {r.timeout_s}")
    return errors


def _eval_checks(e: EvalConfig, check_files: bool) -> list[str]:
    errors = []
    for name in ("samples_per_prompt", "batch_size", "grid_images"):
        if getattr(e, name) < 1:
            errors.append(f"eval.{name} must be >= 1, got {getattr(e, name)}")
    if e.num_prompts is not None and e.num_prompts < 1:
        errors.append(
            f"eval.num_prompts must be >= 1, or null for every prompt of the file, got {e.num_prompts}"
        )
    errors += _reward_checks("eval.rewards", e.rewards)
    if check_files:
        count, problem = _prompt_count(e.prompts)
        if problem:
            errors.append(f"eval.prompts: {problem}")
        elif e.num_prompts is not None and e.num_prompts > count:
            errors.append(
                f"eval.num_prompts is {e.num_prompts}, but eval.prompts {e.prompts!r} holds {count} "
                f"prompts; ask for at most {count} (null: all of them)"
            )
    return errors


def _prompt_count(path: str) -> tuple[int, str | None]:
    """The number of prompts in a prompt file, or the problem that makes it unreadable."""
    from diffrl.data.prompts import PromptFileError, load_prompts

    try:
        return len(load_prompts(path)), None
    except PromptFileError as e:
        return 0, str(e)


def _data_checks(config: Config, online: bool, check_files: bool) -> list[str]:
    d, errors = config.data, []
    if d.dataset_size is not None and d.dataset_size < 1:
        errors.append(
            f"data.dataset_size must be >= 1, or null for one example per prompt, got {d.dataset_size}"
        )
    if not check_files:
        return errors
    # online rollouts sample data.prompts; the synthetic dataset renders them
    if online or d.dataset == "synthetic_text":
        _, problem = _prompt_count(d.prompts)
        if problem:
            errors.append(f"data.prompts: {problem}")
    if d.dataset and d.dataset != "synthetic_text" and not online:
        from diffrl.data.offline import DatasetError, scan_image_folder

        try:
            scan_image_folder(d.dataset)
        except DatasetError as e:
            errors.append(f"data.dataset: {e}")
    return errors


def _rollout_arithmetic(config: Config) -> list[str]:
    r, t = config.rollout, config.train
    errors = []
    for name in ("batch_size", "n_samples_per_prompt", "num_steps_per_rollout"):
        if getattr(r, name) < 1:
            errors.append(f"rollout.{name} must be >= 1, got {getattr(r, name)}")
    if r.micro_group_size is not None and r.micro_group_size < 1:
        errors.append(f"rollout.micro_group_size must be >= 1 or null, got {r.micro_group_size}")
    if errors:
        return errors
    samples = r.batch_size * r.n_samples_per_prompt
    if samples != t.batch_size * r.num_steps_per_rollout:
        fix = samples // r.num_steps_per_rollout if samples % r.num_steps_per_rollout == 0 else None
        hint = f"; e.g. set train.batch_size={fix}" if fix else ""
        errors.append(
            f"batch arithmetic: rollout.batch_size x rollout.n_samples_per_prompt = {r.batch_size} x "
            f"{r.n_samples_per_prompt} = {samples} samples per rollout, but train.batch_size x "
            f"rollout.num_steps_per_rollout = {t.batch_size} x {r.num_steps_per_rollout} = "
            f"{t.batch_size * r.num_steps_per_rollout}; they must be equal{hint}"
        )
    return errors


def _ray_checks(config: Config, check_files: bool) -> list[str]:
    import importlib.util

    r, errors = config.ray, []
    if config.runner != "ray":
        return errors
    if importlib.util.find_spec("ray") is None:
        errors.append("runner=ray needs the ray package: pip install 'ray>=2.40'")
    for name in ("num_engines", "num_reward_workers", "num_trainer_ranks"):
        if getattr(r, name) < 1:
            errors.append(f"ray.{name} must be >= 1, got {getattr(r, name)}")
    errors += _number("ray.cpus_per_actor", r.cpus_per_actor, r.cpus_per_actor >= 0, ">= 0")
    if r.address not in (None, "auto") and ray_host_port(r.address) is None:
        errors.append(
            f"ray.address must be null (start a local cluster), auto (the cluster 'ray start' began on "
            f"this node) or HOST:PORT of a cluster's head (e.g. 10.0.0.5:6379), got {r.address!r}"
        )
    elif r.address is not None and check_files and not errors:
        problem = ray_address_problem(r.address)
        if problem:
            errors.append(problem)
    if r.backend not in (None, "gloo", "nccl"):
        errors.append(f"ray.backend must be gloo, nccl or null, got {r.backend!r}")
    ranks, per_step = r.num_trainer_ranks, config.train.batch_size
    if ranks >= 1 and per_step % ranks:
        errors.append(
            f"batch arithmetic: train.batch_size={per_step} samples per optimizer step do not split "
            f"evenly over ray.num_trainer_ranks={ranks} (ranks take whole samples)"
        )
    return errors


def ray_host_port(address: str) -> tuple[str, int] | None:
    """``"host:port"`` or ``"ray://host:port"`` -> ``(host, port)``; None when it is neither."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]\s/]+?)\]?:(\d{1,5})", address.strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return m.group(1), int(m.group(2))


RAY_CONNECT_TIMEOUT_S = 3.0


def ray_address_problem(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> str | None:
    """Why ``ray.init(address=address)`` would fail (None when a Ray head accepts TCP connections
    there): checked in seconds, where Ray itself retries for half a minute before it gives up."""
    import socket

    if address == "auto":
        try:  # Ray's own lookup: RAY_ADDRESS, then the cluster 'ray start' recorded on this node
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            return None  # no ray (reported apart) or a Ray that moved it: ray.init will tell
        try:
            found = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError):
            found = None
        if found is None:
            return (
                "ray.address=auto, but no Ray cluster runs on this node (none started with 'ray start' "
                "and RAY_ADDRESS is not set); start one with 'ray start --head', give HOST:PORT of a "
                "cluster's head, or set ray.address=null to start a local cluster for this run"
            )
        address = found
    host_port = ray_host_port(address)
    if host_port is None:
        return f"ray.address: {address!r} is not HOST:PORT"
    host, port = host_port
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        return (
            f"ray.address={address!r}: nothing accepts connections at {host}:{port} ({reason}, "
            f"{timeout_s:g} s); start the cluster's head there ('ray start --head --port={port}'), fix "
            "the address, or set ray.address=null to start a local cluster for this run"
        )


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)


def dump_config(config: Config, path: Path) -> None:
    path.write_text(yaml.safe_dump(config.to_dict(), sort_keys=False))
