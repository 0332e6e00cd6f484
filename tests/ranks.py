"""Two (or more) gloo ranks for a test, forked from the test's process.

Forked, not spawned: a spawned rank re-imports torch, diffusers, transformers and peft (~5 s a rank
on 2 cores), a forked one inherits them. Each rank first goes to one thread, so it never enters the
parent's OpenMP pool (whose threads a fork drops), then runs ``fn(rank, *args)``. A rank function
ends with ``os._exit(0)`` after ``destroy_process_group()``: gloo's threads racing C++ static
destructors at interpreter teardown have aborted a child after its work was done.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def _one_thread(rank: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    torch.set_num_threads(1)
    fn(rank, *args)


def run_ranks(fn: Callable[..., None], *args: Any, nprocs: int = 2) -> None:
    """``fn(rank, *args)`` in ``nprocs`` forked processes (spawned where this process is connected
    to Ray: forking its gRPC threads left ``ray.shutdown()`` hanging at the session's end); raises
    what a rank raised."""
    ray = sys.modules.get("ray")
    method = "spawn" if ray is not None and ray.is_initialized() else "fork"
    mp.start_processes(_one_thread, args=(fn, args), nprocs=nprocs, join=True, start_method=method)
