"""Plugin stage: the rewards a config names (``rewards``, ``eval.rewards``, ``eval.watch``), their params, and
whether the model family makes the sound a reward hears."""

from __future__ import annotations

import re

from diffrl.config import Config, RewardConfig
from diffrl.config.binding import signature_problems
from diffrl.core.errors import quoted
from diffrl.core.registry import RegistryError, call_problem, override_problems
from diffrl.core.user_code import checked_problems
from diffrl.models.registry import FAMILIES
from diffrl.rewards.base import Reward, param_name_problems
from diffrl.rewards.registry import REWARDS


def reward_problems(where: str, rewards: list[RewardConfig], check_files: bool) -> list[str]:
    """Each reward's name and params (its weight and deadline are the schema stage's)."""
    errors = []
    for i, r in enumerate(rewards):
        try:
            obj = REWARDS.resolve(r.name)
        except RegistryError as e:
            errors.append(f"{where}[{i}].name: {e}")
            continue
        if not isinstance(r.params, dict):
            errors.append(f"{where}[{i}].params must be a mapping of name: value, got {quoted(r.params)}")
            continue
        problems = param_name_problems(obj, r.params)
        is_reward = isinstance(obj, type) and issubclass(obj, Reward)
        problems += _call_problems(obj, is_reward, r.params)
        typed: list[str] = []
        if not problems:  # each param's type and range, as its annotation declares them
            fn = obj.__init__ if is_reward else obj
            typed = signature_problems(fn, r.params, f"{where}[{i}] ({r.name}).params")
        if not problems and is_reward:
            # the reward's own checks, less those of a param whose type or range is already reported
            flagged = {p.partition(").params.")[2].split(" ")[0].rstrip(":") for p in typed}
            problems = [
                p
                for p in checked_problems(obj, "param_problems()", obj.param_problems(r.params, check_files))
                if re.split(r"[ :]", p)[0] not in flagged
            ]
        errors += [f"{where}[{i}] ({r.name}).params: {p}" for p in problems] + typed
    return errors


def _call_problems(obj: object, is_reward: bool, params: dict) -> list[str]:
    """A reward class whose methods cannot take diffrl's calls, or a function that cannot be called
    as ``fn(images, prompts, metadata, **params)`` (``audio=`` too when it hears)."""
    if is_reward:
        return override_problems(obj, Reward)
    if isinstance(obj, type) or not callable(obj):
        return []  # not a reward at all: reported where the reward is built
    hears = ("audio",) if getattr(obj, "audio", False) else ()
    shown = "fn(images, prompts, metadata" + (", audio=..." if hears else "") + ", **params)"
    problem = call_problem(obj, shown, ("images", "prompts", "metadata"), (*hears, *params))
    return [problem] if problem else []


def hearing_problems(config: Config, rewards: bool, eval_rewards: bool) -> list[str]:
    """A reward that hears (``Reward.audio``) needs a family that makes sound
    (``FamilyDescription.sound``)."""
    try:
        family = getattr(FAMILIES.resolve(config.model.family), "description", None)
    except RegistryError:
        return []  # reported by the model checks
    if getattr(family, "sound", False):
        return []
    lists = [("rewards", config.rewards)] * rewards + [
        ("eval.rewards", config.eval.rewards),
        ("eval.watch", config.eval.watch),
    ] * eval_rewards
    errors = []
    for where, configs in lists:
        for i, r in enumerate(configs):
            try:
                obj = REWARDS.resolve(r.name)
            except RegistryError:
                continue  # reported by reward_problems
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


def _makes_videos(config: Config) -> bool:
    """Whether the config's family makes videos (``FamilyDescription.makes_videos``); False for a family
    that cannot be resolved or is no ModelFamily (the model checks report those)."""
    try:
        family = getattr(FAMILIES.resolve(config.model.family), "description", None)
    except RegistryError:
        return False
    makes_videos = getattr(family, "makes_videos", None) if isinstance(family, type) else None
    return callable(makes_videos) and makes_videos(config) is True


def group_problems(config: Config, rewards: bool, eval_rewards: bool) -> list[str]:
    """A reward that judges a prompt's samples together (:meth:`Reward.judges_groups`) gets them
    whole in one call: in training a micro-group (``rollout.micro_group_size``, else
    ``train.micro_batch_size``) must hold whole prompts, at least 2 samples each; in eval, the
    whole eval set is one call, and a prompt needs ``eval.samples_per_prompt >= 2``. It compares
    still images: a family that makes videos (``FamilyDescription.makes_videos``) is refused."""
    r = config.rollout
    micro = r.micro_group_size if r.micro_group_size is not None else config.train.micro_batch_size
    n = r.n_samples_per_prompt
    where_micro = "rollout.micro_group_size" if r.micro_group_size is not None else "train.micro_batch_size"
    checks = [("rewards", config.rewards)] * rewards + [
        ("eval.rewards", config.eval.rewards),
        ("eval.watch", config.eval.watch),
    ] * eval_rewards
    errors = []
    for where, configs in checks:
        for i, c in enumerate(configs):
            try:
                obj = REWARDS.resolve(c.name)
            except RegistryError:
                continue  # reported by reward_problems
            if not (isinstance(obj, type) and issubclass(obj, Reward) and isinstance(c.params, dict)):
                continue
            if not obj.judges_groups(c.params):
                continue
            if _makes_videos(config):
                errors.append(
                    f"{where}[{i}] ({c.name}) compares a prompt's still images, and model family "
                    f"{config.model.family!r} makes videos; use judging: single (each frame is judged and "
                    "a video scores their mean)"
                )
            elif where.startswith("eval.") and config.eval.samples_per_prompt < 2:
                errors.append(
                    f"{where}[{i}] ({c.name}) judges a prompt's samples together and eval.samples_per_prompt "
                    f"is {config.eval.samples_per_prompt}; set it to 2 or more (or judging: single)"
                )
            elif where == "rewards" and (n < 2 or micro % n):
                errors.append(
                    f"{where}[{i}] ({c.name}) judges a prompt's samples together, so each call must hold "
                    f"whole prompts: {where_micro} ({micro}) must be a multiple of rollout.n_samples_per_prompt "
                    f"({n}), which must be 2 or more"
                )
    return errors
