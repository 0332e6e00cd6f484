"""Every published result names where it came from: each file under docs/results/ has a row in
docs/results/README.md's index (file | made at commit | command | notes) with a commit that is in
this repository and a command, and each Markdown page there opens with its own "Made at commit"
line. A new results file fails here until it is registered (issue 39: published results regenerate
from their commit)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"
INDEX = RESULTS / "README.md"
HEADING = "## Where each file came from"
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")


def index_rows() -> dict[str, tuple[str, str, str]]:
    """The index's rows: file (relative to docs/results) -> (commit cell, command cell, notes)."""
    text = INDEX.read_text()
    assert HEADING in text, f"{INDEX.relative_to(ROOT)} has no '{HEADING}' section"
    rows: dict[str, tuple[str, str, str]] = {}
    for line in text.split(HEADING, 1)[1].splitlines():
        if line.startswith("## "):
            break
        if not line.startswith("| `"):
            continue  # the header, its rule, prose
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row with {len(cells)} cells, not 4 (no '|' inside a cell): {line[:200]}"
        name = cells[0].strip("`")
        assert name not in rows, f"{name} has two rows in the index"
        rows[name] = (cells[1], cells[2], cells[3])
    return rows


def results_files() -> set[str]:
    return {p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*") if p.is_file() and p != INDEX}


def test_every_results_file_has_a_row_and_every_row_a_file():
    rows, files = index_rows(), results_files()
    assert files, "docs/results/ holds no results"
    missing = sorted(files - rows.keys())
    assert not missing, (
        f"register these in {INDEX.relative_to(ROOT)} (file | made at commit | command | notes): {missing}"
    )
    stale = sorted(rows.keys() - files)
    assert not stale, f"rows for files that are not under docs/results/: {stale}"


def test_every_row_names_a_commit_and_a_command():
    for name, (commit, command, _notes) in index_rows().items():
        assert COMMIT.search(commit), f"{name}: the 'made at commit' cell names no commit hash: {commit!r}"
        assert command, (
            f"{name}: the command cell is empty (write 'not recorded' where the history does not say)"
        )


def test_each_results_page_opens_with_its_provenance_line():
    rows = index_rows()
    for page in sorted(p for p in results_files() if p.endswith(".md")):
        head = (RESULTS / page).read_text().splitlines()[:5]
        line = next((h for h in head if h.startswith("Made at commit")), None)
        assert line, f"docs/results/{page} does not open with a 'Made at commit ... by `command`' line"
        row = " ".join(rows[page])
        named = set(COMMIT.findall(line))
        assert named, f"docs/results/{page}: its provenance line names no commit"
        assert named <= set(COMMIT.findall(row)), (
            f"docs/results/{page} names commits its index row does not: {sorted(named - set(COMMIT.findall(row)))}"
        )


def _git(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=30)


def test_the_commits_are_in_the_repository():
    if shutil.which("git") is None:
        pytest.skip("git is not installed: the commits cannot be looked up")
    if _git("rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        pytest.skip("not a git checkout (e.g. an sdist): the commits cannot be looked up")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone: older commits are not in it")
    hashes = sorted({h for commit, _, _ in index_rows().values() for h in COMMIT.findall(commit)})
    out = _git("cat-file", "--batch-check", stdin="".join(f"{h}^{{commit}}\n" for h in hashes))
    assert out.returncode == 0, out.stderr
    answers = out.stdout.splitlines()
    assert len(answers) == len(hashes), out.stdout
    # "<sha> commit <size>" for a commit; "<name> missing" or "<name> ambiguous" otherwise
    unknown = [h for h, answer in zip(hashes, answers) if answer.split()[1:2] != ["commit"]]
    assert not unknown, (
        f"commits named in {INDEX.relative_to(ROOT)} that are not in this repository: {unknown}"
    )


# Every figure on a docs page names where it came from (issue: docs numbers without provenance).
# The pages are README.md and docs/*.md; the pages under docs/results/ are the results themselves,
# checked above by their "Made at commit" line.
#
# The rule. A page is cut into blocks: paragraphs, list items, tables and fenced blocks (a fence
# without a language is printed output and is read whole; of a shell fence only its `# ...`
# comments are read; other fences not at all). Headings, inline code, link targets and URLs are not
# read. A *measured figure* is:
#   - a number with a unit of time, memory, speed or work: `0.257 s`, `5-7 minutes`, `1.6 m`,
#     `420 MB`, `2.02 MiB`, `31.2 img/s`, `16.2 PFLOP`; a duration as minutes:seconds, `5:14`;
#   - a ratio: `0.46x`, `1.55×` (not `8 x 8` or `16x16`: sizes);
#   - a percentage: `75.6%`;
#   - a number in scientific notation: `3e-8`, `1.4e-3`;
#   - a spread: `+0.083 +- 0.019`, `0.62 SE`, `SE 0.016`;
#   - a change: `3.62 -> 5.60`;
#   - in a table, every number of a column whose header names a unit or a statistic (`median s`,
#     `peak memory per rank, MB`, `img/s`, `x ...`, `+- SE`, `mean`, `min-max`, `measured`).
# A setting is no measurement: a number of the first four kinds is no figure right after a config
# key or flag in code (`` `--max-active` 4 ``, `` `max_answer_bytes` = 1 MiB ``), an override
# (`train.lr=3e-4`), "default", "e.g." or a limit's words ("at most", "up to", "more than", "deeper
# than", "over", "past"); nor is a cell of a table column headed "default", "range" or "type".
# A block *cites* a results file when it, or the block right before it (fences skipped; for a list
# item: the items it sits under and the paragraph that opens the list), names `results/<file>` (a
# link or a path) of a file registered in docs/results/README.md, whose row gives the commit and
# the command that made it. A figure in a block that cites nothing fails, unless
#   - it is a bound a test asserts: a number in scientific notation, or one after "to", "within",
#     "below", "under", "less than", "at most" or "<", equal to a numeric constant of a test module
#     the block names ("to 1e-5 (`tests/distributed/test_ray_runner.py`)"); or
#   - it is in NOT_MEASURED: a number that looks measured but is not, each with why.
# Not checked: that the cited file holds the very number (a table may round or derive it), and
# figures inside inline code.

DOC_PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_CONSTANT = "a constant of the code, not a measurement: "
NOT_MEASURED: dict[tuple[str, str], str] = {
    ("docs/bench.md", "+0.2500 +- 0.2500"): "an example of the table's layout (random detector, said there)",
    ("docs/bench.md", "+0.0000 +- 0.0000"): "an example of the table's layout (random detector, said there)",
    ("docs/bench.md", "+0.0417 +- 0.0417"): "an example of the table's layout (random detector, said there)",
    ("docs/customisation.md", "600 s"): _CONSTANT + "CALL_TIMEOUT_S, diffrl/logging/trackers.py",
    ("docs/customisation.md", "5 s"): _CONSTANT + "LINGER_S, diffrl/core/user_code.py",
    ("docs/quickstart.md", "2x"): _CONSTANT + "grid_scale's zoom, diffrl/evaluation/evaluate.py",
    ("docs/recipes.md", "80 GB"): "the memory of the GPU kind a recipe's header names",
    ("docs/recipes.md", "141 GB"): "the memory of the GPU kind a recipe's header names",
    ("docs/recipes.md", "2 s"): "a recipe's setting: ltx2_grpo's sound per clip",
    ("docs/recipes.md", "1e-4"): "a recipe's setting: sd35_nft_pickscore's KL weight",
    ("docs/rewards.md", "256 MB"): _CONSTANT + "OCR_WORKER_BYTES, diffrl/rewards/ocr.py",
    ("docs/rewards.md", "1.1 GB"): "arithmetic: the limits' defaults summed in diffrl/serving/limits.py",
    ("docs/rewards.md", "30 s"): _CONSTANT + "STUCK_S, diffrl/serving/server.py",
    ("docs/rewards.md", "3 s"): _CONSTANT + "PROBE_TIMEOUT_S, diffrl/transport/client.py and openai_judge.py",
    ("docs/troubleshooting.md", "64 KiB"): _CONSTANT + "SAMPLE_BYTES, diffrl/train/manifest.py",
    ("docs/engines.md", "1e-4"): "another project's bound: 'the predecessor expects < 1e-4'",
    ("docs/engines.md", "24 GB"): "arithmetic: a 12B transformer's weights in bf16",
    (
        "docs/engines.md",
        "5.9x",
    ): "another project's number: sglang-diffusion's published speedups over diffusers",
    ("docs/scaling.md", "11 GB"): "arithmetic: UMT5-XXL's parameters in bf16",
    ("docs/scaling.md", "24 GB"): "arithmetic: Gemma 3 12B's parameters in bf16",
    ("docs/scaling.md", "20 GB"): "a quoted former hand estimate of a recipe's header, not a measurement",
    ("docs/trust.md", "4 GB"): "arithmetic: ViT-H-14's parameters in float32",
    ("docs/trust.md", "1 SE"): "the width of the report's bands, a setting",
    ("docs/reproducibility.md", "20%"): "arithmetic: train.lr 1.2e-3 against the recipe's 1e-3",
}
"""(page, figure as the failure message prints it) -> why it is no measurement: a constant of the
code, a setting, arithmetic, hardware, another project's number. A figure that was measured goes to
docs/results/ (or off the page), never here."""

_NUM = r"(?<![\w.])[-+]?\d[\d,]*(?:\.\d+)?"
_BARE = r"[-+]?\d[\d,]*(?:\.\d+)?"
_UNIT = (
    r"(?:ns|µs|us|ms|s|secs?|seconds?|m|min|mins|minutes?|h|hours?|days?|bytes|[kKMGTP]i?B"
    r"|[KMGTPE]?FLOPs?(?:/s)?|[A-Za-z]+/s)"
)
SETTABLE = [
    _NUM + r"(?:\s?(?:-|to)\s?" + _BARE + r")?[ -]?" + _UNIT + r"(?![\w/])",  # 0.44-0.63 s
    _NUM + r"[x×](?!\w)",  # 0.46x (16x16 is a size)
    _NUM + r" [x×](?=\s*(?:[,.;:)\]*]|$))",  # 2 x, (8 x 8 is a size)
    _NUM + r"\s?%",
    r"(?<![\w:.])\d{1,2}:[0-5]\d(?![\d:])",  # 5:14 (minutes:seconds)
    r"(?<![\w.])[-+]?\d+(?:\.\d+)?e[-+]?\d+(?![\w.])",  # 1.4e-3
]
ALWAYS = [
    _NUM + r"\s*(?:±|\+-|\+/-)\s*" + _BARE,  # +0.083 +- 0.019
    _NUM + r"\s?SE\b|\bSE\s+\d[\d.]*",
    r"(?<![\w.])[-+]?\d+\.\d+\s*(?:->|→)\s*" + _BARE,  # 3.62 -> 5.60 (768→1024 is a shape)
]
FIGURES = re.compile("|".join([f"(?P<always>{'|'.join(ALWAYS)})", *SETTABLE]))
SETTING = re.compile(
    r"(?:KEY\s*[=:]?|[\w.]+=|\bdefaults?(?:\s+(?:to|is|of))?\s*[:=]?|\be\.g\.,?"
    r"|\b(?:at\s+most|up\s+to|no\s+more\s+than|more\s+than|deeper\s+than|over|past)(?:\s+every)?)\s*$",
    re.I,
)
"""What, right before a number, makes it a setting or a limit rather than a measurement."""
CONFIG_KEY = re.compile(r"^(?:--)?[A-Za-z_][\w.\-\[\]]*$")
STATISTIC_HEADER = re.compile(
    r"(?:^|[\s,(])(?:s|ms|min|[kKMGT]i?B|bytes|%|x|×|SE|[A-Za-z]+\s?/\s?s|median|mean|min-max|measured)"
    r"(?=$|[\s,)/])"
)
SETTING_HEADER = re.compile(r"\b(?:default|range|type)\b", re.I)
BOUND = re.compile(r"(?:\bto|\bwithin|\bbelow|\bunder|\bless\s+than|\bat\s+most|<=?|≤)\s*(?:about\s+)?$")
"""What, right before a number, makes it a bound (which a named test may assert)."""
SCIENTIFIC = re.compile(r"^[-+]?\d+(?:\.\d+)?e[-+]?\d+$")
NUMBER = re.compile(_NUM)
CITATION = re.compile(r"(?<![\w/.])(?:docs/)?results/([\w.{},*/-]*\w\.\w+)")
TEST_MODULE = re.compile(r"(?<![\w/.])((?:tests/[\w/*.-]+|test_[\w*]+)\.py)")
FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w-]*)")
LIST_ITEM = re.compile(r"^(\s*)(?:[-*+]|\d+[.)])\s+")
SHELL = {"bash", "sh", "shell", "console"}


