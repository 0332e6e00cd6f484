"""One run per output folder: a lock while a process writes it, the run's id, and the metrics a
resumed run continues. A train run goes through these in one place: :mod:`diffrl.train.session`.

```
runs/NAME/
  .lock          flock'ed by the process training into the folder (its PID inside); the kernel
                 releases it when that process dies, kill -9 included, so it never goes stale
  run.json       {"run_id"}: the id every checkpoint of the run carries
  metrics.jsonl  one row per step; on resume, rows after the checkpoint's step are dropped
  checkpoints/   see train/checkpoint.py
```
"""

from __future__ import annotations

import fcntl
import json
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

from diffrl.config import Config, ConfigError
from diffrl.errors import DiffrlError
from diffrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    remove_partial_writes,
    resume_problems,
    verify_checkpoint,
)


class RunFolderError(DiffrlError):
    """The output folder is in use, or holds another run."""


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path``'s content whole (a temporary file renamed over it)."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with tmp.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


class RunFolder:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock_fd: int | None = None

    # ---- the lock -------------------------------------------------------------------------------
    def acquire(self) -> None:
        """Take the folder's lock, or raise naming the process that holds it."""
        self.path.mkdir(parents=True, exist_ok=True)
        lock = self.path / ".lock"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise RunFolderError(
                f"output folder {str(self.path)!r} is in use by another diffrl process (PID {holder}); "
                "wait for it to finish, stop it, or train into another folder (run.name=OTHER)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    # ---- what the folder holds ------------------------------------------------------------------
    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def holds_run(self) -> bool:
        """True when an earlier run wrote here (metrics, checkpoints or its id)."""
        ckpts = self.path / "checkpoints"
        return (
            (self.path / "run.json").is_file()
            or (self.metrics_file.is_file() and self.metrics_file.stat().st_size > 0)
            or (ckpts.is_dir() and any(ckpts.iterdir()))
        )

    def run_id(self) -> str | None:
        try:
            return json.loads((self.path / "run.json").read_text())["run_id"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def set_run_id(self, run_id: str) -> None:
        write_atomic(self.path / "run.json", json.dumps({"run_id": run_id}) + "\n")

    @staticmethod
    def new_run_id() -> str:
        return uuid.uuid4().hex[:16]

    def forget_fresh_start(self) -> None:
        """Undo :meth:`begin` of a fresh run that failed before it logged or saved anything (a
        logger or the model that could not start): the folder may be trained into again as it is."""
        ckpts = self.path / "checkpoints"
        logged = self.metrics_file.is_file() and self.metrics_file.stat().st_size > 0
        if not logged and not (ckpts.is_dir() and any(ckpts.iterdir())):
            (self.path / "run.json").unlink(missing_ok=True)

    def keep_metrics_up_to(self, step: int) -> int:
        """Drop the metric rows after ``step`` (written by a process that died after its last
        checkpoint); returns how many were dropped. A torn last line is dropped too."""
        if not self.metrics_file.is_file():
            return 0
        kept, dropped = [], 0
        for line in self.metrics_file.read_text().splitlines():
            try:
                row = json.loads(line)
                keep = row["step"] <= step
            except (ValueError, KeyError, TypeError):
                keep = False
            if keep:
                kept.append(line)
            else:
                dropped += 1
        if dropped:
            write_atomic(self.metrics_file, "".join(f"{line}\n" for line in kept))
        return dropped

    # ---- resuming -------------------------------------------------------------------------------
    def resume_point(self, config: Config) -> tuple[Path | None, dict[str, Any] | None]:
        """The checkpoint to continue from (``train.resume``: a path, or ``latest``) and its verified
        info; (None, None) for a fresh start. Raises before any model loads."""
        resume = config.train.resume
        if resume is None:
            return None, None
        if resume == "latest":
            removed = remove_partial_writes(self.path)
            for p in removed:
                print(f"removed {p}: a checkpoint whose writing was interrupted", flush=True)
            path, skipped = latest_checkpoint(self.path)
            for why in skipped:
                warnings.warn(f"train.resume=latest skips {why}", stacklevel=2)
            if path is None and skipped:  # never start over silently on top of damaged checkpoints
                raise CheckpointError(
                    f"train.resume=latest: no checkpoint in {self.path / 'checkpoints'} verifies ("
                    + "; ".join(skipped)
                    + "); move them away to start fresh, or resume a good one by path"
                )
            if path is None:
                print(
                    f"train.resume=latest: no checkpoint in {self.path / 'checkpoints'}; starting a fresh run",
                    flush=True,
                )
                return None, None
        else:
            path = Path(resume).expanduser()
        info = verify_checkpoint(path)
        problems = resume_problems(config, info, path)
        if problems:
            raise ConfigError(problems, "train.resume")
        return path, info

    def begin(self, config: Config) -> tuple[Path | None, dict[str, Any] | None, str]:
        """Where this run starts: the checkpoint to continue from and its verified info (None, None
        for a fresh start) and the run's id; drops the metric rows written after that checkpoint."""
        resume_from, info = self.resume_point(config)
        run_id = self.claim(config, info)
        self.keep_metrics_up_to(int(info["iteration"]) if info else -1)
        if not self.holds_run() or info is None:
            self.set_run_id(run_id)
        return resume_from, info, run_id

    def claim(self, config: Config, info: dict[str, Any] | None) -> str:
        """This run's id; refuses a folder that holds another run."""
        held = self.run_id() if self.holds_run() else None
        if info is None:
            if self.holds_run() and config.train.resume != "latest":
                raise RunFolderError(
                    f"output folder {str(self.path)!r} already holds a run; continue it with "
                    "train.resume=latest, or start a new one elsewhere with run.name=OTHER (or delete the folder)"
                )
            return self.new_run_id()  # a fresh start (resume=latest found no checkpoint)
        run_id = info.get("run_id", "")
        if self.holds_run() and held != run_id:
            raise RunFolderError(
                f"output folder {str(self.path)!r} holds run {held}, the checkpoint {config.train.resume!r} is "
                f"of run {run_id}; resume into the checkpoint's own folder or a new one (run.name=OTHER)"
            )
        return run_id
