import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffrl.algorithms.flow_grpo import ppo_clip_loss


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
