"""Every algorithm side by side on the same tiny OCR task, seed and wall-clock budget.

    python benchmarks/algorithms.py [--minutes 10] [--eval-every 5] [--only NAME ...] [--out runs/bench_algorithms]

Each contender (:data:`CONTENDERS`: Flow-GRPO at the reference's geometry (the shipped recipe) and at 8 x 8,
GRPO-Guard, online DPO, DiffusionNFT, AWM) trains from the shipped base with its recipe for the
same training time (evals not counted), one after the other in fresh processes. The headline is the
paired eval of its final checkpoint against the base (``diffrl eval final --baseline base
--num-prompts 100 --samples-per-prompt 4``: all 100 test prompts x 4 seeds, the same noise for both
models): the gain in mean OCR reward and its standard error. Also printed: the in-run eval (64
test prompts) after the budget and at its best, the iterations done, and what the rollout keeps in
memory per sample (the collector's output tensors; the peak memory of one rollout in a fresh
process: ``VmHWM`` on CPU, max allocated on CUDA). Writes ``algorithms.png`` (the in-run eval
curves against training time) and ``algorithms.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import torch

GUARD_OVERRIDES = ["algorithm.params.ratio_norm=true", "algorithm.params.grad_reweight=true"]
CONTENDERS: dict[str, tuple[str, list[str]]] = {
    "flow_grpo": ("tiny_grpo_ocr", []),
    "flow_grpo_small": ("tiny_grpo_ocr_small", []),
    "grpo_guard": ("tiny_grpo_ocr_small", GUARD_OVERRIDES),
    "dpo": ("tiny_dpo_ocr", []),
    "diffusion_nft": ("tiny_nft_ocr", []),
    "awm": ("tiny_awm_ocr", []),
}
"""name -> (recipe, overrides). ``flow_grpo`` is the shipped recipe: the reference's geometry (48
groups x 24 images, two optimizer steps per epoch) with Flow-GRPO-Fast's 2-step window (the all-steps
``tiny_grpo_ocr_reference`` takes about 10 minutes an iteration here). ``flow_grpo_small`` is 8 groups x
8 images and one optimizer step of 64 per iteration; GRPO-Guard runs on it, so that the two differ
by the Guard options alone."""
TARGET_GAIN = 0.15


def memory_child(recipe: str) -> None:
    """One rollout of ``recipe``'s collector; prints what it keeps and the peak memory as JSON."""
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
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else peak_rss_bytes()
    print(json.dumps({"kept_bytes": kept, "peak_bytes": peak, "samples": len(batch)}))


def peak_rss_bytes() -> int:
    """This process's peak resident set (``VmHWM``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def paired_gain(run_dir: Path, prompts: int, samples: int) -> tuple[float, float]:
    """The final checkpoint against the base on the paired eval (the first ``prompts`` test prompts
    x ``samples`` seeds): (gain, standard error)."""
    cmd = [sys.executable, "-m", "diffrl.cli", "eval", str(run_dir / "checkpoints" / "final")]
    cmd += ["--baseline", "base", "--num-prompts", str(prompts), "--samples-per-prompt", str(samples)]
    cmd += ["--out", str(run_dir / "paired")]
    print(f"== paired eval: {' '.join(cmd[3:])}", flush=True)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    m = re.search(r"difference ([+-][0-9.]+) \+- ([0-9.]+)", out)
    if m is None:
        raise RuntimeError(f"no paired difference in the eval's output:\n{out}")
    return float(m.group(1)), float(m.group(2))


def run_algorithm(name: str, recipe: str, overrides: list[str], args, out: Path) -> list[dict]:
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
        *overrides,
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
    parser.add_argument("--paired-prompts", type=int, default=100, help="test prompts of the paired eval")
    parser.add_argument("--paired-samples", type=int, default=4, help="seeds per prompt of the paired eval")
    parser.add_argument("--out", default="runs/bench_algorithms")
    parser.add_argument("--only", nargs="*", choices=list(CONTENDERS), help="a subset of the contenders")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides for every run")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child)
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.only or list(CONTENDERS)
    curves, memory, paired = {}, {}, {}
    for name in names:
        recipe, overrides = CONTENDERS[name]
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", recipe],
            capture_output=True,
            text=True,
            check=True,
        )
        memory[name] = json.loads(child.stdout.strip().splitlines()[-1])
        curves[name] = run_algorithm(name, recipe, overrides, args, out)
        paired[name] = paired_gain(out / name, args.paired_prompts, args.paired_samples)

    base = curves[names[0]][0]["eval/reward_mean"]
    target = base + TARGET_GAIN
    rows = []
    for name in names:
        curve, mem = curves[name], memory[name]
        reached = time_to_reach(curve, target)
        gain, se = paired[name]
        rows.append(
            {
                "algorithm": name,
                "recipe": CONTENDERS[name][0],
                "paired_gain": gain,
                "paired_se": se,
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
        f"\nsame task, seed {args.seed}, {args.minutes} min of training each; paired eval: "
        f"{args.paired_prompts} test prompts x {args.paired_samples} seeds against the base; "
        f"in-run eval target = base {base:.3f} + 0.15"
    )
    print(
        "| algorithm | paired gain over the base +- SE | eval OCR after budget (best) | iterations | time to base+0.15 | rollout keeps / sample | rollout peak |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        reached = (
            f"{r['time_to_target_s'] / 60:.1f} min" if r["time_to_target_s"] is not None else "not reached"
        )
        print(
            f"| {r['algorithm']} | {r['paired_gain']:+.3f} +- {r['paired_se']:.3f} | {r['final']:.3f} ({r['best']:.3f}) | "
            f"{r['iterations']} | {reached} | "
            f"{r['kept_kib_per_sample']:.1f} KiB | {r['peak_mib_rollout']:.0f} MiB |"
        )
    print(f"plot: {out / 'algorithms.png'}")


if __name__ == "__main__":
    main()
