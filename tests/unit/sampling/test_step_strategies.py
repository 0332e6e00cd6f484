import pytest

from diffrl.config import ConfigError
from diffrl.preflight import load_config
from diffrl.sampling.step_strategies import build_step_strategy


def my_strategy(num_steps, rollout_id, seed, every=3):
    return list(range(0, num_steps, every))


def test_all_and_window_and_random_choice():
    s, errors = build_step_strategy({"name": "all"}, 10)
    assert not errors and s(10, 0, 0) == list(range(10))
    s, errors = build_step_strategy({"name": "sde_window", "size": 3, "range": [2, 8]}, 10)
    assert not errors
    windows = {tuple(s(10, rid, 0)) for rid in range(50)}
    assert all(
        len(w) == 3 and w[0] >= 2 and w[-1] < 8 and list(w) == list(range(w[0], w[0] + 3)) for w in windows
    )
    assert len(windows) > 1  # it moves between rollouts...
    assert s(10, 7, 0) == s(10, 7, 0)  # ...and is a pure function of (seed, rollout)
    s, errors = build_step_strategy(
        {"name": "epoch_global_random_choice", "k": 2, "candidates": [1, 3, 5, 7]}, 10
    )
    assert not errors
    picks = [s(10, rid, 0) for rid in range(20)]
    assert all(len(p) == 2 and set(p) <= {1, 3, 5, 7} for p in picks) and len({tuple(p) for p in picks}) > 1


def test_dotted_path_strategy():
    s, errors = build_step_strategy(
        {"name": "tests.unit.sampling.test_step_strategies:my_strategy", "every": 4}, 10
    )
    assert not errors and s(10, 0, 0) == [0, 4, 8]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "sde_window", "size": 3, "range": [8, 12]}, "does not fit a schedule of 10 steps"),
        ({"name": "sde_window", "size": 5, "range": [0, 3]}, "does not fit"),
        ({"name": "epoch_global_random_choice", "k": 5, "candidates": [1, 2]}, "k=5 must be in"),
        ({"name": "sde_windw"}, "Did you mean 'sde_window'"),
        ({"name": "sde_window", "sise": 2}, "Did you mean 'size'"),
    ],
)
def test_bad_strategies_are_config_errors(spec, message):
    with pytest.raises(ConfigError, match=message):
        load_config(
            {
                "algorithm": {"name": "flow_grpo", "params": {"step_strategy": spec}},
                "rewards": [{"name": "ocr"}],
            }
        )
