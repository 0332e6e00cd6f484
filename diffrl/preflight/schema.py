"""The first stage of the checks: what the config's values say on their own, with no plugin, file
or device asked. It imports no torch (nor any plugin), so the command line answers a bad config at
once: binding (unknown keys with a "did you mean", types) and every range or arithmetic rule of
the schema's own numbers, all problems at once.

The second stage (:mod:`diffrl.preflight.plugins`) asks the plugins the config names.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from pathlib import Path
from typing import Any

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

TORCH_SEEDS = (-(2**63), 2**64 - 1)
"""The seeds ``torch.manual_seed`` takes."""


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
        raise ConfigError(errors, source)
    return config, source


def schema_problems(config: Config, sections: Collection[str] = SECTIONS) -> list[str]:
    """The problems of the config's own values in ``sections`` (see :func:`read_config`)."""
    on, errors = set(sections), []
    if "run" in on:
        errors += _run_problems(config, on)
    if "train" in on:
        errors += _train_problems(config)
    if "sampling" in on:
        errors += _sampling_problems(config.sampling)
    if "model" in on:
        errors += _lora_problems(config)
    if "rewards" in on:
        errors += reward_number_problems("rewards", config.rewards)
    if "eval" in on and config.eval.enabled:
        errors += _eval_problems(config.eval)
    if "data" in on:
        errors += _data_problems(config)
    return errors


def _run_problems(config: Config, sections: set[str]) -> list[str]:
    run, errors = config.run, []
    if not run.name.strip():
        errors.append("run.name must not be empty (it names the run folder runs/<name>)")
    if not TORCH_SEEDS[0] <= run.seed <= TORCH_SEEDS[1]:
        errors.append(f"run.seed must be in [-2**63, 2**64 - 1] (torch's seed range), got {run.seed}")
    if run.log_every < 1:
        errors.append(f"run.log_every must be >= 1 (print every N iterations), got {run.log_every}")
    if "train" in sections and "wandb" in run.loggers and not run.wandb_project.strip():
        errors.append(
            "run.wandb_project must not be empty with the wandb logger (e.g. run.wandb_project=diffrl)"
        )
    if run.device not in ("auto", "cpu") and not re.fullmatch(r"cuda(:\d+)?", run.device):
        errors.append(f"run.device must be auto, cpu, cuda or cuda:N, got {run.device!r}")
    return errors


def _train_problems(config: Config) -> list[str]:
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
    if t.off_policy_steps not in (0, 1):
        errors.append(
            f"train.off_policy_steps must be 0 (synchronous) or 1 (rollout one iteration ahead), got "
            f"{t.off_policy_steps!r}: one rollout in flight already hides the shorter of rollout and "
            "training; more would only add staleness"
        )
    for name in ("max_failed_iterations", "max_nonfinite_steps"):
        if getattr(t, name) < 1:
            errors.append(f"train.{name} must be >= 1, got {getattr(t, name)}")
    return errors


def _sampling_problems(s: SamplingConfig) -> list[str]:
    """``sampling.*`` but the guidance scale, whose lowest value is the model family's."""
    errors = []
    if s.num_steps < 1:
        errors.append(f"sampling.num_steps must be >= 1, got {s.num_steps}")
    errors += _number(
        "sampling.shift",
        s.shift,
        s.shift is None or 0 < s.shift <= 100,
        "in (0, 100] (e.g. 3.0), or null for the family's",
    )
    for name in ("height", "width"):
        value = getattr(s, name)
        if value is not None and value < 1:
            errors.append(
                f"sampling.{name} must be >= 1 pixel, or null for the family's default, got {value}"
            )
    return errors


def _lora_problems(config: Config) -> list[str]:
    lora, errors = config.model.lora, []
    if lora is not None:
        if lora.rank < 1:
            errors.append(f"model.lora.rank must be >= 1, got {lora.rank}")
        errors += _number("model.lora.alpha", lora.alpha, lora.alpha > 0, "> 0 (e.g. twice the rank)")
        errors += _number("model.lora.dropout", lora.dropout, 0 <= lora.dropout < 1, "in [0, 1)")
    return errors


def reward_number_problems(where: str, rewards: list[RewardConfig]) -> list[str]:
    """Each reward's weight and deadline (its name and params are the plugin stage's)."""
    errors = []
    for i, r in enumerate(rewards):
        errors += _number(f"{where}[{i}].weight", r.weight, True, "a finite number (e.g. 1.0)")
        if not r.timeout_s > 0 or r.timeout_s == float("inf"):  # NaN fails both
            errors.append(f"{where}[{i}].timeout_s must be a number of seconds > 0, got {r.timeout_s}")
    return errors


def _eval_problems(e: EvalConfig) -> list[str]:
    errors = []
    for name in ("samples_per_prompt", "batch_size", "grid_images"):
        if getattr(e, name) < 1:
            errors.append(f"eval.{name} must be >= 1, got {getattr(e, name)}")
    if e.num_prompts is not None and e.num_prompts < 1:
        errors.append(
            f"eval.num_prompts must be >= 1, or null for every prompt of the file, got {e.num_prompts}"
        )
    return errors + reward_number_problems("eval.rewards", e.rewards)


def _data_problems(config: Config) -> list[str]:
    d = config.data
    if d.dataset_size is not None and d.dataset_size < 1:
        return [f"data.dataset_size must be >= 1, or null for one example per prompt, got {d.dataset_size}"]
    return []


def rollout_arithmetic(config: Config) -> list[str]:
    """The batch arithmetic of online collection: the samples of a rollout fill whole optimizer
    steps. Pure arithmetic, but it applies only to an online algorithm, which only the algorithm's
    collection spec says, so the plugin stage calls it."""
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
