"""The reproducibility gate's shared part: the references, the comparison, and which test module
runs which recipe (``test_reproducibility_gate.py`` and ``test_reproducibility_gate_grpo.py``:
two modules so the two xdist workers share the runs, each module's recipes in one subprocess).

The runs and the references are made by one function, ``run_recipes`` of
``scripts/reference_metrics.py``, so both compute the same way.

Only on a machine of the references' kind (``diffrl.core.determinism.kind_of``: the architecture, the
CPU's vendor, the ISA the libraries are pinned to and torch's version): there every metric and
every tensor is compared exactly. On another kind the module is skipped before it runs anything,
naming the kind the references need: another vendor or ISA level computes other bits from the
first training step on (issue 39: an Intel Sapphire Rapids and an AMD Zen 4 agreed on the first
rollout's mean reward and were 0.3% apart after the first update), and a tolerance loose enough
for that would let a real change through.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

from diffrl.core.determinism import machine_kind

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


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


def metric_differences(expected: list[dict], got: list[dict]) -> list[str]:
    """Each metric that differs, row by row (``metrics.jsonl``'s order), with both values."""
    out = []
    if len(expected) != len(got):
        out.append(f"{len(got)} metric rows, the reference has {len(expected)}")
    for i, (e, g) in enumerate(zip(expected, got)):
        for key in sorted(set(e) | set(g)):
            a, b = e.get(key, "<absent>"), g.get(key, "<absent>")
            if not _same(a, b):
                out.append(f"row {i} (step {e.get('step')}) {key}: reference {a!r}, this run {b!r}")
    return out


def tensor_differences(expected: dict[str, str], got: dict[str, str]) -> list[str]:
    """Each checkpoint tensor whose sha256 differs, or that only one side has."""
    return [
        f"{name}: reference {expected.get(name, '<absent>')[:16]}, this run {got.get(name, '<absent>')[:16]}"
        for name in sorted(set(expected) | set(got))
        if expected.get(name) != got.get(name)
    ]


def kind_mismatch(recipes: list[str]) -> str | None:
    """Why this machine cannot run the gate (its kind is not the references'), else None."""
    here = machine_kind()
    kinds = sorted({load_reference(r)["kind"] for r in recipes})
    if kinds == [here]:
        return None
    return (
        f"this machine is of kind {here!r}, the references of {', '.join(map(repr, kinds))}: "
        "the gate compares bits only between machines of one kind (see tests/integration/reproducibility_gate.py)"
    )


def fail_with(recipe: str, reference: dict, problems: list[str], what: str) -> None:
    shown = "\n  ".join(problems[:SHOWN])
    more = f"\n  ... and {len(problems) - SHOWN} more" if len(problems) > SHOWN else ""
    pytest.fail(
        f"{recipe}: {what} differ from tests/data/reproducibility/{recipe}.json (made at {reference['commit']} "
        f"on {reference['kind']}):\n  {shown}{more}\nIf the change is meant, regenerate with "
        f"`{reference['command']}` and say in the commit message why the numbers moved.",
        pytrace=False,
    )


def run_gate(recipes: list[str], tmp_path_factory) -> dict[str, dict]:
    """A module's runs (its fixture): skipped before anything runs on a machine of another kind."""
    why = kind_mismatch(recipes)
    if why:
        pytest.skip(why)
    return reference_metrics.run_recipes(recipes, tmp_path_factory.mktemp("gate"))


def check(recipe: str, got: dict) -> None:
    """``got`` (``run_recipes``'s result for ``recipe``) against the reference, exactly."""
    reference = load_reference(recipe)
    if got["kind"] != reference["kind"]:  # the module checked the kind before it ran anything
        pytest.fail(f"{recipe}: ran on kind {got['kind']!r}, the reference is of {reference['kind']!r}")
    problems = metric_differences(reference["metrics"], got["metrics"])
    if problems:
        fail_with(recipe, reference, problems, "metrics")
    problems = tensor_differences(reference["tensors"], got["tensors"])
    if problems:
        fail_with(recipe, reference, problems, "the final checkpoint's tensors")
