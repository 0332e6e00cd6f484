"""User code that ends the process, or tries to, through the command line (issue 36, class 1).

Whatever a plugin (a reward, an algorithm, a model family, ... named by dotted path) raises or
does, ``sys.exit()`` and ``KeyboardInterrupt`` included, is that plugin's error, named by its
dotted path: never a silent exit, never "interrupted". Only a real Ctrl-C is "interrupted (Ctrl-C)"
(exit 130), from any moment, the imports at start-up included (one line, no traceback).

Plugins are real files written to ``tmp_path`` and put on ``sys.path``; rows run in-process
through :func:`diffrl.cli.main`, except the Ctrl-C at start-up, which needs a process of its own.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from diffrl.core.errors import EXIT_BUG, EXIT_RUN_STOPPED, EXIT_USER_ERROR
from diffrl.core.interrupts import CtrlC, noting_ctrl_c
from diffrl.core.registry import import_object
from diffrl.train.stop import StopSignals
from tests.conftest import TINY_RUN, overrides, sigint_as_in_a_terminal

ROOT = Path(__file__).resolve().parents[2]
NFT = "recipes/tiny_nft_ocr.yaml"
# a random tiny model, one failed iteration stops the run: about a second in process
TINY = [*overrides(TINY_RUN), "train.iterations=2", "train.max_failed_iterations=1", "eval.enabled=false"]

PLUGIN = """
import argparse
import os
import sys

import torch

from diffrl.rewards.base import Reward


class Custom(BaseException):
    pass


def exits(*args):
    sys.exit(0)


def ends_the_process(*args):
    os._exit(0)


def interrupts(*args):
    raise KeyboardInterrupt


def raises_custom(*args):
    raise Custom("mine")


def raises_value_error(*args):
    raise ValueError("bad value")


def wraps_argparse(*args):
    argparse.ArgumentParser(prog="tool").parse_args(["--nope"])


def closes_stdout(*args):
    sys.stdout.close()


class ExitsWhenBuilt(Reward):
    def __init__(self):
        sys.exit(0)

    def __call__(self, images, prompts, metadata):
        return torch.ones(len(images))
