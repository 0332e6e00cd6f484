"""A checkpoint's manifest, ``checkpoint.json``: what it holds and how to tell it is whole and
unedited. Torch-free, so the command line checks a checkpoint before its world loads.

```
checkpoint.json   {"format", "run_id", "family", "base", "lora", "iteration",
                   "files": {name: sha256}, "trainer": {...}, "loop": {...},
                   "digest": sha256 of all the above in canonical JSON}
```

- ``digest`` covers every other field, so a hand edit (the family, a learning rate, the LR
  schedule's state, the iteration) makes the checkpoint unusable, as an edited weight file does.
- every name in ``files`` is a plain file name inside the checkpoint folder: no separators, no
  ``..``, not absolute; a symlink in the folder must point inside it.
- ``base`` identifies the model the weights were trained on (:func:`base_identity`): a LoRA or a
  fine-tuned transformer fits only its own base.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import warnings
from pathlib import Path
from typing import Any

from diffrl.core.errors import DiffrlError
from diffrl.core.user_files import UserFileError, file_problem, read_bytes

FORMAT = "diffrl-checkpoint-3"
UNSEALED_FORMAT = "diffrl-checkpoint-2"
"""Checkpoints of the previous release: read (their files still checked against their sha256),
with a warning that their ``checkpoint.json`` carries no digest and their base is not recorded."""
INFO = "checkpoint.json"
REQUIRED = frozenset({"trainable.safetensors", "optimizer.safetensors", "config.yaml"})
TMP_PREFIX = ".tmp-"
"""Hidden folders being written (``checkpoints/.tmp-step_00004-PID``); never read as checkpoints."""

SAMPLED_ABOVE = 1 << 20
"""A model file larger than this is identified by its size and its first and last
:data:`SAMPLE_BYTES` (reading a 20 GB transformer whole at every save would cost minutes)."""
SAMPLE_BYTES = 1 << 16
MAX_MODEL_FILES = 20_000
"""Files of a model folder read for its identity at most (a folder with more is not a model)."""


class CheckpointError(DiffrlError):
    """A checkpoint that is missing, truncated, mixed, edited or does not fit the run."""


def sha256_file(file: Path) -> str:
    """The sha256 of a regular file; opened non-blocking (a FIFO swapped in is refused, never
    waited on: :class:`CheckpointError`)."""
    h = hashlib.sha256()
    fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise CheckpointError(f"{str(file)!r} is not a regular file; it cannot be a checkpoint's file")
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _canonical(info: dict[str, Any]) -> bytes:
    body = {k: v for k, v in info.items() if k != "digest"}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def seal(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with its ``digest`` (of every other field) set; what :func:`read_info` checks."""
    info["digest"] = hashlib.sha256(_canonical(info)).hexdigest()
    return info


def _where(path: Path) -> str:
    return f"checkpoint {str(path)!r}"


MAX_INFO_BYTES = 64 * 2**20
"""The largest ``checkpoint.json`` read (a real one is kilobytes: the optimizer's param groups,
the RNG states, the eval history)."""
MAX_ITERATION = 10**9
"""The largest iteration a checkpoint may record (``train.iterations`` is at most this)."""
FORMAT_PREFIX = "diffrl-checkpoint-"
UNUSABLE = (
    "the checkpoint cannot be used: copy it again from where it came from, or use another one "
    "(train.resume=latest skips a damaged one)"
)


def run_folder_hint(path: str | Path) -> str:
    """For a run folder (or its ``checkpoints/``) given where a checkpoint is expected: a sentence
    naming the checkpoint the user likely meant (its ``final``, else its newest ``step_*``);
    ``""`` for any other path."""
    path = Path(path)
    if path.name == "checkpoints" and (path.parent / "run.json").is_file():
        run, root = path.parent, path
    elif (path / "run.json").is_file() or (
        (path / "checkpoints").is_dir() and (path / "metrics.jsonl").exists()
    ):
        run, root = path, path / "checkpoints"
    else:
        return ""
    candidates = []
    if root.is_dir():
        names = sorted(
            (p.name for p in root.iterdir() if not p.name.startswith(TMP_PREFIX) and (p / INFO).is_file()),
            key=lambda n: (n == "final", n),
        )
        candidates = names[-1:]
    if not candidates:
        return f"; {str(run)!r} is a run folder with no checkpoint yet (its checkpoints go to {str(root)!r})"
    best = root / "best"
    also = f" (or its best, {str(best)!r})" if candidates[0] != "best" and (best / INFO).is_file() else ""
    return f"; {str(run)!r} is a run folder: did you mean {str(root / candidates[0])!r}{also}?"


