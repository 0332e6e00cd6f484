"""What deterministic mode (``run.deterministic``, :mod:`diffrl.core.determinism`) costs: the main job's
recipe run with it on and off, side by side.

    python benchmarks/determinism.py [--recipe recipes/tiny_demo.yaml] [--rounds 3] [--iterations 4]
        [--threads 1] [--cpu 1] [--out docs/results/determinism.json]

Each run is the real ``diffrl train`` command in a process of its own (the pins are read when MKL
and oneDNN first run in a process), on the first ``--iterations`` of the recipe, in a temporary
folder. The runs alternate on, off, off, on, ... (``--rounds`` of each), so a noisy neighbour hits
both alike. Per run: the median ``perf/iteration_time`` of its iterations after the first (the
first carries one-off costs); over the runs: the median and the spread (min-max) of each mode and
the ratio on/off per round. ``--cpu N`` pins the runs to CPU N (``taskset``), ``--threads`` sets
``run.threads``. Also checks that two runs of a mode end with the same weights (the point of the mode).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def one_run(recipe: str, deterministic: bool, iterations: int, threads: int, cpu: int | None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="det-bench-"))
    try:
        diffrl = Path(sys.executable).with_name("diffrl")
        cmd = [
            str(diffrl),
            "train",
            recipe,
            f"train.iterations={iterations}",
            f"run.output_dir={folder}",
            f"run.deterministic={str(deterministic).lower()}",
            f"run.threads={threads}",
            "train.eval_every=0",
            "eval.enabled=false",
        ]
        if cpu is not None:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        t0 = time.time()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
        wall = time.time() - t0
        if done.returncode != 0:
            raise SystemExit(f"run failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        times = [
            row["perf/iteration_time"]
            for row in map(json.loads, (folder / "metrics.jsonl").read_text().splitlines())
            if "perf/iteration_time" in row
        ]
        weights = (folder / "checkpoints" / "final" / "trainable.safetensors").read_bytes()
        return {
            "deterministic": deterministic,
            "iteration_s": statistics.median(times[1:] or times),
            "wall_s": wall,
            "weights_sha256": hashlib.sha256(weights).hexdigest()[:16],
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="recipes/tiny_demo.yaml")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    runs = []
    for r in range(args.rounds):
        order = (True, False) if r % 2 == 0 else (False, True)
        pair = {}
        for mode in order:
            run = one_run(args.recipe, mode, args.iterations, args.threads, args.cpu)
            runs.append(run)
            pair[mode] = run
            print(
                f"round {r + 1} {'on ' if mode else 'off'}: {run['iteration_s']:.2f} s/iteration "
                f"(run {run['wall_s']:.0f} s, weights {run['weights_sha256']})",
                flush=True,
            )
        pair["ratio"] = pair[True]["iteration_s"] / pair[False]["iteration_s"]
        print(f"round {r + 1}: on/off = {pair['ratio']:.3f}", flush=True)
    summary = {}
    for mode, name in ((True, "on"), (False, "off")):
        xs = [x["iteration_s"] for x in runs if x["deterministic"] is mode]
        digests = {x["weights_sha256"] for x in runs if x["deterministic"] is mode}
        summary[name] = {
            "median_iteration_s": statistics.median(xs),
            "min": min(xs),
            "max": max(xs),
            "same_weights_every_run": len(digests) == 1,
        }
    ratios = [
        on["iteration_s"] / off["iteration_s"]
        for on, off in zip(
            [x for x in runs if x["deterministic"]], [x for x in runs if not x["deterministic"]], strict=True
        )
    ]
    summary["ratio_on_off"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    summary["setup"] = vars(args)
    for name in ("on", "off"):
        s = summary[name]
        print(
            f"{name:3s}: median {s['median_iteration_s']:.2f} s/iteration (spread {s['min']:.2f}-{s['max']:.2f}); "
            f"same weights in every run: {s['same_weights_every_run']}"
        )
    q = summary["ratio_on_off"]
    print(f"on/off per round: median {q['median']:.3f} (spread {q['min']:.3f}-{q['max']:.3f})")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
