"""Ulysses sequence parallel for the families' diffusers transformers, through diffusers' own
context-parallel plans (``ModelMixin.enable_parallelism`` with a ``ContextParallelConfig``; the
plan is the model class's ``_cp_plan``): no attention all-to-all of our own where diffusers has one.

A module of the models layer, not :mod:`diffrl.core.parallel`: it imports diffusers (2.4 s on 2 cores
after torch), which the checkpoint and weight-sync code that import ``diffrl.core.parallel`` do not need.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from diffusers import ContextParallelConfig
from torch import nn
from torch.distributed.device_mesh import DeviceMesh


@contextlib.contextmanager
def _one_accelerator_without_one() -> Iterator[None]:
    """diffusers 0.42.1 ``ModelMixin._resolve_parallel_config`` computes
    ``rank % torch.accelerator.device_count()`` before it looks at a given mesh, and the count is 0
    on a CPU-only machine (ZeroDivisionError); the device it computes is only stored. Scoped to
    that call: the count reads 1 where there is no accelerator (``tests/unit/test_parallel.py``
    notices when an upgrade fixes or breaks this)."""
    if torch.accelerator.device_count() > 0:
        yield
        return
    real = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = real


def enable_sequence_parallel(model: nn.Module, mesh: DeviceMesh) -> None:
    """Ulysses attention over ``mesh["ulysses"]`` for a diffusers transformer with a context-parallel
    plan (``model._cp_plan``): the plan splits the sequence at its inputs and gathers it at its
    outputs, and each attention exchanges heads for sequence (all-to-all) around the kernel. Every
    rank of a sequence group must then run the same inputs; each rank's backward covers its part of
    the sequence, so gradients are summed over the group."""
    config = ContextParallelConfig(ulysses_degree=mesh["ulysses"].size(), mesh=mesh)
    with _one_accelerator_without_one():
        model.enable_parallelism(config=config)
