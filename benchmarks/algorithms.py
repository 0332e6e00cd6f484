"""Flow-GRPO, DiffusionNFT and AWM side by side on the same tiny OCR task, seed and wall-clock budget.

    python benchmarks/algorithms.py [--minutes 10] [--eval-every 5] [--out runs/bench_algorithms]

Each algorithm trains from the shipped base with its recipe (``recipes/tiny_{grpo,nft,awm}_ocr.yaml``)
for the same training time (evals not counted), one after the other in fresh processes. Prints for
each: the eval OCR reward after the budget, the training time to reach base + 0.15 (or "not
reached"), and what its rollout keeps in memory per sample (the collector's output tensors, and the
peak memory of one rollout in a fresh process: peak RSS on CPU, max allocated on CUDA). Writes
``algorithms.png`` (the three eval curves against training time) and ``algorithms.json``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import torch

ALGORITHMS = {"flow_grpo": "tiny_grpo_ocr", "diffusion_nft": "tiny_nft_ocr", "awm": "tiny_awm_ocr"}
TARGET_GAIN = 0.15


def memory_child(recipe: str) -> None:
    """One rollout of ``recipe``'s collector; prints what it keeps and the peak memory as JSON."""
    import resource

    from diffrl.algorithms.registry import build_algorithm
    from diffrl.data.prompts import load_prompts
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.sampling.collector import OnlineCollector

    cfg = load_config(f"recipes/{recipe}.yaml", ["eval.enabled=false"])
    family = load_family(cfg)
    family.transformer.requires_grad_(False).eval()
    spec = build_algorithm(cfg).collection_spec()
    collector = OnlineCollector(cfg, family, spec, load_prompts(cfg.data.prompts))
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    batch = collector.collect(0)
    kept = 0
    for v in vars(batch).values():
        tensors = v.tensors.values() if hasattr(v, "tensors") else [v]
        kept += sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))
    peak = (
        torch.cuda.max_memory_allocated()
        if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    print(json.dumps({"kept_bytes": kept, "peak_bytes": peak, "samples": len(batch)}))


def run_algorithm(name: str, recipe: str, args, out: Path) -> list[dict]:
    run_dir = out / name
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run each time (diffrl refuses a used folder)
    cmd = [
        sys.executable,
        "-m",
        "diffrl.cli",
        "train",
        f"recipes/{recipe}.yaml",
        f"run.output_dir={run_dir}",
        f"run.seed={args.seed}",
        "train.iterations=100000",
        f"train.time_budget_minutes={args.minutes}",
        f"train.eval_every={args.eval_every}",
        "train.save_every=0",
        *args.overrides,
    ]
    print(f"== {name}: {' '.join(cmd[3:])}", flush=True)
    subprocess.run(cmd, check=True)
    return json.loads((run_dir / "eval_curve.json").read_text())


def time_to_reach(curve: list[dict], target: float) -> float | None:
    for point in curve:
        if point["eval/reward_mean"] >= target:
            return point["train_time_s"]
    return None


def plot(curves: dict[str, list[dict]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, curve in curves.items():
        ax.plot(
            [p["train_time_s"] / 60 for p in curve],
            [p["eval/reward_mean"] for p in curve],
            marker="o",
            label=name,
        )
    ax.axhline(target, color="grey", linestyle="--", label="base + 0.15")
    ax.set_xlabel("training time (min, evals not counted)")
    ax.set_ylabel("eval OCR reward (test prompts)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--minutes", type=float, default=10.0, help="training-time budget per algorithm")
    parser.add_argument("--eval-every", type=int, default=5, help="iterations between evals")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/bench_algorithms")
    parser.add_argument("--only", nargs="*", choices=list(ALGORITHMS), help="a subset of the algorithms")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(ALGORITHMS)
    curves, memory = {}, {}
    for name in names:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", ALGORITHMS[name]],
            capture_output=True,
            text=True,
            check=True,
        )
        memory[name] = json.loads(child.stdout.strip().splitlines()[-1])
        curves[name] = run_algorithm(name, ALGORITHMS[name], args, out)

    base = curves[names[0]][0]["eval/reward_mean"]
    target = base + TARGET_GAIN
    rows = []
    for name in names:
        curve, mem = curves[name], memory[name]
        reached = time_to_reach(curve, target)
        rows.append(
            {
                "algorithm": name,
                "base": curve[0]["eval/reward_mean"],
                "final": curve[-1]["eval/reward_mean"],
                "best": max(p["eval/reward_mean"] for p in curve),
                "iterations": curve[-1]["step"],
                "time_to_target_s": reached,
                "kept_kib_per_sample": mem["kept_bytes"] / mem["samples"] / 1024,
                "peak_mib_rollout": mem["peak_bytes"] / 2**20,
            }
        )
    (out / "algorithms.json").write_text(
        json.dumps({"target": target, "rows": rows, "curves": curves}, indent=1)
    )
    plot(curves, target, out / "algorithms.png")

    print(
        f"\nsame task, seed {args.seed}, {args.minutes} min of training each; target = base {base:.3f} + 0.15"
    )
    print(
        "| algorithm | eval OCR after budget (best) | iterations | time to base+0.15 | rollout keeps / sample | rollout peak |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        reached = (
            f"{r['time_to_target_s'] / 60:.1f} min" if r["time_to_target_s"] is not None else "not reached"
        )
        print(
            f"| {r['algorithm']} | {r['final']:.3f} ({r['best']:.3f}) | {r['iterations']} | {reached} | "
            f"{r['kept_kib_per_sample']:.1f} KiB | {r['peak_mib_rollout']:.0f} MiB |"
        )
    print(f"plot: {out / 'algorithms.png'}")


if __name__ == "__main__":
    main()
