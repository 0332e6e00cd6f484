"""The run's trust as one object (diffrl/trust/trust.py): what an eval decides (watch gains, the
alarm and its stop, keep-best) and what a checkpoint keeps of it, on hand-made evals."""

import json
import warnings

import torch

from diffrl.config import Config, RewardConfig
from diffrl.config.schema import KeepBestConfig, WatchAlarmConfig
from diffrl.evaluation.evaluate import EvalResult
from diffrl.trust.trust import Trust


def result(total: list[float], watched: list[float] | None = None) -> EvalResult:
    n = len(total)
    watch = {"judge": torch.tensor(watched)} if watched is not None else {}
    return EvalResult([""] * n, torch.zeros(n, 3, 2, 2), total=torch.tensor(total), watch=watch)


def config(**train) -> Config:
    c = Config()
    c.eval.rewards = [RewardConfig("ocr")]
    c.eval.watch = [RewardConfig("ocr")]
    c.eval.watch_alarm = WatchAlarmConfig(k_se=2.0, stop=True)
    if train:
        c.train.keep_best = KeepBestConfig(**train)
    return c


def test_an_eval_moves_the_best_only_on_a_paired_win_and_its_metrics_join_the_eval():
    trust = Trust(config(every=1))
    first = result([0.1, 0.1, 0.1, 0.1])
    assert not trust.after_eval(0, first).moved  # the base: the first best, no checkpoint
    better = result([0.3, 0.2, 0.3, 0.2])
    verdict = trust.after_eval(1, better)
    assert verdict.moved and verdict.metrics["keep_best/iteration"] == 1.0
    assert better.extra["eval/reward_gain"] == verdict.metrics["eval/reward_gain"] > 0
    assert not trust.after_eval(2, result([0.3, 0.2, 0.3, 0.2])).moved  # equal: kept
    assert trust.eval_due(5) and not trust.stop


def test_the_alarm_warns_and_asks_the_run_to_stop():
    trust = Trust(config())
    trust.after_eval(0, result([0.1, 0.2, 0.1, 0.2], [0.5, 0.6, 0.5, 0.6]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        verdict = trust.after_eval(1, result([0.4, 0.5, 0.4, 0.5], [0.1, 0.1, 0.1, 0.1]))
    assert verdict.metrics["alarm/reward_hacking"] == 1.0 and trust.stop
    assert any("reward" in str(w.message) for w in caught)


def test_the_state_a_checkpoint_keeps_resumes_the_same_decisions():
    trust = Trust(config(every=1))
    trust.after_eval(0, result([0.1, 0.1, 0.1, 0.1], [0.5, 0.5, 0.5, 0.5]))
    trust.base_spread = 42.0
    trust.guard.failed_in_a_row = 1
    saved = json.loads(json.dumps(trust.state()))  # as checkpoint.json holds it
    assert list(saved) == ["guard", "base_spread", "watch", "best"]  # the keys checkpoints have had
    again = Trust(config(every=1), saved)
    assert json.loads(json.dumps(again.state())) == saved
    later = result([0.3, 0.2, 0.3, 0.2], [0.5, 0.5, 0.5, 0.5])
    assert trust.after_eval(1, later).metrics == again.after_eval(1, later).metrics
    fresh = Trust(config())
    assert fresh.base_spread is None and "best" not in fresh.state()
