"""The sglang engine's weight sync, LoRA adapter against merged transformer: bytes and seconds per
sync on a real sglang-diffusion server, and the bytes a FLUX.1-dev (12B) sync would send.

    DIFFRL_SGLANG=$(.ci/sglang-env) python benchmarks/engine_sync.py --out docs/results/engine_sync.json
    python benchmarks/engine_sync.py --model-path /models/FLUX.1-dev --size 512 --steps 28 \\
        --precision bf16 --lora-rank 32                                          # on a GPU

Two engines, each with a server of its own (a server that took an adapter keeps its layers
wrapped: it takes no merged weights after): ``sync: lora`` and ``sync: merged``. Each first
sync (the server's start, and the LoRA engine's check of the whole transformer) is not timed.
Then, per repeat, the adapter is moved as an update would move it and both engines sync it (the
order alternates), each followed by two rollouts: a cost the sync moved into the server's next
forward (a recompile) shows in the first, the unmerged adapter's own cost in both. Reported: the
medians, the spread (min-max) and the ratio of medians, or "inconclusive" where the spreads overlap.
Then each engine's last rollout is replayed here with the weights it was drawn with (diffrl's
kernel on diffrl's velocity at the recorded transitions): how far the server's log-probs are from
the replay's, the adapter unmerged on both sides against merged on the server's.

The FLUX.1-dev figures come from sizes alone: its transformer built on the meta device from the
``config.json`` diffrl ships (``diffrl/models/assets/configs/FLUX.1-dev``), with a rank-r adapter on
diffrl's default FLUX targets: merged = every parameter in the server's precision; LoRA = the
adapter's parameters in float32 (diffrl trains and sends them in float32; in bf16 they would be half).
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
from diffrl.sampling.sglang import SglangEngine  # noqa: E402
from diffrl.train.actor import apply_lora  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
FLUX_DEV = ROOT / "diffrl" / "models" / "assets" / "configs" / "FLUX.1-dev" / "transformer" / "config.json"


def flux_dev_bytes(rank: int, precision: str) -> dict[str, float]:
    """Bytes per sync of FLUX.1-dev's transformer, from its shipped config on the meta device."""
    from diffusers import FluxTransformer2DModel
    from peft import LoraConfig

    from diffrl.models.base import meta_model
    from diffrl.models.flux import FluxFamily

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[precision]
    model = meta_model(FluxTransformer2DModel, json.loads(FLUX_DEV.read_text()), dtype)
    base = sum(p.numel() for p in model.parameters())
    merged = sum(p.numel() * p.element_size() for p in model.parameters())
    targets = FluxFamily.description.lora_targets_of(model, None)
    model.add_adapter(LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=targets))
    lora = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    return {
        "parameters": base,
        "lora_rank": rank,
        "lora_targets": targets,
        "lora_parameters": lora,
        "merged_bytes": merged,
        "lora_bytes_fp32": lora * 4,
        "lora_bytes_bf16": lora * 2,
        "ratio_fp32": merged / (lora * 4),
    }


def rollout(engine: SglangEngine, rollout_id: int) -> None:
    """Every micro-group of a rollout drawn as the Ray engines draw them (no sync in between)."""
    plan = engine.plan(rollout_id)
    for g in range(len(plan.micro_groups)):
        engine.sample(plan, g)


