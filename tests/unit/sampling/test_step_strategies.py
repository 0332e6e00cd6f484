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


def test_mix_grpo_window_slides_every_shift_interval_and_stays_at_the_end():
    # 10 steps, window 3, tau = 5 iterations, stride 2: starts 0, 2, 4, 6, 8 (cut to [8, 9]), for good
    s, errors = build_step_strategy(
        {"name": "mix_grpo", "size": 3, "shift_interval": 5, "stride": 2, "wrap": False}, 10
    )
    assert not errors
    assert s(10, 0, 0) == [0, 1, 2] and s(10, 4, 0) == [0, 1, 2]  # iterations 0 and tau - 1
    assert s(10, 5, 0) == [2, 3, 4]  # tau: the first move
    assert s(10, 3 * 5, 0) == [6, 7, 8]  # k * tau
    assert s(10, 4 * 5, 0) == [8, 9] and s(10, 1000, 0) == [8, 9]  # the end: cut, and stays
    # the reference's table, iteration by iteration: tests/unit/algorithms/test_mixgrpo_window.py
    assert s(10, 7, 0) == s(10, 7, 123)  # the seed plays no part


def test_mix_grpo_window_wraps_and_defaults_follow_the_reference_script():
    s, errors = build_step_strategy({"name": "mix_grpo", "size": 3, "shift_interval": 5, "stride": 2}, 10)
    # wrap (roll_back) is on by default: starts 0, 2, 4, 6, 8 ([8, 9]), 10 (empty in the reference:
    # [8, 9] stays), then 0 again
    assert not errors
    assert [s(10, 5 * k, 0) for k in (0, 3, 4, 5, 6, 7)] == [
        [0, 1, 2],
        [6, 7, 8],
        [8, 9],
        [8, 9],
        [0, 1, 2],
        [2, 3, 4],
    ]
    s, errors = build_step_strategy({"name": "mix_grpo", "range": [2, 9]}, 12)
    assert not errors  # size 4, tau 25, stride 1 inside [2, 9): starts 2, 3, ..., 8 (cut), 9 (empty), then 2
    assert s(12, 0, 0) == [2, 3, 4, 5] and s(12, 24, 0) == [2, 3, 4, 5] and s(12, 25, 0) == [3, 4, 5, 6]
    assert s(12, 75, 0) == [5, 6, 7, 8] and s(12, 100, 0) == [6, 7, 8] and s(12, 200, 0) == [2, 3, 4, 5]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"name": "sde_window", "size": 3, "range": [8, 12]}, "does not fit a schedule of 10 steps"),
        ({"name": "sde_window", "size": 5, "range": [0, 3]}, "does not fit"),
        ({"name": "epoch_global_random_choice", "k": 5, "candidates": [1, 2]}, "k=5 must be in"),
        ({"name": "mix_grpo", "size": 12}, "mix_grpo window of size 12 in range \\[0, 10\\) does not fit"),
        (
            {"name": "mix_grpo", "size": 2, "shift_interval": 0},
            r"algorithm.params.step_strategy.shift_interval must be in \[1, 1_000_000_000\] .*, got 0",
        ),
        ({"name": "sde_window", "range": [0, 5000]}, r"step_strategy.range\[1\] must be in \[0, 1000\]"),
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
