"""``diffrl`` command line: train, eval, sample, export, report, recipes, serve-reward.

Startup is a feature: the entry point imports only the commands' modules (:mod:`diffrl.cli.commands`:
each command's argument definitions and its checks that need no torch). A command's run, which
imports its world (torch, the models, Ray, ...) at its top, is named in
:data:`~diffrl.cli.commands.COMMANDS` by a dotted path and imported only when that command runs,
after its arguments and the schema stage of its config passed. So ``--help``, ``diffrl recipes``,
a typo and a config error answer before torch loads.
"""

from __future__ import annotations

# first: a Ctrl-C while the command line itself is imported is one line, not a traceback
from diffrl.core import interrupts

_imported = interrupts.exit_on_ctrl_c_from_here()

import argparse  # noqa: E402
import errno  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402
from typing import Any  # noqa: E402

from diffrl.cli.commands import COMMANDS, build_parser  # noqa: E402
from diffrl.config import Config  # noqa: E402
from diffrl.core import pins  # noqa: E402
from diffrl.core.errors import EXIT_BUG, EXIT_USER_ERROR, DiffrlError  # noqa: E402
from diffrl.core.user_code import (  # noqa: E402
    PluginError,
    calling_plugin,
    describe,
    guarding_os_exit,
    plugin_error,
    plugin_origin,
    raised_in_diffrl,
)

# ``python -m diffrl.cli`` (Python sets sys.argv[0] to "-m" while it finds __main__): the handler
# stays until main() takes over. Imported by anyone else, Python's handler again: the ``diffrl``
# console script installs its own first (:mod:`diffrl.command`), a program importing diffrl.cli
# keeps its own.
if sys.argv[:1] != ["-m"]:
    _imported()


USER_OS_ERRORS = {
    errno.ENOENT,
    errno.EACCES,
    errno.EPERM,
    errno.ENOSPC,
    errno.EROFS,
    errno.EDQUOT,
    errno.EFBIG,
    errno.EIO,
    errno.ENAMETOOLONG,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.ELOOP,
}
"""OS errors a user's environment causes (a missing, unwritable or too long path, a full disk or
quota, a file over the file system's size limit, a failing disk), not bugs."""


def main(argv: list[str] | None = None) -> int:
    """Run one command; return its exit code (see :mod:`diffrl.core.errors`). A user's error prints
    ``error: <what is wrong and what to do>``, never a traceback (``--debug`` shows it); a
    plugin's error (anything it raises, ``sys.exit()`` too) names the plugin; a Ctrl-C at any
    moment prints ``interrupted (Ctrl-C)`` and returns 130 (a training run saves first: exit 75,
    :mod:`diffrl.train.stop`)."""
    with interrupts.noting_ctrl_c(), _unclosable_stdio(), guarding_os_exit():
        try:
            return _main(argv)
        except KeyboardInterrupt as e:  # before the command ran (parsing), or under --debug
            if not interrupts.is_real_interrupt(e):
                raise
            return _interrupted()


def _main(argv: list[str] | None) -> int:
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
    with _warning_lines():
        return _reported(args)


def run_command(args: argparse.Namespace) -> int:
    """The command's checks that need no torch, then its module (imported now) with their result."""
    command = COMMANDS[args.command]
    checked = command.inputs(args) if command.inputs is not None else None
    config = getattr(checked, "config", None) or getattr(getattr(checked, "target", None), "config", None)
    if isinstance(config, Config):  # the run's deterministic mode in the environment before torch loads
        pins.repin_environment(config.run.deterministic)
    module, _, function = command.run.partition(":")
    with interrupts.exit_on_ctrl_c():  # imports only (torch, the models): nothing to save
        run = getattr(importlib.import_module(module), function)
    return run(args, checked)


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
        if (origin := plugin_origin(e)) is not None:
            return _user_error(plugin_error(e, origin))
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt as e:
        if interrupts.is_real_interrupt(e):
            return _interrupted()
        return _bug(e)  # raised by code, not by a Ctrl-C: a plugin's (named) or a bug
    except SystemExit as e:
        if raised_in_diffrl(e) and plugin_origin(e) is None:
            return e.code if isinstance(e.code, int) else EXIT_BUG  # diffrl's own (serve-reward's SIGTERM)
        return _bug(e)  # a plugin's exit (named), or a library's inside diffrl: never a silent exit
    except BaseException as e:  # noqa: BLE001 - anything else is a bug (or a plugin's), in one line
        return _bug(e)


def _interrupted() -> int:
    print(f"\n{interrupts.MESSAGE}", file=sys.stderr)
    return interrupts.EXIT_CTRL_C


def _user_error(e: DiffrlError) -> int:
    print(f"error: {e}", file=sys.stderr)
    return e.exit_code


def _one_line(text: str, limit: int = 400) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _bug(e: BaseException) -> int:
    """A plugin's error (:func:`~diffrl.core.user_code.plugin_origin`) names the plugin (exit 2);
    anything else is a bug in diffrl (exit 70)."""
    if (origin := plugin_origin(e)) is not None:
        return _user_error(plugin_error(e, origin))
    if isinstance(e, SystemExit):
        print(
            f"error: {describe(e)} inside diffrl, outside any plugin — this is a bug in diffrl; rerun "
            "with --debug for the traceback",
            file=sys.stderr,
        )
        return EXIT_BUG
    print(
        f"error: unexpected {type(e).__name__}: {_one_line(str(e))} — this is a bug in diffrl; "
        "rerun with --debug for the traceback",
        file=sys.stderr,
    )
    return EXIT_BUG


DIFFRL_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


@contextmanager
def _warning_lines() -> Iterator[None]:
    """Inside the block a warning diffrl issues prints as one ``warning: <message>`` line, as
    errors print ``error: ...`` (Python's own format names diffrl's source file and line, which
    says nothing to a user; ``--debug`` keeps it); other libraries' warnings keep theirs. Which
    warnings show, where and how often stays Python's choice (its filters, ``showwarning``):
    only the text is made here."""
    python_format = warnings.formatwarning

    def line(message, category, filename, lineno, line=None) -> str:
        if str(filename).startswith(DIFFRL_DIR):
            return f"warning: {message}\n"
        return python_format(message, category, filename, lineno, line)

    warnings.formatwarning = line
    try:
        yield
    finally:
        warnings.formatwarning = python_format


class UnclosableStream:
    """``sys.stdout`` / ``sys.stderr`` while a command runs: everything goes to the stream it
    wraps, but :meth:`close` is refused. A plugin that closed the command's stream would make
    diffrl's next line fail far from it; the refusal is raised in the plugin's own call, named."""

    def __init__(self, stream: Any, name: str):
        self._stream, self._name = stream, name

    def close(self) -> None:
        origin = calling_plugin()
        who = f"plugin {origin.path!r} (at {origin.where})" if origin else "code run by diffrl"
        raise PluginError(
            f"{who} closed sys.{self._name}, which is the diffrl command's: a plugin must leave it open"
        )

    def write(self, text: str) -> int:
        return self._stream.write(text)

    def flush(self) -> None:
        self._stream.flush()

    def __getattr__(self, name: str) -> Any:  # closed, fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


@contextmanager
def _unclosable_stdio() -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` as :class:`UnclosableStream` inside the block."""
    saved = sys.stdout, sys.stderr
    if sys.stdout is not None and not isinstance(sys.stdout, UnclosableStream):
        sys.stdout = UnclosableStream(sys.stdout, "stdout")
    if sys.stderr is not None and not isinstance(sys.stderr, UnclosableStream):
        sys.stderr = UnclosableStream(sys.stderr, "stderr")
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
