"""The reproducibility gate: 2-3 shrunk iterations of each shipped tiny recipe give the committed
references' bits (``tests/data/reproducibility/``, made by ``python scripts/reference_metrics.py``
in the portable mode): every metric but the wall-clock ones and every tensor of the final
checkpoint, exactly, on every machine of the references' kind (every x86-64 CPU with AVX2 and FMA,
with the locked torch); on another kind, every metric within the near band. The run's last lines
say which check ran and why (``reproducibility_gate.py``).

This module runs the recipes other than Flow-GRPO's (one subprocess for all of them);
``test_reproducibility_gate_grpo.py`` runs the GRPO ones, so xdist's two workers share the cost.
"""

from __future__ import annotations

import pytest

from tests.integration.reproducibility_gate import (
    REFERENCES,
    check,
    load_reference,
    reference_metrics,
    referenced,
    run_gate,
)

RECIPES = referenced(grpo=False)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_gate(RECIPES, tmp_path_factory)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_fresh_run_gives_the_references_bits(recipe, runs, request):
    check(recipe, runs, request)


def test_every_tiny_recipe_has_a_current_reference():
    # a new tiny recipe needs a SHRINK row and a reference; a changed SHRINK row a new reference
    recipes = reference_metrics.tiny_recipes()
    assert recipes, "no diffrl/recipes/tiny_*.yaml found"
    assert not [r for r in recipes if r not in reference_metrics.SHRINK], (
        "tiny recipes without a SHRINK row in scripts/reference_metrics.py"
    )
    files = sorted(p.stem for p in REFERENCES.glob("*.json"))
    assert files == recipes, (
        f"tests/data/reproducibility/ has {files}, the tiny recipes are {recipes}: "
        "run `python scripts/reference_metrics.py <recipe>` (or delete the reference of a removed recipe)"
    )
    stale = [r for r in recipes if load_reference(r)["overrides"] != reference_metrics.overrides(r)]
    assert not stale, f"references made with other overrides than the script's: regenerate {stale}"


def test_the_wall_clock_rule():
    wall = reference_metrics.is_wall_clock
    assert all(
        map(wall, ["time", "perf/iteration_time", "perf/train_flops", "perf/rollout_mfu", "x/wait_time"])
    )
    assert not any(
        map(wall, ["step", "train/loss", "rollout/reward/raw_mean", "eval/reward_mean", "train/lr"])
    )
