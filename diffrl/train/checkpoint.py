"""Checkpoints in safetensors: the trainable weights (LoRA or full transformer), the optimizer
state, the EMA, the old policy, and ``checkpoint.json`` naming the family, the base model, the
step, the run and the sha256 of every file.

```
checkpoint.json         {"format", "run_id", "family", "base", "lora", "iteration",
                         "files": {name: sha256}, "trainer": {optimizer param groups, LR schedule,
                         step}, "loop": {eval history, training time, final}, "digest"}
                        (see train/manifest.py: the digest covers every other field; "base"
                        identifies the base model the weights fit)
config.yaml             the run's config
trainable.safetensors
optimizer.safetensors   (tensors; the rest of the optimizer state is in checkpoint.json)
ema.safetensors         (when train.ema_decay is set)
old_policy.safetensors  (algorithms that sample with a trailing old policy, e.g. DiffusionNFT)
rollout_weights.safetensors
                        (train.off_policy_steps: 1) the sampling weights the engines held: those
                        the rollout in flight was drawn with; a resumed run draws it again with
                        them (their version: "loop": {"rollout_version": ...})
```

A checkpoint is written whole or not at all: into a hidden temporary folder next to it, each
file fsync'ed, ``checkpoint.json`` last, then renamed into place. Readers verify every file
against its sha256 (:func:`verify_checkpoint`), so a truncated file or a folder mixing two
runs' files is refused with the name of the file, and so is an edited ``checkpoint.json``
(:mod:`diffrl.train.manifest`). A write that fails for want of space (or any storage error) is
:class:`CheckpointWriteError`: nothing was written, the previous checkpoint is intact.
"""

from __future__ import annotations

import base64
import dataclasses
import errno
import fnmatch
import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch
from peft.utils import get_peft_model_state_dict
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.distributed.tensor import DTensor, distribute_tensor

from diffrl.config import (
    Config,
    ConfigError,
    LoraConfig,
    bind_config,
    dump_config,
    read_recipe,
    to_plain,
)
from diffrl.core.errors import DiffrlError
from diffrl.core.parallel import copy_full_, full_tensor
from diffrl.models.base import FamilyMismatchError
from diffrl.train.manifest import (
    FORMAT,
    REQUIRED,
    TMP_PREFIX,
    CheckpointError,
    base_identity,
    base_problem,
    load_info_file,
    seal,
    sha256_file,
    verify_checkpoint,
)

__all__ = ["FORMAT", "REQUIRED", "TMP_PREFIX", "CheckpointError", "verify_checkpoint"]  # re-exported

ROLLOUT_WEIGHTS = "rollout_weights.safetensors"
ROLLOUT_VERSION = "rollout_version"

STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EIO}
"""Errors of the storage a checkpoint is written to (full, over quota, too large a file, read-only,
failing), not of diffrl: a clear error, and a resume from the previous checkpoint is safe."""


class StorageError(DiffrlError):
    """A write failed for the storage's sake (a full disk, a quota, a read-only or failing device)."""


class CheckpointWriteError(StorageError):
    """A checkpoint could not be written for the storage's sake: nothing of it was left behind,
    the checkpoints before it are intact."""


def storage_failure(e: BaseException, what: str, fix: str) -> StorageError | None:
    """``e`` as a :class:`StorageError` saying ``what`` could not be written, why, and ``fix``;
    None when ``e`` is not a storage failure (:func:`storage_errno`)."""
    code = storage_errno(e)
    if code is None:
        return None
    return StorageError(f"could not write {what}: {os.strerror(code)} (errno {errno.errorcode[code]}); {fix}")


