"""Deterministic mode (``run.deterministic``): the same inputs give the same bits, on a busy machine
and on another CPU of the same kind.

What moves a CPU run's bits, measured on the tiny recipes (``docs/reproducibility.md``):

- **The kernels the libraries pick by CPU.** MKL chooses its GEMM code path by processor (vendor,
  microarchitecture, cache sizes); oneDNN its ISA (AMX, AVX-512 FP16 where present). The same commit
  on an Intel Sapphire Rapids and an AMD Zen 4 gave the same rollouts but a first training step
  0.3% apart. MKL's conditional numerical reproducibility (``MKL_CBWR``, Intel's CNR) fixes the
  code path to one ISA branch; ``ONEDNN_MAX_CPU_ISA`` caps oneDNN at a level both CPUs have. Both
  are read once, when the library first runs in a process: :func:`pin_environment` sets them at
  each process's start (the ``diffrl`` command, before torch loads; children inherit them).
- **Threads**: a fixed count per process (``torch.set_num_threads``, which also turns MKL's dynamic
  threading off; ``MKL_DYNAMIC``/``OMP_DYNAMIC`` off for children). With torch 2.13 the tiny
  recipes gave the same bits on 1, 2 and 3 threads and with 4 busy processes on 2 cores; the count
  is fixed anyway because MKL, left dynamic, may pick fewer threads than asked.
- **Not numerics**: a reward call that times out on a loaded machine fails its samples, and the run
  trains on what is left (the committed curve of 2026-12-01 lost 512 of 1,152 rewards at iteration 2
  that way). The rollout's warning says so: from that iteration on, the run does not reproduce.

On a GPU it also sets ``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS's deterministic workspaces), cuDNN's
deterministic algorithms without autotuning, and ``torch.use_deterministic_algorithms`` (warning,
not failing, on an op that has no deterministic kernel).
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from pathlib import Path

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace setting (CUDA's documented choice; ``:16:8`` uses less memory)."""

PINNED_KEYS = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "MKL_DYNAMIC", "OMP_DYNAMIC", "CUBLAS_WORKSPACE_CONFIG")

_set_here: dict[str, str] = {}
"""The environment variables :func:`pin_environment` set in this process (a user's own are kept)."""


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (``/proc/cpuinfo``; empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the platform's word for it."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def isa_pins(flags: frozenset[str]) -> dict[str, str]:
    """The library ISA settings for a CPU with ``flags``: MKL's CNR branch and oneDNN's cap at the
    highest level the CPU has of those two CPUs of one kind share (an AMX or AVX512-FP16 CPU is
    capped at AVX512-BF16, so it computes as a Zen 4 does). Nothing on a CPU without AVX2 (another
    architecture: MKL and oneDNN's x86 kernels are not there)."""
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        if "avx512_bf16" in flags:
            onednn = "AVX512_CORE_BF16"
        elif "avx512_vnni" in flags:
            onednn = "AVX512_CORE_VNNI"
        else:
            onednn = "AVX512_CORE"
        return {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": onednn}
    if {"avx2", "fma"} <= flags:
        return {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {}


def wanted_environment(flags: frozenset[str] | None = None) -> dict[str, str]:
    """Every variable deterministic mode sets, for this CPU."""
    return {
        **isa_pins(cpu_flags() if flags is None else flags),
        "MKL_DYNAMIC": "FALSE",
        "OMP_DYNAMIC": "FALSE",
        "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE,
    }


def pin_environment() -> None:
    """Set deterministic mode's library variables in this process's environment, before the
    libraries first run (they read them once) and so in every child it starts. A variable the
    user set is kept. :func:`unpin_environment` takes back what this set (``run.deterministic:
    false``); call both before torch's first matrix product."""
    for key, value in wanted_environment().items():
        if key not in os.environ:
            os.environ[key] = value
            _set_here[key] = value


def unpin_environment() -> None:
    """Remove what :func:`pin_environment` set (a user's own settings stay)."""
    for key, value in list(_set_here.items()):
        if os.environ.get(key) == value:
            del os.environ[key]
        del _set_here[key]


@dataclass(frozen=True)
class Determinism:
    """What a process runs under: recorded in the run folder (``run.json``) and printed."""

    deterministic: bool
    threads: int
    environment: dict[str, str]
    """The pinned variables as this process has them (unset ones left out)."""
    cpu: str
    torch: str

    @property
    def kind(self) -> str:
        """What two machines must share to give the same bits: the pinned ISA and torch's version
        (the thread count too, where a library splits work by it)."""
        isa = "/".join(self.environment.get(k, "-") for k in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA"))
        return f"{platform.machine()} {isa} torch {self.torch}"

    def describe(self) -> str:
        if not self.deterministic:
            return f"deterministic mode off ({_threads(self.threads)}; run.deterministic)"
        isa = ", ".join(
            f"{k}={self.environment[k]}" for k in ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA") if k in self.environment
        )
        return (
            f"deterministic mode: {_threads(self.threads)}" + (f", {isa}" if isa else "") + f" ({self.cpu})"
        )

    def to_dict(self) -> dict:
        return {
            "deterministic": self.deterministic,
            "threads": self.threads,
            "environment": self.environment,
            "cpu": self.cpu,
            "torch": self.torch,
            "kind": self.kind,
        }


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def apply(deterministic: bool, threads: int | None, device: str = "cpu") -> Determinism:
    """Put this process in (or out of) deterministic mode: the environment (:func:`pin_environment`,
    effective for what has not run yet and for children), a fixed thread count (``threads``, or the
    count torch has now), and torch's deterministic algorithms and cuDNN flags on a GPU."""
    if deterministic:
        pin_environment()
    else:
        unpin_environment()
    import torch

    count = threads or torch.get_num_threads()
    torch.set_num_threads(count)  # also MKL's dynamic threading off, in this process
    if deterministic and device.startswith("cuda"):
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return Determinism(
        deterministic=deterministic,
        threads=count,
        environment={k: os.environ[k] for k in PINNED_KEYS if k in os.environ},
        cpu=cpu_model(),
        torch=torch.__version__,
    )
