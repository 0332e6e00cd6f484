"""``diffrl plan`` against what the real step allocated: for each configuration, the plan's peak
memory per trainer rank and its FLOPs of a training micro-batch, next to one real training step of
the actor measured on CPU, each configuration in a fresh process.

    python benchmarks/plan_accuracy.py [--configs sd3_lora,flux_full,...] [--out docs/results/plan_accuracy.json]
    python benchmarks/plan_accuracy.py --list     # the configurations

The models are the real families' tiny copies the integration tests write with their pipelines'
``save_pretrained`` (``tests/integration/test_{sd3,flux,wan,ltx2}.py``: every part of the real model,
sized for a CPU), written once to a temporary folder, at larger sizes than the tests use so that a
step holds megabytes of activations. Each configuration's child process loads the family, builds
the actor as training does (LoRA or the full transformer, the reference copy or the old policy its
algorithm keeps, FSDP2 and Ulysses on gloo ranks forked from it), samples one real rollout (random
rewards: the scores do not change the memory), takes one micro-batch of its training examples,
runs one warm-up ``Actor.train_step`` (AdamW's state exists after a first step, as the plan counts
it), then measures further ``train_step`` calls on the same micro-batch (each rank its own):

- **allocated** (the figure compared): the tensors the step starts with (the transformer's
  parameters and buffers on this rank, the kept copies, AdamW's state, the micro-batch's tensors:
  exact storage bytes, counted once each) plus the high-water mark of the bytes the CPU allocator
  handed out during the step, from ``torch.profiler``'s memory events (``profile_memory=True``:
  every allocation and free through c10's CPU allocator, with the kernels' own work buffers that no
  Python-level tracker sees). This is what the plan claims to predict: tensor bytes live at the
  peak. Not in it, nor in the plan: the frozen text encoders and VAE, the rollout's batch, Python
  objects, the allocator's caching (none on CPU: glibc returns large blocks at once here).
- **RSS**: the same starting tensors plus the rise of the process's peak resident memory during a
  step (``VmHWM`` reset by ``/proc/self/clear_refs``; ``MALLOC_MMAP_THRESHOLD_`` set low so large
  blocks come from, and go back to, the kernel): the process's view, coarse (pages, malloc's arenas).
- **tracker**: torch's ``MemTracker`` around the same real step (one process only): what the plan's
  own instrument sees of the real step, to tell the plan's modelling from the tracker's blind spots.
- **FLOPs**: ``torch.utils.flop_counter.FlopCounterMode`` around a real step (its forward, the
  recomputed forwards of gradient checkpointing, backward, the no-grad forwards of a reference or
  old policy), against the plan's FLOPs of one micro-batch (``train_flops / examples x micro-batch``);
  on a sequence-parallel group the ranks' counts are summed; and one guided sampling velocity of
  the micro-batch's samples against ``forward_flops_per_sample``.

Ratios are plan / measured, against the rank that allocated most. Memory figures are exact byte
counts of a step (no timing), measured over :data:`REPEATS` steps, which do not allocate quite the
same bytes (in a process group, when gloo's work releases a collective's buffers depends on its
threads): the median step is compared and the range over the steps shown. The check is
|ratio - 1| <= 0.15.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.* (the tiny models' writers), run from anywhere

TOLERANCE = 0.15
MICRO_BATCH = 2
REPEATS = 5
"""Steps measured by the allocator per rank (the median compared, the range shown): the steps of one
process allocate nearly the same bytes; those of a process group's ranks vary more (when gloo's work
releases a collective's buffers depends on its threads' timing)."""


@dataclass(frozen=True)
class Case:
    """One configuration: the tiny folder it loads and its overrides on top of :data:`COMMON`."""

    folder: str
    overrides: dict[str, object]
    note: str
    ranks: int = 1
    sequence: int = 1
    extra: dict[str, object] = field(default_factory=dict)


def _family(family: str, options: str, guidance: float, size: int) -> dict[str, object]:
    return {
        "model.family": family,
        "model.options": options,
        "sampling.guidance_scale": guidance,
        "sampling.height": size,
        "sampling.width": size,
    }


SD3 = _family("sd3", "{max_sequence_length: 32, gradient_checkpointing: true}", 4.5, 128)
SD3_NO_CKPT = {**SD3, "model.options": "{max_sequence_length: 32}"}
FLUX = _family("flux", "{max_sequence_length: 32, gradient_checkpointing: true}", 1.0, 128)
WAN = _family("wan", "{num_frames: 9, max_sequence_length: 32, gradient_checkpointing: true}", 5.0, 256)
LTX2 = _family(
    "ltx2",
    "{num_frames: 9, max_sequence_length: 16, stg_blocks: [1], gradient_checkpointing: true}",
    3.0,
    128,
)
LORA, FULL = {"model.lora": "{rank: 4}"}, {"model.lora": "null"}
RAY2 = {"runner": "ray", "parallel.trainer_ranks": 2}

CASES: dict[str, Case] = {
    "sd3_lora": Case("sd3", {**SD3, **LORA}, "tiny SD3, LoRA r4, CFG 4.5 (2 rows a sample), checkpointing"),
    "sd3_lora_kl": Case(
        "sd3",
        {**SD3, **LORA, "algorithm.params.kl_beta": 0.04},
        "as sd3_lora with Flow-GRPO's KL (a reference forward without gradient inside the loss)",
    ),
    "sd3_full": Case("sd3", {**SD3_NO_CKPT, **FULL}, "tiny SD3, full fine-tune, no checkpointing"),
    "flux_lora": Case("flux", {**FLUX, **LORA}, "tiny FLUX.1, LoRA r4, distilled guidance (1 row a sample)"),
    "flux_full_nft": Case(
        "flux",
        {**FLUX, **FULL, "algorithm.name": "diffusion_nft", "algorithm.params": "{}"},
        "tiny FLUX.1, full fine-tune, DiffusionNFT (a frozen old-policy copy, its forward in the loss)",
    ),
    "wan_lora": Case("wan22", {**WAN, **LORA}, "tiny Wan 2.2 (two experts), LoRA r4, 9 frames, CFG 5"),
    "wan_full": Case("wan22", {**WAN, **FULL}, "tiny Wan 2.2 (two experts), full fine-tune"),
    "ltx2_lora": Case(
        "ltx2",
        {**LTX2, **LORA},
        "tiny LTX-2 (video + audio), LoRA r4, 9 frames, CFG 3, STG, modality isolation",
    ),
    "ltx2_full": Case(
        "ltx2",
        {
            **LTX2,
            **FULL,
            "model.options": LTX2["model.options"].replace(", gradient_checkpointing: true", ""),
        },
        "tiny LTX-2, full fine-tune, no checkpointing (every guidance pass's activations kept for the backward)",
    ),
    "sd3_full_fsdp2": Case(
        "sd3",
        {**SD3, **FULL, **RAY2},
        "tiny SD3 full fine-tune, FSDP2 over 2 gloo ranks (each rank its own micro-batch)",
        ranks=2,
    ),
    "wan_lora_sp2": Case(
        "wan22",
        {**WAN, **LORA, **RAY2, "parallel.sequence": 2},
        "tiny Wan 2.2 LoRA, 2 gloo ranks in one sequence group (Ulysses: each rank half the tokens)",
        ranks=2,
        sequence=2,
    ),
}


def common(out: Path, case: Case, folder: Path) -> dict[str, object]:
    """One rollout of 2 samples a prompt, 3 sampling steps, one trained step each (the micro-batch of
    each rank is :data:`MICRO_BATCH` examples); the tiny Flow-GRPO recipe underneath."""
    groups = case.ranks // case.sequence
    return {
        "run.output_dir": str(out),
        "model.path": str(folder),
        "algorithm.params": "{step_strategy: {name: sde_window, size: 1, range: [0, 2]}}",
        "sampling.num_steps": 3,
        "rollout.batch_size": groups,
        "rollout.n_samples_per_prompt": MICRO_BATCH,
        "rollout.micro_group_size": MICRO_BATCH,
        "train.batch_size": MICRO_BATCH * groups,
        "train.micro_batch_size": MICRO_BATCH,
        "train.iterations": 1,
        "rewards": "[{name: tests.rewards:brightness}]",
        "eval.enabled": "false",
    }


def write_sd3(path: Path) -> None:
    """The integration tests' tiny SD3 with a wider transformer: 6 blocks (the last one
    context-pre-only) of 4 heads of 32, positions for 128 px."""
    from tests.integration.test_sd3 import write_tiny_sd3

    write_tiny_sd3(
        path,
        size=128,
        sample_size=32,
        num_layers=6,
        attention_head_dim=32,
        num_attention_heads=4,
        caption_projection_dim=128,
        pos_embed_max_size=32,
    )


def write_flux(path: Path) -> None:
    """The integration tests' tiny FLUX.1 with a wider transformer: 2 double and 4 single blocks of
    4 heads of 32, distilled guidance."""
    from tests.integration.test_flux import write_tiny_flux

    write_tiny_flux(
        path,
        size=128,
        num_layers=2,
        num_single_layers=4,
        attention_head_dim=32,
        num_attention_heads=4,
        axes_dims_rope=(8, 12, 12),
    )


def write_wan(path: Path) -> None:
    """The integration tests' tiny Wan 2.2 (two experts, the boundary at 0.7) with wider experts:
    4 blocks of 2 heads of 32 each."""
    from tests.integration.test_wan import write_tiny_wan

    write_tiny_wan(path, two_experts=True, attention_head_dim=32, ffn_dim=128, num_layers=4)


def write_folders(root: Path, names: set[str]) -> dict[str, Path]:
    """The tiny folders ``names`` needs (LTX-2: the integration test's own writer)."""
    import torch

    from tests.integration.test_ltx2 import write_tiny_ltx2

    writers = {"sd3": write_sd3, "flux": write_flux, "wan22": write_wan, "ltx2": write_tiny_ltx2}
    folders = {}
    for name in sorted(names):
        torch.manual_seed(0)  # the tests' writers seed theirs; LTX-2's is seeded here
        folders[name] = root / name
        writers[name](folders[name])
    return folders


# ---- what a step starts with, and its peaks ------------------------------------------------------


def tensors_of(obj) -> list:
    """The tensors an examples dataclass holds (its conditioning's too)."""
    import torch

    from diffrl.core.rollout import Conditioning

    out = []

    def visit(v) -> None:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, Conditioning):
            for t in v.tensors.values():
                visit(t)
        elif isinstance(v, dict):
            for t in v.values():
                visit(t)
        elif isinstance(v, list | tuple):
            for t in v:
                visit(t)
        elif is_dataclass(v):
            for f in fields(v):
                visit(getattr(v, f.name))

    visit(obj)
    return out


