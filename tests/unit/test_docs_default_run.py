"""Where a docs page says a check runs "in the default test run", the tests it names run there: they
exist and none is marked slow (issue: docs/scaling.md said LTX-2's and Wan's DiffusionNFT equality
were checked in the default run while those tests were `-m slow`).

The rule, per sentence of README.md and of every page under docs/: a sentence that says "in the
default (test) run" or "(default run)" names the tests it means (`tests/.../test_x.py`, a bare
`test_x.py` beside the path named before it in the sentence, a glob, or a node id
`test_x.py::test_name[case]`), and
  - a module it names holds no slow test (a module-level `pytestmark`, a test's
    `@pytest.mark.slow`, or a parametrized case's `marks=pytest.mark.slow`); a module that mixes
    both is named by the node id of the test that runs by default;
  - a test it names (`::test_name`) is not slow, and has no slow case unless the case is named
    (`[case]`, as pytest spells the id: its `id=`, the parametrize `ids=`, or the value itself).
Slowness is read from the test modules' source (AST); nothing is imported or collected.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
CLAIM = re.compile(r"\bin the default (?:test )?(?:run|suite|tests)\b|\(default (?:test )?run\)", re.I)
NAMED = re.compile(r"(?<![\w/.])((?:tests/[\w/*.-]+|test_[\w*]+)\.py)(?:::(\w+)(?:\[([^\]\s`]+)\])?)?")
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`*\[])")
FENCE = re.compile(r"^\s*(```|~~~)")


def sentences(page: Path) -> list[tuple[int, str]]:
    """(line, text) of each sentence of the page's prose (headings, tables and fences left out)."""
    paragraphs: list[list[tuple[int, str]]] = []
    fenced, current = False, None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if FENCE.match(line):
            fenced, current = not fenced, None
            continue
        if fenced or not line.strip() or line.lstrip().startswith(("#", "|")):
            current = None
            continue
        if current is None or re.match(r"\s*(?:[-*+]|\d+[.)])\s", line):
            current = []
            paragraphs.append(current)
        current.append((number, line.strip()))
    out = []
    for lines in paragraphs:
        text = " ".join(line for _, line in lines)
        starts = [0]  # where each line begins in text
        for _, line in lines[:-1]:
            starts.append(starts[-1] + len(line) + 1)
        # a dot inside code ends no sentence
        masked = re.sub(r"`[^`]*`", lambda m: "`" + "_" * (len(m.group(0)) - 2) + "`", text)
        cuts = [0, *(m.end() for m in SENTENCE_END.finditer(masked)), len(text)]
        for begin, end in zip(cuts, cuts[1:]):
            line = lines[max(i for i, start in enumerate(starts) if start <= begin)][0]
            out.append((line, text[begin:end].strip()))
    return out


def _is_slow_mark(node: ast.AST) -> bool:
    """`pytest.mark.slow` (or `mark.slow`), called or not."""
    if isinstance(node, ast.Call):
        node = node.func
    return isinstance(node, ast.Attribute) and node.attr == "slow" and "mark" in ast.unparse(node)


def _mentions_slow(node: ast.AST) -> bool:
    return any(_is_slow_mark(n) for n in ast.walk(node))


@dataclass
class SourceTest:
    slow: bool = False  # the function, or its module, is marked slow
    cases: dict[str, bool] | None = None  # case id -> slow, where the source spells them out
    slow_cases: bool = False  # some parametrized case is slow

    @property
    def mixed(self) -> bool:
        return not self.slow and self.slow_cases


@dataclass
class SourceModule:
    slow: bool = False
    functions: dict[str, SourceTest] = field(default_factory=dict)


def _case_ids(decorator: ast.Call) -> dict[str, bool] | None:
    """A literal `@pytest.mark.parametrize`'s case ids -> whether each is slow; None when the
    cases are built in code (a comprehension, a name)."""
    if len(decorator.args) < 2 or not isinstance(decorator.args[1], (ast.List, ast.Tuple)):
        return None
    ids = next((k.value for k in decorator.keywords if k.arg == "ids"), None)
    given = [e.value for e in ids.elts] if isinstance(ids, (ast.List, ast.Tuple)) else None
    cases: dict[str, bool] = {}
    for i, case in enumerate(decorator.args[1].elts):
        slow, value, case_id = False, case, None
        if isinstance(case, ast.Call) and ast.unparse(case.func).endswith("param"):
            marks = next((k.value for k in case.keywords if k.arg == "marks"), None)
            slow = marks is not None and _mentions_slow(marks)
            case_id = next((k.value.value for k in case.keywords if k.arg == "id"), None)
            value = case.args[0] if len(case.args) == 1 else None
        if case_id is None and given is not None:
            case_id = given[i]
        if case_id is None and isinstance(value, ast.Constant):
            case_id = str(value.value)
        if not isinstance(case_id, str):
            return None  # an id pytest makes from several values or an object: not read here
        cases[case_id] = slow
    return cases


