"""The libraries diffrl drives keep their own output to themselves: no "Loading weights" or
"Loading checkpoint shards" bars (transformers, diffusers), no download or dataset bars
(huggingface_hub, datasets) and no advisory notes in a run's log, between diffrl's lines. A user
cannot act on any of it: diffrl prints what it loads and its own progress (:mod:`.console`).

:func:`quiet_libraries` is called where diffrl starts a heavy world (a model family loads, a reward
is built, a ``datasets`` folder is read), after the libraries are imported and before they load
anything, not when ``diffrl`` is imported: a program that only imports diffrl keeps its libraries
as it set them. Child processes (reward workers, Ray actors) inherit the variables.
"""

from __future__ import annotations

import importlib
import os
import sys

QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",  # huggingface_hub's bars, and transformers' through it
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",  # logger.warning_advice: tips, not problems
    "DIFFUSERS_NO_ADVISORY_WARNINGS": "1",
}
"""What :func:`quiet_libraries` sets in the environment (a variable the user set keeps its value)."""

BARS = {
    # module: (the variable that lets a user keep its bars, the functions that turn them off)
    "huggingface_hub": ("HF_HUB_DISABLE_PROGRESS_BARS", ("huggingface_hub.utils", "disable_progress_bars")),
    "transformers": ("HF_HUB_DISABLE_PROGRESS_BARS", ("transformers.utils.logging", "disable_progress_bar")),
    # diffusers reads no variable for its bars: its tqdm is on from import unless turned off here
    "diffusers": ("HF_HUB_DISABLE_PROGRESS_BARS", ("diffusers.utils.logging", "disable_progress_bar")),
    "datasets": ("HF_DATASETS_DISABLE_PROGRESS_BARS", ("datasets.utils.tqdm", "disable_progress_bars")),
}
"""The libraries whose progress bars :func:`quiet_libraries` turns off once they are imported."""


def quiet_libraries() -> None:
    """Turn off the progress bars and advisory notes of the libraries in :data:`BARS` (those
    imported now; the others read :data:`QUIET_ENV` when they are). Idempotent and cheap: it
    imports nothing that is not imported yet. A user who wants a library's bars back sets its
    variable to 0 (e.g. ``HF_HUB_DISABLE_PROGRESS_BARS=0``)."""
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    for module, (variable, (where, function)) in BARS.items():
        if module not in sys.modules or os.environ.get(variable) != QUIET_ENV[variable]:
            continue  # not imported (it reads the variable when it is), or the user wants its bars
        # the library is in: its logging submodule costs nothing more
        getattr(importlib.import_module(where), function)()
