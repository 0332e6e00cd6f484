"""The runtime protocol: what code outside ``models/`` calls on a loaded family is
:class:`~diffrl.models.base.FamilyRuntime`, and every built-in family provides all of it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import diffrl
from diffrl.models.base import FamilyRuntime, ModelFamily
from diffrl.models.registry import FAMILIES

PACKAGE = Path(diffrl.__file__).parent
MEMBERS = {n for n in vars(FamilyRuntime) if not n.startswith("_")} | set(FamilyRuntime.__annotations__)


def _family_uses(tree: ast.AST) -> set[tuple[str, int]]:
    """``(attribute, line)`` of every ``family.X`` and ``<anything>.family.X``."""
    uses = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "family") or (
                isinstance(owner, ast.Attribute) and owner.attr == "family"
            ):
                uses.add((node.attr, node.lineno))
    return uses


def test_the_protocol_is_at_most_fifteen_calls():
    methods = {
        n
        for n, v in vars(FamilyRuntime).items()
        if not n.startswith("_") and (callable(v) or isinstance(v, property))
    }
    assert 10 <= len(methods) <= 15, sorted(methods)


def test_code_outside_models_calls_only_the_protocol():
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.relative_to(PACKAGE).parts[0] == "models":
            continue
        for attr, line in _family_uses(ast.parse(path.read_text())):
            if attr not in MEMBERS:
                outside.append(f"{path.relative_to(PACKAGE)}:{line}: family.{attr}")
    assert not outside, "\n".join(sorted(outside))


def test_the_check_sees_a_call_outside_the_protocol():
    tree = ast.parse(
        "def f(self, family):\n    family.decode(x)\n    self.family.forward(m)\n    family.velocity(x)\n"
    )
    assert {a for a, _ in _family_uses(tree)} == {"decode", "forward", "velocity"}


@pytest.mark.parametrize("name", FAMILIES.names())
def test_every_family_provides_the_protocol(name):
    cls = FAMILIES.resolve(name)
    assert issubclass(cls, ModelFamily)
    missing = [m for m in MEMBERS if not hasattr(cls, m) and m not in FamilyRuntime.__annotations__]
    assert not missing
    for m in MEMBERS - set(FamilyRuntime.__annotations__):
        theirs, ours = getattr(cls, m), vars(FamilyRuntime)[m]
        if callable(ours) and not isinstance(ours, property):
            assert list(inspect.signature(theirs).parameters) == list(inspect.signature(ours).parameters), m
