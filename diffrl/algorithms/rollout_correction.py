"""Rollout correction: importance weights between the policy that drew a rollout and the policy the
trainer updates from.

Two policies can differ even with the same weights: a serving engine draws the rollout with its own
kernels and precision (the *behaviour* policy μ, whose log-probs the engine records), while the
trainer replays the same transitions with its own (the *proximal* policy π_old, the trainer's weights
at the start of the update). Older weights (an off-policy rollout) make them differ too. The
decoupled objective (Hilton et al. 2022, "Batch size-invariance for policy optimization",
arXiv 2110.00641) keeps PPO's clipped ratio π_θ/π_old and weights each transition's term by
ρ = π_old/μ, truncated or masked so that a few transitions cannot dominate (Yao et al. 2025, "Your
Efficient RL Framework Secretly Brings You Off-Policy RL Training": truncated IS, TIS). The modes and
the default threshold are verl's (``verl/trainer/ppo/rollout_corr_helper.py``:
``compute_rollout_correction_weights`` with ``rollout_is="token"``, the weight clamped to at most the
threshold, 2.0; ``compute_rollout_rejection_mask``, a transition rejected outside
[1/threshold, threshold]); a transition of a diffusion trajectory plays the part of a token:

    log ρ = clamp(log π_old − log μ, ±20)            (overflow guard, as verl)
    tis:  w = min(exp(log ρ), C)
    mask: w = 1 if 1/C <= exp(log ρ) <= C else 0     (rejection: the transition drops out)

The weights carry no gradient. With ``none`` the recorded log-probs are π_old (today's loop: the
engine's log-probs go straight into the ratio).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MODES = ("none", "tis", "mask")
LOG_RATIO_BOUND = 20.0
"""|log ρ| beyond this is clamped before exp (verl's safety bound)."""


@dataclass
class Correction:
    """``weight (B,)``: each transition's weight on its clipped term; ``metrics``: scalars
    (``train/rollout_is_*``, ``train/rollout_kl``)."""

    weight: torch.Tensor
    metrics: dict[str, float]


def correction_problems(mode: str, cap: float, where: str) -> list[str]:
    """Config problems of ``mode`` / ``cap`` (``where``: their keys' common prefix)."""
    errors = []
    if mode not in MODES:
        errors.append(f"{where}rollout_correction must be one of {', '.join(MODES)}, got {mode!r}")
    if not cap > 1.0 or cap == float("inf"):
        errors.append(f"{where}rollout_correction_cap must be a finite number > 1, got {cap!r}")
    return errors


def correction_weights(proximal: torch.Tensor, behaviour: torch.Tensor, mode: str, cap: float) -> Correction:
    """``proximal, behaviour: (B,)`` log-probs of the same transitions under π_old and μ -> weights
    and their metrics: ``rollout_is_weight_mean`` (after truncation or masking), ``rollout_is_raw_mean``
    (ρ before), ``rollout_is_corrected_frac`` (truncated or masked), ``rollout_log_prob_abs_diff``
    (mean |log π_old − log μ|, the engine's alignment) and ``rollout_kl`` (the k3 estimate of
    KL(μ‖π_old), mean of ρ − 1 − log ρ, >= 0)."""
    log_rho = (proximal.detach().double() - behaviour.detach().double()).clamp(
        -LOG_RATIO_BOUND, LOG_RATIO_BOUND
    )
    rho = log_rho.exp()
    if mode == "tis":
        weight = rho.clamp(max=cap)
        corrected = rho > cap
    elif mode == "mask":
        keep = (rho >= 1.0 / cap) & (rho <= cap)
        weight = keep.double()
        corrected = ~keep
    else:
        raise ValueError(f"rollout correction mode {mode!r} has no weights (one of tis, mask)")
    return Correction(
        weight=weight.to(proximal.dtype),
        metrics={
            "train/rollout_is_weight_mean": weight.mean().item(),
            "train/rollout_is_raw_mean": rho.mean().item(),
            "train/rollout_is_corrected_frac": corrected.double().mean().item(),
            "train/rollout_log_prob_abs_diff": log_rho.abs().mean().item(),
            "train/rollout_kl": (rho - 1.0 - log_rho).mean().item(),
        },
    )
