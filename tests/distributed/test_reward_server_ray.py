"""The reward server deployed as a Ray actor (:mod:`diffrl.distributed.ray.reward_server`): it
reports its URL, the ``remote`` reward scores through it exactly as in-process, and it ends on
``stop``."""

from __future__ import annotations

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.core.errors import DiffrlError
from diffrl.distributed.ray.reward_server import start_reward_server
from diffrl.rewards.base import RewardSet

ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")

REWARD = "tests.rewards:pixel_sum"
TOKEN_ENV = "DIFFRL_TEST_RAY_REWARD_TOKEN"


def test_a_reward_server_actor_serves_the_remote_reward(ray_cluster, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "ray-token")
    server = start_reward_server(REWARD, token="ray-token", host="127.0.0.1", num_cpus=1)
    try:
        assert server.url.startswith("http://127.0.0.1:")
        images = torch.randint(
            0, 256, (3, 3, 8, 12), generator=torch.Generator().manual_seed(0), dtype=torch.uint8
        )
        prompts, meta = ["a", "b", "c"], [{}, {}, {}]
        params = {"url": server.url, "token_env": TOKEN_ENV, "retries": 0}
        far = RewardSet([RewardConfig(name="remote", params=params)])
        out = far(images, prompts, meta)
        far.close()
        local = RewardSet([RewardConfig(name=REWARD)])(images, prompts, meta)
        assert torch.equal(out.total, local.total)
    finally:
        server.stop()
    with pytest.raises(DiffrlError, match="the reward server actor at .* died"):  # stop ended it
        server.wait(poll_s=0.1)


def test_a_reward_that_cannot_load_is_a_clear_error(ray_cluster):
    with pytest.raises(
        DiffrlError,
        match=r"^reward 'tests.rewards:pixel_sum'.*: unknown param 'nope'",
    ):
        start_reward_server(REWARD, {"nope": 1}, host="127.0.0.1")
    with pytest.raises(DiffrlError, match="binds its Ray node's address, and the server has no token"):
        start_reward_server(REWARD)  # the node's address without a token
