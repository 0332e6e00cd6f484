"""What makes a line of text one prompt: the line breaks a prompt file is split at, the characters
some tools take for a line break (refused, with their place), and a prompt's length at most. No
torch here: the command line checks ``--prompt`` with it before anything loads."""

from __future__ import annotations

import re
import unicodedata

LINE_BREAK = re.compile(r"\r\n|\r|\n")
"""What ends a line of a prompt file: ``\n``, ``\r\n`` or ``\r``, nothing else (``str.splitlines``
would also split at the separators below, silently making two prompts of one)."""
SEPARATORS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
"""Characters some tools take for a line break and others do not (vertical tab, form feed, the
information separators, NEL, U+2028, U+2029): a line holding one is refused, with its place."""
MAX_PROMPTS = 10_000_000
"""Prompts of one prompt file at most (as ``eval.num_prompts``): a 256 MB file of one-letter lines
would be 10^8 prompts and ~15 GB of Python objects; counted before the file is split."""
MAX_PROMPT_CHARS = 100_000
"""Characters of one prompt at most (as any text of the config): every text encoder keeps a few
hundred tokens; a longer line is a file that is not a prompt set (a log, a book)."""


def separator_problem(text: str, two: str = "a newline for two prompts") -> str | None:
    """Where ``text`` (one line) holds a character some tools read as a line break, or None
    (``two``: how to give two prompts instead)."""
    if found := SEPARATORS.search(text):
        char = found.group()
        return (
            f"column {found.start() + 1}: U+{ord(char):04X} ({unicodedata.name(char, 'a control character')}), "
            f"which some tools read as a line break; replace it with a space (or {two})"
        )
    return None


def prompt_problem(prompt: str) -> str | None:
    """What makes ``prompt`` (one given on the command line) no prompt, or None."""
    if "\x00" in prompt:
        return f"holds a NUL byte (character {prompt.index(chr(0)) + 1}); remove it"
    if not prompt.strip():
        return "is empty; give the text to draw"
    if found := LINE_BREAK.search(prompt):
        return (
            f"holds a line break at character {found.start() + 1}; a prompt is one line "
            "(give --prompt once per prompt)"
        )
    if problem := separator_problem(prompt, "--prompt once per prompt"):
        return f"at {problem}"
    if len(prompt) > MAX_PROMPT_CHARS:
        return f"is {len(prompt):,} characters; a prompt is at most {MAX_PROMPT_CHARS:,}"
    return None
