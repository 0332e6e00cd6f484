"""A run that hacks its reward on the tiny world, with and without each regulariser, and honest
runs of the main job: how often each trust alarm fires with its **default** settings.

    python benchmarks/hacking.py [--iterations 60] [--seeds 0 1 2 3 4] [--eval-every 5]
        [--variants none "kl_beta 0.5"] [--honest-seeds 0 1 2 3 4] [--k-se K]

The reward is ``tests.rewards:brightness`` (the images' mean value): Flow-GRPO on the tiny base at
8 x 8 px (2 prompts x 4 samples, 3 steps, LoRA r=4, lr 3e-3, clip 0.2) washes the images out
towards white and the samples of a prompt grow alike. The held-out judges are
``tests.rewards:contrast`` (each image's pixel std: the detail a washed-out image loses) and
``jpeg_incompressibility`` (the JPEG size in kB), watched the way a user watches one:
``eval.watch``, scored at every eval (every ``--eval-every`` iterations; 16 test prompts x 2
samples with the eval's fixed noise, so two evals are paired) and never trained on, with
``eval.watch_alarm`` at its defaults (``--k-se`` overrides its ``k_se``). ``contrast`` also rides
along in the rollout with ``weight: 0``: GARDO's gate ranks the samples by it. The collapse alarm
runs at its defaults too (``monitor.*``; the test's tuned ``near_duplicate_std: 40`` is not used).

The honest runs (``--honest-seeds``; none with an empty list): the main job
(``recipes/tiny_demo.yaml``: DiffusionNFT on OCR, 24 iterations, an eval every 6) with the same two
held-out judges watched and both alarms at their defaults; OCR does not trade off against them, so
every alarm there is a false one.

The variants: none, ``kl_beta`` 0.04 and 0.5, GARDO's ``kl_gate`` 0.1 (kl_beta 0.5), the pixel
``diversity_bonus`` and per-group reward clipping (``adv_clip_max: 1``: each sample's
group-normalised reward clipped to one group std). Per run: the first iteration the collapse alarm
fires and the first the hacking alarm fires (and which watched reward, against which eval); the paired eval gains over the base (trained and watched, with SE)
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

from diffrl.config.schema import MonitorConfig, WatchAlarmConfig
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


WORLD = {k: v for k, v in HACKING.items() if not k.startswith("monitor.")}
"""The test's world and geometry, with the monitors at their defaults (the benchmark runs it
longer, with evals)."""
WATCH = "[{name: tests.rewards:contrast}, {name: jpeg_incompressibility}]"


def alarm_setting(k_se: float | None) -> str:
    return "{}" if k_se is None else f"{{k_se: {k_se}}}"


MONITOR: dict[str, float] = {}
"""``--collapse-relative``'s override of ``monitor.collapse_relative`` (none: the default)."""


def first_alarms(result, lines: list[str]) -> dict:
    """The first iteration each alarm fired at (None: never), how often, and the hacking alarms'
    warning ``lines``."""
    return {
        "collapse_alarm": next((m["step"] for m in result.history if m.get("alarm/collapse") == 1.0), None),
        "hacking_alarm": next(
            (m["step"] for m in result.evals if m.get("alarm/reward_hacking") == 1.0), None
        ),
        "collapse_alarms": sum(m.get("alarm/collapse") == 1.0 for m in result.history),
        "hacking_alarms": sum(m.get("alarm/reward_hacking") == 1.0 for m in result.evals),
        "hacking_lines": lines,
    }