def load_info_file(path: Path) -> Any:
    """``checkpoint.json`` parsed: at most :data:`MAX_INFO_BYTES`, never blocking (a FIFO), nesting
    and numbers bounded; anything else a :class:`CheckpointError` naming the file."""
    info_file = path / INFO
    if not path.is_dir():
        what = "no such folder" if not (path.exists() or path.is_symlink()) else "not a folder"
        raise CheckpointError(f"{str(path)!r} is not a diffrl checkpoint ({what}){run_folder_hint(path)}")
    if not (info_file.exists() or info_file.is_symlink()):
        raise CheckpointError(
            f"{str(path)!r} is not a diffrl checkpoint (no checkpoint.json inside){run_folder_hint(path)}"
        )
    problem = file_problem(info_file)  # a FIFO, a folder, a symlink loop: said, never opened
    if problem is None and (size := info_file.stat().st_size) > MAX_INFO_BYTES:
        problem = (
            f"is {size:,} bytes, more than the {MAX_INFO_BYTES:,} read at most (a real one is kilobytes)"
        )
    if problem is not None:
        raise CheckpointError(f"{_where(path)}: checkpoint.json {problem}; {UNUSABLE}")
    try:  # again once open: it may have been swapped since
        data = read_bytes(info_file, f"{_where(path)}: checkpoint.json", UNUSABLE, MAX_INFO_BYTES)
    except UserFileError as e:
        raise CheckpointError(str(e)) from e
    try:
        return json.loads(data.decode("utf-8"))
    # ValueError: not JSON, not UTF-8, or a number of more than 4,300 digits; RecursionError: nested
    # thousands deep (a real one is 4 deep)
    except (ValueError, RecursionError) as e:
        why = "nested too deeply" if isinstance(e, RecursionError) else str(e)[:200]
        raise CheckpointError(f"{_where(path)}: checkpoint.json is corrupt ({why}); {UNUSABLE}") from e


def _format_problem(path: Path, found: Any) -> str:
    """Why a checkpoint.json of format ``found`` cannot be read, and what to do."""
    shown = str(found)[:60] if found is not None else "none"
    number = str(found).removeprefix(FORMAT_PREFIX) if isinstance(found, str) else ""
    newest = int(FORMAT.removeprefix(FORMAT_PREFIX))
    if isinstance(found, str) and found.startswith(FORMAT_PREFIX) and number.isdigit() and len(number) < 9:
        if int(number) > newest:
            return (
                f"{_where(path)} has format {shown!r}, written by a newer diffrl; this one reads "
                f"{FORMAT!r} and {UNSEALED_FORMAT!r}: upgrade diffrl (pip install -U diffrl) to use it"
            )
    return (
        f"{_where(path)} has format {shown!r}, this diffrl reads {FORMAT!r} and "
        f"{UNSEALED_FORMAT!r}: use the diffrl that wrote it"
    )


