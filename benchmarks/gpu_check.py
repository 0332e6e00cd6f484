"""The GPU check: what only a GPU can tell, in one script that fits the minutes of GPU time a task
gets, writing one JSON. Each section runs on its own (a failure or a missing capability is recorded
in its place as ``{"error": ...}`` or ``{"skipped": reason}`` and the next section runs), within a
global budget (``--budget-min``, default 8), and the JSON is rewritten after every section.

    python benchmarks/gpu_check.py --out docs/results/gpu_check.json     # on one (or two) NVIDIA GPUs
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/gpu_check.json   # the CPU dry run

The model (section ``setup``): SD3.5 Medium's real architecture with random weights, in bfloat16 at
512 px, written with ``save_pretrained`` to a temporary diffusers folder and loaded through the
``sd3`` family as a user's copy is (no download). The transformer is built from
stabilityai/stable-diffusion-3.5-medium's ``transformer/config.json`` as diffrl ships it
(``diffrl/models/assets/configs/stable-diffusion-3.5-medium``, its sources in that folder's README),
the VAE from its published ``vae/config.json`` (:data:`SD35_VAE`). The three text encoders are the
real classes (CLIP-L, CLIP-G with projection; T5) at the real output widths (768, 1280, 4096) but
two CLIP layers and one T5 layer (the tests' builders, ``tests/integration/tiny_parts.py``): T5-XXL
alone is 4.7B parameters, and prompt encoding is outside every timed region here (the prompts of
every round are encoded into the family's prompt cache before timing, and both contenders take
those embeddings; the JSON counts the text encoders' forwards during the timed rounds: 0).
``--tiny``: the tests' tiny random SD3 (``tests/integration/test_sd3.py``) at 16 px in float32.

Sections:

- ``rollout``: diffrl's collector (a Flow-GRPO rollout: SDE on every step, trajectory and
  log-probs kept) against diffusers' ``StableDiffusion3Pipeline`` over the same modules (Euler
  ODE, its default attention: SDPA), same prompts' embeddings, initial noise, steps, CFG, both
  ending in uint8 images (``benchmarks/rollout.py``'s contenders). Rounds interleave the two (the
  order alternates), after a warm-up each; per side the seconds of every round, median, min-max and
  images/s; per round the ratio diffusers / collector (> 1: the collector is faster).
- ``determinism``: ``run.deterministic``'s cost. This process is the mode off (deterministic
  mode's variables removed from its environment before torch loads, torch's defaults); a child
  process is the mode on (started with the mode's environment, ``CUBLAS_WORKSPACE_CONFIG``
  included, and :func:`diffrl.core.determinism.apply` before its first CUDA call: the settings are
  process-wide and read once). The two hold the same model and take turns round by round (the order
  alternates): a rollout as in ``rollout`` and a LoRA training step (forward with CFG, backward,
  AdamW); the ratio on / off per round; the warnings of ops without a deterministic kernel.
- ``plan``: ``diffrl plan``'s peak per trainer rank (:func:`diffrl.plan.planner.plan`) against
  the same step measured for two recipes (``sd35_grpo_ocr.yaml`` with gradient checkpointing,
  ``sd35_nft_ocr.yaml`` without, on this model): the actor's LoRA transformer, a micro-batch's
  velocity on real encoded prompts (with CFG where the algorithm trains with it), backward and
  AdamW step. On a GPU the measure is ``torch.cuda.max_memory_allocated`` less what was resident
  before the step and is not the plan's (text encoders, VAE, the encoded prompts); on the CPU
  torch's ``MemTracker`` over the same tensors (as ``tests/unit/plan``). On a GPU also one real
  training iteration of each recipe (``diffrl train``'s loop, 1 iteration, a small batch, a cheap
  reward, deterministic mode off): its whole peak, which holds what the plan leaves out.
- ``fsdp``: with two GPUs, one FSDP2 step of the first recipe on 2 processes over NCCL (each rank
  its own GPU): seconds per step, each rank's measured peak against the plan for 2 ranks, the loss
  both ranks agree on. Fewer than 2 GPUs: skipped (``--fsdp-gloo``: the same step on 2 CPU
  processes over gloo, the next-best check; the tests' 2-process runs are ``tests/distributed``).
- ``sglang``: sglang-diffusion's server (``rollout.engine: sglang``; its environment as
  ``docs/engines.md`` says, found through ``$DIFFRL_SGLANG`` or ``sglang`` on PATH) against
  diffrl's in-process engine on FLUX.1-dev's architecture (random weights; ``--tiny``: the tests'
  tiny FLUX.1), interleaved as ``benchmarks/engine_rollout.py``; skipped when sglang is not there.

The JSON records the device (name, compute capability, memory, driver, CUDA, torch), the commit,
the command line, each section's seconds and the budget. Exit code 1 when a section failed, 3 when
the run was cut off (still running a minute past its budget: the JSON says where), 2 a usage error.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import gc
import importlib.util
import json
import os
import platform
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # diffrl, and the tests' tiny parts

from diffrl.core.pins import PINNED_KEYS, wanted_environment  # noqa: E402  (no torch)

INHERITED_PINS = {k: os.environ[k] for k in PINNED_KEYS if k in os.environ}
"""Deterministic mode's variables this process was started with (the tests' processes set them)."""
PINNED_CHILD = "--worker" in sys.argv and sys.argv[sys.argv.index("--worker") + 1 :][:1] == ["determinism"]
"""This process is the determinism section's "on" side (its environment pinned by its parent)."""


def unpin() -> None:
    """Every other process runs with deterministic mode off: none of its variables (set before
    torch's first operation: the libraries read them once)."""
    if not PINNED_CHILD:
        for key in PINNED_KEYS:
            os.environ.pop(key, None)


unpin()

