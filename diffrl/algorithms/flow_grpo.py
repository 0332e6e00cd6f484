"""Flow-GRPO: reverse-process policy gradient on SDE transitions (Liu et al. 2025, arXiv 2505.05470).

The objective is PPO's clipped surrogate (Schulman et al. 2017, Eq. 7) on the ratio of the
transition log-probs, with group-relative advantages, as flow_grpo ``scripts/train_sd3.py``:

    A = clamp(A, ±adv_clip_max);  ratio = exp(logπ − logπ_old)
    policy_loss = mean(max(−A·ratio, −A·clamp(ratio, 1 − ε, 1 + ε)))
    kl_loss = mean(‖μ_θ − μ_ref‖² / (2·std²))   (per-sample mean over elements)
    approx_kl = ½·mean((logπ − logπ_old)²);  clipfrac = mean(|ratio − 1| > ε)

GRPO-Guard (Wang et al. 2025, "GRPO-Guard: Mitigating Implicit Over-Optimization in Flow Matching
via Regulated Clipping", arXiv 2510.22319), two options, off by default:

- ``ratio_norm`` (RatioNorm): the SDE's log-ratio has a negative mean, −‖μ_θ − μ_old‖²/(2s²), and
  a spread ∝ 1/s, both depending on the step (s = std·sqrt(−Δt) the transition's std), so one clip
  range is lopsided and too tight or too loose depending on the step. RatioNorm adds the mean back and
  rescales by s, as X-GenGroup/Flow-Factory ``src/flow_factory/trainers/grpo.py::GRPOGuardTrainer``:

      bias = mean((μ_θ − μ_old)²) / (2·s²);   log r̂ = (logπ − logπ_old + bias)·s = mean((μ_θ − μ_old)·ε)

  with ε = (x_{t+Δ} − μ_old)/s the rollout's noise: zero mean and a spread, rms(μ_θ − μ_old)/sqrt(D)
  over D elements, that no longer depends on the step's s. μ_old is the rollout's mean, recorded by the collector; the bias
  keeps its gradient (only μ_old is fixed), as the reference. s is analytic in (σ, σ') (the
  reference's ``sqrt(−dt)·std_dev_t`` of the step), so it does not depend on the batch layout.
- ``grad_reweight``: each transition's clipped term is divided by its step's −Δt = σ − σ'. After
  RatioNorm the gradient of log r̂ = mean(ε·∂μ_θ/∂θ) scales with Δt (μ_θ moves by v_θ·Δt), so the
  steps with a small Δt would barely train; 1/Δt evens them out (the paper's gradient
  reweighting for Flow-GRPO's SDE; Flow-GRPO-style GRPO-Guard scripts, ``compute_guard_grpo_loss``,
  divide the policy loss by ``sqrt_dt.mean()**2``; Flow-Factory's trainer has RatioNorm only). Those
  scripts' micro-batches hold one step; a diffrl micro-batch may mix steps, so the weight is per row
  (the same thing when the rows share a step).

Both are derived for the ``sde`` kernel (Flow-Factory's ``grpo-guard`` likewise requires Flow-SDE).
With them on, ``ratio`` and ``clipfrac`` are of r̂; ``approx_kl`` stays on the raw log-ratio.

Rollout correction (``rollout_correction: tis | mask``, none by default; see
:mod:`diffrl.algorithms.rollout_correction`): when the rollout was drawn by another policy than the
trainer's (a serving engine's kernels and precision), the update first replays every recorded
transition with the weights it starts from (π_old), clips π_θ/π_old instead of π_θ/μ, and weights
each transition's term by the truncated (or masked) ρ = π_old/μ, μ the log-prob the engine recorded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch

from diffrl.algorithms.advantages import (
    aggregation_problems,
    batch_advantages,
    diversity_weights,
    gardo_gate,
    pixel_features,
)
from diffrl.algorithms.base import AdvClip, ClipRange, DiffusionAlgorithm, KlBeta
from diffrl.algorithms.rollout_correction import correction_problems, correction_weights
from diffrl.config import Config, Range
from diffrl.config.binding import value_problems
from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals
from diffrl.rewards.base import reward_labels
from diffrl.sampling.kernels import FlowSDE, kernel_problems, resolve_kernel
from diffrl.sampling.step_strategies import build_step_strategy


@dataclass
class PPOTerms:
    """Scalars of the clipped objective for one micro-batch; ``ratio, advantages: (B,)`` (the
    advantages clamped to ±adv_clip_max)."""

    policy_loss: torch.Tensor
    approx_kl: torch.Tensor
    clipfrac: torch.Tensor
    ratio: torch.Tensor
    clip_range: float = 0.0
    advantages: torch.Tensor | None = None

    def metrics(self, kl_loss: torch.Tensor) -> dict[str, float]:
        """The loss terms and the group health (issue 38): the share of transitions clipped on
        each side (ratio > 1 + ε, < 1 − ε), the ratio's mean, std and max, the advantages' std.
        Like every metric of a micro-batch, the driver averages them over the micro-batches
        (so ``ratio_max`` is the mean of the micro-batches' maxima)."""
        r = self.ratio.double()
        adv = self.advantages.double() if self.advantages is not None else torch.zeros(1)
        return {
            "train/policy_loss": self.policy_loss.item(),
            "train/kl_loss": kl_loss.item(),
            "train/approx_kl": self.approx_kl.item(),
            "train/clipfrac": self.clipfrac.item(),
            "train/ratio_abs_minus_1": (r - 1).abs().mean().item(),
            "train/clip_frac_high": (r > 1.0 + self.clip_range).double().mean().item(),
            "train/clip_frac_low": (r < 1.0 - self.clip_range).double().mean().item(),
            "train/ratio_mean": r.mean().item(),
            "train/ratio_std": r.std(unbiased=False).item(),
            "train/ratio_max": r.max().item(),
            "train/adv_std": adv.std(unbiased=False).item(),
        }


def ppo_clip_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_range: float,
    adv_clip_max: float,
    log_ratio: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> PPOTerms:
    """``log_prob, old_log_prob, advantages: (B,)`` -> the clipped surrogate and its diagnostics.

    ``log_ratio (B,)``: the log-ratio to clip instead of ``log_prob − old_log_prob`` (GRPO-Guard's
    :func:`ratio_norm_log_ratio`); ``weight (B,)``: per-row weights of the clipped terms before the
    mean (GRPO-Guard's ``grad_reweight``). Without them this is Flow-GRPO's loss, op for op.
    """
    adv = advantages.clamp(-adv_clip_max, adv_clip_max)
    ratio = torch.exp(log_prob - old_log_prob if log_ratio is None else log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_range, 1.0 + clip_range)
    per_row = torch.maximum(unclipped, clipped)
    return PPOTerms(
        policy_loss=(per_row if weight is None else per_row * weight).mean(),
        approx_kl=0.5 * ((log_prob - old_log_prob) ** 2).mean().detach(),
        clipfrac=((ratio - 1.0).abs() > clip_range).float().mean().detach(),
        ratio=ratio.detach(),
        clip_range=clip_range,
        advantages=adv.detach(),
    )


def ratio_norm_log_ratio(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    mean: torch.Tensor,
    old_mean: torch.Tensor,
    scale: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO-Guard's RatioNorm (arXiv 2510.22319; Flow-Factory ``GRPOGuardTrainer.optimize``):
    ``log_prob, old_log_prob, scale: (B,)``, ``mean, old_mean: (B, *latent)`` -> ``(log r̂, bias)``,
    both ``(B,)``, with ``bias = mean((mean − old_mean)²) / (2·scale²)`` and
    ``log r̂ = (log_prob − old_log_prob + bias)·scale``. ``scale``: the transition's std, std·sqrt(−Δt)."""
    bias = (mean.float() - old_mean.float()).pow(2).flatten(1).mean(1) / (2 * scale.pow(2))
    return (log_prob - old_log_prob + bias) * scale, bias


def mean_kl(mean: torch.Tensor, ref_mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """KL between the Gaussian transitions of the policy and the reference (same std):
    ``mean, ref_mean: (B, *latent)``, ``std: (B,)`` -> scalar."""
    per_sample = (mean - ref_mean).pow(2).flatten(1).mean(1) / (2 * std.pow(2))
    return per_sample.mean()


@dataclass
class GRPOExamples(TrainExamples):
    """One recorded transition per row (N = kept samples x stochastic steps).

    ``x_t, x_next: (N, *latent)``; ``sigma, sigma_next, old_log_prob, advantages: (N,)``;
    ``sample_id, step: (N,)`` the rollout row and the step index each transition came from;
    ``old_mean: (N, *latent)`` the rollout's transition mean (GRPO-Guard's RatioNorm only, else None).
    ``kl_gate (N,)`` bool: GARDO's gate, the rows the KL applies to (``kl_gate > 0`` only, else None).
    ``behaviour_log_prob (N,)``: with rollout correction, the log-probs the rollout recorded (μ),
    while ``old_log_prob`` (and ``old_mean``) become the trainer's replay at the update's start
    (filled in by ``before_update``); else None.
    """

    sample_id: torch.Tensor
    step: torch.Tensor
    x_t: torch.Tensor
    x_next: torch.Tensor
    sigma: torch.Tensor
    sigma_next: torch.Tensor
    old_log_prob: torch.Tensor
    advantages: torch.Tensor
    cond: Conditioning
    old_mean: torch.Tensor | None = None
    behaviour_log_prob: torch.Tensor | None = None
    kl_gate: torch.Tensor | None = None


class FlowGRPO(DiffusionAlgorithm):
    name = "flow_grpo"
    requires = frozenset({"traj_x", "traj_next", "traj_step", "traj_log_prob"})

    @dataclass
    class Params:
        sampler: str = "sde"
        """Kernel of the stochastic steps: ``sde`` (Flow-GRPO), ``cps`` (coefficients-preserving) or a
        dotted path to a stochastic :class:`~diffrl.sampling.kernels.Kernel` of your own."""
        noise_level: Annotated[
            float, Range(0, 5, lo_open=True, hint="η; Flow-GRPO trains on stochastic steps, e.g. 0.7")
        ] = 0.7
        step_strategy: dict[str, Any] = field(default_factory=lambda: {"name": "all"})
        """``{name: all | sde_window | epoch_global_random_choice | mix_grpo | dotted.path, **params}``."""
        clip_range: ClipRange = 1e-4
        adv_clip_max: AdvClip = 5.0
        kl_beta: KlBeta = 0.0
        """Weight of the KL to the reference policy (the base model: LoRA disabled)."""
        global_std: bool = False
        """Divide advantages by the std of the whole batch instead of the prompt group."""
        scale_by_std: bool = True
        """False: Dr.GRPO (no division by the std)."""
        advantage_aggregation: Literal["sum", "per_reward"] = "sum"
        """Several rewards: ``sum`` normalises their weighted sum; ``per_reward`` normalises each
        within its group before the weighted sum (GDPO; see :mod:`diffrl.algorithms.advantages`)."""
        drop_zero_std_groups: bool = False
        """Drop groups whose samples all scored the same (their advantages are all 0)."""
        allow_single_sample: bool = False
        """Allow ``rollout.n_samples_per_prompt = 1`` (every advantage is then 0 unless global_std)."""
        ratio_norm: bool = False
        """GRPO-Guard's RatioNorm: clip the log-ratio with its per-step mean shift added back and
        scaled by the transition std (see the module docstring; ``sampler: sde`` only). The rollout
        then also keeps each recorded step's mean (one more latent per step)."""
        grad_reweight: bool = False
        """GRPO-Guard's gradient reweighting: divide each transition's clipped term by its step's
        σ − σ' (see the module docstring; ``sampler: sde`` only)."""
        kl_gate: Annotated[float, Range(0, 1, hi_open=True, hint="a share of the batch, e.g. 0.1")] = 0.0
        """GARDO's gated KL: > 0 applies ``kl_beta`` only to this share of the samples the trained
        reward and the ``kl_gate_rewards`` disagree on most (see
        :func:`diffrl.algorithms.advantages.gardo_gate`); 0: the KL applies to every sample."""
        kl_gate_rewards: list[str] = field(default_factory=list)
        """The auxiliary rewards of ``kl_gate``: labels of the run's ``rewards`` (give them
        ``weight: 0`` to score them without training on them)."""
        diversity_bonus: bool = False
        """GARDO's diversity-aware advantages: a sample at or above its group's mean reward has its
        advantage multiplied by its distance to the nearest other sample of the group over the
        group's mean such distance (see :mod:`diffrl.algorithms.advantages`), against mode collapse."""
        rollout_correction: Literal["none", "tis", "mask"] = "none"
        """``none`` (the recorded log-probs are π_old), ``tis`` (truncated importance weights
        min(π_old/μ, cap)) or ``mask`` (transitions with π_old/μ outside [1/cap, cap] drop out),
        π_old the trainer's replay at the update's start and μ the rollout's recorded log-prob: for
        an engine whose kernels or precision differ from the trainer's (``rollout.engine``). Costs
        one no-grad forward per transition per iteration. See the module docstring."""
        rollout_correction_cap: Annotated[
            float,
            Range(1, 1e4, lo_open=True, hint="C: weights truncated at C, or kept in [1/C, C]; e.g. 2.0"),
        ] = 2.0
        """``C`` of ``rollout_correction`` (verl's default threshold)."""

    def __init__(self, params, config):
        super().__init__(params, config)
        if params.ratio_norm:
            self.requires = type(self).requires | {"traj_mean"}
        self.step_strategy, self._strategy_errors = build_step_strategy(
            params.step_strategy, config.sampling.num_steps, "algorithm.params.step_strategy"
        )

    @property
    def needs_reference(self) -> bool:
        return self.params.kl_beta > 0

    def validate(self, config) -> list[str]:
        p = self.params
        errors = value_problems(p, "algorithm.params") + list(self._strategy_errors)
        sampler_problems = kernel_problems("algorithm.params.sampler", p.sampler, stochastic=True)
        errors += sampler_problems
        errors += aggregation_problems(p.advantage_aggregation, p.scale_by_std)
        if config.rollout.n_samples_per_prompt < 2 and not p.allow_single_sample:
            errors.append(
                "rollout.n_samples_per_prompt must be >= 2 for group-relative advantages "
                "(set algorithm.params.allow_single_sample=true to override)"
            )
        errors += self._gate_problems(config)
        errors += correction_problems(p.rollout_correction, p.rollout_correction_cap, "algorithm.params.")
        guard = p.ratio_norm or p.grad_reweight
        if guard and not sampler_problems and not isinstance(resolve_kernel(p.sampler), FlowSDE):
            errors.append(
                f"algorithm.params.ratio_norm / grad_reweight (GRPO-Guard) are derived for Flow-GRPO's "
                f"SDE and need algorithm.params.sampler=sde, got {p.sampler!r}; set sampler=sde or turn "
                "them off"
            )
        return errors

    def _gate_problems(self, config) -> list[str]:
        p = self.params
        if p.kl_gate == 0:
            if p.kl_gate_rewards:
                return ["algorithm.params.kl_gate_rewards is set but kl_gate is 0; set kl_gate (e.g. 0.1)"]
            return []
        labels = reward_labels(config.rewards)
        errors = []
        if p.kl_beta <= 0:
            errors.append("algorithm.params.kl_gate gates the KL penalty: set kl_beta > 0 (e.g. 0.04)")
        if not p.kl_gate_rewards:
            errors.append(
                "algorithm.params.kl_gate needs kl_gate_rewards: the labels of the auxiliary rewards "
                f"among the run's rewards ({', '.join(labels)}); add one with weight: 0 to watch it"
            )
        unknown = [r for r in p.kl_gate_rewards if r not in labels]
        if unknown:
            errors.append(
                f"algorithm.params.kl_gate_rewards: {', '.join(repr(r)[:80] for r in unknown[:5])} "
                f"not among the run's rewards ({', '.join(labels)})"
            )
        return errors

    def collection_spec(self) -> CollectionSpec:
        return CollectionSpec(
            online=True,
            needs_reward=True,
            sampler=self.params.sampler,
            noise_level=self.params.noise_level,
            step_strategy=self.step_strategy,
            keep_trajectory=True,
            keep_log_prob=True,
            keep_mean=self.params.ratio_norm,
        )

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        p = self.params
        adv = batch_advantages(
            batch, rewards, self.config.rewards, p.advantage_aggregation, p.global_std, p.scale_by_std
        )
        advantages = adv.advantages
        if p.diversity_bonus:
            if batch.images is None:
                raise ValueError("diversity_bonus needs the rollout's decoded images; the rollout has none")
            features = pixel_features(batch.images)
            advantages = advantages * diversity_weights(features, rewards, batch.group_id)
        keep = ~adv.zero_std if p.drop_zero_std_groups else torch.ones_like(adv.zero_std)
        values = {"advantages": advantages.float(), "keep": keep, "zero_std": adv.zero_std}
        if p.kl_gate > 0:
            if batch.reward_scores is None:
                raise ValueError("kl_gate needs each reward's scores; the batch has none (reward_scores)")
            aux = [batch.reward_scores.scores[label] for label in p.kl_gate_rewards]
            values["kl_gate"] = gardo_gate(rewards, aux, p.kl_gate)
        return TrainSignals(values)

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> GRPOExamples:
        if batch.traj_x is None or batch.traj_log_prob is None:
            raise ValueError("Flow-GRPO needs the recorded trajectory and log-probs; the rollout has none")
        if self.params.ratio_norm and batch.traj_mean is None:
            raise ValueError(
                "ratio_norm needs the rollout's transition means (traj_mean); the rollout has none"
            )
        rows = torch.nonzero(signals.values["keep"]).flatten()
        # order (micro-group, step, sample): a training micro-batch then holds the very samples
        # one rollout forward held, so the first replay reproduces the recorded log-probs exactly
        order = sorted(
            ((batch.micro_group[r].item(), k, r.item()) for r in rows for k in range(batch.traj_x.shape[1])),
        )
        r_idx = torch.tensor([r for _, _, r in order], dtype=torch.long)
        k_idx = torch.tensor([k for _, k, _ in order], dtype=torch.long)
        return GRPOExamples(
            sample_id=r_idx,
            step=batch.traj_step[r_idx, k_idx],
            x_t=batch.traj_x[r_idx, k_idx],
            x_next=batch.traj_next[r_idx, k_idx],
            sigma=batch.traj_sigma[r_idx, k_idx],
            sigma_next=batch.traj_sigma_next[r_idx, k_idx],
            old_log_prob=batch.traj_log_prob[r_idx, k_idx],
            advantages=signals.values["advantages"][r_idx],
            cond=batch.cond.select(r_idx),
            old_mean=batch.traj_mean[r_idx, k_idx] if self.params.ratio_norm else None,
            kl_gate=signals.values["kl_gate"][r_idx] if "kl_gate" in signals.values else None,
        )

    def _replay(self, policy, examples: GRPOExamples, reference: bool = False):
        """The recorded transitions scored by the trainable policy (or the base model, no
        gradient): the kernel's step output (``log_prob (N,)``, ``mean (N, *latent)``, ``std (N,)``)."""
        kernel = resolve_kernel(self.params.sampler)  # the rollout's kernel: scores the recorded step
        forward = policy.reference_velocity if reference else policy.velocity
        v = forward(
            examples.x_t,
            examples.sigma,
            examples.cond,
            guidance_scale=self.config.sampling.guidance_scale,
            negative=policy.negative(examples.cond),
        )
        return kernel.step(
            examples.x_t,
            v,
            examples.sigma,
            examples.sigma_next,
            noise_level=self.params.noise_level,
            sigma_max=policy.sigmas[1].item(),
            prev_sample=examples.x_next,
        )

    def drift(self, policy, examples: GRPOExamples) -> dict[str, float]:
        """``monitor/kl_to_base`` of a run without ``kl_beta``: the KL of the Gaussian
        transitions of the policy and the base on the recorded steps (:func:`mean_kl`, every row:
        GARDO's gate applies to the penalty, not to the drift), as a ``kl_beta`` run's loss
        computes it (flow_grpo ``scripts/train_sd3.py``, its ``kl_loss``)."""
        out = self._replay(policy, examples)
        ref = self._replay(policy, examples, reference=True)
        return {"monitor/kl_to_base": mean_kl(out.mean, ref.mean, out.std).item()}

    def off_policy_problems(self, config: Config) -> list[str]:
        """The clipped ratio is against the recorded log-probs (μ): one update old with
        ``train.off_policy_steps: 1``, so the update replays them with its starting weights (π_old)
        and weights each term by the truncated ρ = π_old/μ (rollout correction) instead."""
        if self.params.rollout_correction == "none":
            return [
                "train.off_policy_steps=1 draws each rollout with the weights of one update earlier; "
                "Flow-GRPO's ratio then needs rollout correction: set "
                "algorithm.params.rollout_correction: tis (or mask)"
            ]
        return []

    def before_update(self, policy, examples: GRPOExamples) -> GRPOExamples:
        if self.params.rollout_correction == "none":
            return examples
        # π_old: the same micro-batches as the update that follows, so its first ratio is exactly 1
        outs = [self._replay(policy, mb) for mb in policy.micro_batches(examples)]
        examples.behaviour_log_prob = examples.old_log_prob
        examples.old_log_prob = torch.cat([o.log_prob for o in outs])
        if self.params.ratio_norm:
            examples.old_mean = torch.cat([o.mean for o in outs])
        return examples

    def compute_loss(self, policy, examples: GRPOExamples) -> tuple[torch.Tensor, dict[str, float]]:
        p = self.params
        out = self._replay(policy, examples)
        guard: dict[str, float] = {}
        log_ratio = weight = None
        if p.ratio_norm or p.grad_reweight:
            minus_dt = (examples.sigma - examples.sigma_next).float()  # the step's −Δt = σ − σ'
            if p.ratio_norm:
                scale = out.std * torch.sqrt(minus_dt)  # the sde kernel's transition std, per row
                log_ratio, bias = ratio_norm_log_ratio(
                    out.log_prob, examples.old_log_prob, out.mean, examples.old_mean, scale
                )
                guard["train/ratio_mean_bias"] = bias.detach().mean().item()
            if p.grad_reweight:
                weight = 1.0 / minus_dt
        recorded = examples.old_log_prob  # the rollout's log-probs (μ)
        if p.rollout_correction != "none":
            if examples.behaviour_log_prob is None:
                raise RuntimeError("Flow-GRPO: rollout correction needs before_update's replay first")
            recorded = examples.behaviour_log_prob
            correction = correction_weights(
                examples.old_log_prob, recorded, p.rollout_correction, p.rollout_correction_cap
            )
            weight = correction.weight if weight is None else weight * correction.weight
            guard.update(correction.metrics)
        terms = ppo_clip_loss(
            out.log_prob,
            examples.old_log_prob,
            examples.advantages,
            p.clip_range,
            p.adv_clip_max,
            log_ratio=log_ratio,
            weight=weight,
        )
        loss = terms.policy_loss
        kl = torch.zeros(())
        if p.kl_beta > 0:
            with torch.no_grad():
                ref = self._replay(policy, examples, reference=True)
            if examples.kl_gate is None:
                kl = mean_kl(out.mean, ref.mean, out.std)
                drift = kl.detach()
            else:  # GARDO: the mean KL of the gated rows (none gated: no KL term), as its script
                gate = examples.kl_gate
                kl = mean_kl(out.mean[gate], ref.mean[gate], out.std[gate]) if gate.any() else kl
                guard["train/kl_gated_frac"] = gate.float().mean().item()
                with torch.no_grad():  # the monitor is every row's drift, as drift() measures it
                    drift = mean_kl(out.mean, ref.mean, out.std)
            loss = loss + p.kl_beta * kl
            guard["monitor/kl_to_base"] = (
                drift.item()
            )  # the policy's drift, for free here (drift() for other runs)
        return loss, {
            **terms.metrics(kl),
            **guard,
            "train/log_prob_mean_abs_diff": (out.log_prob.detach() - recorded).abs().mean().item(),
        }
