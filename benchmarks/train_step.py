"""Training-step benchmark on the tiny model: each algorithm's step against the bare model work it
does, samples/s of whole iterations, and memory per rollout sample and per training example.

    python benchmarks/train_step.py [--algorithms flow_grpo,diffusion_nft,awm,sft] [--options eager,bf16]
                                    [--repeats 3] [--prompts 8] [--samples 8] [--micro-batch 16]
                                    [--steps 10] [--memory-steps 10,20] [--threads N]
                                    [--skip timing|memory] [--set KEY=VALUE ...]
    python benchmarks/train_step.py --quick    # smoke run: 2 prompts x 4 samples, 1 repeat, steps 4,8 in (c)

Each algorithm runs its recipe (``recipes/tiny_{grpo,nft,awm}_ocr.yaml``, ``tiny_sft.yaml``) with eval
off and the sizes above as overrides (SFT: one step of prompts x samples examples), under each option:
``eager``, ``bf16`` (model.autocast=bfloat16), ``compile`` (model.compile=true), ``bf16+compile``.
Prints

 (a) training-step efficiency = time of the bare forward+backward of one optimizer step's
     micro-batches / time of ``Actor.train_step`` on the same examples; target >= 0.9. The bare
     work is the transformer calls the algorithm's loss makes (same inputs, shapes and CFG, the
     old-policy / reference forwards without gradient included, SFT's caption encoding), a trivial
     loss (the mean squared velocity) and its backward: no loss math, no metrics, no optimizer. The step
     adds all of those (clipping and AdamW included). Its examples are those of the first optimizer
     step of a warm-up ``Driver.iteration`` (a real rollout with its OCR rewards), as the driver
     handed them to the runner, then ``before_update``; each step moves the weights, which does not
     change its cost.
 (b) samples/s end to end: rollout samples / seconds of one ``Driver.iteration`` (rollout and its
     rewards, ``before_update``, the optimizer steps, the old-policy update), with its stage times
     and MFU from the ``perf/*`` metrics.
 (c) memory, one fresh child process per row: the peak of one rollout and of one training step
     above the baseline after loading the model and a warm-up, per rollout sample and per training
     example, next to the exact bytes of the tensors the RolloutBatch / TrainExamples hold. CPU:
     peak RSS (VmHWM, reset between the phases; glibc returns large blocks to the OS at once, so RSS
     follows the tensors); CUDA: max allocated. At two ``sampling.num_steps``: DiffusionNFT and AWM
     keep x0 only, so their figure per sample is flat; Flow-GRPO, recording every step here
     (``step_strategy={name: all}``), grows with the steps. RSS is coarse (pages, allocator
     caches, a micro-batch's activations): the exact bytes show small differences. The rewards
     here are random numbers (no OCR workers: scores do not change the memory).

Timings interleave the contenders ((a): step and bare alternately, in alternating order; the options
one after the other) and report the median of the repeats with the min-max spread. On a shared
machine, ``--threads 1`` is much steadier: two threads on two busy cores wait on each other.
The verdict of (a) comes from each repeat's own bare / step ratio (``diffrl.bench.verdict``): PASS or
MISS only when every repeat is on the same side of the target, else "inconclusive: spread X exceeds
the effect Y" and exit code 4 once everything is printed (``--quick``'s one repeat shows no spread,
so it gives none). The "flat" verdict of (c) is on exact byte counts: one measurement suffices.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import torch

from diffrl.algorithms.forward_process import noised
from diffrl.algorithms.registry import build_algorithm
from diffrl.bench.verdict import Claim, Verdict, conclude, judge, paired_ratios
from diffrl.core.rollout import Conditioning, RolloutBatch, TrainExamples
from diffrl.launch import runner_class
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.engine import build_collector
from diffrl.train.actor import Actor
from diffrl.train.batches import optimizer_steps
from diffrl.train.loop import Driver
from diffrl.train.session import TrainSession
from diffrl.train.stop import StopSignals

RECIPES = {
    "flow_grpo": "tiny_grpo_ocr_small",
    "diffusion_nft": "tiny_nft_ocr",
    "awm": "tiny_awm_ocr",
    "sft": "tiny_sft",
}
OPTIONS = {
    "eager": [],
    "bf16": ["model.autocast=bfloat16"],
    "compile": ["model.compile=true"],
    "bf16+compile": ["model.autocast=bfloat16", "model.compile=true"],
}
TARGET = 0.9
FLAT = 1.05
"""(c): the most a rollout sample's held bytes may grow from the fewer to the more sampling steps
for an algorithm that keeps x0 only."""
MEMORY_STRATEGY = "algorithm.params.step_strategy={name: all}"
"""Flow-GRPO's memory rows record every step, so the trajectory grows with ``sampling.num_steps``."""