import diffusers  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from diffusers import (  # noqa: E402
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    FluxPipeline,
    FluxTransformer2DModel,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from torch.distributed.tensor import DTensor  # noqa: E402
from transformers import CLIPTextModel, CLIPTextModelWithProjection, T5EncoderModel  # noqa: E402

from diffrl import launch  # noqa: E402
from diffrl.algorithms.registry import build_algorithm  # noqa: E402
from diffrl.config import ParallelConfig  # noqa: E402
from diffrl.core import determinism  # noqa: E402
from diffrl.core.parallel import free_port, full_tensor, init_distributed  # noqa: E402
from diffrl.core.pins import cpu_model  # noqa: E402
from diffrl.data.prompts import load_prompts  # noqa: E402
from diffrl.models.base import SHIPPED_CONFIGS  # noqa: E402
from diffrl.models.registry import load_family  # noqa: E402
from diffrl.plan.planner import _FrozenAwareMemTracker, plan  # noqa: E402
from diffrl.preflight import load_config  # noqa: E402
from diffrl.sampling.collector import OnlineCollector  # noqa: E402
from diffrl.train.actor import Actor  # noqa: E402
from tests.integration import tiny_parts  # noqa: E402
from tests.integration.test_flux import write_tiny_flux  # noqa: E402
from tests.integration.test_sd3 import write_tiny_sd3  # noqa: E402

unpin()  # importing the tests' builders imports tests/conftest.py, which pins the mode's variables


def _load_benchmark(name: str):
    """``benchmarks/<name>.py`` as a module (the folder is not a package)."""
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


rollout_bench = _load_benchmark("rollout")  # the collector and diffusers contenders, their set-up

RECIPE = ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"
"""The base recipe of the rollout and determinism sections (as ``benchmarks/rollout.py``): Flow-GRPO,
SDE; the model, sizes and batch come from :func:`overrides`."""
PLAN_RECIPES = {
    "sd35_grpo_ocr": ("sd35_grpo_ocr.yaml", True),
    "sd35_nft_ocr": ("sd35_nft_ocr.yaml", False),
}
"""The plan section's recipes -> (file, gradient checkpointing): one with, one without."""
PREFIX = "@gpu_check "
"""The start of a child's protocol lines on its stdout (libraries print there too)."""

SD35_VAE = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "layers_per_block": 2,
    "act_fn": "silu",
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 1.5305,
    "shift_factor": 0.0609,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "force_upcast": True,
}
"""stabilityai/stable-diffusion-3.5-medium ``vae/config.json`` beyond what diffrl ships of it
(``block_out_channels`` [128, 256, 512, 512], 16 latent channels). The Hub is not reachable here;
the values as public code quotes or builds that file: Stability-AI/sd3.5 ``sd3_impls.py``'s VAE
(``ch`` 128, ``ch_mult`` 1, 2, 4, 4, 2 res blocks), mindspore-lab/mindone's ``SD3d5_CONFIG``
(no quant convs, scaling 1.5305, shift 0.0609), sglang's ``StableDiffusion3VAEArchConfig``
(1.5305 / 0.0609); the rest are ``AutoencoderKL``'s defaults, as ``from_pretrained`` reads them."""
FLUX_VAE = {k: v for k, v in SD35_VAE.items() if k not in ("scaling_factor", "shift_factor")}
"""FLUX.1-dev's VAE is SD3's layout (``diffrl/models/assets/configs/README.md``), with its own
scaling and shift (in the shipped ``vae/config.json``)."""


@dataclass
class Settings:
    """One run's model and sizes (the same in every process of the run)."""

    device: str
    """``cuda`` or ``cpu``."""
    tiny: bool
    folder: str
    """The SD3 diffusers folder the sections load."""
    dtype: str
    """``model.dtype`` and the frozen parts' dtype."""
    size: int
    """Pixels (height = width)."""
    steps: int
    guidance: float
    prompts: int
    """Prompts per rollout."""
    samples: int
    """Samples per prompt."""
    max_tokens: int
    """T5 tokens (``model.options.max_sequence_length``)."""
    micro_batch: int
    """Samples per training micro-batch (2 rows each with CFG)."""
    rounds: int
    work: str
    """A folder for runs and logs."""

    @property
    def images(self) -> int:
        return self.prompts * self.samples


def overrides(s: Settings) -> list[str]:
    """The rollout and determinism sections' overrides of :data:`RECIPE`: the SD3 folder, one
    micro-group of ``s.images`` images, SDE on every step, a LoRA for the training step."""
    return [
        "model.family=sd3",
        f"model.path={s.folder}",
        f"model.dtype={s.dtype}",
        f"model.options={{max_sequence_length: {s.max_tokens}, text_encoder_dtype: {s.dtype}}}",
        "model.lora={rank: 32, alpha: 64}",
        f"run.device={s.device}",
        f"run.output_dir={s.work}/run",
        "eval.enabled=false",
        f"sampling.num_steps={s.steps}",
        f"sampling.guidance_scale={s.guidance}",
        f"sampling.height={s.size}",
        f"sampling.width={s.size}",
        f"rollout.batch_size={s.prompts}",
        f"rollout.n_samples_per_prompt={s.samples}",
        f"rollout.micro_group_size={s.images}",
        f"train.batch_size={s.images}",
        f"train.micro_batch_size={s.micro_batch}",
        "algorithm.params.step_strategy={name: all}",
    ]


