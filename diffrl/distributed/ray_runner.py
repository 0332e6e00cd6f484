"""``runner: ray``: rollout engines, reward workers and FSDP2 trainer ranks as Ray actors.

```
driver (this process: plans rollouts, runs the algorithm's postprocess/build_train_data)
  ├─ RolloutEngine x ray.num_engines      base model + sampling weights; samples micro-groups
  ├─ RewardWorker  x ray.num_reward_workers per reward type; scores micro-groups as they finish
  └─ TrainerRank   x ray.num_trainer_ranks in one placement group; torch.distributed (gloo on
                   CPU, NCCL on GPU), FSDP2 fully_shard per transformer block, peft LoRA
```

Every random draw of a rollout is keyed by (seed, prompt slot, sample, step), so the engines'
union is the single-process rollout whatever engine samples which micro-group. Each optimizer
step's examples are split over the ranks by whole samples; each rank weights its loss by its
share of the global count, so the reduced gradient is the single-process one. After each update
only the trainable tensors (LoRA A/B pairs) go to the engines, with a checksum.

Faults: an engine or reward worker that dies is replaced (the new engine first takes the current
weights) and its unfinished micro-group re-issued (``rollout/reissued``); a trainer rank that dies
stops the run with an error naming the last checkpoint. A reward worker still busy at its reward's
deadline (``timeout_s`` from submit) is killed and replaced, and that micro-group's samples fail
(``rollout/reward_timed_out``).
"""

from __future__ import annotations

import copy
import os
import time
import warnings
from collections import Counter, deque
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, RewardConfig
from diffrl.data.prompts import load_prompts
from diffrl.distributed.cluster import ray_address_problem, ray_checks
from diffrl.errors import Abandoned, DiffrlError, RunStopped
from diffrl.rewards.base import RewardOutput
from diffrl.rollout import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.sampling.collector import RolloutPlan, RolloutPlanner, build_collector
from diffrl.train.evaluate import EvalResult

MAX_REISSUES = 3
"""How often one micro-group (or call) may be re-sent after the actor running it died."""


class TrainerRankDied(RunStopped, RuntimeError):
    """A trainer rank died: the run stops, naming the last checkpoint to resume from."""


# ------------------------------------------------------------------------------------------------
# The actors (plain classes; ray.remote wraps them in RayRunner)
# ------------------------------------------------------------------------------------------------


class RolloutEngine:
    """Holds the base model with the sampling weights; samples micro-groups of a plan."""

    def __init__(self, config: Config, threads: int):
        from diffrl.algorithms.registry import build_algorithm
        from diffrl.models.registry import load_family
        from diffrl.train.actor import apply_lora

        torch.set_num_threads(threads)
        self.config = config
        self.family = load_family(config)
        if config.model.lora is not None:
            apply_lora(self.family, config.model.lora)
        self.family.transformer.requires_grad_(False).eval()
        spec = build_algorithm(config).collection_spec()
        self.collector = build_collector(config, self.family, spec)
        self.state: dict[str, torch.Tensor] = {}
        self.eval_rewards = None

    def sample(self, plan: RolloutPlan, micro_group: int) -> RolloutBatch:
        return self.collector.sample(plan, micro_group).to("cpu")

    def collect(self, iteration: int) -> RolloutBatch:
        return self.collector.collect(iteration).to("cpu")

    def load(self, state: dict[str, torch.Tensor]) -> str:
        """Take the trainer's sampling weights; returns the checksum of what this engine now holds."""
        from diffrl.distributed.weight_sync import checksum, load_state, module_state

        module = self.family.transformer
        lora = self.config.model.lora is not None
        held = [n for n, _ in module.named_parameters() if not lora or "lora_" in n]
        if sorted(held) != sorted(state):
            odd = sorted(set(held) ^ set(state))[:1]
            raise KeyError(f"weight sync: the engine's trainable tensors and the sent ones differ ({odd})")
        load_state(module, state)
        self.state = state
        return checksum(module_state(module, held))

    def evaluate(self, state: dict[str, torch.Tensor]) -> EvalResult:
        """Eval with ``state`` (the live weights), then back to the sampling weights."""
        from diffrl.distributed.weight_sync import load_state
        from diffrl.rewards.base import RewardSet
        from diffrl.train.evaluate import evaluate

        if self.eval_rewards is None:
            self.eval_rewards = RewardSet(self.config.eval.rewards, in_process=True)
        load_state(self.family.transformer, state)
        try:
            return evaluate(self.family, self.config, self.eval_rewards)
        finally:
            load_state(self.family.transformer, self.state)

    def pid(self) -> int:
        return os.getpid()


