"""Rollout benchmark: diffrl's collector vs diffusers' ``StableDiffusion3Pipeline`` vs flow_grpo's
``pipeline_with_logprob``, measured side by side in one run, eager and with each speed option.

    python benchmarks/rollout.py --model both --options eager,bf16 --repeats 3 \\
        --flow-grpo /path/to/flow_grpo      # a checkout of github.com/yifan123/flow_grpo

Models: ``tiny`` (the shipped tiny base, pixel space 32 x 64) and ``sd3`` (a tiny random SD3 with
every part of the real one, written to a temp dir as ``tests/integration/test_sd3.py`` does, 16 x 16
pixels, loaded through the ``sd3`` family). Options (``--options``, a subset): ``eager``, ``bf16``
(``model.autocast=bfloat16``), ``compile`` (``model.compile=true``), ``bf16+compile``.

Every contender samples the same ``--batch`` images in one batched call (prompts, initial noise,
steps, size, CFG with the negative prompt "" all the same), from the same prompt embeddings (the
family's encoders and prompt cache), and ends with uint8 images decoded by the model's VAE:

- collector: ``OnlineCollector.collect`` running Flow-GRPO's SDE kernel on every step, keeping the
  trajectory and log-probs (``--collector-steps window``: the recipe's 2-step window instead);
- diffusers: ``StableDiffusion3Pipeline`` over the family's modules (Euler ODE), ``output_type="pt"``;
- flow_grpo: ``pipeline_with_logprob`` on that pipeline, called as its ``scripts/train_sd3.py``
  does (SDE on every step, log-probs, ``output_type="pt"``); imported from ``--flow-grpo PATH``;
- bare forwards: only the transformer calls the collector makes (for the engine efficiency).

The tiny model has no VAE (its latent is the image in [-1, 1]): the pipelines get a pass-through
"VAE" whose output their postprocess maps to [0, 1] exactly as the family's ``decode`` does.

Speed options apply to all contenders: each option loads its own family, and its contenders share
that family's transformer; ``compile`` compiles it in place (``nn.Module.compile``, as the family
does), so the pipelines call the compiled module too (their call compiles graphs of its own, in
their warm-up); ``bf16`` runs each pipeline call under the context the family's forwards run in
(``torch.autocast`` bfloat16, attention in float32 on CPU), around the whole call as flow_grpo's
train script does (so their VAE decode autocasts too; the collector decodes in float32).

Prints a table (median seconds, min-max, images/s, ratio vs the diffusers pipeline at the same option,
ratio vs the float32 eager collector, warm-up seconds incl. compiling, model GFLOP/s) and
 (a) engine efficiency: bare batched velocity forwards / collector, target >= 0.95;
 (b) collector vs diffusers' pipeline and vs flow_grpo's pipeline_with_logprob, same option, >= 1.15x;
 (d) the collector with the best option vs the float32 eager collector, target >= 1.6x;
 (c) peak memory of a Flow-GRPO rollout that records every step vs one with a 2-step window
     (each in a fresh child process, after a warm-up rollout: the peak RSS during the rollout on CPU,
     which includes the weights and libraries already resident; max allocated on CUDA).
Timings interleave the contenders and options within each repeat (the order rotates from repeat to
repeat) and take the median of the repeats (shared, noisy machines); warm-up calls are not timed.
The verdicts of (a), (b) and (d) come from each repeat's own ratio (``diffrl.bench.verdict``): PASS
or MISS only when every repeat is on the same side of the target, else "inconclusive: spread X
exceeds the effect Y" and exit code 4, after everything is printed (one repeat shows no spread).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # diffrl, and the tests' tiny SD3 builder

from diffrl.bench.verdict import Claim, Verdict, conclude, judge, paired_ratios  # noqa: E402

OPTIONS = {
    "eager": [],
    "bf16": ["model.autocast=bfloat16"],
    "compile": ["model.compile=true"],
    "bf16+compile": ["model.autocast=bfloat16", "model.compile=true"],
}
SD3_SIZE = 16  # pixels, as tests/integration/test_sd3.py: the tiny VAE halves them, patch 2 -> 4 x 4 tokens
SD3_MAX_TOKENS = 16  # T5 tokens (that test's sd3_config)
TARGET_EFFICIENCY, TARGET_VS_PIPELINES, TARGET_VS_FLOAT32 = 0.95, 1.15, 1.6
FLOW_GRPO_HINT = (
    "flow_grpo's pipeline_with_logprob: skipped; pass --flow-grpo PATH to a checkout of "
    "https://github.com/yifan123/flow_grpo to add it"
)


def config_overrides(model: str, args, sd3_dir: str | None, step_strategy: str) -> list[str]:
    """The recipe overrides of one benchmark model: one micro-group of ``--batch`` images."""
    common = [
        "model.lora=null",
        "eval.enabled=false",
        f"sampling.num_steps={args.steps}",
        f"sampling.guidance_scale={args.guidance}",
        f"rollout.batch_size={args.batch // args.group}",
        f"rollout.n_samples_per_prompt={args.group}",
        f"rollout.micro_group_size={args.batch}",
        f"train.batch_size={args.batch}",
        f"train.micro_batch_size={args.batch}",
        f"algorithm.params.step_strategy={step_strategy}",
    ]
    if model == "tiny":
        return [f"model.path={args.tiny_path}", *common]
    return [
        "model.family=sd3",
        f"model.path={sd3_dir}",
        f"model.options={{max_sequence_length: {SD3_MAX_TOKENS}}}",
        f"sampling.height={SD3_SIZE}",
        f"sampling.width={SD3_SIZE}",
        *common,
    ]


def strategy(kind: str, steps: int) -> str:
    if kind == "all":
        return "{name: all}"
    return f"{{name: sde_window, size: {min(2, steps)}, range: [0, {min(6, steps)}]}}"


def build(overrides: list[str]):
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.data.prompts import load_prompts
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.sampling.collector import OnlineCollector

    cfg = load_config(str(ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"), overrides)
    family = load_family(cfg)
    family.transformer.requires_grad_(False).eval()
    spec = build_algorithm(cfg).collection_spec()
    return cfg, family, OnlineCollector(cfg, family, spec, load_prompts(cfg.data.prompts))


class PixelSpace(nn.Module):
    """The tiny family's "VAE" for the pipelines: its latent is the image in [-1, 1], so decoding
    passes it through, and the pipelines' postprocess (``(x + 1) / 2``, clamped) is the family's
    ``decode``. One block: a 1x scale factor, so the pipelines take the sizes in pixels."""

    config = SimpleNamespace(scaling_factor=1.0, shift_factor=0.0, block_out_channels=[3])
    dtype = torch.float32

    def __init__(self, device: torch.device):
        super().__init__()
        self.device = device  # what the pipeline asks its modules for

    def decode(self, z: torch.Tensor, return_dict: bool = False) -> tuple[torch.Tensor]:
        return (z,)


def make_pipeline(family, collector):
    """``StableDiffusion3Pipeline`` over the family's own modules, with a scheduler of its own."""
    from diffusers import FlowMatchEulerDiscreteScheduler, StableDiffusion3Pipeline

    if hasattr(family, "pipeline"):  # a diffusers-folder family: its folder's pipeline
        pipe = family.pipeline()
    else:
        shift = collector.config.sampling.shift
        pipe = StableDiffusion3Pipeline(
            transformer=family.transformer,
            scheduler=FlowMatchEulerDiscreteScheduler(shift=family.default_shift if shift is None else shift),
            vae=PixelSpace(family.device),
            text_encoder=None,
            tokenizer=None,
            text_encoder_2=None,
            tokenizer_2=None,
            text_encoder_3=None,
            tokenizer_3=None,
        )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def load_flow_grpo(path: str | None):
    """flow_grpo's ``pipeline_with_logprob`` from the checkout at ``path`` (None: not given)."""
    if path is None:
        return None
    root = Path(path).expanduser().resolve()
    file = root / "flow_grpo" / "diffusers_patch" / "sd3_pipeline_with_logprob.py"
    if not file.is_file():
        raise SystemExit(f"--flow-grpo {path}: no {file.relative_to(root)} there; give a flow_grpo checkout")
    sys.path.insert(0, str(root))
    print(f"flow_grpo: pipeline_with_logprob from {file}")
    return importlib.import_module(
        "flow_grpo.diffusers_patch.sd3_pipeline_with_logprob"
    ).pipeline_with_logprob