# ---- configuration ---------------------------------------------------------------------------------


def overrides(name: str, args, extra: list[str] = ()) -> list[str]:
    """The recipe's overrides for the benchmark's sizes (train.batch_size follows the rollout)."""
    recipe = f"recipes/{RECIPES[name]}.yaml"
    n = args.prompts * args.samples
    out = [
        "eval.enabled=false",
        f"sampling.num_steps={args.steps}",
        f"train.micro_batch_size={args.micro_batch}",
    ]
    if name == "sft":  # offline: one step of the same number of examples as a rollout has samples
        out += [f"train.batch_size={n}", f"data.dataset_size={max(1024, n)}"]
    else:
        steps = load_config(recipe, ["eval.enabled=false"]).rollout.num_steps_per_rollout
        if n % steps:
            raise SystemExit(f"{name}: {n} samples per rollout do not split into {steps} optimizer steps")
        out += [
            f"rollout.batch_size={args.prompts}",
            f"rollout.n_samples_per_prompt={args.samples}",
            f"rollout.micro_group_size={args.micro_batch}",
            f"train.batch_size={n // steps}",
        ]
    return [*out, *args.set, *extra]


def config_for(name: str, option: str, args, extra: list[str] = ()):
    return load_config(f"recipes/{RECIPES[name]}.yaml", overrides(name, args, [*OPTIONS[option], *extra]))


def rollout_samples(config) -> int:
    r = config.rollout
    return (
        config.train.batch_size if config.algorithm.name == "sft" else r.batch_size * r.n_samples_per_prompt
    )


