"""FSDP2 for trainer ranks: ``torch.distributed`` set-up, ``fully_shard`` per transformer block,
and the few collectives the actor needs (sums and maxima of plain numbers).

Following PyTorch's FSDP2 guide (``torch.distributed.fsdp.fully_shard``): each block is its own
FSDP unit (one all-gather per block in forward and backward), then the root module. Parameters
become ``DTensor`` shards on dim 0; frozen and trainable parameters (a peft LoRA on a frozen base)
may share a unit. Gradients are reduce-scattered as the mean over ranks.
"""

from __future__ import annotations

import hashlib
import os
import socket
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass
class DistContext:
    """This process's place in the trainer group."""

    rank: int
    world_size: int
    device: torch.device = torch.device("cpu")
    """Where the small collectives' tensors live (cuda under NCCL)."""

    def sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
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
    rank: int, world_size: int, address: str, port: int, backend: str | None, device: torch.device
) -> DistContext:
    """Join the trainer group (gloo on CPU, NCCL on GPU unless ``backend`` says otherwise)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = address, str(port)
    backend = backend or ("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        # under Ray each rank sees its own GPU(s) from index 0
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=rank, world_size=world_size)
    return DistContext(rank, world_size, device if backend == "nccl" else torch.device("cpu"))


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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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
