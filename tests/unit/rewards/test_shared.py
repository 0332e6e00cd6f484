"""A process's rewards are built once per name and params (:class:`SharedRewards`) and shared by
the reward sets built from it (a run's training and eval rewards), started once and closed once;
the OCR pool's default size follows the cores this process may use and the memory available."""

from __future__ import annotations

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.rewards.base import Reward, RewardSet, SharedRewards
from diffrl.rewards.ocr import OCR_MAX_WORKERS, OCR_WORKER_BYTES, OCRReward
from diffrl.transport import workers


class Counted(Reward):
    """Scores each image's mean times ``scale``; counts what is done to its instances."""

    name = "counted"
    built: list[Counted] = []

    def __init__(self, scale: float = 1.0):
        self.scale = scale
        self.starts = self.closes = 0
        Counted.built.append(self)

    def __call__(self, images, prompts, metadata):
        return images.mean(dim=(1, 2, 3)) * self.scale

    def start(self) -> None:
        self.starts += 1

    def close(self) -> None:
        self.closes += 1


COUNTED = f"{__name__}:Counted"


def test_training_and_eval_sets_share_a_reward_with_the_same_name_and_params(monkeypatch):
    monkeypatch.setattr(Counted, "built", [])
    shared = SharedRewards()
    train = RewardSet([RewardConfig(COUNTED, weight=2.0, timeout_s=30)], shared=shared)
    evaluate = RewardSet(
        [RewardConfig(COUNTED, params={"scale": 3.0}), RewardConfig(COUNTED, timeout_s=60)], shared=shared
    )
    once, thrice = Counted.built
    assert train.rewards == [once] and evaluate.rewards == [thrice, once]
    assert [once.starts, thrice.starts] == [1, 1]
    images = torch.rand(2, 3, 4, 4)
    # weights and deadlines stay the set's own
    torch.testing.assert_close(train(images, ["a", "b"], [{}] * 2).total, 2 * images.mean(dim=(1, 2, 3)))
    torch.testing.assert_close(evaluate(images, ["a", "b"], [{}] * 2).total, 4 * images.mean(dim=(1, 2, 3)))
    train.close()
    evaluate.close()
    assert [once.closes, thrice.closes] == [0, 0]  # the sets do not close what they share
    shared.close()
    assert [once.closes, thrice.closes] == [1, 1]
    shared.close()
    assert [once.closes, thrice.closes] == [1, 1]  # closed once


def test_a_set_without_shared_rewards_builds_and_closes_its_own(monkeypatch):
    monkeypatch.setattr(Counted, "built", [])
    a, b = RewardSet([RewardConfig(COUNTED)]), RewardSet([RewardConfig(COUNTED)])
    assert len(Counted.built) == 2 and a.rewards[0] is not b.rewards[0]
    a.close()
    assert [r.closes for r in Counted.built] == [1, 0]
    b.close()


def affinity(monkeypatch, cores: int, memory: int | None = None) -> None:
    monkeypatch.setattr(workers.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(workers, "available_memory", lambda: memory)


@pytest.mark.parametrize(
    "cores, memory, expected",
    [
        (1, None, 1),  # one core: no pool, OCR in this process
        (2, None, 2),
        (3, 64 * 2**30, 3),
        (64, None, OCR_MAX_WORKERS),  # no more workers than there is work for
        (8, 3 * OCR_WORKER_BYTES * 2, 3),  # as many as fit in half the available memory
        (8, OCR_WORKER_BYTES, 1),  # not one fits: in this process
    ],
)
def test_the_ocr_pool_is_sized_to_the_usable_cores_and_memory(monkeypatch, cores, memory, expected):
    affinity(monkeypatch, cores, memory)
    monkeypatch.setattr(workers.os, "cpu_count", lambda: 128)  # the machine's: not what counts
    reward = OCRReward()
    assert reward.num_workers == expected
    assert reward._jobs(16) == (0 if expected == 1 else expected)  # 0: scored in this process


def test_an_explicit_num_workers_wins(monkeypatch):
    affinity(monkeypatch, 1, OCR_WORKER_BYTES)
    assert OCRReward(num_workers=3).num_workers == 3


def test_available_memory_is_read_on_linux():
    memory = workers.available_memory()
    assert memory is None or memory > 2**20
