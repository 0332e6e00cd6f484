"""diffrl/core/pins.py: the ISA pins chosen for a CPU's flags, the environment pinned and taken
back (a user's own settings kept), the thread count fixed, and what a process reports."""

from __future__ import annotations

import os
import platform

import pytest
import torch

from diffrl.core import determinism, pins
from diffrl.core.determinism import Determinism, apply
from diffrl.core.errors import DiffrlError
from diffrl.core.pins import CUBLAS_WORKSPACE, PINNED_KEYS, PORTABLE_PINS, isa_pins, wanted_environment

AVX2 = frozenset("fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma bmi1 bmi2 avx2".split())
AVX512_CORE = AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}
ZEN4 = AVX512_CORE | {"avx512_vnni", "avx512_bf16", "avx512vbmi", "avx512_vbmi2", "avx512_vpopcntdq"}
"""An AMD EPYC Zen 4 (this project's test machine): AVX-512 with BF16 and VNNI, no AMX."""
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_tile", "amx_int8", "avx512_fp16"}
"""The CPU of issue 39's divergence: the same, plus AMX and AVX512-FP16."""
CASCADE_LAKE = AVX512_CORE | {"avx512_vnni"}
SKYLAKE_X = AVX512_CORE
KNIGHTS_LANDING = AVX2 | {"avx512f", "avx512cd", "avx512er", "avx512pf"}
"""AVX-512 foundation without BW/DQ/VL: not the AVX512_CORE level."""
GRAVITON = frozenset("fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm".split())
"""An aarch64 CPU's ``Features`` line: none of MKL's or oneDNN's x86 kernels."""


INTEL, AMD = "GenuineIntel", "AuthenticAMD"