def device_done(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


# ---- the bare forward+backward ----------------------------------------------------------------------


@dataclass
class Call:
    """One transformer call of a loss: ``weights`` live (with gradient), old or reference (without).
    ``prompts`` instead of ``cond``: encoded in the call (with gradient when the text encoder trains)."""

    weights: str
    x_t: torch.Tensor
    sigma: torch.Tensor
    cond: Conditioning | None
    prompts: list[str] | None = None
    guidance: float = 1.0
    negative: Conditioning | None = None


def _with_kl(algorithm, calls: list[Call]) -> list[Call]:
    """The reference forward an algorithm adds for its KL (``kl_beta > 0``), on the live call's inputs."""
    if getattr(algorithm.params, "kl_beta", 0.0) > 0:
        live = next(c for c in calls if c.weights == "live")
        calls.append(
            Call("reference", live.x_t, live.sigma, live.cond, live.prompts, live.guidance, live.negative)
        )
    return calls


def grpo_calls(algorithm, policy, mb) -> list[Call]:
    """FlowGRPO.compute_loss: the CFG velocity of each recorded x_t (the replay)."""
    g = algorithm.config.sampling.guidance_scale
    return _with_kl(
        algorithm, [Call("live", mb.x_t, mb.sigma, mb.cond, guidance=g, negative=policy.negative(mb.cond))]
    )


def nft_calls(algorithm, policy, mb) -> list[Call]:
    """DiffusionNFT.compute_loss: the old policy's velocity (no gradient), then the live one."""
    p, x_t = algorithm.params, noised(mb.x0, mb.noise, mb.t)
    g = algorithm.config.sampling.guidance_scale if p.train_cfg else 1.0
    neg = policy.negative(mb.cond) if p.train_cfg else None
    return _with_kl(
        algorithm,
        [
            Call("old", x_t, mb.t, mb.cond, guidance=g, negative=neg),
            Call("live", x_t, mb.t, mb.cond, guidance=g, negative=neg),
        ],
    )


def awm_calls(algorithm, policy, mb) -> list[Call]:
    """AWM.compute_loss: the live velocity at the noised x0 (``before_update`` is not in the step)."""
    p, x_t = algorithm.params, noised(mb.x0, mb.noise, mb.t)
    g = algorithm.config.sampling.guidance_scale if p.train_cfg else 1.0
    neg = policy.negative(mb.cond) if p.train_cfg else None
    return _with_kl(algorithm, [Call("live", x_t, mb.t, mb.cond, guidance=g, negative=neg)])


def sft_calls(algorithm, policy, mb) -> list[Call]:
    """SFT.compute_loss: encode the captions, the velocity at the noised x0."""
    s = mb.sigma.view(-1, *[1] * (mb.x0.ndim - 1))
    return [Call("live", (1 - s) * mb.x0 + s * mb.noise, mb.sigma, None, prompts=mb.prompts)]


CALLS = {"flow_grpo": grpo_calls, "diffusion_nft": nft_calls, "awm": awm_calls, "sft": sft_calls}


def bare_plan(actor: Actor, algorithm, examples: TrainExamples) -> list[list[Call]]:
    """The calls of each micro-batch the step runs, inputs made up front (not timed)."""
    device = actor.family.device
    return [
        CALLS[algorithm.name](algorithm, actor.policy, mb.to(device))
        for mb in actor.policy.micro_batches(examples)
    ]


def bare_step(actor: Actor, plan: list[list[Call]]) -> None:
    """The forwards and a trivial loss's backward of every micro-batch, nothing else."""
    policy, family = actor.policy, actor.family
    forward = {"live": policy.velocity, "old": policy.old_velocity, "reference": policy.reference_velocity}
    actor.module.train()
    actor.optimizer.zero_grad(set_to_none=True)
    for calls in plan:
        loss = 0.0
        for c in calls:
            cond = c.cond if c.prompts is None else family.encode_prompts(c.prompts)
            v = forward[c.weights](c.x_t, c.sigma, cond, guidance_scale=c.guidance, negative=c.negative)
            if c.weights == "live":  # a dense gradient, as a real loss gives (v.mean()'s is one value)
                loss = loss + v.square().mean()
        loss.backward()
    device_done(family.device)


# ---- (a) and (b): one Driver per option ---------------------------------------------------------------


class Bench:
    """A Driver (in a temporary run folder) for one (algorithm, option), and its measurements."""

    def __init__(self, name: str, option: str, args, stack: contextlib.ExitStack):
        self.name, self.option = name, option
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="train_step_")))
        self.config = config_for(name, option, args, [f"run.output_dir={tmp / 'run'}"])
        stop = stack.enter_context(StopSignals())
        session = TrainSession(self.config, runner_class(self.config))
        with contextlib.redirect_stdout(io.StringIO()):  # its start-up lines
            session.open()
        stack.callback(session.folder.release)
        stack.callback(session.close, True)  # no report: the run folder is thrown away
        self.driver = Driver(session, stop)
        self.algorithm = session.algorithm  # the plugin itself (the driver holds its checked view)
        self.actor: Actor = self.driver.runner.actor
        self.notes = self.driver.runner.family.numerics.notes
        self.samples = rollout_samples(self.config)
        self.times = {"step": [], "bare": []}
        self.fb, self.opt, self.iterations = [], [], []

    def warm_up(self) -> None:
        """An iteration (reward workers, FLOP counting, compiles), keeping the examples of its first
        optimizer step: those (a) times, exactly as the driver made them."""
        runner, chunks = self.driver.runner, []

        def optimize(steps):
            chunks.extend(steps)
            return type(runner).optimize(runner, steps)

        runner.optimize = optimize
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # "MFU peak: ..."
                self.driver.iteration(0)
        finally:
            del runner.optimize
        if not chunks:
            raise SystemExit(f"{self.name}: the warm-up rollout had no scored sample (every reward failed)")
        self.examples = self.actor.before_update(chunks[0], self.algorithm)
        self.plan = bare_plan(self.actor, self.algorithm, self.examples)
        self.micro_batches = len(self.plan)
        self.forwards = [c.weights for c in self.plan[0]]
        self.train_step()
        bare_step(self.actor, self.plan)
        self.times = {"step": [], "bare": []}
        self.fb, self.opt = [], []

    def train_step(self) -> None:
        t0 = time.perf_counter()
        metrics = self.actor.train_step(self.examples, self.algorithm)
        self.times["step"].append(time.perf_counter() - t0)
        self.fb.append(metrics["perf/train_forward_backward_time"])
        self.opt.append(metrics["perf/optimizer_time"])

    def bare(self) -> None:
        t0 = time.perf_counter()
        bare_step(self.actor, self.plan)
        self.times["bare"].append(time.perf_counter() - t0)

    def iteration(self, it: int) -> None:
        metrics, _ = self.driver.iteration(it)
        self.iterations.append(metrics)


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def med(rows: list[dict], key: str) -> float:
    values = [r.get(key, 0.0) for r in rows]
    return statistics.median(values) if values else 0.0


