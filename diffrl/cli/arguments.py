"""What every command's module (:mod:`diffrl.cli.commands`) shares to declare itself, torch-free:
its :class:`Command` entry and the argparse types of bounded numbers, whose errors say the range."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """A command's line in :data:`diffrl.cli.commands.COMMANDS`, declared by its own module."""

    help: str
    """The line ``diffrl --help`` shows for it."""
    run: str
    """``module:function`` called as ``function(args, inputs) -> exit code``; imported only when
    the command runs, after its arguments and inputs passed (so it may import torch at its top)."""
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    """Adds the command's arguments to its subparser (``--debug`` is there already)."""
    inputs: Callable[[argparse.Namespace], Any] | None = None
    """The command's checks that need no torch: run first, their result handed to ``run``."""


MAX_PROMPTS = 10**7
"""``--num-prompts`` at most (as ``eval.num_prompts``)."""
MAX_SAMPLES_PER_PROMPT = 4096
"""``--samples-per-prompt`` at most (as ``eval.samples_per_prompt``)."""


def integer(lo: int, hi: int, shown: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]`` (``1e3`` and ``2.0`` are integers too;
    ``2.5``, ``nan`` and words are not), else an error that says the range (argparse exits 2)."""
    big = max(abs(lo), abs(hi)) >= 1_000_000
    bounds = shown or (f"[{lo:_}, {hi:_}]" if big else f"[{lo}, {hi}]")

    def parse(text: str) -> int:
        value: int | None = None
        if re.fullmatch(r"\s*[-+]?\d+\s*", text) and len(text) < 100:
            value = int(text)
        elif len(text) < 100:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number.is_integer():
                value = int(number)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected an integer in {bounds}, got {_cut(text)}")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {_cut(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``),
    else an error that says the range; ``nan`` and ``inf`` are refused."""
    bounds = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) < 100 else math.nan
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {bounds}, got {_cut(text)}") from None
        inside = lo < value <= hi if lo_open else lo <= value <= hi  # NaN fails both
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be a number in {bounds}, got {_cut(text)}")
        return value

    parse.__name__ = "number"
    return parse


def _cut(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


PROMPT_COUNT = integer(1, MAX_PROMPTS)
SAMPLE_COUNT = integer(1, MAX_SAMPLES_PER_PROMPT)


TRUST_HELP = (
    "import the dotted paths (rewards, model family, ...) a checkpoint's config.yaml names without "
    "naming them again; only for a checkpoint you trust: importing runs its code (docs/troubleshooting.md)"
)