@pytest.mark.parametrize(
    "flags, vendor, pinned",
    [
        (ZEN4, AMD, {"MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
        (SAPPHIRE_RAPIDS, INTEL, {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}),
        (CASCADE_LAKE, INTEL, {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI"}),
        (SKYLAKE_X, INTEL, {"MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}),
        (KNIGHTS_LANDING, INTEL, {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
        (AVX2, INTEL, {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
        (AVX2, AMD, {"MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "AVX2"}),
        (AVX2 - {"fma"}, INTEL, {}),
        (AVX2 - {"avx2"}, INTEL, {}),
        (GRAVITON, "aarch64", {}),
        (frozenset(), "x86_64", {}),
    ],
    ids=[
        "zen4",
        "amx-capped-at-bf16",
        "avx512-vnni",
        "avx512-core",
        "avx512f-only",
        "avx2-intel",
        "avx2-amd",
        "avx2-no-fma",
        "avx-only",
        "aarch64",
        "no-flags",
    ],
)
def test_isa_pins_for_a_cpus_flags_and_vendor(flags, vendor, pinned):
    """MKL's ISA branches on Intel CPUs; AUTO elsewhere (MKL offers its branches on Intel only)."""
    assert isa_pins(flags, vendor) == pinned


@pytest.mark.parametrize(
    "flags, vendor, portable",
    [
        (ZEN4, AMD, True),
        (SAPPHIRE_RAPIDS, INTEL, True),
        (SKYLAKE_X, INTEL, True),
        (KNIGHTS_LANDING, INTEL, True),
        (AVX2, INTEL, True),
        (AVX2, AMD, True),
        (AVX2 - {"fma"}, INTEL, False),
        (AVX2 - {"avx2"}, AMD, False),
        (GRAVITON, "aarch64", False),
    ],
    ids=[
        "zen4",
        "sapphire-rapids",
        "avx512-core",
        "avx512f-only",
        "avx2-intel",
        "avx2-amd",
        "no-fma",
        "avx",
        "aarch64",
    ],
)
def test_the_portable_pins_are_one_level_for_every_avx2_cpu(flags, vendor, portable):
    """The same three settings whatever the vendor and the level above AVX2; none below it."""
    assert isa_pins(flags, vendor, portable=True) == (PORTABLE_PINS if portable else {})


def test_the_wanted_environment_adds_the_threading_and_cuda_settings_on_every_cpu():
    common = {"MKL_DYNAMIC": "FALSE", "OMP_DYNAMIC": "FALSE", "CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE}
    assert wanted_environment(ZEN4, AMD) == {**isa_pins(ZEN4, AMD), **common}  # the default: true
    assert wanted_environment(ZEN4, AMD, mode="portable") == {**PORTABLE_PINS, **common}
    assert (
        wanted_environment(GRAVITON, "aarch64")
        == wanted_environment(GRAVITON, "aarch64", mode=True)
        == common
    )
    assert set(wanted_environment(SAPPHIRE_RAPIDS, INTEL, mode="portable")) == set(PINNED_KEYS)
    assert set(PINNED_KEYS) - set(wanted_environment(SAPPHIRE_RAPIDS, INTEL)) == {"ATEN_CPU_CAPABILITY"}


@pytest.fixture
def clean_env(monkeypatch):
    """None of the pinned variables set, a CPU with Zen 4's flags, and nothing recorded as pinned
    by this process; all three (and torch's thread count) restored afterwards."""
    for key in PINNED_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(pins, "cpu_flags", lambda: ZEN4)
    monkeypatch.setattr(pins, "cpu_vendor", lambda: AMD)
    monkeypatch.setattr(determinism, "cpu_vendor", lambda: AMD)
    monkeypatch.setattr(pins, "_set_here", {})
    threads, mkldnn = torch.get_num_threads(), torch.backends.mkldnn.enabled
    yield monkeypatch
    torch.set_num_threads(threads)
    torch.backends.mkldnn.enabled = mkldnn


def _pinned() -> dict[str, str]:
    return {k: os.environ[k] for k in PINNED_KEYS if k in os.environ}


def test_pin_keeps_a_users_own_value_and_unpin_removes_only_what_it_set(clean_env):
    clean_env.setenv("MKL_CBWR", "COMPATIBLE")
    pins.pin_environment()
    assert _pinned() == {**wanted_environment(ZEN4, AMD), "MKL_CBWR": "COMPATIBLE"}
    assert "MKL_CBWR" not in pins._set_here

    pins.pin_environment()  # a second call changes nothing
    assert _pinned() == {**wanted_environment(ZEN4, AMD), "MKL_CBWR": "COMPATIBLE"}

    os.environ["OMP_DYNAMIC"] = "TRUE"  # changed after the pin: the user's now, kept
    pins.unpin_environment()
    assert _pinned() == {"MKL_CBWR": "COMPATIBLE", "OMP_DYNAMIC": "TRUE"}
    assert pins._set_here == {}
    pins.unpin_environment()  # nothing left to take back
    assert _pinned() == {"MKL_CBWR": "COMPATIBLE", "OMP_DYNAMIC": "TRUE"}


def test_apply_off_takes_the_pins_back_and_fixes_the_thread_count(clean_env):
    pins.pin_environment()  # as the diffrl command does at its start
    got = apply(False, 3, "cpu")
    assert torch.get_num_threads() == 3
    assert got.threads == 3 and not got.deterministic
    assert got.environment == {} == _pinned()
    assert got.describe() == "deterministic mode off (3 threads; run.deterministic)"


def test_off_names_the_pins_the_environment_still_sets(clean_env):
    """Pins the mode did not set (the user's, a parent process's) stay, and the line says so."""
    clean_env.setenv("MKL_CBWR", "AVX2")
    got = apply(False, 2, "cpu")
    assert (
        got.describe()
        == "deterministic mode off (2 threads; run.deterministic); set in the environment: MKL_CBWR=AVX2"
    )


def test_apply_on_pins_the_environment_and_fixes_the_thread_count(clean_env):
    torch.set_num_threads(1)
    pins.pin_environment("portable")  # another mode pinned before: true takes its place
    got = apply(True, 2, "cpu")
    assert torch.get_num_threads() == 2
    assert got.deterministic and got.threads == 2
    assert got.environment == wanted_environment(ZEN4, AMD, mode=True) == _pinned()
    assert got.torch == torch.__version__
    assert got.describe() == (
        f"deterministic mode: 2 threads, MKL_CBWR=AUTO, ONEDNN_MAX_CPU_ISA=AVX512_CORE_BF16 ({got.cpu})"
    )
    assert got.kind == f"{platform.machine()} {AMD} AUTO/AVX512_CORE_BF16 torch {torch.__version__}"
    assert determinism.machine_kind() == got.kind
    assert got.to_dict()["kind"] == got.kind


def test_apply_without_a_count_keeps_torchs_own(clean_env):
    torch.set_num_threads(1)
    assert apply(True, None).threads == 1
    assert torch.get_num_threads() == 1


def test_describe_and_kind_where_nothing_is_pinned():
    """A CPU without the x86 pins (aarch64): the line has no ISA part, the kind says none."""
    got = Determinism(True, 1, {"MKL_DYNAMIC": "FALSE"}, "Neoverse-V1", "aarch64", "2.13.0")
    assert got.describe() == "deterministic mode: 1 thread (Neoverse-V1)"
    assert got.kind == f"{platform.machine()} aarch64 -/- torch 2.13.0"
    other = Determinism(True, 4, {"MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "x", INTEL, "2.13.0")
    assert other.kind.endswith(f" {INTEL} AVX2/AVX2 torch 2.13.0") and other.kind != got.kind
    amd = Determinism(True, 4, {"MKL_CBWR": "AUTO", "ONEDNN_MAX_CPU_ISA": "AVX2"}, "x", AMD, "2.13.0")
    assert amd.kind != other.kind  # MKL picks its kernels by vendor


def test_apply_portable_pins_one_level_and_names_no_vendor_in_the_kind(clean_env):
    clean_env.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    pins.pin_environment()  # the command's default at its start: portable takes its place
    got = apply("portable", 2, "cpu")
    assert got.environment == wanted_environment(ZEN4, AMD, mode="portable") == _pinned()
    assert got.describe() == (
        "portable deterministic mode: 2 threads, MKL_CBWR=COMPATIBLE, ONEDNN_MAX_CPU_ISA=AVX2, "
        f"ATEN_CPU_CAPABILITY=avx2 ({got.cpu})"
    )
    assert got.kind == f"{platform.machine()} portable COMPATIBLE/AVX2/avx2 torch {torch.__version__}"
    assert got.aten == "AVX2" and got.to_dict()["aten"] == "AVX2"
    assert not torch.backends.mkldnn.enabled  # convolutions through ATen and MKL, not oneDNN
    assert apply(True, 2, "cpu").deterministic and torch.backends.mkldnn.enabled  # back for the others
    intel = Determinism("portable", 4, dict(PORTABLE_PINS), "Xeon", INTEL, torch.__version__)
    assert intel.kind == got.kind  # an Intel and an AMD CPU are one kind at the portable level


def test_apply_portable_refuses_when_aten_already_chose_another_level(clean_env):
    """ATen reads its level once: an operation before the pin (here: a faked AVX512 choice) would
    leave the run at another level than the mode says, so the mode refuses to start."""
    clean_env.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    with pytest.raises(DiffrlError, match="ATen computes with its AVX512 kernels, not AVX2"):
        apply("portable", 1, "cpu")


def test_repin_puts_one_mode_in_place_of_another_and_false_takes_all_back(clean_env):
    clean_env.setenv("ONEDNN_MAX_CPU_ISA", "SSE41")  # the user's: kept throughout
    pins.repin_environment("portable")
    assert _pinned() == {**wanted_environment(ZEN4, AMD, mode="portable"), "ONEDNN_MAX_CPU_ISA": "SSE41"}
    pins.repin_environment(True)
    assert _pinned() == {**wanted_environment(ZEN4, AMD, mode=True), "ONEDNN_MAX_CPU_ISA": "SSE41"}
    assert "ATEN_CPU_CAPABILITY" not in os.environ
    pins.repin_environment(False)
    assert _pinned() == {"ONEDNN_MAX_CPU_ISA": "SSE41"}
