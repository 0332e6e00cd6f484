"""The library environment variables deterministic mode pins (:mod:`diffrl.core.determinism`), without
torch: the ``diffrl`` command sets them before torch loads (MKL and oneDNN read them once, when they
first run in a process) and every child process inherits them; the tests' processes set them too.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path

CUBLAS_WORKSPACE = ":4096:8"
"""cuBLAS's deterministic workspace setting (CUDA's documented choice; ``:16:8`` uses less memory)."""

PINNED_KEYS = (
    "MKL_CBWR",
    "ONEDNN_MAX_CPU_ISA",
    "ATEN_CPU_CAPABILITY",
    "MKL_DYNAMIC",
    "OMP_DYNAMIC",
    "CUBLAS_WORKSPACE_CONFIG",
)

PORTABLE = "portable"
"""``run.deterministic: portable``: one set of bits on every x86-64 CPU with AVX2 and FMA."""
DEFAULT_MODE: bool | str = True
"""``run.deterministic``'s default, which the ``diffrl`` command pins before torch loads: this CPU
kind's level (the portable one costs about 2x on the main job where MKL's own branch is AVX2:
``docs/reproducibility.md``)."""

PORTABLE_PINS = {"MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}
"""The portable level, what every x86-64 CPU with AVX2 and FMA (Intel Haswell, AMD Zen and later)
runs alike: MKL's ``COMPATIBLE`` branch (its conditional numerical reproducibility on SSE2 code, the
one branch MKL offers on every x86 CPU, whatever the vendor; with CNR's fixed cache sizes,
deterministic reductions and static scheduling), oneDNN capped at AVX2, and ATen's vectorised
kernels at their AVX2 build (``ATEN_CPU_CAPABILITY``: ATen picks ``avx512`` on an AVX-512 CPU
otherwise, other vector widths and so other reduction orders)."""

_set_here: dict[str, str] = {}
"""The environment variables :func:`pin_environment` set in this process (a user's own are kept)."""


def _cpuinfo(keys: tuple[str, ...]) -> str | None:
    """The first ``/proc/cpuinfo`` value of one of ``keys`` (None where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags (empty where ``/proc/cpuinfo`` has none)."""
    return frozenset((_cpuinfo(("flags", "Features")) or "").split())


def cpu_vendor() -> str:
    """``GenuineIntel``, ``AuthenticAMD``, ... (the architecture's name where the CPU names none)."""
    return _cpuinfo(("vendor_id",)) or platform.machine()


def cpu_model() -> str:
    """The CPU's model name, else the platform's word for it."""
    return _cpuinfo(("model name",)) or platform.processor() or platform.machine()


INTEL = "GenuineIntel"


def isa_pins(flags: frozenset[str], vendor: str, portable: bool = False) -> dict[str, str]:
    """The library ISA settings for a CPU with ``flags`` made by ``vendor``: with ``portable``, the
    portable level (:data:`PORTABLE_PINS`) on a CPU with AVX2 and FMA; else this kind's own.

    oneDNN's cap (``ONEDNN_MAX_CPU_ISA``) at the highest of the levels two CPUs of one kind share:
    an AMX or AVX512-FP16 CPU is capped at AVX512-BF16. MKL's branch (``MKL_CBWR``, its
    conditional numerical reproducibility): on an Intel CPU the ISA branch of its level (``AVX512``,
    ``AVX2``); MKL offers its ISA branches on Intel processors only and takes ``AUTO`` on others
    (measured on an AMD Zen 4: ``AVX512``, ``AVX2`` and ``AUTO`` give the same bits, not those of
    MKL without CNR), so elsewhere ``AUTO``: CNR on, the branch MKL's own choice for the CPU.
    Nothing on a CPU without AVX2 and FMA (another architecture: MKL and oneDNN's x86 kernels are
    not there)."""
    if portable:
        return dict(PORTABLE_PINS) if {"avx2", "fma"} <= flags else {}
    intel = vendor == INTEL
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        if "avx512_bf16" in flags:
            onednn = "AVX512_CORE_BF16"
        elif "avx512_vnni" in flags:
            onednn = "AVX512_CORE_VNNI"
        else:
            onednn = "AVX512_CORE"
        return {"MKL_CBWR": "AVX512" if intel else "AUTO", "ONEDNN_MAX_CPU_ISA": onednn}
    if {"avx2", "fma"} <= flags:
        return {"MKL_CBWR": "AVX2" if intel else "AUTO", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    return {}


def wanted_environment(
    flags: frozenset[str] | None = None, vendor: str | None = None, mode: bool | str = DEFAULT_MODE
) -> dict[str, str]:
    """Every variable deterministic mode (``mode``: ``run.deterministic``, true or ``portable``) sets,
    for this CPU (or one with ``flags`` by ``vendor``)."""
    return {
        **isa_pins(
            cpu_flags() if flags is None else flags,
            cpu_vendor() if vendor is None else vendor,
            portable=mode == PORTABLE,
        ),
        "MKL_DYNAMIC": "FALSE",
        "OMP_DYNAMIC": "FALSE",
        "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE,
    }


def pin_environment(mode: bool | str = DEFAULT_MODE) -> None:
    """Set deterministic mode's library variables (for ``mode``, ``run.deterministic``: true or
    ``portable``) in this process's environment, before the libraries first run (they read them
    once) and so in every child it starts. A variable the user set is kept. :func:`unpin_environment`
    takes back what this set (to pin another mode, or none: ``run.deterministic: false``); call both
    before torch's first operation."""
    for key, value in wanted_environment(mode=mode).items():
        if key not in os.environ:
            os.environ[key] = value
            _set_here[key] = value


def repin_environment(mode: bool | str) -> None:
    """Pin ``mode``'s variables in place of what this process pinned so far (none for false): the
    command line does it with the run's ``run.deterministic`` once the config is read, before
    torch loads."""
    unpin_environment()
    if mode:
        pin_environment(mode)


def unpin_environment() -> None:
    """Remove what :func:`pin_environment` set (a user's own settings stay)."""
    for key, value in list(_set_here.items()):
        if os.environ.get(key) == value:
            del os.environ[key]
        del _set_here[key]