@torch.no_grad()
def replay_difference(engine: SglangEngine, rollout_id: int) -> dict[str, float]:
    """|server log-prob - diffrl's replay| over a rollout's recorded transitions (max and mean)."""
    plan = engine.plan(rollout_id)
    family, spec = engine.family, engine.spec
    diffs = []
    for g in range(len(plan.micro_groups)):
        batch = engine.sample(plan, g)
        for k in range(batch.traj_x.shape[1]):
            v = family.velocity(batch.traj_x[:, k], batch.traj_sigma[:, k], batch.cond)
            out = engine.kernel.step(
                batch.traj_x[:, k],
                v,
                batch.traj_sigma[:, k],
                batch.traj_sigma_next[:, k],
                noise_level=spec.noise_level,
                sigma_max=engine.sigmas[1].item(),
                prev_sample=batch.traj_next[:, k],
            )
            diffs.append((out.log_prob - batch.traj_log_prob[:, k]).abs())
    d = torch.cat(diffs)
    return {"max": d.max().item(), "mean": d.mean().item(), "transitions": d.numel()}


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def ratio(pair: dict[str, dict[str, float]]) -> float | str:
    """merged's median over lora's, or why there is no verdict (the spreads overlap)."""
    a, b = pair["lora"], pair["merged"]
    if a["max"] >= b["min"] and b["max"] >= a["min"]:
        return (
            f"inconclusive: the spreads overlap ({a['min']:.3f}-{a['max']:.3f} s against "
            f"{b['min']:.3f}-{b['max']:.3f} s)"
        )
    return round(b["median"] / a["median"], 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-path", help="a FLUX.1 folder in diffusers layout (default: a tiny random one)")
    p.add_argument("--size", type=int, default=16)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=2, help="samples per prompt")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--lora-rank", type=int, default=4)
    p.add_argument("--flux-dev-rank", type=int, default=32, help="the LoRA rank of the FLUX.1-dev estimate")
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args()
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
            "model.lora": f"{{rank: {args.lora_rank}}}",
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
        }
        engines: dict[str, SglangEngine] = {}
        family = None
        try:
            for mode in ("lora", "merged"):
                options = f"{{model_id: FLUX.1-dev, precision: {args.precision}, sync: {mode}}}"
                config = load_config(
                    str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"),
                    [f"{k}={v}" for k, v in {**overrides, "rollout.engine_options": options}.items()],
                )
                if family is None:
                    family = load_family(config)
                    apply_lora(family, config.model.lora)
                spec = build_algorithm(config).collection_spec()
                engines[mode] = SglangEngine(config, family, spec, load_prompts(config.data.prompts))
            gen = torch.Generator().manual_seed(0)
            lora_params = [p for n, p in family.transformer.named_parameters() if "lora_" in n]

            def update() -> None:  # what an optimizer step does to the adapter: every tensor moves
                with torch.no_grad():
                    for q in lora_params:
                        q.add_(torch.randn(q.shape, generator=gen, dtype=q.dtype) * 1e-3)

            first: dict[str, float] = {}
            for mode, e in engines.items():
                t = time.perf_counter()
                e.sync()
                first[mode] = time.perf_counter() - t
                rollout(e, 0)  # warm-up
            sync_s: dict[str, list[float]] = {k: [] for k in engines}
            rollout_s: dict[str, list[float]] = {k: [] for k in engines}
            again_s: dict[str, list[float]] = {k: [] for k in engines}
            sent: dict[str, float] = {}
            names = list(engines)
            for r in range(args.repeats):
                update()
                for mode in names if r % 2 == 0 else names[::-1]:
                    e = engines[mode]
                    t = time.perf_counter()
                    metrics = e.sync()
                    sync_s[mode].append(time.perf_counter() - t)
                    sent[mode] = metrics["sync/engine_bytes"]
                    for times in (rollout_s, again_s):
                        t = time.perf_counter()
                        rollout(e, r + 1)
                        times[mode].append(time.perf_counter() - t)
            alignment = {mode: replay_difference(e, args.repeats + 1) for mode, e in engines.items()}
        finally:
            for e in engines.values():
                e.close()
    result = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, {args.device}",
        "model": args.model_path or "tiny random FLUX.1 (tests/integration/test_flux.py)",
        "precision": args.precision,
        "lora_rank": args.lora_rank,
        "rollout": f"{args.size}x{args.size}, {args.steps} steps, {n} images",
        "repeats": args.repeats,
        "first_sync_s": first,
        "bytes_per_sync": sent,
        "sync_s": {k: spread(v) for k, v in sync_s.items()},
        "rollout_after_sync_s": {k: spread(v) for k, v in rollout_s.items()},
        "second_rollout_s": {k: spread(v) for k, v in again_s.items()},
        "server_log_prob_minus_replay": alignment,
        "flux_dev": flux_dev_bytes(args.flux_dev_rank, "bf16"),
    }
    for what in ("sync_s", "rollout_after_sync_s", "second_rollout_s"):
        result[f"{what}_merged_over_lora"] = ratio(result[what])
    print(f"\n{result['model']}, {result['rollout']}, {args.precision}, {args.repeats} interleaved repeats")
    print(
        f"{'sync':8s} {'bytes':>12s} {'sync s (min-max)':>24s} {'next rollout s':>24s} {'second rollout s':>24s}"
    )
    for mode in names:
        cells = [result[w][mode] for w in ("sync_s", "rollout_after_sync_s", "second_rollout_s")]
        print(
            f"{mode:8s} {sent[mode]:12,.0f} "
            + " ".join(f"{c['median']:9.3f} ({c['min']:.3f}-{c['max']:.3f})" for c in cells)
        )
    print(f"merged / lora: {sent['merged'] / sent['lora']:.1f}x the bytes")
    for mode, a in alignment.items():
        print(f"{mode}: server log-prob - diffrl's replay: max {a['max']:.2e}, mean {a['mean']:.2e}")
    for what in ("sync_s", "rollout_after_sync_s", "second_rollout_s"):
        print(f"merged / lora, {what}: {result[f'{what}_merged_over_lora']}")
    f = result["flux_dev"]
    print(
        f"FLUX.1-dev ({f['parameters']:,} parameters), LoRA r{f['lora_rank']} on {f['lora_targets']}: "
        f"merged bf16 {f['merged_bytes'] / 1e9:.2f} GB, adapter {f['lora_bytes_fp32'] / 1e6:.1f} MB "
        f"in float32 ({f['ratio_fp32']:.0f}x less)"
    )
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
