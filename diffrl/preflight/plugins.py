"""The second stage of the checks, and :func:`load_config`, which runs both.

The plugin stage asks the plugins a config names (the model family, the algorithm and its
collection spec, the rewards, the runner) about their own settings, and checks the files and
devices the config points at; each concern has its module beside this one. The command line runs
the schema stage (:mod:`diffrl.preflight.schema`, no torch) before it loads anything, then
:func:`check_plugins`; the library and the tests call :func:`load_config`, which reports both
stages' problems at once.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

from diffrl.config import SECTIONS, Config, ConfigError, bind_config
from diffrl.preflight.algorithm import algorithm_problems
from diffrl.preflight.data import data_problems, eval_prompt_problems, prompt_set
from diffrl.preflight.editing import editing_problems
from diffrl.preflight.model import guidance_problems, model_problems, resolve_guidance
from diffrl.preflight.monitor import monitor_problems, resolve_monitor
from diffrl.preflight.rewards import group_problems, hearing_problems, reward_problems
from diffrl.preflight.run import output_dir_problems, run_problems, runner_problems
from diffrl.preflight.schema import check_sections, schema_problems


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
    files and folders, the GPUs ``run.device`` names, the Ray cluster at ``ray.address``. Both
    stages' problems are raised at once.
    """
    check_sections(sections)
    config, errors, source = bind_config(recipe, overrides)
    errors.extend(validate(config, check_files=check_files, sections=sections))
    if errors:
        raise ConfigError(errors, source)
    resolve_guidance(config)
    resolve_monitor(config, sections)
    return config


def check_plugins(
    config: Config, source: str, sections: Collection[str] = SECTIONS, check_files: bool = True
) -> Config:
    """The plugin stage on a config the schema stage passed
    (:func:`diffrl.preflight.schema.read_config`): raise its problems at once as a
    :class:`ConfigError` naming ``source``; else resolve the family's defaults and return it."""
    check_sections(sections)
    errors = plugin_problems(config, check_files, sections)
    if errors:
        raise ConfigError(errors, source)
    resolve_guidance(config)
    resolve_monitor(config, sections)
    return config


def validate(config: Config, check_files: bool = True, sections: Collection[str] = SECTIONS) -> list[str]:
    """Every semantic problem of both stages, for the ``sections`` a command uses (see
    :func:`load_config`)."""
    return schema_problems(config, sections) + plugin_problems(config, check_files, sections)


def plugin_problems(
    config: Config, check_files: bool = True, sections: Collection[str] = SECTIONS
) -> list[str]:
    """The plugin stage's problems for ``sections``."""
    on = set(sections)
    errors: list[str] = []
    prompt_set.cache_clear()  # files may have changed since the last validation
    if "runner" in on or "ray" in on or "parallel" in on:
        errors += runner_problems(config, check_files)
    if "run" in on:
        errors += run_problems(config, on, check_files)
    if "train" in on and check_files:
        errors += output_dir_problems(config.run.resolved_output_dir())
    if "sampling" in on:
        errors += guidance_problems(config)
    if "model" in on:
        errors += model_problems(config, check_files, size="sampling" in on)
    spec = None
    if "algorithm" in on:
        algorithm_errors, spec = algorithm_problems(config)
        errors += algorithm_errors
    if "rewards" in on:
        errors += reward_problems("rewards", config.rewards, check_files)
    if "eval" in on and config.eval.enabled:
        errors += reward_problems("eval.rewards", config.eval.rewards, check_files)
        errors += reward_problems("eval.watch", config.eval.watch, check_files)  # held-out judges
        errors += eval_prompt_problems(config.eval, check_files)
    errors += group_problems(config, "rewards" in on, "eval" in on and config.eval.enabled)
    if "data" in on:
        errors += data_problems(config, spec, check_files)
    if "train" in on and "monitor" in on:
        errors += monitor_problems(config, check_files)
    if "model" in on:
        errors += hearing_problems(config, "rewards" in on, "eval" in on and config.eval.enabled)
        errors += editing_problems(config, spec, check_files, "data" in on, "eval" in on)
    # train.resume is checked by the driver before any model loads (it verifies the checkpoint's
    # files, see train/run_folder.py), after this config is known to be well-formed
    return errors
