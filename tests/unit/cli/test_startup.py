"""The command line answers before its heavy world loads: ``--help``, ``recipes``, a command's
``--help``, argument errors and config errors import none of torch, diffusers, peft, Ray,
matplotlib or diffrl's models (each case in a fresh process, which reports what it imported)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "diffusers", "peft", "ray", "matplotlib", "diffrl.models")
PROBE = f"""
import json, sys
from diffrl.cli import main
code = main(sys.argv[1:])
print(json.dumps({{"code": code, "heavy": [m for m in {HEAVY!r} if m in sys.modules]}}))
"""

CASES = [
    (["--help"], 0),
    (["recipes"], 0),
    (["train", "--help"], 0),
    (["eval", "--help"], 0),
    (["serve-reward", "--help"], 0),
    (["frobnicate"], 2),  # an argument error: no such command
    (["train"], 2),  # an argument error: no recipe
    (["train", "recipes/tiny_demo.yaml", "train.lr_typo=1"], 2),  # a config error: unknown key
    (["train", "recipes/tiny_demo.yaml", "train.batch_size=10", "train.micro_batch_size=4"], 2),  # arithmetic
    (["eval", "base", "--num-prompts", "0"], 2),
    (["sample", "base"], 2),  # no prompt given
    (["export", "base", "out"], 2),  # not a checkpoint
    (["serve-reward", "--reward", "ocr", "--params", "batch_size"], 2),
]


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }


@pytest.mark.parametrize("argv, code", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_answers_without_the_heavy_world(argv, code):
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["code"] == code, proc.stderr
    assert report["heavy"] == [], f"{argv} imported {report['heavy']}"


def test_import_diffrl_and_the_schema_stage_stay_light():
    probe = (
        "import sys, diffrl, diffrl.cli, diffrl.preflight, diffrl.preflight.schema; "
        f"print([m for m in {HEAVY!r} if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=120
    )
    assert proc.stdout.strip() == "[]", proc.stdout + proc.stderr


def test_python_dash_m_runs_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "diffrl.cli", "--help"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and proc.stdout.startswith("usage: diffrl"), proc.stderr


def test_every_command_of_the_parser_has_its_module():
    import importlib

    from diffrl.cli.commands import COMMANDS, build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert list(sub.choices) == list(COMMANDS)
    for name, command in COMMANDS.items():
        module, _, function = command.run.partition(":")
        assert callable(getattr(importlib.import_module(module), function)), name


def test_every_module_of_the_commands_is_a_line_of_the_table():
    """A command is its module in ``diffrl/cli/commands/`` and its line in ``COMMANDS``: a module
    whose line is missing (or a line naming another module's entry) fails here."""
    import importlib

    from diffrl.cli.commands import COMMANDS

    folder = ROOT / "diffrl" / "cli" / "commands"
    names = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert sorted(name.replace("-", "_") for name in COMMANDS) == names
    for name, command in COMMANDS.items():
        module = importlib.import_module(f"diffrl.cli.commands.{name.replace('-', '_')}")
        assert module.COMMAND is command, name
