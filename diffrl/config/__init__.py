"""The config: its schema (:mod:`~diffrl.config.schema`, dataclasses only) and the binding of
YAML and overrides to it (:mod:`~diffrl.config.binding`). The whole-system checks that need the
plugins (families, algorithms, rewards, runners) sit at the top, in :mod:`diffrl.preflight`."""

from diffrl.config.binding import (
    SECTIONS,
    ConfigError,
    bind_config,
    bind_dataclass,
    deep_merge,
    dump_config,
    number_problem,
    parse_overrides,
    read_recipe,
    recipes_dir,
    resolve_data_path,
)
from diffrl.config.schema import (
    AlgorithmConfig,
    Config,
    DataConfig,
    EvalConfig,
    LoraConfig,
    ModelConfig,
    RayConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    SamplingConfig,
    TrainConfig,
    to_plain,
)

__all__ = [
    "SECTIONS",
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "DataConfig",
    "EvalConfig",
    "LoraConfig",
    "ModelConfig",
    "RayConfig",
    "RewardConfig",
    "RolloutConfig",
    "RunConfig",
    "SamplingConfig",
    "TrainConfig",
    "bind_config",
    "bind_dataclass",
    "deep_merge",
    "dump_config",
    "number_problem",
    "parse_overrides",
    "read_recipe",
    "recipes_dir",
    "resolve_data_path",
    "to_plain",
]