# ---- timing and memory helpers ------------------------------------------------------------------
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(device: str, fn: Callable[[], object]) -> float:
    """Seconds of ``fn()``, the device idle before and done after."""
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def spread(values: list[float]) -> dict[str, float | list[float]]:
    """Every value, their median and min-max."""
    return {
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def tensor_bytes(tensors) -> int:
    """Bytes held in this process (a ``DTensor``: its local shard)."""
    local = [t.to_local() if isinstance(t, DTensor) else t for t in tensors]
    return sum(t.numel() * t.element_size() for t in local)


def module_bytes(module: torch.nn.Module, device_type: str) -> int:
    """Bytes of ``module``'s parameters and buffers on a device of ``device_type``."""
    return tensor_bytes(t for t in [*module.parameters(), *module.buffers()] if t.device.type == device_type)


def optimizer_bytes(optimizer: torch.optim.Optimizer, device_type: str) -> int:
    return tensor_bytes(
        v
        for state in optimizer.state.values()
        for v in state.values()
        if torch.is_tensor(v) and v.device.type == device_type
    )


def release(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# ---- the model folders --------------------------------------------------------------------------
def shipped_config(model: str, part: str) -> dict:
    config = json.loads((SHIPPED_CONFIGS / model / part / "config.json").read_text())
    return {k: v for k, v in config.items() if not k.startswith("_")}


@contextlib.contextmanager
def building(device: str, dtype: torch.dtype):
    """Modules built in this block are created on ``device`` in ``dtype`` (random init there: seconds
    on a GPU for billions of parameters)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(previous)


def text_parts(pooled: tuple[int, ...], t5_width: int, projection: bool) -> dict:
    """Random text encoders of the real classes at the real widths, shrunk in depth and MLP: one CLIP
    per width of ``pooled`` (``CLIPTextModelWithProjection`` when ``projection``), one T5 encoder of
    width ``t5_width``; and the tests' char-level tokenizer for each."""
    tok = tiny_parts.tokenizer()
    clip = CLIPTextModelWithProjection if projection else CLIPTextModel
    clips = [clip(tiny_parts.clip_config(len(tok), hidden_size=w)) for w in pooled]
    t5 = T5EncoderModel(tiny_parts.t5_config(len(tok), d_model=t5_width))
    return {"tok": tok, "clips": clips, "t5": t5}


def write_sd35_medium(path: Path, device: str) -> dict:
    """SD3.5 Medium's transformer and VAE with random weights in bfloat16, shrunk text encoders,
    saved by ``StableDiffusion3Pipeline`` (see the module's docstring); what was built."""
    torch.manual_seed(0)
    config = shipped_config("stable-diffusion-3.5-medium", "transformer")
    vae_config = {**shipped_config("stable-diffusion-3.5-medium", "vae"), **SD35_VAE}
    with building(device, torch.bfloat16):
        transformer = SD3Transformer2DModel(**config)
        vae = AutoencoderKL(**vae_config)
        text = text_parts((768, 1280), config["joint_attention_dim"], projection=True)
    StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0),  # SD3.5's scheduler config
        vae=vae,
        text_encoder=text["clips"][0],
        tokenizer=text["tok"],
        text_encoder_2=text["clips"][1],
        tokenizer_2=text["tok"],
        text_encoder_3=text["t5"],
        tokenizer_3=text["tok"],
    ).save_pretrained(path)
    built = {
        "model": "stabilityai/stable-diffusion-3.5-medium's architecture, random weights (bfloat16)",
        "transformer": {"class": "SD3Transformer2DModel", "config": config, "parameters": count(transformer)},
        "vae": {"class": "AutoencoderKL", "config": vae_config, "parameters": count(vae)},
        "text_encoders": {
            "classes": ["CLIPTextModelWithProjection", "CLIPTextModelWithProjection", "T5EncoderModel"],
            "widths": [768, 1280, config["joint_attention_dim"]],
            "parameters": [count(m) for m in [*text["clips"], text["t5"]]],
            "note": "the real classes and output widths, 2 CLIP layers and 1 T5 layer (random): prompt "
            "encoding is outside every timed region (the prompt cache), so their size does not enter "
            "the timings; it does enter the training iteration's whole peak (plan section)",
        },
        "source": "transformer: diffrl/models/assets/configs/stable-diffusion-3.5-medium (the published "
        "transformer/config.json); vae: benchmarks/gpu_check.py SD35_VAE and the shipped vae/config.json",
    }
    del transformer, vae, text
    release(device)
    return built