def _mask(text: str) -> str:
    """The text a reader takes as prose: a config key or flag in code becomes KEY, other code CODE;
    link targets, URLs and HTML comments go; line breaks stay, so that line numbers hold."""

    def code(m: re.Match) -> str:
        inner = m.group(0).strip("`")
        return (" KEY " if CONFIG_KEY.match(inner) else " CODE ") + "\n" * m.group(0).count("\n")

    text = re.sub(r"<!--.*?-->", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"`[^`]+`", code, text)
    text = re.sub(r"\]\([^)\s]*\)", "]", text)
    return re.sub(r"<?https?://[^\s>)]+>?", " URL ", text)


class Block:
    """Lines of a page read together; `context` holds it and the blocks that may cite for it."""

    def __init__(self, kind: str, start: int, indent: int = 0, language: str = ""):
        self.kind, self.start, self.indent, self.language = kind, start, indent, language
        self.lines: list[str] = []
        self.context: list[Block] = [self]

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def blocks(page: Path) -> list[Block]:
    """The page's blocks in order, each with its context (see the rule above)."""
    out: list[Block] = []
    current: Block | None = None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if current is not None and current.kind == "fence":
            if stripped.startswith(current.lines[0].strip()[:3]) and stripped.strip("`~") == "":
                current = None
            else:
                current.lines.append(line)
            continue
        if fence := FENCE.match(line):
            current = Block("fence", number + 1, indent, fence.group(2).lower())
            current.lines.append(fence.group(1))  # the fence, to find its end; not read
            out.append(current)
            continue
        item = LIST_ITEM.match(line)
        if not stripped:
            current = None
        elif stripped.startswith("#") and not indent:
            current = None
            out.append(Block("heading", number))
            out[-1].lines.append(line)
        elif stripped.startswith("|"):
            if current is None or current.kind != "table":
                current = Block("table", number, indent)
                out.append(current)
            current.lines.append(line)
        elif item:
            current = Block("item", number, len(item.group(1)))
            out.append(current)
            current.lines.append(line)
        elif current is not None and current.kind in ("paragraph", "item"):
            current.lines.append(line)
        else:  # a paragraph, or an item's paragraph after a blank line
            prose = [b for b in out if b.kind != "fence"]
            nested = indent >= 2 and prose and prose[-1].kind in ("item", "table")
            current = Block("item" if nested else "paragraph", number, indent)
            out.append(current)
            current.lines.append(line)
    prose = [b for b in out if b.kind != "fence"]
    for block in out:
        before = [b for b in prose if b.start < block.start]
        if block.kind == "item":
            # the items it sits under, and the paragraph (or item) that opens the list
            indent = block.indent
            while before and before[-1].kind in ("item", "table"):
                if before[-1].kind == "item" and before[-1].indent < indent:
                    block.context.append(before[-1])
                    indent = before[-1].indent
                before.pop()
            if before and before[-1].kind == "paragraph":
                block.context.append(before[-1])
        elif before and before[-1].kind in ("paragraph", "item"):
            block.context.append(before[-1])
    return out


