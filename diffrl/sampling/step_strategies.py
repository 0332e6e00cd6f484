"""Step strategies: which denoising steps of a rollout are stochastic (and recorded and trained).

The other steps are deterministic ODE steps. The choice is keyed by (seed, rollout id), so every
sample of a rollout, and so every sample of one prompt group, shares it, and it does not depend on
how the rollout is split into micro-groups or workers.

- ``all``: every step (Flow-GRPO's original setting).
- ``sde_window``: a random contiguous window of ``size`` steps whose start lies in
  ``[range[0], range[1] - size]`` (flow_grpo's ``sde_window_size`` / ``sde_window_range``, the
  "Flow-GRPO-Fast" setting).
- ``epoch_global_random_choice``: ``k`` steps drawn without replacement from ``candidates``
  (default: all steps), a new draw per rollout (miles' step_strategy_hub).
- ``mix_grpo``: MixGRPO's sliding window (Li et al. 2025, "MixGRPO", arXiv 2507.21802): a
  deterministic window of ``size`` steps that starts at the first step of ``range`` and moves
  ``stride`` steps later every ``shift_interval`` iterations, cut at the end of ``range`` (it
  shrinks there); past the end it stays (or, with ``wrap``, starts over), as the reference's.
- a dotted path to ``def my_strategy(num_steps: int, rollout_id: int, seed: int, **params) -> list[int]``.

In a recipe: ``algorithm.params.step_strategy: {name: sde_window, size: 2, range: [0, 6]}``.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from diffrl.config import Range, bind_dataclass
from diffrl.config.schema import MAX_COUNT
from diffrl.core.registry import Registry, RegistryError, call_problem
from diffrl.core.seeding import derive_seed

MAX_STEPS = 1000
"""``sampling.num_steps`` at most: a step index or a count of steps is below or at it."""
StepIndex = Annotated[int, Range(0, MAX_STEPS, hint="a step index")]
Steps = Annotated[int, Range(1, MAX_STEPS, hint="steps")]


@dataclass
class AllSteps:
    def __call__(self, num_steps: int, rollout_id: int, seed: int) -> list[int]:
        return list(range(num_steps))

    def check(self, num_steps: int) -> list[str]:
        return []


@dataclass
class Window:
    """A contiguous window of ``size`` stochastic steps inside ``range``: what the window strategies
    share (where the window starts is theirs)."""

    size: Steps = 2
    range: list[StepIndex] | None = None
    """``[lo, hi)``: the window lies inside these steps; default all steps."""

    label = "window"

    def bounds(self, num_steps: int) -> tuple[int, int]:
        lo, hi = self.range if self.range is not None else (0, num_steps)
        return lo, hi

    def window_problems(self, num_steps: int) -> list[str]:
        if self.range is not None and len(self.range) != 2:
            return [f"{self.label} range must be [lo, hi), got {self.range}"]
        lo, hi = self.bounds(num_steps)
        if self.size < 1 or not (0 <= lo < hi <= num_steps) or hi - lo < self.size:
            return [
                f"{self.label} window of size {self.size} in range [{lo}, {hi}) does not fit a schedule of "
                f"{num_steps} steps (need 1 <= size <= hi - lo and 0 <= lo < hi <= {num_steps}); "
                "use a smaller size or more sampling.num_steps"
            ]
        return []


@dataclass
class SdeWindow(Window):
    label = "sde_window"

    def __call__(self, num_steps: int, rollout_id: int, seed: int) -> list[int]:
        lo, hi = self.bounds(num_steps)
        start = random.Random(derive_seed(seed, "sde_window", rollout_id)).randint(lo, hi - self.size)
        return list(range(start, start + self.size))

    def check(self, num_steps: int) -> list[str]:
        return self.window_problems(num_steps)


@dataclass
class EpochGlobalRandomChoice:
    k: Steps = 2
    candidates: list[StepIndex] | None = None

    def __call__(self, num_steps: int, rollout_id: int, seed: int) -> list[int]:
        pool = self.candidates if self.candidates is not None else list(range(num_steps))
        rng = random.Random(derive_seed(seed, "step_choice", rollout_id))
        return sorted(rng.sample(pool, self.k))

    def check(self, num_steps: int) -> list[str]:
        pool = self.candidates if self.candidates is not None else list(range(num_steps))
        errors = []
        if any(not 0 <= c < num_steps for c in pool):
            errors.append(f"epoch_global_random_choice candidates {pool} must lie in [0, {num_steps})")
        if not 1 <= self.k <= len(set(pool)):
            errors.append(f"epoch_global_random_choice k={self.k} must be in [1, {len(set(pool))}]")
        return errors


@dataclass
class MixGRPOWindow(Window):
    """MixGRPO's progressive sliding window (Li et al. 2025, arXiv 2507.21802; Tencent-
    Hunyuan/MixGRPO ``fastvideo/utils/grpo_states.py::GRPOTrainingStates``, ``sample_strategy=
    "progressive"``: ``update_iteration`` and ``get_current_timesteps``, as ``train_grpo_flux.py``
    drives them once per training iteration).

    At iteration ``r`` (the rollout id), with ``k = r // shift_interval`` moves done and ``range =
    [lo, hi)`` (the reference's ``[init_timestep, max_timesteps)``), the window starts at

        s = lo + (k mod (⌊(hi − lo) / stride⌋ + 1))·stride     with ``wrap`` (``roll_back``)
        s = min(lo + k·stride, hi)                             without (its clip)

    and is ``[s, min(s + size, hi))``: cut at ``hi``, so it shrinks over the last steps, and with
    ``wrap`` it starts over once a move passes ``hi`` (a start equal to ``hi`` still counts, as the
    reference's ``cur_timestep > max_timesteps`` test has it). Where that window is empty (``s =
    hi``: the reference then trains nothing, for ``shift_interval`` iterations with ``wrap``, for
    good without) this one keeps the last non-empty window, ``s = lo + ⌊(hi − lo − 1) / stride⌋·
    stride``; every other iteration equals the reference's. A pure function of the iteration, so
    resuming from a checkpoint lands on the same window.

    Defaults are those of the reference's shipped script (``finetune_flux_grpo_MixGRPO.sh``:
    ``group_size=4``, ``iters_per_group=25``, ``prog_overlap_step=1``, ``roll_back``); its
    non-overlapping mode (no ``--prog_overlap``) is ``stride = size``. Its bound is
    ``max_timesteps = sampling_steps − 2``: ``range: [0, num_steps - 2]`` here (the default range
    is all steps).
    """

    size: Steps = 4
    """Window size (the reference's ``group_size``)."""
    shift_interval: Annotated[int, Range(1, MAX_COUNT, hint="iterations, e.g. 25")] = 25
    """Iterations between two moves (τ; the reference's ``iters_per_group``)."""
    stride: Steps = 1
    """Steps per move (the reference's ``prog_overlap_step``; ``stride = size``: non-overlapping)."""
    wrap: bool = True
    """Past the end, start over from ``range[0]`` (the reference's ``roll_back``); False: stay there."""
    label = "mix_grpo"

    def __call__(self, num_steps: int, rollout_id: int, seed: int) -> list[int]:
        lo, hi = self.bounds(num_steps)
        moves = rollout_id // self.shift_interval
        if self.wrap:
            start = lo + moves % ((hi - lo) // self.stride + 1) * self.stride
        else:
            start = min(lo + moves * self.stride, hi)
        if start >= hi:  # the reference's window is empty here: keep the last one that is not
            start = lo + (hi - lo - 1) // self.stride * self.stride
        return list(range(start, min(start + self.size, hi)))

    def check(self, num_steps: int) -> list[str]:
        return self.window_problems(num_steps)


@dataclass
class FunctionStrategy:
    fn: Callable[..., list[int]]
    params: dict[str, Any] = field(default_factory=dict)

    def __call__(self, num_steps: int, rollout_id: int, seed: int) -> list[int]:
        steps = sorted(set(int(s) for s in self.fn(num_steps, rollout_id, seed, **self.params)))
        if not steps or steps[0] < 0 or steps[-1] >= num_steps:
            raise ValueError(
                f"step strategy {self.fn.__name__} returned {steps}; expected indices in [0, {num_steps})"
            )
        return steps

    def check(self, num_steps: int) -> list[str]:
        return []


STEP_STRATEGIES = Registry(
    "step strategy",
    {
        "all": "diffrl.sampling.step_strategies:AllSteps",
        "sde_window": "diffrl.sampling.step_strategies:SdeWindow",
        "epoch_global_random_choice": "diffrl.sampling.step_strategies:EpochGlobalRandomChoice",
        "mix_grpo": "diffrl.sampling.step_strategies:MixGRPOWindow",
    },
)
"""Step strategies by name; a dotted path names a function (or a dataclass with ``__call__`` and
``check(num_steps) -> list[str]``) of the user's own."""


def build_step_strategy(spec: dict[str, Any], num_steps: int, where: str = "step_strategy"):
    """``{name: ..., **params}`` -> (strategy, problems). Problems name the key and the fix."""
    params = dict(spec)
    name = params.pop("name", "all")
    errors: list[str] = []
    try:
        found = STEP_STRATEGIES.resolve(str(name))
    except RegistryError as e:
        return None, [f"{where}.name: {e}"]
    if dataclasses.is_dataclass(found) and isinstance(found, type):  # a strategy class: bind its params
        strategy = bind_dataclass(found, params, where, errors)
        for method, call, args in (
            ("__call__", "strategy(num_steps, rollout_id, seed)", ("num_steps", "rollout_id", "seed")),
            ("check", "strategy.check(num_steps)", ("num_steps",)),
        ):
            bound = getattr(strategy, method, None) if not errors else None
            if bound is not None and (problem := call_problem(bound, call, args)):
                errors.append(f"{where}.name: {name!r}: its {method} {problem}")
    elif callable(found):
        problem = call_problem(
            found,
            "fn(num_steps, rollout_id, seed, **params)",
            ("num_steps", "rollout_id", "seed"),
            tuple(params),
        )
        if problem:
            return None, [f"{where}.name: {name!r} {problem}"]
        strategy = FunctionStrategy(found, params)
    else:
        return None, [f"{where}.name: {name!r} is neither a strategy dataclass nor a function"]
    if not errors:
        errors = [f"{where}: {e}" for e in strategy.check(num_steps)]
    return strategy, errors
