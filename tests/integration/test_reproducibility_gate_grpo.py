"""The reproducibility gate for the Flow-GRPO tiny recipes (the rest, and which check runs where:
``test_reproducibility_gate.py``). A module of its own so
the two xdist workers share the gate's runs; its recipes run in one subprocess."""

from __future__ import annotations

import pytest

from tests.integration.reproducibility_gate import check, referenced, run_gate

RECIPES = referenced(grpo=True)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return run_gate(RECIPES, tmp_path_factory)


@pytest.mark.parametrize("recipe", RECIPES)
def test_a_fresh_flow_grpo_run_gives_the_references_bits(recipe, runs, request):
    check(recipe, runs, request)
