"""The policy-drift hook (``DiffusionAlgorithm.drift``, ``monitor.kl_every``) on a tiny LoRA policy:
0 at the base, > 0 after an update, the very number a ``kl_beta`` run's loss logs on the same
micro-batch, the random state left as it was, its schedule, and a plugin's wrong return named."""

import dataclasses

import pytest
import torch

from diffrl.algorithms.flow_grpo import FlowGRPO
from diffrl.algorithms.registry import build_algorithm
from diffrl.core.user_code import PluginError
from diffrl.data.prompts import load_prompts
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.collector import OnlineCollector
from diffrl.train.actor import Actor
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

RECIPES = {"flow_grpo": "tiny_grpo_ocr_small", "awm": "tiny_awm_ocr", "diffusion_nft": "tiny_nft_ocr"}
WORLD = {
    **SMALL_ROLLOUT,
    "rollout.batch_size": 1,  # one prompt's 4 samples in one micro-batch
    "train.batch_size": 4,
    "train.micro_batch_size": 4,
    "rewards": "[{name: tests.rewards:brightness}]",
    "model.lora": "{rank: 4}",
    "eval.enabled": "false",
    "sampling.num_steps": 3,
    "sampling.height": 8,
    "sampling.width": 8,
    "train.lr": 3e-3,
}
STEPS = {"flow_grpo": "{step_strategy: {name: all}, clip_range: 0.2"}


def _config(tmp_path, name: str, kl_beta: float = 0.0, **extra):
    params = STEPS.get(name, "{") + ("" if name not in STEPS else ", ") + f"kl_beta: {kl_beta}}}"
    overrides = tiny_overrides(tmp_path, **{**WORLD, "algorithm.params": params, **extra})
    return load_config(f"recipes/{RECIPES[name]}.yaml", overrides)


def _world(tmp_path, name: str, **extra):
    """A tiny LoRA actor, the algorithm without a KL, and one rollout's examples (prepared by
    ``before_update`` as an update's)."""
    cfg = _config(tmp_path, name, **extra)
    torch.manual_seed(0)
    family = load_family(cfg)
    algo = build_algorithm(cfg)
    actor = Actor(family, cfg, keep_old=algo.keeps_old_policy, sample_with_old=algo.samples_with_old_policy)
    batch = OnlineCollector(cfg, family, algo.collection_spec(), load_prompts(cfg.data.prompts)).collect(0)
    batch.rewards = torch.linspace(0, 1, len(batch))
    examples = algo.build_train_data(batch, algo.postprocess_rewards(batch, batch.rewards), 0)
    return cfg, actor, algo, actor.before_update(examples, algo)


@pytest.mark.parametrize("name", list(RECIPES))
def test_drift_is_zero_at_the_base_grows_after_an_update_and_is_the_kl_runs_number(tmp_path, name):
    cfg, actor, algo, examples = _world(tmp_path, name)
    assert actor.drift(examples, algo)["monitor/kl_to_base"] == 0.0  # LoRA starts as the base
    actor.train_step(examples, algo)
    drift = actor.drift(examples, algo)["monitor/kl_to_base"]
    assert drift > 0
    # a kl_beta run's loss on the same (first) micro-batch with the same weights logs the same KL
    with_kl = build_algorithm(_config(tmp_path, name, kl_beta=0.5))
    mb = actor.policy.micro_batches(examples)[0]
    actor.module.train()
    _, metrics = with_kl.compute_loss(actor.policy, mb)
    assert metrics["monitor/kl_to_base"] == pytest.approx(drift, rel=1e-6)
    if name == "flow_grpo":  # GARDO's gate narrows the penalty to some rows, not the monitor
        gated = dataclasses.replace(mb, kl_gate=torch.arange(len(mb.advantages)) == 0)
        loss_kl, gated_metrics = with_kl.compute_loss(actor.policy, gated)
        assert gated_metrics["train/kl_gated_frac"] == 1 / len(mb.advantages)
        assert gated_metrics["monitor/kl_to_base"] == pytest.approx(drift, rel=1e-6)


