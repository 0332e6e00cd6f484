"""What ``eval``, ``sample`` and ``export`` share: a target's model, loaded with its checkpoint's
weights, ready to sample (imported by those commands' modules only: it needs torch)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from diffrl.cli.targets import SAMPLE_SECTIONS, Target, resolve_target
from diffrl.config import Config
from diffrl.core import determinism
from diffrl.core.registry import refusing
from diffrl.models.base import FamilyRuntime
from diffrl.models.registry import load_family, resolve_device
from diffrl.preflight.plugins import check_plugins
from diffrl.train.actor import apply_lora
from diffrl.train.checkpoint import (
    check_checkpoint_family,
    load_weights_into,
    lora_config_of,
    read_checkpoint_info,
    storage_failure,
)


def checked(target: Target) -> Target:
    """``target`` with the plugin stage passed (the schema stage did, in :mod:`~diffrl.cli.targets`)."""
    check_plugins(target.config, target.source, target.sections)
    return target


def load_target(
    target: str, overrides: list[str], sections: Sequence[str] = SAMPLE_SECTIONS
) -> tuple[Config, Path | None]:
    """``base`` | a recipe YAML | a checkpoint dir | a model dir -> (config, checkpoint or None),
    both stages of the config's checks passed for ``sections``."""
    t = checked(resolve_target(target, overrides, sections))
    return t.config, t.checkpoint


def load_for_inference(config: Config, checkpoint: Path | None) -> FamilyRuntime:
    """The config's model with the checkpoint's weights (its LoRA applied first), frozen."""
    if checkpoint is not None:
        info = read_checkpoint_info(checkpoint)
        check_checkpoint_family(info, config.model.family, checkpoint)
    # the run's thread count and (unless run.deterministic: false) its pins, as in training
    determinism.apply(config.run.deterministic, config.run.threads, str(resolve_device(config.run.device)))
    family = load_family(config)
    if checkpoint is not None:
        lora = lora_config_of(info)
        if lora is not None:
            apply_lora(family, lora)
        load_weights_into(family, checkpoint)
    family.transformer.requires_grad_(False)
    return family


def guarded(
    untrusted: Mapping[str, str], out: Path, writing: str, fix: str, command: Callable[[Path], int]
) -> int:
    """``command(out)`` with ``out`` absolute (a plugin that changes the working directory, with
    ``os.chdir``, moves no output), the dotted paths a checkpoint's config names (and the user did
    not) refused (:func:`~diffrl.core.registry.refusing`), and a full disk while ``writing`` into
    ``out`` a clear error that says ``fix``."""
    out = out.absolute()
    with refusing(untrusted):
        try:
            return command(out)
        except Exception as e:
            failure = storage_failure(e, f"{writing} into {str(out)!r}", fix)
            if failure is None:
                raise
            raise failure from e
