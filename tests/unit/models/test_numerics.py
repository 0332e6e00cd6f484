"""The speed options' resolution and fallbacks, float32 attention under autocast, and the FLOP meter."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from diffrl.core.rollout import Conditioning
from diffrl.models import numerics
from diffrl.models.numerics import Float32Attention, ForwardMeter, Numerics, peak_flops, resolve_numerics

CPU = torch.device("cpu")


def test_an_autocast_dtype_the_cpu_lacks_falls_back_to_the_weights_dtype_with_a_note(monkeypatch):
    monkeypatch.setitem(numerics.CPU_HAS, torch.bfloat16, lambda: False)
    n = resolve_numerics("bfloat16", False, CPU)
    assert n.autocast is None and not n.compile
    assert len(n.notes) == 1 and "model.autocast=bfloat16 is off" in n.notes[0]
    assert "no bfloat16 instructions" in n.notes[0]
    assert n.describe() == "no autocast, eager"


def test_compile_without_a_cxx_compiler_falls_back_to_eager_with_a_note(monkeypatch):
    monkeypatch.setattr(numerics.shutil, "which", lambda name: None)
    n = resolve_numerics(None, True, CPU)
    assert not n.compile and "model.compile=true is off" in n.notes[0] and "C++ compiler" in n.notes[0]


def test_supported_options_resolve_as_asked(monkeypatch):
    monkeypatch.setitem(numerics.CPU_HAS, torch.bfloat16, lambda: True)
    monkeypatch.setattr(numerics.shutil, "which", lambda name: f"/usr/bin/{name}")
    n = resolve_numerics("bfloat16", True, CPU)
    assert (n.autocast, n.compile, n.notes) == (torch.bfloat16, True, ())
    assert n.float32_attention  # on CPUs
    assert n.describe() == "autocast bfloat16 (attention in float32), compiled"


def test_float32_attention_runs_sdpa_on_float32_inputs_and_returns_the_callers_dtype():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 5, 8).bfloat16() for _ in range(3))
    with torch.autocast("cpu", dtype=torch.bfloat16), Float32Attention():
        out = F.scaled_dot_product_attention(q, k, v)
        other = torch.cat([q, k])  # every other function passes through
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float()).bfloat16()
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    assert torch.equal(other, torch.cat([q, k]))


def test_autocast_context_keeps_the_weights_float32_and_runs_matmuls_in_bfloat16():
    layer = nn.Linear(4, 3)
    with numerics.autocast(Numerics(torch.bfloat16, float32_attention=True), CPU):
        y = layer(torch.randn(2, 4))
    assert y.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with numerics.autocast(Numerics(), CPU):
        assert layer(torch.randn(2, 4)).dtype == torch.float32


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 16)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.linear(x))


def test_the_meter_counts_matmul_flops_once_per_shape_and_3x_with_gradients():
    module, meter = Dropping().train(), ForwardMeter()
    x, cond = torch.randn(4, 8), Conditioning({"h": torch.zeros(4, 2)})
    calls = []
    module.register_forward_pre_hook(lambda m, args: calls.append(1))
    with torch.no_grad():
        out = meter.run(module, x, cond, lambda: module(x), dry=False)
    assert out.shape == (4, 16) and len(calls) == 1  # counted on the call itself
    assert meter.flops == 2 * 4 * 8 * 16  # one (4 x 8) @ (8 x 16)
    meter.run(module, x, cond, lambda: module(x), dry=False)  # with gradients: forward + backward
    assert meter.flops == 4 * (2 * 4 * 8 * 16)
    x2 = torch.randn(6, 8)
    with torch.no_grad():
        meter.run(module, x2, cond, lambda: module(x2), dry=True)  # a dry run, then the call
    assert meter.flops == 4 * (2 * 4 * 8 * 16) + 2 * 6 * 8 * 16 and len(calls) == 4


def test_the_meters_dry_run_leaves_the_random_state_alone():
    module, meter = Dropping().train(), ForwardMeter()
    x, cond = torch.randn(4, 8), Conditioning({})
    torch.manual_seed(3)
    counted = meter.run(module, x, cond, lambda: module(x), dry=True)  # its dry run draws dropout masks
    torch.manual_seed(3)
    assert torch.equal(counted, module(x))


def test_peak_flops_states_where_the_figure_comes_from():
    flops, source = peak_flops(CPU, Numerics(), 2.5)
    assert flops == 2.5e12 and source == "run.peak_tflops=2.5"
    flops, source = peak_flops(CPU, Numerics(), None)
    assert flops > 0 and source.startswith("the best of ") and "float32 matmuls of 256^3" in source
    assert source.endswith(f"measured at {flops / 1e9:.1f} GFLOP/s")


def test_measuring_the_peak_leaves_the_random_state_alone(monkeypatch):
    """(It runs once, after a run's first iteration: a draw from the global RNG there would change
    a resumed run's draws against the uninterrupted one's.)"""
    monkeypatch.setattr(numerics, "_MEASURED", {})
    torch.manual_seed(5)
    numerics.measured_gemm_flops(CPU, torch.float32, sizes=(64,), repeats=1, budget_s=0.01)
    after = torch.rand(3)
    torch.manual_seed(5)
    assert torch.equal(after, torch.rand(3))


def _fake_seconds(monkeypatch, rates: dict[int, float]):
    """Each ``n x n`` matmul "takes" ``2 n^3 / rates[n]`` seconds, or 4x or 2x that (a busy machine):
    no test times anything."""
    slow = itertools.cycle([4.0, 1.0, 2.0])
    monkeypatch.setattr(
        numerics, "_seconds", lambda a, b: next(slow) * 2 * a.shape[0] ** 3 / rates[a.shape[0]]
    )
    monkeypatch.setattr(numerics, "_MEASURED", {})


def test_the_measured_peak_is_the_best_of_every_size_and_repeat(monkeypatch):
    # the middle size is the fastest (the largest falls out of cache); most readings are slowed down
    _fake_seconds(monkeypatch, {8: 1e9, 16: 2e9, 32: 0.5e9})
    measured = numerics.measured_gemm_flops(CPU, torch.float32, sizes=(8, 16, 32), repeats=5, budget_s=1.0)
    assert measured.flops == pytest.approx(2e9) and measured.sizes == (8, 16, 32)
    assert measured.timed == numerics.GEMM_MAX_TIMED  # the budget is not spent: then the cap stops it
    assert measured.describe() == "the best of 200 float32 matmuls of 8^3-32^3 measured at 2.0 GFLOP/s"


def test_the_measured_peak_keeps_within_its_time_budget(monkeypatch):
    # 1 kFLOP/s: the next size's estimate (12 x 8 kFLOP at half the rate) is far over the budget,
    # and one more matmul of the first size (1 s) too
    _fake_seconds(monkeypatch, {8: 1e3, 16: 1e3})
    measured = numerics.measured_gemm_flops(CPU, torch.float32, sizes=(8, 16), repeats=5, budget_s=0.5)
    assert measured.sizes == (8,) and measured.timed == 5 and measured.flops == pytest.approx(1e3)
