"""``diffrl plan RECIPE [key=value ...]``: its arguments, the GPU's name and its recipe's schema
stage; the plan itself is made in :mod:`diffrl.cli.plan`."""

from __future__ import annotations

import argparse

from diffrl.cli.arguments import Command, number
from diffrl.cli.commands.train import inputs as recipe_inputs
from diffrl.cli.targets import Target
from diffrl.core.errors import DiffrlError

PLAN_GPUS = ("H200", "H100", "A100", "L40S", "L4", "A10", "RTX 4090")
"""``diffrl plan --gpu``: the GPUs whose datasheet figures :mod:`diffrl.models.numerics` holds."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. parallel.trainer_ranks=16")
    p.add_argument(
        "--gpu",
        default="H100",
        help="datasheet peak and memory of: H200, H100, A100, L40S, L4, A10, RTX 4090",
    )
    p.add_argument(
        "--mfu",
        type=number(0, 1, lo_open=True),
        default=0.4,
        help="model FLOPs utilisation assumed for the times, in (0, 1]",
    )


def inputs(args: argparse.Namespace) -> Target:
    if args.gpu not in PLAN_GPUS:
        raise DiffrlError(f"--gpu {args.gpu!r} is not one of {', '.join(PLAN_GPUS)}")
    if not 0 < args.mfu <= 1:
        raise DiffrlError(f"--mfu {args.mfu:g} must be in (0, 1], e.g. 0.4")
    return recipe_inputs(args)


COMMAND = Command(
    "predict a recipe's peak memory per trainer rank and FLOPs per iteration for the real "
    "model size, without its weights (the model on fake tensors, measured by torch's tools)",
    "diffrl.cli.plan:run",
    arguments,
    inputs,
)
