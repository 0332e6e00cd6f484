"""The composition root: where a training run's parts are chosen, at the top of the layers.

The runner (where the loop's parts run: one process, or Ray actors, or a user's class by dotted
path) is picked here from the recipe's ``runner`` and handed down: the session builds it, the
driver calls it. No module below this one names a runner (the runners themselves aside):
:data:`RUNNERS` names the Ray runner by a string, imported only when a recipe says ``runner: ray``.

```python
from diffrl import launch
from diffrl.preflight import load_config

result = launch.train(load_config("recipes/tiny_demo.yaml", ["train.iterations=2"]))
```
"""

from __future__ import annotations

from diffrl.config import Config, ParallelConfig
from diffrl.core.registry import Registry, call_problem, override_problems
from diffrl.train import loop
from diffrl.train.runner import Runner
from diffrl.train.state import TrainResult


def _runner_problem(obj: object) -> str | None:
    """What keeps ``obj`` from being a runner diffrl can call (a dotted path's class)."""
    if not isinstance(obj, type):
        return "is not a class: a runner is a class, built as Runner(config, algorithm, spec)"
    problems = [call_problem(obj, "Runner(config, algorithm, spec)", ("config", "algorithm", "spec"))]
    problems += override_problems(obj, Runner)
    return "; ".join(p for p in problems if p) or None


RUNNERS = Registry(
    "runner",
    {
        "local": "diffrl.train.runner:LocalRunner",
        "ray": "diffrl.distributed.ray.runner:RayRunner",
    },
    check=_runner_problem,
)
"""``runner:`` -> its class: ``local`` (:class:`~diffrl.train.runner.LocalRunner`), ``ray``
(:class:`~diffrl.distributed.ray.runner.RayRunner`), or ``my_pkg.my_runner:MyRunner``."""


def runner_class(config: Config) -> type[Runner]:
    """The class ``config.runner`` names (the checks reported an unknown one before anything ran)."""
    return RUNNERS.resolve(config.runner)


def layout(config: Config) -> ParallelConfig:
    """The ranks and engines the runner of ``config`` places (one of each in one process)."""
    placed = getattr(runner_class(config), "layout", None)
    return placed(config) if placed is not None else config.parallel


def train(config: Config) -> TrainResult:
    """Train ``config`` (checked: :func:`diffrl.preflight.load_config`) with the runner it names."""
    return loop.train(config, runner_class(config))
