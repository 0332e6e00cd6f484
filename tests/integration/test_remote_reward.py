"""Flow-GRPO scored by a ``diffrl serve-reward`` process through the ``remote`` reward: the same
rewards as in-process, a token the server insists on, and a server killed mid-iteration failing
only the samples it owed (counted) while the run goes on to the end."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.launch import train
from diffrl.rewards.base import RewardSet
from tests.conftest import ROOT
from tests.integration.hanging_reward import HANG_AT_ENV, MARKER_ENV
from tests.integration.test_flow_grpo import grpo

REWARD = "tests.integration.hanging_reward:brightness_until_killed"
TOKEN_ENV = "DIFFRL_TEST_REMOTE_TOKEN"
ITERATIONS = 3
HANG_AT = 2 * ITERATIONS  # two micro-groups per iteration: the last iteration's second one


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A ``diffrl serve-reward`` process with a token, on a free loopback port: (process, url,
    the marker file its reward writes when it hangs)."""
    marker = tmp_path / "hanging"
    monkeypatch.setenv(TOKEN_ENV, "integration-token")
    env = {**os.environ, "PYTHONPATH": str(ROOT), HANG_AT_ENV: str(HANG_AT), MARKER_ENV: str(marker)}
    command = [sys.executable, "-m", "diffrl.cli", "serve-reward", "--reward", REWARD, "--port", "0"]
    command += ["--max-timeout-s", "600", "--max-image-pixels", "1e6"]  # the limit flags reach the server
    proc = subprocess.Popen(
        [*command, "--token-env", TOKEN_ENV], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
    )
    watchdog = threading.Timer(120, proc.kill)  # a server that never starts must not hang the test
    watchdog.start()
    try:
        line = proc.stdout.readline()  # printed once it serves
        found = re.search(r" at (http://\S+) ", line)
        assert found, f"the server printed {line!r} (exit code {proc.poll()})"
        yield proc, found.group(1), marker
    finally:
        watchdog.cancel()
        proc.kill()
        proc.wait(30)


def health(url: str) -> dict:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/health")
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def reward_rows(history: list[dict], label: str) -> list[dict]:
    """The reward metrics of each iteration, the reward's own under ``reward/`` (its label differs:
    ``remote`` on one side, the function's path on the other)."""
    own = f"rollout/reward/{label}/"
    return [
        {k.replace(own, "rollout/reward/REWARD/"): v for k, v in m.items() if k.startswith("rollout/reward")}
        for m in history
    ]


def test_flow_grpo_through_a_reward_server_process(tmp_path, server):
    proc, url, marker = server
    assert health(url) == {
        "status": "ok",
        "reward": REWARD,
        "token_required": True,
        "max_request_mb": 64.0,
        "max_timeout_s": 600.0,
        "max_image_pixels": 1_000_000,
        "max_request_pixels": 64 * 2**20 // 3,
        "max_aspect_ratio": 64.0,
        "audio": False,
    }

    # no token: refused (401), and the client says the server wants one; the reward never ran
    no_token = RewardSet([RewardConfig(name="remote", params={"url": url, "retries": 0})])
    out = no_token.submit(torch.zeros(2, 3, 8, 8, dtype=torch.uint8), ["a", "b"], [{}, {}]).result()
    no_token.close()
    assert out.total.isnan().all() and "HTTP 401" in out.errors[0] and "needs a token" in out.errors[0]

    def kill_when_hanging():
        while not marker.exists() and proc.poll() is None:
            time.sleep(0.05)
        proc.kill()

    killer = threading.Thread(target=kill_when_hanging, daemon=True)
    killer.start()
    params = f"{{url: '{url}', token_env: {TOKEN_ENV}, retries: 2, backoff_s: 0.05, timeout_s: 30}}"
    settings = {"train.iterations": ITERATIONS}
    with pytest.warns(UserWarning, match="dropped"):
        far = train(grpo(tmp_path / "remote", rewards=f"[{{name: remote, params: {params}}}]", **settings))
    killer.join(30)
    near = train(grpo(tmp_path / "local", rewards=f"[{{name: {REWARD}}}]", **settings))

    remote_rows, local_rows = reward_rows(far.history, "remote"), reward_rows(near.history, REWARD)
    assert len(far.history) == ITERATIONS and proc.poll() is not None  # killed, and the run went on
    # before the kill: the same rewards to the last bit (the same pixels reach the same function),
    # so the same update too
    before = ITERATIONS - 1
    assert remote_rows[:before] == local_rows[:before]
    assert all(row["rollout/reward_failed"] == 0 for row in remote_rows[:before])
    assert [m["train/loss"] for m in far.history[:before]] == [m["train/loss"] for m in near.history[:before]]
    # the last iteration: its first micro-group was scored, the second's server died under it
    assert remote_rows[-1]["rollout/reward_failed"] == 4 and local_rows[-1]["rollout/reward_failed"] == 0