def _figures_of_text(text: str) -> list[tuple[int, str, bool]]:
    """(offset, figure, whether a bound's words lead it) of each measured figure in masked text."""
    return [
        (m.start(), " ".join(m.group(0).split()), bool(BOUND.search(text[: m.start()])))
        for m in FIGURES.finditer(text)
        if m.group("always") or not SETTING.search(text[: m.start()])
    ]


def _figures_of_table(block: Block) -> list[tuple[int, str, bool]]:
    rows = [[c.strip() for c in _mask(line).strip().strip("|").split("|")] for line in block.lines]
    header = rows[0]
    setting = [bool(SETTING_HEADER.search(cell)) for cell in header]
    statistic = [bool(STATISTIC_HEADER.search(c)) and not s for c, s in zip(header, setting)]
    found: list[tuple[int, str, bool]] = []
    for offset, cells in enumerate(rows[1:], 1):
        for column, cell in enumerate(cells):
            if column < len(setting) and setting[column]:
                continue
            figures = [(f, bound) for _, f, bound in _figures_of_text(cell)]
            if not figures and column < len(statistic) and statistic[column] and NUMBER.search(cell):
                figures = [(cell, False)]  # a number in a column of seconds, MB, means...
            found += [(block.start + offset, f, bound) for f, bound in figures]
    return found


