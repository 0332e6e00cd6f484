"""``runner:`` names a registered runner or a user's class by dotted path; an unknown name is a
config error that lists the known ones."""

from __future__ import annotations

import pytest

from diffrl.config import ConfigError
from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.train.runner import LocalRunner
from diffrl.transport.workers import ProcessPool
from tests.conftest import tiny_overrides
from tests.integration.test_flow_grpo import grpo


class CountingRunner(LocalRunner):
    """The local runner, counting the rollouts it samples and the micro-groups it yields."""

    rollouts: list[int] = []
    micro_groups = 0

    def sample(self, iteration, should_stop=None):
        CountingRunner.rollouts.append(iteration)
        for part in super().sample(iteration, should_stop):
            CountingRunner.micro_groups += 1
            yield part


def test_a_runner_given_by_dotted_path_trains(tmp_path, monkeypatch):
    monkeypatch.setattr(CountingRunner, "rollouts", [])
    monkeypatch.setattr(CountingRunner, "micro_groups", 0)
    runner = f"{__name__}:CountingRunner"
    config = grpo(tmp_path, runner=runner)  # one Flow-GRPO iteration on a random tiny model
    assert config.runner == runner
    result = train(config)
    assert CountingRunner.rollouts == [0] and CountingRunner.micro_groups == 2  # 8 samples in groups of 4
    [metrics] = result.history
    assert metrics["train/grad_norm"] > 0 and metrics["rollout/reward_failed"] == 0
    assert (result.checkpoint / "trainable.safetensors").is_file()


def test_a_local_run_scores_training_and_eval_with_one_ocr_pool_started_and_closed_once(
    tmp_path, monkeypatch
):
    pools: list[ProcessPool] = []
    closes: list[ProcessPool] = []
    init, close = ProcessPool.__init__, ProcessPool.close

    def made(self, *args, **kwargs):
        init(self, *args, **kwargs)
        pools.append(self)

    def closed(self):
        closes.append(self)
        close(self)

    monkeypatch.setattr(ProcessPool, "__init__", made)
    monkeypatch.setattr(ProcessPool, "close", closed)
    ocr = "[{name: ocr, params: {num_workers: 2}}]"
    result = train(grpo(tmp_path, **{"rewards": ocr, "eval.enabled": "true", "eval.rewards": ocr}))
    assert [e["step"] for e in result.evals] == [0, 1]  # eval, a rollout scored, eval: one pool
    assert result.history[0]["rollout/reward_failed"] == 0 and result.evals[1]["eval/reward_failed"] == 0
    [pool] = [p for p in pools if p.name == "ocr"]
    assert pool.starts == 1 and pool.restarts == 0
    assert closes.count(pool) == 1


@pytest.mark.parametrize(
    "runner, message",
    [
        ("slurm", "unknown runner 'slurm'. Known: local, ray; or give a dotted path"),
        ("rayy", "unknown runner 'rayy'. Did you mean 'ray'? Known: local, ray"),
        (f"{__name__}:NoSuchRunner", f"module {__name__!r} has no attribute 'NoSuchRunner'"),
        (f"{__name__}:grpo", "is not a class"),
    ],
)
def test_an_unknown_runner_is_a_config_error_listing_the_known_ones(tmp_path, runner, message):
    with pytest.raises(ConfigError) as e:
        load_config("recipes/tiny_grpo_ocr_small.yaml", tiny_overrides(tmp_path, runner=runner))
    assert message in str(e.value)
