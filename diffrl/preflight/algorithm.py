"""Plugin stage: the algorithm a config names, its own settings, and what its collection spec
needs of the rest of the config (a reward, an offline dataset, the batch arithmetic, a rollout
engine that can draw it)."""

from __future__ import annotations

import dataclasses

from diffrl.algorithms.registry import build_algorithm
from diffrl.algorithms.returns import checked_spec
from diffrl.config import Config, ConfigError, DataConfig, RolloutConfig
from diffrl.core.registry import RegistryError
from diffrl.core.rollout import CollectionSpec
from diffrl.core.user_code import checked_problems
from diffrl.data.offline import SYNTHETIC
from diffrl.preflight.schema import rollout_arithmetic
from diffrl.sampling.engine import engine_problems


def algorithm_problems(config: Config) -> tuple[list[str], CollectionSpec | None]:
    """The algorithm's own checks and what its collection spec needs; returns (errors, spec), the
    spec None when the algorithm's config does not build."""
    try:
        algorithm = build_algorithm(config)
    except ConfigError as e:
        return e.problems, None
    except RegistryError as e:
        return [f"algorithm.name: {e}"], None
    errors = []
    spec = checked_spec(algorithm, algorithm.collection_spec())
    if spec.needs_reward and not config.rewards:
        errors.append(
            f"algorithm {algorithm.name!r} needs a reward; add a 'rewards:' list (e.g. - name: ocr)"
        )
    if spec.online:
        errors.extend(rollout_arithmetic(config))
    errors.extend(unused_problems(config, algorithm.name, spec))
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
    errors.extend(checked_problems(algorithm, "validate()", algorithm.validate(config)))
    if config.model.encode_once and not spec.online:
        errors.append(
            f"model.encode_once: algorithm {algorithm.name!r} trains on a dataset's captions (no fixed "
            "prompt set to encode up front); set model.encode_once: false"
        )
    if config.train.off_policy_steps > 0:
        errors.extend(
            checked_problems(algorithm, "off_policy_problems()", algorithm.off_policy_problems(config))
        )
    errors.extend(engine_problems(config, spec))
    return errors, spec


def unused_problems(config: Config, name: str, spec: CollectionSpec) -> list[str]:
    """Settings the algorithm's collection spec does not read, refused rather than ignored: an
    offline algorithm draws no rollouts (``rollout.*`` other than its defaults; ``rollout.engine``
    is :func:`engine_problems`'), one that needs no reward scores nothing (``rewards``), an online
    one reads no dataset, and a dataset folder's captions are its prompts (``data.prompts``)."""
    errors = []
    rollout, data = RolloutConfig(), DataConfig()
    if not spec.online:
        for f in dataclasses.fields(RolloutConfig):
            if f.name != "engine" and getattr(config.rollout, f.name) != getattr(rollout, f.name):
                errors.append(
                    f"rollout.{f.name} is not used by algorithm {name!r} (it trains on data.dataset, it "
                    "draws no rollouts); remove it"
                )
    if not spec.needs_reward and config.rewards:
        errors.append(
            f"rewards is not used by algorithm {name!r} (it trains on data.dataset, it scores nothing); "
            "remove it (eval.rewards score the evals)"
        )
    d = config.data
    if spec.online:
        if d.dataset not in (None, data.dataset):
            errors.append(
                f"data.dataset is not used by algorithm {name!r} (it samples data.prompts online); remove it"
            )
        if d.dataset_size is not None:
            errors.append(
                f"data.dataset_size is not used by algorithm {name!r} (it samples data.prompts online); "
                "remove it"
            )
    # a folder's captions (a pair folder's prompts) are the prompts; data.dataset_size, which only the
    # synthetic sets read, may stay (the SFT recipe sets it, and a folder on top of it is the usual use)
    elif d.dataset and d.dataset not in SYNTHETIC and d.prompts != data.prompts:
        errors.append(
            f"data.prompts is not used by algorithm {name!r} with a dataset folder (its captions are the "
            "prompts); remove it (eval.prompts are the evals')"
        )
    return errors
