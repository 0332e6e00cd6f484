"""The package as a user installs it: ``python -m build`` makes a wheel that carries the base
checkpoint, the prompt sets and the recipes, and that wheel, installed into a new virtual
environment, runs ``diffrl eval base --num-prompts 2`` from outside the source tree.

The new environment gets diffrl from the wheel alone (``pip install --no-deps --no-index``); its
dependencies (torch, diffusers, ...: gigabytes, minutes to install) are this environment's, seen
through a ``.pth`` line. A ``.pth`` line adds a folder without running that folder's own ``.pth``
files, so the editable install of the source tree there stays off: ``import diffrl`` can only
find the wheel's copy, which the test checks.
"""

from __future__ import annotations

import os
import shutil
import site
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

from tests.conftest import ROOT

SOURCES = ("pyproject.toml", "README.md", "diffrl")
"""What the wheel is built from (``diffrl/recipes`` holds the recipes; ``recipes/`` at the root is a
link to it)."""


def run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = 300) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def build_wheel(tmp: Path, env: dict[str, str]) -> Path:
    """A copy of the package's sources (no caches, no build leftovers in the tree) -> its wheel."""
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(ROOT / name, src / name)
    # --no-isolation: build with this environment's setuptools (the lock pins it) instead of
    # fetching one into a throwaway environment, which needs the network
    run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp / "dist"), str(src)],
        tmp,
        env,
    )
    [wheel] = (tmp / "dist").glob("diffrl-*.whl")
    return wheel


def test_the_wheel_installs_and_evaluates_the_base_outside_the_source_tree(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["OMP_NUM_THREADS"] = "1"
    wheel = build_wheel(tmp_path, env)
    names = zipfile.ZipFile(wheel).namelist()
    for shipped in (
        "diffrl/models/assets/tiny_base/transformer/diffusion_pytorch_model.safetensors",
        "diffrl/models/assets/tiny_base/diffrl_model.json",
        "diffrl/data/tiny_text/train.txt",
        "diffrl/data/tiny_text/test.txt",
        "diffrl/recipes/tiny_demo.yaml",
        "diffrl/bench/data/geneval_metadata.jsonl",  # diffrl bench's shipped test prompts
    ):
        assert shipped in names, f"the wheel lacks {shipped}"
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)

    target = tmp_path / "venv"
    venv.create(target)  # no pip of its own (ensurepip: seconds); this environment's pip installs into it
    python, bin_dir = target / "bin" / "python", target / "bin"
    purelib = Path(
        run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], tmp_path, env
        ).strip()
    )
    (purelib / "outer_dependencies.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    run([*pip, "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp_path, env)

    elsewhere = tmp_path / "elsewhere"  # no diffrl/ here: only the installed package can answer
    elsewhere.mkdir()
    where = run([str(python), "-c", "import diffrl; print(diffrl.__file__)"], elsewhere, env).strip()
    assert Path(where).is_relative_to(purelib), f"diffrl imported from {where}, not the wheel's copy"

    listed = run([str(bin_dir / "diffrl"), "recipes"], elsewhere, env)
    assert "tiny_demo.yaml" in listed and "tiny_sft.yaml" in listed

    out = run([str(bin_dir / "diffrl"), "eval", "base", "--num-prompts", "2"], elsewhere, env)
    assert "mean reward:" in out and "over 2 samples" in out, out
    assert (elsewhere / "runs" / "eval" / "grid.png").is_file()
