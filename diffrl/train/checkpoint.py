"""Checkpoints in safetensors: the trainable weights (LoRA or full transformer), the optimizer
state, the EMA, and ``checkpoint.json`` naming the family, the base model and the step.

```
checkpoint.json   {"family", "base_model", "lora", "iteration", "format"}
config.yaml       the run's config
trainable.safetensors
optimizer.safetensors   (tensors; param_groups and step counters in its metadata)
ema.safetensors         (when train.ema_decay is set)
old_policy.safetensors  (algorithms that sample with a trailing old policy, e.g. DiffusionNFT)
```
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from diffrl.config import Config, LoraConfig, dump_config
from diffrl.distributed.fsdp import full_tensor
from diffrl.models.base import FamilyMismatchError

FORMAT = "diffrl-checkpoint-1"


def is_checkpoint(path: str | Path) -> bool:
    return (Path(path) / "checkpoint.json").is_file()


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole tensor (gathered from the ranks when FSDP2 shards it)."""
    return full_tensor(t.detach()).contiguous().cpu()


def trainable_state(actor) -> dict[str, torch.Tensor]:
    """The trainable weights by name. On FSDP2 ranks a collective: every rank must call it."""
    module = actor.module
    if actor.config.model.lora is not None:
        from peft.utils import get_peft_model_state_dict

        return {k: _whole(v) for k, v in get_peft_model_state_dict(module).items()}
    return {k: _whole(v) for k, v in module.state_dict().items()}


def load_trainable_state(family, state: dict[str, torch.Tensor], lora: bool) -> None:
    module = family.trainable_module()
    if lora:
        from peft.utils import set_peft_model_state_dict

        result = set_peft_model_state_dict(module, state)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise ValueError(f"LoRA weights do not fit this model: unexpected keys such as {unexpected[0]!r}")
    else:
        module.load_state_dict(state)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    sd = optimizer.state_dict()
    tensors = {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"state.{pid}.{k}"] = _whole(v) if isinstance(v, torch.Tensor) else torch.tensor(v)
    return tensors, {"param_groups": json.dumps(sd["param_groups"])}


def save_checkpoint(path: str | Path, actor, config: Config, iteration: int, write: bool = True) -> Path:
    """Write the checkpoint. On FSDP2 ranks every rank calls it (the shards are gathered) and only
    the one with ``write`` writes."""
    path = Path(path)
    trainable = trainable_state(actor)
    tensors, meta = _optimizer_tensors(actor.optimizer)
    ema = None
    if actor.ema is not None:
        ema = {n: _whole(s) for n, s in zip(_trainable_names(actor), actor.ema.shadow)}
    old = None
    if actor.policy.old is not None:  # named as the live parameters the old ones trail
        names = _names_by_id(actor)
        old = {names[id(live)]: _whole(o) for live, o in actor.policy.old.pairs}
    if not write:
        return path
    path.mkdir(parents=True, exist_ok=True)
    save_file(trainable, str(path / "trainable.safetensors"))
    meta["scheduler"] = json.dumps(actor.scheduler.state_dict())
    meta["actor_step"] = str(actor.step)
    save_file(tensors, str(path / "optimizer.safetensors"), metadata=meta)
    if ema is not None:
        save_file(ema, str(path / "ema.safetensors"))
    if old is not None:
        save_file(old, str(path / "old_policy.safetensors"))
    dump_config(config, path / "config.yaml")
    lora = dataclasses.asdict(config.model.lora) if config.model.lora is not None else None
    info = {
        "format": FORMAT,
        "family": config.model.family,
        "base_model": config.model.path,
        "lora": lora,
        "iteration": iteration,
    }
    (path / "checkpoint.json").write_text(json.dumps(info, indent=1))
    return path


