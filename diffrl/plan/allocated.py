"""What a step really allocated on CPU, to hold a plan against (``benchmarks/plan_accuracy.py``,
``tests/unit/plan/test_planner.py``): the bytes of the tensors it starts with, plus the high-water
mark of what c10's CPU allocator hands out during it, from ``torch.profiler``'s memory events
(``profile_memory=True``: every allocation and free through the allocator, the kernels' own work
buffers included, which no Python-level tracker sees). Tensor bytes live at the peak: what
``diffrl plan`` predicts."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.profiler import ProfilerActivity, profile


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes of the distinct storages of ``tensors`` (a DTensor: this rank's shard; views once)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if isinstance(t, DTensor):
            t = t._local_tensor
        s = t.untyped_storage()
        if s.nbytes():
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def allocated_rise(step: Callable[[], object]) -> int:
    """The high-water mark of the bytes c10's CPU allocator handed out during ``step()`` and had not
    freed yet (the memory events in time order; frees of blocks allocated before do not count:
    the allocator reports them as of unknown size)."""
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted(
        (e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"
    )
    now = high = 0
    for _, n in events:
        now += n
        high = max(high, now)
    return high
