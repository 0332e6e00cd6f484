import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from diffrl.algorithms.diffusion_nft import nft_loss, nft_reward_weight, old_policy_decay


@pytest.mark.parametrize("name", ["nft_beta1", "nft_beta0.1", "nft_video"])
def test_matches_reference_value_and_gradient(reference_dir, name):
    path = reference_dir / f"{name}.safetensors"
    ref = load_file(str(path))
    with safe_open(str(path), "pt") as f:
        meta = {k: float(v) for k, v in f.metadata().items()}
    r = nft_reward_weight(ref["advantages"], meta["adv_clip_max"])
    torch.testing.assert_close(r, ref["r"])
    v_new = ref["v_new"].clone().requires_grad_(True)
    terms = nft_loss(
        ref["x0"],
        ref["xt"],
        ref["t"],
        v_new,
        ref["v_old"],
        r,
        meta["beta"],
        meta["adv_clip_max"],
        ref["v_ref"],
        meta["kl_beta"],
    )
    torch.testing.assert_close(terms.per_sample, ref["per_sample_policy_loss"], check_dtype=False)
    torch.testing.assert_close(terms.policy_loss, ref["policy_loss"][0], check_dtype=False)
    torch.testing.assert_close(terms.kl_loss, ref["kl_loss"][0], check_dtype=False)
    torch.testing.assert_close(terms.loss, ref["loss"][0], check_dtype=False)
    terms.loss.backward()
    torch.testing.assert_close(v_new.grad, ref["grad_v_new"], check_dtype=False)


def test_reward_weight_modes():
    a = torch.tensor([-10.0, -2.5, 0.0, 2.5, 10.0])
    torch.testing.assert_close(nft_reward_weight(a, 5.0), torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0]))
    torch.testing.assert_close(
        nft_reward_weight(a, 5.0, "positive_only"), torch.tensor([0.5, 0.5, 0.5, 0.75, 1.0])
    )
    torch.testing.assert_close(
        nft_reward_weight(a, 5.0, "negative_only"), torch.tensor([0.0, 0.25, 0.5, 0.5, 0.5])
    )
    torch.testing.assert_close(nft_reward_weight(a, 5.0, "binary"), torch.tensor([0.0, 0.0, 0.5, 1.0, 1.0]))


def test_decay_schedules_follow_the_reference():
    assert [old_policy_decay("none", s) for s in (0, 10, 1000)] == [0.0, 0.0, 0.0]
    assert old_policy_decay("ramp", 0) == 0.0
    assert old_policy_decay("ramp", 100) == pytest.approx(0.1)
    assert old_policy_decay("ramp", 5000) == 0.5
    assert old_policy_decay("flat_ramp", 74) == 0.0
    assert old_policy_decay("flat_ramp", 75 + 20) == pytest.approx(0.15)
    assert old_policy_decay("flat_ramp", 10_000) == 0.999


def test_positive_and_negative_branches_pull_in_opposite_directions():
    """r = 1 moves v_new towards the x0-consistent velocity, r = 0 away from it."""
    torch.manual_seed(0)
    x0, eps = torch.randn(4, 3, 4, 4), torch.randn(4, 3, 4, 4)
    t = torch.full((4,), 0.5)
    xt = 0.5 * x0 + 0.5 * eps
    target = eps - x0
    v_old = target + 0.3 * torch.randn_like(target)
    for r, sign in ((torch.ones(4), 1.0), (torch.zeros(4), -1.0)):
        v_new = v_old.clone().requires_grad_(True)
        nft_loss(x0, xt, t, v_new, v_old, r, beta=1.0, adv_clip_max=5.0).loss.backward()
        # a small gradient step changes the distance to the target in the expected direction
        stepped = v_new.detach() - 1e-3 * v_new.grad
        change = (stepped - target).pow(2).sum() - (v_old - target).pow(2).sum()
        assert sign * change < 0
