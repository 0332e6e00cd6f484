"""The commands: one module each, holding what answers before torch loads (its arguments, its
checks, its :class:`~diffrl.cli.arguments.Command` line naming its run), and :data:`COMMANDS`, the
table :func:`build_parser` and :func:`diffrl.cli.main` read.

A command's run (``diffrl/cli/<command>.py``) imports its world (torch, the models, Ray, ...) at
its top and is imported only when the command runs, after its arguments and the schema stage of
its config passed; a command that needs no such world (``recipes``) runs from its own module."""

from __future__ import annotations

import argparse

from diffrl.cli.arguments import Command
from diffrl.cli.commands import bench, eval, export, plan, recipes, report, sample, serve_reward, train

COMMANDS: dict[str, Command] = {
    "train": train.COMMAND,
    "eval": eval.COMMAND,
    "sample": sample.COMMAND,
    "export": export.COMMAND,
    "serve-reward": serve_reward.COMMAND,
    "report": report.COMMAND,
    "plan": plan.COMMAND,
    "bench": bench.COMMAND,
    "recipes": recipes.COMMAND,
}
"""Each command, in the order ``diffrl --help`` lists them -> its module's :class:`Command`."""

DESCRIPTION = """RL post-training for diffusion and flow-matching generators.

  diffrl train recipes/tiny_sft.yaml train.iterations=50     train from a recipe, with overrides
  diffrl eval base                                           mean OCR reward of the shipped tiny base
  diffrl eval runs/tiny_sft/checkpoints/final                ... of a checkpoint
  diffrl eval CHECKPOINT --baseline base                     ... and how much it beats the base (paired)
  diffrl sample base --prompt 'the number "42"'              prompts -> PNG files and a grid
  diffrl export runs/tiny_sft/checkpoints/final OUT_DIR      a checkpoint -> diffusers-layout model
  diffrl report runs/tiny_sft                                a run's curves, grids and config -> one HTML page
  diffrl plan recipes/wan22_grpo.yaml --gpu H100             memory per rank and time per iteration, no weights
  diffrl recipes                                             list the shipped recipes
  diffrl serve-reward --reward ocr --port 8100               serve a reward over HTTP (the remote reward)
"""


def build_parser() -> argparse.ArgumentParser:
    """``diffrl`` and a subparser per command of :data:`COMMANDS`: argparse definitions only, so
    ``diffrl --help``, ``diffrl <command> --help`` and every argument error answer at once."""
    p = argparse.ArgumentParser(
        prog="diffrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    debug_help = "show the full traceback of an error (for bug reports)"
    p.add_argument("--debug", action="store_true", help=debug_help)
    # also accepted after the command (``diffrl train RECIPE --debug``); SUPPRESS keeps the global value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = p.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        parser = sub.add_parser(name, parents=[common], help=command.help)
        if command.arguments is not None:
            command.arguments(parser)
    return p