@dataclass
class Setup:
    """One model at one speed option: its family, collector and the two pipelines."""

    option: str
    cfg: object
    family: object
    collector: object
    pipe: object
    grpo_pipe: object
    flops: float = 0.0
    """Model FLOPs of one rollout (the transformer forwards, the same for every contender)."""
    warmup: dict[str, float] = field(default_factory=dict)


def setup(option: str, overrides: list[str]) -> Setup:
    from diffrl.models.numerics import prepare

    cfg, family, collector = build([*overrides, *OPTIONS[option]])
    for note in family.numerics.notes:
        print(f"  {option}: {note}")
    # compile now, in place, so the pipelines (same module) run the compiled transformer too
    prepare(family.transformer, family.numerics)
    return Setup(
        option, cfg, family, collector, make_pipeline(family, collector), make_pipeline(family, collector)
    )


def prompts_of(s: Setup, rollout_id: int) -> list[str]:
    c = s.collector
    (chunk,) = c.plan(rollout_id).micro_groups
    return [c.prompts.prompts[p] for _, p, _ in chunk]


def draw(s: Setup, rollout_id: int):
    """The collector's prompts and initial noise of rollout ``rollout_id`` (one micro-group)."""
    from diffrl.sampling.sampler import initial_noise

    c = s.collector
    (chunk,) = c.plan(rollout_id).micro_groups
    prompts = prompts_of(s, rollout_id)
    keys = [(c.seed, "init", q, 0 if s.cfg.rollout.same_latent else j) for q, _, j in chunk]
    return prompts, initial_noise(s.family, keys, c.height, c.width)