"""


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    """The module ``userplug`` (:data:`PLUGIN`) in ``tmp_path``, importable."""
    (tmp_path / "userplug.py").write_text(PLUGIN)
    (tmp_path / "userscript.py").write_text(
        "import argparse\nargs = argparse.ArgumentParser().parse_args()\n\n\n"
        "def score(images, prompts, metadata):\n    return [1.0] * len(images)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(ROOT)
    yield tmp_path
    for name in ("userplug", "userscript"):
        sys.modules.pop(name, None)


def run(argv: list[str], capsys) -> tuple[int, str]:
    from diffrl.cli import main

    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.err


# ---- rewards in a real (tiny) run: the reward-failure policy, naming the reward ----------------


@pytest.mark.parametrize(
    ("reward", "did"),
    [
        ("tests.rewards:exits_zero", "called sys.exit(0)"),
        ("tests.rewards:ends_the_process", "raised PluginError: plugin 'tests.rewards:ends_the_process' (at"),
    ],
)
def test_a_reward_that_exits_stops_the_run_naming_it(reward, did, plugin, capsys):
    """Every kind of exit takes this path (tests/unit/rewards/test_base_exits.py): one run shows
    it; ``os._exit`` too, which would otherwise end the process at once with its status."""
    argv = ["train", NFT, *TINY, f"run.output_dir={plugin / 'run'}", f"rewards=[{{name: {reward}}}]"]
    with pytest.warns(UserWarning, match="dropped"):
        code, err = run(argv, capsys)
    assert code == EXIT_RUN_STOPPED, err
    assert f"last error: reward '{reward}' {did}" in err
    assert "interrupted" not in err


def test_a_reward_class_that_exits_when_built_is_named(plugin, capsys):
    argv = [
        "train",
        NFT,
        *TINY,
        f"run.output_dir={plugin / 'run'}",
        "rewards=[{name: userplug:ExitsWhenBuilt}]",
    ]
    code, err = run(argv, capsys)
    assert code == EXIT_USER_ERROR, err
    assert "error: plugin 'userplug:ExitsWhenBuilt' called sys.exit(0) (at userplug.py:" in err
    assert "never end the process" in err


def test_a_reward_module_that_exits_when_imported_is_a_config_error(plugin, capsys, monkeypatch):
    argv = ["train", NFT, *TINY, f"run.output_dir={plugin / 'run'}", "rewards=[{name: userscript:score}]"]
    # the module's argparse reads sys.argv, as under the diffrl command (not the test runner's own)
    monkeypatch.setattr(sys, "argv", ["diffrl", *argv])
    code, err = run(argv, capsys)
    assert code == EXIT_USER_ERROR
    assert "rewards[0].name: importing module 'userscript' for 'userscript:score' called sys.exit(2)" in err
    assert "if __name__ == '__main__'" in err


# ---- any plugin's error that reaches the command line -------------------------------------------


@pytest.mark.parametrize(
    ("call", "code", "message"),
    [
        ("exits", EXIT_USER_ERROR, "plugin 'userplug:exits' called sys.exit(0) (at userplug.py:"),
        ("interrupts", EXIT_USER_ERROR, "plugin 'userplug:interrupts' raised KeyboardInterrupt (no Ctrl-C"),
        ("raises_custom", EXIT_USER_ERROR, "plugin 'userplug:raises_custom' raised Custom: mine"),
        ("raises_value_error", EXIT_USER_ERROR, "plugin 'userplug:raises_value_error' raised ValueError"),
        ("wraps_argparse", EXIT_USER_ERROR, "plugin 'userplug:wraps_argparse' called sys.exit(2)"),
        ("closes_stdout", EXIT_USER_ERROR, "plugin 'userplug:closes_stdout' (at userplug.py:"),
        ("ends_the_process", EXIT_USER_ERROR, "plugin 'userplug:ends_the_process' (at userplug.py:"),
    ],
)
@pytest.mark.usefixtures("terminal_sigint")  # "interrupts": told from a real Ctrl-C only where one can come
def test_a_plugins_error_is_named_never_silent(call, code, message, plugin, monkeypatch, capsys):
    from diffrl.cli.commands import recipes

    # the command calls the plugin, imported as the registry imports one
    monkeypatch.setattr(recipes, "run", import_object(f"userplug:{call}"))
    got, err = run(["recipes"], capsys)
    assert got == code, err
    *before, last = err.strip().splitlines()
    assert last.startswith(f"error: {message}"), err
    assert before == (
        []
        if call != "wraps_argparse"
        else ["usage: tool [-h]", "tool: error: unrecognized arguments: --nope"]
    )


def test_diffrl_own_exit_keeps_its_code_and_a_librarys_is_a_bug(monkeypatch, capsys):
    import argparse

    from diffrl.cli import serve_reward
    from diffrl.cli.commands import recipes

    # diffrl's own exit: serve-reward's SIGTERM handler
    monkeypatch.setattr(
        recipes, "run", lambda args, inputs: serve_reward._exit_on_sigterm(signal.SIGTERM, None)
    )
    assert run(["recipes"], capsys) == (0, "")

    def library(args, inputs):  # a library that exits, called by diffrl's code
        argparse.ArgumentParser().exit(0)

    monkeypatch.setattr(recipes, "run", library)
    code, err = run(["recipes"], capsys)
    assert code == EXIT_BUG and "called sys.exit(0) inside diffrl, outside any plugin" in err


@pytest.mark.usefixtures("terminal_sigint")
def test_only_a_real_ctrl_c_is_interrupted(monkeypatch, capsys):
    from diffrl.cli.commands import recipes

    monkeypatch.setattr(recipes, "run", lambda args, inputs: signal.raise_signal(signal.SIGINT))
    assert run(["recipes"], capsys) == (130, "\ninterrupted (Ctrl-C)\n")

    def raised(args, inputs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recipes, "run", raised)
    code, err = run(["recipes"], capsys)
    assert code == EXIT_BUG and "interrupted" not in err


@pytest.mark.usefixtures("terminal_sigint")
def test_a_second_ctrl_c_in_training_is_real():
    with noting_ctrl_c(), StopSignals() as stop:
        signal.raise_signal(signal.SIGINT)  # the first: noted, the run finishes its step
        assert stop.received == signal.SIGINT
        with pytest.raises(CtrlC):
            signal.raise_signal(signal.SIGINT)  # the second: stop now, as a real Ctrl-C


# ---- a Ctrl-C while diffrl starts (imports) -----------------------------------------------------

MOMENTS = [  # (how diffrl is started, the module whose import sends the signal, what runs then)
    pytest.param("-m diffrl.cli", "diffrl.core.errors", id="-m: importing the command line"),
    pytest.param("-m diffrl.cli", "diffrl.cli", id="-m: runpy finding __main__, then main"),
    pytest.param("-m diffrl.cli", "torch._C", id="-m: importing torch"),
    pytest.param("console script", "diffrl.cli.commands", id="script: importing the command line"),
    pytest.param("console script", "diffrl.models", id="script: importing the command's world"),
]
"""Moments of a start: the signal is sent once ``python -X importtime`` reports the module imported."""
SCRIPT = Path(sys.executable).parent / "diffrl"
"""The console script (``from diffrl.command import main; sys.exit(main())``), where installed."""


@pytest.mark.parametrize(("entry", "module"), MOMENTS)
def test_ctrl_c_while_starting_is_one_line(entry, module, tmp_path):
    if entry == "console script" and not SCRIPT.is_file():
        pytest.skip("no diffrl console script beside this Python")
    start = ["-m", "diffrl.cli"] if entry == "-m diffrl.cli" else [str(SCRIPT)]
    argv = [sys.executable, "-X", "importtime", *start, "train", "recipes/tiny_sft.yaml"]
    argv += [f"run.output_dir={tmp_path / 'run'}", "model.path=random", "eval.enabled=false"]
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_as_in_a_terminal,
    )
    err = []
    try:
        for line in proc.stderr:
            err.append(line)
            if line.rsplit("|", 1)[-1].strip() == module:
                proc.send_signal(signal.SIGINT)
                break
        else:
            pytest.fail(f"{module} was never imported:\n{''.join(err)}")
        err += proc.stderr.readlines()
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    text = "".join(line for line in err if not line.startswith("import time:"))
    assert "Traceback" not in text, text
    assert proc.returncode == 130, text
    assert text.strip() == "interrupted (Ctrl-C)"


@pytest.mark.parametrize("argv0", ["diffrl", "/usr/local/bin/diffrl", "myprogram.py"])
def test_a_program_importing_the_command_line_keeps_its_own_ctrl_c(argv0):
    """Only the ``diffrl`` console script (:mod:`diffrl.command`) and ``python -m diffrl.cli`` take
    SIGINT at start-up; a program that imports :mod:`diffrl.cli` keeps Python's handler, whatever
    its own name."""
    code = (
        "import signal, sys; sys.argv[0] = sys.argv[1]; import diffrl.cli; "
        "assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, signal.getsignal(signal.SIGINT)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, argv0],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=sigint_as_in_a_terminal,  # a run in the background inherits SIGINT ignored
    )
    assert proc.returncode == 0, proc.stderr
