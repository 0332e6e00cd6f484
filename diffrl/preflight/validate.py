"""Pre-flight: the whole-system checks of a config, before anything loads, every problem at once.

It sits at the top of the layers (it may import everything): the checks ask the plugins a config
names (the model family, the algorithm and its collection spec, the rewards, the runner) about
their own settings, and check the batch arithmetic and the files and devices the config points at.
:func:`load_config` is what every command calls: bind (:mod:`diffrl.config.binding`), then check.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.config import (
    SECTIONS,
    Config,
    ConfigError,
    EvalConfig,
    RewardConfig,
    SamplingConfig,
    bind_config,
)
from diffrl.config import number_problem as _number
from diffrl.data.hf import EVAL_SPLITS, TRAIN_SPLITS
from diffrl.data.offline import SYNTHETIC, DatasetError, scan_image_data, scan_pair_folder
from diffrl.data.prompts import PromptFileError, PromptSet, crop_box, edit_mismatch, image_size, load_prompts
from diffrl.logging import tracker_problems
from diffrl.models.base import ModelFamily, SourceError
from diffrl.models.registry import FAMILIES
from diffrl.registry import RegistryError
from diffrl.rewards.base import Reward, param_name_problems
from diffrl.rewards.registry import REWARDS
from diffrl.rollout import CollectionSpec
from diffrl.train.runner import RUNNERS


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
    config, errors, source = bind_config(recipe, overrides)
    errors.extend(validate(config, check_files=check_files, sections=sections))
    if errors:
        raise ConfigError(errors, source)
    if config.sampling.guidance_scale is None:  # resolved once: everything downstream sees a number
        config.sampling.guidance_scale = float(FAMILIES.resolve(config.model.family).default_guidance)
    return config


def validate(config: Config, check_files: bool = True, sections: Collection[str] = SECTIONS) -> list[str]:
    """Semantic checks that need more than types, for the ``sections`` a command uses (see
    :func:`load_config`). Returns every problem found."""
    on = set(sections)
    errors: list[str] = []
    _prompt_set.cache_clear()
    if "runner" in on or "ray" in on:
        errors += _runner_checks(config, check_files)
    if "run" in on:
        errors += _run_checks(config, on, check_files)
    if "train" in on:
        errors += _train_checks(config, check_files)
    if "sampling" in on:
        errors += _sampling_checks(config.sampling, _no_guidance_scale(config.model.family))
    if "model" in on:
        errors += _model_checks(config, check_files, size="sampling" in on)
    spec = None
    if "algorithm" in on:
        algorithm_errors, spec = _algorithm_checks(config)
        errors += algorithm_errors
    if "rewards" in on:
        errors += _reward_checks("rewards", config.rewards, check_files)
    if "eval" in on and config.eval.enabled:
        errors += _eval_checks(config.eval, check_files)
    if "data" in on:
        errors += _data_checks(config, spec, check_files)
    if "model" in on:
        errors += _hearing_checks(config, "rewards" in on, "eval" in on and config.eval.enabled)
    if "model" in on:
        errors += _editing_checks(config, spec, check_files, "data" in on, "eval" in on)
    # train.resume is checked by the driver before any model loads (it verifies the checkpoint's
    # files, see train/run_folder.py), after this config is known to be well-formed
    return errors


TORCH_SEEDS = (-(2**63), 2**64 - 1)
"""The seeds ``torch.manual_seed`` takes."""


def _run_checks(config: Config, sections: set[str], check_files: bool) -> list[str]:
    run, errors = config.run, []
    if not run.name.strip():
        errors.append("run.name must not be empty (it names the run folder runs/<name>)")
    if not TORCH_SEEDS[0] <= run.seed <= TORCH_SEEDS[1]:
        errors.append(f"run.seed must be in [-2**63, 2**64 - 1] (torch's seed range), got {run.seed}")
    if run.log_every < 1:
        errors.append(f"run.log_every must be >= 1 (print every N iterations), got {run.log_every}")
    if "train" in sections:  # only training logs to the trackers
        errors += tracker_problems(run.loggers, "run.loggers")
        if "wandb" in run.loggers and not run.wandb_project.strip():
            errors.append(
                "run.wandb_project must not be empty with the wandb logger (e.g. run.wandb_project=diffrl)"
            )
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
    """True when the model runs on this machine (the runner says; a Ray cluster at ``host:port``
    has GPUs of its own, checked when it starts)."""
    if "runner" not in sections:
        return True
    try:
        runner = RUNNERS.resolve(config.runner)
    except RegistryError:
        return True  # reported by the runner checks
    return bool(getattr(runner, "uses_local_devices", lambda c: True)(config))


def _runner_checks(config: Config, check_files: bool) -> list[str]:
    """``runner`` names a runner class; the runner checks its own settings (``ray.*`` for Ray)."""
    try:
        runner = RUNNERS.resolve(config.runner)
    except RegistryError as e:
        return [f"runner: {e}"]
    if not isinstance(runner, type):
        return [
            f"runner: {config.runner!r} is not a class (a runner is built as Runner(config, algorithm, spec))"
        ]
    check = getattr(runner, "validate", None)
    return list(check(config, check_files)) if check is not None else []


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


def _no_guidance_scale(family: str) -> float:
    """The family's ``no_guidance_scale``: the lowest ``sampling.guidance_scale``, where its CFG
    is off (1 for ``neg + s (pos - neg)``, 0 for Z-Image's ``pos + s (pos - neg)``); 1 when the
    family is unknown (``model.family``'s check reports that)."""
    try:
        cls = FAMILIES.resolve(family)
    except RegistryError:
        return 1.0
    return float(getattr(cls, "no_guidance_scale", 1.0))


def _sampling_checks(s: SamplingConfig, no_guidance: float = 1.0) -> list[str]:
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
        s.guidance_scale is None or no_guidance <= s.guidance_scale <= 100,
        f"in [{no_guidance:g}, 100] ({no_guidance:g} disables the family's CFG; e.g. 4.5), or null "
        "for the family's",
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


def _algorithm_checks(config: Config) -> tuple[list[str], CollectionSpec | None]:
    """The algorithm's own checks and what its collection spec needs; returns (errors, spec)."""
    try:
        algorithm = build_algorithm(config)
    except ConfigError as e:
        return e.problems, None
    except RegistryError as e:
        return [f"algorithm.name: {e}"], None
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
    return errors, spec


def _reward_checks(where: str, rewards: list[RewardConfig], check_files: bool) -> list[str]:
    errors = []
    for i, r in enumerate(rewards):
        try:
            obj = REWARDS.resolve(r.name)
        except RegistryError as e:
            errors.append(f"{where}[{i}].name: {e}")
        else:
            if not isinstance(r.params, dict):
                errors.append(f"{where}[{i}].params must be a mapping of name: value, got {r.params!r}")
            else:
                problems = param_name_problems(obj, r.params)
                if not problems and isinstance(obj, type) and issubclass(obj, Reward):
                    problems = obj.param_problems(r.params, check_files)
                errors += [f"{where}[{i}] ({r.name}).params: {p}" for p in problems]
        errors += _number(f"{where}[{i}].weight", r.weight, True, "a finite number (e.g. 1.0)")
        if not r.timeout_s > 0 or r.timeout_s == float("inf"):  # NaN fails both
            errors.append(f"{where}[{i}].timeout_s must be a number of seconds > 0, got {r.timeout_s}")
    return errors


def _hearing_checks(config: Config, rewards: bool, eval_rewards: bool) -> list[str]:
    """A reward that hears (``Reward.audio``) needs a family that makes sound (``ModelFamily.sound``)."""
    try:
        family_cls = FAMILIES.resolve(config.model.family)
    except RegistryError:
        return []  # reported by _model_checks
    if getattr(family_cls, "sound", False):
        return []
    lists = [("rewards", config.rewards)] * rewards + [("eval.rewards", config.eval.rewards)] * eval_rewards
    errors = []
    for where, configs in lists:
        for i, r in enumerate(configs):
            try:
                obj = REWARDS.resolve(r.name)
            except RegistryError:
                continue  # reported by _reward_checks
            is_reward = isinstance(obj, type) and issubclass(obj, Reward)
            if (
                obj.hears(r.params)
                if is_reward and isinstance(r.params, dict)
                else getattr(obj, "audio", False)
            ):
                errors.append(
                    f"{where}[{i}] ({r.name}) scores sound, but model family {config.model.family!r} "
                    "makes none (its samples are silent); use an audio-video family (e.g. ltx2) or "
                    "drop this reward"
                )
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
    errors += _reward_checks("eval.rewards", e.rewards, check_files)
    if check_files:
        count, problem = _prompt_count(e.prompts, EVAL_SPLITS)
        if problem:
            errors.append(f"eval.prompts: {problem}")
        elif e.num_prompts is not None and e.num_prompts > count:
            errors.append(
                f"eval.num_prompts is {e.num_prompts}, but eval.prompts {e.prompts!r} holds {count} "
                f"prompts; ask for at most {count} (null: all of them)"
            )
    return errors


def _prompt_count(path: str, splits: tuple[str, ...] = TRAIN_SPLITS) -> tuple[int, str | None]:
    """The number of prompts in a prompt file (``splits``: the split a ``datasets`` folder
    without one named reads), or the problem that makes it unreadable."""
    prompts, problem = _prompt_set(path, splits)
    return (0, problem) if prompts is None else (len(prompts), None)


@functools.lru_cache(maxsize=8)  # cleared by validate: files may change between two validations
def _prompt_set(path: str, splits: tuple[str, ...] = TRAIN_SPLITS) -> tuple[PromptSet | None, str | None]:
    """A prompt file's prompts (each source image checked), or the problem that makes it
    unreadable; read once per :func:`validate` (several checks ask for it, and each of an edit
    set's images is opened to be checked)."""
    try:
        return load_prompts(path, splits), None
    except PromptFileError as e:
        return None, str(e)


def _source_size_checks(config: Config, family: type, images: list[Path]) -> list[str]:
    """Every source image of a run must resize to one size (``ModelFamily.source_size``: the rows
    are batched): the first two sizes found, with a file of each, when they do not."""
    s = config.sampling
    if not images or not (
        isinstance(s.height, int) and isinstance(s.width, int) and s.height > 0 and s.width > 0
    ):
        return []  # the family's default size is known only once it loads; it checks then
    found: dict[Any, Path] = {}
    for image in images:
        _, _, w, h = crop_box(*image_size(image), s.height, s.width)
        try:
            size = family.source_size(config, w, h)
        except SourceError as e:
            return [f"source image {str(image)!r}: {e}"]
        if size is None:
            return []
        found.setdefault(size, image)
        if len(found) > 1:
            (a, first), (b, second) = found.items()
            return [
                f"the source images resize to different sizes for model family {config.model.family!r}: "
                f"{str(first)!r} to {a}, {str(second)!r} to {b}; the rows of a run are batched, so "
                "every source needs one size: give images of one aspect ratio and size (they are "
                f"centre-cropped to sampling.height : sampling.width = {s.height} : {s.width} first)"
            ]
    return []


def _editing_checks(
    config: Config, spec: CollectionSpec | None, check_files: bool, data: bool, evals: bool
) -> list[str]:
    """An editing family (``ModelFamily.edits``) needs source images on every prompt it samples
    (``data.prompts`` online, ``eval.prompts``) and edit pairs offline (``synthetic_edit``);
    any other family takes none."""
    try:
        family = FAMILIES.resolve(config.model.family)
    except RegistryError:
        return []  # reported by _model_checks
    edits, errors = bool(getattr(family, "edits", False)), []
    name, d = config.model.family, config.data
    online = spec is not None and spec.online
    files = [("data.prompts", d.prompts, TRAIN_SPLITS)] * (data and online)
    files += [("eval.prompts", config.eval.prompts, EVAL_SPLITS)] * (evals and config.eval.enabled)
    images: list[Path] = []
    for where, path, splits in files if check_files else []:
        prompts, _ = _prompt_set(path, splits)  # unreadable files are reported by the data / eval checks
        if prompts is not None and prompts.edits != edits:
            errors.append(f"{where}: {edit_mismatch(name, edits, repr(path))}")
        elif prompts is not None and edits:
            images += [image for image in prompts.images if image is not None]
    errors += _source_size_checks(config, family, list(dict.fromkeys(images)))
    if data and spec is not None and not online and spec.offline_items == "images":
        if edits and d.dataset != "synthetic_edit":
            errors.append(
                f"data.dataset: model family {name!r} edits images, so it trains offline on edit pairs "
                f"(a source, an instruction, the edited image): data.dataset=synthetic_edit, got {d.dataset!r}"
            )
        elif not edits and d.dataset == "synthetic_edit":
            errors.append(
                f"data.dataset=synthetic_edit holds edit pairs, but model family {name!r} does not "
                "edit images; use synthetic_text or an image folder"
            )
    if data and edits and spec is not None and not online and spec.offline_items == "pairs":
        errors.append(
            f"model family {name!r} edits images, but a folder of preference pairs has no source "
            "images; train it on online pairs (algorithm.params.pairs: online)"
        )
    return errors


def _data_checks(config: Config, spec: CollectionSpec | None, check_files: bool) -> list[str]:
    """``spec``: the algorithm's collection spec (None when its config did not build)."""
    d, errors = config.data, []
    online = spec is not None and spec.online
    if d.dataset_size is not None and d.dataset_size < 1:
        errors.append(
            f"data.dataset_size must be >= 1, or null for one example per prompt, got {d.dataset_size}"
        )
    if not check_files:
        return errors
    # online rollouts sample data.prompts; the synthetic datasets render them
    if online or d.dataset in SYNTHETIC:
        _, problem = _prompt_count(d.prompts)
        if problem:
            errors.append(f"data.prompts: {problem}")
    if d.dataset and d.dataset not in SYNTHETIC and not online:
        try:
            pairs = spec is not None and spec.offline_items == "pairs"
            (scan_pair_folder if pairs else scan_image_data)(d.dataset)
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


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, max(1, min(n, at_most)) + 1) if n % d == 0)