def embeds(s: Setup, prompts: list[str]) -> dict[str, torch.Tensor]:
    cond = s.family.encode_prompts(prompts)
    neg = s.family.encode_prompts([s.cfg.sampling.negative_prompt]).repeat(len(prompts))
    return {
        "prompt_embeds": cond.tensors["encoder_hidden_states"],
        "pooled_prompt_embeds": cond.tensors["pooled_projections"],
        "negative_prompt_embeds": neg.tensors["encoder_hidden_states"].contiguous(),
        "negative_pooled_prompt_embeds": neg.tensors["pooled_projections"].contiguous(),
    }


def run_collector(s: Setup, rollout_id: int) -> torch.Tensor:
    batch = s.collector.collect(rollout_id)
    s.collector.clock.take()
    return batch.images


def run_bare(s: Setup, rollout_id: int) -> None:
    """Only the transformer calls the collector makes: same batch, steps and CFG."""
    c, family = s.collector, s.family
    prompts, x = draw(s, rollout_id)
    g = s.cfg.sampling.guidance_scale
    with torch.no_grad():
        cond = family.encode_prompts(prompts)
        neg = family.negative(s.cfg.sampling.negative_prompt, g)
        negative = neg.repeat(len(prompts)) if neg is not None else None
        for i in range(c.num_steps):
            family.velocity(x, c.sigmas[i].expand(len(prompts)), cond, g, negative)


def run_diffusers(s: Setup, rollout_id: int) -> torch.Tensor:
    from diffrl.core.rollout import quantize
    from diffrl.models.numerics import autocast

    prompts, x = draw(s, rollout_id)
    c = s.collector
    with autocast(s.family.numerics, s.family.device):
        images = s.pipe(
            **embeds(s, prompts),
            guidance_scale=s.cfg.sampling.guidance_scale,
            num_inference_steps=c.num_steps,
            height=c.height,
            width=c.width,
            latents=x,
            output_type="pt",
        ).images
    return quantize(images)


