"""``diffrl plan RECIPE [key=value ...]``: a trainer rank's peak memory and an iteration's FLOPs and
time for the recipe's real model, without its weights (see :mod:`diffrl.plan.planner`)."""

from __future__ import annotations

import argparse

from diffrl import launch
from diffrl.algorithms.registry import build_algorithm
from diffrl.cli.targets import Target
from diffrl.models.numerics import GPU_MEMORY_GB
from diffrl.plan.planner import plan, render
from diffrl.preflight import check_plugins


def run(args: argparse.Namespace, target: Target) -> int:
    # the model's files need not be here: that is the point
    config = check_plugins(target.config, target.source, target.sections, check_files=False)
    result = plan(config, build_algorithm(config), launch.layout(config))  # what the runner places
    print(render(result, config, args.gpu, args.mfu, GPU_MEMORY_GB[args.gpu]))
    return 0
