"""The driver's calls on the actors, and what happens when one dies.

- :class:`ActorPool`: replaceable actors of one kind (engines, a reward's workers).
- :func:`ranks_call`: every trainer rank at once; the first that dies stops the run
  (:class:`TrainerRankDied`, naming the last checkpoint).

A user's error raised in an actor (a plugin's, named there: :mod:`.actor_errors`) is raised as
itself by every call here: it is no actor's death, so nothing is replaced or re-sent.
- :class:`Dispatch`: a rollout's micro-groups on the engines (two queued per engine; the
  micro-groups of an engine that died re-issued to its replacement), calls on one engine with
  retries, and each micro-group's scores on the reward workers by each reward's deadline.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterator

from diffrl.config import RewardConfig
from diffrl.core.errors import Abandoned, RunStopped
from diffrl.core.rollout import RolloutBatch
from diffrl.distributed.ray.actor_errors import get
from diffrl.distributed.ray.cluster import import_ray
from diffrl.rewards.base import RewardOutput, reward_labels
from diffrl.sampling.collector import RolloutPlan

MAX_REISSUES = 3
"""How often one micro-group (or call) may be re-sent after the actor running it died."""


class TrainerRankDied(RunStopped, RuntimeError):
    """A trainer rank died: the run stops, naming the last checkpoint to resume from."""


def kill(actor) -> None:
    """Kill an actor for good (one that is gone already is no error)."""
    try:
        import_ray().kill(actor, no_restart=True)
    except Exception:  # already gone
        pass


class ActorPool:
    """Replaceable actors of one kind: ``make(i)`` starts actor ``i``; ``on_replace(i, actor)``
    readies a replacement before it takes work (an engine first takes the current weights)."""

    def __init__(
        self, make: Callable[[int], object], n: int, on_replace: Callable[[int, object], None] | None = None
    ):
        self.make, self.on_replace = make, on_replace
        self.actors = [make(i) for i in range(n)]

    def replace(self, i: int, dead) -> bool:
        """Kill actor ``i`` (``dead``, found dead or stuck) and start another in its place; False
        when ``dead`` was replaced already."""
        if self.actors[i] is not dead:
            return False
        kill(dead)
        self.actors[i] = self.make(i)
        if self.on_replace is not None:
            self.on_replace(i, self.actors[i])
        return True


def ranks_call(
    ranks: list, method: str, *args, per_rank: list | None = None, last_checkpoint: str | None = None
) -> list:
    """Call ``method`` on every trainer rank (``per_rank[i]``: rank i's arguments); their results."""
    ray = import_ray()
    refs = [
        getattr(rank, method).remote(*(per_rank[i] if per_rank is not None else args))
        for i, rank in enumerate(ranks)
    ]
    pending = list(refs)
    try:
        while pending:  # fail at the first dead rank: the others may wait in a collective
            ready, pending = ray.wait(pending, num_returns=1)
            get(ready)  # a user's error (a plugin's, named) is raised as itself: no rank died
    except ray.exceptions.RayError as e:  # a dead rank, or a rank whose collective broke with it
        where = last_checkpoint or "none yet (no checkpoint was written)"
        raise TrainerRankDied(
            f"a trainer rank died or failed during {method!r}; the run stops. Last checkpoint: "
            f"{where} (continue with train.resume=latest). Cause: {type(e).__name__}: {e}"
        ) from e
    return get(refs)


class _PendingScores:
    """One micro-group's scores on the reward workers; ``result`` waits by each reward's deadline."""

    def __init__(self, dispatch: Dispatch, part: RolloutBatch, jobs: list, last_checkpoint: str | None):
        self.dispatch, self.part, self.jobs, self.last_checkpoint = dispatch, part, jobs, last_checkpoint

    def result(self) -> RewardOutput:
        return self.dispatch._score_result(self.part, self.jobs, self.last_checkpoint)


class Dispatch:
    """Micro-groups to the engines and their images to the reward workers (``reward_pools``: one
    per reward, in ``rewards``' order); ``reissued`` counts what was re-sent after an actor died."""

    def __init__(self, rewards: list[RewardConfig]):
        self.rewards = rewards
        self.engines = ActorPool(lambda i: None, 0)
        self.reward_pools: list[ActorPool] = []
        self.reissued = 0
        """Micro-groups re-sent this iteration after their engine or reward worker died."""
        self.on_dispatch: Callable[[int, int], None] | None = None
        """Test hook: called with (engine index, micro-group) right after a micro-group is sent."""
        self._timed_out_workers: set = set()
        """Reward workers killed for a missed deadline: the jobs queued on them are re-sent free."""

    def actors(self) -> list:
        return [*self.engines.actors, *(a for pool in self.reward_pools for a in pool.actors)]

    # ---- engines -----------------------------------------------------------------------------------
    def engine_call(self, i: int, method: str, *args):
        """Call engine ``i``; if it died, replace it and call the new one (a few times at most)."""
        ray = import_ray()
        for attempt in range(MAX_REISSUES + 1):
            engine = self.engines.actors[i]
            try:
                return get(getattr(engine, method).remote(*args))
            except ray.exceptions.RayActorError as e:
                if attempt == MAX_REISSUES:
                    raise RuntimeError(f"engine {i} died {attempt + 1} times during {method!r}") from e
                self.engines.replace(i, engine)

    def micro_groups(
        self,
        plan: RolloutPlan,
        should_stop: Callable[[], bool] | None = None,
        last_checkpoint: str | None = None,
    ) -> Iterator[RolloutBatch]:
        """The plan's micro-groups as the engines finish them (two queued per engine: it starts the
        next while the driver takes the last); a micro-group whose engine died is re-sent to its
        replacement."""
        ray = import_ray()
        plan_ref = ray.put(plan)
        queue = deque(range(len(plan.micro_groups)))
        free = deque(i for _ in range(2) for i in range(len(self.engines.actors)))
        inflight: dict = {}
        attempts: Counter[int] = Counter()
        while queue or inflight:
            if should_stop is not None and should_stop():  # the engines' work is dropped at close()
                raise Abandoned
            while queue and free:
                i, g = free.popleft(), queue.popleft()
                engine = self.engines.actors[i]
                inflight[engine.sample.remote(plan_ref, g)] = (i, g, engine)
                if self.on_dispatch is not None:
                    self.on_dispatch(i, g)
            [ref], _ = ray.wait(list(inflight), num_returns=1)
            i, g, engine = inflight.pop(ref)
            try:
                part = get(ref)
            except ray.exceptions.RayActorError as e:
                attempts[g] += 1
                if attempts[g] > MAX_REISSUES:
                    raise RunStopped(
                        f"micro-group {g} of rollout {plan.rollout_id} killed {attempts[g]} engines in a "
                        f"row; the run stops (last checkpoint: {last_checkpoint or 'none yet'})"
                    ) from e
                self.engines.replace(i, engine)  # once: its other queued micro-group fails too
                queue.appendleft(g)
                self.reissued += 1
                free.append(i)
                continue
            free.append(i)
            yield part

    # ---- reward workers ----------------------------------------------------------------------------
    def score(self, part: RolloutBatch, last_checkpoint: str | None = None) -> _PendingScores | None:
        """Send the micro-group to a worker of each reward (chosen by its index)."""
        if not self.reward_pools:
            return None
        return _PendingScores(
            self, part, [self._score(pool, part) for pool in self.reward_pools], last_checkpoint
        )

    def _score(self, pool: ActorPool, part: RolloutBatch):
        w = part.micro_group[0].item() % len(pool.actors)
        worker = pool.actors[w]
        return (w, worker, _submit(worker, part), time.monotonic())

    def _score_result(self, part: RolloutBatch, jobs: list, last_checkpoint: str | None) -> RewardOutput:
        """Wait for a micro-group's scores, each reward by its deadline (``timeout_s`` from submit,
        as in one process: see :class:`~diffrl.rewards.base.PendingRewards`). A worker that died is
        replaced and the micro-group re-sent (counted in ``reissued``); one still busy, dead or
        unreachable at the deadline (or that reports a sample timed out: it enforces the same deadline
        itself, and its reward thread is stuck) is killed and replaced, and the micro-group fails
        (NaN, "timed out") instead of being sent again."""
        ray = import_ray()
        outs, resent, deaths = [], 0, 0
        labels = reward_labels(self.rewards)
        for cfg, label, pool, (w, worker, ref, submitted) in zip(
            self.rewards, labels, self.reward_pools, jobs
        ):
            deadline = submitted + cfg.timeout_s
            while True:
                try:
                    out = get(ref, timeout=max(0.0, deadline - time.monotonic()))
                    if out.timed_out.any() and pool.replace(w, worker):
                        # the worker enforced the deadline itself (the driver came to wait late):
                        # its reward thread is still stuck, so it is replaced as if it were
                        self._timed_out_workers.add(worker)
                    outs.append(out)
                    break
                except ray.exceptions.GetTimeoutError:
                    # stuck or too slow: a replacement takes the micro-groups queued behind this one
                    if pool.replace(w, worker):
                        self._timed_out_workers.add(worker)
                    outs.append(RewardOutput.late(cfg, len(part), label))
                    break
                except ray.exceptions.RayActorError as e:
                    if time.monotonic() >= deadline:
                        # dead, or unreachable (Ray's ActorUnavailableError, seen on a loaded
                        # machine) at the deadline: the micro-group fails, and a replacement takes
                        # the micro-groups queued behind it, as for a worker still busy
                        if pool.replace(w, worker):
                            self._timed_out_workers.add(worker)
                        outs.append(RewardOutput.late(cfg, len(part), label))
                        break
                    if worker not in self._timed_out_workers:  # it died under this micro-group
                        deaths += 1
                        if deaths > MAX_REISSUES:
                            raise RunStopped(
                                f"reward {cfg.name!r} ended its worker process {deaths} times on one "
                                "micro-group (a crash, os._exit() or the memory limit: fix the reward); "
                                f"the run stops (last checkpoint: {last_checkpoint or 'none yet'})"
                            ) from e
                    pool.replace(w, worker)
                    resent += 1
                    worker = pool.actors[w]
                    ref = _submit(worker, part)
        self.reissued += resent
        return RewardOutput.combine(outs)


def _submit(worker, part: RolloutBatch):
    return worker.score.remote(part.images, part.prompts, part.metadata, part.audio, part.group_id.tolist())
