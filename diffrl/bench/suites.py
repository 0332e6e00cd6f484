"""The benchmarks' prompt files, read in their own formats (no torch: the command line checks a
user's file with these before any model loads).

- ``ocr``: flow_grpo's ``dataset/ocr/test.txt``, one prompt a line, the text to render between
  the first pair of double quotes (``... a sign that reads "Open Late" ...``).
- ``geneval``: GenEval's ``prompts/evaluation_metadata.jsonl`` (djghosh13/geneval,
  ``prompts/create_prompts.py``; flow_grpo's ``dataset/geneval/test_metadata.jsonl`` is the same
  format), one object a line: ``{"tag": "position", "include": [{"class": "dog", "count": 1},
  {"class": "cat", "count": 1, "position": ["left of", 0]}], "prompt": "a photo of a cat left of a
  dog"}``; ``include`` entries may carry ``color``; ``exclude`` (``[{"class", "count"}]``) is
  optional.
- ``drawbench``: DrawBench's csv (Imagen's release, e.g. the ``shunk031/DrawBench`` copy): a
  header row with ``Prompts`` and ``Category`` columns (others are ignored), one prompt a row.

Each suite's category is what its table is broken down by: GenEval's ``tag``, DrawBench's
``Category``, one category for OCR.
"""

from __future__ import annotations

import csv
import difflib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import read_text
from diffrl.data.jsonl import JsonLineError, parse_json_line
from diffrl.data.lines import LINE_BREAK, MAX_PROMPTS, prompt_problem, separator_problem

DATA = Path(__file__).parent / "data"

GENEVAL_SAMPLES = 4
"""Images per prompt GenEval draws (its ``generation/diffusers_generate.py``: ``--n_samples 4``),
``--samples-per-prompt``'s default for the suite (the others: 1)."""

COLORS = ("red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white")
"""GenEval's colour list (``evaluate_images.py``'s ``COLORS``): what the colour check chooses among."""
POSITIONS = ("left of", "right of", "above", "below")
"""GenEval's relations (``create_prompts.py``'s ``positions``)."""
MAX_CLAUSES = 64
"""``include`` / ``exclude`` entries of one GenEval line at most (GenEval's have one or two)."""
MAX_COUNT = 1000
"""A GenEval clause's ``count`` at most (GenEval asks for 1 to 4; the detector keeps 16 a class)."""
MAX_CLASS_CHARS = 200
MAX_PROBLEMS = 100
"""Malformed lines a file is read for at most (its first 10 are named)."""
MAX_FILE_BYTES = 64 * 2**20
"""A benchmark prompt file at most (GenEval's is ~100 KB, flow_grpo's OCR test set ~250 KB)."""


class SuiteError(DiffrlError, ValueError):
    """A benchmark prompt file that cannot be read in its suite's format."""


Reader = Callable[[list[str], list[str]], tuple[list[str], list[str], list[dict[str, Any]]]]
"""A suite's file reader: its lines, a list to append problems to -> (prompts, categories, metadata)."""


@dataclass(frozen=True)
class Suite:
    """A benchmark: how its prompt file reads, how many images a prompt gets, and what its scoring
    needs (its scorer is :data:`diffrl.bench.scorers.SCORERS` ``[name]``, on the torch side)."""

    name: str
    format: str
    """The prompt file's format, as an error's fix names it."""
    shipped: Path
    """A handful of the suite's prompts in its format, shipped so it runs without a file of the
    user's (the benchmarks' own files are the user's to bring: ``--prompts``)."""
    read: Reader
    samples_per_prompt: int = 1
    """``--samples-per-prompt``'s default (the benchmark's own protocol)."""
    models: bool = False
    """Scored by GenEval's detector and colour classifier: needs ``--detector`` and ``--clip``."""
    rewards: bool = False
    """Scored by ``eval.rewards`` (``--rewards``), which must name one or more."""


@dataclass(frozen=True)
class BenchPrompts:
    """A suite's prompts: ``categories[i]`` (the table's row) and ``metadata[i]`` (GenEval's line,
    what its scoring checks; empty for the others) go with ``prompts[i]``."""

    suite: str
    prompts: list[str]
    categories: list[str]
    metadata: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def head(self, n: int | None) -> BenchPrompts:
        """The first ``n`` prompts (``None``: all); more than the file holds is an error."""
        if n is None:
            return self
        if not 1 <= n <= len(self.prompts):
            raise SuiteError(
                f"--num-prompts {n}: {self.source!r} holds {len(self.prompts)} prompts; ask for 1 to "
                f"{len(self.prompts)}"
            )
        return BenchPrompts(self.suite, self.prompts[:n], self.categories[:n], self.metadata[:n], self.source)


