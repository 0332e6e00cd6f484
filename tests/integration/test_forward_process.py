"""DiffusionNFT and AWM end to end on a random tiny model with a cheap reward, the old policy, the
trajectory-free collector, a user's own algorithm by dotted path, and bad recipes."""

from dataclasses import dataclass

import pytest
import torch

from diffrl.algorithms.awm import AWM
from diffrl.algorithms.registry import build_algorithm
from diffrl.algorithms.sft import SFT, flow_matching_loss
from diffrl.config import ConfigError
from diffrl.core.rollout import CollectionSpec
from diffrl.data.prompts import load_prompts
from diffrl.launch import train
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.collector import OnlineCollector
from diffrl.train.actor import Actor
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

REWARD = "tests.rewards:brightness"
ONE_PROMPT = {"rollout.batch_size": 1, "train.batch_size": 4}
"""One prompt's group of 4 samples, one optimizer step of 4: for the tests that need an update or a
rollout, not a batch."""


def forward_process(tmp_path, recipe, **extra):
    base = {
        "rewards": f"[{{name: {REWARD}}}]",
        **SMALL_ROLLOUT,
        "train.iterations": 2,
        "model.lora": "{rank: 4}",
        "eval.enabled": "false",
        "sampling.num_steps": 3,
    }
    base.update(extra)
    return load_config(f"recipes/{recipe}.yaml", tiny_overrides(tmp_path, **base))


def test_nft_trains_and_its_old_policy_trails_the_live_one(tmp_path):
    params = "{kl_beta: 0.01, timestep_fraction: 1.0}"
    cfg = forward_process(tmp_path, "tiny_nft_ocr", **{"algorithm.params": params, **ONE_PROMPT})
    history = train(cfg).history
    first, second = history
    for key in ("train/nft_pos_loss", "train/nft_neg_loss", "train/nft_r_mean", "train/kl_loss"):
        assert key in first
    # the first update starts from old == live; afterwards the old policy lags (ramp decay 0.001)
    assert first["train/old_deviate"] == 0.0
    assert second["train/old_deviate"] > 0.0
    assert first["train/old_policy_decay"] == pytest.approx(0.001)
    assert first["train/grad_norm"] > 0 and first["train/skipped_nonfinite"] == 0


@pytest.mark.parametrize("lora", ["{rank: 4}", "null"])
def test_old_policy_copy_switch_and_update(tmp_path, lora):
    cfg = forward_process(tmp_path, "tiny_nft_ocr", **{"model.lora": lora})
    family = load_family(cfg)
    actor = Actor(family, cfg, keep_old=True)
    old = actor.policy.old
    x = torch.randn(2, 3, 32, 64)
    sigma = torch.tensor([0.5, 0.9])
    cond = family.encode_prompts(["a", "b"])
    with torch.no_grad():
        for p in actor.params:  # move the live weights away from the old ones
            p.add_(0.05 * torch.randn_like(p))
    live = actor.policy.velocity(x, sigma, cond).detach()
    before = actor.policy.old_velocity(x, sigma, cond)
    assert not torch.allclose(live, before)
    # switching to the old weights and back leaves the live ones and their trainability intact
    torch.testing.assert_close(actor.policy.velocity(x, sigma, cond).detach(), live)
    assert all(p.requires_grad for p in actor.params)
    assert old.deviation() > 0
    old.update(0.0)  # old <- live
    assert old.deviation() == 0.0
    torch.testing.assert_close(actor.policy.old_velocity(x, sigma, cond), live)


def _collect(cfg):
    family = load_family(cfg)
    spec = build_algorithm(cfg).collection_spec()
    return OnlineCollector(cfg, family, spec, load_prompts(cfg.data.prompts)).collect(0)


def _bytes(batch) -> int:
    total = 0
    for v in vars(batch).values():
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif hasattr(v, "tensors"):
            total += sum(t.numel() * t.element_size() for t in v.tensors.values())
    return total


@pytest.mark.parametrize("recipe", ["tiny_nft_ocr", "tiny_awm_ocr"])
def test_collection_keeps_no_trajectory_and_memory_does_not_grow_with_steps(tmp_path, recipe):
    sizes = []
    for steps in (2, 6):
        batch = _collect(forward_process(tmp_path, recipe, **{"sampling.num_steps": steps}))
        assert batch.traj_x is None and batch.traj_log_prob is None
        sizes.append(_bytes(batch))
    # only the schedule each sample records grows: 4 more float32 sigmas per sample
    assert sizes[1] - sizes[0] == len(batch) * 4 * 4


def test_heun_collection_is_second_order(tmp_path):
    """Heun with 4 steps lands closer to a fine Euler solution (64 steps) than Euler with 4 does
    (one prompt's 4 samples: Heun's error is 0.26 of Euler's, as on 2 prompts' 8)."""
    cfg = forward_process(tmp_path, "tiny_nft_ocr", **{"sampling.num_steps": 4, **ONE_PROMPT})
    euler = _collect(cfg).x0
    cfg.algorithm.params = {"sampler": "heun"}
    heun = _collect(cfg).x0
    cfg.algorithm.params = {}
    cfg.sampling.num_steps = 64
    fine = _collect(cfg).x0
    assert (heun - fine).abs().mean() < 0.5 * (euler - fine).abs().mean()


