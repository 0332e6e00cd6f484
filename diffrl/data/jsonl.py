"""One line of a JSONL file the user wrote (a prompt file, a dataset's ``metadata.jsonl``), read
strictly: what Python's ``json.loads`` accepts silently or cannot bound is refused with the reason.

- a key given twice in one object (``json.loads`` keeps the last one without a word);
- ``NaN``, ``Infinity`` and ``-Infinity`` (not JSON; Python writes them, no other reader takes them);
- nesting deeper than :data:`MAX_DEPTH` (``json.loads`` recurses: a line of 100,000 ``[`` raises
  ``RecursionError``).
"""

from __future__ import annotations

import json
import re
from typing import Any

from diffrl.core.errors import quoted

MAX_DEPTH = 64
"""Objects and arrays nested in one line at most (a prompt's metadata nests three or four deep)."""
_OPENERS = re.compile(r'"(?:[^"\\]|\\.)*"|[\[{]|[\]}]')


class JsonLineError(ValueError):
    """A line that is not strict JSON; its message says why (no line number: the caller adds it)."""


def _depth(line: str) -> int:
    """The deepest nesting of objects and arrays in ``line`` (strings skipped), in one pass."""
    depth = deepest = 0
    for token in _OPENERS.finditer(line):
        t = token.group()
        if t in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif t in "]}":
            depth -= 1
    return deepest


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise JsonLineError(
                f"key {quoted(key)} is given twice in one object (JSON readers keep only the last): keep one"
            )
        seen[key] = value
    return seen


def _not_a_number(word: str) -> float:
    raise JsonLineError(f"{word} is not JSON (a number must be finite); write a number or null")


def parse_json_line(line: str) -> Any:
    """``line`` as JSON, strictly (see the module docstring); raises :class:`JsonLineError`."""
    if _depth(line) > MAX_DEPTH:
        raise JsonLineError(f"nested more than {MAX_DEPTH} levels deep")
    try:
        return json.loads(line, object_pairs_hook=_no_duplicates, parse_constant=_not_a_number)
    except json.JSONDecodeError as e:
        raise JsonLineError(f"not valid JSON ({e.msg} at column {e.colno})") from e
    except RecursionError as e:  # a guard: the depth bound stops nesting well before Python's limit
        raise JsonLineError(f"nested more than {MAX_DEPTH} levels deep") from e
