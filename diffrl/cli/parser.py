"""The command line's arguments: argparse definitions only (no command's code, no torch), so
``diffrl --help``, ``diffrl <command> --help`` and every argument error answer at once."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

from diffrl.serving.limits import flag_name, limit_fields

MAX_PROMPTS = 10**7
"""``--num-prompts`` at most (as ``eval.num_prompts``)."""
MAX_SAMPLES_PER_PROMPT = 4096
"""``--samples-per-prompt`` at most (as ``eval.samples_per_prompt``)."""
SEEDS = (-(2**63), 2**64 - 1)
"""``--seed``: torch's seed range (as ``run.seed``)."""

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


def integer(lo: int, hi: int, shown: str = "") -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``[lo, hi]`` (``1e3`` and ``2.0`` are integers too;
    ``2.5``, ``nan`` and words are not), else an error that says the range (argparse exits 2)."""
    big = max(abs(lo), abs(hi)) >= 1_000_000
    bounds = shown or (f"[{lo:_}, {hi:_}]" if big else f"[{lo}, {hi}]")

    def parse(text: str) -> int:
        value: int | None = None
        if re.fullmatch(r"\s*[-+]?\d+\s*", text) and len(text) < 100:
            value = int(text)
        elif len(text) < 100:
            try:
                number = float(text)
            except ValueError:
                number = math.nan
            if math.isfinite(number) and number.is_integer():
                value = int(number)
        if value is None:
            raise argparse.ArgumentTypeError(f"expected an integer in {bounds}, got {_cut(text)}")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {bounds}, got {_cut(text)}")
        return value

    parse.__name__ = "integer"
    return parse


def number(lo: float, hi: float, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse ``type``: a finite number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``),
    else an error that says the range; ``nan`` and ``inf`` are refused."""
    bounds = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) < 100 else math.nan
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number in {bounds}, got {_cut(text)}") from None
        inside = lo < value <= hi if lo_open else lo <= value <= hi  # NaN fails both
        if not (math.isfinite(value) and inside):
            raise argparse.ArgumentTypeError(f"must be a number in {bounds}, got {_cut(text)}")
        return value

    parse.__name__ = "number"
    return parse


def _cut(text: str, limit: int = 60) -> str:
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text):,} characters)"


PROMPT_COUNT = integer(1, MAX_PROMPTS)
SAMPLE_COUNT = integer(1, MAX_SAMPLES_PER_PROMPT)