@pytest.fixture(scope="module")
def dropout_world(tmp_path_factory):
    """flow_grpo's world with LoRA dropout: its forwards in training mode draw random numbers."""
    return _world(
        tmp_path_factory.mktemp("dropout"), "flow_grpo", **{"model.lora": "{rank: 4, dropout: 0.1}"}
    )


def test_drift_leaves_the_random_state_and_the_weights_as_they_were(dropout_world):
    cfg, actor, algo, examples = dropout_world
    with torch.no_grad():
        for p in actor.params:
            p.add_(0.01)
    weights = [p.detach().clone() for p in actor.params]
    state = torch.random.get_rng_state()
    assert actor.drift(examples, algo)["monitor/kl_to_base"] > 0
    assert torch.equal(torch.random.get_rng_state(), state)
    assert all(torch.equal(a, b) for a, b in zip(weights, actor.params))
    # the check can fail: the same forwards without the actor's care draw (LoRA dropout)
    with torch.no_grad():
        algo.drift(actor.policy, actor.policy.micro_batches(examples)[0])
    assert not torch.equal(torch.random.get_rng_state(), state)


def _due(actor, algo, step: int, steps: int) -> bool:
    actor.step = step  # the optimizer steps done before the update
    return actor.drift_due(steps, algo)


def test_the_schedule_counts_iterations_in_optimizer_steps_and_skips_kl_runs(
    tmp_path, dropout_world, monkeypatch
):
    cfg, actor, algo, _ = dropout_world
    # the world is shared by the module's tests: monkeypatch puts every setting back, failed or not
    monkeypatch.setattr(cfg.monitor, "kl_every", 2)
    monkeypatch.setattr(cfg.rollout, "num_steps_per_rollout", cfg.rollout.num_steps_per_rollout)
    monkeypatch.setattr(actor, "_steps_per_iteration", None)
    # one optimizer step per iteration: iterations 2 and 4 measure
    assert [_due(actor, algo, step, 1) for step in range(4)] == [False, True, False, True]
    actor._steps_per_iteration = None
    cfg.rollout.num_steps_per_rollout = 2  # two per iteration: the updates ending at steps 4 and 8
    assert [_due(actor, algo, step, 2) for step in (0, 2, 4, 6)] == [False, True, False, True]
    assert not _due(actor, build_algorithm(_config(tmp_path, "flow_grpo", kl_beta=0.1)), 2, 2)
    cfg.monitor.kl_every = 0
    assert not _due(actor, algo, 2, 2)


def test_a_full_fine_tune_without_a_kl_says_once_it_does_not_measure(tmp_path, capsys):
    cfg = _config(tmp_path, "flow_grpo", **{"model.lora": "null"})
    actor = Actor(load_family(cfg), cfg)
    assert "monitor/kl_to_base is measured only by runs with LoRA" in capsys.readouterr().out
    assert not actor.drift_due(1, build_algorithm(cfg))
    cfg.monitor.kl_every = 0
    Actor(load_family(cfg), cfg)
    assert "kl_to_base" not in capsys.readouterr().out


class ListDrift(FlowGRPO):
    def drift(self, policy, examples):
        return [0.5]


class TextDrift(FlowGRPO):
    def drift(self, policy, examples):
        return {"monitor/kl_to_base": "small"}


@pytest.mark.parametrize(
    "cls, said", [(ListDrift, "a list"), (TextDrift, "metric 'monitor/kl_to_base' = a str")]
)
def test_a_plugins_wrong_drift_is_its_error(dropout_world, cls, said):
    cfg, actor, algo, examples = dropout_world
    with pytest.raises(PluginError, match=rf"test_drift:{cls.__name__}'.*drift\(\) returned {said}"):
        actor.drift(examples, cls(algo.params, cfg))
