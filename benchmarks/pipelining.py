"""Samples per second of the pipelined loop (``train.off_policy_steps: 1``: the next rollout drawn
while the ranks train) against the synchronous one (``0``) at its best, measured side by side.

    python benchmarks/pipelining.py [--recipe recipes/tiny_demo.yaml] [--rounds 5] [--iterations 5]
    python benchmarks/pipelining.py --curves [--curve-recipes nft,grpo] [--seeds 0 1 2] [--against-base]

The contenders (:data:`MODES`), each a ``diffrl`` training run of the recipe with no eval or
checkpoints: the pipelined loop on ``runner: ray`` (1 rollout engine, 1 FSDP2 trainer rank, 1
reward worker) with the default threads (``ray.threads_per_actor: null``: the cores shared by the
actors that compute at once, so 1 each on 2 cores at K = 1); and the synchronous loop in every
layout a user could pick for speed: the same Ray placement with the default threads (the engine and
the rank alternate, so each gets every core), the same with one thread per actor, and ``runner:
local`` (one process, every core, no Ray). Each round runs every contender once, in an order that
rotates from round to round, so a noisy neighbour hits all alike; each run's first ``--warmup``
iterations are left out. Per run: the median seconds per iteration and samples per second; over the
runs: the median and the spread (min-max) of each contender, each actor's idle fraction (the share
of the iteration's wall-clock it did not compute: the trainer rank's = 1 - (its update, old-policy
update included) / iteration, the engine's = 1 - (its sampling stages) / iteration). The headline is
the pipelined run's samples/s over the **best synchronous contender's** (the one with the highest
median), per round, judged against :data:`TARGET` (``diffrl.bench.verdict``: PASS or MISS only
when every round is on one side, else inconclusive and exit code 4); each synchronous layout's
ratio is printed too. Writes ``docs/results/pipelining.json``.

``--curves``: what the staleness costs in learning. The main job's DiffusionNFT recipe
(``tiny_demo``, all its iterations) and the tiny Flow-GRPO recipe (``tiny_grpo_ocr``, the first
``--grpo-iterations``; at K = 1 with ``rollout_correction: tis``) train at K = 0 and K = 1 on the
same Ray placement for the same samples, each in a process of its own; then the paired eval
(``diffrl eval``: 100 test prompts x 4 seeds, the same noise for both) of each final checkpoint
against the base (``--against-base``), and of K = 1 against K = 0, for each of ``--seeds``; over the
seeds, the mean paired difference and its standard error. Writes ``pipelining_curves.json`` under
``--out``.
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
TARGET = 1.3
"""Samples per second of the pipelined run over the best synchronous one, in every round."""
PIPELINED = "pipelined (ray, K=1, default threads)"
MODES: dict[str, dict[str, object]] = {
    PIPELINED: {"runner": "ray", "train.off_policy_steps": 1, "ray.threads_per_actor": "null"},
    "synchronous (ray, default threads)": {
        "runner": "ray",
        "train.off_policy_steps": 0,
        "ray.threads_per_actor": "null",
    },
    "synchronous (ray, 1 thread per actor)": {
        "runner": "ray",
        "train.off_policy_steps": 0,
        "ray.threads_per_actor": 1,
    },
    "synchronous (local, one process)": {"runner": "local", "train.off_policy_steps": 0},
}
"""Contender -> its settings (over :data:`COMMON`)."""
COMMON: dict[str, object] = {
    "train.eval_every": 0,
    "train.save_every": 0,
    "train.time_budget_minutes": "null",
    "eval.enabled": "false",
    "parallel.engines": 1,
    "parallel.trainer_ranks": 1,
    "ray.num_reward_workers": 1,
}


def run(recipe: str, out: Path, name: str, iterations: int, mode: dict, extra: list[str]) -> list[dict]:
    settings = {
        **COMMON,
        **mode,
        "run.output_dir": str(out / name),
        "train.iterations": iterations,
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
        "rollout_s": statistics.median(r.get("perf/rollout_time", 0.0) for r in rows),
        "train_s": rank,
        "reward_wait_s": statistics.median(r.get("perf/reward_wait_time", 0.0) for r in rows),
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


def curves(out: Path, grpo_iterations: int, names: list[str], seeds: list[int], against_base: bool) -> Path:
    """Each recipe of ``names`` at K = 0 and K = 1 for each of ``seeds`` (``run.seed``; the rollouts,
    the initial noise and the eval's seeds follow it), the same samples each way; per seed the paired
    eval of K = 1 against K = 0, and with ``against_base`` each run's against the base; over the seeds
    the mean of the paired differences and its standard error (sample standard deviation / sqrt(n)).
    Writes ``pipelining_curves.json`` under ``out``."""
    rows = []
    for name in names:
        recipe, both, ahead = CURVES[name]
        differences = []
        for seed in seeds:
            finals = {}
            for k in (0, 1):
                run_dir = out / f"{name}_seed{seed}_k{k}"
                shutil.rmtree(run_dir, ignore_errors=True)
                extra = [f"train.iterations={grpo_iterations}"] if name == "grpo" else []
                t0 = time.time()
                diffrl(
                    "train",
                    recipe,
                    "runner=ray",
                    f"run.output_dir={run_dir}",
                    f"run.seed={seed}",
                    f"train.off_policy_steps={k}",
                    "train.save_every=0",
                    *both,
                    *extra,
                    *(ahead if k else []),
                )
                minutes = (time.time() - t0) / 60
                finals[k] = run_dir / "checkpoints" / "final"
                curve = json.loads((run_dir / "eval_curve.json").read_text())
                row = {
                    "recipe": name,
                    "seed": seed,
                    "k": k,
                    "minutes": minutes,
                    "curve": [(e["step"], e["eval/reward_mean"]) for e in curve],
                }
                if against_base:
                    row["gain"], row["se"] = paired(finals[k], "base", run_dir / "paired_base")
                rows.append(row)
            diff, se = paired(finals[1], finals[0], out / f"{name}_seed{seed}_k1_vs_k0")
            differences.append(diff)
            rows.append({"recipe": name, "seed": seed, "k1_minus_k0": diff, "se": se})
        n = len(differences)
        mean = statistics.fmean(differences)
        se = statistics.stdev(differences) / n**0.5 if n > 1 else float("nan")
        rows.append({"recipe": name, "seeds": seeds, "mean_k1_minus_k0": mean, "se_over_seeds": se})
    print()
    print("| recipe | seed | K | wall-clock (min) | in-run eval (64 prompts) by step | paired (100 x 4) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        if "k" in r:
            curve = ", ".join(f"{step}: {v:.3f}" for step, v in r["curve"])
            gain = f"{r['gain']:+.4f} +- {r['se']:.4f} over base" if "gain" in r else ""
            print(f"| {r['recipe']} | {r['seed']} | {r['k']} | {r['minutes']:.1f} | {curve} | {gain} |")
        elif "k1_minus_k0" in r:
            print(
                f"| {r['recipe']} | {r['seed']} | K=1 - K=0 | | | {r['k1_minus_k0']:+.4f} +- {r['se']:.4f} |"
            )
        else:
            print(
                f"| {r['recipe']} | {len(r['seeds'])} seeds | mean K=1 - K=0 | | | "
                f"{r['mean_k1_minus_k0']:+.4f} +- {r['se_over_seeds']:.4f} (SE over the seeds) |"
            )
    path = out / "pipelining_curves.json"
    path.write_text(json.dumps(rows, indent=1))
    print(f"wrote {path}")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--curves", action="store_true", help="the learning curves instead of the speed")
    ap.add_argument("--grpo-iterations", type=int, default=8)
    ap.add_argument("--curve-recipes", default="nft,grpo", help=f"with --curves: of {', '.join(CURVES)}")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="with --curves: run.seed of each pair")
    ap.add_argument(
        "--against-base", action="store_true", help="with --curves: each run's paired eval vs base"
    )
    ap.add_argument("--recipe", default="recipes/tiny_demo.yaml")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--out", default="runs/bench_pipelining")
    ap.add_argument("overrides", nargs="*", help="more KEY=VALUE overrides for both")
    args = ap.parse_args()
    out = Path(args.out)
    if args.curves:
        names = [n.strip() for n in args.curve_recipes.split(",") if n.strip()]
        unknown = [n for n in names if n not in CURVES]
        if unknown:
            ap.error(f"--curve-recipes: unknown {unknown}; known: {', '.join(CURVES)}")
        curves(out, args.grpo_iterations, names, args.seeds, args.against_base)
        return 0
    cfg = load_config(args.recipe, args.overrides)
    samples = cfg.rollout.batch_size * cfg.rollout.n_samples_per_prompt

    names = list(MODES)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in names}
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]  # rotated: each goes first in turn
        for name in order:
            slug = re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")
            rows = run(args.recipe, out, f"{slug}_round{r}", args.iterations, MODES[name], args.overrides)
            results[name].append(summary(rows[args.warmup :], samples))

    def per_round(sync: str) -> list[float]:
        return [b["samples_per_s"] / a["samples_per_s"] for a, b in zip(results[sync], results[PIPELINED])]

    synchronous = [n for n in names if n != PIPELINED]
    best = max(synchronous, key=lambda n: statistics.median(x["samples_per_s"] for x in results[n]))
    print()
    print(
        f"{args.recipe}: {samples} samples an iteration; {args.rounds} rounds, every contender once a "
        "round in a rotated order; medians [min-max]"
    )
    print("| contender | s / iteration | samples / s | rank idle | engine idle | staleness |")
    print("|---|---|---|---|---|---|")
    for name in names:
        rs = results[name]
        print(
            f"| {name} | {spread([x['iteration_s'] for x in rs])} | {spread([x['samples_per_s'] for x in rs])} "
            f"| {spread([x['rank_idle'] for x in rs])} | {spread([x['engine_idle'] for x in rs])} "
            f"| {max(x['staleness_max'] for x in rs):.0f} |"
        )
    for name in synchronous:
        print(f"samples/s, pipelined over {name}, per round: {spread(per_round(name))}")
    ratios = per_round(best)
    verdict = judge(ratios, Claim(TARGET))  # each round's own ratio: the two ran in the same round
    print(
        f"samples/s, pipelined over the best synchronous ({best}) per round: {spread(ratios)}  "
        f"(target >= {TARGET})  {verdict}"
    )
    path = Path("docs/results/pipelining.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps(
            {
                "recipe": args.recipe,
                "command": " ".join(["python", "benchmarks/pipelining.py", *sys.argv[1:]]),
                "samples_per_iteration": samples,
                "rounds": args.rounds,
                "iterations": args.iterations,
                "warmup": args.warmup,
                "modes": MODES,
                "runs": results,
                "best_synchronous": best,
                "ratios": {name: per_round(name) for name in synchronous},
            },
            indent=1,
        )
    )
    print(f"wrote {path}")
    return conclude([verdict])  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