class RewardWorker:
    """Scores images with one reward type, in this process."""

    def __init__(self, reward: RewardConfig, threads: int):
        from diffrl.rewards.base import RewardSet

        torch.set_num_threads(threads)
        self.rewards = RewardSet([reward], in_process=True)

    def score(self, images: torch.Tensor, prompts: list[str], metadata: list[dict]) -> RewardOutput:
        return self.rewards.submit(images, prompts, metadata).result()


class TrainerRank:
    """One FSDP2 rank: the actor (policy + optimizer) on this rank's shard of the weights."""

    def __init__(self, config: Config, rank: int, world_size: int, threads: int):
        torch.set_num_threads(threads)
        self.config, self.rank, self.world_size = config, rank, world_size

    def address(self) -> tuple[str, int]:
        import ray

        from diffrl.parallel import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, host: str, port: int) -> int:
        from diffrl.algorithms.registry import build_algorithm
        from diffrl.models.registry import load_family, resolve_device
        from diffrl.parallel import init_distributed
        from diffrl.train.actor import Actor

        config = self.config
        ctx = init_distributed(
            self.rank, self.world_size, host, port, config.ray.backend, resolve_device(config.run.device)
        )
        torch.manual_seed(config.run.seed)  # the same LoRA init on every rank as in one process
        self.algorithm = build_algorithm(config)
        family = load_family(config)
        self.actor = Actor(
            family,
            config,
            keep_reference=self.algorithm.needs_reference,
            keep_old=self.algorithm.keeps_old_policy,
            dist=ctx,
        )
        return self.actor.num_trainable()

    def optimize(self, parts: list[tuple[TrainExamples, int, int]]) -> list[dict[str, float]]:
        """``parts``: per optimizer step, this rank's share, the step's global example count and
        the number of micro-batches every rank runs."""
        chunks, totals, counts = (list(column) for column in zip(*parts))
        return self.actor.optimize(chunks, self.algorithm, totals, counts)

    def end_iteration(self) -> dict[str, float]:
        return self.actor.update_old_policy(self.algorithm)

    def sampling_state(self) -> dict[str, torch.Tensor] | None:
        from diffrl.distributed.weight_sync import sampling_state

        state = sampling_state(self.actor)  # every rank gathers; rank 0 sends
        return state if self.rank == 0 else None

    def live_state(self) -> dict[str, torch.Tensor] | None:
        from diffrl.distributed.weight_sync import live_state

        state = live_state(self.actor)
        return state if self.rank == 0 else None

    def save(self, path: str, iteration: int, run_id: str, loop_state: dict) -> str:
        from diffrl.train.checkpoint import save_checkpoint

        save_checkpoint(
            path, self.actor, self.config, iteration, self.rank == 0, run_id=run_id, loop_state=loop_state
        )
        return path

    def resume(self, path: str) -> None:
        """Load the checkpoint into this rank's shards (every rank reads the whole files)."""
        from diffrl.train.checkpoint import load_resume_state

        load_resume_state(self.actor, path)


# ------------------------------------------------------------------------------------------------
# The driver side
# ------------------------------------------------------------------------------------------------