def held_by_actor(actor) -> list:
    """What the actor holds for training on this rank: the transformer's parameters and buffers
    (LoRA's adapters with it), the full fine-tune's reference and old-policy copies, AdamW's state."""
    modules = [actor.family.transformer, actor.policy._reference]
    if actor.policy.old is not None:
        modules.append(actor.policy.old.module)
    out = []
    for m in modules:
        if m is not None:
            out += [*m.parameters(), *m.buffers()]
    for state in actor.optimizer.state.values():
        out += [v for v in state.values() if hasattr(v, "untyped_storage")]
    return out


def _fresh() -> None:
    """Free what is free: Python's garbage and glibc's cached pages."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def rss_rise(step) -> int | None:
    """The rise of this process's peak resident memory during ``step()`` (None where the peak
    cannot be reset)."""
    _fresh()
    with open("/proc/self/statm") as f:
        before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return None
    step()
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024 - before
    return None


def measure(actor, algorithm, mb, total: int | None, family, single: bool) -> dict[str, object]:
    """The step's memory by the three measures and its FLOPs (see the module's docstring)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from diffrl.plan.allocated import allocated_rise, storage_bytes

    def step() -> None:
        actor.train_step(mb, algorithm, total)

    actor.train_step(mb, algorithm, total)  # warm-up: AdamW's state, the kernels' first calls
    actor.optimizer.zero_grad(set_to_none=True)  # the step starts so (before its first op)
    start = storage_bytes([*held_by_actor(actor), *tensors_of(mb)])
    rss = rss_rise(step)
    rises = []
    for _ in range(REPEATS):
        actor.optimizer.zero_grad(set_to_none=True)
        rises.append(allocated_rise(step))
    alloc = int(statistics.median(rises))
    actor.optimizer.zero_grad(set_to_none=True)
    with FlopCounterMode(display=False) as counter:
        step()
    train_flops = counter.get_total_flops()
    tracked = None
    if single:
        from diffrl.plan.planner import _FrozenAwareMemTracker

        actor.optimizer.zero_grad(set_to_none=True)
        tracker = _FrozenAwareMemTracker()
        modules = [m for m in (actor.family.transformer, actor.policy._reference) if m is not None]
        if actor.policy.old is not None and actor.policy.old.module is not None:
            modules.append(actor.policy.old.module)
        tracker.track_external(*modules, actor.optimizer, *tensors_of(mb))
        try:
            with tracker:
                step()
            tracked = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        except NotImplementedError:  # MemTracker takes one forward of a module per step: not a KL's second
            tracked = None
    # one guided sampling velocity of the micro-batch's samples (a rollout step's forward)
    x = mb.x_t if hasattr(mb, "x_t") else mb.x0
    sigma = mb.sigma if hasattr(mb, "sigma") else mb.t
    g = actor.policy.guidance_scale
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        family.velocity(x, sigma, mb.cond, g, actor.policy.negative(mb.cond))
    return {
        "start_bytes": start,
        "allocated_peak": start + alloc,
        "allocated_rise": alloc,
        "allocated_peaks": [start + r for r in rises],
        "rss_peak": None if rss is None else start + rss,
        "rss_rise": rss,
        "tracker_peak": tracked,
        "train_flops": train_flops,
        "sampling_flops": counter.get_total_flops(),
        "examples": len(mb),
    }


