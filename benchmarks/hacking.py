"""A run that hacks its reward on the tiny world, with and without each regulariser.

    python benchmarks/hacking.py [--iterations 60] [--seeds 0 1]

The reward is ``tests.rewards:brightness`` (the images' mean value): Flow-GRPO on the tiny base at
8 x 8 px (2 prompts x 4 samples, 3 steps, LoRA r=4, lr 3e-3, clip 0.2) washes the images out
towards white and the samples of a prompt grow alike. ``jpeg_incompressibility`` rides along with
``weight: 0`` (scored, never trained on) as the watched reward: it falls as the images lose their
detail, on the very samples the trained reward scored (paired by construction). The variants:
none, ``kl_beta`` 0.04 and 0.5, GARDO's ``kl_gate`` 0.1 (kl_beta 0.5, gated by the watched
reward's ranks) and ``diversity_bonus``. Per run: the first iteration whose collapse alarm fires
at the tiny world's threshold (``monitor.near_duplicate_std: 40``, half the groups), and the means
over the last 10 iterations of the trained reward, the watched one and the within-group std.
Writes ``docs/results/hacking.json``; the page is ``docs/results/hacking.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from diffrl.preflight import load_config
from diffrl.train.loop import train

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.conftest import tiny_overrides  # noqa: E402
from tests.integration.test_hacking import HACKING  # noqa: E402

BASE = "{step_strategy: {name: all}, clip_range: 0.2"
VARIANTS = {
    "none": BASE + "}",
    "kl_beta 0.04": BASE + ", kl_beta: 0.04}",
    "kl_beta 0.5": BASE + ", kl_beta: 0.5}",
    "kl_gate 0.1 (kl_beta 0.5)": BASE
    + ", kl_beta: 0.5, kl_gate: 0.1, kl_gate_rewards: [jpeg_incompressibility]}",
    "diversity_bonus": BASE + ", diversity_bonus: true}",
}
WATCHED = "rollout/reward/jpeg_incompressibility/mean"


def one_run(params: str, seed: int, iterations: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = tiny_overrides(
            Path(tmp),
            **{
                **HACKING,  # the test's world and geometry: the benchmark runs it longer
                "run.seed": seed,
                "algorithm.params": params,
                "rewards": "[{name: tests.rewards:brightness}, {name: jpeg_incompressibility, weight: 0}]",
                "train.iterations": iterations,
            },
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            history = train(load_config("recipes/tiny_grpo_ocr_small.yaml", overrides)).history
    tail = history[-10:]

    def mean(key: str) -> float:
        return statistics.fmean(m[key] for m in tail)

    return {
        "seed": seed,
        "first_alarm": next((m["step"] for m in history if m["alarm/collapse"] == 1.0), None),
        "trained_first": history[0]["rollout/reward/raw_mean"],
        "trained_last10": mean("rollout/reward/raw_mean"),
        "watched_first": history[0][WATCHED],
        "watched_last10": mean(WATCHED),
        "within_group_std_first": history[0]["monitor/within_group_std"],
        "within_group_std_last10": mean("monitor/within_group_std"),
        "curve": [
            {k: m[k] for k in ("step", "rollout/reward/raw_mean", WATCHED, "monitor/within_group_std")}
            for m in history
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "hacking.json"))
    args = ap.parse_args()
    results = {name: [one_run(p, s, args.iterations) for s in args.seeds] for name, p in VARIANTS.items()}
    print(f"{'variant':28} {'alarm at':>10} {'trained':>16} {'watched kB':>16} {'within std':>16}")
    for name, runs in results.items():
        alarms = ",".join(str(r["first_alarm"]) for r in runs)
        cols = [
            "/".join(f"{r[k]:.3f}" for r in runs)
            for k in ("trained_last10", "watched_last10", "within_group_std_last10")
        ]
        print(f"{name:28} {alarms:>10} {cols[0]:>16} {cols[1]:>16} {cols[2]:>16}")
    Path(args.out).write_text(json.dumps({"iterations": args.iterations, "results": results}, indent=1))


if __name__ == "__main__":
    main()
