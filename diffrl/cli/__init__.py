"""``diffrl`` command line: train, eval, sample, export, report, recipes, serve-reward.

Startup is a feature: the entry point imports only the argument definitions
(:mod:`~diffrl.cli.parser`) and the checks that need no torch (:mod:`~diffrl.cli.inputs`). A
command's own module, which imports its world (torch, the models, Ray, ...) at its top, is named in
:data:`COMMANDS` by a dotted path and imported only when that command runs, after its arguments
and the schema stage of its config passed. So ``--help``, ``diffrl recipes``, a typo and a config
error answer before torch loads.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from diffrl.cli import inputs
from diffrl.cli.parser import build_parser
from diffrl.errors import EXIT_BUG, EXIT_USER_ERROR, DiffrlError


@dataclass(frozen=True)
class Command:
    run: str
    """``module:function`` called as ``function(args, inputs) -> exit code``; imported only when
    the command runs."""
    inputs: Callable[[argparse.Namespace], Any] | None = None
    """The command's checks that need no torch (:mod:`~diffrl.cli.inputs`): run first, their
    result handed to ``run``."""


COMMANDS: dict[str, Command] = {
    "train": Command("diffrl.cli.train:run", inputs.train_inputs),
    "eval": Command("diffrl.cli.eval:run", inputs.eval_inputs),
    "sample": Command("diffrl.cli.sample:run", inputs.sample_inputs),
    "export": Command("diffrl.cli.export:run", inputs.export_inputs),
    "report": Command("diffrl.cli.report:run", inputs.report_inputs),
    "plan": Command("diffrl.cli.plan:run", inputs.plan_inputs),
    "recipes": Command("diffrl.cli.recipes:run"),
    "serve-reward": Command("diffrl.cli.serve_reward:run", inputs.serve_inputs),
}
"""Each command of :func:`~diffrl.cli.parser.build_parser` -> where its code lives."""

USER_OS_ERRORS = {errno.ENOENT, errno.EACCES, errno.EPERM, errno.ENOSPC, errno.EROFS, errno.EDQUOT}
"""OS errors a user's environment causes (a missing or unwritable path, a full disk), not bugs."""


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see :mod:`diffrl.errors`). A user's error prints
    ``error: <what is wrong and what to do>``, never a traceback (``--debug`` shows it)."""
    parser = build_parser()
    try:
        # key=value overrides may also come after options (``eval base --num-prompts 8 sampling.num_steps=4``)
        args, extra = parser.parse_known_args(argv)
        stray = [a for a in extra if "=" not in a or a.startswith("-")]
        if stray or (extra and not hasattr(args, "overrides")):
            parser.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    except SystemExit as e:  # argparse printed its usage and message (or --help)
        return e.code if isinstance(e.code, int) else EXIT_USER_ERROR
    if extra:
        args.overrides = [*args.overrides, *extra]
    if args.debug:
        return run_command(args)
    return _reported(args)


def run_command(args: argparse.Namespace) -> int:
    """The command's checks that need no torch, then its module (imported now) with their result."""
    command = COMMANDS[args.command]
    checked = command.inputs(args) if command.inputs is not None else None
    module, _, function = command.run.partition(":")
    return getattr(importlib.import_module(module), function)(args, checked)


def _reported(args: argparse.Namespace) -> int:
    try:
        return run_command(args)
    except DiffrlError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    except BrokenPipeError:  # the reader went away (``diffrl recipes | head``): not an error
        # Python would report the pipe again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a command its pipe ended
    except OSError as e:
        if e.errno not in USER_OS_ERRORS and not isinstance(e, FileNotFoundError):
            return _bug(e)
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("\ninterrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - anything else is a bug, reported in one line
        return _bug(e)


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _bug(e: BaseException) -> int:
    print(
        f"error: unexpected {type(e).__name__}: {_one_line(str(e))} — this is a bug in diffrl; "
        "rerun with --debug for the traceback",
        file=sys.stderr,
    )
    return EXIT_BUG
