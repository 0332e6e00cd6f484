"""How the transformer's forwards run: mixed precision and ``torch.compile`` (``model.autocast``,
``model.compile``).

Both apply to every transformer forward of a run (rollouts, training, the old policy, the
reference and eval), through :meth:`ModelFamily.velocity`, so a rollout and its replay in training
run the same numerics. The weights, LoRA adapters and optimizer state stay in ``model.dtype``
(float32 by default); only the forwards' matmuls and convolutions run in the autocast dtype.

An option the device cannot do falls back to what it can, with a message that says so at start-up
(:attr:`Numerics.notes`, printed by the trainer and logged as ``perf/autocast`` /
``perf/compiled``): numerics never change silently.
"""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch._inductor.config
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode
from torch.utils.flop_counter import FlopCounterMode

from diffrl.core.rollout import Conditioning

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Numerics:
    """The resolved forward settings of a run."""

    autocast: torch.dtype | None = None
    """The dtype the forwards autocast to; None: they run in the weights' dtype."""
    compile: bool = False
    """True: each transformer module is ``torch.compile``-d (in place) on its first forward."""
    float32_attention: bool = False
    """Attention runs in float32 under autocast (:class:`Float32Attention`; on CPUs)."""
    notes: tuple[str, ...] = ()
    """The fallbacks taken (an option this device cannot do), one sentence each."""

    def describe(self) -> str:
        precision = (
            f"autocast {str(self.autocast).removeprefix('torch.')}" if self.autocast else "no autocast"
        )
        if self.autocast and self.float32_attention:
            precision += " (attention in float32)"
        return f"{precision}, {'compiled' if self.compile else 'eager'}"


CPU_HAS = {
    torch.bfloat16: lambda: torch.ops.mkldnn._is_mkldnn_bf16_supported(),
    torch.float16: lambda: torch.ops.mkldnn._is_mkldnn_fp16_supported(),
}
"""Whether this CPU has instructions for the dtype (oneDNN's check: AVX-512 BF16 / AMX, AVX-512 FP16)."""


def autocast_problem(dtype: torch.dtype, device: torch.device) -> str | None:
    """Why ``dtype`` autocast would not be a speed-up on ``device`` (None: it is supported)."""
    name = str(dtype).removeprefix("torch.")
    if device.type == "cuda":
        if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
            return f"this GPU ({torch.cuda.get_device_name(device)}) has no {name} support"
        return None
    if device.type != "cpu":
        return f"autocast is not wired up for {device.type} devices here"
    if not CPU_HAS[dtype]():
        return f"this CPU has no {name} instructions (oneDNN reports none), so {name} would be emulated and slower"
    return None


def compile_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot run on ``device`` here (None: it can)."""
    if not torch._dynamo.is_dynamo_supported():
        return "torch.compile does not support this Python version"
    if device.type == "cuda":
        if importlib.util.find_spec("triton") is None:
            return "torch.compile on CUDA needs triton, which is not installed"
        return None
    if device.type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        return "torch.compile on CPU needs a C++ compiler (g++ or clang++) on PATH; none was found"
    return None


def resolve_numerics(autocast: str | None, compile: bool, device: torch.device) -> Numerics:
    """The settings a run gets on ``device``: the asked ones, minus those it cannot do (noted)."""
    notes = []
    dtype = AUTOCAST_DTYPES[autocast] if autocast else None
    if dtype is not None and (problem := autocast_problem(dtype, device)):
        notes.append(f"model.autocast={autocast} is off: {problem}; the forwards run in the weights' dtype")
        dtype = None
    if compile and (problem := compile_problem(device)):
        notes.append(f"model.compile=true is off: {problem}; the transformer runs eagerly")
        compile = False
    return Numerics(dtype, compile, float32_attention=device.type == "cpu", notes=tuple(notes))


COMPILE_CACHE_LIMIT = 64
"""Graphs kept per compiled forward: one per (batch shape, grad mode, active adapter) a run uses,
so a run never falls back to eager after its first few shapes (dynamo's default keeps 8)."""


def prepare(module: nn.Module, numerics: Numerics) -> None:
    """Compile ``module`` in place on its first forward (``nn.Module.compile`` keeps its
    ``state_dict`` keys, so checkpoints do not change)."""
    if not numerics.compile or getattr(module, "_diffrl_compiled", False):
        return
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILE_CACHE_LIMIT)
    torch._dynamo.config.accumulated_cache_size_limit = max(
        torch._dynamo.config.accumulated_cache_size_limit, 4 * COMPILE_CACHE_LIMIT
    )
    if numerics.autocast is not None:
        # round every bfloat16 intermediate as eager would: the graph of a rollout (no gradient)
        # and that of its replay (with) then give the same numbers (exact log-prob replay)
        torch._inductor.config.emulate_precision_casts = True
    module.compile(dynamic=False)
    module._diffrl_compiled = True


