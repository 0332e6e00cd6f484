"""Transition kernels against the Flow-GRPO reference (golden vectors) and their invariants."""

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffrl.core.registry import RegistryError
from diffrl.sampling.kernels import Kernel, cps_step, ode_step, resolve_kernel, sde_step

CASES = ["sde_image", "sde_video", "cps_image", "sde_last_step"]


def _load(reference_dir, name):
    path = reference_dir / f"{name}.safetensors"
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    return load_file(str(path)), meta


def _step(reference_dir, name, **given):
    """Run the case's kernel on its inputs; ``given``: ``prev_sample=`` to score or ``noise=`` to sample."""
    ref, meta = _load(reference_dir, name)
    sigmas = ref["sigmas"].float()
    idx = ref["step_index"]
    kernel = resolve_kernel(meta["sde_type"])
    out = kernel.step(
        ref["sample"],
        ref["model_output"],
        sigmas[idx],
        sigmas[idx + 1],
        noise_level=float(meta["noise_level"]),
        sigma_max=sigmas[1].item(),
        **given,
    )
    return ref, meta, out


@pytest.mark.parametrize("name", CASES)
def test_kernel_matches_reference(reference_dir, name):
    ref, _, out = _step(reference_dir, name, prev_sample=_load(reference_dir, name)[0]["prev_sample"])
    torch.testing.assert_close(out.mean, ref["prev_sample_mean"])
    torch.testing.assert_close(out.std, ref["std_dev_t"])
    torch.testing.assert_close(out.log_prob, ref["log_prob"])
    _, _, perturbed = _step(reference_dir, name, prev_sample=ref["prev_sample_perturbed"])
    torch.testing.assert_close(perturbed.log_prob, ref["log_prob_perturbed"])


@pytest.mark.parametrize("name", CASES)
def test_sampling_with_the_recovered_noise_reproduces_prev_sample(reference_dir, name):
    ref, meta, scored = _step(reference_dir, name, prev_sample=_load(reference_dir, name)[0]["prev_sample"])
    sigmas, idx = ref["sigmas"].float(), ref["step_index"]
    shape = [-1] + [1] * (ref["sample"].ndim - 1)
    dt = (sigmas[idx] - sigmas[idx + 1]).view(shape)
    scale = scored.std.view(shape) * (torch.sqrt(dt) if meta["sde_type"] == "sde" else 1)
    noise = (ref["prev_sample"] - scored.mean) / scale
    _, _, sampled = _step(reference_dir, name, noise=noise)
    torch.testing.assert_close(sampled.prev_sample, ref["prev_sample"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(sampled.log_prob, scored.log_prob, atol=1e-3, rtol=1e-4)


@pytest.mark.parametrize("kernel", [sde_step, cps_step])
def test_noise_level_zero_is_the_ode_step(kernel):
    x, v = torch.randn(3, 4, 2, 8, 8), torch.randn(3, 4, 2, 8, 8)  # video-shaped
    sigma, sigma_next = torch.tensor([1.0, 0.7, 0.3]), torch.tensor([0.9, 0.5, 0.0])
    out = kernel(x, v, sigma, sigma_next, 0.0, 0.95, prev_sample=torch.zeros_like(x))
    torch.testing.assert_close(out.mean, ode_step(x, v, sigma, sigma_next), atol=1e-6, rtol=1e-6)


def test_unknown_kernel_lists_the_known_ones():
    with pytest.raises(RegistryError, match="Known: cps, heun, ode, sde"):
        resolve_kernel("ddim")


def test_a_dotted_path_that_is_not_a_kernel_is_refused():
    with pytest.raises(RegistryError, match="not a diffrl.sampling.kernels.Kernel"):
        resolve_kernel("diffrl.sampling.kernels:ode_step")


@pytest.mark.parametrize("name", ["ode", "sde", "cps", "heun"])
def test_every_builtin_kernel_follows_the_contract(name):
    """One contract: ``step(...) -> StepOutput``; stochastic kernels give a ``(B,)`` log-prob, the
    others none; Heun asks for its second velocity through ``velocity_at``."""
    kernel = resolve_kernel(name)
    assert isinstance(kernel, Kernel)
    x, v = torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8)
    sigma, sigma_next = torch.tensor([0.8, 0.8]), torch.tensor([0.6, 0.6])
    calls = []

    def velocity_at(latents, s):
        calls.append(s)
        return v

    out = kernel.step(
        x,
        v,
        sigma,
        sigma_next,
        noise_level=0.5,
        sigma_max=0.9,
        noise=torch.randn_like(x),
        velocity_at=velocity_at,
    )
    assert out.prev_sample.shape == x.shape
    assert (out.log_prob is not None) == kernel.stochastic
    if kernel.stochastic:
        assert out.log_prob.shape == (2,)
    assert len(calls) == (1 if kernel.second_evaluation else 0)
    if name == "heun":  # a constant velocity: the trapezoid is the Euler step
        torch.testing.assert_close(out.prev_sample, ode_step(x, v, sigma, sigma_next))


def test_ode_step_is_euler():
    x = torch.randn(2, 3, 4, 4)
    v = torch.randn(2, 3, 4, 4)
    s, s_next = torch.tensor([0.8, 0.5]), torch.tensor([0.6, 0.1])
    out = ode_step(x, v, s, s_next)
    torch.testing.assert_close(out, x + (s_next - s).view(2, 1, 1, 1) * v)
