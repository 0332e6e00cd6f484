"""What deterministic mode (``run.deterministic``, :mod:`diffrl.core.determinism`) costs: recipes run
in the portable mode (the default), this CPU kind's mode (``true``) and with the mode off, side by side.

    python benchmarks/determinism.py [--recipe recipes/tiny_demo.yaml ...] [--rounds 3]
        [--iterations 4] [--threads 1] [--cpu 1] [--out docs/results/determinism.json]

Each run is the real ``diffrl train`` command in a process of its own (the pins are read when MKL,
oneDNN and ATen first run in a process), on the first ``--iterations`` of the recipe, in a temporary
folder, evals off. The three modes run in a rotated order each round (portable, kind, off; then
kind, off, portable; ...), so a noisy neighbour hits all alike. Per run: the median
``perf/iteration_time`` of its iterations after the first (the first carries one-off costs); over
the runs: the median and the spread (min-max) of each mode, and each mode's ratio to off per round.
``--cpu N`` pins the runs to CPU N (``taskset``), ``--threads`` sets ``run.threads``. Also checks
that the runs of a mode end with the same weights (the point of the mode), and says whether the
portable and the kind mode compute the same bits here (they do where the CPU's own level is the
portable one and MKL's own branch is its compatible one: not expected).
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
sys.path.insert(0, str(ROOT))

from diffrl.core.pins import cpu_flags, cpu_model, cpu_vendor  # noqa: E402

MODES = {"portable": "portable", "kind": "true", "off": "false"}
"""Name -> the ``run.deterministic`` value."""


def one_run(recipe: str, mode: str, iterations: int, threads: int, cpu: int | None) -> dict:
    folder = Path(tempfile.mkdtemp(prefix="det-bench-"))
    try:
        diffrl = Path(sys.executable).with_name("diffrl")
        cmd = [
            str(diffrl),
            "train",
            recipe,
            f"train.iterations={iterations}",
            f"run.output_dir={folder}",
            f"run.deterministic={MODES[mode]}",
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
        line = next((x.strip() for x in done.stdout.splitlines() if "deterministic mode" in x), "")
        return {
            "mode": mode,
            "iteration_s": statistics.median(times[1:] or times),
            "wall_s": wall,
            "weights_sha256": hashlib.sha256(weights).hexdigest()[:16],
            "start_up_line": line,
        }
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench(recipe: str, args: argparse.Namespace) -> dict:
    names = list(MODES)
    runs = []
    for r in range(args.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        got = {}
        for mode in order:
            run = one_run(recipe, mode, args.iterations, args.threads, args.cpu)
            runs.append({**run, "round": r + 1})
            got[mode] = run
            print(
                f"{recipe} round {r + 1} {mode:8s}: {run['iteration_s']:.2f} s/iteration "
                f"(run {run['wall_s']:.0f} s, weights {run['weights_sha256']})",
                flush=True,
            )
        print(
            f"{recipe} round {r + 1}: portable/off {got['portable']['iteration_s'] / got['off']['iteration_s']:.3f}, "
            f"kind/off {got['kind']['iteration_s'] / got['off']['iteration_s']:.3f}",
            flush=True,
        )
    summary: dict = {"runs": runs}
    for mode in names:
        xs = [x["iteration_s"] for x in runs if x["mode"] == mode]
        summary[mode] = {
            "median_iteration_s": statistics.median(xs),
            "min": min(xs),
            "max": max(xs),
            "same_weights_every_run": len({x["weights_sha256"] for x in runs if x["mode"] == mode}) == 1,
            "start_up_line": next(x["start_up_line"] for x in runs if x["mode"] == mode),
        }
    for mode in ("portable", "kind"):
        ratios = [
            a["iteration_s"] / b["iteration_s"]
            for a, b in zip(
                [x for x in runs if x["mode"] == mode], [x for x in runs if x["mode"] == "off"], strict=True
            )
        ]
        summary[f"ratio_{mode}_off"] = {
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
        }
    summary["portable_bits_equal_kind_bits"] = {
        x["weights_sha256"] for x in runs if x["mode"] == "portable"
    } == {x["weights_sha256"] for x in runs if x["mode"] == "kind"}
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", action="append", help="a recipe (repeat for more); default: the main job's")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iterations", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--cpu", type=int, default=None)
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    recipes = args.recipe or ["recipes/tiny_demo.yaml"]
    flags = cpu_flags()
    result = {
        "machine": {
            "cpu": cpu_model(),
            "vendor": cpu_vendor(),
            "isa": sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))),
        },
        "setup": {**vars(args), "recipe": recipes},
        "recipes": {},
    }
    for recipe in recipes:
        result["recipes"][recipe] = s = bench(recipe, args)
        for mode in MODES:
            m = s[mode]
            print(
                f"{recipe} {mode:8s}: median {m['median_iteration_s']:.2f} s/iteration "
                f"(spread {m['min']:.2f}-{m['max']:.2f}); same weights in every run: {m['same_weights_every_run']}"
            )
        for mode in ("portable", "kind"):
            q = s[f"ratio_{mode}_off"]
            print(
                f"{recipe} {mode}/off per round: median {q['median']:.3f} (spread {q['min']:.3f}-{q['max']:.3f})"
            )
        print(f"{recipe} portable and kind give the same weights here: {s['portable_bits_equal_kind_bits']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