def storage_errno(e: BaseException) -> int | None:
    """The errno of a storage failure ``e`` (an ``OSError``, or safetensors' own error, which
    carries the OS error in its message: ``IoError(Os { code: 28, ...``); None for anything else."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:  # the error, and what it was raised from
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in STORAGE_ERRNOS:
            return e.errno
        if type(e).__name__ == "SafetensorError":  # Rust's io::Error, as Debug or as Display
            found = re.search(r"Os \{ code: (\d+)|\(os error (\d+)\)", str(e))
            code = int(next(g for g in found.groups() if g)) if found else None
            if code in STORAGE_ERRNOS:
                return code
        e = e.__cause__
    return None


def is_checkpoint(path: str | Path) -> bool:
    """A folder with a ``checkpoint.json`` (also one that is no file, a FIFO say: reading it says so)."""
    return os.path.lexists(Path(path) / "checkpoint.json")


def _whole(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of the whole tensor (gathered from the ranks when FSDP2 shards it)."""
    return full_tensor(t.detach()).contiguous().cpu()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------
# What a checkpoint holds
# ------------------------------------------------------------------------------------------------


def trainable_state(actor) -> dict[str, torch.Tensor]:
    """The trainable weights by name. On FSDP2 ranks a collective: every rank must call it."""
    module = actor.module
    if actor.config.model.lora is not None:
        return {k: _whole(v) for k, v in get_peft_model_state_dict(module).items()}
    return {k: _whole(v) for k, v in module.state_dict().items()}


def _lora_key(name: str) -> str:
    """A live LoRA parameter's name -> its key in peft's state dict (the adapter name dropped)."""
    return name.replace(".default.", ".")


@torch.no_grad()
def load_trainable_state(family, state: dict[str, torch.Tensor], lora: bool) -> None:
    """Put ``state`` (whole tensors, as :func:`trainable_state` writes them) into the trainable
    module, also when FSDP2 shards it (then every rank must call it with the same ``state``)."""
    module = family.trainable_module()
    if lora:
        targets = {_lora_key(n): p for n, p in module.named_parameters() if "lora_" in n and ".default." in n}
    else:
        targets = dict(module.state_dict(keep_vars=True))
    unexpected = sorted(set(state) - set(targets))
    missing = sorted(set(targets) - set(state))
    if unexpected or missing:
        what = f"unexpected keys such as {unexpected[0]!r}" if unexpected else f"no {missing[0]!r}"
        raise CheckpointError(f"the checkpoint's weights do not fit this model: {what}")
    for key, value in state.items():
        if tuple(targets[key].shape) != tuple(value.shape):
            raise CheckpointError(
                f"the checkpoint's weights do not fit this model: {key} is {tuple(value.shape)} in the "
                f"checkpoint, {tuple(targets[key].shape)} here (another base model or LoRA settings?)"
            )
        copy_full_(targets[key], value)


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list]:
    sd = optimizer.state_dict()
    tensors = {}
    for pid, state in sd["state"].items():
        for k, v in state.items():
            tensors[f"state.{pid}.{k}"] = _whole(v) if isinstance(v, torch.Tensor) else torch.tensor(v)
    return tensors, sd["param_groups"]


def _rng_state() -> dict[str, list[str]]:
    """torch's global generators (LoRA dropout draws from them), base64 for checkpoint.json."""
    states = {"cpu": [base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode()]}
    if torch.cuda.is_available():
        states["cuda"] = [
            base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()
        ]
    return states


