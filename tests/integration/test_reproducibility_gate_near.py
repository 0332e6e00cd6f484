"""The reproducibility gate's near check, the one a machine of another kind gets
(``reproducibility_gate.py``): it passes a run whose kernels differ from the references' (this
machine's own kind, ``run.deterministic=true``: MKL's own branch, not the portable one) and fails a
run with one changed seed and one with a changed learning rate; so does the exact check. The main
job's recipe, shrunk as the gate shrinks it, one subprocess a run; in the slow tier
(``python -m pytest -m slow``, which ``.ci/run`` runs too)."""

from __future__ import annotations

import pytest

from tests.integration.reproducibility_gate import (
    choose_check,
    load_reference,
    metric_differences,
    near_differences,
    reference_metrics,
)

pytestmark = pytest.mark.slow  # three more runs of the main job's shrunk recipe (~80 s of one core)

RECIPE = "tiny_demo"
RUNS = {
    "kind": ["run.deterministic=true"],
    "seed": ["run.seed=1"],
    "lr": ["train.lr=1.2e-3"],  # the recipe's 1e-3, 20% up
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    return {
        name: reference_metrics.run_recipes([RECIPE], tmp_path_factory.mktemp(name), extra=extra)[RECIPE]
        for name, extra in RUNS.items()
    }


def test_another_kind_of_kernels_passes_the_near_check(runs):
    reference = load_reference(RECIPE)
    assert not near_differences(reference["metrics"], runs["kind"]["metrics"])
    assert choose_check([RECIPE], runs["kind"]["kind"])[0] == "near"  # the check such a machine gets


@pytest.mark.parametrize("perturbed", ["seed", "lr"])
def test_a_perturbed_run_fails_both_checks(runs, perturbed):
    reference = load_reference(RECIPE)["metrics"]
    near = near_differences(reference, runs[perturbed]["metrics"])
    assert near, f"the near check passed a run with {RUNS[perturbed]}"
    assert metric_differences(reference, runs[perturbed]["metrics"])


def test_the_check_is_chosen_by_kind():
    kind = load_reference(RECIPE)["kind"]
    assert choose_check([RECIPE], here=kind)[0] == "exact"
    check, why = choose_check([RECIPE], here="aarch64 aarch64 -/- torch 2.13.0")
    assert check == "near" and "aarch64" in why and kind in why
