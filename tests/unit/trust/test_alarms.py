"""The reward-hacking alarm and the watch curves' paired gains (diffrl/trust/alarms.py), on
hand-made per-sample scores: it fires only when the total rose by more than k paired SE while a
watched reward fell by more than k paired SE and more than ``min_drop``, against the base and the
eval ``window`` evals back, and its state survives a checkpoint."""

import json
import math

import pytest
import torch

from diffrl.config.schema import WatchAlarmConfig
from diffrl.preflight import schema
from diffrl.trust import alarms
from diffrl.trust.alarms import ALARM_METRIC, TOTAL, Watch, paired

W = "eval/watch/aesthetic_mean"


def scores(total, watched):
    return {TOTAL: torch.tensor(total, dtype=torch.float32), W: torch.tensor(watched, dtype=torch.float32)}


def test_paired_leaves_out_failed_samples_and_has_no_se_for_one_pair():
    mean, se, n = paired(torch.tensor([1.0, 2.0, float("nan"), 4.0]), torch.tensor([0.0, 1.0, 5.0, 2.0]))
    assert n == 3 and mean == pytest.approx(4 / 3)
    assert se == pytest.approx(torch.tensor([1.0, 1.0, 2.0], dtype=torch.float64).std().item() / 3**0.5)
    assert math.isnan(paired(torch.tensor([1.0]), torch.tensor([0.0]))[1])


def test_fires_when_the_total_rises_and_a_watched_reward_falls_beyond_k_se():
    watch = Watch(WatchAlarmConfig(k_se=2.0, window=1))
    assert watch.observe(0, scores([0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]))[1] == []
    # watched falls by 0.5 with a paired SE of 0.5/sqrt(4)*std([.4,.6,.5,.5]): far beyond 2 SE
    metrics, alarms = watch.observe(2, scores([0.1, 0.1, 0.1, 0.1], [0.6, 0.4, 0.5, 0.5]))
    assert [a.watched for a in alarms] == ["aesthetic"] and alarms[0].since == 0
    assert metrics[ALARM_METRIC] == 1.0
    assert metrics["eval/watch/aesthetic_gain"] == pytest.approx(-0.5)
    assert metrics["eval/reward_gain"] == pytest.approx(0.1, abs=1e-6)
    line = alarms[0].message(WatchAlarmConfig(k_se=2.0))
    assert "aesthetic" in line and "iteration 2" in line and "min_drop 0.05" in line


@pytest.mark.parametrize(
    ("total", "watched"),
    [
        ([0.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]),  # the total did not rise
        ([0.1, 0.1, 0.1, 0.1], [1.2, 0.8, 1.0, 1.0]),  # the watched one did not fall
        ([0.1, 0.1, 0.1, 0.1], [1.5, 0.5, 1.0, 0.8]),  # fell 0.05 with an SE of ~0.2: noise
        ([0.1, 0.1, 0.1, 0.1], [0.97, 0.96, 0.97, 0.98]),  # fell 0.03, many SE, below min_drop 0.05
        ([0.3, -0.2, 0.2, -0.2], [0.6, 0.4, 0.5, 0.5]),  # the total's +0.025 is noise (SE ~0.13)
    ],
)
def test_stays_quiet_otherwise(total, watched):
    watch = Watch(WatchAlarmConfig(k_se=2.0, window=1))
    watch.observe(0, scores([0.0] * 4, [1.0] * 4))
    metrics, alarms = watch.observe(1, scores(total, watched))
    assert alarms == [] and metrics[ALARM_METRIC] == 0.0 and not watch.stop


def test_the_window_compares_with_the_eval_that_many_evals_back_and_stop_is_set():
    watch = Watch(WatchAlarmConfig(k_se=1.0, window=2, stop=True))
    watch.observe(0, scores([0.0] * 3, [1.0, 1.1, 0.9]))
    assert watch.observe(1, scores([1.0] * 3, [2.0, 2.1, 1.9]))[1] == []  # the watched one rose
    # fell 1.0 since step 1, but the window of 2 compares with step 0 (and the base is step 0): equal
    assert watch.observe(2, scores([2.0] * 3, [1.0, 1.1, 0.9]))[1] == [] and not watch.stop
    # against step 1 it fell 2.0, against the base 1.0: one alarm, the larger fall's
    _, alarms = watch.observe(3, scores([3.0] * 3, [0.0, 0.1, -0.1]))
    assert [(a.since, a.step, a.watched_gain) for a in alarms] == [(1, 3, pytest.approx(-2.0))]
    assert watch.stop


def test_a_slow_slide_fires_against_the_base():
    watch = Watch(WatchAlarmConfig(k_se=2.0, window=1))
    watch.observe(0, scores([0.0] * 4, [1.0, 0.9, 1.1, 1.0]))
    # 0.03 an eval: each step below min_drop (0.05) against the eval before it
    assert watch.observe(1, scores([0.1] * 4, [0.97, 0.87, 1.07, 0.97]))[1] == []
    _, alarms = watch.observe(2, scores([0.2] * 4, [0.94, 0.84, 1.04, 0.94]))
    assert [(a.since, a.watched_gain) for a in alarms] == [(0, pytest.approx(-0.06))]


def test_min_drop_is_the_floor():
    fall = scores([0.1] * 4, [0.97, 0.96, 0.97, 0.98])  # 0.03 below the base, many SE
    for floor, fires in [(0.05, False), (0.02, True), (0.0, True)]:
        watch = Watch(WatchAlarmConfig(k_se=2.0, min_drop=floor))
        watch.observe(0, scores([0.0] * 4, [1.0] * 4))
        assert bool(watch.observe(1, fall)[1]) is fires, floor


def test_its_state_round_trips_through_json_exactly():
    watch = Watch(WatchAlarmConfig(window=2))
    watch.observe(0, scores([0.1, float("nan"), 0.3], [0.5, 0.25, 1 / 3]))
    watch.observe(1, scores([0.2, 0.2, 0.4], [0.4, 0.2, 0.3]))
    again = Watch.resumed(WatchAlarmConfig(window=2), json.loads(json.dumps(watch.state())))
    later = scores([0.3, 0.3, 0.5], [0.1, 0.1, 0.1])
    assert again.state() == watch.state()
    assert again.observe(2, later) == watch.observe(2, later)


def test_the_pairing_cap_is_one_number_in_both_layers():
    assert schema.MAX_PAIRED == alarms.MAX_PAIRED
