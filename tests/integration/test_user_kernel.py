"""A sampler kernel of the user's own, by dotted path: Flow-GRPO samples and replays with it.

``EulerMaruyama`` is a test-defined SDE variant (plain Euler-Maruyama on the flow's velocity, no
drift correction): x' = x + dt·v + η·sqrt(-dt)·ε, scored by the Gaussian log-density (per-element
mean, as the built-in kernels). The first replay of a rollout must give exactly the recorded
log-probs, as it does for ``sde`` and ``cps``.
"""

from __future__ import annotations

import math

import pytest
import torch

from diffrl.config import ConfigError
from diffrl.launch import train
from diffrl.sampling.kernels import Kernel, StepOutput
from tests.integration.test_flow_grpo import grpo

KERNEL = "tests.integration.test_user_kernel:EulerMaruyama"


class EulerMaruyama(Kernel):
    stochastic = True
    calls = {"sample": 0, "score": 0}

    def step(
        self,
        x_t,
        velocity,
        sigma,
        sigma_next,
        *,
        noise_level=0.0,
        sigma_max=1.0,
        noise=None,
        prev_sample=None,
        **_,
    ) -> StepOutput:
        EulerMaruyama.calls["sample" if prev_sample is None else "score"] += 1
        x, v = x_t.float(), velocity.float()
        dt = (sigma_next - sigma).float().view(-1, *[1] * (x.ndim - 1))
        mean = x + dt * v
        scale = noise_level * torch.sqrt(-dt)
        if prev_sample is None:
            prev_sample = mean + scale * noise.float()
        log_prob = (
            -((prev_sample.detach().float() - mean) ** 2) / (2 * scale**2)
            - torch.log(scale)
            - math.log(math.sqrt(2 * math.pi))
        )
        return StepOutput(prev_sample, log_prob.mean(dim=tuple(range(1, x.ndim))), mean, scale.flatten())


class NotStochastic(Kernel):
    def step(self, x_t, velocity, sigma, sigma_next, **_) -> StepOutput:
        return StepOutput(x_t + (sigma_next - sigma).view(-1, *[1] * (x_t.ndim - 1)) * velocity)


def test_a_users_kernel_trains_a_flow_grpo_iteration_with_the_exact_replay(tmp_path):
    params = f"{{sampler: '{KERNEL}', noise_level: 0.7, step_strategy: {{name: sde_window, size: 2, range: [0, 2]}}}}"
    EulerMaruyama.calls.update(sample=0, score=0)
    result = train(grpo(tmp_path, **{"algorithm.params": params}))
    assert EulerMaruyama.calls["sample"] > 0 and EulerMaruyama.calls["score"] > 0  # rollout and replay
    m = result.history[0]
    assert m["train/log_prob_mean_abs_diff"] == 0.0
    assert math.isfinite(m["train/loss"]) and m["train/skipped_nonfinite"] == 0.0


def test_flow_grpo_refuses_a_deterministic_kernel_of_the_users_own(tmp_path):
    params = "{sampler: 'tests.integration.test_user_kernel:NotStochastic'}"
    with pytest.raises(ConfigError, match="is deterministic"):
        grpo(tmp_path, **{"algorithm.params": params})


def test_an_unknown_kernel_lists_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"unknown sampler kernel 'sdee'\. Did you mean 'sde'\?"):
        grpo(tmp_path, **{"algorithm.params": "{sampler: sdee}"})