ROLLOUT_PARTS = ("perf/rollout_encode_time", "perf/rollout_denoise_time", "perf/rollout_decode_time")
STAGES = [
    ("reward wait", "perf/reward_wait_time"),
    ("before update", "perf/before_update_time"),
    ("fwd+bwd", "perf/train_forward_backward_time"),
    ("optimizer", "perf/optimizer_time"),
]
"""The stages of an iteration after the rollout (``perf/rollout_time``, its parts above)."""


def run_timings(args) -> list[Verdict]:
    """(a) and (b); the verdicts of (a)."""
    print("\n(a) training-step efficiency: bare forward+backward / Actor.train_step, same micro-batches")
    print(
        f"    median seconds of {args.repeats} repeats (min-max); forwards per micro-batch: live (with "
        f"gradient), old / reference (without); target >= {TARGET}"
    )
    print(
        "| algorithm | option | examples | micro-batches x forwards | train_step s | of it fwd+bwd / optimizer | bare s | efficiency | |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    done: list[Bench] = []
    verdicts: list[Verdict] = []
    for name in args.algorithms:
        with contextlib.ExitStack() as stack:
            benches = [Bench(name, option, args, stack) for option in args.options]
            for b in benches:
                for note in b.notes:
                    print(f"    note ({name}, {b.option}): {note}")
                b.warm_up()
            for r in range(args.repeats):
                for b in benches:  # alternate the order, so a drift of the machine falls on both
                    if r % 2 == 0:
                        b.train_step()
                        b.bare()
                    else:
                        b.bare()
                        b.train_step()
            for r in range(args.repeats):
                for b in benches:
                    b.iteration(1 + r)
            for b in benches:
                eff = statistics.median(b.times["bare"]) / statistics.median(b.times["step"])
                # the verdict from each repeat's own ratio (its step and bare ran back to back)
                verdicts.append(judge(paired_ratios(b.times["bare"], b.times["step"]), Claim(TARGET)))
                forwards = "+".join(b.forwards)
                print(
                    f"| {name} | {b.option} | {len(b.examples)} | {b.micro_batches} x {forwards} | "
                    f"{spread(b.times['step'])} | {statistics.median(b.fb):.3f} / {statistics.median(b.opt):.3f} | "
                    f"{spread(b.times['bare'])} | {eff:.3f} | {verdicts[-1]} |",
                    flush=True,
                )
                b.driver, b.actor, b.examples, b.plan = None, None, None, None  # free the model
                done.append(b)
        gc.collect()

    print(
        f"\n(b) samples/s end to end: one Driver.iteration (median of {args.repeats}), stage seconds and MFU from perf/*"
    )
    print(
        "| algorithm | option | samples | iteration s | samples/s | rollout (encode/denoise/decode) | "
        + " | ".join(label for label, _ in STAGES)
        + " | other | MFU rollout / train |"
    )
    print("|---|---|---|---|---|---|" + "---|" * (len(STAGES) + 2))
    for b in done:
        rows = b.iterations
        it_s = statistics.median(r["perf/iteration_time"] for r in rows)
        rollout = med(rows, "perf/rollout_time")
        parts = [med(rows, key) for _, key in STAGES]
        # the old-policy update, metrics, the driver itself: per iteration, then the median
        other = statistics.median(
            r["perf/iteration_time"] - r.get("perf/rollout_time", 0.0) - sum(r.get(k, 0.0) for _, k in STAGES)
            for r in rows
        )
        print(
            f"| {b.name} | {b.option} | {b.samples} | {spread([r['perf/iteration_time'] for r in rows])} | "
            f"{b.samples / it_s:.1f} | {rollout:.3f} ({'/'.join(f'{med(rows, k):.2f}' for k in ROLLOUT_PARTS)}) | "
            + " | ".join(f"{v:.3f}" for v in parts)
            + f" | {other:.3f} | {med(rows, 'perf/rollout_mfu'):.1%} / {med(rows, 'perf/train_mfu'):.1%} |"
        )
    return verdicts


# ---- (c) memory, in a fresh process per row -------------------------------------------------------------


def held_bytes(obj) -> int:
    """Bytes of the distinct tensor storages a batch dataclass holds (views counted once)."""
    seen: dict[int, int] = {}

    def visit(v) -> None:
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
        elif isinstance(v, Conditioning):
            for t in v.tensors.values():
                visit(t)
        elif isinstance(v, dict):
            for t in v.values():
                visit(t)
        elif is_dataclass(v):
            for f in fields(v):
                visit(getattr(v, f.name))

    visit(obj)
    return sum(seen.values())


class Peak:
    """Peak memory of a phase: RSS on CPU (the kernel's high-water mark reset at the phase's start,
    Linux), max allocated on CUDA."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.resets = True

    def now(self) -> int:
        if self.cuda:
            return torch.cuda.memory_allocated()
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def start(self) -> int:
        """Start a phase: free what is free (Python's garbage, glibc's cached pages, so the phase's
        peak is its own allocations and not their reuse), reset the peak; the memory in use now."""
        gc.collect()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
            return self.now()
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        try:  # "5": reset the peak RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.resets = False
        return self.now()

    def peak(self) -> int:
        if self.cuda:
            return torch.cuda.max_memory_allocated()
        # VmHWM: the high-water mark clear_refs resets. Not ru_maxrss: it also holds the RSS of the
        # image this process was forked from before its exec (the parent's), which nothing resets
        with contextlib.suppress(OSError):
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return max(int(line.split()[1]) * 1024, self.now())
        self.resets = False
        return max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, self.now())

    def describe(self) -> str:
        if self.cuda:
            return "CUDA max allocated"
        return "peak RSS (VmHWM)" if self.resets else "peak RSS since the process started (no reset here)"


def memory_child(args) -> None:
    """One rollout and one training step of ``--memory-child NAME:STEPS``; prints JSON."""
    name, steps = args.memory_child.split(":")
    args.steps = int(steps)
    extra = [MEMORY_STRATEGY] if name == "flow_grpo" else []
    config = config_for(name, "eager", args, extra)
    algorithm = build_algorithm(config)
    spec = algorithm.collection_spec()
    family = load_family(config)
    actor = Actor(
        family, config, keep_reference=algorithm.needs_reference, keep_old=algorithm.keeps_old_policy
    )
    collector = build_collector(config, family, spec)
    gen = torch.Generator().manual_seed(0)

    def rollout(it: int) -> RolloutBatch:
        family.transformer.eval()
        with actor.policy.sampling_weights() as module:
            batch = collector.collect(it, module)
        if spec.needs_reward:  # the scores do not change the memory: no OCR workers here
            batch.rewards = torch.rand(len(batch), generator=gen)
        return batch

    def examples_of(batch: RolloutBatch, it: int) -> TrainExamples:
        signals = algorithm.postprocess_rewards(batch, batch.rewards)
        examples = algorithm.build_train_data(batch, signals, it)
        n_steps = config.rollout.num_steps_per_rollout if spec.online else 1
        return optimizer_steps(batch, examples, n_steps, config.run.seed, it)[0]

    # warm-up: one rollout, one micro-batch's step (kernels, caches, the optimizer's state)
    batch = rollout(0)
    warm = examples_of(batch, 0)
    warm = warm.select(range(min(len(warm), config.train.micro_batch_size)))
    actor.train_step(actor.before_update(warm, algorithm), algorithm)
    del batch, warm

    peak = Peak(family.device)
    base = peak.start()  # the baseline: the model, its optimizer state, the warm caches
    batch = rollout(1)
    rollout_peak = peak.peak() - base
    peak.start()  # the training phase's peak, still above the same baseline (the batch is held)
    examples = actor.before_update(examples_of(batch, 1), algorithm)
    actor.train_step(examples, algorithm)
    train_peak = peak.peak() - base
    print(
        json.dumps(
            {
                "name": name,
                "steps": int(steps),
                "recorded": 0 if batch.traj_x is None else batch.traj_x.shape[1],
                "samples": len(batch),
                "examples": len(examples),
                "rollout_peak": rollout_peak,
                "rollout_held": held_bytes(batch),
                "train_peak": train_peak,
                "examples_held": held_bytes(examples),
                "measure": peak.describe(),
            }
        )
    )


def run_memory(args) -> list[Verdict]:
    """(c), one fresh process per row; the verdicts of "flat" (exact byte counts: one row each)."""
    mib, kib = 2**20, 2**10
    rows, verdicts = [], []
    for name in args.algorithms:
        for steps in args.memory_steps[:1] if name == "sft" else args.memory_steps:  # SFT does not sample
            cmd = [
                sys.executable,
                __file__,
                "--memory-child",
                f"{name}:{steps}",
                "--prompts",
                str(args.prompts),
                "--samples",
                str(args.samples),
                "--micro-batch",
                str(args.micro_batch),
                *(["--threads", str(args.threads)] if args.threads else []),
                *(["--set", *args.set] if args.set else []),
            ]
            # large blocks straight from (and back to) the OS: RSS then follows the tensors
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 2**10)}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if out.returncode:
                sys.stderr.write(out.stderr)
                raise SystemExit(f"memory child {name}:{steps} failed with code {out.returncode}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    measure = rows[0]["measure"] if rows else ""
    print(
        f"\n(c) memory above the baseline after loading the model and a warm-up ({measure}; eager; one "
        "fresh process per row; Flow-GRPO records every step here)"
    )
    print(
        "| algorithm | sampling steps | recorded steps | samples | rollout peak MiB/sample | batch holds KiB/sample "
        "| examples | train-step peak MiB/example | examples hold KiB/example |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} | {'-' if r['name'] == 'sft' else r['steps']} | {r['recorded']} | {r['samples']} | "
            f"{r['rollout_peak'] / mib / r['samples']:.3f} | {r['rollout_held'] / kib / r['samples']:.1f} | "
            f"{r['examples']} | {r['train_peak'] / mib / r['examples']:.3f} | {r['examples_held'] / kib / r['examples']:.1f} |"
        )
    if len(args.memory_steps) >= 2:
        lo, hi = args.memory_steps[0], args.memory_steps[-1]
        print(f"growth from {lo} to {hi} sampling steps, per rollout sample (exact held bytes; peak):")
        for name in [n for n in args.algorithms if n != "sft"]:
            a = next(r for r in rows if r["name"] == name and r["steps"] == lo)
            b = next(r for r in rows if r["name"] == name and r["steps"] == hi)
            held = b["rollout_held"] / b["samples"] / (a["rollout_held"] / a["samples"])
            pk = (b["rollout_peak"] / b["samples"]) / max(1, a["rollout_peak"] / a["samples"])
            if name == "flow_grpo":
                verdict = "grows with the recorded steps"
            else:  # the held bytes are exact, not timed: one measurement is the whole answer
                verdicts.append(judge([held], Claim(FLAT, at_least=False, min_rounds=1)))
                verdict = f"flat, held x<={FLAT}: {verdicts[-1]}"
            print(f"  {name}: held x{held:.3f}, peak x{pk:.2f}  ({verdict})")
    return verdicts


# ---- main ---------------------------------------------------------------------------------------------


def names_in(choices):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        bad = [t for t in items if t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {', '.join(bad)}; known: {', '.join(choices)}")
        return items

    return parse


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--algorithms", type=names_in(RECIPES), default=list(RECIPES))
    parser.add_argument("--options", type=names_in(OPTIONS), default=["eager"], help="e.g. eager,bf16")
    parser.add_argument("--repeats", type=int, help="default 3 (--quick: 1)")
    parser.add_argument("--prompts", type=int, help="rollout.batch_size; default 8 (--quick: 2)")
    parser.add_argument("--samples", type=int, help="rollout.n_samples_per_prompt; default 8 (--quick: 4)")
    parser.add_argument(
        "--micro-batch",
        type=int,
        help="train.micro_batch_size and rollout.micro_group_size; default 16 (--quick: 4)",
    )
    parser.add_argument("--steps", type=int, default=10, help="sampling.num_steps for (a) and (b)")
    parser.add_argument(
        "--memory-steps",
        type=lambda s: [int(x) for x in s.split(",")],
        help="the sampling.num_steps of (c); default 10,20 (--quick: 4,8)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--skip", type=names_in(["timing", "memory"]), default=[], help="parts to leave out")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="overrides for every run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 prompts x 4 samples, 1 repeat")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    for key, full, quick in (
        ("repeats", 3, 1),
        ("prompts", 8, 2),
        ("samples", 8, 4),
        ("micro_batch", 16, 4),
        ("memory_steps", [10, 20], [4, 8]),
    ):
        if getattr(args, key) is None:
            setattr(args, key, quick if args.quick else full)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(args)
        return 0

    n = args.prompts * args.samples
    print(
        f"tiny model, torch threads {torch.get_num_threads()}, {'cuda' if torch.cuda.is_available() else 'cpu'}; "
        f"rollout {args.prompts} prompts x {args.samples} samples = {n} ({args.steps} steps, CFG as each recipe), "
        f"micro-groups and micro-batches of {args.micro_batch}; SFT: steps of {n} examples; "
        f"options {','.join(args.options)}; repeats {args.repeats}"
        + (f"; overrides {' '.join(args.set)}" if args.set else "")
    )
    verdicts: list[Verdict] = []
    if "timing" not in args.skip:
        verdicts += run_timings(args)
    if "memory" not in args.skip:
        verdicts += run_memory(args)
    return conclude(verdicts)  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
