"""How far the sglang-diffusion server's recorded log-probs are from diffrl's replay of the same
transitions, by server precision and kernel, and what ``rollout_correction`` makes of it: the
alignment table of ``docs/engines.md``.

    DIFFRL_SGLANG=$(.ci/sglang-env) python benchmarks/engine_alignment.py [--out docs/results/engine_alignment.json]

Each setting (:data:`SETTINGS`) is one Flow-GRPO run of 2 iterations through the Ray runner (1
engine, 1 trainer rank) on the tiny random FLUX.1 of the integration tests (written by the
pipeline's ``save_pretrained``), the trainer in float32, the engine launching its own real server at
the setting's precision. Per iteration, from the run's metrics: ``train/log_prob_mean_abs_diff``
(the mean |recorded - replayed| log-prob of the transitions trained on), ``train/clipfrac`` (the
share of transitions outside the clip range in the update), and with a correction
``train/rollout_log_prob_abs_diff``, ``train/rollout_is_raw_mean`` (the weight pi_old/mu before
truncation), ``train/rollout_is_corrected_frac`` and ``train/rollout_kl``. Deterministic numbers of
this model and these seeds (no timing): one run each is the whole measurement.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.* (the tiny model's writer), run from anywhere

SETTINGS: dict[str, dict[str, str]] = {
    "sde, fp32 server, tis": {"precision": "fp32", "sampler": "sde", "correction": "tis"},
    "sde, bf16 server, none": {"precision": "bf16", "sampler": "sde", "correction": "none"},
    "sde, bf16 server, tis": {"precision": "bf16", "sampler": "sde", "correction": "tis"},
    "cps, fp32 server, tis": {"precision": "fp32", "sampler": "cps", "correction": "tis"},
    "cps, bf16 server, tis": {"precision": "bf16", "sampler": "cps", "correction": "tis"},
}
METRICS = (
    "train/log_prob_mean_abs_diff",
    "train/clipfrac",
    "train/rollout_log_prob_abs_diff",
    "train/rollout_is_raw_mean",
    "train/rollout_is_weight_mean",
    "train/rollout_is_corrected_frac",
    "train/rollout_kl",
)


def run(name: str, flux_dir: Path, out: Path) -> list[dict[str, float]]:
    """The setting's run, configured as the engine's tests configure theirs."""
    from diffrl.launch import train
    from tests.distributed.test_sglang_engine import config

    s = SETTINGS[name]
    extra = {"algorithm.params.sampler": s["sampler"], "algorithm.params.rollout_correction": s["correction"]}
    result = train(config(out, flux_dir, "flow_grpo", f"{{precision: {s['precision']}}}", **extra))
    return [{k: m[k] for k in METRICS if k in m} for m in result.history]


def _col(its: list[dict[str, float]], key: str, fmt: str = ".2g") -> str:
    """One metric over the iterations, comma-separated."""
    return ", ".join(format(m[key], fmt) for m in its if key in m)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--settings", default=";".join(SETTINGS), help=f"separated by ';', of: {'; '.join(SETTINGS)}"
    )
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    if not (os.environ.get("DIFFRL_SGLANG") or shutil.which("sglang")):
        raise SystemExit("no sglang-diffusion environment: run .ci/sglang-env and set DIFFRL_SGLANG")
    names = [n.strip() for n in args.settings.split(";") if n.strip()]
    unknown = [n for n in names if n not in SETTINGS]
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; known: {'; '.join(SETTINGS)}")
    import torch

    from tests.integration.test_flux import write_tiny_flux

    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        flux_dir = Path(tmp) / "flux"
        write_tiny_flux(flux_dir)
        for name in names:
            rows[name] = run(name, flux_dir, Path(tmp) / name.replace(", ", "_").replace(" ", "_"))
            print(name, json.dumps(rows[name]), flush=True)
    print()
    print("| setting | log-prob diff | clipfrac | weight mean (raw) | truncated | rollout_kl |")
    print("|---|---|---|---|---|---|")
    for name, its in rows.items():
        print(
            f"| {name} | {_col(its, 'train/log_prob_mean_abs_diff')} | {_col(its, 'train/clipfrac')} | "
            f"{_col(its, 'train/rollout_is_raw_mean', '.8f')} | {_col(its, 'train/rollout_is_corrected_frac')} | "
            f"{_col(its, 'train/rollout_kl')} |"
        )
    if args.out:
        machine = {"machine": platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__}
        Path(args.out).write_text(
            json.dumps(
                {
                    "machine": machine,
                    "model": "tiny random FLUX.1 (tests/integration/test_flux.py)",
                    "iterations": 2,
                    "settings": SETTINGS,
                    "runs": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
