"""``diffrl bench TARGET --suite geneval|ocr|drawbench``: sample a model on a benchmark's prompts
with fixed seeds, score as the benchmark does (:mod:`diffrl.bench`), print a table per category
(with ``--baseline``: its column and the paired difference +- SE), write ``bench.json`` and a
grid ``bench_SUITE.png`` into ``--out`` (a run folder's: ``diffrl report`` shows them)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from diffrl.bench.geneval import GenevalSettings
from diffrl.bench.report import BENCH_JSON, MAX_BENCH_JSON
from diffrl.bench.score import Scorer, draw_and_score, tabulate
from diffrl.bench.scorers import SCORERS, ScorerSetup
from diffrl.bench.table import finite, render
from diffrl.cli.commands.bench import BenchInputs
from diffrl.cli.inference import checked, guarded, load_for_inference
from diffrl.cli.outputs import claim_out_folder
from diffrl.core.user_files import UserFileError, read_json
from diffrl.evaluation.evaluate import Caption, save_grid

GRID_IMAGES = 32


def run(args: argparse.Namespace, inputs: BenchInputs) -> int:
    return guarded(
        inputs.eval.untrusted(),
        inputs.eval.out,
        "the bench's outputs",
        "free space, then run it again",
        lambda out: _run(args, inputs, out),
    )


def _scorer(args: argparse.Namespace, inputs: BenchInputs) -> Scorer:
    config, drawn = inputs.eval.target.config, len(inputs.prompts.prompts) * inputs.samples_per_prompt
    auto = "cuda" if torch.cuda.is_available() else "cpu"
    settings = GenevalSettings(
        args.threshold, args.counting_threshold, args.max_objects, args.max_overlap, args.position_threshold
    )
    setup = ScorerSetup(
        num_images=drawn * (2 if inputs.eval.baseline is not None else 1),
        rewards=config.eval.rewards,
        device=torch.device(auto if config.run.device == "auto" else config.run.device),
        detector=args.detector,
        clip=args.clip,
        nms=args.nms,
        geneval=settings,
    )
    return SCORERS[inputs.prompts.suite](setup)


def _run(args: argparse.Namespace, inputs: BenchInputs, out: Path) -> int:
    e, prompts, samples = inputs.eval, inputs.prompts, inputs.samples_per_prompt
    config = checked(e.target).config
    paired = None
    if e.baseline is not None and e.paired is not None:
        checked(e.baseline)
        paired = checked(e.paired)
    scorer = _scorer(args, inputs)
    try:
        target = draw_and_score(
            load_for_inference(config, e.target.checkpoint), config, prompts, samples, scorer, "bench"
        )
        base = None
        if paired is not None:
            family = load_for_inference(paired.config, paired.checkpoint)
            base = draw_and_score(family, config, prompts, samples, scorer, "baseline")
    finally:
        scorer.close()
    info = {
        "suite": prompts.suite,
        "target": args.target,
        "baseline": args.baseline,
        "prompts": prompts.source,
        "num_prompts": len(prompts.prompts),
        "samples_per_prompt": samples,
        "seed": config.eval.seed,
        "overall": scorer.overall,
    }
    result = tabulate(prompts, target, base, scorer.overall, info)
    print(
        f"{prompts.suite}: {len(prompts.prompts)} prompts x {samples} samples (seed {config.eval.seed}) from "
        f"{prompts.source}; target {args.target}" + (f", baseline {args.baseline}" if args.baseline else "")
    )
    for metric, rows in result.tables.items():
        print()
        print(render(metric, rows, base is not None))
    if not inputs.run_folder:
        claim_out_folder(out, "--out", "bench")  # checked again: files may have arrived meanwhile
    path = write_bench_json(out / BENCH_JSON, prompts.suite, result.to_json())
    n = min(GRID_IMAGES, len(target.index))
    first = next(iter(result.tables))
    captions = [
        Caption(prompts.prompts[i], target.scored.metrics[first][k].item())
        for k, i in enumerate(target.index[:n])
    ]
    grid = save_grid(target.images[:n], out / f"bench_{prompts.suite}.png", captions=captions)
    print(f'\n{path} ({prompts.suite} under "suites"); grid of the first {n} samples: {grid}')
    return 0


def write_bench_json(path: Path, suite: str, result: dict[str, Any]) -> Path:
    """``path`` holding ``{"suites": {suite: result, ...}}``: the suites an earlier bench wrote
    there are kept (one file per run folder, every suite benched on it); one that cannot be read
    as that is replaced, with a warning."""
    suites: dict[str, Any] = {}
    if path.exists():
        try:
            earlier = read_json(path, "--out's bench.json", "it is replaced", MAX_BENCH_JSON)
        except UserFileError as err:
            earlier = None
            print(f"warning: {err}", file=sys.stderr)
        if isinstance(earlier, dict) and isinstance(earlier.get("suites"), dict):
            suites = earlier["suites"]
        elif earlier is not None:
            print(
                f"warning: {str(path)!r} is not a bench.json diffrl bench wrote; it is replaced",
                file=sys.stderr,
            )
    suites[suite] = finite(result)
    path.write_text(json.dumps({"suites": suites}, indent=1))
    return path
