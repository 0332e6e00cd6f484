"""Every reward call has a deadline (``rewards[].timeout_s``, counted from submit): a reward that
never returns fails its samples (NaN, "timed out", counted) and the run goes on.

The hung calls wait on :data:`RELEASE`, set after each test, so that no thread stays stuck for
the rest of the session. Deadlines are short (0.5-1 s); the only timing checks are generous bounds
(a few seconds) on how long a wait for a hung reward may take.
"""

from __future__ import annotations

import itertools
import threading
import time

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.core.registry import RegistryError
from diffrl.rewards.base import Pending, Reward, RewardSet
from diffrl.transport.workers import CallThread
from tests.conftest import SMALL_ROLLOUT, tiny_overrides

HERE = "tests.unit.rewards.test_deadlines"
RELEASE = threading.Event()
CALLS = itertools.count()


@pytest.fixture(autouse=True)
def _release_hung_calls():
    global CALLS, RELEASE
    CALLS, RELEASE = itertools.count(), threading.Event()
    yield
    RELEASE.set()


def brightness(images, prompts, metadata):
    return images.mean(dim=(1, 2, 3)).tolist()


def never_returns(images, prompts, metadata):
    RELEASE.wait()
    return [0.0] * len(images)


def hangs_on_hang_prompts(images, prompts, metadata):
    if "hang" in prompts[0]:
        RELEASE.wait()
    return [1.0] * len(images)


def takes_half_a_second(images, prompts, metadata):
    time.sleep(0.5)
    return [2.0] * len(images)


def hangs_on_second_call(images, prompts, metadata):
    if next(CALLS) == 1:
        RELEASE.wait()
    return [1.0] * len(images)


def raises_timeout_error(images, prompts, metadata):
    raise TimeoutError("the judge server did not answer")


def reward_set(*rewards: tuple[str, float]) -> RewardSet:
    return RewardSet([RewardConfig(f"{HERE}:{name}", timeout_s=t) for name, t in rewards])


def test_a_reward_that_never_returns_fails_its_samples_at_the_deadline_and_the_others_score():
    rewards = reward_set(("never_returns", 0.5), ("brightness", 30.0))
    images = torch.rand(3, 3, 8, 8)
    start = time.monotonic()
    out = rewards.submit(images, ["a", "b", "c"], [{}] * 3).result()
    assert time.monotonic() - start < 10  # 0.5 s deadline; generous for a loaded machine
    assert out.total.isnan().all() and out.per_reward[f"{HERE}:never_returns"].isnan().all()
    torch.testing.assert_close(out.per_reward[f"{HERE}:brightness"], images.mean(dim=(1, 2, 3)))
    assert out.timed_out.all()
    assert out.errors == [
        f"reward '{HERE}:never_returns' timed out after 0.5 s (counted from submit); if it is slow "
        "rather than stuck, raise its timeout_s or give it more workers (on prompts 'a', 'b', 'c')"
    ]
    rewards.close()


def test_a_hung_call_does_not_hold_up_the_same_rewards_next_calls():
    """A reward's calls run one at a time; the hung one is failed when its deadline passes (not
    when someone waits for it) and the call queued behind it runs then, within its own deadline."""
    rewards = reward_set(("hangs_on_hang_prompts", 2.0))
    images = torch.rand(2, 3, 8, 8)
    hung = rewards.submit(images, ["hang", "hang"], [{}] * 2)
    time.sleep(1.0)  # sampling the next micro-group
    queued = rewards.submit(images, ["ok", "ok"], [{}] * 2)  # starts at the first one's deadline
    out = queued.result()  # waited for first: the hung call is failed without anyone waiting for it
    assert out.errors == [] and out.total.tolist() == [1.0, 1.0] and not out.timed_out.any()
    assert hung.result().timed_out.all()
    out = rewards.submit(images, ["ok", "ok"], [{}] * 2).result()
    assert out.errors == [] and out.total.tolist() == [1.0, 1.0]
    rewards.close()


def test_the_deadline_counts_from_submit_not_from_the_wait():
    """What the collector does: submit while sampling, wait at the end. A call that finished within
    its deadline counts however late the wait; a hung one costs no fresh deadline at the wait."""
    rewards = reward_set(("takes_half_a_second", 1.0))
    images = torch.rand(2, 3, 8, 8)
    done_in_time = rewards.submit(images, ["a", "b"], [{}] * 2)
    time.sleep(1.5)  # "sampling" past the deadline
    out = done_in_time.result()
    assert out.errors == [] and out.total.tolist() == [2.0, 2.0]

    rewards = reward_set(("never_returns", 1.0))
    hung = rewards.submit(images, ["a", "b"], [{}] * 2)
    time.sleep(1.5)
    start = time.monotonic()
    assert hung.result().timed_out.all()
    assert time.monotonic() - start < 1.0  # the deadline had passed: no second one at the wait
    rewards.close()


