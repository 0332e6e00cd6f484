"""``diffrl recipes``: the shipped recipes, each with its description (its header comment),
whole and wrapped to the terminal. Needs nothing but the files, no torch: its run is here too."""

from __future__ import annotations

import argparse
import shutil
import textwrap
from pathlib import Path

from diffrl.cli.arguments import Command
from diffrl.config import recipes_dir

DETAILS = ("Memory per GPU", "Host memory")
"""Header lines that open a recipe's sizing notes (estimates of GPU and host memory): the
description ends there; the file holds them."""
INDENT = "    "


def run(args: argparse.Namespace, inputs: None) -> int:
    width = min(shutil.get_terminal_size((100, 24)).columns, 100)
    for i, f in enumerate(sorted(recipes_dir().glob("*.yaml"))):
        paragraphs, details = description(f)
        print("\n" * bool(i) + f.name)
        for text, verbatim in paragraphs:
            if verbatim:  # an example or a command: as written
                print(INDENT * 2 + text)
            else:  # never split a name such as black-forest-labs/FLUX.1-dev
                print(
                    textwrap.fill(
                        text,
                        width,
                        initial_indent=INDENT,
                        subsequent_indent=INDENT,
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
                )
        if details:
            print(f"{INDENT}(memory estimates: in {f})")
    return 0


def description(recipe: Path) -> tuple[list[tuple[str, bool]], bool]:
    """A recipe's description: its header comment after the first line (the command that runs
    it) up to its sizing notes, as (paragraph, verbatim) pairs, and whether sizing notes follow.
    A line that ends a sentence ends a paragraph; an indented line is kept verbatim."""
    paragraphs: list[tuple[str, bool]] = []
    current: list[str] = []
    details = False
    for line in recipe.read_text(encoding="utf-8").splitlines()[1:]:
        if not line.startswith("#"):
            break
        text = line[1:].removeprefix(" ")
        if text.lstrip().startswith(DETAILS):
            details = True
            break
        if text.startswith(" ") or not text.strip():
            if current:
                paragraphs.append((" ".join(current), False))
                current = []
            if text.strip():
                paragraphs.append((text.strip(), True))
            continue
        current.append(text.strip())
        if text.rstrip().endswith((".", ":")):
            paragraphs.append((" ".join(current), False))
            current = []
    if current:
        paragraphs.append((" ".join(current), False))
    return paragraphs, details


COMMAND = Command("list the shipped recipes", "diffrl.cli.commands.recipes:run")
