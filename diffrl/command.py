"""The ``diffrl`` console script's entry point (``[project.scripts]``).

Its first act, before the command line is imported, makes a Ctrl-C during start-up print one line
and end the process (:func:`diffrl.core.interrupts.exit_on_ctrl_c`): the imports below are all there is
to interrupt, nothing to save. :func:`main` keeps that handler until
:func:`diffrl.cli.main` has installed its own. A program that imports :mod:`diffrl.cli` as a
library never imports this module, so its SIGINT handling stays its own. (``python -m diffrl.cli``
gets the same from :mod:`diffrl.cli` itself: Python tells that case by ``sys.argv[0] == "-m"``.)
"""

from __future__ import annotations

from diffrl.core import interrupts

_start_up = interrupts.exit_on_ctrl_c_from_here()

from diffrl.core import pins  # noqa: E402

# before torch loads: MKL and oneDNN read these once, when they first run (run.deterministic: false
# takes them back before anything runs; every child process inherits them)
pins.pin_environment()

from diffrl.cli import main as _cli_main  # noqa: E402 - after the handler, which covers this import
from diffrl.core.user_code import end_process  # noqa: E402


def main() -> int:
    """Run the command line (:func:`diffrl.cli.main`) with the process's arguments."""
    try:
        return end_process(_cli_main())  # no thread a plugin left running keeps the process alive
    finally:
        _start_up()