def write_flux_dev(path: Path, device: str) -> None:
    """FLUX.1-dev's transformer and VAE with random weights in bfloat16 (the shipped configs), a
    CLIP-L and a T5 shrunk in depth at the real widths, saved by ``FluxPipeline``."""
    torch.manual_seed(0)
    config = shipped_config("FLUX.1-dev", "transformer")
    with building(device, torch.bfloat16):
        transformer = FluxTransformer2DModel(**config)
        vae = AutoencoderKL(**{**shipped_config("FLUX.1-dev", "vae"), **FLUX_VAE})
        text = text_parts((config["pooled_projection_dim"],), config["joint_attention_dim"], projection=False)
    FluxPipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(  # FLUX.1-dev's scheduler config
            shift=3.0,
            use_dynamic_shifting=True,
            base_shift=0.5,
            max_shift=1.15,
            base_image_seq_len=256,
            max_image_seq_len=4096,
        ),
        vae=vae,
        text_encoder=text["clips"][0],
        tokenizer=text["tok"],
        text_encoder_2=text["t5"],
        tokenizer_2=text["tok"],
    ).save_pretrained(path)
    del transformer, vae, text
    release(device)


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---- the report ---------------------------------------------------------------------------------
class Report:
    """The JSON being built: rewritten (atomically) after every section, so a run cut short keeps
    what it measured."""

    def __init__(self, out: Path, head: dict):
        self.out = out
        self.data = {**head, "sections": {}}
        self.current: str | None = None
        self.lock = threading.Lock()

    def put(self, name: str, result: dict) -> None:
        with self.lock:
            self.data["sections"][name] = result
            self.write()

    def write(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.out.with_suffix(self.out.suffix + ".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str) + "\n")
        os.replace(tmp, self.out)


@dataclass
class Context:
    """What the sections share: the settings, the deadlines, the processes started (to stop them
    when the budget runs out) and the rollout set-up (loaded once, for two sections)."""

    settings: Settings
    args: argparse.Namespace
    deadline: float
    """``time.monotonic()`` by which the whole run must be done."""
    children: list[subprocess.Popen] = field(default_factory=list)
    setup: object | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def start(
        self, argv: list[str], env: dict[str, str] | None = None, log: Path | None = None
    ) -> subprocess.Popen:
        """A child process in a session of its own (stopped by its process group), stdout piped
        unbuffered, stderr to ``log``."""
        err = open(log, "w") if log is not None else subprocess.DEVNULL  # noqa: SIM115 (closed below)
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                env=env,
                cwd=ROOT,
                bufsize=0,
                start_new_session=True,
            )
        finally:
            if log is not None:  # the child holds its own copy
                err.close()
        self.children.append(proc)
        return proc

    def stop_children(self) -> None:
        for proc in self.children:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.children.clear()

    def rollout_setup(self):
        """``benchmarks/rollout.py``'s set-up of the SD3 folder (family, collector, pipeline)."""
        if self.setup is None:
            self.setup = rollout_bench.setup("eager", overrides(self.settings))
        return self.setup

    def drop_setup(self) -> None:
        self.setup = None
        release(self.settings.device)


class Lines:
    """Protocol lines from a child's stdout, each awaited until a deadline (``select`` on the raw
    pipe, so no buffered read hides a line)."""

    def __init__(self, proc: subprocess.Popen, log: Path | None):
        self.proc, self.log, self.fd, self.buf = proc, log, proc.stdout.fileno(), b""

    def message(self, deadline: float, what: str) -> dict:
        while True:
            while b"\n" not in self.buf:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{what}: no answer within the section's time")
                ready, _, _ = select.select([self.fd], [], [], left)
                if ready:
                    chunk = os.read(self.fd, 1 << 16)
                    if not chunk:
                        raise RuntimeError(f"{what}: the child exited ({self.proc.wait()}): {tail(self.log)}")
                    self.buf += chunk
            line, _, self.buf = self.buf.partition(b"\n")
            text = line.decode(errors="replace")
            if text.startswith(PREFIX):
                return json.loads(text[len(PREFIX) :])

    def send(self, text: str) -> None:
        self.proc.stdin.write((text + "\n").encode())
        self.proc.stdin.flush()


def tail(log: Path | None, lines: int = 15) -> str:
    if log is None or not log.is_file():
        return ""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def say(message: dict) -> None:
    """A child's protocol line."""
    sys.stdout.write(PREFIX + json.dumps(message) + "\n")
    sys.stdout.flush()


# ---- shared pieces of the sections --------------------------------------------------------------
@dataclass
class StepInputs:
    """A training micro-batch: ``x (B, C, h, w)`` latents, ``sigma (B,)``, the prompts' and the
    negative prompt's conditioning."""

    x: torch.Tensor
    sigma: torch.Tensor
    cond: object
    negative: object


def step_inputs(family, actor: Actor, prompts: list[str], latent: tuple[int, ...], seed: int) -> StepInputs:
    """The inputs of :func:`train_step` for ``prompts`` (encoded now: the prompt cache)."""
    g = torch.Generator().manual_seed(seed)
    cond = family.encode_prompts(prompts)
    x = torch.randn(len(prompts), *latent, generator=g).to(family.device)
    sigma = torch.full((len(prompts),), 0.9, device=family.device)
    return StepInputs(x, sigma, cond, actor.policy.negative(cond))


def train_step(actor: Actor, guidance: float | None, inputs: StepInputs) -> torch.Tensor:
    """The step ``diffrl plan`` models: the trainable transformer's velocity of one micro-batch
    (guided by ``guidance``, with the negative prompt's rows; None: unguided, as an algorithm that
    trains without CFG), backward, an AdamW step. Returns the loss (no sync)."""
    if guidance is None:
        v = actor.policy.velocity(inputs.x, inputs.sigma, inputs.cond)
    else:
        v = actor.policy.velocity(
            inputs.x, inputs.sigma, inputs.cond, guidance_scale=guidance, negative=inputs.negative
        )
    loss = v.float().square().mean()
    loss.backward()
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def warm_optimizer(actor: Actor) -> None:
    """AdamW's state as after a first step (it stays for the whole run; the plan counts it so)."""
    for p in actor.params:
        p.grad = torch.zeros_like(p)
    actor.optimizer.step()
    actor.optimizer.zero_grad(set_to_none=True)


def train_actor(setup, algorithm=None) -> Actor:
    """The actor (its LoRA on the set-up's transformer) as the local runner builds it."""
    algorithm = algorithm or build_algorithm(setup.cfg)
    return Actor(
        setup.family,
        setup.cfg,
        keep_reference=algorithm.needs_reference,
        keep_old=algorithm.keeps_old_policy,
        sample_with_old=algorithm.samples_with_old_policy,
    )


def rollout_once(setup, rollout_id: int) -> dict[str, float]:
    """One collector rollout; its stage seconds (``perf/rollout_<stage>_time``)."""
    setup.collector.collect(rollout_id)
    return setup.collector.clock.take()


# ---- section: rollout ---------------------------------------------------------------------------
def section_rollout(ctx: Context, deadline: float) -> dict:
    s, device = ctx.settings, ctx.settings.device
    setup = ctx.rollout_setup()
    family, pipe = setup.family, setup.pipe
    rounds = s.rounds
    for r in range(rounds + 1):  # the prompt cache: no contender encodes in a timed round
        family.encode_prompts(rollout_bench.prompts_of(setup, r))
    family.encode_prompts([setup.cfg.sampling.negative_prompt])
    encoders = [m for name, m in pipe.components.items() if name.startswith("text_encoder") and m is not None]
    calls = [0]
    hooks = [m.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1)) for m in encoders]
    contenders = {
        "collector": lambda r: rollout_once(setup, r),
        "diffusers": lambda r: rollout_bench.run_diffusers(setup, r),
    }
    try:
        warmup = {name: timed(device, lambda f=fn: f(0)) for name, fn in contenders.items()}
        calls[0] = 0
        times: dict[str, list[float]] = {name: [] for name in contenders}
        stages: list[dict[str, float]] = []
        stopped = None
        for r in range(1, rounds + 1):
            if time.monotonic() > deadline:
                stopped = f"the section's time ran out after {r - 1} of {rounds} rounds"
                break
            order = list(contenders) if r % 2 else list(contenders)[::-1]
            for name in order:
                if name == "collector":
                    times[name].append(timed(device, lambda r=r: stages.append(rollout_once(setup, r))))
                else:
                    times[name].append(timed(device, lambda r=r, f=contenders[name]: f(r)))
    finally:
        for h in hooks:
            h.remove()
    done = len(times["collector"])
    if done == 0:
        return {"error": f"no round within the section's time (warm-up took {sum(warmup.values()):.1f} s)"}
    ours, theirs = pipe.scheduler.sigmas.cpu(), setup.collector.sigmas.cpu()
    n = s.images
    return {
        "what": f"{n} images per call ({s.prompts} prompts x {s.samples}), {s.size}x{s.size} px, {s.steps} "
        f"steps, CFG {s.guidance}, {s.dtype}; collector: Flow-GRPO SDE on every step, trajectory and "
        "log-probs kept; diffusers: StableDiffusion3Pipeline over the same modules (Euler ODE); both "
        "from the same prompt embeddings and initial noise, to uint8 images",
        "attention": sorted({type(p).__name__ for p in family.transformer.attn_processors.values()}),
        "rounds": done,
        **({"stopped": stopped} if stopped else {}),
        "warmup_s": warmup,
        "collector_s": spread(times["collector"]),
        "diffusers_s": spread(times["diffusers"]),
        "collector_images_per_s": n / statistics.median(times["collector"]),
        "diffusers_images_per_s": n / statistics.median(times["diffusers"]),
        "ratio_diffusers_over_collector": spread(
            [d / c for d, c in zip(times["diffusers"], times["collector"], strict=True)]
        ),
        "collector_stage_s": {
            k: statistics.median(x[k] for x in stages) for k in stages[0] if k.endswith("_time")
        },
        "text_encoder_calls_in_timed_rounds": calls[0],
        "same_sigmas": bool(ours.shape == theirs.shape and torch.allclose(ours, theirs, atol=1e-6)),
    }