def read_checkpoint_info(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not is_checkpoint(path):
        raise FileNotFoundError(f"{str(path)!r} is not a diffrl checkpoint (no checkpoint.json inside)")
    return json.loads((path / "checkpoint.json").read_text())


def check_checkpoint_family(info: dict[str, Any], family: str, path: str | Path) -> None:
    if info["family"] != family:
        raise FamilyMismatchError(
            f"checkpoint {str(path)!r} was trained on the {info['family']!r} family, not {family!r}; "
            f"use model.family={info['family']} (and its base model) to load it"
        )


def lora_config_of(info: dict[str, Any]) -> LoraConfig | None:
    return LoraConfig(**info["lora"]) if info.get("lora") else None


def load_weights_into(family, path: str | Path, use_ema: bool = True) -> dict[str, Any]:
    """Load a checkpoint's trainable weights (EMA ones when present and ``use_ema``) into ``family``
    whose LoRA adapter (if any) is already in place."""
    path = Path(path)
    info = read_checkpoint_info(path)
    check_checkpoint_family(info, family.name, path)
    state = load_file(str(path / "trainable.safetensors"))
    load_trainable_state(family, state, lora=info.get("lora") is not None)
    ema_file = path / "ema.safetensors"
    if use_ema and ema_file.is_file():
        ema = load_file(str(ema_file))
        params = dict(family.trainable_module().named_parameters())
        with torch.no_grad():
            for n, v in ema.items():
                params[n].copy_(v)
    return info


def load_optimizer_state(actor, path: str | Path) -> None:
    from safetensors import safe_open

    file = Path(path) / "optimizer.safetensors"
    with safe_open(str(file), "pt") as f:
        meta = f.metadata()
        state: dict[int, dict[str, torch.Tensor]] = {}
        for key in f.keys():
            _, pid, name = key.split(".", 2)
            state.setdefault(int(pid), {})[name] = f.get_tensor(key)
    actor.optimizer.load_state_dict({"state": state, "param_groups": json.loads(meta["param_groups"])})
    actor.scheduler.load_state_dict(json.loads(meta["scheduler"]))
    actor.step = int(meta["actor_step"])


def _trainable_names(actor) -> list[str]:
    """Names of the trainable parameters, in the order of ``actor.params`` (and the EMA's shadow)."""
    return [n for n, p in actor.module.named_parameters() if p.requires_grad]


def _names_by_id(actor) -> dict[int, str]:
    return {id(p): n for n, p in actor.family.transformer.named_parameters()}


@torch.no_grad()
def load_resume_state(actor, path: str | Path) -> int:
    """Put ``actor`` back where the checkpoint at ``path`` left it (live weights, optimizer, LR
    schedule, step, EMA, old policy); returns the checkpoint's iteration. Single process only."""
    path = Path(path)
    info = read_checkpoint_info(path)
    check_checkpoint_family(info, actor.family.name, path)
    load_trainable_state(
        actor.family, load_file(str(path / "trainable.safetensors")), lora=info.get("lora") is not None
    )
    load_optimizer_state(actor, path)
    if actor.ema is not None:
        ema_file = path / "ema.safetensors"
        if ema_file.is_file():
            ema = load_file(str(ema_file))
            for n, shadow in zip(_trainable_names(actor), actor.ema.shadow):
                shadow.copy_(ema[n])
        else:
            warnings.warn(
                f"{path} has no EMA weights: the EMA restarts from the resumed weights", stacklevel=2
            )
            for shadow, p in zip(actor.ema.shadow, actor.params):
                shadow.copy_(p)
    old = actor.policy.old
    if old is not None:
        old_file = path / "old_policy.safetensors"
        names = _names_by_id(actor)
        if old_file.is_file():
            state = load_file(str(old_file))
            for live, o in old.pairs:
                o.copy_(state[names[id(live)]])
        else:
            warnings.warn(
                f"{path} has no old-policy weights: the old policy restarts from the resumed weights",
                stacklevel=2,
            )
            for live, o in old.pairs:
                o.copy_(live)
    return int(info["iteration"])