class Float32Attention(TorchFunctionMode):
    """Runs ``F.scaled_dot_product_attention`` in float32 (inputs cast up, the output cast back).

    Under CPU autocast the matmuls gain from bfloat16 but oneDNN's bfloat16 flash attention does
    not: on the tiny model (AVX-512 BF16, 2 cores) its backward took 3.5x, its forward 1.3x the
    float32 kernel's time (``benchmarks/train_step.py`` measures the whole step both ways).
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        dtype = args[0].dtype

        def up(a):
            return a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a

        with torch.autocast(args[0].device.type, enabled=False):
            out = func(*map(up, args), **{k: up(v) for k, v in kwargs.items()})
        return out.to(dtype)


@contextlib.contextmanager
def autocast(numerics: Numerics, device: torch.device):
    """The context the forwards run in."""
    if numerics.autocast is None:
        yield
        return
    with torch.autocast(device.type, dtype=numerics.autocast):
        if not numerics.float32_attention:
            yield
            return
        with Float32Attention():
            yield


def _graphs_compiled() -> int:
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


def _sharded(module: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in module.parameters())


class ForwardMeter:
    """The model FLOPs the transformer forwards did, and the seconds spent compiling them.

    FLOPs are counted by ``torch.utils.flop_counter.FlopCounterMode`` (matmuls, convolutions and
    attention) once per module and input shapes: on that forward itself when it runs eagerly (the
    counter only watches the ops), on a dry run before it when the module is compiled (eager, no
    gradient, random state restored; its output is dropped). A forward with
    gradients counts 3x (forward + backward, the usual MFU convention). Modules sharded by FSDP2
    are not counted (a dry run on one rank would issue collectives the others do not).
    """

    def __init__(self) -> None:
        self.flops = 0.0
        self.compile_seconds = 0.0
        """Time of the forwards that compiled a new graph (``model.compile``)."""
        self._per_call: dict[tuple, float | None] = {}

    def run(
        self,
        module: nn.Module,
        x_t: torch.Tensor,
        cond: Conditioning,
        forward: Callable[[], torch.Tensor],
        dry: bool,
    ) -> torch.Tensor:
        """``forward()``, its model FLOPs added. The first call per module and shapes counts them:
        on the call itself (the counter only watches the ops), or, with ``dry`` (a compiled
        module, whose first call compiles), on an eager dry run before it."""
        key = (
            id(module),
            tuple(x_t.shape),
            tuple(sorted((k, tuple(v.shape)) for k, v in cond.tensors.items())),
        )
        if key in self._per_call:
            out = forward()
        elif _sharded(module):
            self._per_call[key] = None
            out = forward()
        elif dry:
            self._per_call[key] = dry_run_flops(forward, x_t.device)
            out = forward()
        else:
            with FlopCounterMode(display=False) as counter:
                out = forward()
            self._per_call[key] = float(counter.get_total_flops())
        flops = self._per_call[key]
        if flops is not None:
            self.flops += flops * (3 if torch.is_grad_enabled() else 1)
        return out

    @contextlib.contextmanager
    def compiling(self, numerics: Numerics):
        """Around a forward: adds its time to :attr:`compile_seconds` when it compiled a graph."""
        if not numerics.compile:
            yield
            return
        before, t0 = _graphs_compiled(), time.perf_counter()
        yield
        if _graphs_compiled() != before:
            self.compile_seconds += time.perf_counter() - t0


def dry_run_flops(run: Callable[[], object], device: torch.device) -> float:
    """The FLOPs ``run()`` does, counted on an eager run without gradients that leaves the random
    state as it found it."""
    with (
        torch.random.fork_rng(devices=[device] if device.type == "cuda" else []),
        torch.no_grad(),
        torch.compiler.set_stance("force_eager"),
        FlopCounterMode(display=False) as counter,
    ):
        run()
    return float(counter.get_total_flops())


GPU_MEMORY_GB = {"H200": 141, "H100": 80, "A100": 80, "L40S": 48, "L4": 24, "A10": 24, "RTX 4090": 24}
"""Device memory (GB, 1e9 bytes) of the GPUs below (A100: the 80 GB model), for ``diffrl plan``."""

GPU_PEAK_TFLOPS = {
    # dense tensor-core bf16/fp16, and fp32 without TF32 (the vendors' datasheets)
    "H200": (989.0, 67.0),
    "H100": (989.0, 67.0),
    "A100": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "L4": (121.0, 30.3),
    "A10": (125.0, 31.2),
    "RTX 4090": (165.2, 82.6),
}


@dataclass(frozen=True)
class MeasuredGemm:
    """The best rate of square matmuls timed on a device: the MFU peak where neither
    ``run.peak_tflops`` nor a datasheet gives one."""

    flops: float
    """FLOP/s of the fastest timed matmul."""
    sizes: tuple[int, ...]
    """The sizes ``n`` timed (``n x n @ n x n``), smallest first."""
    timed: int
    """Timed matmuls in all (each size after one untimed warm-up)."""
    dtype: torch.dtype

    def describe(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        sizes = f"{self.sizes[0]}^3" + (f"-{self.sizes[-1]}^3" if len(self.sizes) > 1 else "")
        return (
            f"the best of {self.timed} {dtype} matmuls of {sizes} measured at {self.flops / 1e9:.1f} GFLOP/s"
        )


GEMM_SIZES = (256, 512, 1024, 2048, 4096)
GEMM_BUDGET_S = 0.5
"""Seconds the peak's matmuls may take, once per run: about what the six 1024^3 float32 matmuls of
the single-size measurement it replaced took on a busy 2-core CPU."""
GEMM_MAX_TIMED = 200
"""Timed matmuls at most: more add little to the best of them (and cost a fast device nothing)."""
_MEASURED: dict[tuple[str, torch.dtype], MeasuredGemm] = {}


def _seconds(a: torch.Tensor, b: torch.Tensor) -> float:
    """Wall seconds of one ``a @ b``, finished (synchronised on a GPU)."""
    cuda = a.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(a.device)
    t0 = time.perf_counter()
    a @ b
    if cuda:
        torch.cuda.synchronize(a.device)
    return time.perf_counter() - t0


def measured_gemm_flops(
    device: torch.device,
    dtype: torch.dtype,
    sizes: tuple[int, ...] = GEMM_SIZES,
    repeats: int = 5,
    budget_s: float = GEMM_BUDGET_S,
) -> MeasuredGemm:
    """The best FLOP/s of ``n x n`` matmuls in ``dtype`` on ``device`` (cached per device and dtype).

    First the sizes, smallest first, each timed ``repeats`` times after a warm-up, growing while
    the next one's estimate (at half the last size's rate: a larger matmul can run slower, out of
    cache) fits in half of ``budget_s``; the first size is always timed. Then the fastest size again
    until ``budget_s`` is spent (at most :data:`GEMM_MAX_TIMED` matmuls in all). A slow CPU stops at
    512 or 1024 (bfloat16 without native support at 256, its first size); a GPU goes on to 4096.

    The best of many, because the peak is a yardstick the run's own rates must not beat: one
    matmul timed on a busy machine reads low, and a large one can run slower than the model's own
    smaller, cache-resident ones (a run's training MFU read 115.9% against one 1024^3 figure). A
    rate above even this best raises the peak (:class:`diffrl.train.perf.MfuPeak`)."""
    key = (str(device), dtype)
    if key in _MEASURED:
        return _MEASURED[key]
    gen = torch.Generator(device).manual_seed(0)  # not the global RNG: the run's draws stay as they were
    start, rates, rate, timed, fastest = time.perf_counter(), {}, 0.0, 0, None
    for n in sizes:
        flop = 2 * n**3
        if rates and time.perf_counter() - start + (repeats + 1) * flop / (rate / 2) > budget_s / 2:
            break
        a, b = (torch.randn(n, n, device=device, generator=gen).to(dtype) for _ in range(2))
        _seconds(a, b)  # warm-up
        rate = rates[n] = max(flop / _seconds(a, b) for _ in range(repeats))
        timed += repeats
        if fastest is None or rate > rates[fastest[0]]:
            fastest = (n, a, b)
    n, a, b = fastest
    flop = 2 * n**3
    while timed < GEMM_MAX_TIMED and time.perf_counter() - start + flop / rates[n] < budget_s:
        rates[n] = max(rates[n], flop / _seconds(a, b))
        timed += 1
    _MEASURED[key] = MeasuredGemm(max(rates.values()), tuple(rates), timed, dtype)
    return _MEASURED[key]


def peak_flops(
    device: torch.device, numerics: Numerics, configured_tflops: float | None
) -> tuple[float, str]:
    """The device's peak FLOP/s for ``perf/*_mfu`` and where the figure comes from."""
    low = numerics.autocast is not None
    if configured_tflops:
        return configured_tflops * 1e12, f"run.peak_tflops={configured_tflops:g}"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for gpu, (half, single) in GPU_PEAK_TFLOPS.items():
            if gpu in name:
                tflops = half if low else single
                return (
                    tflops * 1e12,
                    f"{name} datasheet {tflops:g} TFLOP/s ({'bf16' if low else 'fp32'} dense)",
                )
    measured = measured_gemm_flops(device, numerics.autocast or torch.float32)
    return measured.flops, measured.describe()
