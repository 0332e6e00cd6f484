"""``diffrl bench TARGET --suite geneval|ocr|drawbench``: its arguments, the suite's prompts, the
target (and ``--baseline``) and where its files go, checked before torch loads; the benchmark runs
in :mod:`diffrl.cli.bench`."""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path

from diffrl.bench.report import BENCH_JSON
from diffrl.bench.suites import SUITES, BenchPrompts, load_suite, suite_name
from diffrl.cli.arguments import PROMPT_COUNT, SAMPLE_COUNT, TRUST_HELP, Command, integer, number
from diffrl.cli.commands.eval import EvalInputs
from diffrl.cli.outputs import check_command_out, check_out_dir
from diffrl.cli.targets import EVAL_SECTIONS, is_run_folder, paired_target, resolve_target
from diffrl.core.errors import DiffrlError, quoted

BENCH_WRITES = (BENCH_JSON,)
"""What ``diffrl bench`` writes into a run folder given as ``--out`` (and ``bench_SUITE.png``)."""


GENEVAL_FLAGS = (
    ("--threshold", number(0, 1), 0.3, "geneval: keep detections scoring above this (0.3)"),
    ("--counting-threshold", number(0, 1), 0.9, "geneval: ... for the counting tag (0.9)"),
    ("--max-objects", integer(1, 1000), 16, "geneval: detections kept per class (16)"),
    ("--max-overlap", number(0, 1), 1.0, "geneval: IoU dropping a less confident box (1: none)"),
    ("--position-threshold", number(0, 10), 0.1, "geneval: the position rule's margin (0.1)"),
    ("--nms", number(0, 1), 0.5, "geneval: the detector's per-class box merging IoU (0.5)"),
)
"""GenEval's detection settings (:class:`~diffrl.bench.geneval.GenevalSettings`, and the detector's
box merging): flag, type, default, help."""


@dataclass(frozen=True)
class BenchInputs:
    eval: EvalInputs
    """The target (and baseline) as ``diffrl eval`` takes them: sampled with ``sampling`` and
    ``eval.seed``; ``eval.rewards`` is what DrawBench scores."""
    prompts: BenchPrompts
    samples_per_prompt: int
    run_folder: bool
    """``--out`` is a training run's folder: bench adds its files there (``diffrl report`` shows
    them) instead of making ``--out`` its own output folder."""


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", help="'base', a recipe .yaml, a checkpoint folder or a model folder")
    p.add_argument("overrides", nargs="*", help="key=value overrides, e.g. sampling.num_steps=20")
    p.add_argument("--suite", required=True, help="geneval, ocr or drawbench")
    p.add_argument(
        "--prompts",
        help="the benchmark's prompt file in its format: GenEval's evaluation_metadata.jsonl, flow_grpo's "
        "ocr/test.txt, DrawBench's csv (default: a few shipped test prompts of the suite)",
    )
    p.add_argument("--num-prompts", type=PROMPT_COUNT, help="the first N prompts (default: all)")
    p.add_argument(
        "--samples-per-prompt", type=SAMPLE_COUNT, help="default: 4 for geneval (as GenEval), else 1"
    )
    p.add_argument(
        "--baseline",
        help="another target sampled with the same prompts and seeds: its column and the paired "
        "difference +- standard error per category",
    )
    p.add_argument(
        "--out",
        default="runs/bench",
        help="where bench.json and bench_SUITE.png go; a training run's folder adds them to its "
        "`diffrl report` page (default: runs/bench)",
    )
    p.add_argument("--rewards", help="drawbench: reward names, comma-separated (default: eval.rewards)")
    p.add_argument(
        "--detector", help="geneval: a local OWL-ViT or OWLv2 folder (e.g. google/owlvit-base-patch32)"
    )
    p.add_argument(
        "--clip", help="geneval: a local CLIP folder for colours (e.g. openai/clip-vit-large-patch14)"
    )
    for flag, kind, default, text in GENEVAL_FLAGS:
        p.add_argument(flag, type=kind, default=default, help=text)
    p.add_argument("--trust-checkpoint-code", action="store_true", help=TRUST_HELP)


def inputs(args: argparse.Namespace) -> BenchInputs:
    suite = SUITES[suite_name(args.suite)]
    for flag, given, used in (
        ("--detector", args.detector, suite.models),
        ("--clip", args.clip, suite.models),
        ("--rewards", args.rewards, suite.rewards),
    ):
        if given is not None and not used:
            users = [s.name for s in SUITES.values() if (s.rewards if flag == "--rewards" else s.models)]
            raise DiffrlError(
                f"{flag}: --suite {suite.name} does not use it (only {', '.join(users)} does); leave it out"
            )
    prompts = load_suite(suite.name, args.prompts).head(args.num_prompts)
    samples = args.samples_per_prompt or suite.samples_per_prompt
    overrides = [*args.overrides, "eval.enabled=true"]
    if args.rewards is not None:
        names = [n.strip() for n in args.rewards.split(",") if n.strip()]
        if not names:
            raise DiffrlError(
                f"--rewards {quoted(args.rewards, 60)} names no reward; give names, e.g. pickscore,clip_score"
            )
        overrides.append("eval.rewards=" + json.dumps([{"name": n} for n in names]))
    trust = getattr(args, "trust_checkpoint_code", False)
    out = Path(args.out).expanduser()
    check_out_dir(out, "--out")
    target = resolve_target(args.target, overrides, EVAL_SECTIONS, trust)
    baseline = paired = None
    folders = target.inputs("the target's")
    if args.baseline:
        baseline = resolve_target(args.baseline, [], ("model",), trust)
        folders = {**folders, **baseline.inputs("the baseline's")}
        paired = paired_target(target, baseline, args.baseline)
    if suite.rewards and not target.config.eval.rewards:
        raise DiffrlError(
            f"--suite {suite.name} scores with eval.rewards, which is empty; give --rewards NAMES"
        )
    if target.config.eval.batch_size < 1:
        raise DiffrlError(
            f"eval.batch_size (images per sampling forward) must be >= 1, got {target.config.eval.batch_size}"
        )
    run_folder = is_run_folder(out)
    if run_folder:  # only bench's own files are written there, each a file of its own (no link out)
        check_out_dir(out, "--out", inputs=folders)
        for name in (*BENCH_WRITES, f"bench_{suite.name}.png"):
            path = out / name
            if path.is_symlink() or (os.path.lexists(path) and not path.is_file()):
                raise DiffrlError(
                    f"--out {quoted(str(out))}: {name} there is {'a symlink' if path.is_symlink() else 'not a file'}; "
                    "bench writes that file: remove it, or give another --out"
                )
    else:
        read = [("the target", args.target), ("--prompts", args.prompts)]
        if args.baseline:
            read.append(("--baseline", args.baseline))
        check_command_out(out, "--out", "bench", folders, read)
    return BenchInputs(EvalInputs(target, baseline, paired, out), prompts, samples, run_folder)


COMMAND = Command(
    "score a model on a benchmark's prompts as the benchmark does (GenEval, OCR, DrawBench): "
    "a table per category, paired against --baseline, and bench.json (docs/bench.md)",
    "diffrl.cli.bench:run",
    arguments,
    inputs,
)