def _set_rng_state(states: dict[str, list[str]]) -> None:
    def tensor(b64: str) -> torch.Tensor:
        return torch.frombuffer(bytearray(base64.b64decode(b64)), dtype=torch.uint8)

    torch.set_rng_state(tensor(states["cpu"][0]))
    if "cuda" in states and torch.cuda.is_available() and len(states["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([tensor(s) for s in states["cuda"]])


def _trainable_names(actor) -> list[str]:
    """Names of the trainable parameters, in the order of ``actor.params`` (and the EMA's shadow)."""
    return [n for n, p in actor.module.named_parameters() if p.requires_grad]


def _names_by_id(actor) -> dict[int, str]:
    return {id(p): n for n, p in actor.family.transformer.named_parameters()}


# ------------------------------------------------------------------------------------------------
# Writing: whole or not at all
# ------------------------------------------------------------------------------------------------


def save_checkpoint(
    path: str | Path,
    actor,
    config: Config,
    iteration: int,
    write: bool = True,
    run_id: str = "",
    loop_state: dict[str, Any] | None = None,
    rollout_weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write the checkpoint atomically. On FSDP2 ranks every rank calls it (the shards are
    gathered) and only the one with ``write`` writes. ``loop_state``: what the driver needs to
    continue (eval history, training time), stored in ``checkpoint.json``; ``rollout_weights``:
    a pipelined run's engine weights (:data:`ROLLOUT_WEIGHTS`)."""
    path = Path(path)
    files = {"trainable.safetensors": trainable_state(actor)}
    tensors, param_groups = _optimizer_tensors(actor.optimizer)
    files["optimizer.safetensors"] = tensors
    if actor.ema is not None:
        files["ema.safetensors"] = {n: _whole(s) for n, s in zip(_trainable_names(actor), actor.ema.shadow)}
    if actor.policy.old is not None:  # named as the live parameters the old ones trail
        names = _names_by_id(actor)
        files["old_policy.safetensors"] = {names[id(live)]: _whole(o) for live, o in actor.policy.old.pairs}
    if rollout_weights is not None:
        files[ROLLOUT_WEIGHTS] = rollout_weights
    if not write:
        return path
    meta = {
        "format": FORMAT,
        "run_id": run_id,
        "family": config.model.family,
        "base": base_identity(config.model.family, config.model.path),
        "lora": dataclasses.asdict(config.model.lora) if config.model.lora is not None else None,
        "iteration": iteration,
        "trainer": {
            "param_groups": param_groups,
            "scheduler": actor.scheduler.state_dict(),
            "actor_step": actor.step,
            "rng": _rng_state(),
        },
        "loop": loop_state or {},
    }
    tmp = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write(tmp, files, config, meta)
    except Exception as e:
        code = storage_errno(e)
        if code is None:
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind
        raise CheckpointWriteError(
            f"could not write checkpoint {str(path)!r}: {os.strerror(code)} (errno {errno.errorcode[code]}); "
            "the checkpoint was not written and the ones before it are intact, so resuming is safe: free "
            "space (or fix the device), then rerun the same command with train.resume=latest"
        ) from e
    if path.exists():  # a rename cannot replace a non-empty folder: move the old one aside first
        old = path.parent / f"{TMP_PREFIX}{path.name}-{os.getpid()}-old"
        shutil.rmtree(old, ignore_errors=True)
        path.rename(old)
        tmp.rename(path)
        shutil.rmtree(old)
    else:
        tmp.rename(path)
    _fsync(path.parent)
    return path


def _write(
    tmp: Path, files: dict[str, dict[str, torch.Tensor]], config: Config, meta: dict[str, Any]
) -> None:
    """The checkpoint into the temporary folder ``tmp``: each file, fsync'ed, then ``meta`` with
    their sha256 as the sealed ``checkpoint.json`` (:func:`~diffrl.train.manifest.seal`)."""
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    for name, state in files.items():
        save_file(state, str(tmp / name))
    dump_config(config, tmp / "config.yaml")
    digests = {}
    for f in sorted(tmp.iterdir()):
        _fsync(f)
        digests[f.name] = sha256_file(f)
    with (tmp / "checkpoint.json").open("w") as f:
        f.write(json.dumps(seal({**meta, "files": digests}), indent=1))
        f.flush()
        os.fsync(f.fileno())
    _fsync(tmp)


def checkpoints_of(output_dir: str | Path) -> list[Path]:
    """The checkpoint folders of a run (``checkpoints/*`` with a ``checkpoint.json``), temporary
    ones excluded, in no particular order."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if not p.name.startswith(TMP_PREFIX) and is_checkpoint(p)]


def remove_partial_writes(output_dir: str | Path) -> list[Path]:
    """Delete temporary folders left by a process killed while writing a checkpoint (the caller
    holds the run's lock, so no live writer owns them). A checkpoint killed in the middle of being
    replaced (moved aside, its successor not yet in place) is first moved back."""
    root = Path(output_dir) / "checkpoints"
    if not root.is_dir():
        return []
    for old in root.glob(f"{TMP_PREFIX}*-old"):
        name = old.name.removeprefix(TMP_PREFIX).rsplit("-", 2)[0]
        if not (root / name).exists():
            old.rename(root / name)
    removed = list(root.glob(f"{TMP_PREFIX}*"))
    for p in removed:
        shutil.rmtree(p, ignore_errors=True)
    return removed


def prune_checkpoints(output_dir: str | Path, keep_last: int | None, step: int) -> list[Path]:
    """Keep the newest ``keep_last`` ``step_*`` checkpoints up to ``step`` (the one just written);
    ``final``, checkpoints after ``step`` (of a branch given up by resuming an older one) and ones
    that do not verify are left alone, so only good checkpoints are ever counted or removed."""
    if keep_last is None:
        return []
    steps = []
    for p in checkpoints_of(output_dir):
        if p.name.startswith("step_") and 0 <= iteration_of(p) <= step:
            try:
                verify_checkpoint(p)
            except CheckpointError:
                continue
            steps.append(p)
    steps.sort(key=iteration_of)
    doomed = steps[:-keep_last]
    for p in doomed:  # out of sight first: a process killed mid-delete leaves no half checkpoint
        trash = p.parent / f"{TMP_PREFIX}{p.name}-{os.getpid()}-pruned"
        p.rename(trash)
        shutil.rmtree(trash)  # (or remove_partial_writes does, at the next resume)
    return doomed


def iteration_of(path: str | Path) -> int:
    """The iteration a checkpoint's ``checkpoint.json`` records, unverified (-1 if unreadable)."""
    try:
        iteration = load_info_file(Path(path)).get("iteration", -1)
    except (CheckpointError, AttributeError):
        return -1
    return iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else -1


# ------------------------------------------------------------------------------------------------
# Reading: verified
# ------------------------------------------------------------------------------------------------


def read_checkpoint_info(path: str | Path) -> dict[str, Any]:
    """The verified ``checkpoint.json`` of the checkpoint at ``path``."""
    return verify_checkpoint(path)


def latest_checkpoint(output_dir: str | Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint of a run folder that verifies, and why each newer one was skipped."""
    # newest first; at the same iteration 'final' before a step checkpoint (a run stopped in its
    # final eval, then finished), and a step checkpoint before 'best' (train.keep_best: a complete
    # checkpoint too, the newest when the best moved after the last step_*)
    rank = {"final": 2, "best": 0}
    found = sorted(
        checkpoints_of(output_dir), key=lambda p: (iteration_of(p), rank.get(p.name, 1)), reverse=True
    )
    skipped = []
    unreadable = [p for p in found if iteration_of(p) < 0]  # maybe the newest: said, whatever resumes
    for p in [*unreadable, *(p for p in found if p not in unreadable)]:
        try:
            verify_checkpoint(p)
        except CheckpointError as e:
            skipped.append(str(e))
            continue
        return p, skipped
    return None, skipped


def check_checkpoint_family(info: dict[str, Any], family: str, path: str | Path) -> None:
    if info["family"] != family:
        raise FamilyMismatchError(
            f"checkpoint {str(path)!r} was trained on the {info['family']!r} family, not {family!r}; "
            f"use model.family={info['family']} (and its base model) to load it"
        )


def lora_config_of(info: dict[str, Any]) -> LoraConfig | None:
    """The LoRA settings a checkpoint's weights were trained with (None: full weights)."""
    if not info.get("lora"):
        return None
    try:
        return LoraConfig(**info["lora"])
    except TypeError as e:  # settings of another diffrl version (checkpoint.json is sealed)
        raise CheckpointError(
            f"the checkpoint's LoRA settings {str(info['lora'])[:200]} are not this diffrl's ({e}); "
            "use the diffrl that wrote it"
        ) from e


def load_tensors(path: str | Path, name: str) -> dict[str, torch.Tensor]:
    """The tensors of the checkpoint file ``path/name`` (verified against its sha256 before): one
    that is no safetensors file (empty, a header that lies about its tensors) is a
    :class:`CheckpointError` naming it, not a crash."""
    file = Path(path) / name
    try:
        return load_file(str(file))
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"checkpoint {str(path)!r}: {name} is not a readable safetensors file ({str(e)[:200]}); "
            "the checkpoint cannot be used (resume from another one)"
        ) from e


def _unfit(path: str | Path, name: str, e: BaseException) -> CheckpointError:
    return CheckpointError(
        f"checkpoint {str(path)!r}: {name} does not fit this run's model and optimizer ({type(e).__name__}: "
        f"{str(e)[:200]}); resume it with the settings it was trained with, or start a new run"
    )


RESUMABLE = (
    "run.name",
    "run.output_dir",
    "run.device",
    "run.log_every",
    "run.loggers",
    "run.wandb_project",
    "run.peak_tflops",
    "run.threads",
    "run.deterministic",
    "runner",
    "parallel.*",
    "ray.*",
    "model.compile",
    "model.autocast",
    "model.encode_once",
    "model.options.gradient_checkpointing",
    "rollout.micro_group_size",
    "rollout.engine",
    "rollout.engine_options",
    "train.iterations",
    "train.micro_batch_size",
    "train.save_every",
    "train.eval_every",
    "train.time_budget_minutes",
    "train.resume",
    "train.keep_last",
    "train.max_failed_iterations",
    "train.max_nonfinite_steps",
    "eval.enabled",
    "eval.batch_size",
    "eval.grid_images",
    "rewards[*].timeout_s",
    "eval.rewards[*].timeout_s",
    "eval.watch[*].timeout_s",
    "monitor.*",  # the collapse alarm's thresholds: what is logged, not what is trained
)
"""Settings a resumed run may change: where and how it runs (device, runner, workers, micro-batch
layout, gradient checkpointing, which results do not depend on), how long and how often it saves, logs and evaluates, and
deadlines. They take effect from the resumed iteration on and the run folder's ``config.yaml``
records them. Every other setting (the learning rate and optimizer, the seed, the algorithm and its
parameters, the batch arithmetic, sampling, data, rewards, what eval measures) is the run's: the
checkpoint's optimizer and LR schedule, its rollout stream and its eval curve were made with it,
so a change could not take effect, or would make one run of two."""
CHECKED_APART = ("model.family", "model.path", "model.lora", "model.lora.*", "train.resume")
"""Compared by :func:`resume_problems` with their own messages (the base model by content), or
(``train.resume``) what makes a run a resumed one."""


def _flat(value: Any, key: str, out: dict[str, Any]) -> dict[str, Any]:
    """A config's settings by dotted key (``train.lr``, ``rewards[0].name``); mappings of free
    form (``algorithm.params``) are one value each."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            _flat(getattr(value, f.name), f"{key}.{f.name}" if key else f.name, out)
    elif isinstance(value, list) and value and all(dataclasses.is_dataclass(v) for v in value):
        for i, v in enumerate(value):
            _flat(v, f"{key}[{i}]", out)
    else:
        out[key] = to_plain(value)
    return out


def _by_option(flat: dict[str, Any]) -> dict[str, Any]:
    """``flat`` with ``model.options`` one setting per option (``model.options.gradient_checkpointing``
    may change on resume; the family's other options may not)."""
    options = flat.get("model.options")
    if isinstance(options, dict):
        del flat["model.options"]
        flat.update({f"model.options.{k}": v for k, v in options.items()})
    return flat


def _shown(value: Any) -> str:
    text = "(none)" if value is _ABSENT else json.dumps(value, default=str)
    return text if len(text) <= 120 else text[:117] + "..."


_ABSENT = object()


def config_changes(config: Config, path: str | Path) -> tuple[list[str], list[str]]:
    """How ``config`` differs from the config the checkpoint at ``path`` was trained with (its
    verified ``config.yaml``): ``(refused, allowed)``, each ``"key: old ... -> new ..."``; allowed are the
    :data:`RESUMABLE` ones. A saved config this diffrl cannot read is said in ``refused``."""
    file = Path(path) / "config.yaml"
    try:
        saved, errors, _ = bind_config(read_recipe(file), [])
    except ConfigError as e:
        return [f"the checkpoint's config.yaml cannot be read ({' '.join(str(e).split())[:300]})"], []
    if errors:
        warnings.warn(
            f"checkpoint {str(path)!r}: its config.yaml has settings this diffrl does not know "
            f"({'; '.join(errors)[:300]}): only the others are compared with this config",
            stacklevel=2,
        )
    old, new = _by_option(_flat(saved, "", {})), _by_option(_flat(config, "", {}))
    refused, allowed = [], []
    for key in sorted(set(old) | set(new), key=lambda k: (k.split(".")[0], k)):
        before, after = old.get(key, _ABSENT), new.get(key, _ABSENT)
        if before == after or any(fnmatch.fnmatchcase(key, p) for p in CHECKED_APART):
            continue
        line = f"{key}: {_shown(before)} in the checkpoint's run -> {_shown(after)} here"
        general = re.sub(r"\[\d+\]", "[*]", key)
        (allowed if any(fnmatch.fnmatchcase(general, p) for p in RESUMABLE) else refused).append(line)
    return refused, allowed


def resume_problems(
    config: Config, info: dict[str, Any], path: Path, finished_here: bool = False
) -> list[str]:
    """Why the checkpoint ``info`` (at ``path``) cannot continue ``config``; empty if it can.
    ``finished_here``: it is the output folder's own final checkpoint of a run that trained every
    iteration (a rerun writes what that run had left: its report), not "nothing left to run"."""
    problems = []
    if info.get("family") != config.model.family:
        problems.append(
            f"train.resume: {str(path)!r} was trained on the {info.get('family')!r} family, "
            f"this config has model.family={config.model.family}"
        )
    lora = dataclasses.asdict(config.model.lora) if config.model.lora is not None else None
    if info.get("lora") != lora:
        problems.append(
            f"train.resume: the checkpoint's LoRA ({info.get('lora')}) differs from model.lora ({lora}); "
            "resume with the run's own model settings"
        )
    base = base_problem(info, config.model.family, config.model.path, path)
    if base is not None:
        problems.append(f"train.resume: {base}")
    refused, _ = config_changes(config, path)
    if refused:
        problems += [f"train.resume: {line}" for line in refused]
        problems.append(
            f"train.resume: the settings above differ from those the run of {str(path)!r} was trained "
            "with, and a resumed run is that run (its optimizer, LR schedule, seed and eval curve go on "
            f"as they were): resume with its settings (they are in {str(Path(path) / 'config.yaml')!r}), "
            f"or start a new run from its weights: diffrl export {path} DIR --merge, then train with "
            "model.path=DIR in another folder (run.name=OTHER)"
        )
    iteration = info.get("iteration", 0)
    # a step checkpoint at the last iteration (a run stopped during its final eval) may finish
    final = info.get("loop", {}).get("final", False)
    if iteration > config.train.iterations or (
        iteration == config.train.iterations and final and not finished_here
    ):
        problems.append(
            f"train.resume: {str(path)!r} is at iteration {iteration}, train.iterations is "
            f"{config.train.iterations}: nothing left to run (raise train.iterations)"
        )
    return problems


@torch.no_grad()
def load_weights_into(family, path: str | Path, use_ema: bool = True) -> dict[str, Any]:
    """Load a checkpoint's trainable weights (EMA ones when present and ``use_ema``) into ``family``
    whose LoRA adapter (if any) is already in place."""
    path = Path(path)
    info = verify_checkpoint(path)
    check_checkpoint_family(info, family.description.name, path)
    load_trainable_state(
        family, load_tensors(path, "trainable.safetensors"), lora=info.get("lora") is not None
    )
    if use_ema and "ema.safetensors" in info["files"]:
        params = dict(family.trainable_module().named_parameters())
        ema = load_tensors(path, "ema.safetensors")
        # the EMA shadows the trained parameters: all of them, or (LoRA) the adapter's only
        if (
            not ema
            or not set(ema) <= set(params)
            or any(tuple(v.shape) != tuple(params[n].shape) for n, v in ema.items())
        ):
            raise _unfit(path, "ema.safetensors", KeyError("its tensors are not the trainable parameters"))
        for n, v in ema.items():
            copy_full_(params[n], v)
    return info


def load_optimizer_state(actor, path: str | Path, info: dict[str, Any] | None = None) -> None:
    """Restore the optimizer, LR schedule and step counter (into FSDP2 shards on trainer ranks);
    ``info``: the checkpoint's verified ``checkpoint.json`` (read when not given)."""
    info = info if info is not None else verify_checkpoint(path)

    state: dict[int, dict[str, torch.Tensor]] = {}
    tensors = load_tensors(path, "optimizer.safetensors")
    try:
        for key, value in tensors.items():
            _, pid, name = key.split(".", 2)
            param = actor.params[int(pid)]
            if isinstance(param, DTensor) and value.shape == param.shape:  # moments sharded as the param
                value = distribute_tensor(value.to(param.device), param.device_mesh, param.placements)
            state.setdefault(int(pid), {})[name] = value
    except (ValueError, IndexError) as e:  # a key not "state.<param>.<name>", a parameter too many
        raise _unfit(path, "optimizer.safetensors", e) from e
    trainer = info["trainer"]
    try:
        actor.optimizer.load_state_dict({"state": state, "param_groups": trainer["param_groups"]})
        actor.scheduler.load_state_dict(trainer["scheduler"])
        if "rng" in trainer:  # dropout masks after the resume are the uninterrupted run's
            _set_rng_state(trainer["rng"])
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
        raise _unfit(path, "the optimizer state in checkpoint.json", e) from e
    actor.step = int(trainer["actor_step"])


@torch.no_grad()
def load_resume_state(actor, path: str | Path) -> dict[str, Any]:
    """Put ``actor`` back where the checkpoint at ``path`` left it (live weights, optimizer, LR
    schedule, step, EMA, old policy); returns the verified ``checkpoint.json``. On FSDP2 ranks
    every rank calls it."""
    path = Path(path)
    info = verify_checkpoint(path)
    check_checkpoint_family(info, actor.family.description.name, path)
    load_trainable_state(
        actor.family, load_tensors(path, "trainable.safetensors"), lora=info.get("lora") is not None
    )
    load_optimizer_state(actor, path, info)
    if actor.ema is not None:
        if "ema.safetensors" in info["files"]:
            ema = load_tensors(path, "ema.safetensors")
            try:
                for n, shadow in zip(_trainable_names(actor), actor.ema.shadow):
                    copy_full_(shadow, ema[n])
            except (KeyError, RuntimeError) as e:
                raise _unfit(path, "ema.safetensors", e) from e
        else:
            warnings.warn(
                f"{path} has no EMA weights: the EMA restarts from the resumed weights", stacklevel=2
            )
            for shadow, p in zip(actor.ema.shadow, actor.params):
                shadow.copy_(p)
    old = actor.policy.old
    if old is not None:
        names = _names_by_id(actor)
        if "old_policy.safetensors" in info["files"]:
            state = load_tensors(path, "old_policy.safetensors")
            try:
                for live, o in old.pairs:
                    copy_full_(o, state[names[id(live)]])
            except (KeyError, RuntimeError) as e:
                raise _unfit(path, "old_policy.safetensors", e) from e
        else:
            warnings.warn(
                f"{path} has no old-policy weights: the old policy restarts from the resumed weights",
                stacklevel=2,
            )
            for live, o in old.pairs:
                o.copy_(live)
    return info
