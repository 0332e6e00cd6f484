"""Rollout engines side by side: diffrl's built-in engine against sglang-diffusion's server on the
same FLUX.1 folder, steps, size and precision (images per second of a Flow-GRPO rollout: every
step stochastic-or-Euler as the recipe's window, trajectory and log-probs kept, uint8 images out).

    DIFFRL_SGLANG=$(.ci/sglang-env) python benchmarks/engine_rollout.py            # tiny random FLUX.1
    python benchmarks/engine_rollout.py --model-path /models/FLUX.1-dev --size 512 --steps 28 \\
        --device cuda --precision bf16                                           # on a GPU

Timings interleave the engines within each repeat (the order alternates), after one warm-up
rollout each; it prints the median seconds per rollout, the spread (min-max) and the ratio of
medians. The built-in engine here runs in this process; the sglang engine's time is the round trip
(request, server-side sampling and decoding, msgpack answer, the prompts encoded here for the
trainer). Weights are synced once before timing (not timed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffrl.algorithms.registry import build_algorithm  # noqa: E402
from diffrl.data.prompts import load_prompts  # noqa: E402
from diffrl.models.registry import load_family  # noqa: E402
from diffrl.preflight import load_config  # noqa: E402
from diffrl.sampling.collector import OnlineCollector  # noqa: E402
from diffrl.sampling.sglang import SglangEngine  # noqa: E402
from diffrl.train.actor import apply_lora  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", help="a FLUX.1 folder in diffusers layout (default: a tiny random one)")
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--samples", type=int, default=2, help="samples per prompt")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--threads", type=int, default=0, help="torch threads here (0: torch's default)")
    p.add_argument("--out", default=None, help="write the timings as JSON here")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        path = args.model_path
        if path is None:
            from tests.integration.test_flux import write_tiny_flux

            path = str(Path(tmp) / "flux")
            write_tiny_flux(path)
        n = args.prompts * args.samples
        overrides = {
            "run.output_dir": str(Path(tmp) / "run"),
            "run.device": args.device,
            "model.family": "flux",
            "model.path": path,
            "model.dtype": "float32" if args.precision == "fp32" else "bfloat16",
            "model.lora": "{rank: 4}",
            "sampling.num_steps": args.steps,
            "sampling.guidance_scale": 1.0,
            "sampling.height": args.size,
            "sampling.width": args.size,
            "algorithm.params": f"{{step_strategy: {{name: sde_window, size: 2, range: [0, {args.steps - 1}]}}}}",
            "rollout.batch_size": args.prompts,
            "rollout.n_samples_per_prompt": args.samples,
            "rollout.micro_group_size": n,
            "train.batch_size": n,
            "train.micro_batch_size": n,
            "rewards": "[{name: tests.rewards:brightness}]",
            "eval.enabled": "false",
            "rollout.engine": "sglang",
            "rollout.engine_options": f"{{model_id: FLUX.1-dev, precision: {args.precision}}}",
        }
        root = Path(__file__).resolve().parents[1]
        config = load_config(
            str(root / "recipes" / "tiny_grpo_ocr_small.yaml"), [f"{k}={v}" for k, v in overrides.items()]
        )
        family = load_family(config)
        apply_lora(family, config.model.lora)  # as the actor adds it: the engines sample with the adapter
        spec = build_algorithm(config).collection_spec()
        prompts = load_prompts(config.data.prompts)
        engines = {"diffrl (in-process)": OnlineCollector(config, family, spec, prompts)}
        t0 = time.perf_counter()
        sglang = SglangEngine(config, family, spec, prompts)
        try:
            sglang.sync()
            ready_s = time.perf_counter() - t0
            print(f"sglang server ready in {ready_s:.1f} s ({os.environ.get('DIFFRL_SGLANG', 'sglang')})")
            engines["sglang-diffusion (server)"] = sglang
            for e in engines.values():  # warm-up rollout each
                e.collect(0)
            times: dict[str, list[float]] = {k: [] for k in engines}
            names = list(engines)
            for r in range(args.repeats):
                for name in names if r % 2 == 0 else names[::-1]:
                    t = time.perf_counter()
                    engines[name].collect(r + 1)
                    times[name].append(time.perf_counter() - t)
        finally:
            sglang.close()
    print(
        f"\nFLUX.1 {'(tiny random)' if args.model_path is None else args.model_path}, {args.size}x{args.size}, "
        f"{args.steps} steps, {n} images per rollout ({args.prompts} prompts x {args.samples}), "
        f"{args.precision}, {args.device}, {args.repeats} interleaved repeats"
    )
    print(f"{'engine':28s} {'median s':>9s} {'min-max s':>15s} {'img/s':>8s}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        print(f"{k:28s} {med[k]:9.3f} {min(v):7.3f}-{max(v):<7.3f} {n / med[k]:8.1f}")
    a, b = names
    print(f"\nspeed of {b} relative to {a}: {med[a] / med[b]:.2f}x (ratio of median seconds)")
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "command": " ".join(["python", "benchmarks/engine_rollout.py", *sys.argv[1:]]),
                    "machine": {
                        "machine": platform.machine(),
                        "cores": os.cpu_count(),
                        "device": args.device,
                    },
                    "model": "tiny random FLUX.1" if args.model_path is None else args.model_path,
                    "size": args.size,
                    "steps": args.steps,
                    "images_per_rollout": n,
                    "precision": args.precision,
                    "server_start_and_first_sync_s": ready_s,
                    "seconds": times,
                    "median_s": med,
                    "images_per_s": {k: n / med[k] for k in med},
                    "speed_of_server_over_in_process": med[a] / med[b],
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