TRUST_HELP = (
    "import the dotted paths (rewards, model family, ...) a checkpoint's config.yaml names without "
    "naming them again; only for a checkpoint you trust: importing runs its code (docs/troubleshooting.md)"
)


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
    e.add_argument(
        "--num-prompts", type=PROMPT_COUNT, help="the first N prompts (sets eval.num_prompts; 1 to 10^7)"
    )
    e.add_argument(
        "--samples-per-prompt",
        type=SAMPLE_COUNT,
        help="default: the config's eval.samples_per_prompt (1 to 4096)",
    )
    e.add_argument(
        "--baseline",
        help="another target ('base', a checkpoint, ...) sampled with the same prompts and seeds; "
        "prints the paired difference of the mean reward and its standard error",
    )
    e.add_argument("--out", default="runs/eval")
    e.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)

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
    s.add_argument("--num-prompts", type=PROMPT_COUNT, help="the first N prompts of --prompts (default: all)")
    s.add_argument("--samples-per-prompt", type=SAMPLE_COUNT, default=1, help="1 to 4096")
    s.add_argument("--seed", type=integer(*SEEDS, "[-2**63, 2**64 - 1] (torch's seed range)"), default=0)
    s.add_argument("--out", default="runs/samples")
    s.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)

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
    x.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)

    v = sub.add_parser(
        "serve-reward",
        parents=[common],
        help="serve a reward over HTTP for the 'remote' reward (wire format: diffrl/serving/server.py)",
    )
    v.add_argument("--reward", required=True, help="a reward name (e.g. ocr) or a dotted path module:obj")
    v.add_argument(
        "--params", nargs="*", default=[], help="the reward's params: key=value ... or one mapping '{k: v}'"
    )
    v.add_argument("--host", help="address to bind (default 127.0.0.1; with --ray, the node's address)")
    v.add_argument(
        "--port", type=integer(0, 65535), help="default 8000 (with --ray: a free port); 0: a free port"
    )
    v.add_argument(
        "--protocol",
        default="diffrl",
        help="the wire protocol to answer: diffrl (msgpack POST /score, the default), flow_factory "
        "(Flow-Factory's JSON POST /compute) or verl_omni (verl-omni's / flow_grpo's scorer fields "
        "as JSON, POST / and /score); see diffrl/transport/protocols.py",
    )
    v.add_argument("--token-file", help="a file holding the token clients must send (Bearer)")
    v.add_argument("--token-env", help="an environment variable holding the token")
    for name, limit in limit_fields().items():  # one flag per limit (diffrl/serving/limits.py)
        lo, hi = limit.bounds.lo, limit.bounds.hi
        v.add_argument(
            flag_name(name),
            type=integer(int(lo), int(hi)) if limit.kind is int else number(lo, hi, limit.bounds.lo_open),
            help=f"{limit.help} (default {limit.default:g}; {limit.bounds.text()})",
        )
    v.add_argument("--ray", action="store_true", help="serve from a Ray actor (its own CPUs/GPUs)")
    v.add_argument("--ray-address", help="with --ray: auto or HOST:PORT of a cluster (default: start one)")
    v.add_argument(
        "--num-gpus", type=number(0, 1024), default=0, help="with --ray: GPUs for the server's actor"
    )
    v.add_argument(
        "--num-cpus", type=number(0, 1024), default=1, help="with --ray: CPUs for the server's actor"
    )

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
        "--mfu",
        type=number(0, 1, lo_open=True),
        default=0.4,
        help="model FLOPs utilisation assumed for the times, in (0, 1]",
    )

    b = sub.add_parser(
        "bench",
        parents=[common],
        help="score a model on a benchmark's prompts as the benchmark does (GenEval, OCR, DrawBench): "
        "a table per category, paired against --baseline, and bench.json (docs/bench.md)",
    )
    b.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    b.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sampling.num_steps=20")
    b.add_argument("--suite", required=True, help="geneval, ocr or drawbench")
    b.add_argument(
        "--prompts",
        help="the benchmark's prompt file in its format: GenEval's evaluation_metadata.jsonl, flow_grpo's "
        "ocr/test.txt, DrawBench's csv (default: a few shipped test prompts of the suite)",
    )
    b.add_argument("--num-prompts", type=PROMPT_COUNT, help="the first N prompts (default: all)")
    b.add_argument(
        "--samples-per-prompt", type=SAMPLE_COUNT, help="default: 4 for geneval (as GenEval), else 1"
    )
    b.add_argument(
        "--baseline",
        help="another target sampled with the same prompts and seeds: its column and the paired "
        "difference +- standard error per category",
    )
    b.add_argument(
        "--out",
        default="runs/bench",
        help="where bench.json and bench_SUITE.png go; a training run's folder adds them to its "
        "`diffrl report` page (default: runs/bench)",
    )
    b.add_argument("--rewards", help="drawbench: reward names, comma-separated (default: eval.rewards)")
    b.add_argument(
        "--detector", help="geneval: a local OWL-ViT or OWLv2 folder (e.g. google/owlvit-base-patch32)"
    )
    b.add_argument(
        "--clip", help="geneval: a local CLIP folder for colours (e.g. openai/clip-vit-large-patch14)"
    )
    b.add_argument(
        "--threshold",
        type=number(0, 1),
        default=0.3,
        help="geneval: keep detections scoring above this (0.3)",
    )
    b.add_argument(
        "--counting-threshold", type=number(0, 1), default=0.9, help="geneval: ... for the counting tag (0.9)"
    )
    b.add_argument(
        "--max-objects", type=integer(1, 1000), default=16, help="geneval: detections kept per class (16)"
    )
    b.add_argument(
        "--max-overlap",
        type=number(0, 1),
        default=1.0,
        help="geneval: IoU dropping a less confident box (1: none)",
    )
    b.add_argument(
        "--position-threshold",
        type=number(0, 10),
        default=0.1,
        help="geneval: the position rule's margin (0.1)",
    )
    b.add_argument(
        "--nms",
        type=number(0, 1),
        default=0.5,
        help="geneval: the detector's per-class box merging IoU (0.5)",
    )
    b.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)

    sub.add_parser("recipes", parents=[common], help="list the shipped recipes")
    return p
