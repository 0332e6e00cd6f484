"""The Ray cluster: the checks of the ``ray:`` section and of ``ray.address`` (a TCP probe in
seconds, where Ray itself retries for half a minute), joining or starting the cluster, and placing
the actors on it."""

from __future__ import annotations

import copy
import importlib.util
import os
import re
import socket

from diffrl.config import Config
from diffrl.config import number_problem as _number
from diffrl.core import pins
from diffrl.core.errors import DiffrlError
from diffrl.sampling.engine import engine_devices


def ray_checks(config: Config, check_files: bool) -> list[str]:
    """Problems with the ``ray:`` section of a ``runner: ray`` config (``check_files``: also probe
    the cluster at ``ray.address``)."""
    r, errors = config.ray, []
    if importlib.util.find_spec("ray") is None:
        errors.append("runner=ray needs the ray package: pip install 'ray>=2.40'")
    p = config.parallel
    for key, value in (("parallel.engines", p.engines), ("ray.num_reward_workers", r.num_reward_workers)):
        if value < 1:
            errors.append(f"{key} must be >= 1, got {value}")
    if p.trainer_ranks < 1:
        errors.append(f"parallel.trainer_ranks must be >= 1, got {p.trainer_ranks}")
    errors += _number("ray.cpus_per_actor", r.cpus_per_actor, r.cpus_per_actor >= 0, ">= 0")
    if r.threads_per_actor is not None and not 1 <= r.threads_per_actor <= 4096:
        errors.append(
            f"ray.threads_per_actor must be in [1, 4096] or null (share the cores), got {r.threads_per_actor}"
        )
    if r.address not in (None, "auto") and ray_host_port(r.address) is None:
        errors.append(
            f"ray.address must be null (start a local cluster), auto (the cluster 'ray start' began on "
            f"this node) or HOST:PORT of a cluster's head (e.g. 10.0.0.5:6379), got {r.address!r}"
        )
    elif r.address is not None and check_files and not errors:
        problem = ray_address_problem(r.address)
        if problem:
            errors.append(problem)
    # (eval.rewards run on an engine, which holds a GPU share)
    for i, reward in enumerate(config.rewards):
        device = reward.params.get("device") if isinstance(reward.params, dict) else None
        if isinstance(device, str) and device.startswith("cuda") and not r.rewards_on_gpu:
            errors.append(
                f"rewards[{i}] ({reward.name}).params.device={device}, but under runner=ray reward "
                "workers get no GPU unless ray.rewards_on_gpu=true (they then share the ranks' "
                "GPUs); or serve the reward on GPUs of its own (diffrl serve-reward, reward 'remote')"
            )
    if config.model.compile and p.trainer_ranks > 1:
        errors.append(
            f"model.compile=true with parallel.trainer_ranks={p.trainer_ranks}: compiling "
            "FSDP2-sharded transformers is not supported yet; set model.compile=false, or train on "
            "one rank (parallel.trainer_ranks=1; the engines compile either way)"
        )
    gpus = _engine_gpus(config)
    if gpus > 1 and r.colocate:
        errors.append(
            f"rollout.engine={config.rollout.engine}: an engine spanning {gpus} GPUs (its options' "
            "sequence_parallel) cannot share a trainer rank's GPU; set ray.colocate=false"
        )
    if r.backend not in (None, "gloo", "nccl"):
        errors.append(f"ray.backend must be gloo, nccl or null, got {r.backend!r}")
    ranks, per_step, sp = p.trainer_ranks, config.train.batch_size, p.sequence
    if sp < 1:
        errors.append(f"parallel.sequence must be >= 1, got {sp}")
    elif ranks >= 1 and ranks % sp:
        errors.append(
            f"parallel.sequence={sp} ranks per sample do not divide parallel.trainer_ranks={ranks}: "
            f"the trainer ranks form data-parallel groups of {sp} (e.g. parallel.trainer_ranks={sp * max(1, ranks // sp)})"
        )
    elif ranks >= 1 and per_step % (ranks // sp):
        groups = ranks // sp
        errors.append(
            f"batch arithmetic: train.batch_size={per_step} samples per optimizer step do not split "
            f"evenly over {groups} data-parallel group(s) (parallel.trainer_ranks={ranks} / "
            f"parallel.sequence={sp}; groups take whole samples)"
            if sp > 1
            else f"batch arithmetic: train.batch_size={per_step} samples per optimizer step do not "
            f"split evenly over parallel.trainer_ranks={ranks} (ranks take whole samples)"
        )
    return errors


def _engine_gpus(config: Config) -> int:
    """The GPUs one rollout engine holds (1 where its settings cannot be read: the engine's own
    checks report them)."""
    try:
        return engine_devices(config)
    except DiffrlError:
        return 1


def ray_host_port(address: str) -> tuple[str, int] | None:
    """``"host:port"`` or ``"ray://host:port"`` -> ``(host, port)``; None when it is neither."""
    m = re.fullmatch(r"(?:ray://)?\[?([^\[\]\s/]+?)\]?:(\d{1,5})", address.strip())
    if m is None or not 0 < int(m.group(2)) < 65536:
        return None
    return m.group(1), int(m.group(2))


RAY_CONNECT_TIMEOUT_S = 3.0


def ray_address_problem(address: str, timeout_s: float = RAY_CONNECT_TIMEOUT_S) -> str | None:
    """Why ``ray.init(address=address)`` would fail (None when a Ray head accepts TCP connections
    there): checked in seconds, where Ray itself retries for half a minute before it gives up."""
    if address == "auto":
        try:  # Ray's own lookup: RAY_ADDRESS, then the cluster 'ray start' recorded on this node
            # ray is optional (the ray extra); this is a private module that may move
            from ray._private.services import canonicalize_bootstrap_address
        except ImportError:
            return None  # no ray (reported apart) or a Ray that moved it: ray.init will tell
        try:
            found = canonicalize_bootstrap_address("auto")
        except (ConnectionError, ValueError):
            found = None
        if found is None:
            return (
                "ray.address=auto, but no Ray cluster runs on this node (none started with 'ray start' "
                "and RAY_ADDRESS is not set); start one with 'ray start --head', give HOST:PORT of a "
                "cluster's head, or set ray.address=null to start a local cluster for this run"
            )
        address = found
    host_port = ray_host_port(address)
    if host_port is None:
        return f"ray.address: {address!r} is not HOST:PORT"
    host, port = host_port
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as e:
        reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        return (
            f"ray.address={address!r}: nothing accepts connections at {host}:{port} ({reason}, "
            f"{timeout_s:g} s); start the cluster's head there ('ray start --head --port={port}'), fix "
            "the address, or set ray.address=null to start a local cluster for this run"
        )


def import_ray():
    """The ``ray`` package, with ``ray.util.scheduling_strategies`` loaded. Ray is optional (the
    ``ray`` extra), so no diffrl module imports it at the top: each use goes through here."""
    import ray  # ray is optional (the ray extra)
    import ray.util.scheduling_strategies

    return ray


class Cluster:
    """This run's place on a Ray cluster: ``ray.init`` (unless this process runs Ray already),
    the trainer ranks' placement group, and how the actors share its bundles (CPUs and GPUs).

    Colocated (``ray.colocate``), rank i's bundle also holds engines i, i + ranks, ...; its GPU is
    shared evenly between them. Each actor runs ``threads`` torch threads (``ray.threads_per_actor``):
    by default the machine's cores shared by the larger of the two actor groups, or by both when a
    pipelined run computes with both at once.
    """

    def __init__(self, config: Config, needs_reward: bool):
        """Join the cluster at ``ray.address``, or start a local one with room for every actor
        (CPU counts are scheduling units)."""
        ray = import_ray()
        self.settings, self.parallel = r, p = config.ray, config.parallel
        self.pg = None
        pinned = {k: os.environ[k] for k in pins.PINNED_KEYS if k in os.environ}
        self.runtime_env = {"runtime_env": {"env_vars": pinned}} if r.address and pinned else {}
        """Deterministic mode's library pins for the actors of a cluster this run joins (a cluster
        it starts inherits them from this process, as its workers do)."""
        self.num_reward_actors = r.num_reward_workers * len(config.rewards) if needs_reward else 0
        self.owns_ray = not ray.is_initialized()
        if not self.owns_ray:
            return
        if r.address:
            # Ray retries an unreachable address for half a minute, then raises ConnectionError
            problem = ray_address_problem(r.address)
            if problem:
                raise DiffrlError(problem)
            ray.init(address=r.address)
        else:
            n_rewards = r.num_reward_workers * len(config.rewards) if needs_reward else 0
            need = int(r.cpus_per_actor * (p.trainer_ranks + p.engines + n_rewards)) + 1
            ray.init(
                num_cpus=max(os.cpu_count() or 1, need),
                include_dashboard=False,
                # Ray lowers its workers' priority by default (niceness 15); here they are the work
                _system_config={"worker_niceness": 0},
            )

    def place(self, config: Config, engine_gpus: int = 1) -> Config:
        """Check the cluster's devices and reserve the ranks' bundles; returns the config the
        actors get (under Ray each actor sees its own GPU(s) from 0). ``engine_gpus``: the GPUs an
        engine on devices of its own holds (a server spanning several)."""
        ray = import_ray()
        r, p = self.settings, self.parallel
        n_ranks, n_engines, cpus = p.trainer_ranks, p.engines, r.cpus_per_actor
        self.gpu = config.run.device != "cpu" and ray.cluster_resources().get("GPU", 0) > 0
        if config.run.device.startswith("cuda") and not self.gpu:
            raise DiffrlError(
                f"run.device={config.run.device} but the Ray cluster has no GPU; use run.device=cpu or a "
                "cluster with GPUs"
            )
        if config.run.device.startswith("cuda:"):
            config = copy.deepcopy(config)
            config.run.device = "cuda"
        self.engine_gpus = engine_gpus
        side_by_side = n_ranks + n_engines if config.train.off_policy_steps > 0 else max(n_ranks, n_engines)
        self.threads = r.threads_per_actor or max(1, (os.cpu_count() or 1) // side_by_side)
        per_bundle = 1 + (-(-n_engines // n_ranks) if r.colocate else 0)
        if r.rewards_on_gpu:
            per_bundle += -(-self.num_reward_actors // n_ranks)
        self.share = (1.0 / per_bundle) if self.gpu else 0.0
        bundle = {"CPU": cpus * per_bundle, **({"GPU": 1.0} if self.gpu else {})}
        self.pg = ray.util.placement_group([dict(bundle) for _ in range(n_ranks)], strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=300)
        except ray.exceptions.GetTimeoutError as e:
            raise DiffrlError(
                f"the Ray cluster cannot place {n_ranks} trainer-rank bundle(s) of {bundle} within 5 "
                f"minutes (cluster: {ray.cluster_resources()}); lower parallel.trainer_ranks or "
                "ray.cpus_per_actor, or add nodes"
            ) from e
        return config

    def _in_bundle(self, i: int):
        return import_ray().util.scheduling_strategies.PlacementGroupSchedulingStrategy(
            placement_group=self.pg, placement_group_bundle_index=i
        )

    def rank_options(self, i: int) -> dict:
        """``.options`` of trainer rank ``i``: in bundle ``i``."""
        return {
            "num_cpus": self.settings.cpus_per_actor,
            "num_gpus": self.share,
            "scheduling_strategy": self._in_bundle(i),
            **self.runtime_env,
        }

    def engine_options(self, i: int) -> dict:
        """``.options`` of engine ``i``: in a rank's bundle when colocated, else a GPU of its own."""
        cpus = self.settings.cpus_per_actor
        if self.settings.colocate:
            return {
                "num_cpus": cpus,
                "num_gpus": self.share,
                "scheduling_strategy": self._in_bundle(i % self.parallel.trainer_ranks),
                **self.runtime_env,
            }
        return {"num_cpus": cpus, "num_gpus": float(self.engine_gpus) if self.gpu else 0, **self.runtime_env}

    def reward_options(self, i: int) -> dict:
        """``.options`` of reward actor ``i`` (counted over every reward's workers): in rank
        ``i mod ranks``'s bundle, sharing its GPU, with ``ray.rewards_on_gpu``; else CPUs only."""
        if not self.settings.rewards_on_gpu:
            return {"num_cpus": self.settings.cpus_per_actor, **self.runtime_env}
        return {
            "num_cpus": self.settings.cpus_per_actor,
            "num_gpus": self.share,
            "scheduling_strategy": self._in_bundle(i % self.parallel.trainer_ranks),
            **self.runtime_env,
        }

    def close(self) -> None:
        """Release the placement group; shut Ray down if this run started or joined it."""
        ray = import_ray()
        try:
            ray.util.remove_placement_group(self.pg)
        except Exception:
            pass
        if self.owns_ray:
            ray.shutdown()
