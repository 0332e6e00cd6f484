"""``diffrl train RECIPE [key=value ...]``: its arguments and its config's schema stage; the
training driver runs in :mod:`diffrl.cli.train`."""

from __future__ import annotations

import argparse

from diffrl.cli.arguments import Command
from diffrl.cli.targets import Target
from diffrl.config import SECTIONS
from diffrl.preflight.schema import read_config


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("recipe")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-4")


def inputs(args: argparse.Namespace) -> Target:
    config, source = read_config(args.recipe, args.overrides, SECTIONS)
    return Target(config, None, source, SECTIONS)


COMMAND = Command("train from a recipe", "diffrl.cli.train:run", arguments, inputs)
