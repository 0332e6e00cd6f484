import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffrl.algorithms.flow_grpo import ppo_clip_loss, ratio_norm_log_ratio
from diffrl.config import ConfigError
from diffrl.preflight import load_config
from diffrl.sampling.kernels import sde_step


def test_matches_reference(reference_dir):
    path = reference_dir / "grpo_loss.safetensors"
    ref = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = f.metadata()
    out = ppo_clip_loss(
        ref["log_prob"],
        ref["old_log_prob"],
        ref["advantages"],
        float(meta["clip_range"]),
        float(meta["adv_clip_max"]),
    )
    torch.testing.assert_close(out.policy_loss, ref["policy_loss"][0])
    torch.testing.assert_close(out.approx_kl, ref["approx_kl"][0])
    torch.testing.assert_close(out.clipfrac, ref["clipfrac"][0])


def test_on_policy_ratio_is_one_and_gradient_is_minus_mean_advantage_times_grad_log_prob():
    lp = torch.randn(8, requires_grad=True)
    adv = torch.randn(8)
    out = ppo_clip_loss(lp, lp.detach(), adv, clip_range=1e-4, adv_clip_max=5.0)
    assert torch.equal(out.ratio, torch.ones(8)) and out.clipfrac == 0 and out.approx_kl == 0
    out.policy_loss.backward()
    torch.testing.assert_close(lp.grad, -adv / 8)


def test_without_the_guard_options_the_loss_is_flow_grpo_s_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    lp, old, adv = (torch.randn(16, generator=g) * 1e-3 for _ in range(3))
    adv = adv * 3e3
    out = ppo_clip_loss(lp, old, adv, clip_range=2e-4, adv_clip_max=5.0)
    # the loss as it was before GRPO-Guard's options, op for op
    a = adv.clamp(-5.0, 5.0)
    ratio = torch.exp(lp - old)
    before = torch.maximum(-a * ratio, -a * ratio.clamp(1.0 - 2e-4, 1.0 + 2e-4)).mean()
    assert torch.equal(out.policy_loss, before) and torch.equal(out.ratio, ratio)
    assert 0 < out.clipfrac < 1  # the clip is exercised


# three steps of a 10-step schedule: the first (σ = 1 uses σ_max), a middle one, the last (to σ = 0)
STEPS = [(1.0, 0.9), (0.5, 0.4), (0.1, 0.0)]


def _replay(n_rows: int, sigma: float, sigma_next: float, seed: int):
    """A rollout step and its replay by a policy whose velocity differs by a fixed δ:
    -> (log_prob, old_log_prob, mean, old_mean, scale, noise), ``(n,)`` or ``(n, 2, 4, 4)``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n_rows, 2, 4, 4, generator=g)
    v_old = torch.randn(n_rows, 2, 4, 4, generator=g)
    delta = torch.randn(1, 2, 4, 4, generator=g).expand(n_rows, -1, -1, -1)  # the same Δμ for each row
    noise = torch.randn(n_rows, 2, 4, 4, generator=g)
    s, s_next = torch.full((n_rows,), sigma), torch.full((n_rows,), sigma_next)
    old = sde_step(x, v_old, s, s_next, noise_level=0.7, sigma_max=0.9, noise=noise)
    new = sde_step(
        x, v_old + 0.5 * delta, s, s_next, noise_level=0.7, sigma_max=0.9, prev_sample=old.prev_sample
    )
    scale = new.std * torch.sqrt(s - s_next)
    return new.log_prob, old.log_prob, new.mean, old.mean, scale, noise


def test_ratio_norm_centres_the_log_ratio_and_makes_its_spread_the_same_at_every_step():
    """GRPO-Guard's RatioNorm: per step, the raw log-ratio has mean −‖Δμ‖²/(2s²) and a spread ∝ 1/s;
    the normalised one is mean(Δμ·ε): mean 0 and std rms(Δμ)/sqrt(D) whatever the step's s."""
    n, d = 4000, 32
    for k, (sigma, sigma_next) in enumerate(STEPS):
        lp, old, mean, old_mean, scale, noise = _replay(n, sigma, sigma_next, seed=k)
        log_r, bias = ratio_norm_log_ratio(lp, old, mean, old_mean, scale)
        dmu = mean - old_mean
        torch.testing.assert_close(log_r, (dmu * noise).flatten(1).mean(1), rtol=1e-3, atol=1e-6)
        spread = dmu.pow(2).flatten(1).mean(1)[0].sqrt() / d**0.5  # std of mean(Δμ·ε) over ε
        assert abs(log_r.mean().item()) < 4 * spread / n**0.5  # zero mean
        assert abs(log_r.std().item() / spread - 1) < 0.05  # unit scale in units of the drift
        raw = lp - old  # what RatioNorm corrects: a negative shift of exactly the bias, spread / s
        assert (raw.mean() + bias.mean()).abs() < 4 * spread / scale[0] / n**0.5
        assert abs(raw.std().item() * scale[0].item() / spread - 1) < 0.05