def _type_problems(info: dict[str, Any]) -> list[str]:
    """The fields of ``info`` this diffrl reads that are missing or of the wrong type."""

    def whole(v: Any, lo: int, hi: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi

    trainer, loop = info.get("trainer"), info.get("loop")
    checks = {
        "run_id": isinstance(info.get("run_id"), str),
        "family": isinstance(info.get("family"), str),
        "iteration": whole(info.get("iteration"), 0, MAX_ITERATION),
        "lora": info.get("lora") is None or isinstance(info.get("lora"), dict),
        "trainer": isinstance(trainer, dict),
        "loop": isinstance(loop, dict),
    }
    if isinstance(trainer, dict):
        checks["trainer.param_groups"] = isinstance(trainer.get("param_groups"), list) and all(
            isinstance(g, dict) for g in trainer["param_groups"]
        )
        checks["trainer.scheduler"] = isinstance(trainer.get("scheduler"), dict)
        checks["trainer.actor_step"] = whole(trainer.get("actor_step"), 0, 2**62)
        checks["trainer.rng"] = "rng" not in trainer or isinstance(trainer["rng"], dict)
    if isinstance(loop, dict):
        seconds = loop.get("train_time_s", 0.0)
        checks["loop.train_time_s"] = (
            isinstance(seconds, int | float) and not isinstance(seconds, bool) and 0 <= seconds < 1e12
        )
        checks["loop.final"] = isinstance(loop.get("final", False), bool)
        guard = loop.get("guard", {})
        checks["loop.guard"] = isinstance(guard, dict) and all(whole(v, 0, 2**62) for v in guard.values())
        checks["loop.rollout_version"] = "rollout_version" not in loop or whole(
            loop["rollout_version"], 0, 2**62
        )
        evals = loop.get("evals", [])
        checks["loop.evals"] = isinstance(evals, list) and all(
            isinstance(e, dict) and whole(e.get("step"), 0, MAX_ITERATION) for e in evals
        )
    return [k for k, ok in checks.items() if not ok]


def read_info(path: str | Path) -> dict[str, Any]:
    """The checkpoint's ``checkpoint.json``, checked but for the files' contents: its format, its
    digest (no field edited since it was written), its fields' types, every file name a plain name
    inside the folder (a symlink pointing out of it refused). Raises :class:`CheckpointError`."""
    path = Path(path)
    info = load_info_file(path)
    unsealed = isinstance(info, dict) and info.get("format") == UNSEALED_FORMAT
    if (
        not isinstance(info, dict)
        or info.get("format") not in (FORMAT, UNSEALED_FORMAT)
        or not isinstance(info.get("files"), dict)
    ):
        raise CheckpointError(_format_problem(path, info.get("format") if isinstance(info, dict) else None))
    if unsealed:
        warnings.warn(
            f"{_where(path)} was written by an older diffrl ({UNSEALED_FORMAT}): its files are checked "
            "against their sha256, but its checkpoint.json carries no digest and its base model is not "
            "recorded, so a hand edit or another base model cannot be detected",
            stacklevel=2,
        )
    elif info.get("digest") != hashlib.sha256(_canonical(info)).hexdigest():
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json was changed after the checkpoint was written (its digest "
            "does not match its content: a hand edit?); diffrl does not use an edited checkpoint: use "
            "the run's own copy, or resume from another checkpoint"
        )
    wrong = _type_problems(info)
    if wrong:
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json lacks or garbles {', '.join(wrong)}; {UNUSABLE}"
        )
    for name in info["files"]:
        _check_file_name(path, name)
    for name in sorted(REQUIRED - set(info["files"])):
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json does not list {name}; the checkpoint is incomplete"
        )
    return info


def _check_file_name(path: Path, name: Any) -> None:
    """A listed file is a plain name in the folder (a symlink's target inside it too)."""
    plain = (
        isinstance(name, str)
        and name not in ("", ".", "..", INFO)
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and not os.path.isabs(name)
    )
    if not plain:
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json lists the file {str(name)[:200]!r}, which is not a plain "
            "file name inside the checkpoint folder; the checkpoint cannot be used"
        )
    file = path / name
    if file.is_symlink():
        target, root = Path(os.path.realpath(file)), Path(os.path.realpath(path))
        if root not in target.parents:
            raise CheckpointError(
                f"{_where(path)}: {name} is a symlink to {str(target)[:200]!r}, outside the checkpoint "
                "folder; copy the checkpoint with its files (e.g. cp -rL) and use the copy"
            )


def verify_checkpoint(path: str | Path, only: set[str] | None = None) -> dict[str, Any]:
    """:func:`read_info`, then every file (``only``: just those) against its sha256; returns the info.

    Raises :class:`CheckpointError` naming the file for a missing, truncated or foreign file
    (one the checkpoint does not list), or an unreadable or edited ``checkpoint.json``."""
    path = Path(path)
    info = read_info(path)
    listed = info["files"]
    present = {f.name for f in path.iterdir() if f.is_file() and f.name != INFO}
    for name in sorted(present - set(listed)):
        raise CheckpointError(
            f"{_where(path)}: {name} is not one of its files (a folder mixing two checkpoints, or an "
            "output written into it?); the checkpoint cannot be trusted"
        )
    for name, digest in sorted(listed.items()):
        if only is not None and name not in only:
            continue
        file = path / name
        problem = file_problem(file)  # nothing opened: a FIFO in its place never blocks
        if problem == "does not exist":
            raise CheckpointError(f"{_where(path)}: {name} is missing; {UNUSABLE}")
        if problem is not None:
            raise CheckpointError(f"{_where(path)}: {name} {problem}; {UNUSABLE}")
        if sha256_file(file) != digest:
            raise CheckpointError(
                f"{_where(path)}: {name} does not match its sha256 in checkpoint.json "
                "(truncated, edited, or written by another run); the checkpoint cannot be used"
            )
    return info