def test_a_timeout_error_raised_by_the_reward_is_its_error_not_a_missed_deadline():
    out = reward_set(("raises_timeout_error", 30.0)).submit(torch.rand(1, 3, 8, 8), ["a"], [{}]).result()
    assert out.total.isnan().all() and not out.timed_out.any()
    assert out.errors == [
        f"reward '{HERE}:raises_timeout_error' raised TimeoutError: the judge server did not answer "
        "(on prompts 'a')"
    ]


def test_scoring_now_raises_on_a_missed_deadline():
    from diffrl.rewards.base import RewardError

    with pytest.raises(RewardError, match="timed out after 0.5 s"):
        reward_set(("never_returns", 0.5))(torch.rand(1, 3, 8, 8), ["a"], [{}])


def test_the_collector_counts_the_samples_a_hung_reward_failed(tmp_path):
    """Two micro-groups of 4; the reward hangs on the second: those 4 samples fail, are counted
    as failed and as timed out, and the first micro-group keeps its scores."""
    from diffrl.algorithms.registry import build_algorithm
    from diffrl.data.prompts import load_prompts
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.sampling.collector import OnlineCollector
    from diffrl.train.gather import Rollout, rollout_metrics

    overrides = {
        **SMALL_ROLLOUT,
        "sampling.num_steps": 2,
        "eval.enabled": "false",
        "rewards": f"[{{name: {HERE}:hangs_on_second_call, timeout_s: 1.0}}]",
    }
    cfg = load_config("recipes/tiny_nft_ocr.yaml", tiny_overrides(tmp_path, **overrides))
    rewards = RewardSet(cfg.rewards)
    try:
        collector = OnlineCollector(
            cfg, load_family(cfg), build_algorithm(cfg).collection_spec(), load_prompts(cfg.data.prompts)
        )
        rollout = Rollout()  # as the driver: each micro-group is submitted as it is sampled
        for part in collector.micro_groups(0):
            rollout.add(part, rewards.submit(part.images, part.prompts, part.metadata))
        batch, stats = rollout.finish()
    finally:
        rewards.close()
    assert batch.rewards[:4].tolist() == [1.0] * 4 and batch.rewards[4:].isnan().all()
    assert stats.reward_failed == 4 and stats.metrics["rollout/reward_timed_out"] == 4.0
    assert "timed out after 1 s" in stats.errors[0]
    with pytest.warns(
        UserWarning, match="4 of them missed a reward's deadline .* does not reproduce bit for bit"
    ):
        rollout_metrics(batch, stats, 0)


class OldStyleSubmit(Reward):
    """A reward written before deadlines: its submit takes no timeout."""

    def __call__(self, images, prompts, metadata):
        return torch.zeros(len(images))

    def submit(self, images, prompts, metadata):
        return Pending(lambda: self(images, prompts, metadata))


def test_a_submit_without_a_timeout_is_refused_with_the_signature_to_write():
    with pytest.raises(RegistryError, match=r"submit\(self, images, prompts, metadata, timeout=None\)"):
        RewardSet([RewardConfig(f"{HERE}:OldStyleSubmit")])


def _new_threads(before: set[threading.Thread], name: str) -> set[str]:
    return {
        t.name
        for t in threading.enumerate()
        if t not in before and t.name.startswith(f"reward-{HERE}:{name}")
    }


def test_close_waits_for_the_threads_of_finished_calls_and_leaves_a_hung_one(monkeypatch):
    """A daemon thread still unwinding a finished call when the interpreter finalizes aborts the
    process inside torch (pytorch/pytorch#38228); close() must not return before such threads end.
    A call stuck past its deadline cannot be ended and must not hold close() up."""
    monkeypatch.setattr(CallThread, "JOIN_S", 60.0)  # waiting for the hung thread would take all of it
    before = set(threading.enumerate())  # other tests' hung calls may still be around
    images = torch.rand(2, 3, 8, 8)
    rewards = reward_set(("brightness", 30.0), ("never_returns", 0.3))
    for _ in range(3):
        rewards.submit(images, ["a", "b"], [{}] * 2).result()
    assert _new_threads(before, "brightness")  # the lane thread at least, until close
    start = time.monotonic()
    rewards.close()
    assert time.monotonic() - start < 30.0  # the hung thread was not waited for
    assert _new_threads(before, "brightness") == set()
    # the hung calls' threads are left; the lane ended
    assert _new_threads(before, "never_returns") == {f"reward-{HERE}:never_returns-call"}