def run_flow_grpo(pipeline_with_logprob, s: Setup, rollout_id: int) -> torch.Tensor:
    from diffrl.core.rollout import quantize
    from diffrl.models.numerics import autocast

    prompts, x = draw(s, rollout_id)
    c = s.collector
    # as flow_grpo's scripts/train_sd3.py samples, but with the collector's initial noise
    with autocast(s.family.numerics, s.family.device), torch.no_grad():
        images, _latents, _log_probs = pipeline_with_logprob(
            s.grpo_pipe,
            **embeds(s, prompts),
            num_inference_steps=c.num_steps,
            guidance_scale=s.cfg.sampling.guidance_scale,
            output_type="pt",
            height=c.height,
            width=c.width,
            latents=x,
            noise_level=c.spec.noise_level,
        )
    return quantize(images)


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return time.perf_counter() - t0, out


def benchmark(model: str, args, sd3_dir: str | None, pipeline_with_logprob) -> list[Verdict]:
    """Measure and print one model's table, (a), (b), (d) and (c); the verdicts of (a), (b), (d)."""
    overrides = config_overrides(model, args, sd3_dir, strategy(args.collector_steps, args.steps))
    contenders = {
        "collector": run_collector,
        "bare forwards": run_bare,
        "diffusers pipeline": run_diffusers,
    }
    if pipeline_with_logprob is not None:
        contenders["flow_grpo pipeline_with_logprob"] = lambda s, r: run_flow_grpo(
            pipeline_with_logprob, s, r
        )
    setups = [setup(option, overrides) for option in args.options]
    s0 = setups[0]
    h, w = s0.collector.height, s0.collector.width
    sde = (
        "every step"
        if args.collector_steps == "all"
        else f"a 2-step window drawn per rollout (rollout 0: steps {s0.collector.plan(0).steps})"
    )
    print(
        f"\n== {model}: {args.batch} images per call ({args.batch // args.group} prompts x {args.group}), "
        f"{h}x{w} px, latent {tuple(s0.family.latent_shape(h, w))}, {args.steps} steps, CFG {args.guidance}, "
        f"torch threads {torch.get_num_threads()}\n"
        f"   collector: SDE (noise level {s0.collector.spec.noise_level}) on {sde}, trajectory and "
        f"log-probs kept; all contenders end with uint8 images decoded by "
        + (
            "the VAE"
            if model == "sd3"
            else "the tiny family's affine decode (pass-through VAE for the pipelines)"
        )
    )
    for s in setups:
        print(f"   {s.option}: {s.family.numerics.describe()}")
        for r in range(args.repeats + 1):  # fill the prompt cache: no contender pays for encoding
            s.family.encode_prompts(prompts_of(s, r))
        for name, fn in contenders.items():
            seconds, images = timed(fn, s, 0)
            s.warmup[name] = seconds
            if images is not None and (images.shape != (args.batch, 3, h, w) or images.dtype != torch.uint8):
                raise SystemExit(f"{name} ({s.option}) gave images {tuple(images.shape)} {images.dtype}")
        for pipe in (s.pipe, s.grpo_pipe) if pipeline_with_logprob is not None else (s.pipe,):
            theirs, ours = pipe.scheduler.sigmas.cpu(), s.collector.sigmas.cpu()
            if theirs.shape != ours.shape or not torch.allclose(theirs, ours, atol=1e-6):
                print(f"   WARNING: {s.option}: the pipeline's sigmas differ from the collector's")
        if s.family.meter.compile_seconds:
            print(
                f"   {s.option}: the collector's forwards spent {s.family.meter.compile_seconds:.1f} s compiling"
            )

    times = {(s.option, name): [] for s in setups for name in contenders}
    jobs = [(s, name) for s in setups for name in contenders]
    for r in range(1, args.repeats + 1):
        shift = (r - 1) % len(jobs)
        for s, name in jobs[shift:] + jobs[:shift]:
            flops0 = s.family.meter.flops
            seconds, _ = timed(contenders[name], s, r)
            times[(s.option, name)].append(seconds)
            if name == "collector":
                s.flops = s.family.meter.flops - flops0

    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        "   GFLOP/s: the transformer FLOPs of one rollout (family.meter, on the collector's forwards: the "
        "same forwards for every contender) / median s"
    )
    base = med.get(("eager", "collector"))
    print(
        f"   {'contender':<32} {'option':<13} {'median s':>9} {'min-max':>13} {'img/s':>7} "
        f"{'vs diffusers':>12} {'vs f32 coll.':>12} {'warm-up s':>9} {'GFLOP/s':>8}"
    )
    for s in setups:
        for name in contenders:
            m, v = med[(s.option, name)], times[(s.option, name)]
            vs_pipe = med[(s.option, "diffusers pipeline")] / m
            vs_base = f"{base / m:.2f}x" if base else "n/a"
            print(
                f"   {name:<32} {s.option:<13} {m:>9.3f} {f'{min(v):.3f}-{max(v):.3f}':>13} "
                f"{args.batch / m:>7.2f} {f'{vs_pipe:.2f}x':>12} {vs_base:>12} "
                f"{s.warmup[name]:>9.1f} {s.flops / m / 1e9:>8.1f}"
            )

    # each verdict from the per-repeat ratios (the contenders of a repeat ran side by side), never
    # from the medians alone: a spread wider than the effect gets no PASS or MISS
    verdicts: list[Verdict] = []

    def verdict(numerators: list[float], denominators: list[float], target: float) -> Verdict:
        verdicts.append(judge(paired_ratios(numerators, denominators), Claim(target)))
        return verdicts[-1]

    for s in setups:
        coll = med[(s.option, "collector")]
        eff = med[(s.option, "bare forwards")] / coll
        v = verdict(times[(s.option, "bare forwards")], times[(s.option, "collector")], TARGET_EFFICIENCY)
        print(
            f"   (a) {s.option:<13} engine efficiency  bare forwards / collector = {eff:.3f}  "
            f"(target >= {TARGET_EFFICIENCY})  {v}"
        )
        for other in ("diffusers pipeline", "flow_grpo pipeline_with_logprob"):
            if (s.option, other) not in med:
                continue
            ratio = med[(s.option, other)] / coll
            v = verdict(times[(s.option, other)], times[(s.option, "collector")], TARGET_VS_PIPELINES)
            print(
                f"   (b) {s.option:<13} collector vs {other:<31} = {ratio:.3f}x  "
                f"(target >= {TARGET_VS_PIPELINES})  {v}"
            )
    fast = [s.option for s in setups if s.option != "eager"]
    if base and fast:
        best = min(fast, key=lambda o: med[(o, "collector")])
        ratio = base / med[(best, "collector")]
        v = verdict(times[("eager", "collector")], times[(best, "collector")], TARGET_VS_FLOAT32)
        print(
            f"   (d) best option ({best}) collector vs float32 eager collector = {ratio:.3f}x  "
            f"(target >= {TARGET_VS_FLOAT32})  {v}"
        )
    else:
        print("   (d) best option vs float32 eager collector: n/a (run eager and at least one speed option)")
    if pipeline_with_logprob is None:
        print(f"   {FLOW_GRPO_HINT}")

    if args.no_memory:
        return verdicts
    rows = {}
    for mode in ("all", "window"):
        child = [*config_overrides(model, args, sd3_dir, strategy(mode, args.steps))]
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--threads",
                str(torch.get_num_threads()),
                "--memory-child",
                json.dumps(child),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    a, w = rows["all"], rows["window"]
    print(
        f"   (c) GRPO rollout peak memory: all {a['steps_recorded']} steps recorded {a['peak_bytes'] / 2**20:.1f} MiB "
        f"(trajectory {a['recorded_bytes'] / 2**20:.2f} MiB) vs 2-step window {w['peak_bytes'] / 2**20:.1f} MiB "
        f"(trajectory {w['recorded_bytes'] / 2**20:.2f} MiB); trajectory ratio {a['recorded_bytes'] / max(1, w['recorded_bytes']):.1f}x"
    )
    return verdicts


