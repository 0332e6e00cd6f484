"""Ulysses sequence parallel (``diffrl.models.sequence_parallel``): peak memory per rank and step
time of one forward + backward of a long-sequence tiny Wan transformer with a LoRA, on 1 process
against 2 sequence ranks (gloo on CPU, NCCL with ``--device cuda``), measured side by side.

    python benchmarks/sequence_parallel.py --frames 33 --size 256 --rounds 3

Each measurement runs in fresh processes, the two settings interleaved round by round; the table
gives medians and the min-max spread. Memory on CPU: the step's peak resident set above the resident
set before it (Linux ``VmHWM``, reset through ``/proc/self/clear_refs`` after a warm-up step, with
glibc's mmap threshold fixed so that freed tensors leave the resident set), so weights and
libraries already resident do not count; on CUDA ``max_memory_allocated`` above the
allocated memory before the step. Time: the median of ``--steps`` timed steps in that process.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from diffusers import WanTransformer3DModel
from peft import LoraConfig, inject_adapter_in_model

from diffrl.core.parallel import free_port, sequence_mesh
from diffrl.models.sequence_parallel import enable_sequence_parallel


def model(device: torch.device) -> WanTransformer3DModel:
    torch.manual_seed(0)
    m = WanTransformer3DModel(
        patch_size=(1, 2, 2),
        num_attention_heads=4,
        attention_head_dim=32,
        in_channels=16,
        out_channels=16,
        text_dim=64,
        freq_dim=64,
        ffn_dim=256,
        num_layers=2,
        rope_max_seq_len=1024,
    )
    lora = LoraConfig(r=8, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    return inject_adapter_in_model(lora, m).to(device).train()


def step(m, x, t, text) -> None:
    out = m(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False)[0]
    out.square().mean().backward()
    m.zero_grad(set_to_none=True)


def status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure(m, args, device: torch.device) -> dict[str, float]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 16, args.frames, args.size // 8, args.size // 8, generator=g).to(device)
    t, text = torch.tensor([500.0], device=device), torch.randn(1, 16, 64, generator=g).to(device)
    step(m, x, t, text)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    else:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # the warm-up's freed memory back to the OS
        before = status_kb("VmRSS") * 1024
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    step(m, x, t, text)
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = status_kb("VmHWM") * 1024 - before
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step(m, x, t, text)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return {"peak_mb": peak / 2**20, "step_s": statistics.median(times)}


def _rank(rank: int, world: int, port: int, args, out: str) -> None:
    device = torch.device("cuda", rank) if args.device == "cuda" else torch.device("cpu")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(max(1, args.threads // world))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        m = model(device)
        if world > 1:
            enable_sequence_parallel(m, sequence_mesh(device.type, 1, world))
        result = measure(m, args, device)
        Path(f"{out}.{rank}").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def run(world: int, args) -> dict[str, float]:
    """One measurement in ``world`` fresh processes: rank 0's figures (the ranks are symmetric)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result")
        mp.spawn(_rank, args=(world, free_port(), args, out), nprocs=world, join=True)
        return json.loads(Path(f"{out}.0").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=33, help="latent frames")
    p.add_argument("--size", type=int, default=256, help="pixels per side (latent = size / 8)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=3, help="timed steps per process")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="torch threads in all")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--out", default=None, help="write the measurements as JSON here")
    args = p.parse_args()
    # a fixed glibc mmap threshold: tensors above it are mapped and unmapped, so the resident set
    # follows live memory (with the default, adaptive one a freed tensor's pages stay resident and
    # the next step reuses them unseen); the ranks, spawned, inherit it
    os.environ["MALLOC_MMAP_THRESHOLD_"] = "65536"
    tokens = args.frames * (args.size // 16) ** 2
    print(
        f"tiny Wan, {args.frames} latent frames x {args.size // 8}^2 latent = {tokens} tokens, {args.device}"
    )
    results: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    for r in range(args.rounds):
        for world in (1, 2):  # interleaved
            results[world].append(run(world, args))
            print(f"round {r + 1} N={world}: {results[world][-1]}", flush=True)
    print("\n| N | peak memory per rank, MB (min-max) | step s (min-max) |\n|---|---|---|")
    for world, rows in results.items():
        mem, sec = [x["peak_mb"] for x in rows], [x["step_s"] for x in rows]
        print(
            f"| {world} | {statistics.median(mem):.0f} ({min(mem):.0f}-{max(mem):.0f}) "
            f"| {statistics.median(sec):.3f} ({min(sec):.3f}-{max(sec):.3f}) |"
        )
    m1 = statistics.median(x["peak_mb"] for x in results[1])
    m2 = statistics.median(x["peak_mb"] for x in results[2])
    ratios = [b["peak_mb"] / a["peak_mb"] for a, b in zip(results[1], results[2])]
    print(f"\nmemory per rank N=2 / N=1: {m2 / m1:.2f} (per round {min(ratios):.2f}-{max(ratios):.2f})")
    if args.out:
        from diffrl.core.pins import cpu_model

        Path(args.out).write_text(
            json.dumps(
                {
                    "command": " ".join(["python", "benchmarks/sequence_parallel.py", *sys.argv[1:]]),
                    "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "device": args.device},
                    "tokens": tokens,
                    "rounds": results,
                    "memory_ratio_per_round": ratios,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
