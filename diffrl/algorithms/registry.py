"""Algorithms by short name, or a dotted path to a user's ``DiffusionAlgorithm`` subclass."""

from __future__ import annotations

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, ConfigError, bind_dataclass
from diffrl.registry import Registry, RegistryError

ALGORITHMS = Registry(
    "algorithm",
    {
        "sft": "diffrl.algorithms.sft:SFT",
        "flow_grpo": "diffrl.algorithms.flow_grpo:FlowGRPO",
        "diffusion_nft": "diffrl.algorithms.diffusion_nft:DiffusionNFT",
        "awm": "diffrl.algorithms.awm:AWM",
        "dpo": "diffrl.algorithms.dpo:DPO",
    },
)


def build_algorithm(config: Config) -> DiffusionAlgorithm:
    """Resolve ``algorithm.name`` and bind ``algorithm.params`` to its ``Params`` dataclass."""
    cls = ALGORITHMS.resolve(config.algorithm.name)
    if not (isinstance(cls, type) and issubclass(cls, DiffusionAlgorithm)):
        raise RegistryError(f"{config.algorithm.name!r} is not a DiffusionAlgorithm subclass")
    errors: list[str] = []
    params = bind_dataclass(cls.Params, config.algorithm.params, "algorithm.params", errors)
    if errors:
        raise ConfigError(errors)
    return cls(params, config)