def figures(block: Block) -> list[tuple[int, str, bool]]:
    """(line, figure, whether a bound's words lead it) of each measured figure in the block."""
    if block.kind == "table":
        return _figures_of_table(block)
    if block.kind == "heading":
        return []
    lines = block.lines[1:] if block.kind == "fence" else block.lines
    if block.kind == "fence" and block.language in SHELL:
        lines = [line.split(" # ", 1)[1] if " # " in line else "" for line in lines]
    elif block.kind == "fence" and block.language:
        return []
    text = _mask("\n".join(lines))
    return [(block.start + text.count("\n", 0, at), f, b) for at, f, b in _figures_of_text(text)]


def citations(block: Block) -> set[str]:
    """The results files the block may lean on: those its prose context names (a path inside a
    fence is a command's argument, and the index, results/README.md, holds no figure)."""
    named = {name for b in block.context if b.kind != "fence" for name in CITATION.findall(b.text)}
    return named - {"README.md"}


def _named_test_modules(block: Block) -> list[Path]:
    found: list[Path] = []
    for b in block.context:
        for name in TEST_MODULE.findall(b.text):
            found += sorted(ROOT.glob(name)) if "/" in name else sorted((ROOT / "tests").rglob(name))
    return found


def _numeric_constants(module: Path) -> set[float]:
    return {
        float(node.value)
        for node in ast.walk(ast.parse(module.read_text()))
        if isinstance(node, ast.Constant) and type(node.value) in (int, float)
    }