# ---- section: determinism -----------------------------------------------------------------------
def section_determinism(ctx: Context, deadline: float) -> dict:
    s, device = ctx.settings, ctx.settings.device
    setup = ctx.rollout_setup()
    env = {k: v for k, v in os.environ.items() if k not in PINNED_KEYS}
    env.update(wanted_environment(mode=True))  # as the diffrl command pins the mode, before torch loads
    log = Path(s.work) / "determinism_child.log"
    child = ctx.start(
        [sys.executable, __file__, "--worker", "determinism", "--spec", json.dumps(dataclasses.asdict(s))],
        env=env,
        log=log,
    )
    lines = Lines(child, log)
    try:
        # this side's actor and warm-up while the child loads (neither is timed)
        off = determinism.apply(False, None, device)
        side = DeterminismSide(setup)
        side.round(0)
        ready = lines.message(deadline, "the deterministic child's start")
        times = {"off": [], "on": []}
        stopped = None
        for r in range(1, s.rounds + 1):
            if time.monotonic() > deadline:
                stopped = f"the section's time ran out after {r - 1} of {s.rounds} rounds"
                break
            for mode in ("off", "on") if r % 2 else ("on", "off"):
                if mode == "off":
                    times["off"].append(side.round(r))
                else:
                    lines.send(str(r))
                    times["on"].append(lines.message(deadline, f"the deterministic child's round {r}"))
        lines.send("quit")
        child.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        ctx.stop_children()
        ctx.drop_setup()
    if not times["on"]:
        return {"error": "no round within the section's time"}
    result = {
        "what": "the rollout of the rollout section and a LoRA training step (its micro-batch's guided "
        "velocity, backward, AdamW), in a process with deterministic mode off (this one) and one with it "
        "on (a child: the mode's environment from its start, determinism.apply before its first CUDA call), "
        "taking turns round by round",
        "rounds": len(times["on"]),
        **({"stopped": stopped} if stopped else {}),
        "off": {"determinism": off.to_dict(), "environment_removed": INHERITED_PINS},
        "on": {
            "determinism": ready["determinism"],
            "torch_deterministic_algorithms": ready["deterministic_algorithms"],
            "warnings": ready["warnings"],
        },
    }
    for key in ("rollout_s", "train_step_s"):
        on = [x[key] for x in times["on"]]
        off_s = [x[key] for x in times["off"][: len(on)]]
        result[key] = {"off": spread(off_s), "on": spread(on)}
        result[key]["ratio_on_over_off"] = spread([a / b for a, b in zip(on, off_s, strict=True)])
    return result


class DeterminismSide:
    """One side of the determinism section: the set-up's collector and an actor, a rollout and a
    training step per round."""

    def __init__(self, setup):
        self.setup, self.device = setup, str(setup.family.device)
        self.actor = train_actor(setup)
        prompts = rollout_bench.prompts_of(setup, 0)[: setup.cfg.train.micro_batch_size]
        latent = tuple(setup.family.latent_shape(setup.collector.height, setup.collector.width))
        self.inputs = step_inputs(setup.family, self.actor, prompts, latent, seed=0)
        self.guidance = setup.cfg.sampling.guidance_scale

    def round(self, r: int) -> dict[str, float]:
        for p in rollout_bench.prompts_of(self.setup, r):  # encoded before timing, as in the rollout section
            self.setup.family.encode_prompts([p])
        self.setup.family.transformer.eval()
        rollout = timed(self.device, lambda: rollout_once(self.setup, r))
        self.setup.family.transformer.train()
        step = timed(self.device, lambda: train_step(self.actor, self.guidance, self.inputs))
        return {"rollout_s": rollout, "train_step_s": step}


def worker_determinism(spec: dict) -> None:
    """The deterministic side: the mode on before any CUDA work, then rounds on request."""
    s = Settings(**spec)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mode = determinism.apply(True, None, s.device)
        side = DeterminismSide(rollout_bench.setup("eager", overrides(s)))
        side.round(0)  # warm-up
        # torch's warn_only: the ops run without a deterministic kernel (each op's first call)
        seen = sorted(
            {str(w.message).splitlines()[0][:300] for w in caught if "determinis" in str(w.message)}
        )
    say(
        {
            "determinism": mode.to_dict(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
            "warnings": seen,
        }
    )
    while (line := sys.stdin.readline().strip()) not in ("", "quit"):  # "": the parent is gone
        say(side.round(int(line)))


# ---- section: plan ------------------------------------------------------------------------------
def plan_overrides(s: Settings, name: str, checkpointing: bool) -> list[str]:
    """The shipped SD3.5 recipe ``name`` on this model, in one process, with a micro-batch of
    ``s.micro_batch``."""
    return [
        "runner=local",
        "parallel.engines=1",
        "parallel.trainer_ranks=1",
        f"model.path={s.folder}",
        f"model.dtype={s.dtype}",
        f"model.options={{max_sequence_length: {s.max_tokens}, text_encoder_dtype: {s.dtype}, "
        f"gradient_checkpointing: {str(checkpointing).lower()}}}",
        f"run.device={s.device}",
        f"run.output_dir={s.work}/{name}",
        f"sampling.height={s.size}",
        f"sampling.width={s.size}",
        f"train.micro_batch_size={s.micro_batch}",
        "eval.enabled=false",
    ]


def measure_step(cfg, algorithm, latent: tuple[int, ...], guided: bool, device: str) -> dict:
    """The planned step for real: the recipe's family and actor, one micro-batch of real encoded
    prompts (``guided``: with CFG's negative rows, as the plan's rows say); its peak (see the
    module's docstring)."""
    family = load_family(cfg)
    actor = Actor(
        family,
        cfg,
        keep_reference=algorithm.needs_reference,
        keep_old=algorithm.keeps_old_policy,
        sample_with_old=algorithm.samples_with_old_policy,
    )
    prompts = load_prompts(cfg.data.prompts).prompts[: cfg.train.micro_batch_size]
    inputs = step_inputs(family, actor, prompts, latent, seed=0)
    warm_optimizer(actor)
    family.transformer.train()
    guidance = cfg.sampling.guidance_scale if guided else None
    if device.startswith("cuda"):
        sync(device)
        release(device)
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        tracked = (
            module_bytes(family.transformer, "cuda")
            + optimizer_bytes(actor.optimizer, "cuda")
            + tensor_bytes([inputs.x, inputs.sigma])
        )
        seconds = timed(device, lambda: train_step(actor, guidance, inputs))
        peak = torch.cuda.max_memory_allocated()
        result = {
            "measured_peak_bytes": peak - (before - tracked),
            "max_memory_allocated_bytes": peak,
            "resident_not_planned_bytes": before - tracked,
            "how": "torch.cuda.max_memory_allocated during the step, less the bytes resident before it that "
            "are not the transformer's, its optimizer state's or the inputs' (text encoders, VAE, prompt cache)",
        }
    else:
        tracker = _FrozenAwareMemTracker()
        tracker.track_external(family.transformer, actor.optimizer, inputs.x, inputs.sigma)
        with tracker:
            seconds = timed(device, lambda: train_step(actor, guidance, inputs))
        peak = tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]
        result = {
            "measured_peak_bytes": peak,
            "how": "torch's MemTracker over the transformer, its optimizer and the inputs (as tests/unit/plan)",
        }
    return {**result, "step_s": seconds}


