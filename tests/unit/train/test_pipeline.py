"""The pipelined driver's rollout in flight (:mod:`diffrl.train.pipeline`) and the staleness each
sample carries (:func:`diffrl.train.gather.rollout_metrics`). The end-to-end behaviour (a Ray run
at ``train.off_policy_steps: 1``, killed and resumed bit for bit) is
``tests/distributed/test_ray_resume.py``."""

import threading

import pytest
import torch

from diffrl.core.errors import Abandoned
from diffrl.core.rollout import Conditioning, RolloutBatch, RolloutStats
from diffrl.train.gather import rollout_metrics
from diffrl.train.pipeline import RolloutAhead


def _part(group: int, n: int, version: int) -> RolloutBatch:
    return RolloutBatch(
        prompts=[""] * n,
        metadata=[{}] * n,
        prompt_index=torch.arange(n),
        sample_index=torch.zeros(n, dtype=torch.long),
        group_id=torch.arange(n),
        micro_group=torch.full((n,), group),
        x0=torch.zeros(n, 1),
        cond=Conditioning({"c": torch.zeros(n, 1)}),
        policy_version=torch.full((n,), version),
    )


class Engines:
    """A runner's rollout side: two micro-groups a rollout, drawn with ``version``, the second
    one held back until ``release`` is set (so a test sees the rollout still in flight)."""

    def __init__(self):
        self.version, self.drawn = 0, []
        self.release, self.stopped = threading.Event(), []

    def sample(self, iteration, should_stop=None):
        self.drawn.append((iteration, self.version))
        yield _part(1, 2, self.version)  # out of order: the rollout comes back in micro-group order
        while not self.release.wait(0.01):
            if should_stop():
                self.stopped.append(iteration)
                raise Abandoned
        yield _part(0, 3, self.version)

    def score(self, part):
        return None


def test_one_rollout_is_in_flight_at_a_time_and_comes_back_whole_and_in_order():
    engines = Engines()
    ahead = RolloutAhead(engines, lambda: False)
    try:
        engines.release.set()
        batch, stats, waited = ahead.take(0)  # nothing in flight: launched now, then awaited
        assert batch.micro_group.tolist() == [0, 0, 0, 1, 1] and waited >= 0
        engines.release.clear()
        ahead.launch(1)
        with pytest.raises(RuntimeError, match="rollout 1 is still in flight"):
            ahead.launch(2)
        with pytest.raises(RuntimeError, match="rollout 1 is in flight, and iteration 2 wants its own"):
            ahead.take(2)
        engines.release.set()
        batch, _, _ = ahead.take(1)
        assert engines.drawn == [(0, 0), (1, 0)] and len(batch) == 5 and ahead.pending is None
    finally:
        ahead.close()


def test_closing_stops_the_rollout_in_flight_and_a_stop_request_reaches_it():
    engines = Engines()
    ahead = RolloutAhead(engines, lambda: False)
    ahead.launch(0)
    ahead.close()  # an error or the time budget ended the run: the rollout is given up
    assert engines.stopped == [0] and ahead.pending is None

    stop = threading.Event()
    engines = Engines()
    ahead = RolloutAhead(engines, stop.is_set)
    try:
        ahead.launch(3)
        stop.set()  # SIGTERM while the ranks train: the rollout stops at its next micro-group
        with pytest.raises(Abandoned):
            ahead.take(3)
        assert engines.stopped == [3]
    finally:
        ahead.close()


def test_staleness_is_the_trainers_version_minus_each_samples():
    batch = RolloutBatch.cat([_part(0, 3, 4), _part(1, 1, 5)])
    metrics = rollout_metrics(batch, RolloutStats(), iteration=5)
    assert metrics["rollout/staleness_mean"] == 0.75 and metrics["rollout/staleness_max"] == 1.0
    batch.policy_version = None  # an offline dataset's samples carry no version
    assert "rollout/staleness_max" not in rollout_metrics(batch, RolloutStats(), iteration=5)