def suite_name(name: str) -> str:
    """``name`` if it is a suite, else an error listing them (with a did-you-mean)."""
    if name in SUITES:
        return name
    close = difflib.get_close_matches(name.lower(), SUITES, n=1, cutoff=0.6)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise SuiteError(
        f"--suite {quoted(name, 60)} is not a benchmark suite; give one of {', '.join(SUITES)}.{hint}"
    )


def load_suite(suite: str, path: str | Path | None = None) -> BenchPrompts:
    """The prompts of ``suite`` from ``path`` (None: the shipped test prompts), every malformed
    line reported with its number (the first 10)."""
    suite = suite_name(suite)
    spec = SUITES[suite]
    file = Path(path).expanduser() if path is not None else spec.shipped
    fix = f"give {spec.format}"
    text = read_text(file, f"--prompts ({suite})", fix, MAX_FILE_BYTES)
    lines = LINE_BREAK.split(text)
    if len(lines) > MAX_PROMPTS + 1:
        raise SuiteError(
            f"--prompts {str(file)!r} has {len(lines):,} lines, more than {MAX_PROMPTS:,}; {fix}"
        )
    problems: list[str] = []
    prompts, categories, metadata = spec.read(lines, problems)
    if problems:
        more = len(problems) - 10
        shown = "; ".join(problems[:10]) + (
            f"; and {'at least ' if len(problems) >= MAX_PROBLEMS else ''}{more} more" if more > 0 else ""
        )
        raise SuiteError(f"--prompts {str(file)!r} is not {spec.format}: {shown}")
    if not prompts:
        raise SuiteError(f"--prompts {str(file)!r} holds no prompt; {fix}")
    return BenchPrompts(suite, prompts, categories, metadata, str(file))


def _prompt(text: Any, where: str, problems: list[str]) -> str | None:
    if not isinstance(text, str):
        problems.append(f"{where}: the prompt is {type(text).__name__}, not text")
        return None
    if why := prompt_problem(text):
        problems.append(f"{where}: the prompt {quoted(text, 60)} {why}")
        return None
    return text


def ocr_target(prompt: str) -> str | None:
    """The text an OCR prompt asks for (between its first pair of double quotes, as flow_grpo's
    ``OcrScorer`` takes ``prompt.split('"')[1]``), or None when it quotes none (or only spaces)."""
    parts = prompt.split('"')
    return parts[1] if len(parts) >= 3 and parts[1].replace(" ", "") else None


def _ocr(lines: list[str], problems: list[str]) -> tuple[list[str], list[str], list[dict]]:
    prompts = []
    for n, line in enumerate(lines, 1):
        if len(problems) >= MAX_PROBLEMS:
            break
        if not line.strip():
            continue
        if (text := _prompt(line.strip(), f"line {n}", problems)) is None:
            continue
        if ocr_target(text) is None:
            problems.append(
                f'line {n} ({quoted(text, 60)}) quotes no text to render (e.g. a sign that reads "Open")'
            )
            continue
        prompts.append(text)
    return prompts, ["ocr"] * len(prompts), [{} for _ in prompts]


def _drawbench(lines: list[str], problems: list[str]) -> tuple[list[str], list[str], list[dict]]:
    prompts: list[str] = []
    categories: list[str] = []
    header: list[str] | None = None
    rows = csv.reader(lines)
    n = 0
    while len(problems) < MAX_PROBLEMS:
        n += 1
        try:
            row = next(rows)
        except StopIteration:
            break
        except csv.Error as e:  # a field past csv's size limit, a NUL byte
            problems.append(f"line {n}: not csv ({str(e)[:120]})")
            break
        if not any(cell.strip() for cell in row):
            continue
        if header is None:
            header = [cell.strip().lower() for cell in row]
            missing = [c for c in ("prompts", "category") if c not in header]
            if missing:
                problems.append(
                    f"line {n}: the header {quoted(','.join(row), 120)} lacks the column(s) "
                    f"{', '.join(m.capitalize() for m in missing)}"
                )
                break
            p, c = header.index("prompts"), header.index("category")
            continue
        if len(row) <= max(p, c):
            problems.append(f"line {n}: {len(row)} column(s), the header has {len(header)}")
            continue
        text = _prompt(row[p].strip(), f"line {n}", problems)
        category = row[c].strip()
        if separator_problem(category) or len(category) > MAX_CLASS_CHARS or "\x00" in category:
            problems.append(f"line {n}: the category {quoted(category, 60)} is not one line of text")
            continue
        if text is not None:
            prompts.append(text)
            categories.append(category or "(none)")
    return prompts, categories, [{} for _ in prompts]