def one_iteration(cfg_overrides: list[str], recipe: Path, device: str) -> dict:
    """One real training iteration of ``recipe`` (the loop, 2 samples of one prompt, a cheap reward):
    ``torch.cuda.max_memory_allocated`` over all of it."""
    cfg = load_config(
        str(recipe),
        [
            *cfg_overrides,
            "train.iterations=1",
            "rollout.batch_size=1",
            "rollout.n_samples_per_prompt=2",
            "rollout.micro_group_size=2",
            "rollout.num_steps_per_rollout=1",
            "train.batch_size=2",
            "train.save_every=0",
            "train.eval_every=0",
            "rewards=[{name: tests.rewards:brightness}]",
            # this process stays deterministic mode's "off" side (the mode's settings are process-wide)
            "run.deterministic=false",
        ],
    )
    cuda = device.startswith("cuda")
    release(device)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() if cuda else None
    t0 = time.perf_counter()
    launch.train(cfg)
    seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated() if cuda else None
    release(device)
    return {
        "seconds": seconds,
        "max_memory_allocated_bytes": peak,
        "allocated_before_bytes": before,
        "what": "diffrl train's loop for 1 iteration (1 prompt x 2 samples, the recipe's steps, reward "
        "tests.rewards:brightness), everything in this process: rollout, VAE, text encoders (shrunk here), "
        "the algorithm's loss; the plan holds only the trainer's step",
    }


def section_plan(ctx: Context, deadline: float) -> dict:
    s, device = ctx.settings, ctx.settings.device
    out: dict = {}
    for name, (file, checkpointing) in PLAN_RECIPES.items():
        if time.monotonic() > deadline:
            out[name] = {"skipped": "the section's time ran out"}
            continue
        try:
            recipe = ROOT / "recipes" / file
            cfg_overrides = plan_overrides(s, name, checkpointing)
            cfg = load_config(str(recipe), cfg_overrides)
            algorithm = build_algorithm(cfg)
            t0 = time.perf_counter()
            predicted = plan(cfg, algorithm, launch.layout(cfg))
            plan_s = time.perf_counter() - t0
            guided = predicted.rows > cfg.train.micro_batch_size  # the algorithm trains with CFG
            measured = measure_step(cfg, algorithm, tuple(predicted.latent), guided, device)
            release(device)  # the step's family and actor are gone
            row = {
                "recipe": f"recipes/{file}",
                "algorithm": cfg.algorithm.name,
                "micro_batch": cfg.train.micro_batch_size,
                "rows": predicted.rows,
                "gradient_checkpointing": checkpointing,
                "trainable": predicted.trainable,
                "plan_s": plan_s,
                "planned_peak_bytes": predicted.memory.peak,
                "planned": dataclasses.asdict(predicted.memory),
                **measured,
                "ratio_planned_over_measured": predicted.memory.peak / measured["measured_peak_bytes"],
            }
            if not device.startswith("cuda"):
                row["iteration"] = {
                    "skipped": "the CPU allocator keeps no peak of tensors; the step above is "
                    "measured with torch's MemTracker instead"
                }
            elif time.monotonic() > deadline:
                row["iteration"] = {"skipped": "the section's time ran out"}
            else:
                try:
                    row["iteration"] = one_iteration(cfg_overrides, recipe, device)
                except Exception as e:  # noqa: BLE001 (recorded; the next measurement runs)
                    row["iteration"] = {"error": f"{type(e).__name__}: {e}"}
            out[name] = row
        except Exception as e:  # noqa: BLE001 (recorded; the next recipe runs)
            out[name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
            release(device)
    return {
        "what": "diffrl plan's peak per trainer rank against the same step measured (the actor's LoRA "
        "transformer, one micro-batch's velocity on real encoded prompts, with CFG's rows where the "
        "algorithm trains with them, backward, AdamW step)",
        "recipes": out,
    }


# ---- section: fsdp ------------------------------------------------------------------------------
def section_fsdp(ctx: Context, deadline: float) -> dict:
    s = ctx.settings
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= 2 and s.device.startswith("cuda"):
        backend = "nccl"
    elif ctx.args.fsdp_gloo:
        backend = "gloo"
    else:
        return {
            "skipped": f"needs 2 GPUs for NCCL, found {gpus}"
            + ("" if s.device.startswith("cuda") else " (--fsdp-gloo runs the same step on 2 CPU processes)")
        }
    port = free_port()
    procs = []
    for rank in range(2):
        log = Path(s.work) / f"fsdp_rank{rank}.log"
        argv = [sys.executable, __file__, "--worker", "fsdp", "--spec", json.dumps(dataclasses.asdict(s))]
        argv += ["--rank", str(rank), "--port", str(port), "--backend", backend]
        procs.append((ctx.start(argv, log=log), log))
    try:
        # the plan for 2 ranks while the ranks load (it runs on fake tensors in this process)
        file, checkpointing = PLAN_RECIPES["sd35_grpo_ocr"]
        cfg = load_config(str(ROOT / "recipes" / file), plan_overrides(s, "sd35_grpo_ocr", checkpointing))
        predicted = plan(cfg, build_algorithm(cfg), ParallelConfig(trainer_ranks=2))
        ranks = [Lines(p, log).message(deadline, f"FSDP rank {i}") for i, (p, log) in enumerate(procs)]
    finally:
        ctx.stop_children()
    result = {
        "what": f"one FSDP2 step of recipes/{file} (LoRA) on 2 processes over {backend}: each rank its "
        f"micro-batch of {s.micro_batch}, guided velocity, backward, AdamW",
        "backend": backend,
        "planned_peak_bytes_per_rank": predicted.memory.peak,
        "ranks": ranks,
        # the collectives work: both ranks hold the same all-reduced loss and gathered weights
        "ranks_agree": len({(r["loss_all_reduced"], r["first_trainable_sum"]) for r in ranks}) == 1,
    }
    for r in ranks:
        if "measured_peak_bytes" in r:
            r["ratio_planned_over_measured"] = predicted.memory.peak / r["measured_peak_bytes"]
    return result


def worker_fsdp(spec: dict, rank: int, port: int, backend: str) -> None:
    """One trainer rank: the recipe's family on this rank's device, the actor sharded with FSDP2,
    a warm-up step and timed steps; its numbers as one protocol line."""
    s = Settings(**spec)
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    dist_ctx = init_distributed(rank, 2, "127.0.0.1", port, backend, device)
    file, checkpointing = PLAN_RECIPES["sd35_grpo_ocr"]
    cfg = load_config(
        str(ROOT / "recipes" / file),
        [*plan_overrides(s, f"fsdp_rank{rank}", checkpointing), f"run.device={device}"],
    )
    algorithm = build_algorithm(cfg)
    family = load_family(cfg)
    actor = Actor(
        family,
        cfg,
        keep_reference=algorithm.needs_reference,
        keep_old=algorithm.keeps_old_policy,
        sample_with_old=algorithm.samples_with_old_policy,
        dist=dist_ctx,
    )
    prompts = load_prompts(cfg.data.prompts).prompts
    prompts = prompts[rank * s.micro_batch : (rank + 1) * s.micro_batch]
    latent = tuple(family.latent_shape(s.size, s.size))
    inputs = step_inputs(family, actor, prompts, latent, seed=rank)
    family.transformer.train()
    dev = str(device)
    train_step(actor, cfg.sampling.guidance_scale, inputs)  # warm-up (and AdamW's state)
    release(dev)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        tracked = (
            module_bytes(family.transformer, "cuda")
            + optimizer_bytes(actor.optimizer, "cuda")
            + tensor_bytes([inputs.x, inputs.sigma])
        )
    losses, seconds = [], []
    for _ in range(3 if device.type == "cuda" else 1):
        torch.distributed.barrier()
        t0 = time.perf_counter()
        losses.append(train_step(actor, cfg.sampling.guidance_scale, inputs))
        sync(dev)
        seconds.append(time.perf_counter() - t0)
    total = dist_ctx.sum([float(losses[-1])])[0]
    out = {"rank": rank, "step_s": spread(seconds), "loss": float(losses[-1]), "loss_all_reduced": total}
    if device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device)
        out.update(measured_peak_bytes=peak - (before - tracked), max_memory_allocated_bytes=peak)
    # every rank's trainable shards gathered: equal on both ranks after the same steps
    out["first_trainable_sum"] = float(full_tensor(actor.params[0].detach()).float().sum())
    say(out)
    torch.distributed.destroy_process_group()


