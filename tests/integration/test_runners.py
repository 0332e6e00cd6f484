"""``runner:`` names a registered runner or a user's class by dotted path; an unknown name is a
config error that lists the known ones."""

from __future__ import annotations

import pytest

from diffrl.config import ConfigError
from diffrl.preflight import load_config
from diffrl.train.loop import train
from diffrl.train.runner import LocalRunner
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
