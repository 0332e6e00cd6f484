"""Plugin stage: the run on this machine: the loggers a run names, the runner and its settings,
the GPUs ``run.device`` names, and the output folder."""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from diffrl.config import Config
from diffrl.core.registry import RegistryError
from diffrl.launch import RUNNERS
from diffrl.logging import tracker_problems


def run_problems(config: Config, sections: set[str], check_files: bool) -> list[str]:
    """The loggers (training only logs to them) and the GPUs ``run.device`` names (its spelling
    is the schema stage's)."""
    run, errors = config.run, []
    if "train" in sections:
        errors += tracker_problems(run.loggers, "run.loggers")
    device = run.device
    if re.fullmatch(r"cuda(:\d+)?", device) and check_files and _uses_local_devices(config, sections):
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


def runner_problems(config: Config, check_files: bool) -> list[str]:
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
    errors = list(check(config, check_files)) if check is not None else []
    said = any("train.off_policy_steps" in e for e in errors)  # the runner's own reason
    if config.train.off_policy_steps > 0 and not hasattr(runner, "end_rollout") and not said:
        errors.append(
            f"train.off_policy_steps={config.train.off_policy_steps}: runner {config.runner!r} cannot draw "
            "a rollout while it trains (it has no end_rollout(); see diffrl.train.runner.Runner); set "
            "runner: ray or train.off_policy_steps: 0"
        )
    return errors


def output_dir_problems(out: Path) -> list[str]:
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
