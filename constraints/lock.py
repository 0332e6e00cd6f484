"""Refresh constraints/cpu.txt, the full lock of the CPU environment.

    python constraints/lock.py             # keep every pin of the lock, add what is new
    python constraints/lock.py --upgrade   # take the newest releases of everything

Makes a temporary venv with this Python, installs `-e ".[test,ray]"` into it with torch pinned
(TORCH below: the CPU build) and, unless --upgrade, every package the lock pins already at its
pinned version (a new requirement then adds its packages without moving the others), and writes that venv's `pip freeze --all --exclude-editable`, sorted,
under a header that says how it was made. Every package of the install is pinned with `==`, so a
newer release of any dependency cannot change the last bits of a result (nor the README's numbers)
until the lock is refreshed. `tests/unit/test_lock.py` checks the lock against pyproject.toml.

To move torch, change TORCH and rerun with --upgrade; to take newer releases of everything else,
rerun with --upgrade. When a new requirement cannot be had with the current pins, pip says so:
rerun with --upgrade.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints" / "cpu.txt"
TORCH = "torch==2.13.0+cpu"  # the CPU wheel (an unpinned torch pulls a multi-GB CUDA build)
EXTRAS = "test,ray"
# the installer the venv brings, required by nothing installed; setuptools stays (torch requires it)
NOT_LOCKED = {"pip"}


def pip(python: Path, *args: str) -> str:
    cmd = [str(python), "-m", "pip", "--no-input", *args]
    return subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True, cwd=ROOT).stdout


def name(pin: str) -> str:
    """The normalised name of a `name==version` line (PEP 503; stdlib only, so any Python runs this)."""
    return re.sub(r"[-_.]+", "-", pin.split("==")[0]).lower()


def current_pins() -> list[str]:
    """The lock's `name==version` lines, torch's left out (TORCH pins it)."""
    if not LOCK.is_file():
        return []
    lines = (line.split("#", 1)[0].strip() for line in LOCK.read_text().splitlines())
    return [line for line in lines if "==" in line and name(line) != "torch"]


def freeze_fresh_install(folder: Path, keep: list[str]) -> list[str]:
    """`pip freeze` of a new venv in `folder` after installing diffrl with EXTRAS, torch and the
    pins `keep` held."""
    venv.create(folder / "venv", with_pip=True)
    python = folder / "venv" / "bin" / "python"
    constraints = folder / "constraints.txt"
    constraints.write_text("\n".join([TORCH, *keep]) + "\n")
    pip(python, "install", "-q", "-c", str(constraints), "-e", f".[{EXTRAS}]")
    pins = []
    for line in pip(python, "freeze", "--all", "--exclude-editable").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "==" not in line:
            raise SystemExit(f"pip freeze printed {line!r}, not name==version: nothing else may be installed")
        if name(line) not in NOT_LOCKED:
            pins.append(line)
    return sorted(pins, key=name)


def header() -> str:
    return f"""\
# The full lock of the CPU environment: every package that `pip install -e ".[test]"` installs (ray
# included), at exact versions. Made, and refreshed, by one command:
#     python constraints/lock.py
# (a fresh venv, Python {platform.python_version()} on {sys.platform} {platform.machine()}: `pip install -c <{TORCH} and the lock's
# pins> -e ".[{EXTRAS}]"`, then `pip freeze --all --exclude-editable`, sorted, pip left out;
# `--upgrade`: torch alone pinned, the newest releases of the rest).
# torch is the CPU build (+cpu: the local wheels here, PyTorch's CPU index elsewhere); an unpinned torch
# pulls a multi-GB CUDA build. GPU machines: install without this file, keeping your CUDA torch.
"""


def main() -> None:
    upgrade = "--upgrade" in sys.argv[1:]
    with tempfile.TemporaryDirectory(prefix="diffrl-lock-") as tmp:
        pins = freeze_fresh_install(Path(tmp), [] if upgrade else current_pins())
    LOCK.write_text(header() + "\n".join(pins) + "\n")
    print(f"wrote {LOCK.relative_to(ROOT)}: {len(pins)} packages")


if __name__ == "__main__":
    main()
