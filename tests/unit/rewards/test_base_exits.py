"""A reward that ends the process, or tries to (``sys.exit``, ``KeyboardInterrupt``, any
``BaseException``, closing ``sys.stdout``), fails its own samples, named by its dotted path, as a
reward that raises an ``Exception`` does: the run's reward-failure policy decides what follows.
Wherever the reward runs: on its call thread, in its own ``submit`` (the caller's thread), in a
process pool's worker."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.core.errors import Abandoned
from diffrl.rewards.base import Pending, Reward, RewardSet
from diffrl.transport.workers import ProcessPool

IMAGES = torch.rand(2, 3, 8, 8)

# reward (in tests/rewards.py) -> what the error says it did
ENDINGS = {
    "exits_zero": "called sys.exit(0)",
    "exits_three": "called sys.exit(3)",
    "exits_with_a_message": "called sys.exit('scorer: bad flag')",
    "raises_keyboard_interrupt": "raised KeyboardInterrupt (no Ctrl-C was pressed)",
    "raises_generator_exit": "raised GeneratorExit",
    "raises_its_own_base_exception": "raised Custom: stop everything",
    "wraps_an_argparse_tool": "called sys.exit(2)",
}


def score(name: str, prompts=("a", "b")) -> tuple:
    rewards = RewardSet([RewardConfig(name, timeout_s=60.0)])
    try:
        return rewards.submit(IMAGES, list(prompts), [{}] * 2).result(), rewards
    finally:
        rewards.close()


@pytest.mark.parametrize("reward", sorted(ENDINGS))
def test_a_reward_that_ends_the_process_fails_its_samples_named(reward, capsys):
    out, _ = score(f"tests.rewards:{reward}")
    assert out.total.isnan().all() and not out.timed_out.any()
    assert out.errors == [f"reward 'tests.rewards:{reward}' {ENDINGS[reward]} (on prompts 'a', 'b')"]


def test_the_next_call_of_a_reward_that_exited_is_made_as_usual():
    rewards = RewardSet([RewardConfig("tests.rewards:exits_zero"), RewardConfig("tests.rewards:brightness")])
    try:
        for _ in range(2):  # its call thread lives on: the second call fails the same way
            out = rewards.submit(IMAGES, ["a", "b"], [{}] * 2).result()
            assert "called sys.exit(0)" in out.errors[0]
            torch.testing.assert_close(out.per_reward["tests.rewards:brightness"], IMAGES.mean(dim=(1, 2, 3)))
    finally:
        rewards.close()


class ExitsInSubmit(Reward):
    """A reward whose own ``submit`` (run on the caller's thread) exits."""

    def submit(self, images, prompts, metadata, timeout=None, audio=None) -> Pending:
        sys.exit(4)

    def __call__(self, images, prompts, metadata):
        return torch.ones(len(images))


class AbandonsInSubmit(ExitsInSubmit):
    def submit(self, images, prompts, metadata, timeout=None, audio=None) -> Pending:
        raise Abandoned  # diffrl's own stop signal passes through untouched


def test_an_exit_in_a_rewards_own_submit_fails_its_samples():
    out, _ = score(f"{__name__}:ExitsInSubmit")
    assert out.total.isnan().all()
    assert out.errors[0].startswith(f"reward '{__name__}:ExitsInSubmit' called sys.exit(4)")


def test_a_stop_signal_still_passes_a_rewards_submit():
    rewards = RewardSet([RewardConfig(f"{__name__}:AbandonsInSubmit")])
    try:
        with pytest.raises(Abandoned):
            rewards.submit(IMAGES, ["a", "b"], [{}] * 2)
    finally:
        rewards.close()


def test_closing_stdout_is_refused_and_named(capsys):
    from diffrl.cli import _unclosable_stdio

    with _unclosable_stdio():
        out, _ = score("tests.rewards:closes_stdout")
        print("still printing")
    assert "still printing" in capsys.readouterr().out
    assert out.errors[0].startswith(
        "reward 'tests.rewards:closes_stdout' raised PluginError: plugin 'tests.rewards:closes_stdout' "
        "(at rewards.py:"
    )
    assert "closed sys.stdout, which is the diffrl command's" in out.errors[0]


def test_a_pool_worker_that_exits_fails_its_job_and_the_pool_goes_on():
    pool = ProcessPool(1, name="exits")
    try:
        with pytest.raises(SystemExit) as exited:  # handed back as the job's error (then the reward's)
            pool.map(sys.exit, [(5,)], timeout=60).result()
        assert exited.value.code == 5
        assert pool.map(abs, [(-2,)], timeout=60).result() == [2]  # the same worker
        assert pool.restarts == 0
    finally:
        pool.close()


def test_a_pool_worker_that_os_exits_is_replaced():
    pool = ProcessPool(1, name="os-exits")
    try:
        with pytest.raises(Exception, match="terminated abruptly"):
            pool.map(os._exit, [(0,)], timeout=60).result()
        assert pool.map(abs, [(-2,)], timeout=60).result() == [2]
    finally:
        pool.close()
