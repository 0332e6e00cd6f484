"""``diffrl export CHECKPOINT OUT_DIR``: a LoRA checkpoint -> the adapter as diffusers'
``load_lora_weights`` reads it (families with a diffusers pipeline), else (or with ``--merge``) a
diffusers-layout model folder. Prints what it wrote and the diffusers lines that load it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from diffrl.cli.commands.export import ExportInputs
from diffrl.cli.inference import checked, guarded, load_for_inference
from diffrl.cli.targets import Target
from diffrl.models.registry import DTYPES


def run(args: argparse.Namespace, inputs: ExportInputs) -> int:
    return guarded(
        inputs.target.untrusted,
        inputs.out,
        "the export",
        "what it holds is incomplete: free space, then export again (--force to reuse the folder)",
        lambda out: _run(args, checked(inputs.target), out),
    )


def _run(args: argparse.Namespace, target: Target, out: Path) -> int:
    config = target.config
    family = load_for_inference(config, target.checkpoint)
    lora = config.model.lora is not None
    exported = family.export(
        out, lora=lora, merge=args.merge, dtype=DTYPES[args.dtype] if args.dtype else None
    )
    what = "the LoRA adapter" if exported.adapter else f"{family.description.name} model"
    print(f"wrote {what} to {out}:")
    print(written(out))
    if exported.load is not None:
        base = f"BASE: the base model's folder (this run's model.path: {config.model.path!r})"
        print(snippet(exported.load, base if exported.adapter else None))
    return 0


def written(folder: Path) -> str:
    """Each file under ``folder`` with its size, and the total, one a line."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    width = max((len(str(p.relative_to(folder))) for p in files), default=0)
    lines = [f"  {str(p.relative_to(folder)):<{width}}  {_size(p.stat().st_size):>9}" for p in files]
    total = sum(p.stat().st_size for p in files)
    lines.append(f"  {len(files)} file{'s' * (len(files) != 1)}, {_size(total)} in all")
    return "\n".join(lines)


def snippet(how: str, note: str | None = None) -> str:
    """The family's ``; ``-separated load statements as lines of Python, after the import of the
    diffusers classes they call ``from_pretrained`` on."""
    statements = how.split("; ")
    classes = list(dict.fromkeys(re.findall(r"(\w+)\.from_pretrained\(", how)))
    lines = [f"from diffusers import {', '.join(classes)}"] * bool(classes) + statements
    head = "load it with diffusers" + (f" ({note})" if note else "") + ":"
    return "\n".join([head, *(f"  {line}" for line in lines)])


def _size(n: float) -> str:
    if n < 1000:
        return f"{n:.0f} B"
    for unit in ("KB", "MB", "GB"):
        n /= 1000
        if n < 1000 or unit == "GB":
            return f"{n:.1f} {unit}"
    raise AssertionError("unreachable: the loop returns at GB")
