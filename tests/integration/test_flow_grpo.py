"""Flow-GRPO end to end on a random tiny model with a cheap reward (OCR is exercised elsewhere)."""

import pytest
import torch
from safetensors.torch import load_file

from diffrl.algorithms.advantages import group_advantages
from diffrl.algorithms.flow_grpo import FlowGRPO
from diffrl.algorithms.registry import build_algorithm
from diffrl.config import ConfigError
from diffrl.data.prompts import load_prompts
from diffrl.launch import train
from diffrl.models.numerics import resolve_numerics
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.collector import OnlineCollector
from tests.conftest import SMALL_ROLLOUT, tiny_overrides
from tests.engines import SHIFT

REWARD = "tests.rewards:brightness"


def grpo(tmp_path, **extra):
    base = {
        "algorithm.name": "flow_grpo",
        "algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 2]}}",
        "rewards": f"[{{name: {REWARD}}}]",
        **SMALL_ROLLOUT,
        "train.iterations": 1,
        "model.lora": "{rank: 4}",
        "eval.enabled": "false",
        "sampling.num_steps": 3,
    }
    base.update(extra)
    return load_config("recipes/tiny_grpo_ocr_small.yaml", tiny_overrides(tmp_path, **base))


SPEED = {"model.autocast": "bfloat16", "model.compile": "true"}


@pytest.mark.parametrize(
    "guidance, options",
    [
        pytest.param(1.0, {}, id="no_cfg"),
        pytest.param(3.0, {}, id="cfg"),
        pytest.param(3.0, {"model.autocast": "bfloat16"}, id="cfg_bf16"),
        # compiling the rollout and training graphs takes 3-4 minutes on 2 cores with a cold
        # inductor cache (CI's): run with -m slow
        pytest.param(3.0, SPEED, id="cfg_bf16_compiled", marks=pytest.mark.slow),
    ],
)
def test_first_replay_reproduces_the_recorded_log_probs_exactly(tmp_path, guidance, options):
    """Rollouts and training run the same numerics with every speed option on: the first replay
    of each recorded step is bit for bit the rollout's forward (bf16 autocast, torch.compile)."""
    cfg = grpo(tmp_path, **{"sampling.guidance_scale": guidance, **options})
    family_numerics = resolve_numerics(cfg.model.autocast, cfg.model.compile, torch.device("cpu"))
    if options and family_numerics.notes:
        pytest.skip(f"this machine cannot: {'; '.join(family_numerics.notes)}")
    result = train(cfg)
    m = result.history[0]
    assert m["train/log_prob_mean_abs_diff"] == 0.0
    assert m["train/ratio_abs_minus_1"] == 0.0 and m["train/clipfrac"] == 0.0 and m["train/approx_kl"] == 0.0
    assert m["train/grad_norm"] > 0 and m["rollout/reward_failed"] == 0
    for key in ("train/policy_loss", "train/kl_loss", "rollout/reward/raw_std", "rollout/zero_std_ratio"):
        assert key in m
    # the stage breakdown: the sampling stages fit in the rollout's time, the training ones ran
    parts = [m[f"perf/rollout_{stage}_time"] for stage in ("encode", "denoise", "decode")]
    assert all(t >= 0 for t in parts) and m["perf/rollout_denoise_time"] > 0
    assert sum(parts) <= m["perf/rollout_time"] + 1e-3
    assert m["perf/train_forward_backward_time"] > 0 and m["perf/optimizer_time"] > 0
    # the model FLOPs were counted, against a stated peak, raised where a stage beat it (never > 100%)
    assert m["perf/rollout_flops"] > 0 and m["perf/train_flops"] > 0
    assert 0 < m["perf/rollout_mfu"] <= 1 and 0 < m["perf/train_mfu"] <= 1
    if cfg.model.compile:
        assert m["perf/compile_time"] > 0


def _collect(cfg, micro_group):
    cfg.rollout.micro_group_size = micro_group
    family = load_family(cfg)
    spec = build_algorithm(cfg).collection_spec()
    collector = OnlineCollector(cfg, family, spec, load_prompts(cfg.data.prompts))
    return collector.collect(3)


