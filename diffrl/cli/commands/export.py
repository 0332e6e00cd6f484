"""``diffrl export CHECKPOINT OUT_DIR``: its arguments, its checkpoint and output folder, checked
before torch loads; the export runs in :mod:`diffrl.cli.export`."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path

from diffrl.cli.arguments import TRUST_HELP, Command
from diffrl.cli.outputs import check_links_inside, check_out_dir
from diffrl.cli.targets import CHECKPOINT_INFO, Target, resolve_target, run_checkpoint
from diffrl.core.errors import DiffrlError
from diffrl.train.manifest import run_folder_hint

EXPORT_SECTIONS = ("run", "model")
"""Export reads the model and its weights: the run's training settings (rewards, data) need not
resolve."""


@dataclass(frozen=True)
class ExportInputs:
    target: Target
    out: Path


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--merge", action="store_true", help="merge a LoRA into a full model folder instead")
    p.add_argument("checkpoint")
    p.add_argument("out_dir", help="a new or empty folder (see --force)")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.device=cpu")
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    p.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT_DIR (files of the same name are replaced)",
    )
    p.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)


def inputs(args: argparse.Namespace) -> ExportInputs:
    args.checkpoint = run_checkpoint(args.checkpoint)
    checkpoint = Path(args.checkpoint).expanduser()
    if not os.path.lexists(checkpoint / CHECKPOINT_INFO):  # one that is no file: described when read
        what = "no such folder" if not checkpoint.exists() else "no checkpoint.json inside"
        raise DiffrlError(
            f"{args.checkpoint!r} is not a diffrl checkpoint ({what}); give a run's checkpoint folder, "
            f"e.g. runs/NAME/checkpoints/final{run_folder_hint(checkpoint)}"
        )
    out = Path(args.out_dir).expanduser()
    check_out_dir(out, "OUT_DIR")
    target = resolve_target(
        args.checkpoint, args.overrides, EXPORT_SECTIONS, getattr(args, "trust_checkpoint_code", False)
    )
    check_out_dir(out, "OUT_DIR", empty=not args.force, inputs=target.inputs("the checkpoint's"))
    check_links_inside(out, "OUT_DIR", target.inputs("the checkpoint's"))
    return ExportInputs(target, out)


COMMAND = Command(
    "a LoRA checkpoint -> the adapter as diffusers loads it (families with a diffusers "
    "pipeline), else a diffusers-layout model folder",
    "diffrl.cli.export:run",
    arguments,
    inputs,
)
