"""``runner: ray`` survives a ``kill -9`` of its driver: ``train.resume=latest`` loads the
checkpoint into every FSDP2 rank's shards and the engines, and the run ends where the
uninterrupted Ray run ends.

Only the killed run is a process of its own (it starts its own local cluster, which must die
with it); the uninterrupted and the resumed run train in this process on the session's cluster
(``ray_cluster``), so the resumed run also shows that a run's results do not depend on the
cluster that ran it."""

from __future__ import annotations

import json
import signal
import time

import pytest

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import ROOT
from tests.integration.test_crash_safety import RECIPE, SETTINGS, assert_same, run, state

RAY = {
    "runner": "ray",
    "parallel.engines": 1,
    "parallel.trainer_ranks": 2,
    "train.keep_last": "null",
    "train.iterations": 4,
}


def train_here(out, *extra: str, runner: dict = RAY):
    """The run ``crash_driver`` would start (its settings, into ``out``), in this process."""
    settings = {**SETTINGS, **runner, "run.output_dir": str(out)}
    overrides = [f"{k}={v}" for k, v in settings.items()] + list(extra)
    return train(load_config(str(ROOT / RECIPE), overrides))


def _alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in open(f"/proc/{pid}/status").read()
    except OSError:
        return False


@pytest.mark.parametrize(
    "off_policy_steps",
    [
        # (both in the slow tier: ~100 s each on 2 cores; tests/integration/test_crash_safety.py
        # holds kill -9 and resume in the default run)
        # pipelined: the driver dies while rollout 3 is drawn in the background during iteration 2's
        # update; the checkpoint of step 2 holds the weights that drew rollout 2 (one update old)
        pytest.param(1, marks=pytest.mark.slow),
        # synchronous: the same code but for the rollout weights (the local runner's crash tests
        # cover the synchronous resume in the default run)
        pytest.param(0, marks=pytest.mark.slow),
    ],
)
def test_kill_9_of_the_ray_driver_then_resume_latest(
    off_policy_steps, tmp_path, monkeypatch, capsys, ray_cluster
):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the reward workers import the test's reward
    monkeypatch.setenv("CRASH_PIDS_FILE", str(tmp_path / "pids.json"))
    ray = {**RAY, "train.off_policy_steps": off_policy_steps}
    whole = train_here(tmp_path / "whole", runner=ray)
    staleness = [row["rollout/staleness_max"] for row in whole.history]
    assert staleness == [0.0] + [float(off_policy_steps)] * (len(staleness) - 1)

    out = tmp_path / "run"
    killed = run(out, "kill-dispatch", 3, runner=ray)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the driver's local Ray cluster goes with it: GCS, raylet, the engine, ranks and reward
    # workers. Ray's two agents (DashboardAgent, RuntimeEnvAgent) are left out: they poll for
    # their raylet and exit on their own, measured here 1-2 minutes after it.
    below = json.loads((tmp_path / "pids.json").read_text())
    work = [int(p) for p, cmd in below.items() if "Agent" not in cmd]
    assert any("raylet" in cmd for cmd in below.values()) and len(work) >= 4
    deadline = time.time() + 30
    while any(_alive(p) for p in work) and time.time() < deadline:
        time.sleep(0.5)
    assert not [below[str(p)] for p in work if _alive(p)]

    capsys.readouterr()
    train_here(out, "train.resume=latest", runner=ray)
    assert f"resumed from {out / 'checkpoints' / 'step_00002'} at iteration 2" in capsys.readouterr().out
    assert_same(state(out), state(tmp_path / "whole"))
