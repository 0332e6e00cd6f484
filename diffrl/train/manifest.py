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
import warnings
from pathlib import Path
from typing import Any

from diffrl.errors import DiffrlError

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
    h = hashlib.sha256()
    with file.open("rb") as f:
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


def read_info(path: str | Path) -> dict[str, Any]:
    """The checkpoint's ``checkpoint.json``, checked but for the files' contents: its format, its
    digest (no field edited since it was written), its fields' types, every file name a plain name
    inside the folder (a symlink pointing out of it refused). Raises :class:`CheckpointError`."""
    path = Path(path)
    info_file = path / INFO
    if not path.is_dir() or not info_file.is_file():
        raise CheckpointError(f"{str(path)!r} is not a diffrl checkpoint (no checkpoint.json inside)")
    try:
        info = json.loads(info_file.read_text())
    except (UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json is corrupt ({str(e)[:200]}); the checkpoint cannot be used "
            "(resume from another one, e.g. train.resume=latest skips it)"
        ) from e
    unsealed = isinstance(info, dict) and info.get("format") == UNSEALED_FORMAT
    if (
        not isinstance(info, dict)
        or info.get("format") not in (FORMAT, UNSEALED_FORMAT)
        or not isinstance(info.get("files"), dict)
    ):
        found = info.get("format") if isinstance(info, dict) else None
        raise CheckpointError(
            f"{_where(path)} has format {str(found)[:60]!r}, this diffrl reads {FORMAT!r} and "
            f"{UNSEALED_FORMAT!r}: use the diffrl that wrote it"
        )
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
    expected = {"run_id": str, "family": str, "iteration": int, "trainer": dict, "loop": dict}
    wrong = [k for k, kind in expected.items() if not isinstance(info.get(k), kind)]
    if wrong:
        raise CheckpointError(
            f"{_where(path)}: checkpoint.json lacks or garbles {', '.join(wrong)}; the checkpoint cannot be used"
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
        target, root = file.resolve(), path.resolve()
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
        if not file.is_file():
            raise CheckpointError(f"{_where(path)}: {name} is missing")
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
        digest = f", content sha256 {base['digest'][:12]}..." if base.get("digest") else ""
        return f"{str(base.get('path'))[:200]!r} ({base.get('family')}{digest})"

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