def test_rollout_does_not_depend_on_micro_group_size_and_records_only_chosen_steps(tmp_path):
    cfg = grpo(
        tmp_path, **{"algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 3]}}"}
    )
    a, b = _collect(cfg, 8), _collect(cfg, 3)
    torch.testing.assert_close(a.x0, b.x0, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(a.traj_log_prob, b.traj_log_prob, atol=1e-4, rtol=1e-4)
    assert a.prompts == b.prompts and torch.equal(a.group_id, b.group_id)
    assert a.traj_x.shape[:2] == (8, 2) and a.traj_log_prob.shape == (8, 2)
    assert (a.traj_step == a.traj_step[0]).all()  # one window for every sample of the rollout
    assert a.group_id.unique().numel() == 2


@pytest.mark.parametrize("same_latent", [True, False])
def test_same_latent_shares_a_groups_start_until_the_window(tmp_path, same_latent):
    """With ``rollout.same_latent`` a group's samples share the initial noise, so they are equal
    up to the first stochastic step (ODE steps before it) and differ after the window."""
    cfg = grpo(
        tmp_path,
        **{
            "algorithm.params": "{step_strategy: {name: sde_window, size: 1, range: [1, 2]}}",
            "rollout.same_latent": str(same_latent).lower(),
        },
    )
    batch = _collect(cfg, 8)
    for g in batch.group_id.unique():
        rows = torch.nonzero(batch.group_id == g).flatten()
        start, final = batch.traj_x[rows, 0], batch.x0[rows]
        assert torch.equal(start, start[:1].expand_as(start)) == same_latent
        assert not torch.allclose(final[0], final[1])


def test_update_does_not_depend_on_micro_batch_size(tmp_path):
    weights = []
    for micro in (4, 2):
        result = train(
            grpo(tmp_path / str(micro), **{"train.micro_batch_size": micro, "rollout.micro_group_size": 4})
        )
        weights.append(load_file(str(result.checkpoint / "trainable.safetensors")))
    for k in weights[0]:
        torch.testing.assert_close(weights[0][k], weights[1][k], atol=1e-6, rtol=1e-4)


def test_two_optimizer_steps_per_rollout_and_kl(tmp_path):
    cfg = grpo(
        tmp_path,
        **{
            "rollout.num_steps_per_rollout": 2,
            "train.batch_size": 4,
            "algorithm.params": "{kl_beta: 0.1, step_strategy: {name: all}}",
        },
    )
    m = train(cfg).history[0]
    assert m["train/kl_loss"] >= 0 and m["train/skipped_nonfinite"] == 0


def test_grpo_guard_and_the_mix_grpo_window_train_end_to_end(tmp_path):
    """GRPO-Guard's RatioNorm + gradient reweighting on MixGRPO's sliding window (windows [0, 1],
    [1, 2], then [2] of 3 steps, one move per iteration): the rollout keeps the transitions' means and
    an iteration of two optimizer steps trains with finite losses."""
    cfg = grpo(
        tmp_path,
        **{
            "rollout.num_steps_per_rollout": 2,
            "train.batch_size": 4,
            "algorithm.params": "{ratio_norm: true, grad_reweight: true, "
            "step_strategy: {name: mix_grpo, size: 2, shift_interval: 1}}",
        },
    )
    # rollout 3: the window was cut to [2] at the end (the reference's is empty there: [2] stays)
    batch = _collect(cfg, 8)
    assert batch.traj_mean.shape == batch.traj_x.shape and (batch.traj_step == torch.tensor([2])).all()
    m = train(cfg).history[0]  # means over the two optimizer steps: the second replays a moved policy
    assert m["train/ratio_mean_bias"] > 0 and m["train/skipped_nonfinite"] == 0
    assert torch.isfinite(torch.tensor(m["train/policy_loss"])) and m["train/grad_norm"] > 0


def test_reward_nan_drops_samples_and_is_counted(tmp_path):
    cfg = grpo(
        tmp_path,
        **{
            "rewards": "[{name: tests.rewards:flaky}]",
            "rollout.batch_size": 4,
            "train.batch_size": 16,
        },
    )
    with pytest.warns(UserWarning, match="dropped"):
        result = train(cfg)
    m = result.history[0]
    assert m["rollout/reward_failed"] == 4  # one per micro-group of 4
    assert m["rollout/reward/raw_mean"] == m["rollout/reward/raw_mean"]  # not NaN: failures are not averaged
    assert m["train/skipped_nonfinite"] == 0 and m["train/grad_norm"] > 0


def test_each_rewards_raw_scores_and_failures_are_logged_next_to_the_total(tmp_path):
    cfg = grpo(
        tmp_path,
        **{  # brightness twice: rewards sharing a name get their index in the metric names
            "rewards": f"[{{name: tests.rewards:flaky, weight: 0.5}}, {{name: {REWARD}}}, {{name: {REWARD}, weight: 2}}]",
            "rollout.batch_size": 4,
            "train.batch_size": 16,
        },
    )
    with pytest.warns(UserWarning, match=r"raised|non-finite.*\(on prompts '") as caught:
        m = train(cfg).history[0]
    assert "flaky' returned 1 non-finite score(s) (on prompts" in str(caught[0].message)
    flaky, first, second = "tests.rewards:flaky", f"{REWARD}#1", f"{REWARD}#2"
    assert m[f"rollout/reward/{flaky}/failed"] == 4 and m["rollout/reward_failed"] == 4
    assert m[f"rollout/reward/{first}/failed"] == 0 == m[f"rollout/reward/{second}/failed"]
    for label in (flaky, first, second):
        lo, mean, hi = (m[f"rollout/reward/{label}/{k}"] for k in ("min", "mean", "max"))
        assert lo <= mean <= hi and m[f"rollout/reward/{label}/std"] >= 0
    # the same function on the same images: the duplicates' raw scores are equal, whatever the weight
    assert m[f"rollout/reward/{first}/mean"] == m[f"rollout/reward/{second}/mean"]
    # on the 12 scored samples flaky == brightness, so each total is 3.5 x its brightness
    assert m["rollout/reward/raw_max"] <= 3.5 * m[f"rollout/reward/{first}/max"] * (1 + 1e-6)


@pytest.mark.parametrize(
    "extra, message",
    [
        ({"algorithm.params": "{sampler: ode}"}, "needs a stochastic sampler"),
        ({"rollout.n_samples_per_prompt": 1, "train.batch_size": 2}, "n_samples_per_prompt must be >= 2"),
        ({"train.batch_size": 6}, "they must be equal; e.g. set train.batch_size=8"),
        ({"rewards": "[]"}, "needs a reward"),
    ],
)
def test_bad_grpo_recipes(tmp_path, extra, message):
    with pytest.raises(ConfigError, match=message):
        grpo(tmp_path, **extra)


def redness(images, prompts, metadata):
    """A second reward on a scale 1000 times brightness's."""
    return (1000 * images[:, 0].float().mean(dim=(1, 2))).tolist()


RECORDED: list = []


class RecordingGRPO(FlowGRPO):
    """Flow-GRPO that keeps what its advantages were computed from."""

    def postprocess_rewards(self, batch, rewards):
        signals = super().postprocess_rewards(batch, rewards)
        RECORDED.append((batch.group_id, batch.reward_scores.scores, signals.values["advantages"]))
        return signals


def test_per_reward_advantages_end_to_end(tmp_path):
    here = "tests.integration.test_flow_grpo"
    cfg = grpo(
        tmp_path,
        **{
            "algorithm.name": f"{here}:RecordingGRPO",
            "algorithm.params": "{step_strategy: {name: sde_window, size: 2, range: [0, 2]}, advantage_aggregation: per_reward}",
            "rewards": f"[{{name: {REWARD}}}, {{name: {here}:redness, weight: 2.0}}]",
        },
    )
    RECORDED.clear()
    m = train(cfg).history[0]
    assert m["train/skipped_nonfinite"] == 0 and m["train/grad_norm"] > 0
    ((group_id, scores, adv),) = RECORDED
    # each reward normalised in its group, weighted, summed, then normalised over the batch
    combined = sum(
        w * group_advantages(scores[label].double(), group_id).advantages
        for label, w in ((REWARD, 1.0), (f"{here}:redness", 2.0))
    )
    expected = (combined - combined.mean()) / (combined.std(unbiased=False) + 1e-4)
    torch.testing.assert_close(adv, expected.float())


def _trainable(result) -> dict[str, torch.Tensor]:
    return load_file(str(result.checkpoint / "trainable.safetensors"))


@pytest.mark.parametrize("mode", ["tis", "mask"])
def test_rollout_correction_changes_nothing_when_the_engine_is_the_trainer(tmp_path, mode):
    """The built-in engine records the trainer's own log-probs bit for bit: every weight is 1 and
    the run is the uncorrected run's, bit for bit."""
    runs = {}
    for correction in ("none", mode):
        params = f"{{step_strategy: {{name: sde_window, size: 2, range: [0, 2]}}, rollout_correction: {correction}}}"
        runs[correction] = train(
            grpo(tmp_path / correction, **{"train.iterations": 2, "algorithm.params": params})
        )
    m = runs[mode].history[0]
    assert m["train/rollout_is_weight_mean"] == 1.0 and m["train/rollout_is_corrected_frac"] == 0.0
    assert m["train/rollout_log_prob_abs_diff"] == 0.0 and m["train/rollout_kl"] == 0.0
    for a, b in zip(runs["none"].history, runs[mode].history):
        assert (
            a["train/policy_loss"] == b["train/policy_loss"] and a["train/grad_norm"] == b["train/grad_norm"]
        )
    off, on = _trainable(runs["none"]), _trainable(runs[mode])
    assert off.keys() == on.keys() and all(torch.equal(off[k], on[k]) for k in off)


def test_rollout_correction_replays_the_engines_transitions_and_weights_them(tmp_path):
    """An engine whose recorded log-probs are another policy's (μ, off by a known shift): with the
    correction the clipped ratio starts from the trainer's replay (exactly 1) and each transition's
    term is weighted by ρ = π/μ truncated or masked; without it the ratio starts at π/μ and clips."""

    def first_step(mode: str, cap: float) -> dict[str, float]:
        params = (
            "{step_strategy: {name: sde_window, size: 2, range: [0, 2]}, "
            f"rollout_correction: {mode}, rollout_correction_cap: {cap}}}"
        )
        overrides = {"rollout.engine": "tests.engines:MisalignedLogProbs", "algorithm.params": params}
        return train(grpo(tmp_path / f"{mode}{cap}", **overrides)).history[0]

    runs = {
        (mode, cap): first_step(mode, cap)
        for mode, cap in [("none", 2), ("tis", 2), ("mask", 2), ("mask", 3)]
    }
    shift = torch.tensor(SHIFT, dtype=torch.float64)
    rho, diff = shift.exp(), shift.abs().mean().item()  # even samples: ρ = e^1; odd: e^-0.25
    for m in runs.values():
        assert m["train/log_prob_mean_abs_diff"] == pytest.approx(diff, abs=1e-5)
    assert runs["none", 2]["train/clipfrac"] == 1.0 and "train/rollout_is_weight_mean" not in runs["none", 2]
    expected = {
        ("tis", 2): ((2.0 + rho[1].item()) / 2, 0.5),
        ("mask", 2): (0.5, 0.5),
        ("mask", 3): (1.0, 0.0),
    }
    for key, (weight_mean, corrected) in expected.items():
        m = runs[key]
        assert m["train/ratio_abs_minus_1"] == 0.0 and m["train/clipfrac"] == 0.0
        assert m["train/rollout_is_weight_mean"] == pytest.approx(weight_mean, abs=1e-5)
        assert m["train/rollout_is_corrected_frac"] == corrected
        assert m["train/rollout_is_raw_mean"] == pytest.approx(rho.mean().item(), abs=1e-5)
        assert m["train/rollout_log_prob_abs_diff"] == pytest.approx(diff, abs=1e-5)
        assert m["train/rollout_kl"] == pytest.approx((rho - 1 - shift).mean().item(), abs=1e-5)
    # the weights are in the loss: with the ratio 1 it is mean(−A·w), with w = (0, 1) for (even,
    # odd) samples at mask 2, (1, 1) at mask 3 and (2, e^-0.25) at tis 2
    odd = runs["mask", 2]["train/policy_loss"]
    even = runs["mask", 3]["train/policy_loss"] - odd
    assert even != 0.0 and odd != 0.0
    assert runs["tis", 2]["train/policy_loss"] == pytest.approx(
        2 * even + rho[1].item() * odd, rel=1e-4, abs=1e-7
    )
