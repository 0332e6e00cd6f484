"""The reproducibility gate's shared part: the references, the two checks, and which test module
runs which recipe (``test_reproducibility_gate.py`` and ``test_reproducibility_gate_grpo.py``:
two modules so the two xdist workers share the runs, each module's recipes in one subprocess).

The runs and the references are made by one function, ``run_recipes`` of
``scripts/reference_metrics.py``, so both compute the same way, in the default mode
(``run.deterministic: portable``).

Which check runs depends on this machine's kind (``diffrl.core.determinism.kind_of``):

- **exact**, on a machine of the references' kind. In the portable mode that kind names no vendor
  and no level above AVX2: every x86-64 CPU with AVX2 and FMA and the same torch (what
  ``constraints/cpu.txt`` installs) is of it, Intel or AMD, AVX2 or AVX-512. Every metric and every
  tensor of the final checkpoint is compared exactly.
- **near**, on any other kind (another architecture, a CPU without AVX2, another torch; or a run
  made outside the portable mode): every metric within :data:`NEAR_RTOL` of the reference's
  (relative; or :data:`NEAR_ATOL`, absolute, for float-noise values), the float-noise quantities of
  :data:`NOT_NEAR` aside, tensors not compared. Another
  kind computes other bits from the first training step on, far below that band; one changed seed
  or learning rate moves the metrics far outside it (``test_reproducibility_gate_near.py`` shows
  both). It says so at the end of the run (``reproducibility gate: near check ...``), never silently.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import GATE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "reference_metrics.py"


def _load_script():
    spec = importlib.util.spec_from_file_location("reference_metrics", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("reference_metrics", module)
    spec.loader.exec_module(module)
    return module


reference_metrics = _load_script()
REFERENCES: Path = reference_metrics.REFERENCES
SHOWN = 12
"""Differences quoted in a failure."""


def in_grpo_module(recipe: str) -> bool:
    """Which module runs ``recipe``: the Flow-GRPO recipes (the longer runs) in
    ``test_reproducibility_gate_grpo.py``, the others in ``test_reproducibility_gate.py``."""
    return "grpo" in recipe


def referenced(grpo: bool) -> list[str]:
    """The recipes with a reference file that the module (``grpo``: the GRPO one) runs."""
    return sorted(p.stem for p in REFERENCES.glob("*.json") if in_grpo_module(p.stem) == grpo)


def load_reference(recipe: str) -> dict:
    return json.loads((REFERENCES / f"{recipe}.json").read_text())


def _same(a, b, key: str = "") -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def metric_differences(expected: list[dict], got: list[dict], same=_same) -> list[str]:
    """Each metric that differs (``same`` false), row by row (``metrics.jsonl``'s order), with both values."""
    out = []
    if len(expected) != len(got):
        out.append(f"{len(got)} metric rows, the reference has {len(expected)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        for key in sorted(set(e) | set(g)):
            a, b = e.get(key, "<absent>"), g.get(key, "<absent>")
            if not same(a, b, key):
                out.append(f"row {i} (step {e.get('step')}) {key}: reference {a!r}, this run {b!r}")
    return out


def tensor_differences(expected: dict[str, str], got: dict[str, str]) -> list[str]:
    """Each checkpoint tensor whose sha256 differs, or that only one side has."""
    return [
        f"{name}: reference {expected.get(name, '<absent>')[:16]}, this run {got.get(name, '<absent>')[:16]}"
        for name in sorted(set(expected) | set(got))
        if expected.get(name) != got.get(name)
    ]


NEAR_RTOL = 1e-3
"""The near check's band: relative to the reference's value."""
NEAR_ATOL = 1e-6
"""... or absolute, for values that are float noise in these short runs: a Flow-GRPO loss at its
first step, where every ratio is 1 (5e-7, and 7e-9 vs 1.5e-8 for its policy loss between two kinds
of kernels on one machine), its approximate KL (3e-10)."""
NOT_NEAR = ("train/old_deviate", "train/log_prob_mean_abs_diff")
"""Metrics the near check leaves out: differences of two nearly equal quantities (the policy against
its old copy, the replayed log-prob against the recorded one), zero or float noise on any kind, so
their relative difference between kinds is not small."""


@dataclass
class Gate:
    """A module's runs and the check they get."""

    check: str
    """``exact`` or ``near`` (the module's docstring)."""
    why: str
    runs: dict[str, dict]

    def said(self) -> str:
        return f"{self.check} check ({self.why})"


def choose_check(recipes: list[str], here: str) -> tuple[str, str]:
    """``exact`` where the runs' kind (``here``: this machine's, in the mode the references were made
    in) is the references' kind, else ``near``; and why."""
    kinds = sorted({load_reference(r)["kind"] for r in recipes})
    if kinds == [here]:
        return "exact", f"this machine is of the references' kind, {here!r}"
    return "near", (
        f"this machine is of kind {here!r}, the references of {', '.join(map(repr, kinds))}: their bits "
        f"are not this kind's, so each metric is compared within {NEAR_RTOL:g} (relative) or {NEAR_ATOL:g}"
    )


def fail_with(recipe: str, reference: dict, problems: list[str], what: str, check: str = "exact") -> None:
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    pytest.fail(
        f"{recipe} ({check} check): {what} differ from tests/data/reproducibility/{recipe}.json (made at "
        f"{reference['commit']} on {reference['kind']}):\n  {shown}{more}\nIf the change is meant, regenerate "
        f"with `{reference['command']}` and say in the commit message why the numbers moved.",
        pytrace=False,
    )


def run_gate(recipes: list[str], tmp_path_factory, extra: list[str] | None = None) -> Gate:
    """A module's runs (its fixture) and the check they get (:func:`choose_check` with the kind the
    runs report)."""
    runs = reference_metrics.run_recipes(recipes, tmp_path_factory.mktemp("gate"), extra=extra)
    check, why = choose_check(recipes, runs[recipes[0]]["kind"])
    return Gate(check, why, runs)


def _near(a, b, key: str) -> bool:
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (a, b))
    return (
        key in NOT_NEAR
        or _same(a, b)
        or (numbers and math.isclose(a, b, rel_tol=NEAR_RTOL, abs_tol=NEAR_ATOL))
    )


def near_differences(expected: list[dict], got: list[dict]) -> list[str]:
    """Each metric outside the near band (:data:`NEAR_RTOL`, :data:`NEAR_ATOL`; :data:`NOT_NEAR`
    aside), row by row."""
    return metric_differences(expected, got, same=_near)


def check(recipe: str, gate: Gate, request=None) -> None:
    """``gate``'s run of ``recipe`` against the reference: exactly, or near (:func:`choose_check`).
    ``request``: the test's, whose report then says which check ran (``tests/conftest.py`` prints it)."""
    if request is not None:
        request.node.user_properties.append((GATE, gate.said()))
    reference, got = load_reference(recipe), gate.runs[recipe]
    if gate.check == "near":
        problems = near_differences(reference["metrics"], got["metrics"])
        if problems:
            fail_with(recipe, reference, problems, "metrics", "near")
        return
    if got["kind"] != reference["kind"]:  # the kind was read before the runs
        pytest.fail(f"{recipe}: ran on kind {got['kind']!r}, the reference is of {reference['kind']!r}")
    problems = metric_differences(reference["metrics"], got["metrics"])
    if problems:
        fail_with(recipe, reference, problems, "metrics")
    problems = tensor_differences(reference["tensors"], got["tensors"])
    if problems:
        fail_with(recipe, reference, problems, "the final checkpoint's tensors")
