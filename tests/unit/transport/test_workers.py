"""Reward worker processes: a job that hangs is failed at its deadline and the pool works again,
a worker that dies is replaced, and no worker outlives the process that started it (``kill -9``
and SIGTERM included) or :meth:`ProcessPool.close`.

The pool's jobs live in :mod:`tests.unit.transport.pool_jobs` (spawned workers import them; no torch there,
so a worker starts quickly). Linux only where a test reads ``/proc``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
import torch

from diffrl.config import RewardConfig
from diffrl.rewards.base import Pending, Reward, RewardSet, SharedRewards
from diffrl.transport.workers import DeadlineExceeded, ProcessPool
from tests.conftest import ROOT
from tests.unit.transport import pool_jobs

linux_only = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")


def gone(pid: int) -> bool:
    """True once ``pid`` has exited: no such process, or a zombie (dead, not yet reaped)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True
    return any(line.split()[1:2] == ["Z"] for line in status.splitlines() if line.startswith("State:"))


def wait_gone(pids: Sequence[int], within: float = 10.0) -> list[int]:
    """The ``pids`` still alive after ``within`` seconds (polled)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        alive = [p for p in pids if not gone(p)]
        if not alive:
            return []
        time.sleep(0.1)
    return alive


def wait_for(path: Path, within: float = 60.0) -> None:
    """Until ``path`` exists (a job's marker: the job is running)."""
    end = time.monotonic() + within
    while not path.exists():
        assert time.monotonic() < end, f"{path.name} never appeared"
        time.sleep(0.01)


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:  # field 4, after "(comm)" and the state
                out.append(int(entry.name))
    return out


def test_a_hung_job_fails_at_its_deadline_and_the_pool_works_again(tmp_path):
    pool = ProcessPool(2, name="test")
    try:
        [first] = pool.map(pool_jobs.pid, [()]).result()  # workers up (no deadline yet)
        innocent = pool.map(pool_jobs.square_when_told, [(3.0, str(tmp_path))], timeout=60)
        wait_for(tmp_path / "running")
        hung = pool.map(pool_jobs.hang, [()], timeout=1.0)
        start = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            hung.result()
        assert time.monotonic() - start < 10  # a 1 s deadline; generous for a loaded machine
        assert pool.restarts == 1
        assert wait_gone([first]) == []  # the old workers were killed, the stuck one with them
        (tmp_path / "go").touch()
        assert innocent.result() == [9.0]  # in flight when the workers were killed: re-sent
        assert pool.map(pool_jobs.square_after, [(2.0, 0.0), (4.0, 0.0)], timeout=60).result() == [4.0, 16.0]
    finally:
        pool.close()


def test_a_deadline_is_enforced_without_a_wait():
    """The overdue call's timer restarts the pool: a hung job does not hold its worker until
    someone waits for it."""
    pool = ProcessPool(1, name="test")
    try:
        [worker] = pool.map(pool_jobs.pid, [()]).result()
        pool.map(pool_jobs.hang, [()], timeout=0.5)  # never waited for
        assert wait_gone([worker]) == []
        assert pool.map(pool_jobs.square_after, [(5.0, 0.0)], timeout=60).result() == [25.0]
    finally:
        pool.close()


@linux_only
def test_a_worker_killed_from_outside_is_replaced_and_its_job_re_sent(tmp_path):
    pool = ProcessPool(1, name="test")
    try:
        [worker] = pool.map(pool_jobs.pid, [()]).result()
        call = pool.map(pool_jobs.square_when_told, [(3.0, str(tmp_path))], timeout=60)
        wait_for(tmp_path / "running")  # running on the one worker
        os.kill(worker, signal.SIGKILL)
        assert wait_gone([worker]) == []
        (tmp_path / "go").touch()  # the re-sent job returns at once
        assert call.result() == [9.0]
        assert pool.restarts == 1
    finally:
        pool.close()


def pool_workers() -> list[int]:
    """This process's children that are multiprocessing workers (not its resource tracker); a
    child that exits while they are listed (another test's) is not one."""
    return [p for p in children(os.getpid()) if b"spawn_main" in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return b""


@linux_only
def test_close_ends_the_workers_even_with_a_job_stuck():
    before = set(pool_workers())
    pool = ProcessPool(2, name="test")
    pool.map(pool_jobs.square_after, [(1.0, 0.0), (2.0, 0.0)]).result()  # two jobs: two workers
    pool.map(pool_jobs.hang, [()])  # no deadline
    workers = sorted(set(pool_workers()) - before)
    assert len(workers) == 2
    pool.close()
    assert wait_gone(workers) == []


class StuckOnRequest(Reward):
    """A reward that scores in a worker pool as OCR does, and hangs on prompts saying "stuck"."""

    name = "stuck_on_request"

    def __init__(self) -> None:
        self.pool = ProcessPool(2, name="stuck")

    def __call__(self, images, prompts, metadata):
        return self.submit(images, prompts, metadata).result()

    def submit(self, images, prompts: Sequence[str], metadata, timeout: float | None = None) -> Pending:
        values = images.mean(dim=(1, 2, 3)).tolist()
        call = self.pool.map(pool_jobs.scores, [(values, "stuck" in prompts[0])], timeout)
        return Pending(lambda: call.result()[0])

    def close(self) -> None:
        self.pool.close()


def test_a_pool_reward_that_hangs_fails_its_samples_and_scores_the_next_call():
    rewards = RewardSet(
        [RewardConfig("tests.unit.transport.test_workers:StuckOnRequest", timeout_s=1.0)],
    )
    images = torch.rand(2, 3, 8, 8)
    try:
        out = rewards.submit(images, ["stuck", "stuck"], [{}] * 2).result()
        assert out.total.isnan().all() and out.timed_out.all()
        assert out.errors[0].startswith(
            "reward 'tests.unit.transport.test_workers:StuckOnRequest' timed out after 1 s"
        )
        out = rewards.submit(images, ["fine", "fine"], [{}] * 2).result()
        torch.testing.assert_close(out.total, images.mean(dim=(1, 2, 3)))
        assert out.errors == [] and not out.timed_out.any()
    finally:
        rewards.close()


class Pooled(Reward):
    """A pool reward started in the background as OCR's is; it hangs on prompts saying "stuck"
    and its worker exits on prompts saying "crash"."""

    name = "pooled"

    def __init__(self) -> None:
        self.pool = ProcessPool(2, name="pooled")

    def __call__(self, images, prompts, metadata):
        return self.submit(images, prompts, metadata).result()

    def start(self) -> None:
        self.pool.start()

    def submit(self, images, prompts: Sequence[str], metadata, timeout: float | None = None) -> Pending:
        values = images.mean(dim=(1, 2, 3)).tolist()
        if "stuck" in prompts[0]:
            call = self.pool.map(pool_jobs.scores, [(values, True)], timeout)
        else:
            call = self.pool.map(pool_jobs.scores_or_die, [(values, "crash" in prompts[0])], timeout)
        return Pending(lambda: call.result()[0])

    def close(self) -> None:
        self.pool.close()


@linux_only
def test_a_pool_shared_by_training_and_eval_fails_a_hung_or_crashed_call_and_scores_the_next():
    before = set(pool_workers())
    shared = SharedRewards()
    pooled = f"{__name__}:Pooled"
    train = RewardSet([RewardConfig(pooled, timeout_s=1.0)], shared=shared)
    evaluate = RewardSet([RewardConfig(pooled, timeout_s=60.0)], shared=shared)
    [reward] = train.rewards
    images = torch.rand(2, 3, 8, 8)
    try:
        assert evaluate.rewards == [reward] and reward.pool.starts == 1  # started once, when built
        out = train.submit(images, ["stuck"] * 2, [{}] * 2).result()
        assert out.total.isnan().all() and out.timed_out.all() and "timed out after 1 s" in out.errors[0]
        out = evaluate.submit(images, ["fine"] * 2, [{}] * 2).result()  # the same pool, restarted
        torch.testing.assert_close(out.total, images.mean(dim=(1, 2, 3)))
        out = evaluate.submit(images, ["crash"] * 2, [{}] * 2).result()  # re-sent, then failed
        assert out.total.isnan().all() and not out.timed_out.any()
        assert "reward 'tests.unit.transport.test_workers:Pooled' raised BrokenProcessPool" in out.errors[0]
        out = train.submit(images, ["fine"] * 2, [{}] * 2).result()
        torch.testing.assert_close(out.total, images.mean(dim=(1, 2, 3)))
        assert reward.pool.restarts >= 2
        workers = sorted(set(pool_workers()) - before)
        assert 1 <= len(workers) <= 2
    finally:
        train.close()
        evaluate.close()
        shared.close()
    assert wait_gone(workers) == []


# ------------------------------------------------------------------------------------------------
# No orphans
# ------------------------------------------------------------------------------------------------

OCR_PARENT = """
import os, sys, time
from pathlib import Path
import torch
from diffrl.rewards.ocr import OCRReward
from tests.unit.transport.test_workers import children

reward = OCRReward(num_workers=2)
reward(torch.rand(4, 3, 32, 64), ['the text "ab"'] * 4, [{}] * 4)  # the workers exist now
Path(sys.argv[1]).write_text(" ".join(map(str, children(os.getpid()))))
time.sleep(600)
"""


def start_and_record(code: str, tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """Run ``code`` in a new Python; it writes the pids to watch to a file. Returns them."""
    record = tmp_path / "pids"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), str(record)], cwd=ROOT)
    end = time.monotonic() + 120
    while not record.exists() or not record.read_text():
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"the child process did not start its workers (exit code {proc.poll()})")
        time.sleep(0.1)
    return proc, [int(p) for p in record.read_text().split()]


