"""constraints/cpu.txt, the lock made by ``python constraints/lock.py``, agrees with pyproject.toml:
every requirement (dependencies and every extra) pinned with ``==`` to a version it allows, no name
twice, and closed: what a locked package requires is locked too. Reads files and the installed
metadata only (no network)."""

from __future__ import annotations

import tomllib
from importlib.metadata import PackageNotFoundError, distribution

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tests.conftest import ROOT

LOCK = ROOT / "constraints" / "cpu.txt"


def parse_lock(text: str) -> dict[NormalizedName, Version]:
    """``name==version`` lines (comments and blank lines aside) -> {normalised name: version}."""
    pins: dict[NormalizedName, Version] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)  # raises InvalidRequirement on a line that does not parse
        [spec] = req.specifier or [None]
        assert spec is not None and spec.operator == "==" and not req.marker and not req.extras, (
            f"cpu.txt:{number}: {line!r} is not a plain name==version pin"
        )
        name = canonicalize_name(req.name)
        assert name not in pins, f"cpu.txt:{number}: {req.name} is pinned twice"
        pins[name] = Version(spec.version)
    return pins


def project_requirements() -> dict[str, list[Requirement]]:
    """pyproject.toml's requirements: ``""`` -> [project].dependencies, then each extra's."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project.get("optional-dependencies", {})}
    return {group: [Requirement(r) for r in reqs] for group, reqs in groups.items()}


def needed(req: Requirement, extra: str = "") -> bool:
    """Whether ``req`` is needed here by a package installed with ``extra`` ("" for none); its marker
    is evaluated for this interpreter and platform."""
    return req.marker is None or req.marker.evaluate({"extra": extra})


def installed_version(name: str) -> Version | None:
    try:
        return Version(distribution(name).version)
    except PackageNotFoundError:
        return None


PINS = parse_lock(LOCK.read_text())


def test_the_lock_parses_and_pins_what_its_test_reads_with():
    assert len(PINS) > 20  # the full environment, not torch alone
    assert "torch" in PINS and PINS["torch"].local == "cpu"  # the CPU build
    assert "packaging" in PINS and installed_version("packaging") is not None
    assert canonicalize_name("diffrl") not in PINS  # the project itself is installed editable
    assert "pip" not in PINS  # the installer, required by nothing installed


def test_every_project_requirement_is_pinned_to_a_version_it_allows():
    problems = []
    for group, reqs in project_requirements().items():
        for req in filter(needed, reqs):
            pin = PINS.get(canonicalize_name(req.name))
            if pin is None:
                problems.append(f"{req} ({group or 'dependencies'}): not in the lock")
            elif not req.specifier.contains(pin, prereleases=True):
                problems.append(f"{req} ({group or 'dependencies'}): the lock pins {pin}")
    assert not problems, "refresh the lock: python constraints/lock.py\n" + "\n".join(problems)


def test_the_lock_is_closed_over_what_its_packages_require():
    """From diffrl with every extra and from each locked package: every requirement of a locked
    package installed at its pinned version (its metadata is then that release's) is locked at a
    version it allows, with the extras it asks for walked too. A package installed at another
    version (a GPU machine's own torch) is not the locked release: its metadata says nothing here."""
    roots = [req for reqs in project_requirements().values() for req in filter(needed, reqs)]
    todo = roots + [Requirement(name) for name in PINS]
    expanded: dict[NormalizedName, set[str]] = {}
    problems = []
    while todo:
        req = todo.pop()
        name, pin = canonicalize_name(req.name), PINS.get(canonicalize_name(req.name))
        if pin is None or not req.specifier.contains(pin, prereleases=True):
            problems.append(f"{req}: " + ("not in the lock" if pin is None else f"the lock pins {pin}"))
            continue
        new = {"", *map(canonicalize_name, req.extras)} - expanded.setdefault(name, set())
        expanded[name] |= new
        if new and installed_version(name) == pin:
            deps = map(Requirement, distribution(name).requires or [])
            todo += [dep for dep in deps if any(needed(dep, extra) for extra in new)]
    assert not problems, "refresh the lock: python constraints/lock.py\n" + "\n".join(sorted(set(problems)))
    if not any(installed_version(name) == pin for name, pin in PINS.items()):
        pytest.skip("no locked package is installed at its pinned version: closure unchecked")
