"""Algorithms by short name, or a dotted path to a user's ``DiffusionAlgorithm`` subclass."""

from __future__ import annotations

import dataclasses
import inspect

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, ConfigError, bind_dataclass
from diffrl.core.registry import Registry, RegistryError, call_problem, override_problems
from diffrl.core.user_code import kind

ALGORITHMS = Registry(
    "algorithm",
    {
        "sft": "diffrl.algorithms.sft:SFT",
        "flow_grpo": "diffrl.algorithms.flow_grpo:FlowGRPO",
        "diffusion_nft": "diffrl.algorithms.diffusion_nft:DiffusionNFT",
        "awm": "diffrl.algorithms.awm:AWM",
        "dpo": "diffrl.algorithms.dpo:DPO",
    },
    # a dotted path's subclass: each method it overrides takes the call diffrl makes of it
    check=lambda obj: (
        "; ".join(
            p
            for p in [
                call_problem(obj, "Algorithm(params, config)", ("params", "config")),
                *override_problems(obj, DiffusionAlgorithm),
            ]
            if p
        )
        or None
        if isinstance(obj, type) and issubclass(obj, DiffusionAlgorithm)
        else None  # not a subclass at all: build_algorithm says so
    ),
)


def build_algorithm(config: Config) -> DiffusionAlgorithm:
    """Resolve ``algorithm.name`` and bind ``algorithm.params`` to its ``Params`` dataclass."""
    cls = ALGORITHMS.resolve(config.algorithm.name)
    name = config.algorithm.name
    if not (isinstance(cls, type) and issubclass(cls, DiffusionAlgorithm)):
        raise RegistryError(f"{name!r} is not a DiffusionAlgorithm subclass")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise RegistryError(
            f"{name!r} does not define {missing} (abstract in DiffusionAlgorithm); define them"
        )
    params_cls = getattr(cls, "Params", None)
    if not (isinstance(params_cls, type) and dataclasses.is_dataclass(params_cls)):
        raise RegistryError(
            f"{name!r}: its Params is {kind(params_cls)}; it must be a dataclass class of the "
            "algorithm's algorithm.params (an empty @dataclass class Params: pass when it takes none)"
        )
    requires = getattr(cls, "requires", frozenset())
    if not (
        isinstance(requires, set | frozenset | list | tuple) and all(isinstance(r, str) for r in requires)
    ):
        raise RegistryError(
            f"{name!r}: its requires is {kind(requires)}; it must be a frozenset of RolloutBatch field "
            "names, e.g. frozenset({'traj_log_prob'})"
        )
    errors: list[str] = []
    params = bind_dataclass(cls.Params, config.algorithm.params, "algorithm.params", errors)
    if errors:
        raise ConfigError(errors)
    return cls(params, config)
