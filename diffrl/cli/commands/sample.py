"""``diffrl sample TARGET --prompt TEXT | --prompts FILE``: its arguments, its prompts, target and
output folder, checked before torch loads; the sampling runs in :mod:`diffrl.cli.sample`."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from diffrl.cli.arguments import PROMPT_COUNT, SAMPLE_COUNT, TRUST_HELP, Command, integer
from diffrl.cli.outputs import check_command_out, check_out_dir
from diffrl.cli.targets import SAMPLE_SECTIONS, Target, resolve_target
from diffrl.core.errors import DiffrlError, quoted
from diffrl.data.lines import prompt_problem

SEEDS = (-(2**63), 2**64 - 1)
"""``--seed``: torch's seed range (as ``run.seed``)."""


@dataclass(frozen=True)
class SampleInputs:
    target: Target
    out: Path


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target")
    p.add_argument("overrides", nargs="*")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    p.add_argument(
        "--image", action="append", help="an editing family's source image for each --prompt (repeatable)"
    )
    p.add_argument("--prompts", help="prompt file")
    p.add_argument("--num-prompts", type=PROMPT_COUNT, help="the first N prompts of --prompts (default: all)")
    p.add_argument("--samples-per-prompt", type=SAMPLE_COUNT, default=1, help="1 to 4096")
    p.add_argument("--seed", type=integer(*SEEDS, "[-2**63, 2**64 - 1] (torch's seed range)"), default=0)
    p.add_argument("--out", default="runs/samples")
    p.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)


def inputs(args: argparse.Namespace) -> SampleInputs:
    if args.prompt and args.prompts:
        raise DiffrlError("give either --prompt TEXT (repeatable) or --prompts FILE, not both")
    if not args.prompt and not args.prompts:
        raise DiffrlError("give --prompt TEXT (repeatable) or --prompts FILE")
    problems = [
        f"--prompt {n} ({quoted(p, 60)}): {why}"
        for n, p in enumerate(args.prompt or [], 1)
        if (why := prompt_problem(p))
    ]
    if problems:  # checked again where the prompts are read (given_prompts); here before anything loads
        raise DiffrlError("; ".join(problems))
    if args.num_prompts is not None and not args.prompts:
        raise DiffrlError(
            "--num-prompts takes the first N prompts of --prompts FILE; with --prompt, give just those"
        )
    if args.samples_per_prompt < 1:
        raise DiffrlError(f"--samples-per-prompt must be >= 1, got {args.samples_per_prompt}")
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    target = resolve_target(
        args.target, args.overrides, SAMPLE_SECTIONS, getattr(args, "trust_checkpoint_code", False)
    )
    read = [
        ("the target", args.target),
        ("--prompts", args.prompts),
        *(("--image", i) for i in args.image or []),
    ]
    check_command_out(out, "--out", "sample", target.inputs("the target's"), read)
    if target.config.eval.batch_size < 1:  # sample draws eval.batch_size images per forward
        raise DiffrlError(
            f"eval.batch_size (images per sampling forward) must be >= 1, got {target.config.eval.batch_size}"
        )
    if args.image and not args.prompt:
        raise DiffrlError("--image goes with --prompt (one each); a prompt file names its images itself")
    return SampleInputs(target, out)


COMMAND = Command(
    "prompts -> PNG files (videos: .mp4 with sound, and frames) and a grid",
    "diffrl.cli.sample:run",
    arguments,
    inputs,
)
