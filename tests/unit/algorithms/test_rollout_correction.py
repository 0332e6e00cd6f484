import pytest
import torch

from diffrl.algorithms.rollout_correction import correction_problems, correction_weights


def test_tis_truncates_at_the_cap_and_mask_rejects_outside_the_band():
    behaviour = torch.zeros(4)
    proximal = torch.tensor([1.0, -0.25, -1.0, 0.0])  # ρ = e, e^-0.25, e^-1, 1
    rho = proximal.double().exp()
    tis = correction_weights(proximal, behaviour, "tis", 2.0)
    torch.testing.assert_close(tis.weight, torch.tensor([2.0, rho[1].item(), rho[2].item(), 1.0]))
    assert tis.metrics["train/rollout_is_corrected_frac"] == 0.25
    mask = correction_weights(proximal, behaviour, "mask", 2.0)  # keeps 1/2 <= ρ <= 2
    assert mask.weight.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert mask.metrics["train/rollout_is_corrected_frac"] == 0.5
    assert mask.metrics["train/rollout_log_prob_abs_diff"] == pytest.approx(0.5625)
    assert mask.metrics["train/rollout_kl"] == pytest.approx((rho - 1 - rho.log()).mean().item())


def test_weights_carry_no_gradient_and_equal_policies_weigh_one():
    lp = torch.randn(8, requires_grad=True)
    c = correction_weights(lp, lp.detach().clone(), "tis", 2.0)
    assert not c.weight.requires_grad and torch.equal(c.weight, torch.ones(8))
    assert c.metrics["train/rollout_kl"] == 0.0 and c.metrics["train/rollout_is_corrected_frac"] == 0.0


def test_huge_log_ratios_stay_finite():
    c = correction_weights(torch.tensor([1e4, -1e4]), torch.zeros(2), "tis", 2.0)
    assert c.weight.tolist() == [2.0, pytest.approx(torch.tensor(-20.0).double().exp().item())]
    assert all(v == v and abs(v) != float("inf") for v in c.metrics.values())


@pytest.mark.parametrize(
    "mode, cap", [("tiss", 2.0), ("tis", 1.0), ("mask", float("inf")), ("tis", float("nan"))]
)
def test_bad_settings_are_named(mode, cap):
    errors = correction_problems(mode, cap, "algorithm.params.")
    assert len(errors) == 1 and errors[0].startswith("algorithm.params.rollout_correction")