# ---- one configuration, in its own process ------------------------------------------------------------


def _config(name: str, folder: Path, out: Path, **extra):
    from diffrl.preflight import load_config

    case = CASES[name]
    overrides = {**common(out, case, folder), **case.overrides, **extra}
    return load_config(
        str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"), [f"{k}={v}" for k, v in overrides.items()]
    )


def _examples(config, algorithm, family, actor):
    """One rollout (random scores) and its first optimizer step's examples."""
    import torch

    from diffrl.sampling.engine import build_collector
    from diffrl.train.batches import optimizer_steps

    spec = algorithm.collection_spec()
    collector = build_collector(config, family, spec)
    family.transformer.eval()
    with torch.no_grad(), actor.policy.sampling_weights() as module:
        batch = collector.collect(0, module)
    batch.rewards = torch.rand(len(batch), generator=torch.Generator().manual_seed(0))
    examples = algorithm.build_train_data(batch, algorithm.postprocess_rewards(batch, batch.rewards), 0)
    steps = config.rollout.num_steps_per_rollout if spec.online else 1
    return optimizer_steps(batch, examples, steps, config.run.seed, 0)[0]


def _actor(config, algorithm, family, dist=None):
    from diffrl.train.actor import Actor

    return Actor(
        family,
        config,
        keep_reference=algorithm.needs_reference,
        keep_old=algorithm.keeps_old_policy,
        dist=dist,
        sample_with_old=algorithm.samples_with_old_policy,
    )


