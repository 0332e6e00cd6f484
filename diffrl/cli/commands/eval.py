"""``diffrl eval TARGET``: its arguments, its target (and ``--baseline``) and its output folder,
checked before torch loads; the eval runs in :mod:`diffrl.cli.eval`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from diffrl.cli.arguments import PROMPT_COUNT, SAMPLE_COUNT, TRUST_HELP, Command
from diffrl.cli.outputs import check_command_out, check_out_dir
from diffrl.cli.targets import EVAL_SECTIONS, Target, paired_target, resolve_target, run_checkpoint


@dataclass(frozen=True)
class EvalInputs:
    target: Target
    baseline: Target | None
    """The ``--baseline`` model as its own config names it (its ``model`` section checked)."""
    paired: Target | None
    """The target's config with the baseline's model: sampled and scored exactly as the target."""
    out: Path

    def untrusted(self) -> dict[str, str]:
        return {**self.target.untrusted, **(self.baseline.untrusted if self.baseline else {})}


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    p.add_argument("overrides", nargs="*")
    p.add_argument(
        "--prompts", help="prompt file, all of its prompts unless --num-prompts (default: eval.prompts)"
    )
    p.add_argument(
        "--num-prompts", type=PROMPT_COUNT, help="the first N prompts (sets eval.num_prompts; 1 to 10^7)"
    )
    p.add_argument(
        "--samples-per-prompt",
        type=SAMPLE_COUNT,
        help="default: the config's eval.samples_per_prompt (1 to 4096)",
    )
    p.add_argument(
        "--baseline",
        help="another target ('base', a checkpoint, ...) sampled with the same prompts and seeds; "
        "prints the paired difference of the mean reward and its standard error",
    )
    p.add_argument("--out", default="runs/eval")
    p.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)


def inputs(args: argparse.Namespace) -> EvalInputs:
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    # the eval command evaluates whatever the run's eval.enabled said about evals during training
    overrides = [*args.overrides, "eval.enabled=true"]
    if args.num_prompts is not None:
        overrides.append(f"eval.num_prompts={args.num_prompts}")
    elif args.prompts:  # a prompt file named on the command line is scored whole
        overrides.append("eval.num_prompts=null")
    if args.samples_per_prompt is not None:
        overrides.append(f"eval.samples_per_prompt={args.samples_per_prompt}")
    if args.prompts:
        overrides.append(f"eval.prompts={json.dumps(args.prompts)}")  # quoted: any path is a string
    trust = getattr(args, "trust_checkpoint_code", False)
    args.target, args.baseline = run_checkpoint(args.target), args.baseline and run_checkpoint(args.baseline)
    target = resolve_target(args.target, overrides, EVAL_SECTIONS, trust)
    read = [("the target", args.target), ("eval.prompts", target.config.eval.prompts)]
    if not args.baseline:
        check_command_out(out, "--out", "eval", target.inputs("the target's"), read)
        return EvalInputs(target, None, None, out)
    # the baseline's model, sampled and scored exactly as the target: same config, prompts, seeds
    baseline = resolve_target(args.baseline, [], ("model",), trust)
    folders = {**target.inputs("the target's"), **baseline.inputs("the baseline's")}
    check_command_out(out, "--out", "eval", folders, [*read, ("--baseline", args.baseline)])
    return EvalInputs(target, baseline, paired_target(target, baseline, args.baseline), out)


COMMAND = Command(
    "score a model on a prompt set; print the mean reward; write a grid",
    "diffrl.cli.eval:run",
    arguments,
    inputs,
)