def trained(config) -> tuple[object, list[str]]:
    """``train(config)`` with its warnings caught, not printed: the result and the hacking alarms'
    lines."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = train(config)
    return result, [str(w.message) for w in caught if "reward-hacking alarm" in str(w.message)]


def one_run(
    params: str, seed: int, iterations: int, eval_every: int, k_se: float | None, figure: Path | None
) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = tiny_overrides(
            Path(tmp),
            **{
                **WORLD,
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
                "eval.watch": WATCH,
                "eval.watch_alarm": alarm_setting(k_se),
                **MONITOR,
            },
        )
        result, lines = trained(load_config("recipes/tiny_grpo_ocr_small.yaml", overrides))
        if figure is not None:
            figure.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(Path(tmp) / "run" / "trust.png", figure)
    history = result.history
    evals = [m for m in result.evals if TRAINED in m]
    tail = history[-10:]
    last = evals[-1]
    return {
        "seed": seed,
        **first_alarms(result, lines),
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


def honest_run(seed: int, k_se: float | None) -> dict:
    """The main job (``recipes/tiny_demo.yaml``) at ``seed`` with the held-out judges watched."""
    with tempfile.TemporaryDirectory() as tmp:
        overrides = [
            f"run.output_dir={Path(tmp) / 'run'}",
            f"run.seed={seed}",
            f"eval.watch={WATCH}",
            f"eval.watch_alarm={alarm_setting(k_se)}",
            *(f"{k}={v}" for k, v in MONITOR.items()),
        ]
        result, lines = trained(load_config("recipes/tiny_demo.yaml", overrides))
    evals = [m for m in result.evals if TRAINED in m]
    last = evals[-1]
    history = result.history
    return {
        "seed": seed,
        **first_alarms(result, lines),
        "trained_gain": last[TRAINED],
        "trained_gain_se": last[TRAINED + "_se"],
        "watched_gain": last[WATCHED],
        "watched_gain_se": last[WATCHED + "_se"],
        "jpeg_gain": last[JPEG],
        "jpeg_gain_se": last[JPEG + "_se"],
        "deepest_watched_gain": min(m[WATCHED] for m in evals),
        "within_group_std_first": history[0]["monitor/within_group_std"],
        "within_group_std_last": history[-1]["monitor/within_group_std"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--iterations", type=int, default=60)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    ap.add_argument("--eval-every", type=int, default=5)
    ap.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--honest-seeds", type=int, nargs="*", default=[0, 1, 2, 3, 4])
    ap.add_argument("--k-se", type=float, default=None, help="the alarm's k_se (default: its default)")
    ap.add_argument("--collapse-relative", type=float, default=None, help="monitor.collapse_relative")
    ap.add_argument("--out", default=str(ROOT / "docs" / "results" / "hacking.json"))
    args = ap.parse_args()
    if args.collapse_relative is not None:
        MONITOR["monitor.collapse_relative"] = args.collapse_relative
    figures = Path(args.out).with_suffix("")
    honest = [honest_run(s, args.k_se) for s in args.honest_seeds]
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
        if name in args.variants
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
    for r in honest:
        print(
            f"honest seed {r['seed']}: collapse alarms {r['collapse_alarms']}, hacking alarms "
            f"{r['hacking_alarms']}; trained gain {r['trained_gain']:+.3f} ({r['trained_gain_se']:.3f}), "
            f"watched contrast {r['watched_gain']:+.4f} ({r['watched_gain_se']:.4f}), deepest "
            f"{r['deepest_watched_gain']:+.4f}"
        )
    alarm = WatchAlarmConfig() if args.k_se is None else WatchAlarmConfig(k_se=args.k_se)
    monitor = MonitorConfig(**{k.removeprefix("monitor."): v for k, v in MONITOR.items()})
    payload = {
        "iterations": args.iterations,
        "eval_every": args.eval_every,
        "watch_alarm": {"k_se": alarm.k_se, "min_drop": alarm.min_drop, "window": alarm.window},
        "monitor": {
            "near_duplicate_std": monitor.near_duplicate_std,
            "collapse_share": monitor.collapse_share,
            "collapse_relative": monitor.collapse_relative,
        },
        "command": " ".join(["python", "benchmarks/hacking.py", *sys.argv[1:]]),
        "results": results,
        "honest": honest,
    }
    Path(args.out).write_text(json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
