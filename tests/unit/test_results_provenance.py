"""Every published result names where it came from: each file under docs/results/ has a row in
docs/results/README.md's index (file | made at commit | command | notes) with a commit that is in
this repository and a command, and each Markdown page there opens with its own "Made at commit"
line. A new results file fails here until it is registered (issue 39: published results regenerate
from their commit)."""

from __future__ import annotations

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
