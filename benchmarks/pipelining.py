"""Samples per second of the synchronous loop (``train.off_policy_steps: 0``) against the
pipelined one (``1``: the next rollout drawn while the ranks train), measured side by side.

    python benchmarks/pipelining.py [--recipe recipes/tiny_demo.yaml] [--rounds 3] [--iterations 6]
    python benchmarks/pipelining.py --curves [--grpo-iterations 8]

Both run ``runner: ray`` with the same placement: 1 rollout engine and 1 FSDP2 trainer rank, one
torch thread each (``ray.threads_per_actor: 1``), 1 reward worker, no eval or checkpoints. The runs
alternate K = 0, K = 1, K = 0, ... (``--rounds`` of each), so a noisy neighbour hits both alike;
each run's first ``--warmup`` iterations are left out. Per run: the median seconds per iteration
and samples per second; over the runs: the median and the spread (min-max) of each, their ratio
per round, and each actor's idle fraction, the share of the iteration's wall-clock it did not
compute: the trainer rank's = 1 - (its update, old-policy update included) / iteration, the
engine's = 1 - (its sampling stages) / iteration. Writes ``docs/results/pipelining.json``. The
verdict on the target (K = 1 at least 1.5x the samples/s of K = 0) is PASS or MISS only when every
round's ratio is on the same side of it, else inconclusive and exit code 4 (``diffrl.bench.verdict``).

``--curves``: what the staleness costs in learning. The main job's DiffusionNFT recipe
(``tiny_demo``, all its iterations) and the tiny Flow-GRPO recipe (``tiny_grpo_ocr``, the first
``--grpo-iterations``; at K = 1 with ``rollout_correction: tis``) train at K = 0 and K = 1 on the
same Ray placement for the same samples, each in a process of its own; then the paired eval
(``diffrl eval``: 100 test prompts x 4 seeds, the same noise for both) of each final checkpoint
against the base, and of K = 1 against K = 0. Writes ``docs/results/pipelining_curves.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from diffrl.bench.verdict import Claim, conclude, judge
from diffrl.launch import train
from diffrl.preflight import load_config

TRAIN_KEYS = ("perf/before_update_time", "perf/train_forward_backward_time", "perf/optimizer_time")
"""The rank's busy seconds of an iteration (its optimizer steps; summed over them)."""
ENGINE_STAGES = ("encode", "denoise", "decode")
"""The engine's busy seconds of an iteration (its sampling stages, ``perf/rollout_<stage>_time``)."""
TARGET = 1.5
"""Samples per second at K = 1 over K = 0, in every round."""


def run(recipe: str, out: Path, name: str, iterations: int, k: int, extra: list[str]) -> list[dict]:
    settings = {
        "run.output_dir": str(out / name),
        "runner": "ray",
        "train.iterations": iterations,
        "train.off_policy_steps": k,
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.time_budget_minutes": "null",
        "eval.enabled": "false",
        "parallel.engines": 1,
        "parallel.trainer_ranks": 1,
        "ray.num_reward_workers": 1,
        "ray.threads_per_actor": 1,
    }
    cfg = load_config(recipe, [f"{key}={v}" for key, v in settings.items()] + extra)
    shutil.rmtree(out / name, ignore_errors=True)  # a fresh run each time (diffrl refuses a used folder)
    t0 = time.time()
    history = train(cfg).history
    print(f"{name}: {iterations} iterations in {time.time() - t0:.1f} s (start-up included)", flush=True)
    return history


def summary(rows: list[dict], samples: int) -> dict[str, float]:
    """Medians over the counted iterations of one run."""
    it = statistics.median(r["perf/iteration_time"] for r in rows)
    rank = statistics.median(sum(r.get(key, 0.0) for key in TRAIN_KEYS) for r in rows)
    engine = statistics.median(
        sum(r.get(f"perf/rollout_{stage}_time", 0.0) for stage in ENGINE_STAGES) for r in rows
    )
    return {
        "iteration_s": it,
        "samples_per_s": samples / it,
        "rank_idle": max(0.0, 1.0 - rank / it),
        "engine_idle": max(0.0, 1.0 - engine / it),
        "staleness_max": max(r.get("rollout/staleness_max", 0.0) for r in rows),
    }


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


CURVES: dict[str, tuple[str, list[str], list[str]]] = {
    "nft": ("recipes/tiny_demo.yaml", [], []),
    "grpo": (
        "recipes/tiny_grpo_ocr.yaml",
        ["train.time_budget_minutes=null"],
        ["algorithm.params.rollout_correction=tis"],
    ),
}
"""name -> (recipe, overrides for both, overrides for K = 1)."""


