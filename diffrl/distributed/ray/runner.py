"""``runner: ray``: rollout engines, reward workers and FSDP2 trainer ranks as Ray actors.

```
driver (this process: plans rollouts, runs the algorithm's postprocess/build_train_data)
  ├─ RolloutEngine x parallel.engines      base model + sampling weights; samples micro-groups
  ├─ RewardWorker  x ray.num_reward_workers per reward type; scores micro-groups as they finish
  └─ TrainerRank   x parallel.trainer_ranks in one placement group; torch.distributed (gloo on
                   CPU, NCCL on GPU), FSDP2 fully_shard per transformer block, peft LoRA
```

Every random draw of a rollout is keyed by (seed, prompt slot, sample, step), so the engines'
union is the single-process rollout whatever engine samples which micro-group. Each optimizer
step's examples are split over the ranks by whole samples; each rank weights its loss by its
share of the global count, so the reduced gradient is the single-process one. With
``parallel.sequence: N`` the ranks form data-parallel groups of N: a group's ranks take the
same samples and each runs its part of every sample's tokens (Ulysses attention). After each update
only the trainable tensors (LoRA A/B pairs) go to the engines, with a checksum.

Faults: an engine or reward worker that dies is replaced (the new engine first takes the current
weights) and its unfinished micro-group re-issued (``rollout/reissued``); a trainer rank that dies
stops the run with an error naming the last checkpoint. A plugin's error in an actor (``sys.exit()``
too) is no death: it is named there and stops the run (:mod:`.actor_errors`). A reward worker still busy at its reward's
deadline (``timeout_s`` from submit) is killed and replaced, and that micro-group's samples fail
(``rollout/reward_timed_out``).

The parts: :mod:`.actors` (the engines' and ranks' classes), :mod:`.reward_worker` (the reward
workers' class), :mod:`.actor_errors` (a user's error in an actor, raised in the driver as itself), :mod:`.cluster` (ray.init, placement), :mod:`.dispatch` (calls, retries,
re-issues, reward deadlines), :mod:`.sharding` (the ranks' shares of a step), :mod:`.weight_sync`
(trainer -> engines, checked).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

from safetensors.torch import load_file

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.config import Config, ParallelConfig
from diffrl.core.errors import DiffrlError
from diffrl.core.rollout import CollectionSpec, RolloutBatch, TrainExamples
from diffrl.data.prompts import load_prompts
from diffrl.distributed.ray.actor_errors import get
from diffrl.distributed.ray.actors import RolloutEngine, TrainerRank
from diffrl.distributed.ray.cluster import Cluster, import_ray, ray_checks
from diffrl.distributed.ray.dispatch import ActorPool, Dispatch, kill, ranks_call
from diffrl.distributed.ray.reward_worker import RewardWorker
from diffrl.distributed.ray.sharding import shard_steps
from diffrl.distributed.ray.weight_sync import EngineWeights
from diffrl.evaluation.evaluate import EvalResult
from diffrl.models.registry import FAMILIES
from diffrl.rewards.base import reward_labels
from diffrl.sampling.collector import RolloutPlanner
from diffrl.sampling.engine import engine_devices
from diffrl.train.checkpoint import ROLLOUT_VERSION, ROLLOUT_WEIGHTS, read_checkpoint_info
from diffrl.train.runner import PendingScore


class RayRunner:
    """The :class:`~diffrl.train.runner.Runner` of ``runner: ray``: composes the cluster, the
    actors, the dispatch, the ranks' shares and the weight sync (see the module's docstring)."""

    @classmethod
    def validate(cls, config: Config, check_files: bool = True) -> list[str]:
        """The ``ray:`` and ``parallel:`` settings, and what the model family can do in one process
        only (the engines sample apart from the ranks)."""
        errors = ray_checks(config, check_files)
        try:
            description = FAMILIES.resolve(config.model.family).description
        except (DiffrlError, AttributeError):
            return errors  # the model checks report an unknown family (or one without a description)
        return errors + list(description.one_process_problems(config))

    @classmethod
    def layout(cls, config: Config) -> ParallelConfig:
        """The ranks and engines of ``parallel:``, each an actor."""
        return config.parallel

    @classmethod
    def driver_device(cls, config: Config) -> str:
        """The driver holds no actor's device (``run.device`` names the actors'): the CPU."""
        return "cpu"

    @classmethod
    def uses_local_devices(cls, config: Config) -> bool:
        """A local cluster (started here, or 'ray start' on this node) uses this machine's GPUs."""
        return config.ray.address in (None, "auto")

    def __init__(self, config: Config, algorithm: DiffusionAlgorithm, spec: CollectionSpec):
        self.config, self.algorithm, self.spec = config, algorithm, spec
        self.pipelined = config.train.off_policy_steps > 0
        self.updates = 0
        """The trainer's version: iterations trained (the engines' samples carry the version they
        were drawn with)."""
        self.last_checkpoint: str | None = None
        self.ranks: list = []
        self.weights = EngineWeights()
        self.dispatch = Dispatch(config.rewards)
        self.cluster = Cluster(config, spec.needs_reward)
        try:
            self._start(config, spec)
        except BaseException:
            self.close()
            raise

    def _start(self, config: Config, spec: CollectionSpec) -> None:
        ray, cluster, r, p = import_ray(), self.cluster, config.ray, config.parallel
        actor_config = cluster.place(config, engine_devices(config))
        rank_cls = ray.remote(TrainerRank)
        self.ranks = [
            rank_cls.options(**cluster.rank_options(i)).remote(
                actor_config, i, p.trainer_ranks, cluster.threads
            )
            for i in range(p.trainer_ranks)
        ]
        host, port = get(self.ranks[0].address.remote())
        self.trainable = self._ranks_call("setup", host, port)[0]
        self._peak: float | None = None
        engine_cls, worker_cls = ray.remote(RolloutEngine), ray.remote(RewardWorker)
        self.dispatch.engines = ActorPool(
            lambda i: engine_cls.options(**cluster.engine_options(i)).remote(actor_config, cluster.threads),
            p.engines,
            on_replace=self.weights.load_into,  # a new engine first takes the current weights
        )
        self.dispatch.reward_pools = [
            ActorPool(  # reward k's worker i is reward actor k * workers + i (its bundle, on GPUs)
                lambda i, k=k, c=c, label=label: worker_cls.options(
                    **cluster.reward_options(k * r.num_reward_workers + i)
                ).remote(c, 1, label, config.run.deterministic),
                r.num_reward_workers,
            )
            for k, (c, label) in enumerate(zip(actor_config.rewards, reward_labels(actor_config.rewards)))
            if spec.needs_reward
        ]
        self.planner = (
            RolloutPlanner(config, spec, len(load_prompts(config.data.prompts))) if spec.online else None
        )
        self.sync()

    def _ranks_call(self, method: str, *args, per_rank: list | None = None) -> list:
        return ranks_call(self.ranks, method, *args, per_rank=per_rank, last_checkpoint=self.last_checkpoint)

    def describe(self) -> str:
        r, p = self.config.ray, self.config.parallel
        forwards, notes = get(self.dispatch.engines.actors[0].forwards.remote())
        return (
            f"{self.trainable:,} trainable parameters; Ray: {p.engines} engine(s), "
            f"{p.trainer_ranks} FSDP2 rank(s), {r.num_reward_workers} reward worker(s) per reward"
            f"{', rollouts drawn one iteration ahead' if self.pipelined else ''}; "
            f"forwards {forwards}" + "".join(f"\n  note: {note}" for note in notes)
        )

    def peak_flops(self) -> float | None:
        """An engine's device peak (the engines and the trainer ranks share one kind of device)."""
        if self._peak is None:
            self._peak = get(self.dispatch.engines.actors[0].peak_flops.remote())
        return self._peak

    # ---- rollouts ----------------------------------------------------------------------------------
    def sample(self, iteration: int, should_stop: Callable[[], bool] | None = None) -> Iterator[RolloutBatch]:
        """The rollout's micro-groups as the engines finish them (see :meth:`Dispatch.micro_groups`)."""
        self.dispatch.reissued = 0
        if self.planner is None:  # offline data (SFT): one engine reads it
            yield self.dispatch.engine_call(0, "collect", iteration)
            return
        yield from self.dispatch.micro_groups(self.planner.plan(iteration), should_stop, self.last_checkpoint)

    def score(self, part: RolloutBatch) -> PendingScore | None:
        """Send the micro-group to a worker of each reward (chosen by its index)."""
        return self.dispatch.score(part, self.last_checkpoint)

    # ---- training ----------------------------------------------------------------------------------
    def optimize(self, chunks: list[TrainExamples]) -> list[dict[str, float]]:
        per_rank, skipped = shard_steps(
            chunks, len(self.ranks), self.config.train.micro_batch_size, self.config.parallel.sequence
        )
        if skipped:
            warnings.warn(
                f"{skipped} optimizer step(s) skipped: fewer samples than data-parallel groups", stacklevel=2
            )
        if not per_rank[0]:
            return []
        return self._ranks_call("optimize", per_rank=[[p] for p in per_rank])[0]

    def end_iteration(self) -> dict[str, float]:
        metrics = self._ranks_call("end_iteration")[0]
        self.updates += 1
        if self.pipelined:  # the next rollout is on the engines now: they sync in end_rollout
            return metrics
        return {**metrics, **self.end_rollout()}

    def end_rollout(self) -> dict[str, float]:
        """The engines' counters of the rollout just drawn, and the trainer's sampling weights
        sent to them (the next rollout draws with them)."""
        return {
            **self.engine_stage_times(),
            **self.sync(),
            "rollout/reissued": float(self.dispatch.reissued),
        }

    def engine_stage_times(self) -> dict[str, float]:
        """Each sampling stage's seconds, summed over the engines (they run side by side: this
        is engine-seconds, not wall-clock)."""
        total: dict[str, float] = {}
        for times in get([e.stage_times.remote() for e in self.dispatch.engines.actors]):
            for k, v in times.items():
                total[k] = total.get(k, 0.0) + v
        return total

    def sync(self) -> dict[str, float]:
        """Send the sampling weights to every engine and check that they hold them exactly."""
        return self.weights.sync(
            lambda: self._ranks_call("sampling_state")[0], self.dispatch.engines, self.updates
        )

    # ---- eval, checkpoints -------------------------------------------------------------------------
    def evaluate(self) -> EvalResult | None:
        if not self.config.eval.enabled:
            return None
        return self.dispatch.engine_call(0, "evaluate", self._ranks_call("live_state")[0])

    def save(self, path: Path, iteration: int, run_id: str, loop_state: dict) -> Path:
        """Every rank saves (rank 0 writes). Pipelined, the checkpoint also holds the weights the
        engines hold (those of the rollout in flight, or of the next one), so that a resumed run
        draws that rollout again exactly."""
        args = [str(Path(path).resolve()), iteration, run_id, loop_state, None]
        per_rank = [args] * len(self.ranks)
        if self.pipelined:
            loop_state = {**loop_state, ROLLOUT_VERSION: self.weights.version}
            per_rank = [
                [*args[:3], loop_state, self.weights.ref if i == 0 else None] for i in range(len(self.ranks))
            ]
        self._ranks_call("save", per_rank=per_rank)
        self.last_checkpoint = str(path)
        return Path(path)

    def resume(self, path: Path) -> None:
        """Every rank loads its shards; then the engines take the resumed sampling weights (the
        saved rollout weights when pipelined: those the next rollout was drawn with)."""
        self._ranks_call("resume", str(Path(path).resolve()))
        self.last_checkpoint = str(path)
        info = read_checkpoint_info(path)
        self.updates = int(info["iteration"])
        saved = Path(path) / ROLLOUT_WEIGHTS
        if self.pipelined and ROLLOUT_WEIGHTS in info["files"]:
            version = int(info["loop"][ROLLOUT_VERSION])
            self.weights.sync(lambda: load_file(str(saved)), self.dispatch.engines, version)
        else:
            self.sync()

    def close(self) -> None:
        engines = self.dispatch.engines.actors
        if engines:  # a serving engine stops its servers (bounded: a stuck engine is killed anyway)
            try:
                import_ray().wait([e.close.remote() for e in engines], num_returns=len(engines), timeout=30)
            except Exception:  # the cluster or the engines are gone already
                pass
        for actor in [*self.ranks, *self.dispatch.actors()]:
            kill(actor)
        self.cluster.close()