def test_ratio_norm_is_per_row_so_a_micro_batch_may_mix_steps():
    parts = [_replay(6, sigma, sigma_next, seed=k) for k, (sigma, sigma_next) in enumerate(STEPS)]
    alone = torch.cat([ratio_norm_log_ratio(*p[:5])[0] for p in parts])
    mixed = [torch.cat([p[i] for p in parts]) for i in range(5)]
    perm = torch.randperm(18, generator=torch.Generator().manual_seed(0))
    together = ratio_norm_log_ratio(*(t[perm] for t in mixed))[0]
    assert torch.equal(together, alone[perm])


def test_grad_reweight_weights_each_row_before_the_mean():
    lp = torch.randn(6, requires_grad=True)
    adv, w = torch.randn(6), torch.tensor([10.0, 10.0, 2.0, 2.0, 1.0, 1.0])
    out = ppo_clip_loss(lp, lp.detach(), adv, 1e-4, 5.0, log_ratio=lp - lp.detach(), weight=w)
    out.policy_loss.backward()
    torch.testing.assert_close(lp.grad, -adv * w / 6)


@pytest.mark.parametrize("option", ["ratio_norm", "grad_reweight"])
def test_guard_options_need_the_sde_sampler(option):
    with pytest.raises(ConfigError, match="GRPO-Guard.*need algorithm.params.sampler=sde, got 'cps'"):
        load_config(
            {
                "algorithm": {"name": "flow_grpo", "params": {"sampler": "cps", option: True}},
                "rewards": [{"name": "ocr"}],
            }
        )
    load_config("recipes/tiny_grpo_ocr_small.yaml", [f"algorithm.params.{option}=true"])  # sde: fine


def test_group_health_splits_the_clip_fraction_by_side():
    """Issue 38's group health: ratios 1.5, 1.0, 0.5, 1.05 with ε = 0.1 -> one clipped above,
    one below; the ratio's mean/std/max and the clamped advantages' std."""
    log_ratio = torch.log(torch.tensor([1.5, 1.0, 0.5, 1.05], dtype=torch.float64))
    old = torch.zeros(4, dtype=torch.float64)
    adv = torch.tensor([1.0, -1.0, 3.0, -9.0], dtype=torch.float64)  # -9 clamps to -5
    terms = ppo_clip_loss(log_ratio, old, adv, clip_range=0.1, adv_clip_max=5.0)
    m = terms.metrics(torch.zeros(()))
    assert m["train/clip_frac_high"] == 0.25 and m["train/clip_frac_low"] == 0.25
    assert m["train/clipfrac"] == m["train/clip_frac_high"] + m["train/clip_frac_low"]
    r = torch.tensor([1.5, 1.0, 0.5, 1.05], dtype=torch.float64)
    assert m["train/ratio_mean"] == pytest.approx(r.mean().item())
    assert m["train/ratio_std"] == pytest.approx(r.std(unbiased=False).item())
    assert m["train/ratio_max"] == pytest.approx(1.5)
    clamped = torch.tensor([1.0, -1.0, 3.0, -5.0], dtype=torch.float64)
    assert m["train/adv_std"] == pytest.approx(clamped.std(unbiased=False).item())


REWARDS = "rewards=[{name: ocr}, {name: jpeg_incompressibility, weight: 0}]"


@pytest.mark.parametrize(
    "params, message",
    [
        ({"kl_gate": 0.1, "kl_gate_rewards": "[jpeg_incompressibility]"}, "set kl_beta > 0"),
        ({"kl_gate": 0.1, "kl_beta": 0.04}, "kl_gate needs kl_gate_rewards: .*ocr, jpeg_incompressibility"),
        ({"kl_gate": 0.1, "kl_beta": 0.04, "kl_gate_rewards": "[aesthetic]"}, "'aesthetic' not among"),
        ({"kl_gate_rewards": "[ocr]"}, "kl_gate_rewards is set but kl_gate is 0"),
        ({"kl_gate": 1.0, "kl_beta": 0.04, "kl_gate_rewards": "[ocr]"}, "kl_gate"),
    ],
)
def test_kl_gate_refusals(params, message):
    """GARDO's gate needs a KL to gate and auxiliary rewards the run scores."""
    overrides = [REWARDS, *(f"algorithm.params.{k}={v}" for k, v in params.items())]
    with pytest.raises(ConfigError, match=message):
        load_config("recipes/tiny_grpo_ocr_small.yaml", overrides)
    ok = ["kl_gate=0.1", "kl_beta=0.04", "kl_gate_rewards=[jpeg_incompressibility]"]
    load_config("recipes/tiny_grpo_ocr_small.yaml", [REWARDS, *(f"algorithm.params.{o}" for o in ok)])