def diffrl(*args: str) -> str:
    cmd = [sys.executable, "-m", "diffrl.cli", *args]
    print(f"== diffrl {' '.join(args)}", flush=True)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def paired(target: Path, baseline: Path | str, out: Path) -> tuple[float, float]:
    """``diffrl eval target --baseline baseline`` on 100 prompts x 4 seeds: (difference, SE)."""
    text = diffrl(
        "eval",
        str(target),
        "--baseline",
        str(baseline),
        "--num-prompts",
        "100",
        "--samples-per-prompt",
        "4",
        "--out",
        str(out),
    )
    m = re.search(r"difference ([+-][0-9.]+) \+- ([0-9.]+)", text)
    if m is None:
        raise RuntimeError(f"no paired difference in the eval's output:\n{text}")
    return float(m.group(1)), float(m.group(2))


def curves(out: Path, grpo_iterations: int) -> None:
    rows = []
    for name, (recipe, both, ahead) in CURVES.items():
        finals = {}
        for k in (0, 1):
            run_dir = out / f"{name}_k{k}"
            shutil.rmtree(run_dir, ignore_errors=True)
            extra = [f"train.iterations={grpo_iterations}"] if name == "grpo" else []
            t0 = time.time()
            diffrl(
                "train",
                recipe,
                "runner=ray",
                f"run.output_dir={run_dir}",
                f"train.off_policy_steps={k}",
                "train.save_every=0",
                *both,
                *extra,
                *(ahead if k else []),
            )
            minutes = (time.time() - t0) / 60
            finals[k] = run_dir / "checkpoints" / "final"
            curve = json.loads((run_dir / "eval_curve.json").read_text())
            gain, se = paired(finals[k], "base", run_dir / "paired_base")
            rows.append(
                {
                    "recipe": name,
                    "k": k,
                    "minutes": minutes,
                    "curve": [(e["step"], e["eval/reward_mean"]) for e in curve],
                    "gain": gain,
                    "se": se,
                }
            )
        diff, se = paired(finals[1], finals[0], out / f"{name}_k1_vs_k0")
        rows.append({"recipe": name, "k1_minus_k0": diff, "se": se})
    print()
    print(
        "| recipe | K | wall-clock (min) | in-run eval (64 prompts) by step | paired gain over base (100 x 4) |"
    )
    print("|---|---|---|---|---|")
    for r in rows:
        if "k" in r:
            curve = ", ".join(f"{step}: {v:.3f}" for step, v in r["curve"])
            print(
                f"| {r['recipe']} | {r['k']} | {r['minutes']:.1f} | {curve} | {r['gain']:+.4f} +- {r['se']:.4f} |"
            )
        else:
            print(f"| {r['recipe']} | K=1 - K=0 (paired) | | | {r['k1_minus_k0']:+.4f} +- {r['se']:.4f} |")
    path = Path("docs/results/pipelining_curves.json")
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curves", action="store_true", help="the learning curves instead of the speed")
    ap.add_argument("--grpo-iterations", type=int, default=8)
    ap.add_argument("--recipe", default="recipes/tiny_demo.yaml")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_pipelining")
    ap.add_argument("overrides", nargs="*", help="more KEY=VALUE overrides for both")
    args = ap.parse_args()
    out = Path(args.out)
    if args.curves:
        curves(out, args.grpo_iterations)
        return 0
    cfg = load_config(args.recipe, args.overrides)
    samples = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt

    results: dict[int, list[dict[str, float]]] = {0: [], 1: []}
    for r in range(args.rounds):
        for k in (0, 1):
            rows = run(args.recipe, out, f"k{k}_round{r}", args.iterations, k, args.overrides)
            results[k].append(summary(rows[args.warmup :], samples))
    ratios = [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(results[0], results[1])]

    print()
    print(
        f"{args.recipe}: {samples} samples an iteration; {args.rounds} runs each, interleaved; medians [min-max]"
    )
    print("| off_policy_steps | s / iteration | samples / s | rank idle | engine idle | staleness |")
    print("|---|---|---|---|---|---|")
    for k in (0, 1):
        rs = results[k]
        print(
            f"| {k} | {spread([x['iteration_s'] for x in rs])} | {spread([x['samples_per_s'] for x in rs])} "
            f"| {spread([x['rank_idle'] for x in rs])} | {spread([x['engine_idle'] for x in rs])} "
            f"| {max(x['staleness_max'] for x in rs):.0f} |"
        )
    verdict = judge(ratios, Claim(TARGET))  # each round's own ratio: the two ran side by side
    print(f"samples/s, K=1 over K=0 per round: {spread(ratios)}  (target >= {TARGET})  {verdict}")
    path = Path("docs/results/pipelining.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {"recipe": args.recipe, "samples_per_iteration": samples, "runs": results, "ratios": ratios},
            indent=1,
        )
    )
    print(f"wrote {path}")
    return conclude([verdict])  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
