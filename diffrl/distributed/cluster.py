"""Where a Ray cluster is and whether it answers: the checks of ``ray.address`` (a TCP probe in
seconds, where Ray itself retries for half a minute) and of the ``ray:`` section."""

from __future__ import annotations

import importlib.util
import re
import socket

from diffrl.config import Config
from diffrl.config import number_problem as _number


def ray_checks(config: Config, check_files: bool) -> list[str]:
    """Problems with the ``ray:`` section of a ``runner: ray`` config (``check_files``: also probe
    the cluster at ``ray.address``)."""
    r, errors = config.ray, []
    if importlib.util.find_spec("ray") is None:
        errors.append("runner=ray needs the ray package: pip install 'ray>=2.40'")
    for name in ("num_engines", "num_reward_workers", "num_trainer_ranks"):
        if getattr(r, name) < 1:
            errors.append(f"ray.{name} must be >= 1, got {getattr(r, name)}")
    errors += _number("ray.cpus_per_actor", r.cpus_per_actor, r.cpus_per_actor >= 0, ">= 0")
    if r.address not in (None, "auto") and ray_host_port(r.address) is None:
        errors.append(
            f"ray.address must be null (start a local cluster), auto (the cluster 'ray start' began on "
            f"this node) or HOST:PORT of a cluster's head (e.g. 10.0.0.5:6379), got {r.address!r}"
        )
    elif r.address is not None and check_files and not errors:
        problem = ray_address_problem(r.address)
        if problem:
            errors.append(problem)
    if r.backend not in (None, "gloo", "nccl"):
        errors.append(f"ray.backend must be gloo, nccl or null, got {r.backend!r}")
    ranks, per_step = r.num_trainer_ranks, config.train.batch_size
    if ranks >= 1 and per_step % ranks:
        errors.append(
            f"batch arithmetic: train.batch_size={per_step} samples per optimizer step do not split "
            f"evenly over ray.num_trainer_ranks={ranks} (ranks take whole samples)"
        )
    return errors


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