@linux_only
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["kill-9", "sigterm"])
def test_ocr_workers_and_the_resource_tracker_die_with_their_parent(tmp_path, sig):
    proc, pids = start_and_record(OCR_PARENT, tmp_path)
    try:
        assert len(pids) >= 2  # two workers (and multiprocessing's resource tracker)
        os.kill(proc.pid, sig)
        proc.wait(10)
        assert wait_gone(pids) == [], "left behind by the killed parent"
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


POLLING_PARENT = """
import os, subprocess, sys, time
from pathlib import Path

child = subprocess.Popen([sys.executable, "-c", (
    "import os, time; from diffrl.transport.workers import die_with_parent; "
    f"die_with_parent({os.getpid()}, poll_s=0.1, pdeathsig=False); "
    f"open({sys.argv[1]!r} + '.up', 'w').close(); time.sleep(600)"
)])
while not os.path.exists(sys.argv[1] + ".up"):
    time.sleep(0.05)
Path(sys.argv[1]).write_text(str(child.pid))
time.sleep(600)
"""


@linux_only
def test_without_pdeathsig_the_parent_poll_still_ends_the_worker(tmp_path):
    """What other systems than Linux get: a thread that polls the parent pid."""
    proc, pids = start_and_record(POLLING_PARENT, tmp_path)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        assert wait_gone(pids) == []
    finally:
        for pid in pids:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