def _rank(rank: int, config, examples, port: int, out: str) -> None:
    import torch

    from diffrl.algorithms.registry import build_algorithm
    from diffrl.core.parallel import init_distributed
    from diffrl.distributed.ray.sharding import shard_steps
    from diffrl.models.registry import load_family

    p = config.parallel
    ctx = init_distributed(rank, p.trainer_ranks, "127.0.0.1", port, "gloo", torch.device("cpu"), p.sequence)
    torch.manual_seed(config.run.seed)
    algorithm = build_algorithm(config)
    family = load_family(config)
    actor = _actor(config, algorithm, family, ctx)
    [(share, total, count)] = shard_steps(
        [examples], p.trainer_ranks, config.train.micro_batch_size, p.sequence
    )[0][rank]
    actor.policy.micro_batch_count = count
    mb = actor.before_update(share, algorithm)
    result = measure(actor, algorithm, mb, total, family, single=False)
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()
    os._exit(0)  # skip the teardown where gloo's threads race C++ destructors (see tests/ranks.py)


def child(name: str, folder: Path) -> None:
    """Measure ``name`` and plan it; print one JSON line."""
    import torch

    from diffrl import launch
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.core.parallel import free_port
    from diffrl.models.registry import load_family
    from diffrl.plan.planner import plan

    torch.set_num_threads(1)
    case = CASES[name]
    with tempfile.TemporaryDirectory() as tmp:
        config = _config(name, folder, Path(tmp) / "run")
        torch.manual_seed(config.run.seed)
        algorithm = build_algorithm(config)
        if case.ranks == 1:
            family = load_family(config)
            actor = _actor(config, algorithm, family)
            step = _examples(config, algorithm, family, actor)
            mb = actor.before_update(step.select(range(MICRO_BATCH)), algorithm)
            ranks = [measure(actor, algorithm, mb, None, family, single=True)]
            del actor, family, mb
        else:
            from tests.ranks import run_ranks

            one = {"runner": "local", "parallel.trainer_ranks": 1, "parallel.sequence": 1}
            local = _config(name, folder, Path(tmp) / "local", **one)
            family, local_algorithm = load_family(local), build_algorithm(local)
            step = _examples(local, local_algorithm, family, _actor(local, local_algorithm, family))
            del family
            run_ranks(_rank, config, step, free_port(), tmp, nprocs=case.ranks)
            ranks = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(case.ranks)]
        gc.collect()
        t0 = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter()
        planned = plan(config, algorithm, launch.layout(config))
        t1 = resource.getrusage(resource.RUSAGE_SELF)
        plan_cpu = t1.ru_utime + t1.ru_stime - t0.ru_utime - t0.ru_stime
    m = planned.memory
    per_example = planned.train_flops / planned.examples
    print(
        json.dumps(
            {
                "name": name,
                "plan": {
                    "peak": m.peak,
                    "parameters": m.parameters,
                    "gathered": m.gathered,
                    "gradients": m.gradients,
                    "optimizer": m.optimizer,
                    "activations": m.activations,
                    "temporary": m.temporary,
                    "rows": planned.rows,
                    "trainable": planned.trainable,
                    "train_flops_per_example": per_example,
                    "forward_flops_per_sample": planned.forward_flops_per_sample,
                    "cpu_s": round(plan_cpu, 2),
                    "wall_s": round(time.perf_counter() - wall, 2),
                },
                "ranks": ranks,
            }
        )
    )


