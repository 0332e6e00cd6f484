"""Prompt sets: plain text (one prompt a line, as flow_grpo's train.txt/test.txt) or JSONL
(``{"prompt": ..., "metadata": {...}}`` a line)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffrl.config import resolve_data_path
from diffrl.errors import DiffrlError

FORMATS = 'a .txt file (one prompt a line) or a .jsonl file (one {"prompt": ...} object a line)'


class PromptFileError(DiffrlError, ValueError):
    """A prompt file that is missing or has a malformed line."""


@dataclass
class PromptSet:
    prompts: list[str]
    metadata: list[dict[str, Any]] = field(default_factory=list)
    source: str = ""

    def __post_init__(self):
        if not self.metadata:
            self.metadata = [{} for _ in self.prompts]

    def __len__(self) -> int:
        return len(self.prompts)

    def head(self, n: int | None) -> PromptSet:
        """The first ``n`` prompts (``None``: all); asking for more than the set holds, or for
        fewer than one, is an error (no silent cap)."""
        if n is None:
            return self
        if not 1 <= n <= len(self):
            raise PromptFileError(
                f"asked for {n} prompts of {self.source or 'the prompt set'!r}, which holds "
                f"{len(self)}; ask for 1 to {len(self)}"
            )
        return PromptSet(self.prompts[:n], self.metadata[:n], self.source)


def load_prompts(path: str | Path) -> PromptSet:
    """Read ``.txt`` or ``.jsonl``; every malformed line is reported with its number."""
    file = resolve_data_path(str(path))
    if file.is_dir():
        raise PromptFileError(f"prompt file {str(path)!r} is a folder; give {FORMATS}")
    if not file.is_file():
        raise PromptFileError(f"prompt file {str(path)!r} does not exist; give {FORMATS}")
    if file.suffix == ".json":
        raise PromptFileError(
            f"prompt file {str(path)!r} is .json; give {FORMATS} (for JSON, write one object a line "
            "and name the file .jsonl)"
        )
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise PromptFileError(
            f"prompt file {str(path)!r} is not UTF-8 text (byte {e.start} cannot be decoded); give {FORMATS}"
        ) from e
    except OSError as e:
        raise PromptFileError(f"prompt file {str(path)!r} cannot be read: {e.strerror}") from e
    if "\x00" in text:
        raise PromptFileError(f"prompt file {str(path)!r} holds NUL bytes: not a text file; give {FORMATS}")
    lines = text.splitlines()
    prompts, metadata, problems = [], [], []
    jsonl = file.suffix == ".jsonl"
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            if n == len(lines):
                continue
            problems.append(f"line {n}: empty prompt line (remove it)")
            continue
        if jsonl:
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                problems.append(f"line {n}: not valid JSON ({e.msg})")
                continue
            if (
                not isinstance(row, dict)
                or not isinstance(row.get("prompt"), str)
                or not row["prompt"].strip()
            ):
                problems.append(
                    f'line {n}: expected {{"prompt": "...", "metadata": {{...}}}} with a non-empty prompt'
                )
                continue
            meta = row.get("metadata", {})
            if not isinstance(meta, dict):
                problems.append(f"line {n}: metadata must be an object")
                continue
            prompts.append(row["prompt"])
            metadata.append(meta)
        else:
            prompts.append(line.strip())
            metadata.append({})
    if problems:
        shown = "\n  ".join(problems[:20]) + ("\n  ..." if len(problems) > 20 else "")
        raise PromptFileError(f"prompt file {str(path)!r} has {len(problems)} malformed line(s):\n  {shown}")
    if not prompts:
        raise PromptFileError(f"prompt file {str(path)!r} holds no prompts; give {FORMATS}")
    return PromptSet(prompts, metadata, str(path))
