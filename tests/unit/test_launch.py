"""The composition root (diffrl/launch.py): the runner is chosen there from ``runner:`` and what
it places is asked of it, not of a runner's name in a lower layer."""

import pytest

from diffrl import launch
from diffrl.config import ConfigError, ParallelConfig
from diffrl.core.registry import RegistryError
from diffrl.preflight import load_config
from diffrl.train.runner import LocalRunner


class Placing(LocalRunner):
    """A user's runner that says nothing of its layout."""

    layout = None


def test_the_runner_named_is_the_class_handed_down():
    assert launch.runner_class(load_config({})) is LocalRunner
    assert launch.RUNNERS.resolve("ray").__name__ == "RayRunner"
    with pytest.raises(RegistryError, match="Did you mean 'local'"):
        launch.RUNNERS.resolve("locl")


def test_the_layout_is_what_the_runner_places():
    asked = ["parallel.trainer_ranks=4", "parallel.engines=2"]
    assert launch.layout(load_config({}, asked)) == ParallelConfig()  # one process: one of each
    ray = load_config({}, ["runner=ray", *asked], check_files=False)
    assert launch.layout(ray) == ParallelConfig(trainer_ranks=4, engines=2)
    own = load_config({}, [f"runner={__name__}:Placing", *asked])
    assert launch.layout(own) == ParallelConfig(trainer_ranks=4, engines=2)  # the recipe's, as asked


def test_a_runner_that_samples_apart_refuses_what_needs_one_process():
    with pytest.raises(ConfigError, match=r"train_text_encoder runs in one process only \(runner: local\)"):
        load_config("recipes/tiny_sft.yaml", ["runner=ray"], check_files=False)
    load_config("recipes/tiny_sft.yaml", check_files=False)  # one process: fine