class _Pool:
    """Replaceable actors of one kind; ``call`` retries on a fresh actor when one dies."""

    def __init__(self, make: Callable[[int], object], n: int):
        self.make = make
        self.actors = [make(i) for i in range(n)]

    def replace(self, i: int) -> None:
        import ray

        try:
            ray.kill(self.actors[i], no_restart=True)
        except Exception:  # already gone
            pass
        self.actors[i] = self.make(i)


def split_by_samples(examples: TrainExamples, world_size: int) -> list[TrainExamples]:
    """Split one optimizer step's examples over ``world_size`` ranks by whole samples, as evenly
    as they go (counts differ by at most one sample), keeping their order: with even counts a
    rank's micro-batches are the rollout's micro-groups."""
    ids = list(dict.fromkeys(examples.sample_id.tolist()))
    bounds = [len(ids) * r // world_size for r in range(world_size + 1)]
    parts = []
    for r in range(world_size):
        mine = torch.tensor(ids[bounds[r] : bounds[r + 1]], dtype=torch.long)
        parts.append(examples.select(torch.nonzero(torch.isin(examples.sample_id, mine)).flatten()))
    return parts


def micro_batch_count(sizes: list[int], micro_batch_size: int) -> int:
    """How many micro-batches every rank splits its share into: enough for the largest share at
    ``micro_batch_size``, but no more than the smallest share has examples."""
    return max(1, min(max(-(-n // micro_batch_size) for n in sizes), min(sizes)))


class _PendingScores:
    """One micro-group's scores on the reward workers; ``result`` waits by each reward's deadline."""

    def __init__(self, runner: RayRunner, part: RolloutBatch, jobs: list):
        self.runner, self.part, self.jobs = runner, part, jobs

    def result(self) -> RewardOutput:
        return self.runner._score_result(self.part, self.jobs)


class RayRunner:
    @classmethod
    def validate(cls, config: Config, check_files: bool = True) -> list[str]:
        return ray_checks(config, check_files)

    @classmethod
    def uses_local_devices(cls, config: Config) -> bool:
        """A local cluster (started here, or 'ray start' on this node) uses this machine's GPUs."""
        return config.ray.address in (None, "auto")

    def __init__(self, config: Config, algorithm: DiffusionAlgorithm, spec: CollectionSpec):
        import ray

        self.config, self.algorithm, self.spec = config, algorithm, spec
        self.last_checkpoint: str | None = None
        self._reissued = 0
        """Micro-groups re-sent this iteration after their engine or reward worker died."""
        self.on_dispatch: Callable[[int, int], None] | None = None
        """Test hook: called with (engine index, micro-group) right after a micro-group is sent."""
        self._state_ref = None
        self.ranks: list = []
        self.pg = None
        self.engines = _Pool(lambda i: None, 0)
        self.reward_pools: list[_Pool] = []
        self._timed_out_workers: set = set()
        """Reward workers killed for a missed deadline: the jobs queued on them are re-sent free."""
        r = config.ray
        n_ranks, n_engines, cpus = r.num_trainer_ranks, r.num_engines, r.cpus_per_actor
        n_rewards = r.num_reward_workers * len(config.rewards) if spec.needs_reward else 0
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if r.address:
                # Ray retries an unreachable address for half a minute, then raises ConnectionError
                problem = ray_address_problem(r.address)
                if problem:
                    raise DiffrlError(problem)
                ray.init(address=r.address)
            else:  # a local cluster with room for every actor (CPU counts are scheduling units)
                need = int(cpus * (n_ranks + n_engines + n_rewards)) + 1
                ray.init(
                    num_cpus=max(os.cpu_count() or 1, need),
                    include_dashboard=False,
                    # Ray lowers its workers' priority by default (niceness 15); here they are the work
                    _system_config={"worker_niceness": 0},
                )
        try:
            self._start(config, spec)
        except BaseException:
            self.close()
            raise

    def _start(self, config: Config, spec: CollectionSpec) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        r = config.ray
        n_ranks, n_engines, cpus = r.num_trainer_ranks, r.num_engines, r.cpus_per_actor
        gpu = config.run.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
        if config.run.device.startswith("cuda") and not gpu:
            raise DiffrlError(
                f"run.device={config.run.device} but the Ray cluster has no GPU; use run.device=cpu or a "
                "cluster with GPUs"
            )
        if config.run.device.startswith("cuda:"):  # under Ray each actor sees its own GPU(s) from 0
            config = copy.deepcopy(config)
            config.run.device = "cuda"
        threads = max(1, (os.cpu_count() or 1) // max(n_ranks, n_engines))
        # colocated: rank i's bundle also holds engines i, i + ranks, ...; its GPU is shared evenly
        per_bundle = 1 + (-(-n_engines // n_ranks) if r.colocate else 0)
        share = (1.0 / per_bundle) if gpu else 0.0
        bundle = {"CPU": cpus * per_bundle, **({"GPU": 1.0} if gpu else {})}
        self.pg = placement_group([dict(bundle) for _ in range(n_ranks)], strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=300)
        except ray.exceptions.GetTimeoutError as e:
            raise DiffrlError(
                f"the Ray cluster cannot place {n_ranks} trainer-rank bundle(s) of {bundle} within 5 "
                f"minutes (cluster: {ray.cluster_resources()}); lower ray.num_trainer_ranks or "
                "ray.cpus_per_actor, or add nodes"
            ) from e

        def in_bundle(i: int):
            return PlacementGroupSchedulingStrategy(placement_group=self.pg, placement_group_bundle_index=i)

        rank_cls = ray.remote(TrainerRank)
        self.ranks = [
            rank_cls.options(num_cpus=cpus, num_gpus=share, scheduling_strategy=in_bundle(i)).remote(
                config, i, n_ranks, threads
            )
            for i in range(n_ranks)
        ]
        host, port = ray.get(self.ranks[0].address.remote())
        self.trainable = self._ranks_call("setup", host, port)[0]
        engine_cls = ray.remote(RolloutEngine)

        def make_engine(i: int):
            if r.colocate:
                opts = {"num_cpus": cpus, "num_gpus": share, "scheduling_strategy": in_bundle(i % n_ranks)}
            else:
                opts = {"num_cpus": cpus, "num_gpus": 1.0 if gpu else 0}
            return engine_cls.options(**opts).remote(config, threads)

        self.engines = _Pool(make_engine, n_engines)
        worker_cls = ray.remote(RewardWorker)
        self.reward_pools = [
            _Pool(lambda i, c=c: worker_cls.options(num_cpus=cpus).remote(c, 1), r.num_reward_workers)
            for c in (config.rewards if spec.needs_reward else [])
        ]
        self.planner = (
            RolloutPlanner(config, spec, len(load_prompts(config.data.prompts))) if spec.online else None
        )
        self.sync()

    # ---- calls on the ranks ----------------------------------------------------------------------
    def _ranks_call(self, method: str, *args, per_rank: list | None = None) -> list:
        import ray

        refs = [
            getattr(rank, method).remote(*(per_rank[i] if per_rank is not None else args))
            for i, rank in enumerate(self.ranks)
        ]
        pending = list(refs)
        try:
            while pending:  # fail at the first dead rank: the others may wait in a collective
                ready, pending = ray.wait(pending, num_returns=1)
                ray.get(ready)
        except ray.exceptions.RayError as e:  # a dead rank, or a rank whose collective broke with it
            where = self.last_checkpoint or "none yet (no checkpoint was written)"
            raise TrainerRankDied(
                f"a trainer rank died or failed during {method!r}; the run stops. Last checkpoint: "
                f"{where} (continue with train.resume=latest). Cause: {type(e).__name__}: {e}"
            ) from e
        return ray.get(refs)

    def describe(self) -> str:
        r = self.config.ray
        return (
            f"{self.trainable:,} trainable parameters; Ray: {r.num_engines} engine(s), "
            f"{r.num_trainer_ranks} FSDP2 rank(s), {r.num_reward_workers} reward worker(s) per reward"
        )

    # ---- rollouts ----------------------------------------------------------------------------------
    def sample(self, iteration: int, should_stop: Callable[[], bool] | None = None) -> Iterator[RolloutBatch]:
        """The rollout's micro-groups as the engines finish them (two queued per engine: it starts
        the next while the driver takes the last); a micro-group whose engine died is re-sent to
        its replacement."""
        import ray

        self._reissued = 0
        if self.planner is None:  # offline data (SFT): one engine reads it
            yield self._engine_call(0, "collect", iteration)
            return
        plan = self.planner.plan(iteration)
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
                part = ray.get(ref)
            except ray.exceptions.RayActorError as e:
                attempts[g] += 1
                if attempts[g] > MAX_REISSUES:
                    raise RunStopped(
                        f"micro-group {g} of rollout {iteration} killed {attempts[g]} engines in a row; "
                        f"the run stops (last checkpoint: {self.last_checkpoint or 'none yet'})"
                    ) from e
                self._replace_engine(i, engine)  # once: its other queued micro-group fails too
                queue.appendleft(g)
                self._reissued += 1
                free.append(i)
                continue
            free.append(i)
            yield part

    def score(self, part: RolloutBatch) -> _PendingScores | None:
        """Send the micro-group to a worker of each reward (chosen by its index)."""
        if not self.reward_pools:
            return None
        return _PendingScores(self, part, [self._score(pool, part) for pool in self.reward_pools])

    def _replace_engine(self, i: int, dead) -> None:
        """Replace engine ``i`` (unless ``dead`` was replaced already); the new one first takes
        the current weights, and its checksum must match."""
        import ray

        from diffrl.distributed.weight_sync import checksum

        if self.engines.actors[i] is not dead:
            return
        self.engines.replace(i)
        if self._state_ref is not None:
            held = ray.get(self.engines.actors[i].load.remote(self._state_ref))
            if held != checksum(ray.get(self._state_ref)):
                raise RuntimeError(f"weight sync: replacement engine {i} does not hold the trainer's weights")

    def _engine_call(self, i: int, method: str, *args):
        """Call engine ``i``; if it died, replace it and call the new one (a few times at most)."""
        import ray

        for attempt in range(MAX_REISSUES + 1):
            engine = self.engines.actors[i]
            try:
                return ray.get(getattr(engine, method).remote(*args))
            except ray.exceptions.RayActorError as e:
                if attempt == MAX_REISSUES:
                    raise RuntimeError(f"engine {i} died {attempt + 1} times during {method!r}") from e
                self._replace_engine(i, engine)

    def _score(self, pool: _Pool, part: RolloutBatch):
        w = part.micro_group[0].item() % len(pool.actors)
        worker = pool.actors[w]
        return (w, worker, worker.score.remote(part.images, part.prompts, part.metadata), time.monotonic())

    def _score_result(self, part: RolloutBatch, jobs: list) -> RewardOutput:
        """Wait for a micro-group's scores, each reward by its deadline (``timeout_s`` from submit,
        as in one process: see :class:`~diffrl.rewards.base.PendingRewards`). A worker that died is
        replaced and the micro-group re-sent; one still busy at the deadline is killed and replaced,
        and the micro-group fails (NaN, "timed out") instead of being sent again. Returns the
        output and how often the micro-group was re-sent."""
        import ray

        outs, resent, deaths = [], 0, 0
        for cfg, pool, (w, worker, ref, submitted) in zip(self.config.rewards, self.reward_pools, jobs):
            deadline = submitted + cfg.timeout_s
            while True:
                try:
                    outs.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
                    break
                except ray.exceptions.GetTimeoutError:
                    # stuck or too slow: a replacement takes the micro-groups queued behind this one
                    if pool.actors[w] is worker:
                        self._timed_out_workers.add(worker)
                        pool.replace(w)
                    outs.append(RewardOutput.late(cfg, len(part)))
                    break
                except ray.exceptions.RayActorError as e:
                    if time.monotonic() >= deadline:
                        outs.append(RewardOutput.late(cfg, len(part)))
                        break
                    if worker not in self._timed_out_workers:  # it died under this micro-group
                        deaths += 1
                        if deaths > MAX_REISSUES:
                            raise RunStopped(
                                "a micro-group killed its reward worker repeatedly; the run stops "
                                f"(last checkpoint: {self.last_checkpoint or 'none yet'})"
                            ) from e
                    if pool.actors[w] is worker:
                        pool.replace(w)
                    resent += 1
                    worker = pool.actors[w]
                    ref = worker.score.remote(part.images, part.prompts, part.metadata)
        self._reissued += resent
        return RewardOutput.combine(outs)

    # ---- training ----------------------------------------------------------------------------------
    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        n = len(self.ranks)
        per_rank: list[list] = [[] for _ in range(n)]
        skipped = 0
        for chunk in chunks:
            parts = split_by_samples(chunk, n)
            sizes = [len(p) for p in parts]
            if min(sizes) == 0:  # fewer samples left (failed rewards, dropped groups) than ranks
                skipped += 1
                continue
            count = micro_batch_count(sizes, self.config.train.micro_batch_size)
            for r in range(n):
                per_rank[r].append((parts[r], sum(sizes), count))
        if skipped:
            warnings.warn(
                f"{skipped} optimizer step(s) skipped: fewer samples than trainer ranks", stacklevel=2
            )
        if not per_rank[0]:
            return []
        return self._ranks_call("optimize", per_rank=[[p] for p in per_rank])[0]

    def end_iteration(self) -> dict[str, float]:
        metrics = self._ranks_call("end_iteration")[0]
        return {**metrics, **self.sync(), "rollout/reissued": float(self._reissued)}

    def sync(self) -> dict[str, float]:
        """Send the sampling weights to every engine and check that they hold them exactly."""
        import ray

        from diffrl.distributed.weight_sync import checksum, state_bytes

        t0 = time.time()
        state = self._ranks_call("sampling_state")[0]
        expected = checksum(state)
        self._state_ref = ray.put(state)
        sent = [(i, e, e.load.remote(self._state_ref)) for i, e in enumerate(self.engines.actors)]
        match = True
        for i, engine, ref in sent:
            try:
                match &= ray.get(ref) == expected
            except ray.exceptions.RayActorError:
                self._replace_engine(i, engine)  # the replacement loads the state and is checked
        if not match:
            raise RuntimeError("weight sync: an engine's weights differ from the trainer's after the sync")
        return {
            "perf/weight_sync_time": time.time() - t0,
            "sync/checksum_match": float(match),
            "sync/bytes": float(state_bytes(state)),
        }

    # ---- eval, checkpoints -------------------------------------------------------------------------
    def evaluate(self) -> EvalResult | None:

        if not self.config.eval.enabled:
            return None
        return self._engine_call(0, "evaluate", self._ranks_call("live_state")[0])

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict) -> Path:
        self._ranks_call("save", str(Path(path).resolve()), iteration, run_id, loop_state)
        self.last_checkpoint = str(path)
        return Path(path)

    def resume(self, path: Path) -> None:
        """Every rank loads its shards; then the engines take the resumed sampling weights."""
        self._ranks_call("resume", str(Path(path).resolve()))
        self.last_checkpoint = str(path)
        self.sync()

    def close(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for actor in [*self.ranks, *self.engines.actors, *(a for p in self.reward_pools for a in p.actors)]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:
                pass
        try:
            remove_placement_group(self.pg)
        except Exception:
            pass
        if self._owns_ray:
            ray.shutdown()
