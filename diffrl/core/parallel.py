"""FSDP2 for trainer ranks: ``torch.distributed`` set-up, ``fully_shard`` per transformer block,
the data x sequence device mesh, and the few collectives the actor needs (sums and maxima of plain
numbers).

Following PyTorch's FSDP2 guide (``torch.distributed.fsdp.fully_shard``): each block is its own
FSDP unit (one all-gather per block in forward and backward), then the root module. Parameters
become ``DTensor`` shards on dim 0; frozen and trainable parameters (a peft LoRA on a frozen base)
may share a unit. Gradients are reduce-scattered as the mean over ranks.
"""

from __future__ import annotations

import hashlib
import os
import random
import socket
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

SEQUENCE_MESH_DIMS = ("dp", "ring", "ulysses")
"""The trainer mesh's axes: data parallel, then diffusers' two context-parallel axes (ring is 1)."""


def sequence_mesh(device_type: str, data: int, sequence: int) -> DeviceMesh:
    """The ``(dp, ring=1, ulysses)`` mesh over ``data * sequence`` ranks: consecutive ranks share
    a sequence group (rank r is in data group r // sequence)."""
    return init_device_mesh(device_type, (data, 1, sequence), mesh_dim_names=SEQUENCE_MESH_DIMS)


@dataclass
class DistContext:
    """This process's place in the trainer group: ``world_size = data groups x sequence``; the
    ``sequence`` ranks of a data group (consecutive ranks) hold the same examples and split each
    sample's tokens (Ulysses, over ``mesh["ulysses"]``)."""

    rank: int
    world_size: int
    device: torch.device = torch.device("cpu")
    """Where the small collectives' tensors live (cuda under NCCL)."""
    sequence: int = 1
    mesh: DeviceMesh | None = None
    """The ``(dp, ring, ulysses)`` mesh when ``sequence > 1`` (:func:`sequence_mesh`)."""

    @property
    def data_rank(self) -> int:
        """This rank's data group (the share of a step's examples it holds)."""
        return self.rank // self.sequence

    def sum(self, values: list[float]) -> list[float]:
        """Sums over the data groups of per-group values (each group's first rank counts; the
        other ranks of a sequence group hold the same numbers)."""
        counted = values if self.rank % self.sequence == 0 else [0.0] * len(values)
        t = torch.tensor(counted, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def all(self, flag: bool) -> bool:
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MIN)
        return bool(t.item())


def init_distributed(
    rank: int,
    world_size: int,
    address: str,
    port: int,
    backend: str | None,
    device: torch.device,
    sequence: int = 1,
) -> DistContext:
    """Join the trainer group (gloo on CPU, NCCL on GPU unless ``backend`` says otherwise); with
    ``sequence > 1``, also the data x sequence mesh (``world_size`` a multiple of ``sequence``)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        # under Ray each rank sees its own GPU(s) from index 0
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    mesh = sequence_mesh(device.type, world_size // sequence, sequence) if sequence > 1 else None
    small = device if backend == "nccl" else torch.device("cpu")
    return DistContext(rank, world_size, small, sequence, mesh)


def shard_module(module: nn.Module, blocks: list[nn.Module]) -> None:
    """``fully_shard`` each block, then the root (its remaining parameters form one unit)."""
    for block in blocks:
        fully_shard(block)
    fully_shard(module)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor from a ``DTensor`` shard (a collective: every rank must call it), or ``t``."""
    return t.full_tensor() if isinstance(t, DTensor) else t


@torch.no_grad()
def copy_full_(dst: torch.Tensor, full: torch.Tensor) -> None:
    """Copy the whole tensor ``full`` into ``dst``, or into this rank's shard of it when ``dst`` is
    a ``DTensor`` (a collective then: every rank must call it, with the same ``full``)."""
    if isinstance(dst, DTensor):
        full = distribute_tensor(full.to(dst.device, dst.dtype), dst.device_mesh, dst.placements)
    dst.copy_(full)


LISTEN_PORTS_FROM = 20000
"""The lowest port :func:`listen_port` draws: above Ray's worker ports (10002-19999 by default)."""


def ephemeral_ports() -> tuple[int, int]:
    """The range the kernel gives outgoing connections their local port from (Linux
    ``ip_local_port_range``; Linux's default elsewhere)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def bindable(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def listen_port(host: str = "", avoid: tuple[int, ...] = (), pair: bool = False) -> int:
    """A port free now, for a server that binds it later (a torch.distributed store, a serving
    engine once it has loaded). Drawn at random below the kernel's ephemeral range where there is
    room: a port of that range, free when drawn, can be taken before the server binds it as the
    local port of any outgoing connection (the CI saw an sglang server stop on "[Errno 98] address
    already in use"). Not in ``avoid``; ``pair``: the next port is free too (a server that binds
    both). Only another program binding ports explicitly can still take it first."""
    low, _ = ephemeral_ports()
    draw = random.SystemRandom()  # not a result: no run seed, and two processes must not draw alike
    for _ in range(200):
        if low - 1 > LISTEN_PORTS_FROM + 100:
            p = draw.randrange(LISTEN_PORTS_FROM, low - 1)
        else:
            with socket.socket() as s:
                s.bind((host, 0))
                p = s.getsockname()[1]
        if (
            {p, p + 1 if pair else p} & set(avoid)
            or not bindable(host, p)
            or (pair and not bindable(host, p + 1))
        ):
            continue
        return p
    raise OSError(f"no free port to listen on for {host or 'all addresses'}")


def free_port() -> int:
    """A port for a torch.distributed store on all addresses (:func:`listen_port`)."""
    return listen_port()


def state_checksum(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over a state's tensors sorted by name, each the name's bytes then the tensor's raw
    bytes: what the Ray weight sync compares, and sglang's ``compute_weights_checksum``
    (``multimodal_gen/runtime/loader/weight_utils.py``), so a server's ``/get_weights_checksum``
    can be checked against it."""
    h = hashlib.sha256()
    for k in sorted(state):
        h.update(k.encode())
        h.update(state[k].detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
