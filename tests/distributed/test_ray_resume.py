"""``runner: ray`` survives a ``kill -9`` of its driver: ``train.resume=latest`` loads the
checkpoint into every FSDP2 rank's shards and the engines, and the run ends where the
uninterrupted Ray run ends."""

from __future__ import annotations

import os
import signal
import time

from tests.conftest import ROOT
from tests.integration.test_crash_safety import assert_same, run, state

RAY = {
    "runner": "ray",
    "ray.num_engines": 1,
    "ray.num_trainer_ranks": 2,
    "train.keep_last": "null",
}


def _ray_processes() -> set[int]:
    """PIDs of Ray's processes that hold work (raylet, GCS, the actors' workers) on this machine.
    Ray's two agent processes (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are left out:
    they poll for their raylet and exit on their own, measured here 1-2 minutes after it."""
    found = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ")
        except OSError:
            continue
        if b"Agent" in cmd:
            continue
        if b"raylet" in cmd or b"gcs_server" in cmd or b"ray::" in cmd or b"default_worker.py" in cmd:
            found.add(int(pid))
    return found


def test_kill_9_of_the_ray_driver_then_resume_latest(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the reward workers import the test's reward
    before = _ray_processes()
    whole = run(tmp_path / "whole", runner=RAY)
    assert whole.returncode == 0, whole.stderr

    out = tmp_path / "run"
    killed = run(out, "kill-dispatch", 3, runner=RAY)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the driver's local Ray cluster goes with it
    deadline = time.time() + 30
    while _ray_processes() - before and time.time() < deadline:
        time.sleep(0.5)
    assert not _ray_processes() - before

    resumed = run(out, "none", 0, "train.resume=latest", runner=RAY)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed from {out / 'checkpoints' / 'step_00002'} at iteration 2" in resumed.stdout
    assert_same(state(out), state(tmp_path / "whole"))