# ---- section: sglang ----------------------------------------------------------------------------
def section_sglang(ctx: Context, deadline: float) -> dict:
    from diffrl.sampling.sglang import SglangEngine

    command = os.environ.get("DIFFRL_SGLANG") or shutil.which("sglang")
    if not command:
        return {
            "skipped": "sglang-diffusion is not installed here (no $DIFFRL_SGLANG, no sglang on PATH); its "
            "environment: docs/engines.md"
        }
    s = ctx.settings
    folder = Path(s.work) / "flux"
    if s.tiny:
        write_tiny_flux(str(folder))
    else:
        write_flux_dev(folder, s.device)
    n = s.images
    precision = "fp32" if s.dtype == "float32" else "bf16"
    cfg = load_config(
        str(RECIPE),
        [
            f"run.output_dir={s.work}/sglang_run",
            f"run.device={s.device}",
            "model.family=flux",
            f"model.path={folder}",
            f"model.dtype={s.dtype}",
            "model.lora={rank: 4}",
            f"sampling.num_steps={s.steps}",
            "sampling.guidance_scale=1.0",
            f"sampling.height={s.size}",
            f"sampling.width={s.size}",
            f"algorithm.params={{step_strategy: {{name: sde_window, size: 2, range: [0, {s.steps - 1}]}}}}",
            f"rollout.batch_size={s.prompts}",
            f"rollout.n_samples_per_prompt={s.samples}",
            f"rollout.micro_group_size={n}",
            f"train.batch_size={n}",
            f"train.micro_batch_size={n}",
            "rewards=[{name: tests.rewards:brightness}]",
            "eval.enabled=false",
            "rollout.engine=sglang",
            f"rollout.engine_options={{model_id: FLUX.1-dev, precision: {precision}, command: {command}}}",
        ],
    )
    family = load_family(cfg)
    spec = build_algorithm(cfg).collection_spec()
    prompts = load_prompts(cfg.data.prompts)
    engines = {"diffrl": OnlineCollector(cfg, family, spec, prompts)}
    t0 = time.perf_counter()
    engine = SglangEngine(cfg, family, spec, prompts)
    try:
        engine.sync()
        start_s = time.perf_counter() - t0
        engines["sglang"] = engine
        for e in engines.values():
            e.collect(0)
        times: dict[str, list[float]] = {k: [] for k in engines}
        for r in range(1, s.rounds + 1):
            if time.monotonic() > deadline:
                break
            for name in list(engines) if r % 2 else list(engines)[::-1]:
                times[name].append(timed(s.device, lambda e=engines[name], r=r: e.collect(r)))
    finally:
        engine.close()
        del family, engines
        release(s.device)
        shutil.rmtree(folder, ignore_errors=True)
    if not times["sglang"]:
        return {"error": f"no round within the section's time (server ready in {start_s:.0f} s)"}
    return {
        "what": f"FLUX.1-dev's architecture{' (tiny)' if s.tiny else ''}, random weights, {s.size}x{s.size} "
        f"px, {s.steps} steps, {n} images per rollout, {precision}; a Flow-GRPO rollout (2-step SDE "
        "window, trajectory and log-probs); sglang's time is the round trip",
        "server_start_s": start_s,
        "rounds": len(times["sglang"]),
        **{f"{k}_s": spread(v) for k, v in times.items()},
        **{f"{k}_images_per_s": n / statistics.median(v) for k, v in times.items()},
        "ratio_diffrl_over_sglang_seconds": spread(
            [a / b for a, b in zip(times["diffrl"], times["sglang"], strict=True)]
        ),
    }


# ---- section: setup -----------------------------------------------------------------------------
def section_setup(ctx: Context, deadline: float) -> dict:
    s = ctx.settings
    folder = Path(s.folder)
    if s.tiny:
        write_tiny_sd3(str(folder))
        return {"model": "tests/integration/test_sd3.py's tiny random SD3 (every part of the real one)"}
    return write_sd35_medium(folder, s.device)


SECTIONS: dict[str, tuple[Callable[[Context, float], dict], float, float]] = {
    "setup": (section_setup, 15, 120),
    "rollout": (section_rollout, 20, 100),
    "determinism": (section_determinism, 30, 120),
    "plan": (section_plan, 30, 200),
    "fsdp": (section_fsdp, 30, 120),
    "sglang": (section_sglang, 120, 240),
}
"""Name -> (the section, seconds it needs at least on a GPU to start, seconds it may take at most)."""


