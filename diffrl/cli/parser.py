"""The command line's arguments: argparse definitions only (no command's code, no torch), so
``diffrl --help``, ``diffrl <command> --help`` and every argument error answer at once."""

from __future__ import annotations

import argparse

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
    p = argparse.ArgumentParser(
        prog="diffrl", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    debug_help = "show the full traceback of an error (for bug reports)"
    p.add_argument("--debug", action="store_true", help=debug_help)
    # also accepted after the command (``diffrl train RECIPE --debug``); SUPPRESS keeps the global value
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=debug_help)
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("train", parents=[common], help="train from a recipe")
    t.add_argument("recipe")
    t.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.lr=1e-4")

    e = sub.add_parser(
        "eval", parents=[common], help="score a model on a prompt set; print the mean reward; write a grid"
    )
    e.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    e.add_argument("overrides", nargs="*")
    e.add_argument(
        "--prompts", help="prompt file, all of its prompts unless --num-prompts (default: eval.prompts)"
    )
    e.add_argument("--num-prompts", type=int, help="the first N prompts (sets eval.num_prompts)")
    e.add_argument("--samples-per-prompt", type=int, help="default: the config's eval.samples_per_prompt")
    e.add_argument(
        "--baseline",
        help="another target ('base', a checkpoint, ...) sampled with the same prompts and seeds; "
        "prints the paired difference of the mean reward and its standard error",
    )
    e.add_argument("--out", default="runs/eval")

    s = sub.add_parser(
        "sample",
        parents=[common],
        help="prompts -> PNG files (videos: .mp4 with sound, and frames) and a grid",
    )
    s.add_argument("target")
    s.add_argument("overrides", nargs="*")
    s.add_argument("--prompt", action="append", help="a prompt (repeatable)")
    s.add_argument(
        "--image", action="append", help="an editing family's source image for each --prompt (repeatable)"
    )
    s.add_argument("--prompts", help="prompt file")
    s.add_argument("--num-prompts", type=int, help="the first N prompts of --prompts (default: all)")
    s.add_argument("--samples-per-prompt", type=int, default=1)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--out", default="runs/samples")

    x = sub.add_parser(
        "export",
        parents=[common],
        help="a LoRA checkpoint -> the adapter as diffusers loads it (families with a diffusers "
        "pipeline), else a diffusers-layout model folder",
    )
    x.add_argument("--merge", action="store_true", help="merge a LoRA into a full model folder instead")
    x.add_argument("checkpoint")
    x.add_argument("out_dir", help="a new or empty folder (see --force)")
    x.add_argument("overrides", nargs="*", help="key=value overrides, e.g. run.device=cpu")
    x.add_argument("--dtype", choices=["float32", "float16", "bfloat16"])
    x.add_argument(
        "--force",
        action="store_true",
        help="write into a non-empty OUT_DIR (files of the same name are replaced)",
    )

    v = sub.add_parser(
        "serve-reward",
        parents=[common],
        help="serve a reward over HTTP for the 'remote' reward (wire format: diffrl/rewards/server.py)",
    )
    v.add_argument("--reward", required=True, help="a reward name (e.g. ocr) or a dotted path module:obj")
    v.add_argument(
        "--params", nargs="*", default=[], help="the reward's params: key=value ... or one mapping '{k: v}'"
    )
    v.add_argument("--host", help="address to bind (default 127.0.0.1; with --ray, the node's address)")
    v.add_argument("--port", type=int, help="default 8000 (with --ray: a free port); 0: a free port")
    v.add_argument("--token-file", help="a file holding the token clients must send (Bearer)")
    v.add_argument("--token-env", help="an environment variable holding the token")
    v.add_argument("--max-request-mb", type=float, default=64.0, help="larger requests get HTTP 413")
    v.add_argument("--ray", action="store_true", help="serve from a Ray actor (its own CPUs/GPUs)")
    v.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: start one)")
    v.add_argument("--num-gpus", type=float, default=0, help="with --ray: GPUs for the server's actor")
    v.add_argument("--num-cpus", type=float, default=1, help="with --ray: CPUs for the server's actor")

    h = sub.add_parser(
        "report",
        parents=[common],
        help="a run folder -> one self-contained HTML page: curves, captioned eval grids, the first "
        "and last eval side by side, final numbers, config (a run writes RUN_DIR/report.html itself)",
    )
    h.add_argument("run_dir", help="a training run's output folder, e.g. runs/tiny_demo")
    h.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html)")

    n = sub.add_parser(
        "plan",
        parents=[common],
        help="predict a recipe's peak memory per trainer rank and FLOPs per iteration for the real "
        "model size, without its weights (the model on fake tensors, measured by torch's tools)",
    )
    n.add_argument("recipe")
    n.add_argument("overrides", nargs="*", help="key=value overrides, e.g. ray.num_trainer_ranks=16")
    n.add_argument(
        "--gpu",
        default="H100",
        help="datasheet peak and memory of: H200, H100, A100, L40S, L4, A10, RTX 4090",
    )
    n.add_argument(
        "--mfu", type=float, default=0.4, help="model FLOPs utilisation assumed for the times (0-1]"
    )

    sub.add_parser("recipes", parents=[common], help="list the shipped recipes")
    return p
