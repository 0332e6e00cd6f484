"""The cost of runner=ray against one process, on the tiny Flow-GRPO recipe, measured in one run.

    python benchmarks/scale.py [--iterations 6] [--recipe recipes/tiny_grpo_ocr_small.yaml]

Prints, side by side: the time per iteration of ``runner: local`` and of ``runner: ray`` with 1
rollout engine, 1 FSDP2 trainer rank and 1 OCR worker (the first iteration is warm-up and not
counted; medians), the Ray overhead (target <= 15%), and the weight sync per update: time and bytes sent
for a LoRA run and for a full fine-tune (a Ray run with ``model.lora: null``). Writes
``docs/results/scale.json``. The two runs go one after the other, so the overhead's verdict pairs
every counted Ray iteration with every counted local one: PASS or MISS only when all those ratios
are on the same side of 1.15, else inconclusive and exit code 4 (``diffrl.bench.verdict``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

from diffrl.bench.verdict import Claim, conclude, judge, unpaired_ratios
from diffrl.launch import train
from diffrl.preflight import load_config


def run(recipe: str, out: Path, name: str, iterations: int, **overrides) -> list[dict]:
    base = {
        "run.output_dir": str(out / name),
        "train.iterations": iterations,
        "train.eval_every": 0,
        "train.save_every": 0,
        "train.time_budget_minutes": "null",
        "eval.enabled": "false",
        "parallel.engines": 1,
        "parallel.trainer_ranks": 1,
        "ray.num_reward_workers": 1,
        **overrides,
    }
    cfg = load_config(recipe, [f"{k}={v}" for k, v in base.items()])
    shutil.rmtree(out / name, ignore_errors=True)  # a fresh run each time (diffrl refuses a used folder)
    t0 = time.time()
    history = train(cfg).history
    print(f"{name}: {iterations} iterations in {time.time() - t0:.1f} s (start-up included)", flush=True)
    return history


TARGET_OVERHEAD = 0.15
"""The most an iteration under ``runner: ray`` may take over one in one process, as a fraction."""


def median(rows: list[dict], key: str, skip: int = 1) -> float:
    """The median over the iterations after ``skip`` warm-up ones (robust to a noisy neighbour)."""
    return statistics.median(values(rows, key, skip))


def values(rows: list[dict], key: str, skip: int = 1) -> list[float]:
    """``key`` of each iteration after ``skip`` warm-up ones."""
    return [r[key] for r in rows[skip:] if key in r]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipe", default="recipes/tiny_grpo_ocr_small.yaml")
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--out", default="runs/bench_scale")
    args = ap.parse_args()
    out = Path(args.out)

    local = run(args.recipe, out, "local", args.iterations, runner="local")
    ray_lora = run(args.recipe, out, "ray_lora", args.iterations, runner="ray")
    ray_full = run(args.recipe, out, "ray_full", 2, runner="ray", **{"model.lora": "null", "train.lr": 1e-6})

    t_local, t_ray = median(local, "perf/iteration_time"), median(ray_lora, "perf/iteration_time")
    result = {
        "iterations_counted": args.iterations - 1,
        "local_iteration_s": t_local,
        "ray_iteration_s": t_ray,
        "ray_overhead": t_ray / t_local - 1.0,
        "local_rollout_s": median(local, "perf/rollout_time"),
        "ray_rollout_s": median(ray_lora, "perf/rollout_time"),
        "lora_sync_s": median(ray_lora, "perf/weight_sync_time", skip=0),
        "lora_sync_bytes": ray_lora[0]["sync/bytes"],
        "full_sync_s": median(ray_full, "perf/weight_sync_time", skip=0),
        "full_sync_bytes": ray_full[0]["sync/bytes"],
        "checksum_match": min(r["sync/checksum_match"] for r in ray_lora + ray_full),
    }
    print()
    print(f"time per iteration  local {t_local:.2f} s | ray (1 engine, 1 rank) {t_ray:.2f} s")
    # the two runs ran one after the other, not in rounds: every pairing of a Ray iteration with a
    # local one, whose extremes are the widest the measurements allow
    verdict = judge(
        unpaired_ratios(values(ray_lora, "perf/iteration_time"), values(local, "perf/iteration_time")),
        Claim(1 + TARGET_OVERHEAD, at_least=False, fmt="{:.3f}x"),
        label="pairings",
    )
    print(
        f"ray overhead        {100 * result['ray_overhead']:+.1f}%  (target <= +{TARGET_OVERHEAD:.0%})  "
        f"ray / local per iteration: {verdict}"
    )
    print(
        f"rollout             local {result['local_rollout_s']:.2f} s | ray {result['ray_rollout_s']:.2f} s"
    )
    print(
        f"weight sync/update  LoRA {result['lora_sync_s'] * 1e3:.1f} ms, {result['lora_sync_bytes'] / 2**20:.2f} MiB"
        f" | full {result['full_sync_s'] * 1e3:.1f} ms, {result['full_sync_bytes'] / 2**20:.2f} MiB"
        f"  (full/LoRA bytes {result['full_sync_bytes'] / result['lora_sync_bytes']:.1f}x)"
    )
    print(f"checksums matched   {bool(result['checksum_match'])}")
    path = Path("docs/results/scale.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"wrote {path}")
    return conclude([verdict])  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
