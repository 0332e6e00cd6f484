"""The first stage of the checks: what the config's values say on their own, with no plugin, file
or device asked. It imports no torch (nor any plugin), so the command line answers a bad config at
once: binding (unknown keys with a "did you mean", types, and the range every number of the schema
declares, :class:`~diffrl.config.schema.Range`) and the rules between the schema's own values, all
problems at once, each led by its line in the recipe file where it has one.

The second stage (:mod:`diffrl.preflight.plugins`) asks the plugins the config names.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

from diffrl.config import SECTIONS, Config, ConfigError, bind_config
from diffrl.config.binding import recipe_lines, value_problems, with_lines
from diffrl.core.errors import quoted

MAX_NAME_BYTES = 255
MAX_PAIRED = 100_000
"""As :data:`diffrl.trust.alarms.MAX_PAIRED` (this module imports no torch)."""
"""``run.name`` names a folder: at most this many bytes (UTF-8), as file systems allow."""


def check_sections(sections: Collection[str]) -> None:
    """Refuse section names the schema does not have (a programming error in a command)."""
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        raise ValueError(f"unknown config sections {unknown}; known: {', '.join(SECTIONS)}")


def read_config(
    recipe: str | Path | dict[str, Any] | None,
    overrides: list[str] | None,
    sections: Collection[str] = SECTIONS,
) -> tuple[Config, str]:
    """Recipe + ``key=value`` overrides -> (bound config, the source's name for messages), with
    every problem of this stage raised at once as a :class:`ConfigError`. The config still needs
    the second stage (:func:`diffrl.preflight.plugins.check_plugins`) before it is used."""
    check_sections(sections)
    config, errors, source = bind_config(recipe, overrides)
    errors.extend(schema_problems(config, sections))
    if errors:
        raise ConfigError(with_lines(errors, recipe_lines(recipe, overrides)), source)
    return config, source


def schema_problems(config: Config, sections: Collection[str] = SECTIONS) -> list[str]:
    """The problems of the config's own values in ``sections`` (see :func:`read_config`)."""
    on = set(sections)
    # every value's type and range, as the binder checks them (for a config built in code)
    errors = [p for name in SECTIONS if name in on for p in value_problems(getattr(config, name), name)]
    if errors:
        return errors
    if "run" in on:
        errors += _run_problems(config, on)
    if "train" in on:
        errors += _train_problems(config)
    if "train" in on and "eval" in on:
        errors += trust_problems(config)
    return errors


def _labels(rewards: list) -> list[str]:
    """Each reward's label, as :func:`diffrl.rewards.base.reward_labels` gives it (no torch here)."""
    names = [r.name for r in rewards]
    return [n if names.count(n) == 1 else f"{n}#{i}" for i, n in enumerate(names)]


def trust_problems(config: Config) -> list[str]:
    """``eval.watch``, ``eval.watch_alarm`` and ``train.keep_best`` together: each needs evals, the
    alarm needs a watched reward, and ``keep_best.metric`` must be a metric evals log."""
    e, errors = config.eval, []
    metrics = ["eval/reward_mean", *(f"eval/{x}_mean" for x in _labels(e.rewards))]
    metrics += [f"eval/watch/{x}_mean" for x in _labels(e.watch)]
    if e.watch_alarm is not None and not e.watch:
        errors.append(
            "eval.watch_alarm compares the trained reward with watched ones, and eval.watch is empty: "
            "add a reward to eval.watch (e.g. eval.watch=[{name: aesthetic}]) or remove eval.watch_alarm"
        )
    if (e.watch or e.watch_alarm is not None) and not e.enabled:
        errors.append(
            "eval.watch and eval.watch_alarm score the evals, and eval.enabled is false: set it true"
        )
    keep = config.train.keep_best
    n = e.num_prompts * e.samples_per_prompt if e.num_prompts is not None else 0
    if (keep is not None or e.watch_alarm is not None) and n > MAX_PAIRED:
        errors.append(
            f"train.keep_best and eval.watch_alarm pair at most {MAX_PAIRED:,} eval samples (each "
            f"checkpoint keeps their scores), and eval.num_prompts x eval.samples_per_prompt is {n:,}: "
            "evaluate fewer"
        )
    if keep is not None:
        if not e.enabled:
            errors.append("train.keep_best compares evals, and eval.enabled is false: set it true")
        if keep.metric not in metrics:
            errors.append(
                f"train.keep_best.metric {quoted(keep.metric)} is no metric this run's evals log; "
                f"use one of: {', '.join(metrics)}"
            )
    return errors


def _run_problems(config: Config, sections: set[str]) -> list[str]:
    run, errors = config.run, []
    if not run.name.strip():
        errors.append("run.name must not be empty (it names the run folder runs/<name>)")
    if len(run.name.encode("utf-8", "replace")) > MAX_NAME_BYTES:
        errors.append(
            f"run.name names the run's folder: at most {MAX_NAME_BYTES} bytes, got "
            f"{len(run.name.encode('utf-8', 'replace')):,}: {quoted(run.name)}"
        )
    if "train" in sections and "wandb" in run.loggers and not run.wandb_project.strip():
        errors.append(
            "run.wandb_project must not be empty with the wandb logger (e.g. run.wandb_project=diffrl)"
        )
    if run.device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", run.device):
        errors.append(f"run.device must be auto, cpu, cuda or cuda:N, got {quoted(run.device)}")
    return errors


def _train_problems(config: Config) -> list[str]:
    """What the numbers of ``train`` say together (each one's range is the binder's)."""
    t = config.train
    if t.batch_size % t.micro_batch_size:
        return [
            f"train.batch_size ({t.batch_size}) must be a multiple of train.micro_batch_size "
            f"({t.micro_batch_size}); e.g. set train.micro_batch_size={largest_divisor(t.batch_size, t.micro_batch_size)}"
        ]
    return []


def rollout_arithmetic(config: Config) -> list[str]:
    """The batch arithmetic of online collection: the samples of a rollout fill whole optimizer
    steps. Pure arithmetic, but it applies only to an online algorithm, which only the algorithm's
    collection spec says, so the plugin stage calls it."""
    r, t = config.rollout, config.train
    errors = value_problems(r, "rollout")  # a config built in code: its ranges are not yet checked
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


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n >= 1`` that is at most ``at_most`` (1 at least): the divisor pairs
    up to sqrt(n), so 10^6 steps for n = 10^12, never a scan up to ``at_most``."""
    best, d = 1, 1
    while d * d <= n:
        if n % d == 0:
            for divisor in (d, n // d):
                if best < divisor <= at_most:
                    best = divisor
        d += 1
    return best