def _asserted_by_a_named_test(block: Block, figure: str) -> bool:
    """Whether the figure's number is a numeric constant of a test module the block names."""
    number = SCIENTIFIC.match(figure) or NUMBER.match(figure)
    value = float(number.group(0).replace(",", ""))
    return any(value in _numeric_constants(m) for m in _named_test_modules(block))


def unsourced_figures() -> tuple[list[str], list[str]]:
    """(figures whose block cites no results file, citations of files the index does not have)."""
    registered = set(index_rows())
    unsourced, unknown = [], []
    for page in DOC_PAGES:
        name = page.relative_to(ROOT).as_posix()
        for block in blocks(page):
            cited = citations(block)
            unknown += [f"{name}:{block.start}: results/{c}" for c in sorted(cited - registered)]
            if cited & registered:
                continue
            for line, figure, bound in figures(block):
                bound = bound or bool(SCIENTIFIC.match(figure))  # a tolerance, whatever words lead it
                if (name, figure) in NOT_MEASURED:
                    continue
                if bound and _asserted_by_a_named_test(block, figure):
                    continue
                unsourced.append(f"{name}:{line}: {figure}")
    return unsourced, unknown


def test_every_figure_in_the_docs_names_its_results_file():
    unsourced, unknown = unsourced_figures()
    assert not unknown, "docs cite results files that are not registered in the index:\n" + "\n".join(unknown)
    assert not unsourced, (
        "measured figures whose paragraph or table (or the block right before it) names no file "
        "under docs/results/: link the results file that holds each (registered in "
        "docs/results/README.md with its commit and command), or remove the figure (the rule is "
        "above this test):\n" + "\n".join(unsourced)
    )