def rss_peak_bytes(reset: bool = False) -> int:
    """The process's peak resident memory; ``reset``: restart the peak from now (Linux's VmHWM,
    reset through /proc/self/clear_refs; elsewhere the peak since the process started)."""
    import resource

    try:
        if reset:
            Path("/proc/self/clear_refs").write_text("5")
        status = Path("/proc/self/status").read_text()
        return int(next(ln for ln in status.splitlines() if ln.startswith("VmHWM:")).split()[1]) * 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def memory_child(overrides: list[str]) -> None:
    """Run one recorded rollout and print its peak memory as JSON (called in a fresh process)."""
    _, family, collector = build(overrides)
    collector.collect(0)  # warm-up: the peak measured below is that of a rollout, not of the imports
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    rss_peak_bytes(reset=True)
    batch = collector.collect(1)
    recorded = sum(t.numel() * t.element_size() for t in (batch.traj_x, batch.traj_next) if t is not None)
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else rss_peak_bytes()
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


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", choices=["tiny", "sd3", "both"], default="both")
    parser.add_argument(
        "--options", default="eager,bf16", help=f"comma-separated subset of {', '.join(OPTIONS)}"
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=16, help="images per call (one micro-group)")
    parser.add_argument("--group", type=int, default=4, help="samples per prompt (divides --batch)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--guidance", type=float, default=4.5)
    parser.add_argument("--tiny-path", default="base", help="the tiny model: base, random or a folder")
    parser.add_argument(
        "--collector-steps",
        choices=["all", "window"],
        default="all",
        help="the collector's SDE steps: all (as flow_grpo's pipeline_with_logprob) or the recipe's 2-step window",
    )
    parser.add_argument("--flow-grpo", metavar="PATH", help="a flow_grpo checkout to import from")
    parser.add_argument(
        "--threads",
        type=int,
        help="torch CPU threads (default: torch's); 1 on a machine others share (2 threads on 2 busy cores ran 10-25x slower)",
    )
    parser.add_argument("--no-memory", action="store_true", help="leave out (c)")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # progress shows through pipes (compiling takes minutes)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.memory_child:
        memory_child(json.loads(args.memory_child))
        return 0
    args.options = [o.strip() for o in args.options.split(",") if o.strip()]
    unknown = [o for o in args.options if o not in OPTIONS]
    if unknown or not args.options:
        parser.error(f"--options {','.join(unknown)}: choose from {', '.join(OPTIONS)}")
    if args.batch < 1 or args.group < 1 or args.batch % args.group:
        parser.error(f"--batch {args.batch} must be a positive multiple of --group {args.group}")
    if args.repeats < 1 or args.steps < 1:
        parser.error("--repeats and --steps must be >= 1")

    pipeline_with_logprob = load_flow_grpo(args.flow_grpo)
    if pipeline_with_logprob is None:
        print(FLOW_GRPO_HINT)
    models = ["tiny", "sd3"] if args.model == "both" else [args.model]
    verdicts: list[Verdict] = []
    with tempfile.TemporaryDirectory(prefix="diffrl_tiny_sd3_") as tmp:
        sd3_dir = None
        if "sd3" in models:
            from tests.integration.test_sd3 import write_tiny_sd3

            sd3_dir = tmp
            write_tiny_sd3(sd3_dir)
        for model in models:
            verdicts += benchmark(model, args, sd3_dir, pipeline_with_logprob)
    return conclude(verdicts)  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