# ---- the table ------------------------------------------------------------------------------------


def run_child(name: str, folder: Path) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--folder", str(folder)]
    # large blocks straight from (and back to) the kernel: RSS then follows the tensors
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 2**10), "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if out.returncode:
        sys.stderr.write(out.stdout[-4000:] + out.stderr[-8000:])
        return {"name": name, "error": f"the child failed with code {out.returncode}: {out.stderr[-300:]}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def summarise(row: dict) -> dict:
    """Plan / measured memory against the rank that allocated most (the median of its measured steps;
    the range: over its steps), and the FLOPs (a sequence group's ranks summed)."""
    case = CASES[row["name"]]
    p, r0 = row["plan"], row["ranks"][0]
    top = max(row["ranks"], key=lambda r: r["allocated_peak"])
    peaks = top.get("allocated_peaks", [top["allocated_peak"]])
    group = row["ranks"][: case.sequence]
    measured_train = sum(r["train_flops"] for r in group)
    measured_sampling = sum(r["sampling_flops"] for r in group)
    n = r0["examples"]
    out = {
        "peak_vs_allocated": p["peak"] / top["allocated_peak"],
        "peak_vs_allocated_range": [p["peak"] / max(peaks), p["peak"] / min(peaks)],
        "rank_allocated_most": row["ranks"].index(top),
        "peak_vs_rss": p["peak"] / r0["rss_peak"] if r0["rss_peak"] else None,
        "peak_vs_tracker": p["peak"] / r0["tracker_peak"] if r0["tracker_peak"] else None,
        "train_flops_vs_counter": p["train_flops_per_example"] * n / measured_train,
        "sampling_flops_vs_counter": p["forward_flops_per_sample"] * n / measured_sampling,
    }
    out["within_tolerance"] = abs(out["peak_vs_allocated"] - 1) <= TOLERANCE
    return out


def machine() -> dict[str, object]:
    import platform

    import torch

    from diffrl.core.pins import cpu_model, cpu_vendor

    return {
        "cpu": cpu_model(),
        "vendor": cpu_vendor(),
        "cores": os.cpu_count(),
        "affinity": sorted(os.sched_getaffinity(0)),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--folder", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.list:
        for name, case in CASES.items():
            print(f"{name:16s} {case.note}")
        return
    if args.child:
        child(args.child, Path(args.folder))
        return
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        raise SystemExit(f"unknown configurations {unknown}; known: {', '.join(CASES)}")
    mib = 2**20
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folders = write_folders(Path(tmp), {CASES[n].folder for n in names})
        print(
            "| config | ranks | plan MiB | allocated MiB | plan/allocated [over steps] | RSS MiB | plan/RSS | tracker MiB "
            "| plan/tracker | train FLOPs plan/counter | sampling FLOPs plan/counter | plan CPU s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for name in names:
            row = run_child(name, folders[CASES[name].folder])
            rows.append(row)
            if "error" in row:
                print(f"| {name} | {row['error'][:200]} |", flush=True)
                continue
            row["ratios"] = summarise(row)
            p, r0, q = row["plan"], row["ranks"][0], row["ratios"]
            top = row["ranks"][q["rank_allocated_most"]]

            def f(v, scale=mib, digits=2):
                return "-" if v is None else f"{v / scale:.{digits}f}"

            lo, hi = q["peak_vs_allocated_range"]
            print(
                f"| {name} | {CASES[name].ranks} | {f(p['peak'])} | {f(top['allocated_peak'])} | "
                f"{q['peak_vs_allocated']:.3f} [{lo:.3f}-{hi:.3f}] | {f(r0['rss_peak'])} | {f(q['peak_vs_rss'], 1, 3)} | "
                f"{f(r0['tracker_peak'])} | {f(q['peak_vs_tracker'], 1, 3)} | {q['train_flops_vs_counter']:.3f} | "
                f"{q['sampling_flops_vs_counter']:.3f} | {p['cpu_s']:.1f} |",
                flush=True,
            )
    within = sum(r["ratios"]["within_tolerance"] for r in rows if "ratios" in r)
    failed = [r["name"] for r in rows if "error" in r]
    print(f"\n{within} of {len(rows)} configurations within {TOLERANCE:.0%} of the allocated peak")
    if failed:
        print(f"failed (see above): {', '.join(failed)}")
    if args.out:
        result = {
            "machine": machine(),
            "command": "python " + " ".join([Path(__file__).relative_to(ROOT).as_posix(), *sys.argv[1:]]),
            "tolerance": TOLERANCE,
            "micro_batch": MICRO_BATCH,
            "configs": {
                n: {"note": CASES[n].note, "ranks": CASES[n].ranks, "sequence": CASES[n].sequence}
                for n in names
            },
            "rows": rows,
        }
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