def read_module(path: Path) -> SourceModule:
    tree = ast.parse(path.read_text())
    module = SourceModule()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            module.slow = _mentions_slow(node.value)
    functions = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name.startswith("Test")):
        functions += [n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for fn in functions:
        if not fn.name.startswith("test"):
            continue
        test = SourceTest(slow=module.slow or any(_is_slow_mark(d) for d in fn.decorator_list))
        parametrizes = [
            d
            for d in fn.decorator_list
            if isinstance(d, ast.Call) and ast.unparse(d.func).endswith("parametrize")
        ]
        test.slow_cases = any(_mentions_slow(d) for d in parametrizes)
        if len(parametrizes) == 1:
            test.cases = _case_ids(parametrizes[0])
            if test.cases and all(test.cases.values()):
                test.slow = True  # every case is slow
        module.functions[fn.name] = test
    return module


def _resolve(name: str, near: Path | None) -> list[Path]:
    """The test modules a page's name stands for: a path or glob from the root, else a bare name
    beside the module named before it, else the one module of that name under tests/."""
    if "/" in name:
        return sorted(ROOT.glob(name))
    if near is not None and sorted(near.parent.glob(name)):
        return sorted(near.parent.glob(name))
    found = sorted((ROOT / "tests").rglob(name))
    return found if len(found) == 1 else []


def _default_nodes(relative: str, module: SourceModule) -> list[str]:
    """Node ids of the module's tests that run by default, spelled as a page should name them."""
    nodes = []
    for name, test in module.functions.items():
        if not test.slow and not test.mixed:
            nodes.append(f"{relative}::{name}")
        elif test.mixed and test.cases:
            nodes += [f"{relative}::{name}[{case}]" for case, slow in test.cases.items() if not slow]
    return nodes


def problems_of(sentence: str) -> list[str]:
    names = NAMED.findall(sentence)
    if not names:
        return ["says it runs in the default test run but names no test: name the test module or node id"]
    out, near = [], None
    for name, function, case in names:
        modules = _resolve(name, near)
        if not modules:
            out.append(f"{name}: no such test module (or the bare name is ambiguous: give its path)")
            continue
        near = modules[-1]
        for path in modules:
            relative = path.relative_to(ROOT).as_posix()
            module = read_module(path)
            if not function:
                if module.slow:
                    out.append(f"{relative} is marked slow as a whole (pytestmark)")
                    continue
                slow = [
                    n if t.slow else f"{n} (some cases)"
                    for n, t in module.functions.items()
                    if t.slow or t.mixed
                ]
                default = _default_nodes(relative, module)
                if slow and default:
                    out.append(
                        f"{relative} also holds slow tests ({', '.join(slow)}): name the tests that run by "
                        f"default instead, e.g. {default[0]}"
                    )
                elif slow and any(t.mixed for t in module.functions.values()):
                    out.append(
                        f"{relative} holds slow tests ({', '.join(slow)}) and its other cases are built in "
                        "code, so none can be named and checked: spell the cases out with "
                        "pytest.param(..., id=...) and name the one that runs by default"
                    )
                elif slow:
                    out.append(f"{relative}: every test in it is slow ({', '.join(slow)})")
                continue
            test = module.functions.get(function)
            node = f"{relative}::{function}"
            if test is None:
                out.append(f"{node}: no such test")
            elif test.slow:
                out.append(f"{node} is marked slow")
            elif case:
                if test.cases is None:
                    out.append(
                        f"{node}[{case}]: its cases are built in code, so whether this one is slow cannot be read "
                        "from the source: spell them out with pytest.param(..., id=...)"
                    )
                elif case not in test.cases:
                    out.append(f"{node}[{case}]: no such case (cases: {', '.join(test.cases)})")
                elif test.cases[case]:
                    out.append(f"{node}[{case}] is marked slow")
            elif test.mixed:
                default = [c for c, slow in (test.cases or {}).items() if not slow]
                hint = f"e.g. {node}[{default[0]}]" if default else "the case that runs by default"
                out.append(f"{node} has slow cases: name the one that runs by default ({hint})")
    return out


def test_tests_said_to_run_by_default_are_not_slow():
    failures = []
    for page in PAGES:
        for line, sentence in sentences(page):
            if CLAIM.search(sentence):
                failures += [f"{page.relative_to(ROOT)}:{line}: {p}" for p in problems_of(sentence)]
    assert not failures, (
        "a page says these run in the default test run (python -m pytest -q, which deselects -m slow); "
        "they do not:\n" + "\n".join(failures)
    )


def test_the_rule_reads_slow_marks_where_they_are(tmp_path):
    # every way a test is put in the slow tier, and the ways it is not, on a module written here
    source = """
import pytest
@pytest.mark.slow
def test_slow(): pass
@pytest.mark.parametrize("a", ["fast", pytest.param("slow", marks=pytest.mark.slow)])
def test_mixed(a): pass
@pytest.mark.parametrize("a", [pytest.param(a, marks=[pytest.mark.slow] if a else []) for a in (0, 1)])
def test_built(a): pass
@pytest.mark.parametrize("a", [1, 2], ids=["one", "two"])
def test_fast(a): pass
"""
    path = tmp_path / "test_sample.py"
    path.write_text(source)
    module = read_module(path)
    assert module.functions["test_slow"].slow
    mixed, built, fast = (module.functions[f"test_{name}"] for name in ("mixed", "built", "fast"))
    assert mixed.mixed and mixed.cases == {"fast": False, "slow": True}
    assert built.mixed and built.cases is None  # built in a comprehension: ids not read
    assert not fast.slow_cases and fast.cases == {"one": False, "two": False}
    path.write_text("import pytest\npytestmark = [pytest.mark.slow]\ndef test_a(): pass\n")
    assert read_module(path).slow and read_module(path).functions["test_a"].slow