def test_awm_first_ratio_is_one_and_gradient_is_advantage_weighted_flow_matching(tmp_path):
    cfg = forward_process(tmp_path, "tiny_awm_ocr", **{"train.iterations": 1, **ONE_PROMPT})
    m = train(cfg).history[0]
    assert m["train/ratio_abs_minus_1"] == 0.0 and m["train/clipfrac"] == 0.0 and m["train/approx_kl"] == 0.0

    family = load_family(cfg)
    actor = Actor(family, cfg)
    algo = build_algorithm(cfg)
    batch = _collect(cfg)
    batch.rewards = torch.rand(len(batch))
    examples = algo.build_train_data(batch, algo.postprocess_rewards(batch, batch.rewards), 0)
    cfg.train.micro_batch_size = len(examples)  # one micro-batch: the same forward as compute_loss
    examples = actor.before_update(examples, algo)
    loss, metrics = algo.compute_loss(actor.policy, examples)
    assert metrics["train/ratio_abs_minus_1"] == 0.0
    grads = torch.autograd.grad(loss, actor.params)
    t_ = examples.t.view(-1, 1, 1, 1)
    x_t = (1 - t_) * examples.x0 + t_ * examples.noise
    fm = flow_matching_loss(
        actor.policy.velocity(x_t, examples.t, examples.cond), examples.x0, examples.noise
    )
    expected = torch.autograd.grad((examples.advantages.clamp(-5, 5) * fm).mean(), actor.params)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g.float(), e, atol=1e-7, rtol=1e-4)


class HalfAWM(AWM):
    """A user's algorithm, defined outside the package: AWM on the better half of each group only."""

    name = "half_awm"

    @dataclass
    class Params(AWM.Params):
        keep_fraction: float = 0.5

    def postprocess_rewards(self, batch, rewards):
        signals = super().postprocess_rewards(batch, rewards)
        adv = signals.values["advantages"]
        signals.values["advantages"] = torch.where(adv > 0, adv, torch.zeros_like(adv))
        return signals


def test_user_algorithm_by_dotted_path_trains(tmp_path):
    cfg = forward_process(
        tmp_path,
        "tiny_awm_ocr",
        **{
            "algorithm.name": "tests.integration.test_forward_process:HalfAWM",
            "algorithm.params": "{keep_fraction: 0.5}",
            "train.iterations": 1,
            **ONE_PROMPT,
        },
    )
    result = train(cfg)
    assert result.history[-1]["train/grad_norm"] > 0 and result.checkpoint.is_dir()


class NeedsLogProbs(SFT):
    """A custom algorithm whose training data needs log-probs its spec does not collect."""

    requires = frozenset({"traj_log_prob"})

    def collection_spec(self):
        return CollectionSpec(online=True, needs_reward=True, sampler="ode")


@pytest.mark.parametrize(
    "recipe, extra, message",
    [
        (
            "tiny_nft_ocr",
            {"algorithm.params": "{beta: 0.0}"},
            r"beta must be in \(0, 100\] \(it divides the loss",
        ),
        ("tiny_nft_ocr", {"algorithm.params": "{decay_schedule: linear}"}, "decay_schedule"),
        ("tiny_nft_ocr", {"algorithm.params": "{timestep_fraction: 0.1}"}, "trains on no timestep"),
        (
            "tiny_awm_ocr",
            {"algorithm.params": "{timestep_sampling: discrete, num_timesteps: 3}"},
            "num_timesteps=3",
        ),
        (
            "tiny_awm_ocr",
            {
                "algorithm.name": "tests.integration.test_forward_process:NeedsLogProbs",
                "algorithm.params": "{}",
            },
            "trains on traj_log_prob, which its collection_spec",
        ),
    ],
)
def test_bad_forward_process_recipes(tmp_path, recipe, extra, message):
    with pytest.raises(ConfigError, match=message):
        forward_process(tmp_path, recipe, **extra)


@pytest.mark.parametrize("recipe", ["tiny_nft_ocr", "tiny_awm_ocr"])
def test_cfg_rollouts_with_and_without_cfg_in_training(tmp_path, recipe):
    for train_cfg in (False, True):
        cfg = forward_process(
            tmp_path / str(train_cfg),
            recipe,
            **{
                "sampling.guidance_scale": 3.0,
                "train.iterations": 1,
                **ONE_PROMPT,
                "algorithm.params": f"{{train_cfg: {str(train_cfg).lower()}}}",
            },
        )
        m = train(cfg).history[0]
        assert m["train/grad_norm"] > 0 and m["train/skipped_nonfinite"] == 0
