"""Weight sync from the trainer ranks to the rollout engines: only the trainable tensors.

With LoRA that is the adapter's A/B pairs (the engines hold the base model already); for a full
fine-tune, the transformer's parameters. The tensors are gathered from the FSDP2 shards (every
rank takes part), sent once through Ray's object store and copied into each engine's module by
name. A SHA-256 over names and bytes, computed on each side from the tensors it holds, proves
that the engines sample with exactly the trainer's weights (:class:`EngineWeights`; an engine that
replaces a dead one takes the current weights first, and is checked alike).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import torch
from torch import nn

from diffrl.core.parallel import full_tensor, state_checksum
from diffrl.distributed.ray.actor_errors import get
from diffrl.distributed.ray.cluster import import_ray
from diffrl.distributed.ray.dispatch import ActorPool
from diffrl.train.actor import OLD_ADAPTER

LIVE_ADAPTER = "default"


def _adapter_params(module: nn.Module, adapter: str) -> list[tuple[str, torch.Tensor]]:
    """The LoRA tensors of one peft adapter: ``...lora_A.<adapter>.weight`` (linear layers) or
    ``...lora_embedding_A.<adapter>`` (embeddings)."""
    pattern = re.compile(rf"\.{re.escape(adapter)}(\.|$)")
    return [(n, p) for n, p in module.named_parameters() if "lora_" in n and pattern.search(n)]


def _rename(name: str, adapter: str) -> str:
    return re.sub(rf"\.{re.escape(adapter)}(?=\.|$)", f".{LIVE_ADAPTER}", name)


def _gather(named: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: full_tensor(p.detach()).contiguous().cpu() for name, p in named}


def sampling_state(actor) -> dict[str, torch.Tensor]:
    """The weights rollouts sample with (the old policy when the algorithm samples with one), named
    as an engine's module names them (one LoRA adapter, ``default``). A collective on FSDP2 ranks."""
    old = actor.policy.sampling_old
    module = actor.family.transformer
    if actor.config.model.lora is not None:
        adapter = OLD_ADAPTER if old is not None else LIVE_ADAPTER
        named = _adapter_params(module, adapter)
        return {_rename(n, adapter): t for n, t in _gather(named).items()}
    source = old.module if old is not None else module
    return _gather(list(source.named_parameters()))


def live_state(actor) -> dict[str, torch.Tensor]:
    """The live trainable weights (EMA swapped in if enabled), engine naming; for eval."""
    module = actor.family.transformer
    with actor.eval_weights():
        if actor.config.model.lora is not None:
            named = _adapter_params(module, LIVE_ADAPTER)
        else:
            named = list(module.named_parameters())
        return _gather(named)


@torch.no_grad()
def load_state(module: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``module``'s parameters by name; every name must exist."""
    params = dict(module.named_parameters())
    missing = [k for k in state if k not in params]
    if missing:
        raise KeyError(f"weight sync: the engine's module has no parameter {missing[0]!r}")
    for k, v in state.items():
        params[k].copy_(v.to(params[k].device, params[k].dtype))


def module_state(module: nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    params = dict(module.named_parameters())
    return {k: params[k].detach().cpu() for k in names}


checksum = state_checksum


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


class EngineWeights:
    """The sampling weights the engines hold, in Ray's object store since the last sync."""

    def __init__(self) -> None:
        self.ref = None
        self.version = 0
        """The version of the weights sent last (the trainer's updates at the time)."""

    def sync(
        self, gather: Callable[[], dict[str, torch.Tensor]], engines: ActorPool, version: int
    ) -> dict[str, float]:
        """Send the state ``gather()`` returns (the trainer's sampling weights after ``version``
        updates) to every engine and check that they hold it exactly; an engine that died meanwhile
        is replaced (and checked)."""
        ray = import_ray()
        t0 = time.time()
        state = gather()
        expected = checksum(state)
        self.ref, self.version = ray.put(state), version
        sent = [(i, e, e.load.remote(self.ref, version)) for i, e in enumerate(engines.actors)]
        match = True
        for i, engine, ref in sent:
            try:
                match &= get(ref) == expected
            except ray.exceptions.RayActorError:
                engines.replace(i, engine)  # the replacement loads the state and is checked
        if not match:
            raise RuntimeError("weight sync: an engine's weights differ from the trainer's after the sync")
        return {
            "perf/weight_sync_time": time.time() - t0,
            "sync/checksum_match": float(match),
            "sync/bytes": float(state_bytes(state)),
        }

    def load_into(self, i: int, engine) -> None:
        """Ready replacement engine ``i``: it takes the current weights (if any were sent yet), and
        its checksum must match."""
        if self.ref is None:
            return
        ray = import_ray()
        held = get(engine.load.remote(self.ref, self.version))
        if held != checksum(ray.get(self.ref)):
            raise RuntimeError(f"weight sync: replacement engine {i} does not hold the trainer's weights")
