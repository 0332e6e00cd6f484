"""train.keep_best's decision (diffrl/trust/best.py) on hand-made scores: the best moves only when
the new eval beats it by more than the paired SE; the first eval is the first best (no checkpoint);
the record survives a checkpoint exactly."""

import json

import pytest
import torch

from diffrl.config.schema import KeepBestConfig
from diffrl.trust.best import Best, beats

KEY = "eval/reward_mean"


def ev(*values):
    return {KEY: torch.tensor(values, dtype=torch.float32)}


@pytest.mark.parametrize(
    ("new", "old", "moves"),
    [
        ([0.2, 0.2, 0.2, 0.2], [0.1, 0.1, 0.1, 0.1], True),  # +0.1, SE 0
        ([0.5, 0.1, 0.4, 0.2], [0.1, 0.1, 0.1, 0.1], True),  # +0.2, SE 0.09
        ([0.9, -0.5, 0.3, -0.3], [0.0, 0.0, 0.0, 0.0], False),  # +0.1, SE 0.31: within the noise
        ([0.0, 0.0, 0.0, 0.0], [0.1, 0.1, 0.1, 0.1], False),  # worse
        ([0.1, 0.1, 0.1, 0.1], [0.1, 0.1, 0.1, 0.1], False),  # equal
        ([0.9, float("nan")], [0.1, 0.1], False),  # one scored pair: no SE
    ],
)
def test_beats_only_by_more_than_the_paired_se(new, old, moves):
    assert beats(torch.tensor(new), torch.tensor(old))[0] is moves


def test_first_eval_is_the_best_then_moves_on_a_paired_win():
    best = Best(KeepBestConfig(every=2))
    assert best.consider(0, ev(0.1, 0.1, 0.1)) == (False, {"keep_best/iteration": 0.0})
    assert best.iteration == 0 and not best.saved
    moved, metrics = best.consider(2, ev(0.3, 0.1, 0.2))
    assert moved and best.iteration == 2 and best.saved
    assert metrics["keep_best/gain"] == pytest.approx(0.1, abs=1e-6)
    moved, metrics = best.consider(4, ev(0.31, 0.1, 0.2))  # +0.0033, SE 0.0033: not more than it
    assert not moved and best.iteration == 2 and metrics["keep_best/iteration"] == 2.0
    assert [best.due(s) for s in (1, 2, 3, 4)] == [False, True, False, True]


def test_a_metric_the_eval_lacks_is_a_key_error_naming_it():
    with pytest.raises(KeyError, match="eval/watch/x_mean"):
        Best(KeepBestConfig(metric="eval/watch/x_mean")).consider(0, ev(0.1))


def test_the_record_round_trips_through_json_exactly():
    best = Best(KeepBestConfig())
    best.consider(0, ev(0.1, 0.2, 1 / 3))
    best.consider(1, ev(0.4, 0.5, 0.6))
    again = Best.resumed(KeepBestConfig(), json.loads(json.dumps(best.state())))
    assert again == best
    assert again.consider(2, ev(0.9, 0.9, 0.9)) == best.consider(2, ev(0.9, 0.9, 0.9))
