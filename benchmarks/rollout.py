"""Rollout benchmark on the tiny model, measured side by side in one run.

    python benchmarks/rollout.py [--model base|random] [--repeats 3]

Prints
 (a) engine efficiency: time of the bare batched velocity forwards / time of the collector doing the
     same sampling (same micro-groups, steps, CFG), target >= 0.9;
 (b) the collector's throughput / that of diffusers' StableDiffusion3Pipeline driving the same
     transformer (prompt embeddings passed in, latent output, same steps, batch and CFG), target >= 1.0;
 (c) peak memory of a Flow-GRPO rollout that records every step vs one with a 2-step window
     (each in a fresh child process: peak RSS on CPU, max allocated on CUDA).
Timings interleave the contenders and take the median of the repeats (shared, noisy machines).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import torch


def build(model: str, overrides: list[str]):
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.data.prompts import load_prompts
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.sampling.collector import OnlineCollector

    cfg = load_config(
        "recipes/tiny_grpo_ocr.yaml",
        [f"model.path={model}", "model.lora=null", "eval.enabled=false", *overrides],
    )
    family = load_family(cfg)
    family.transformer.requires_grad_(False).eval()
    spec = build_algorithm(cfg).collection_spec()
    return cfg, family, OnlineCollector(cfg, family, spec, load_prompts(cfg.data.prompts))


def bare_forwards(family, collector, rollout_id: int) -> None:
    """Only the transformer calls the collector makes: same micro-groups, steps and CFG."""
    cfg = collector.config
    prompt_ids = collector.planner.stream.take(
        rollout_id * collector.planner.n_prompts, collector.planner.n_prompts
    )
    prompts = [collector.prompts.prompts[p] for p in prompt_ids for _ in range(collector.planner.n_samples)]
    neg = family.negative(cfg.sampling.negative_prompt, cfg.sampling.guidance_scale)
    h, w = collector.height, collector.width
    with torch.no_grad():
        for start in range(0, len(prompts), collector.planner.micro_group_size):
            chunk = prompts[start : start + collector.planner.micro_group_size]
            cond = family.encode_prompts(chunk)
            x = torch.randn(len(chunk), *family.latent_shape(h, w))
            negative = neg.repeat(len(chunk)) if neg is not None else None
            for i in range(collector.num_steps):
                family.velocity(
                    x, collector.sigmas[i].expand(len(chunk)), cond, cfg.sampling.guidance_scale, negative
                )


def diffusers_pipeline(family, collector):
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    shift = collector.config.sampling.shift
    scheduler = FlowMatchEulerDiscreteScheduler(shift=family.default_shift if shift is None else shift)
    pipe = StableDiffusion3Pipeline(
        transformer=family.transformer,
        scheduler=scheduler,
        vae=None,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        text_encoder_3=None,
        tokenizer_3=None,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def run_pipeline(pipe, family, collector, rollout_id: int) -> None:
    cfg = collector.config
    prompt_ids = collector.planner.stream.take(
        rollout_id * collector.planner.n_prompts, collector.planner.n_prompts
    )
    prompts = [collector.prompts.prompts[p] for p in prompt_ids for _ in range(collector.planner.n_samples)]
    g = cfg.sampling.guidance_scale
    h, w = collector.height, collector.width
    for start in range(0, len(prompts), collector.planner.micro_group_size):
        chunk = prompts[start : start + collector.planner.micro_group_size]
        cond = family.encode_prompts(chunk)
        neg = family.encode_prompts([cfg.sampling.negative_prompt] * len(chunk))
        pipe(
            prompt_embeds=cond.tensors["encoder_hidden_states"],
            pooled_prompt_embeds=cond.tensors["pooled_projections"],
            negative_prompt_embeds=neg.tensors["encoder_hidden_states"],
            negative_pooled_prompt_embeds=neg.tensors["pooled_projections"],
            guidance_scale=g,
            num_inference_steps=cfg.sampling.num_steps,
            # the pipeline assumes an 8x VAE: ask for 8x the pixels to get latents of our size
            height=h * 8,
            width=w * 8,
            latents=torch.randn(len(chunk), *family.latent_shape(h, w)),
            output_type="latent",
        )


def timed(fn, *args) -> float:
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


def memory_child(model: str, window: str) -> None:
    """Run one recorded rollout and print its peak memory as JSON (called in a fresh process)."""
    import resource

    strategy = "{name: all}" if window == "all" else "{name: sde_window, size: 2, range: [0, 6]}"
    _, family, collector = build(model, [f"algorithm.params.step_strategy={strategy}"])
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    batch = collector.collect(0)
    recorded = sum(t.numel() * t.element_size() for t in (batch.traj_x, batch.traj_next) if t is not None)
    peak = (
        torch.cuda.max_memory_allocated()
        if torch.cuda.is_available()
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    print(
        json.dumps(
            {
                "peak_bytes": peak,
                "recorded_bytes": recorded,
                "samples": len(batch),
                "steps_recorded": batch.traj_x.shape[1],
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="base", help="base or random")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--memory-child", choices=["all", "window"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.model, args.memory_child)
        return

    overrides = [f"sampling.guidance_scale={args.guidance}"]
    cfg, family, collector = build(args.model, overrides)
    pipe = diffusers_pipeline(family, collector)
    n = collector.planner.n_prompts * collector.planner.n_samples
    print(
        f"tiny {args.model}: {collector.planner.n_prompts} prompts x {collector.planner.n_samples} samples, micro-groups of "
        f"{collector.planner.micro_group_size}, {cfg.sampling.num_steps} steps, CFG {args.guidance}, "
        f"torch threads {torch.get_num_threads()}"
    )
    collector.collect(0)  # warm-up: prompt cache, allocator
    bare_forwards(family, collector, 0)
    run_pipeline(pipe, family, collector, 0)
    times = {"bare": [], "collector": [], "pipeline": []}
    for r in range(1, args.repeats + 1):
        times["collector"].append(timed(collector.collect, r))
        times["bare"].append(timed(bare_forwards, family, collector, r))
        times["pipeline"].append(timed(run_pipeline, pipe, family, collector, r))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median seconds per rollout of {n} samples: " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    print(
        f"(a) engine efficiency  bare forwards / collector      = {med['bare'] / med['collector']:.3f}  (target >= 0.9)"
    )
    print(
        f"(b) collector throughput / diffusers SD3 pipeline      = {med['pipeline'] / med['collector']:.3f}  (target >= 1.0)"
    )

    rows = {}
    for mode in ("all", "window"):
        out = subprocess.run(
            [sys.executable, __file__, "--model", args.model, "--memory-child", mode],
            capture_output=True,
            text=True,
            check=True,
        )
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    a, w = rows["all"], rows["window"]
    print(
        f"(c) GRPO rollout peak memory: all {a['steps_recorded']} steps recorded {a['peak_bytes'] / 2**20:.1f} MiB "
        f"(trajectory {a['recorded_bytes'] / 2**20:.2f} MiB) vs 2-step window {w['peak_bytes'] / 2**20:.1f} MiB "
        f"(trajectory {w['recorded_bytes'] / 2**20:.2f} MiB); trajectory ratio {a['recorded_bytes'] / max(1, w['recorded_bytes']):.1f}x"
    )


if __name__ == "__main__":
    main()
