"""A run that hacks its reward on the tiny world, with and without each regulariser.

    python benchmarks/hacking.py [--iterations 60] [--seeds 0 1 2] [--eval-every 5]

The reward is ``tests.rewards:brightness`` (the images' mean value): Flow-GRPO on the tiny base at
8 x 8 px (2 prompts x 4 samples, 3 steps, LoRA r=4, lr 3e-3, clip 0.2) washes the images out
towards white and the samples of a prompt grow alike. The held-out judges are
``tests.rewards:contrast`` (each image's pixel std: the detail a washed-out image loses) and
``jpeg_incompressibility`` (the JPEG size in kB), watched the way a user watches one:
``eval.watch``, scored at every eval (every ``--eval-every`` iterations; 16 test prompts x 2
samples with the eval's fixed noise, so two evals are paired) and never trained on, with
``eval.watch_alarm`` (``--k-se``, window 1). ``contrast`` also rides along in the rollout with
``weight: 0``: GARDO's gate ranks the samples by it.

The variants: none, ``kl_beta`` 0.04 and 0.5, GARDO's ``kl_gate`` 0.1 (kl_beta 0.5), the pixel
``diversity_bonus`` and per-group reward clipping (``adv_clip_max: 1``: each sample's
group-normalised reward clipped to one group std). Per run: the first iteration the collapse alarm
fires at the tiny world's threshold (``monitor.near_duplicate_std: 40``, half the groups) and the
first the hacking alarm fires; the paired eval gains over the base (trained and watched, with SE)
at the last eval; the within-group std of the rollouts (first and the mean of the last 10).
Writes ``docs/results/hacking.json`` and, for the first seed, each variant's report figure
(``trust.png``) as ``docs/results/hacking/<variant>.png``; the page is ``docs/results/hacking.md``.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

from diffrl.launch import train
from diffrl.preflight import load_config

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
    + ", kl_beta: 0.5, kl_gate: 0.1, kl_gate_rewards: ['tests.rewards:contrast']}",
    "diversity_bonus": BASE + ", diversity_bonus: true}",
    "adv_clip_max 1": BASE + ", adv_clip_max: 1.0}",
}
TRAINED = "eval/reward_gain"
WATCHED = "eval/watch/tests.rewards:contrast_gain"
JPEG = "eval/watch/jpeg_incompressibility_gain"


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def one_run(
    params: str, seed: int, iterations: int, eval_every: int, k_se: float, figure: Path | None
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = tiny_overrides(
            Path(tmp),
            **{
                **HACKING,  # the test's world and geometry: the benchmark runs it longer, with evals
                "run.seed": seed,
                "algorithm.params": params,
                "rewards": "[{name: tests.rewards:brightness}, {name: tests.rewards:contrast, weight: 0}]",
                "train.iterations": iterations,
                "train.eval_every": eval_every,
                "eval.enabled": "true",
                "eval.num_prompts": 16,
                "eval.samples_per_prompt": 2,
                "eval.batch_size": 32,
                "eval.rewards": "[{name: tests.rewards:brightness}]",
                "eval.watch": "[{name: tests.rewards:contrast}, {name: jpeg_incompressibility}]",
                "eval.watch_alarm": f"{{k_se: {k_se}, window: 1}}",
            },
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = train(load_config("recipes/tiny_grpo_ocr_small.yaml", overrides))
        if figure is not None:
            figure.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / "run" / "trust.png", figure)
    history = result.history
    evals = [m for m in result.evals if TRAINED in m]
    tail = history[-10:]
    last = evals[-1]
    return {
        "seed": seed,
        "collapse_alarm": next((m["step"] for m in history if m.get("alarm/collapse") == 1.0), None),
        "hacking_alarm": next(
            (m["step"] for m in result.evals if m.get("alarm/reward_hacking") == 1.0), None
        ),
        "trained_gain": last[TRAINED],
        "trained_gain_se": last[TRAINED + "_se"],
        "watched_gain": last[WATCHED],
        "watched_gain_se": last[WATCHED + "_se"],
        "jpeg_gain": last[JPEG],
        "jpeg_gain_se": last[JPEG + "_se"],
        "within_group_std_first": history[0]["monitor/within_group_std"],
        "within_group_std_last10": statistics.fmean(m["monitor/within_group_std"] for m in tail),
        "evals": [
            {
                k: m[k]
                for k in ("step", TRAINED, TRAINED + "_se", WATCHED, WATCHED + "_se", JPEG, JPEG + "_se")
                if k in m
            }
            for m in evals
        ],
        "curve": [
            {
                k: m[k]
                for k in ("step", "rollout/reward/raw_mean", "monitor/within_group_std", "alarm/collapse")
                if k in m
            }
            for m in history
        ],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--k-se", type=float, default=3.0)
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "hacking.json"))
    args = ap.parse_args()
    figures = Path(args.out).with_suffix("")
    results = {
        name: [
            one_run(
                p,
                s,
                args.iterations,
                args.eval_every,
                args.k_se,
                figures / f"{slug(name)}.png" if i == 0 else None,
            )
            for i, s in enumerate(args.seeds)
        ]
        for name, p in VARIANTS.items()
    }
    print(
        f"{'variant':26} {'collapse at':>12} {'hacking at':>12} {'trained gain (SE)':>24} "
        f"{'watched contrast gain (SE)':>30} {'within std':>18}"
    )

    def alarm(a: int | None) -> str:
        return "-" if a is None else str(a)

    for name, runs in results.items():
        cols = [
            ",".join(alarm(r["collapse_alarm"]) for r in runs),
            ",".join(alarm(r["hacking_alarm"]) for r in runs),
            " ".join(f"{r['trained_gain']:+.3f}({r['trained_gain_se']:.3f})" for r in runs),
            " ".join(f"{r['watched_gain']:+.4f}({r['watched_gain_se']:.4f})" for r in runs),
            "/".join(f"{r['within_group_std_last10']:.0f}" for r in runs),
        ]
        print(f"{name:26} {cols[0]:>12} {cols[1]:>12} {cols[2]:>24} {cols[3]:>30} {cols[4]:>18}")
    payload = {
        "iterations": args.iterations,
        "eval_every": args.eval_every,
        "k_se": args.k_se,
        "results": results,
    }
    Path(args.out).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
