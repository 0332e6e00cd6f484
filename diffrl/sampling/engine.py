"""The rollout engine contract: who draws a rollout's samples, chosen by ``rollout.engine``.

An engine turns the plan of a rollout (:class:`~diffrl.sampling.collector.RolloutPlan`: which
``(slot, prompt, sample)`` jobs each micro-group holds and which steps are stochastic) into
:class:`~diffrl.core.rollout.RolloutBatch` es, micro-group by micro-group, filling what the algorithm's
:class:`~diffrl.core.rollout.CollectionSpec` asks for and nothing more. The local runner and the Ray
runner's engine actors drive any engine alike:

- ``diffrl`` (:class:`~diffrl.sampling.collector.OnlineCollector`): the built-in sampling loop on
  the family's diffusers modules, in this process; it samples with the module it is given, so
  ``sync`` has nothing to do;
- ``sglang`` (:class:`~diffrl.sampling.sglang.SglangEngine`): sglang-diffusion servers draw the
  samples (``POST /rollout/generate``); ``sync`` sends them the sampling weights;
- ``my_pkg.my_engine:MyEngine``: a class built as ``MyEngine(config, family, spec, prompts)`` that
  follows :class:`Engine`, with ``Options`` (a dataclass binding ``rollout.engine_options``) and
  ``validate(config) -> list[str]`` if it has settings of its own.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from torch import nn

from diffrl.config import Config, ConfigError
from diffrl.config.binding import bind_dataclass
from diffrl.core.registry import Registry, RegistryError, call_problem, override_problems
from diffrl.core.rollout import CollectionSpec, RolloutBatch
from diffrl.data.offline import build_offline_dataset
from diffrl.data.prompts import PromptSet, load_prompts
from diffrl.models.base import FamilyRuntime
from diffrl.sampling.collector import OfflineCollector, RolloutPlan, StageClock
from diffrl.sampling.sampler import image_size

ENGINES = Registry(
    "rollout engine",
    {
        "diffrl": "diffrl.sampling.collector:OnlineCollector",
        "sglang": "diffrl.sampling.sglang:SglangEngine",
    },
    check=lambda obj: _engine_problem(obj),
)


def _engine_problem(obj: object) -> str | None:
    """What keeps ``obj`` (a dotted path's) from being an engine diffrl can build and call."""
    if not isinstance(obj, type):
        return "is not a class: an engine is a class, built as Engine(config, family, spec, prompts)"
    call = "Engine(config, family, spec, prompts)"
    problems = [
        call_problem(obj, call, ("config", "family", "spec", "prompts")),
        *override_problems(obj, Engine),
    ]
    return "; ".join(p for p in problems if p) or None


class Engine(Protocol):
    clock: StageClock
    """Seconds per stage since the last ``clock.take()`` (the driver logs them each iteration)."""

    def plan(self, rollout_id: int) -> RolloutPlan:
        """The rollout's micro-groups and stochastic steps (no sampling)."""

    def sample(self, plan: RolloutPlan, micro_group: int, module: nn.Module | None = None) -> RolloutBatch:
        """Draw micro-group ``micro_group`` of ``plan`` (``module``: the weights to sample with,
        for an engine that samples in this process; None: the family's transformer)."""

    def micro_groups(
        self, rollout_id: int, module: nn.Module | None = None, should_stop: Callable[[], bool] | None = None
    ) -> Iterator[RolloutBatch]:
        """The rollout's micro-groups as they are drawn; :class:`~diffrl.core.errors.Abandoned` once
        ``should_stop()``."""

    def sync(self, module: nn.Module | None = None) -> dict[str, float]:
        """Take the sampling weights (``module``, or the family's transformer) before the next
        rollout; the metrics of the transfer (empty when there is nothing to send)."""

    def take_metrics(self) -> dict[str, float]:
        """The engine's metrics since the last call (``perf/rollout_<stage>_time`` per stage, and
        its own counters); starts afresh."""

    def close(self) -> None:
        """Release what the engine started (servers, folders)."""


def engine_class(config: Config) -> type:
    return ENGINES.resolve(config.rollout.engine)


def engine_options(config: Config, cls: type | None = None):
    """``rollout.engine_options`` bound by the engine's ``Options`` dataclass (a
    :class:`~diffrl.config.ConfigError` lists every problem); None for an engine without one."""
    cls = cls or engine_class(config)
    options_cls = getattr(cls, "Options", None)
    if options_cls is None:
        if config.rollout.engine_options:
            raise ConfigError(
                [f"rollout.engine_options: the {config.rollout.engine!r} engine takes no options"]
            )
        return None
    errors: list[str] = []
    options = bind_dataclass(options_cls, config.rollout.engine_options, "rollout.engine_options", errors)
    if errors:
        raise ConfigError(errors)
    return options


def engine_devices(config: Config) -> int:
    """The devices one engine of ``rollout.engine`` holds (an engine class's optional
    ``devices(config)``; 1 without one), for the Ray placement of engines on devices of their own."""
    devices = getattr(engine_class(config), "devices", None)
    return int(devices(config)) if devices is not None else 1


def engine_problems(config: Config, spec: CollectionSpec) -> list[str]:
    """``rollout.engine`` names an engine class; its options bind; the engine's own checks."""
    if not spec.online:
        if config.rollout.engine != "diffrl":
            return [
                f"rollout.engine={config.rollout.engine!r}: this algorithm reads an offline dataset "
                "(no rollouts to draw); leave rollout.engine at diffrl"
            ]
        return []
    try:
        cls = engine_class(config)
    except RegistryError as e:
        return [f"rollout.engine: {e}"]
    if not isinstance(cls, type):
        return [
            f"rollout.engine: {config.rollout.engine!r} is not a class (built as Engine(config, family, spec, prompts))"
        ]
    try:
        engine_options(config, cls)
    except ConfigError as e:
        return list(e.problems)
    check = getattr(cls, "validate", None)
    return list(check(config, spec)) if check is not None else []


def build_collector(config: Config, family: FamilyRuntime, spec: CollectionSpec) -> Engine | OfflineCollector:
    """What ``spec`` asks for: the ``rollout.engine`` sampling ``data.prompts``, or ``data.dataset``
    read offline."""
    if spec.online:
        prompts: PromptSet = load_prompts(config.data.prompts)
        return engine_class(config)(config, family, spec, prompts)
    height, width = image_size(config, family)
    return OfflineCollector(
        build_offline_dataset(config, height, width, spec.offline_items),
        family,
        config.train.batch_size,
        config.run.seed,
    )