# ---- the run ------------------------------------------------------------------------------------
def device_info(device: str) -> dict:
    info = {
        "kind": device,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(
            name=torch.cuda.get_device_name(0),
            capability=list(torch.cuda.get_device_capability(0)),
            memory_bytes=props.total_memory,
            count=torch.cuda.device_count(),
            cudnn=torch.backends.cudnn.version(),
            driver=_run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]),
        )
    return info


def _run(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def commit() -> dict:
    return {
        "sha": _run(["git", "rev-parse", "HEAD"]),
        "dirty": bool(_run(["git", "status", "--porcelain", "--untracked-files=no"])),
    }


def settings_for(args: argparse.Namespace, work: Path) -> Settings:
    gpu = args.device.startswith("cuda")
    if args.tiny:
        base = dict(
            dtype="float32",
            size=16,
            steps=2,
            guidance=4.5,
            prompts=1,
            samples=2,
            max_tokens=16,
            micro_batch=2,
            rounds=2,
        )
    else:
        base = dict(
            dtype="bfloat16",
            size=512,
            steps=10,
            guidance=4.5,
            prompts=2,
            samples=4,
            max_tokens=256,
            micro_batch=2,
            rounds=4,
        )
    if args.rounds:
        base["rounds"] = args.rounds
    return Settings(
        device="cuda" if gpu else "cpu", tiny=args.tiny, folder=str(work / "model"), work=str(work), **base
    )


def run_sections(ctx: Context, report: Report, names: list[str]) -> bool:
    """Each section in turn within the budget; whether all that ran ended without an error."""
    ok = True
    scale = 1.0 if ctx.settings.device.startswith("cuda") and not ctx.settings.tiny else 0.1
    for name in SECTIONS:
        fn, least, most = SECTIONS[name]
        if name not in names:
            report.put(name, {"skipped": "not asked for (--sections)", "seconds": 0.0})
            continue
        setup = report.data["sections"].get("setup", {})
        if name != "setup" and ("error" in setup or "skipped" in setup):
            report.put(name, {"skipped": "no model folder: the setup section did not run", "seconds": 0.0})
            continue
        left = ctx.left()
        if left < least * scale:
            report.put(
                name,
                {
                    "skipped": f"the budget is spent: {left:.0f} s left, the section needs about {least * scale:.0f}",
                    "seconds": 0.0,
                },
            )
            continue
        report.current = name
        release(ctx.settings.device)  # what an earlier section left is not this one's
        print(f"[gpu_check] {name} ({left:.0f} s of the budget left)", flush=True)
        t0 = time.monotonic()
        try:
            result = fn(ctx, min(ctx.deadline, t0 + most))
        except Exception as e:  # noqa: BLE001 (recorded; the next section runs)
            result = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            ctx.stop_children()
            ctx.drop_setup()
        ok = ok and "error" not in result
        result["seconds"] = time.monotonic() - t0
        report.put(name, result)
        print(f"[gpu_check] {name}: {summary(result)}", flush=True)
    report.current = None
    return ok


def summary(result: dict) -> str:
    for key in ("skipped", "error"):
        if key in result:
            return f"{key}: {str(result[key]).splitlines()[0]}"
    return f"done in {result['seconds']:.1f} s"


def watchdog(ctx: Context, report: Report, grace_s: float) -> threading.Timer:
    """Past the budget and a grace: the section still running is recorded as cut off, the children
    stopped, the JSON written, and the process ends (exit code 3)."""

    def fire() -> None:
        with report.lock:
            name = report.current or "(between sections)"
            report.data["sections"][name] = {
                "error": f"still running {grace_s:.0f} s after the budget ran out: cut off"
            }
            report.data["cut_off"] = True
            report.write()
        ctx.stop_children()
        os._exit(3)

    timer = threading.Timer(max(0.0, ctx.left()) + grace_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check.json", help="the JSON to write (default: ./gpu_check.json)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="the tests' tiny SD3 at 16 px, float32 (the dry run)")
    p.add_argument("--budget-min", type=float, default=8.0, help="the whole run's budget in minutes")
    p.add_argument(
        "--rounds", type=int, default=None, help="timed rounds per comparison (default 4; --tiny 2)"
    )
    p.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"a comma-separated subset of {', '.join(SECTIONS)}"
    )
    p.add_argument(
        "--fsdp-gloo", action="store_true", help="without 2 GPUs: the FSDP step on 2 CPU processes (gloo)"
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary model folder and logs")
    p.add_argument("--worker", choices=["determinism", "fsdp"], help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return args
    names = [n.strip() for n in args.sections.split(",") if n.strip()]
    unknown = [n for n in names if n not in SECTIONS]
    if unknown or not names:
        p.error(f"--sections {','.join(unknown) or args.sections!r}: choose from {', '.join(SECTIONS)}")
    args.sections = names if "setup" in names else ["setup", *names]  # the others load its folder
    if args.device == "cpu" and not args.tiny:
        p.error("--device cpu: add --tiny (the dry run); SD3.5 Medium at 512 px on a CPU takes hours")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here; the CPU dry run is --device cpu --tiny")
    if args.budget_min <= 0:
        p.error(f"--budget-min {args.budget_min:g}: give a positive number of minutes, e.g. 8")
    if args.rounds is not None and args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.worker == "determinism":
        worker_determinism(json.loads(args.spec))
        return 0
    if args.worker == "fsdp":
        worker_fsdp(json.loads(args.spec), args.rank, args.port, args.backend)
        return 0
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="diffrl_gpu_check_"))
    settings = settings_for(args, work)
    ctx = Context(settings, args, started + args.budget_min * 60)
    report = Report(
        Path(args.out),
        {
            "check": "benchmarks/gpu_check.py",
            "command": [Path(sys.executable).name, *sys.argv],
            "commit": commit(),
            "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "budget_s": args.budget_min * 60,
            "device": device_info(settings.device),
            "settings": {
                k: v for k, v in dataclasses.asdict(settings).items() if k not in ("folder", "work")
            },
        },
    )
    report.write()
    timer = watchdog(ctx, report, grace_s=60.0)
    try:
        ok = run_sections(ctx, report, args.sections)
    finally:
        timer.cancel()
        ctx.stop_children()
        ctx.drop_setup()
        if args.keep:
            print(f"[gpu_check] kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    report.data["seconds"] = time.monotonic() - started
    report.write()
    print(f"[gpu_check] wrote {args.out} in {report.data['seconds']:.1f} s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
