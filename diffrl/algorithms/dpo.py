"""Diffusion-DPO on flow-matching velocities, with online or offline preference pairs.

Loss: Wallace et al. 2023, "Diffusion Model Alignment Using Direct Preference Optimization"
(arXiv 2311.12908), Eq. 14, in the form of its reference code (SalesforceAIResearch/DiffusionDPO
``train.py``: ``scale_term = -0.5 * args.beta_dpo``, ``inside_term = scale_term * (model_diff -
ref_diff)``, ``loss = -F.logsigmoid(inside_term)``), on flow matching as flow_grpo's
``scripts/train_sd3_dpo.py`` and Flow-Factory's ``src/flow_factory/trainers/dpo.py``. For a pair
(x0ʷ preferred, x0ˡ rejected) of one prompt, one t and one noise ε shared by both:

    xₜʷ = (1 − t)·x0ʷ + t·ε,            xₜˡ = (1 − t)·x0ˡ + t·ε
    eʷ_θ = mean((v_θ(xₜʷ, t) − (ε − x0ʷ))²)   (over all non-batch dims; likewise eˡ_θ, eʷ_ref, eˡ_ref)
    z   = −β/2 · ((eʷ_θ − eʷ_ref) − (eˡ_θ − eˡ_ref))
    L   = −log σ(z)

The paper's factor −β·T·ω(λₜ) is a constant for the uniform weighting its code uses, written
there (and here) as −β/2, so ``beta`` is the reference code's ``beta_dpo`` and flow_grpo's
``train.beta`` (``config/dpo.py``: 100). The reference policy is the base model: LoRA disabled, or
a frozen copy of the starting weights for full fine-tunes.

Pairs (``pairs``):

- ``online`` (flow_grpo's ``train_sd3_dpo.py``, Flow-Factory's ``_form_pairs``): sample
  ``rollout.n_samples_per_prompt`` images per prompt, keep only x0 and the conditioning, and pair
  each prompt group's best sample against its worst by reward; groups whose rewards are all equal
  give no pair (``train/dpo_skipped_groups``).
- ``offline``: ``data.dataset`` is a pair folder (see
  :mod:`diffrl.data.offline`); ``train.batch_size`` pairs per iteration.

Timesteps are logit-normal (or uniform) and shifted like the sampler's schedule, as flow_grpo's
``compute_density_for_timestep_sampling(weighting_scheme="logit_normal")`` on SD3's shifted
timesteps, ``num_timesteps`` per pair (one per stratum), each with its own noise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

import torch
import torch.nn.functional as F

from diffrl.algorithms.awm import stratified_timesteps
from diffrl.algorithms.base import (
    DiffusionAlgorithm,
    LogitMean,
    LogitStd,
    NoiseLevel,
    TimeShift,
    Timesteps,
    x0_only_spec,
)
from diffrl.algorithms.forward_process import noised
from diffrl.algorithms.sft import flow_matching_loss
from diffrl.config import Range
from diffrl.config.binding import value_problems
from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainExamples, TrainSignals
from diffrl.core.seeding import generator
from diffrl.sampling.kernels import kernel_problems


@dataclass
class Pairs:
    """``chosen, rejected (P,)``: batch rows of each pair's preferred and rejected sample, by group
    in ascending ``group_id``; ``skipped``: the groups that gave no pair (all scores equal)."""

    chosen: torch.Tensor
    rejected: torch.Tensor
    skipped: int


def select_pairs(scores: torch.Tensor, group_id: torch.Tensor) -> Pairs:
    """Each group's highest-scoring row against its lowest (the first of tied rows), for
    ``scores, group_id (B,)``; a group whose scores are all equal (or of one row) is skipped."""
    chosen, rejected, skipped = [], [], 0
    for g in group_id.unique().tolist():
        rows = torch.nonzero(group_id == g).flatten()
        s = scores[rows]
        if s.max() == s.min():
            skipped += 1
            continue
        chosen.append(int(rows[s.argmax()]))
        rejected.append(int(rows[s.argmin()]))
    return Pairs(torch.tensor(chosen, dtype=torch.long), torch.tensor(rejected, dtype=torch.long), skipped)


@dataclass
class DPOTerms:
    """``loss``: the scalar mean; ``inside (N,)``: z, the implicit reward margin of each pair."""

    loss: torch.Tensor
    inside: torch.Tensor


def diffusion_dpo_loss(
    model_w: torch.Tensor, model_l: torch.Tensor, ref_w: torch.Tensor, ref_l: torch.Tensor, beta: float
) -> DPOTerms:
    """``−log σ(−β/2 · ((model_w − ref_w) − (model_l − ref_l)))`` averaged over pairs, for the
    per-pair flow-matching errors ``(N,)`` of the policy and the reference (detached)."""
    inside = -0.5 * beta * ((model_w - ref_w.detach()) - (model_l - ref_l.detach()))
    return DPOTerms(-F.logsigmoid(inside).mean(), inside)


@dataclass
class DPOExamples(TrainExamples):
    """One (pair, timestep) per row. ``sample_id (N,)``: the chosen sample's batch row;
    ``x0_w, x0_l, noise (N, *latent)``; ``t (N,)``; ``cond``: the pair's prompt (N rows);
    ``reward_gap (N,)``: the chosen minus the rejected sample's score; ``pairs, skipped (N,)``: the
    iteration's pair count and groups without a pair (the same in every row, for the metrics)."""

    sample_id: torch.Tensor
    x0_w: torch.Tensor
    x0_l: torch.Tensor
    noise: torch.Tensor
    t: torch.Tensor
    cond: Conditioning
    reward_gap: torch.Tensor
    pairs: torch.Tensor
    skipped: torch.Tensor


