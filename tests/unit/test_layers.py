"""The package's layering (docs/ARCHITECTURE.md), checked on every test run.

- the import-linter contract in ``pyproject.toml`` (``[tool.importlinter]``): no module imports a
  layer above it, and the parts of one layer marked ``|`` do not import each other;
- no import cycles between modules (counting imports made inside functions);
- imports inside functions only for optional dependencies (``ray``).

Each check is also run once on a copy of the package with one bad import added, to show it fails.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("ray", "datasets", "pyarrow")  # pyarrow: installed with datasets (diffrl[datasets])
"""Top-level packages that may be imported inside a function: optional dependencies (extras)."""


def _modules(package_dir: Path) -> dict[str, Path]:
    root = package_dir.parent
    out = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, module: str, is_package: bool):
    """``(imported module, line, inside a function)`` for every import statement of a file."""
    tree = ast.parse(path.read_text())
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            nested = in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if isinstance(child, ast.Import):
                found.extend((a.name, child.lineno, in_function) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolve against this module's package
                    pkg = module.split(".") if is_package else module.split(".")[:-1]
                    base = ".".join(pkg[: len(pkg) - child.level + 1] + ([base] if base else []))
                found.append((base, child.lineno, in_function))
                found.extend((f"{base}.{a.name}", child.lineno, in_function) for a in child.names)
            visit(child, nested)

    visit(tree, False)
    return found


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (at the top or inside functions)."""
    modules = _modules(package_dir)
    graph = {m: set() for m in modules}
    for m, path in modules.items():
        for name, _, _ in _imports(path, m, path.name == "__init__.py"):
            if name in modules and name != m:
                graph[m].add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def strong(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def function_level_imports(package_dir: Path) -> list[str]:
    """``file:line name`` of each import inside a function that is not of an optional dependency."""
    bad = []
    for m, path in _modules(package_dir).items():
        for name, line, inside in _imports(path, m, path.name == "__init__.py"):
            if inside and name.split(".")[0] not in OPTIONAL and not name.startswith(f"{m}."):
                bad.append(f"{path.relative_to(package_dir.parent)}:{line} {name}")
    return sorted(set(bad))


def lint_imports(root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_layer_contract_holds():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_no_import_cycles():
    assert cycles(import_graph(ROOT / "diffrl")) == []


def test_imports_inside_functions_are_only_of_optional_dependencies():
    assert function_level_imports(ROOT / "diffrl") == []


@pytest.fixture(scope="module")
def spoiled(tmp_path_factory) -> Path:
    """A copy of the package and its pyproject.toml with three bad imports added: an upward one
    (models -> train), a cycle inside a layer (models.base <-> models.registry) and a required
    package imported inside a function."""
    root = tmp_path_factory.mktemp("spoiled")
    shutil.copytree(
        ROOT / "diffrl", root / "diffrl", ignore=shutil.ignore_patterns("assets", "*.txt", "__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", root / "pyproject.toml")
    with open(root / "diffrl" / "models" / "tiny.py", "a") as f:
        f.write("\nfrom diffrl.train.loop import train  # noqa\n")
    with open(root / "diffrl" / "models" / "base.py", "a") as f:
        f.write(
            "\n\ndef _spoil():\n    import numpy  # noqa\n    from diffrl.models import registry  # noqa\n"
        )
    return root


def test_the_checks_catch_bad_imports(spoiled):
    result = lint_imports(spoiled)
    assert result.returncode != 0
    assert "diffrl.models.tiny -> diffrl.train.loop" in result.stdout
    assert ["diffrl.models.base", "diffrl.models.registry"] in cycles(import_graph(spoiled / "diffrl"))
    bad = function_level_imports(spoiled / "diffrl")
    assert any(b.startswith("diffrl/models/base.py:") and b.endswith(" numpy") for b in bad)


# ---- every module in a layer; the docs' table is the contract; runners chosen at the top --------


def contract_layers(pyproject: Path, name: str = "diffrl layers") -> list[set[str]]:
    """The layers of the import-linter contract ``name``, top first, each a set of modules."""
    contracts = tomllib.loads(pyproject.read_text())["tool"]["importlinter"]["contracts"]
    [contract] = [c for c in contracts if c["name"] == name]
    return [{part.strip() for part in layer.split("|")} for layer in contract["layers"]]


def doc_layers(markdown: Path) -> list[set[str]]:
    """The layer column of the table under ``## Layers`` in ``docs/ARCHITECTURE.md``, top first."""
    text = markdown.read_text().split("\n## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in text.splitlines() if re.match(r"\| \d+ \|", line)]
    cells = [re.split(r"(?<!\\)\|", row) for row in rows]  # a cell's "\|" is not a column
    return [set(re.findall(r"`(diffrl[\w.]*)`", cell[2])) for cell in cells]


def top_level(package_dir: Path) -> set[str]:
    """``diffrl.X`` for each module and package right under the package (data folders aside)."""
    names = {f"diffrl.{p.stem}" for p in package_dir.glob("*.py") if p.stem != "__init__"}
    return names | {f"diffrl.{p.name}" for p in package_dir.iterdir() if (p / "__init__.py").is_file()}


def test_every_module_of_the_package_is_in_one_layer():
    layers = contract_layers(ROOT / "pyproject.toml")
    placed = [m for layer in layers for m in layer]
    assert sorted(placed) == sorted(set(placed)), "a module in two layers"
    assert set(placed) == top_level(ROOT / "diffrl")


def test_the_docs_layer_table_is_the_contract():
    assert doc_layers(ROOT / "docs" / "ARCHITECTURE.md") == contract_layers(ROOT / "pyproject.toml")


RUNNER_HOMES = ("diffrl/launch.py", "diffrl/train/runner.py", "diffrl/distributed/")
"""The composition root and the runners: the only modules that may name a runner."""
ABOVE_ROOT = ("diffrl/command.py", "diffrl/cli/", "diffrl/preflight/")
"""The layers above the composition root (they may read ``config.ray`` to check it)."""


def _config_attr(node: ast.AST, name: str) -> bool:
    """``node`` is ``config.<name>`` (or ``cfg.<name>``, ``self.config.<name>``)."""
    if not isinstance(node, ast.Attribute) or node.attr != name:
        return False
    owner = node.value
    return (isinstance(owner, ast.Name) and owner.id in ("config", "cfg")) or (
        isinstance(owner, ast.Attribute) and owner.attr == "config"
    )


def runner_names_below_the_root(package_dir: Path) -> list[str]:
    """``file:line what`` for each comparison with a runner's name (``"ray"``, ``"local"``) outside
    the runners' homes, and each read of ``config.ray`` below the composition root."""
    found = []
    for path in sorted(package_dir.rglob("*.py")):
        rel = path.relative_to(package_dir.parent).as_posix()
        if rel.startswith(RUNNER_HOMES):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                equal = all(isinstance(op, ast.Eq | ast.NotEq) for op in node.ops)
                named = [
                    s.value for s in sides if isinstance(s, ast.Constant) and s.value in ("ray", "local")
                ]
                if named and equal:
                    found.append(f"{rel}:{node.lineno} compares with {named[0]!r}")
                elif any(_config_attr(s, "runner") for s in sides):
                    found.append(f"{rel}:{node.lineno} compares the runner")
            elif _config_attr(node, "ray") and not rel.startswith(ABOVE_ROOT):
                found.append(f"{rel}:{node.lineno} reads config.ray")
    return found


def test_no_module_below_the_composition_root_names_a_runner(tmp_path):
    assert runner_names_below_the_root(ROOT / "diffrl") == []
    spoiled = tmp_path / "diffrl" / "models"
    spoiled.mkdir(parents=True)
    (spoiled / "bad.py").write_text(
        "def f(config, name):\n    return config.runner == 'ray' or config.ray.colocate or name != 'local'\n"
        "def g(config):\n    return config.runner in ('slurm', 'k8s')\n"
    )
    assert sorted(runner_names_below_the_root(tmp_path / "diffrl")) == [
        "diffrl/models/bad.py:2 compares with 'local'",
        "diffrl/models/bad.py:2 compares with 'ray'",
        "diffrl/models/bad.py:2 reads config.ray",
        "diffrl/models/bad.py:4 compares the runner",
    ]
