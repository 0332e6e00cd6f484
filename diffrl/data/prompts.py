"""Prompt sets: plain text (one prompt a line, as flow_grpo's train.txt/test.txt) or JSONL
(``{"prompt": ..., "metadata": {...}}`` a line)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from diffrl.config import resolve_data_path


class PromptFileError(ValueError):
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
        if n is None:
            return self
        return PromptSet(self.prompts[:n], self.metadata[:n], self.source)


def load_prompts(path: str | Path) -> PromptSet:
    """Read ``.txt`` or ``.jsonl``; every malformed line is reported with its number."""
    file = resolve_data_path(str(path))
    if not file.is_file():
        raise PromptFileError(f"prompt file {str(path)!r} does not exist")
    prompts, metadata, problems = [], [], []
    lines = file.read_text(encoding="utf-8").splitlines()
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
        raise PromptFileError(f"prompt file {str(path)!r} holds no prompts")
    return PromptSet(prompts, metadata, str(path))
