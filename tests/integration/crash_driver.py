"""Runs ``diffrl train`` in this process and kills or signals it at one exact point, as a real
``kill -9`` or a scheduler's SIGTERM would land there (used by ``test_crash_safety.py``).

    python -m tests.integration.crash_driver MODE ITERATION -- diffrl-train-args...

MODE: ``none`` (run normally), ``kill-rollout`` (SIGKILL while sampling the second micro-group of
rollout ITERATION), ``kill-optimizer`` (SIGKILL between the micro-batches of optimizer step
ITERATION, its first gradient accumulated), ``kill-save`` (SIGKILL after the second file of the
checkpoint of step ITERATION is written), ``kill-dispatch`` (``runner: ray``: SIGKILL of the
driver right after micro-group 1 of rollout ITERATION went to an engine), ``term-rollout`` / ``term-optimizer`` (SIGTERM at those
points instead; in the rollout, during its first micro-group). The patches wrap diffrl's own functions; nothing in diffrl knows about them.
"""

from __future__ import annotations

import json
import os
import signal
import sys


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
    elif mode != "none":
        raise SystemExit(f"unknown mode {mode!r}")


def main() -> int:
    mode, iteration, sep, *args = sys.argv[1:]
    if sep != "--":
        raise SystemExit(__doc__)
    install(mode, int(iteration))
    from diffrl.cli import main as cli

    return cli(["train", *args])


if __name__ == "__main__":
    sys.exit(main())
