"""A real Ctrl-C, told apart from a ``KeyboardInterrupt`` that code raised itself.

Python's SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is, and code may
raise it too (a reward, a plugin): only a signal means the user asked to stop. The command line
installs :func:`noting_ctrl_c` while a command runs: its handler raises :class:`CtrlC`, so a
``KeyboardInterrupt`` of any other kind is some code's error (:func:`is_real_interrupt`). While
only modules are being imported (``diffrl`` itself at start-up, a command's world: torch, the
models) there is nothing to save or clean up, and an exception could land anywhere inside
someone's import: :func:`exit_on_ctrl_c` makes a Ctrl-C print one line and end the process at
once, without a traceback. The training loop installs its own handler on top
(:mod:`diffrl.train.stop`: stop after the current step and save).

This module imports nothing of diffrl's: the command line installs it before anything else.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

EXIT_CTRL_C = 130
"""128 + SIGINT, as a shell reports a command that Ctrl-C ended."""
MESSAGE = "interrupted (Ctrl-C)"


class CtrlC(KeyboardInterrupt):
    """The ``KeyboardInterrupt`` of a real SIGINT (raised by :func:`noting_ctrl_c`'s handler)."""


_noting = 0
"""How many :func:`noting_ctrl_c` are active (nested ``main()`` calls in tests)."""


def _raise_ctrl_c(signum: int, frame: object) -> None:
    raise CtrlC


def _exit_now(signum: int, frame: object) -> None:
    # a signal handler runs between two bytecodes of the main thread, which may be inside a write
    # to stdout: flushing could raise (a re-entrant call), so each is tried on its own
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001, S110 - best effort: the process ends now anyway
            pass
    os.write(2, f"\n{MESSAGE}\n".encode())
    os._exit(EXIT_CTRL_C)


@contextmanager
def _handler(handler) -> Iterator[bool]:
    """``handler`` for SIGINT inside the block (then the previous one again); yields whether it
    was installed: only from the main thread, and only over a Python-level handler (an embedding
    application that ignores SIGINT keeps its choice)."""
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield False
        return
    signal.signal(signal.SIGINT, handler)
    try:
        yield True
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def noting_ctrl_c() -> Iterator[None]:
    """Inside the block a SIGINT raises :class:`CtrlC` (a ``KeyboardInterrupt``), and
    :func:`is_real_interrupt` holds for it alone."""
    global _noting
    with _handler(_raise_ctrl_c) as installed:
        _noting += installed
        try:
            yield
        finally:
            _noting -= installed


@contextmanager
def exit_on_ctrl_c() -> Iterator[None]:
    """Inside the block (imports only: nothing to save, nothing to clean up) a SIGINT prints
    ``interrupted (Ctrl-C)`` and ends the process with exit code 130 at once: no traceback,
    wherever the import was."""
    with _handler(_exit_now):
        yield


def exit_on_ctrl_c_from_here() -> Callable[[], None]:
    """:func:`exit_on_ctrl_c` for a module's own imports (no ``with`` block can hold them):
    returns the function that ends it."""
    block = exit_on_ctrl_c()
    block.__enter__()
    return lambda: block.__exit__(None, None, None)


def is_real_interrupt(error: BaseException) -> bool:
    """Whether ``error`` is a Ctrl-C the user gave: a :class:`CtrlC`; outside
    :func:`noting_ctrl_c` (diffrl used as a library), any ``KeyboardInterrupt``, as Python's
    own handler raises a plain one."""
    if isinstance(error, CtrlC):
        return True
    return isinstance(error, KeyboardInterrupt) and not _noting
