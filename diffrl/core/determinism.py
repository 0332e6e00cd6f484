"""Deterministic mode (``run.deterministic``): the same inputs give the same bits, on a busy machine
and, at ``true`` (the default), on another CPU of the same kind; at the ``portable`` level, on every
x86-64 CPU with AVX2 and FMA.

The portable level (:data:`~diffrl.core.pins.PORTABLE_PINS`) pins the three libraries that choose
kernels by CPU below every such CPU's own level: MKL's ``COMPATIBLE`` branch (offered on every x86
CPU, whatever the vendor), oneDNN capped at AVX2, ATen's vectorised kernels at their AVX2 build; and
it turns oneDNN off for what torch would send it (fp32 convolutions go through ATen and MKL), since
oneDNN's JIT kernels also choose their blocking by the CPU's cache sizes. What it cannot pin (the
OCR reward's onnxruntime) is in ``docs/reproducibility.md``.

What moves a CPU run's bits, measured on the tiny recipes (``docs/reproducibility.md``):

- **The kernels the libraries pick by CPU.** MKL chooses its GEMM code path by processor (vendor,
  microarchitecture); oneDNN its ISA (AMX, AVX-512 FP16 where present). The same commit on an Intel
  Sapphire Rapids and an AMD Zen 4 gave the same first rollout reward but a first training step 0.3%
  apart (the cause inferred: thread count and load were ruled out on the Zen 4, no Intel CPU was at
  hand). MKL's conditional numerical reproducibility (``MKL_CBWR``) fixes its code path: to an ISA
  branch on Intel CPUs, ``AUTO`` elsewhere (MKL offers its branches on Intel CPUs only);
  ``ONEDNN_MAX_CPU_ISA`` caps oneDNN at a level CPUs of one kind share. Both are read once, when the
  library first runs in a process: :func:`diffrl.core.pins.pin_environment` sets them at each process's
  start (the ``diffrl`` command, before torch loads; children inherit them). Machines of one
  :func:`kind_of` (vendor, pinned ISA, torch) are meant to agree; only one kind was at hand to test.
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
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from diffrl.core.errors import DiffrlError
from diffrl.core.pins import (
    PINNED_KEYS,
    PORTABLE,
    PORTABLE_PINS,
    cpu_model,
    cpu_vendor,
    repin_environment,
)

ISA_KEYS = ("MKL_CBWR", "ONEDNN_MAX_CPU_ISA", "ATEN_CPU_CAPABILITY")


def kind_of(environment: Mapping[str, str], vendor: str, torch_version: str) -> str:
    """What two machines must share to give the same bits: the architecture, the ISA the libraries
    are pinned to, torch's version, and, unless the pins are the portable level
    (:data:`~diffrl.core.pins.PORTABLE_PINS`, whose MKL branch is the same on every vendor's CPU),
    the CPU's vendor (MKL picks its kernels by vendor). (Also the thread count where a library
    splits work by it: not seen on the tiny recipes, so not part of it.)"""
    if all(environment.get(k) == v for k, v in PORTABLE_PINS.items()):
        return f"{platform.machine()} portable {'/'.join(PORTABLE_PINS[k] for k in ISA_KEYS)} torch {torch_version}"
    isa = "/".join(environment.get(k, "-") for k in ISA_KEYS[:2])
    return f"{platform.machine()} {vendor} {isa} torch {torch_version}"


def machine_kind() -> str:
    """This process's kind (:func:`kind_of` with its environment), without changing anything."""
    return kind_of(os.environ, cpu_vendor(), torch.__version__)


@dataclass(frozen=True)
class Determinism:
    """What a process runs under: printed in a run's start-up lines (and the trackers' start-up text)."""

    deterministic: bool | str
    """``run.deterministic``: ``portable``, true (this CPU kind's bits) or false."""
    threads: int
    environment: dict[str, str]
    """The pinned variables as this process has them (unset ones left out)."""
    cpu: str
    vendor: str
    torch: str
    aten: str = ""
    """The ATen CPU capability in effect (``torch.backends.cpu.get_cpu_capability()``: ``AVX2``,
    ``AVX512``, ...); empty where not read."""

    @property
    def kind(self) -> str:
        return kind_of(self.environment, self.vendor, self.torch)

    def describe(self) -> str:
        isa = ", ".join(f"{k}={self.environment[k]}" for k in ISA_KEYS if k in self.environment)
        if not self.deterministic:
            line = f"deterministic mode off ({_threads(self.threads)}; run.deterministic)"
            # a pin the mode did not set (the user's, or a parent process's) still applies
            return line + (f"; set in the environment: {isa}" if isa else "")
        level = "portable deterministic mode" if self.deterministic == PORTABLE else "deterministic mode"
        return f"{level}: {_threads(self.threads)}" + (f", {isa}" if isa else "") + f" ({self.cpu})"

    def to_dict(self) -> dict:
        return {
            "deterministic": self.deterministic,
            "threads": self.threads,
            "environment": self.environment,
            "cpu": self.cpu,
            "vendor": self.vendor,
            "torch": self.torch,
            "aten": self.aten,
            "kind": self.kind,
        }


def _threads(n: int) -> str:
    return f"{n} thread" + ("" if n == 1 else "s")


def apply(deterministic: bool | str, threads: int | None, device: str = "cpu") -> Determinism:
    """Put this process in deterministic mode ``deterministic`` (``run.deterministic``: ``portable``,
    true, or false for none): the environment (:func:`diffrl.core.pins.pin_environment`, effective
    for what has not run yet and for children), a fixed thread count (``threads``, or the count torch
    has now), and torch's deterministic algorithms and cuDNN flags on a GPU. Raises
    :class:`~diffrl.core.errors.DiffrlError` when ATen already computes at another level than the
    mode pins (an operation ran before the pin: the mode would not hold)."""
    repin_environment(deterministic)
    # portable: convolutions through ATen and MKL's pinned branch, not oneDNN, whose JIT kernels
    # choose their blocking by the CPU's cache sizes (its ISA cap pins the instructions, not those)
    torch.backends.mkldnn.enabled = deterministic != PORTABLE
    count = threads or torch.get_num_threads()
    torch.set_num_threads(count)  # also MKL's dynamic threading off, in this process
    if deterministic and device.startswith("cuda"):
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    aten = torch.backends.cpu.get_cpu_capability()  # fixed from ATen's first use of it on
    wanted = PORTABLE_PINS["ATEN_CPU_CAPABILITY"]
    if (
        deterministic == PORTABLE
        and os.environ.get("ATEN_CPU_CAPABILITY") == wanted
        and aten.lower() != wanted
    ):
        raise DiffrlError(
            f"run.deterministic: portable: ATen computes with its {aten} kernels, not {wanted.upper()} "
            "(ATen reads ATEN_CPU_CAPABILITY once, at its first operation, which ran before the mode "
            "was set): start the run with the diffrl command, or set ATEN_CPU_CAPABILITY=avx2 before torch loads"
        )
    return Determinism(
        deterministic=deterministic,
        threads=count,
        environment={k: os.environ[k] for k in PINNED_KEYS if k in os.environ},
        cpu=cpu_model(),
        vendor=cpu_vendor(),
        torch=torch.__version__,
        aten=aten,
    )