class DPO(DiffusionAlgorithm):
    name = "dpo"
    needs_reference = True

    @dataclass
    class Params:
        beta: Annotated[
            float,
            Range(0, 1e5, lo_open=True, hint="DPO's KL strength; e.g. 100 (flow_grpo), 5000 (Diffusion-DPO)"),
        ] = 100.0
        """DPO's β (the reference code's ``beta_dpo``; flow_grpo's ``train.beta`` = 100 on SD3.5)."""
        pairs: Literal["online", "offline"] = "online"
        """``online``: each prompt group's best vs worst rollout sample by reward; ``offline``: the
        pair folder in ``data.dataset``."""
        num_timesteps: Timesteps = 1
        """Timesteps per pair (one per stratum of the distribution), each with its own noise."""
        timestep_sampling: Literal["logit_normal", "uniform"] = "logit_normal"
        logit_mean: LogitMean = 0.0
        logit_std: LogitStd = 1.0
        time_shift: TimeShift = 3.0
        """Shift of the timesteps (as the sampler's schedule: SD3's and tiny's 3.0)."""
        sampler: str = "ode"
        """Online: how rollouts are drawn (any sampler; DPO needs only x0)."""
        noise_level: NoiseLevel = 0.7
        """Online, for ``sde`` / ``cps`` collection only."""

    def validate(self, config) -> list[str]:
        p, d = self.params, config.data
        errors = value_problems(p, "algorithm.params")
        if p.pairs == "online":
            errors += kernel_problems("algorithm.params.sampler", p.sampler)
            if config.rollout.n_samples_per_prompt < 2:
                errors.append(
                    "online DPO pairs each prompt's best and worst sample: rollout.n_samples_per_prompt "
                    f"must be >= 2, got {config.rollout.n_samples_per_prompt}"
                )
        elif d.dataset in (None, "synthetic_text", "synthetic_edit"):
            errors.append(
                "algorithm.params.pairs=offline trains on a folder of preference pairs: set data.dataset "
                'to the folder (a metadata.jsonl of {"prompt": ..., "chosen": FILE, "rejected": FILE} '
                f"rows), got data.dataset={d.dataset!r}"
            )
        return errors

    def collection_spec(self) -> CollectionSpec:
        if self.params.pairs == "offline":
            return CollectionSpec(online=False, needs_reward=False, offline_items="pairs")
        return x0_only_spec(self.params.sampler, self.params.noise_level)

    def postprocess_rewards(self, batch: RolloutBatch, rewards: torch.Tensor | None) -> TrainSignals:
        """``score (B,)``: the reward (online), or minus the rank in the pair (offline: chosen 0,
        rejected −1)."""
        if rewards is None:
            return TrainSignals({"score": -batch.sample_index.double()})
        return TrainSignals({"score": rewards.double()})

    def build_train_data(self, batch: RolloutBatch, signals: TrainSignals, iteration: int) -> DPOExamples:
        p = self.params
        seed = self.config.run.seed
        pairs = select_pairs(signals.values["score"], batch.group_id)
        rows, ts, noise = [], [], []
        for w, lo in zip(pairs.chosen.tolist(), pairs.rejected.tolist()):
            # the pair's identity: its group and its two samples (unique in a run: online groups
            # are prompt-stream slots, offline ones stream positions)
            key = (int(batch.group_id[w]), int(batch.sample_index[w]), int(batch.sample_index[lo]))
            times = stratified_timesteps(
                generator(seed, "dpo_t", iteration, *key),
                p.num_timesteps,
                p.timestep_sampling,
                p.time_shift,
                p.logit_mean,
                p.logit_std,
            )
            for n, t in enumerate(times):
                rows.append((w, lo))
                ts.append(t)
                noise.append(
                    torch.randn(batch.x0.shape[1:], generator=generator(seed, "dpo_eps", iteration, *key, n))
                )
        device = batch.x0.device
        idx = torch.tensor(rows, dtype=torch.long).view(-1, 2)
        w_idx, l_idx = idx[:, 0], idx[:, 1]
        score = signals.values["score"].to(device)
        return DPOExamples(
            sample_id=w_idx,
            x0_w=batch.x0[w_idx.to(device)],
            x0_l=batch.x0[l_idx.to(device)],
            noise=torch.stack(noise).to(device) if noise else batch.x0[:0].clone(),
            t=torch.tensor(ts, dtype=torch.float32, device=device),
            cond=batch.cond.select(w_idx),
            reward_gap=(score[w_idx.to(device)] - score[l_idx.to(device)]).float(),
            pairs=torch.full((len(rows),), float(len(pairs.chosen)), device=device),
            skipped=torch.full((len(rows),), float(pairs.skipped), device=device),
        )

    def compute_loss(self, policy, examples: DPOExamples) -> tuple[torch.Tensor, dict[str, float]]:
        n = len(examples)
        # chosen and rejected in one forward of 2N rows, as the reference code
        x0 = torch.cat([examples.x0_w, examples.x0_l])
        noise = torch.cat([examples.noise, examples.noise])
        t = torch.cat([examples.t, examples.t])
        cond = Conditioning.cat([examples.cond, examples.cond])
        x_t = noised(x0, noise, t)
        model_err = flow_matching_loss(policy.velocity(x_t, t, cond), x0, noise)
        ref_err = flow_matching_loss(policy.reference_velocity(x_t, t, cond), x0, noise)
        terms = diffusion_dpo_loss(model_err[:n], model_err[n:], ref_err[:n], ref_err[n:], self.params.beta)
        z = terms.inside.detach()
        metrics = {
            "train/dpo_loss": terms.loss.item(),
            "train/implicit_acc": (z > 0).float().mean().item(),
            "train/reward_margin": z.mean().item(),
            "train/model_w_err": model_err[:n].detach().mean().item(),
            "train/model_l_err": model_err[n:].detach().mean().item(),
            "train/ref_w_err": ref_err[:n].mean().item(),
            "train/ref_l_err": ref_err[n:].mean().item(),
            "train/dpo_pairs": examples.pairs[0].item(),
            "train/dpo_skipped_groups": examples.skipped[0].item(),
        }
        if self.params.pairs == "online":
            metrics["train/pair_reward_gap"] = examples.reward_gap.mean().item()
        return terms.loss, metrics