# ------------------------------------------------------------------------------------------------
# The base model a checkpoint's weights fit
# ------------------------------------------------------------------------------------------------


def folder_digest(folder: Path) -> str:
    """A sha256 of a model folder's content that does not depend on where it lies: each file's
    relative path and size, and its bytes (the first and last :data:`SAMPLE_BYTES` of files above
    :data:`SAMPLED_ABOVE`); hidden files and folders (``.cache``, ``.lock``) are left out."""
    h = hashlib.sha256()
    count = 0
    for root, dirs, files in os.walk(folder, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(f for f in files if not f.startswith(".")):
            count += 1
            if count > MAX_MODEL_FILES:
                raise CheckpointError(
                    f"{str(folder)!r} holds more than {MAX_MODEL_FILES} files: not a model folder"
                )
            file = Path(root) / name
            size = file.stat().st_size
            h.update(f"{file.relative_to(folder).as_posix()}\0{size}\0".encode())
            with file.open("rb") as f:
                if size <= SAMPLED_ABOVE:
                    h.update(f.read())
                else:
                    h.update(f.read(SAMPLE_BYTES))
                    f.seek(size - SAMPLE_BYTES)
                    h.update(f.read(SAMPLE_BYTES))
    return h.hexdigest()


def base_identity(family: str, model_path: str) -> dict[str, Any]:
    """What identifies the base model ``model.path`` names: a folder by its content
    (:func:`folder_digest`: a copied or moved folder is the same base), a built-in name
    (``random``, ``base``) by that name."""
    folder = Path(model_path).expanduser()
    digest = folder_digest(folder) if folder.is_dir() else None
    return {"family": family, "path": model_path, "digest": digest}


def base_problem(info: dict[str, Any], family: str, model_path: str, path: str | Path) -> str | None:
    """Why the checkpoint ``info`` (at ``path``) does not fit the base model ``model_path`` (None
    when it does): its weights were trained on another one. Checked before any model loads."""
    saved = info.get("base")
    if info.get("format") == UNSEALED_FORMAT and saved is None:
        return None  # not recorded before format 3: read_info warned
    if not isinstance(saved, dict):
        return f"{_where(Path(path))}: checkpoint.json does not record its base model; the checkpoint cannot be used"
    here = base_identity(family, model_path)
    same = (
        saved.get("digest") == here["digest"]
        if saved.get("digest") and here["digest"]
        else (saved.get("digest"), saved.get("path")) == (here["digest"], here["path"])
    )
    if same:
        return None

    def named(base: dict[str, Any]) -> str:
        digest = f", content sha256 {str(base['digest'])[:12]}..." if base.get("digest") else ""
        return f"{str(base.get('path'))[:200]!r} ({str(base.get('family'))[:100]}{digest})"

    return (
        f"{_where(Path(path))} was trained on the base model {named(saved)}, and this config loads "
        f"{named(here)}: its weights fit only their own base. Set model.path to that base model "
        "(a copied or moved folder with the same content is fine)"
    )


# ------------------------------------------------------------------------------------------------
# Outputs that must not land in an input
# ------------------------------------------------------------------------------------------------


def _resolved(path: Path) -> Path:
    return Path(os.path.realpath(Path(path).expanduser()))


def checkpoint_around(path: str | Path) -> Path | None:
    """The checkpoint ``path`` is, or lies inside (a folder with ``checkpoint.json``, or a run's
    ``checkpoints/`` folder), if any: a folder no command may write into."""
    path = _resolved(Path(path))
    for p in (path, *path.parents):
        if (p / INFO).is_file():
            return p
        if p.name == "checkpoints" and (p.parent / "run.json").is_file():
            return p
    return None


def overlap(out: str | Path, inputs: dict[str, str | Path | None]) -> str | None:
    """Why writing into ``out`` would damage an input (``inputs``: its role -> folder, e.g.
    ``{"the target checkpoint": ...}``; None entries skipped): ``out`` is one of them or inside one,
    or inside a checkpoint. None when it is a safe place."""
    target = _resolved(Path(out))
    for role, folder in inputs.items():
        if folder is None or not Path(folder).expanduser().is_dir():
            continue
        where = _resolved(Path(folder))
        if target == where or where in target.parents:
            inside = "is" if target == where else "lies inside"
            return f"{str(out)!r} {inside} {role} ({str(folder)!r})"
    around = checkpoint_around(target)
    if around is not None:
        return f"{str(out)!r} lies inside the checkpoint folder {str(around)!r}"
    return None
