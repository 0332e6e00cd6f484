"""``model.encode_once``: every prompt a run conditions on, encoded once for the run, then the text
encoders freed.

A text-to-image run draws its prompts from a fixed set (``data.prompts``, ``eval.prompts``, the
negative prompt), and a frozen text encoder maps each to the same embedding every time, so the
encoders (T5-XXL, a Qwen2.5-VL or Gemma 3: often larger than the transformer) are only needed until
each prompt has been seen once. With ``encode_once`` each process that loads the model (the
engines, the trainer ranks, the local runner) takes the embeddings from the run folder's
:data:`CACHE_FILE`, which the first of them writes (under a file lock: the others wait for it and
read it, so every process, and a resumed run, conditions on the very same tensors), and then drops
its text encoders and tokenizers (:meth:`~diffrl.models.base.ModelFamily.keep_encoded`).
A resumed run reads the file again instead of encoding. Editing families (whose conditioning holds
each prompt's source image) and trained text encoders are refused at validation.
"""

from __future__ import annotations

import fcntl
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from diffrl.config import Config
from diffrl.data.hf import EVAL_SPLITS
from diffrl.data.prompts import load_prompts
from diffrl.models.base import FamilyRuntime

CACHE_FILE = "prompt_embeddings.safetensors"
ENCODE_BATCH = 32
"""Prompts per text-encoder call while filling the cache."""


@dataclass(frozen=True)
class EncodedOnce:
    """What :func:`encode_once` did: ``prompts`` embedded (``cache_bytes`` held), read from the run
    folder or encoded here (``encoded``), and ``released_bytes`` of text-encoder weights freed."""

    prompts: int
    cache_bytes: int
    released_bytes: int
    encoded: bool

    def describe(self) -> str:
        how = "encoded" if self.encoded else "read from the run folder"
        return (
            f"encode once: {self.prompts} prompts {how} ({self.cache_bytes / 2**20:.1f} MiB of embeddings); "
            f"text encoders released ({self.released_bytes / 2**20:.1f} MiB)"
        )


def run_prompts(config: Config) -> list[str]:
    """Every prompt the run conditions on, once each, in a fixed order: the training prompts, the
    eval prompts (when eval is on) and the negative prompt."""
    prompts = list(load_prompts(config.data.prompts).prompts)
    if config.eval.enabled:
        prompts += load_prompts(config.eval.prompts, EVAL_SPLITS).head(config.eval.num_prompts).prompts
    prompts.append(config.sampling.negative_prompt)
    return list(dict.fromkeys(prompts))


def _identity(config: Config) -> dict[str, str]:
    """What the embeddings depend on: the model and its options (a cache of another model is not
    read)."""
    m = config.model
    return {"family": m.family, "path": str(m.path), "options": json.dumps(m.options, sort_keys=True)}


def _read(path: Path, config: Config, prompts: list[str]) -> dict[str, dict[str, torch.Tensor]] | None:
    """The cached embeddings by prompt, or None when the file is of another model or lacks some,
    or cannot be read (damaged, edited: a derived file, encoded again with a warning)."""
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
            if json.loads(meta.get("identity", "null")) != _identity(config):
                return None
            stored = json.loads(meta.get("prompts", "[]"))
            index = {p: i for i, p in enumerate(stored)}
            if any(p not in index for p in prompts):
                return None
            names = json.loads(meta.get("names", "[]"))
            tensors = {n: f.get_tensor(n) for n in names}
            return {p: {n: t[index[p]] for n, t in tensors.items()} for p in prompts}
    except Exception as e:  # noqa: BLE001 - safetensors' error, JSON, wrong shapes: all the file's
        detail = " ".join(f"{type(e).__name__}: {e}".split())[:200]
        warnings.warn(
            f"prompt cache {str(path)!r} cannot be read ({detail}); encoding the prompts again", stacklevel=2
        )
        return None


def _write(path: Path, config: Config, prompts: list[str], rows: dict[str, dict[str, torch.Tensor]]) -> None:
    names = sorted(rows[prompts[0]])
    tensors = {n: torch.stack([rows[p][n] for p in prompts]).contiguous().cpu() for n in names}
    meta = {
        "identity": json.dumps(_identity(config)),
        "prompts": json.dumps(prompts),
        "names": json.dumps(names),
    }
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    save_file(tensors, str(tmp), metadata=meta)
    tmp.replace(path)


def encode_once(family: FamilyRuntime, config: Config) -> EncodedOnce:
    """Fill ``family``'s prompt cache with every prompt of the run (from the run folder's file, or
    encoded here and written there), then release its text encoders."""
    prompts = run_prompts(config)
    out = config.run.resolved_output_dir().absolute()  # runs/<run.name> without run.output_dir
    out.mkdir(parents=True, exist_ok=True)
    path = out / CACHE_FILE
    with open(out / f".{CACHE_FILE}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one process encodes; the others wait and read its file
        rows = _read(path, config, prompts) if path.is_file() else None
        encoded = rows is None
        if rows is None:
            rows = {}
            for i in range(0, len(prompts), ENCODE_BATCH):
                chunk = prompts[i : i + ENCODE_BATCH]
                cond = family.encode_prompts(chunk)
                rows.update(
                    {p: {n: t[j].cpu() for n, t in cond.tensors.items()} for j, p in enumerate(chunk)}
                )
            _write(path, config, prompts, rows)
    released = family.keep_encoded(rows)
    cache_bytes = sum(t.numel() * t.element_size() for r in rows.values() for t in r.values())
    return EncodedOnce(len(prompts), cache_bytes, released, encoded)
