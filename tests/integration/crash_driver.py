"""Runs ``diffrl train`` in this process and kills or signals it at one exact point, as a real
``kill -9`` or a scheduler's SIGTERM would land there (used by ``test_crash_safety.py``).

    python -m tests.integration.crash_driver MODE ITERATION -- diffrl-train-args...

or, from a test, :func:`run_forked` (the same, in a child of a warm fork server: see there).

MODE: ``none`` (run normally), ``kill-rollout`` (SIGKILL while sampling the second micro-group of
rollout ITERATION), ``kill-optimizer`` (SIGKILL between the micro-batches of optimizer step
ITERATION, its first gradient accumulated), ``kill-save`` (SIGKILL after the second file of the
checkpoint of step ITERATION is written), ``kill-dispatch`` (``runner: ray``: SIGKILL of the
driver right after micro-group 1 of rollout ITERATION went to an engine), ``kill-eval`` (SIGKILL
right after the eval of step ITERATION is recorded: its row in metrics.jsonl), ``kill-report``
(SIGKILL as the report starts, after the final checkpoint), ``term-rollout`` / ``term-optimizer`` (SIGTERM at those
points instead; in the rollout, during its first micro-group). The patches wrap diffrl's own functions; nothing in diffrl knows about them.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path


def descendants(pid: int) -> dict[int, str]:
    """The processes below ``pid`` (children, their children, ...) with their command lines."""
    parent, cmd = {}, {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = open(f"/proc/{entry}/stat").read()
                cmd[int(entry)] = open(f"/proc/{entry}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            parent[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = {}, [pid]
    while frontier:
        p = frontier.pop()
        for child, ppid in parent.items():
            if ppid == p and child not in found:
                found[child] = cmd.get(child, "")
                frontier.append(child)
    return found


def _hit(sig: int) -> None:
    """Signal this process; first, when ``CRASH_PIDS_FILE`` is set, write the PIDs of every process
    below it there (a test then checks that none outlives it)."""
    if os.environ.get("CRASH_PIDS_FILE"):
        with open(os.environ["CRASH_PIDS_FILE"], "w") as f:
            json.dump(descendants(os.getpid()), f)
    sys.stdout.flush()
    os.kill(os.getpid(), sig)


def install(mode: str, iteration: int) -> None:
    from diffrl.sampling import collector
    from diffrl.train import actor, checkpoint

    action, _, where = mode.partition("-")
    sig = signal.SIGKILL if action == "kill" else signal.SIGTERM
    fired = [False]

    def once() -> bool:
        if fired[0]:
            return False
        fired[0] = True
        return True

    if where == "rollout":
        # SIGKILL in the second micro-group; SIGTERM in the first, so that the rollout has a next
        # micro-group to stop before (one arriving in the last lets the iteration finish)
        target_group = 1 if action == "kill" else 0
        original_sample = collector.OnlineCollector._sample

        def _sample(self, chunk, micro_group, rollout_id, *args):
            if rollout_id == iteration and micro_group == target_group and once():
                _hit(sig)
            return original_sample(self, chunk, micro_group, rollout_id, *args)

        collector.OnlineCollector._sample = _sample
    elif where == "optimizer":
        original_step = actor.Actor.train_step

        def train_step(self, examples, algorithm, total=None):
            if self.step != iteration:
                return original_step(self, examples, algorithm, total)
            calls, loss = [0], algorithm.compute_loss

            def compute_loss(policy, mb):
                calls[0] += 1
                if calls[0] == 2 and once():  # the first micro-batch's backward is done
                    _hit(sig)
                return loss(policy, mb)

            algorithm.compute_loss = compute_loss
            try:
                return original_step(self, examples, algorithm, total)
            finally:
                algorithm.compute_loss = loss

        actor.Actor.train_step = train_step
    elif where == "save":
        original_save, written = checkpoint.save_file, [0]

        def save_file(tensors, filename, metadata=None):
            original_save(tensors, filename, metadata=metadata)
            if f"step_{iteration:05d}" in filename:
                written[0] += 1
                if written[0] == 2 and once():
                    _hit(sig)

        checkpoint.save_file = save_file
    elif where == "dispatch":  # runner: ray: the driver, right after micro-group 1 went to an engine
        from diffrl.distributed.ray.runner import RayRunner

        original_sample = RayRunner.sample

        def sample(self, rollout_id, *args):
            if rollout_id == iteration:
                self.dispatch.on_dispatch = lambda engine, group: group == 1 and once() and _hit(sig)
            return original_sample(self, rollout_id, *args)

        RayRunner.sample = sample
    elif where == "eval":
        from diffrl.train.state import LoopState

        original_record = LoopState.record_eval

        def record_eval(self, step, *args, **kwargs):
            original_record(self, step, *args, **kwargs)
            if step == iteration and once():
                _hit(sig)

        LoopState.record_eval = record_eval
    elif where == "report":
        from diffrl.evaluation import report

        def write_report(*args, **kwargs):
            _hit(sig)

        report.write_report = write_report
    elif mode != "none":
        raise SystemExit(f"unknown mode {mode!r}")


def main() -> int:
    mode, iteration, sep, *args = sys.argv[1:]
    if sep != "--":
        raise SystemExit(__doc__)
    install(mode, int(iteration))
    from diffrl.cli import main as cli

    return cli(["train", *args])


PRELOAD = [
    "tests.integration.crash_driver",
    "diffrl.cli",
    "diffrl.cli.train",
    "diffrl.distributed.ray.runner",
    "ray",
    # what the tests' runs import by name (family, algorithm, reward: their diffusers models and
    # LoRA loaders) and draw with: each run imported them again, ~0.7 s of a 3 s run
    "diffrl.models.tiny",
    "diffrl.algorithms.diffusion_nft",
    "tests.rewards",
    "matplotlib.backends.backend_agg",
]
"""What the fork server imports once: the ``diffrl train`` world (torch, diffusers, peft: ~6 CPU
seconds a process), the Ray runner's, and the tiny runs' family, algorithm and reward."""


@functools.cache
def _fork_server(threads: str) -> multiprocessing.context.BaseContext:
    """The fork server, started (with ``threads`` as OMP/MKL_NUM_THREADS, which libgomp reads when
    torch loads it) and its imports done."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    os.environ.update(dict.fromkeys(saved, threads))
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        for k, v in saved.items():  # this process's own settings back
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v
    return ctx


def _child(argv: list[str], env: dict[str, str], cwd: str, stdout: str, stderr: str) -> None:
    """The forked process: this run's folder, environment, output files and argv, then :func:`main`."""
    import torch

    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    for fd, path in ((1, stdout), (2, stderr)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    sys.argv = [__file__, *argv]
    sys.exit(main())


def run_forked(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """``python -m tests.integration.crash_driver ARGV`` as a child of a fork server that imported
    :data:`PRELOAD` once, so that a test's many runs do not each import torch, diffusers and peft.

    The child is a process of its own, as a real run is: it is killed by a real ``SIGKILL``
    (returncode ``-9``), its ``SIGTERM`` handler is diffrl's, and what runs below it (a local Ray
    cluster, reward workers) is its own. ``env`` must set ``OMP_NUM_THREADS``: the child runs that
    many torch threads, as the fork server (started with it) does."""
    ctx = _fork_server(env["OMP_NUM_THREADS"])
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        child = ctx.Process(target=_child, args=(argv, dict(env), str(cwd), str(out), str(err)))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(argv, timeout, out.read_text(), err.read_text())
        return subprocess.CompletedProcess(argv, child.exitcode, out.read_text(), err.read_text())


if __name__ == "__main__":
    sys.exit(main())
