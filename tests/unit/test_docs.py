"""The docs site builds with no warning (broken links and anchors included), and the README stays a
short tour that opens with the two commands CI runs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_docs_site_builds_strictly(tmp_path):
    # mkdocs.yml sets strict and warns on missing pages, links to files outside docs/ and anchors
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # no end-of-life banner in the output
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines; move details into docs/"


def test_the_readme_opens_with_the_commands_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert readme.startswith("# diffrl\n\n```bash\n"), "the two commands open the README, under its title"
    first_block = re.search(r"```bash\n(.*?)```", readme, re.S)
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    ci = (ROOT / ".ci" / "run").read_text()
    pip = re.search(r"python -m pip install -q (.+)", ci).group(1).strip()
    pytest = re.search(r"^(python -m pytest.*)$", ci, re.M).group(1).strip()
    # the README's test command is CI's: the same pip install (CI adds -q) and the same pytest run
    assert commands[1] == f"pip install {pip} && {pytest}", (commands[1], pip, pytest)
    assert commands[0].startswith(
        "pip install -c constraints/cpu.txt -e . && diffrl train recipes/tiny_demo.yaml"
    )


def test_the_readme_links_point_at_files_that_exist():
    # mkdocs checks the pages under docs/; the README, read on GitHub, is checked here
    readme = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme)
    assert targets, "the README links into the docs"
    missing = [t for t in targets if "://" not in t and not (ROOT / t).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_every_install_line_of_the_docs_names_the_constraints_file():
    # without -c constraints/cpu.txt pip picks other versions than the tests ran with (and a CUDA
    # torch of several GB); each page that installs also says a GPU machine leaves it out
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    loose, silent = [], []
    for page in pages:
        lines = [line for line in page.read_text().splitlines() if "pip install" in line]
        loose += [
            f"{page.relative_to(ROOT)}: {line.strip()}"
            for line in lines
            if "-c constraints/cpu.txt" not in line
        ]
        text = " ".join(page.read_text().split())
        if lines and not re.search(r"GPU machine (leave `?-c|without `-c)", text):
            silent.append(str(page.relative_to(ROOT)))
    assert not loose, "install lines without -c constraints/cpu.txt:\n" + "\n".join(loose)
    assert not silent, f"pages that install without saying a GPU machine leaves -c out: {silent}"
