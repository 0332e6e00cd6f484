"""Plugin stage: the model family a config names, its own settings (``model.*``), the sizes it
can sample and the guidance scale where its CFG is off."""

from __future__ import annotations

from diffrl.config import Config
from diffrl.config import number_problem as _number
from diffrl.core.registry import RegistryError
from diffrl.core.user_code import checked_problems
from diffrl.models.base import FamilyDescription, ModelFamily
from diffrl.models.registry import FAMILIES


def model_problems(config: Config, check_files: bool, size: bool) -> list[str]:
    """``model.family`` and the family's checks of ``model.*``; with ``size``, its constraints on
    ``sampling.height/width`` (``model.lora``'s numbers are the schema stage's)."""
    try:
        family_cls = FAMILIES.resolve(config.model.family)
    except RegistryError as e:
        return [f"model.family: {e}"]
    if not (isinstance(family_cls, type) and issubclass(family_cls, ModelFamily)):
        return [f"model.family: {config.model.family!r} is not a ModelFamily subclass"]
    description = getattr(family_cls, "description", None)
    if not (isinstance(description, type) and issubclass(description, FamilyDescription)):
        return [
            f"model.family: {config.model.family!r} has no description (its class attribute description "
            "must be a FamilyDescription subclass, in the family's file)"
        ]
    errors = checked_problems(
        family_cls, "validate_config()", description.validate_config(config, check_files=check_files)
    )
    errors += checked_problems(
        family_cls, "lora_problems()", description.lora_problems(config, check_files=check_files)
    )
    errors += sequence_parallel_problems(family_cls, config, check_files)
    if config.model.encode_once and description.edits:
        errors.append(
            f"model.encode_once: the {description.name} family edits images, and its conditioning holds "
            "each prompt's source image; set model.encode_once: false"
        )
    if config.model.encode_once and config.model.options.get("train_text_encoder"):
        errors.append(
            "model.encode_once: the text encoder trains (model.options.train_text_encoder); set one false"
        )
    if size:
        errors += checked_problems(
            family_cls, "size_problems()", description.size_problems(config, check_files=check_files)
        )
    return errors


def sequence_parallel_problems(family_cls: type[ModelFamily], config: Config, check_files: bool) -> list[str]:
    """``parallel.sequence`` > 1 needs a family that can split its samples' tokens, and
    lengths that split evenly."""
    n = config.parallel.sequence
    if not isinstance(n, int) or n <= 1:
        return []
    if not family_cls.description.sequence_parallel:
        able = [name for name in FAMILIES.names() if FAMILIES.resolve(name).description.sequence_parallel]
        return [
            f"parallel.sequence={n}: the {family_cls.description.name} family's transformer cannot split a "
            f"sample over ranks (diffusers declares no context-parallel plan for it, or diffrl has "
            f"not tested it); families that can: {', '.join(able) or 'none'}. Set "
            "parallel.sequence: 1 (FSDP2 still shards the weights over parallel.trainer_ranks)"
        ]
    return checked_problems(
        family_cls, "sequence_problems()", family_cls.description.sequence_problems(config, check_files)
    )


def guidance_problems(config: Config) -> list[str]:
    """``sampling.guidance_scale`` in [the family's ``no_guidance_scale``, 100]: 1 for
    ``neg + s (pos - neg)``, 0 for Z-Image's ``pos + s (pos - neg)`` (1 when the family is
    unknown: ``model.family``'s check reports that)."""
    try:
        description = getattr(FAMILIES.resolve(config.model.family), "description", None)
        no_guidance = float(getattr(description, "no_guidance_scale", 1.0))
    except RegistryError:
        no_guidance = 1.0
    s = config.sampling
    return _number(
        "sampling.guidance_scale",
        s.guidance_scale,
        s.guidance_scale is None or no_guidance <= s.guidance_scale <= 100,
        f"in [{no_guidance:g}, 100] ({no_guidance:g} disables the family's CFG; e.g. 4.5), or null "
        "for the family's",
    )


def resolve_guidance(config: Config) -> None:
    """Resolve a null ``sampling.guidance_scale`` to the family's default, once, so everything
    downstream sees a number (the config must have passed the checks)."""
    if config.sampling.guidance_scale is None:
        config.sampling.guidance_scale = float(
            FAMILIES.resolve(config.model.family).description.default_guidance
        )