def _geneval(lines: list[str], problems: list[str]) -> tuple[list[str], list[str], list[dict]]:
    prompts, categories, metadata = [], [], []
    for n, line in enumerate(lines, 1):
        if len(problems) >= MAX_PROBLEMS:
            break
        if not line.strip():
            continue
        where = f"line {n}"
        try:
            row = parse_json_line(line)
        except JsonLineError as e:
            problems.append(f"{where}: {e}")
            continue
        if not isinstance(row, dict):
            problems.append(f"{where}: a JSON {type(row).__name__}, not an object")
            continue
        before = len(problems)
        text = _prompt(row.get("prompt"), where, problems) if "prompt" in row else None
        if "prompt" not in row:
            problems.append(f'{where}: no "prompt"')
        tag = row.get("tag")
        if (
            not isinstance(tag, str)
            or not tag.strip()
            or len(tag) > MAX_CLASS_CHARS
            or separator_problem(tag)
        ):
            problems.append(f'{where}: "tag" must be a short text (e.g. "counting"), got {quoted(tag, 60)}')
        _clauses(row, "include", where, problems, positions=True)
        _clauses(row, "exclude", where, problems, positions=False)
        if len(problems) == before and text is not None:
            prompts.append(text)
            categories.append(tag)
            metadata.append(row)
    return prompts, categories, metadata


def _clauses(row: dict, key: str, where: str, problems: list[str], positions: bool) -> None:
    """Check ``row[key]`` (GenEval's ``include`` or ``exclude``), a problem per fault."""
    if key not in row:
        if key == "include":
            problems.append(f'{where}: no "include" (the objects the image must show)')
        return
    clauses = row[key]
    if not isinstance(clauses, list) or len(clauses) > MAX_CLAUSES:
        problems.append(
            f'{where}: "{key}" must be a list of at most {MAX_CLAUSES} {{"class", "count"}} objects'
        )
        return
    for i, clause in enumerate(clauses):
        at = f'{where}: "{key}"[{i}]'
        if not isinstance(clause, dict):
            problems.append(f'{at} is a JSON {type(clause).__name__}, not a {{"class", "count"}} object')
            continue
        name = clause.get("class")
        if (
            not isinstance(name, str)
            or not name.strip()
            or len(name) > MAX_CLASS_CHARS
            or separator_problem(name)
        ):
            problems.append(f'{at}: "class" must be an object name (e.g. "dog"), got {quoted(name, 60)}')
        count = clause.get("count")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_COUNT:
            problems.append(f'{at}: "count" must be an integer in [1, {MAX_COUNT}], got {quoted(count, 60)}')
        if "color" in clause and clause["color"] not in COLORS:
            color = clause["color"]
            close = (
                difflib.get_close_matches(str(color).lower(), COLORS, n=1) if isinstance(color, str) else []
            )
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append(
                f'{at}: "color" {quoted(color, 60)} is not one of GenEval\'s {", ".join(COLORS)}{hint}'
            )
        if "position" in clause:
            position = clause["position"]
            ok = (
                positions
                and isinstance(position, list)
                and len(position) == 2
                and position[0] in POSITIONS
                and isinstance(position[1], int)
                and not isinstance(position[1], bool)
                and 0 <= position[1] < i
            )
            if not ok:
                problems.append(
                    f'{at}: "position" must be [relation, index] with relation one of {", ".join(POSITIONS)} '
                    f"and index that of an earlier include entry, got {quoted(position, 60)}"
                )


SUITES: dict[str, Suite] = {
    s.name: s
    for s in (
        Suite(
            "ocr",
            "one prompt a line with the text to render in double quotes (flow_grpo's dataset/ocr/test.txt)",
            DATA / "ocr_test.txt",
            _ocr,
        ),
        Suite(
            "geneval",
            'GenEval\'s evaluation_metadata.jsonl: one {"tag", "include", "prompt"} object a line',
            DATA / "geneval_metadata.jsonl",
            _geneval,
            samples_per_prompt=GENEVAL_SAMPLES,
            models=True,
        ),
        Suite(
            "drawbench",
            "DrawBench's csv: a header row with Prompts and Category columns, one prompt a row",
            DATA / "drawbench.csv",
            _drawbench,
            rewards=True,
        ),
    )
}
"""The benchmark suites by name (``--suite``); defined after their readers."""
