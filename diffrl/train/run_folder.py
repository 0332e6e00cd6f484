"""One run per output folder: a lock while a process writes it, the run's id, and the metrics a
resumed run continues. A train run goes through these in one place: :mod:`diffrl.train.session`.

```
runs/NAME/
  .lock          flock'ed by the process training into the folder (its PID inside); the kernel
                 releases it when that process dies, kill -9 included, so it never goes stale
  run.json       {"run_id"}: the id every checkpoint of the run carries ({"run_id": null}: a
                 diffrl folder whose run never started); what makes a folder a run's
  metrics.jsonl  one row per (kind, step), kind "eval" or "train"; on resume, rows the resumed run
                 writes again (after the checkpoint's step, or its eval if the checkpoint lacks it)
                 are dropped
  checkpoints/   see train/checkpoint.py
```

A run writes only into a new folder, an empty one, or a run's own: a folder of other files
(someone's ``config.yaml`` or ``report.html``) is refused before anything is written, and so is a
folder inside the model folder, the checkpoint it resumes, or any checkpoint, and one where a file
the run writes is a symlink (the write would land elsewhere) or not a file (a FIFO would block it).
(``run.name`` is one folder name, checked where the config binds: ``runs/<name>`` stays in runs/.)
The folder's path is made absolute when the run starts: a plugin that changes the working
directory (``os.chdir``) mid-run does not split the run between two folders.
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
from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import read_text
from diffrl.train.checkpoint import (
    CheckpointError,
    latest_checkpoint,
    remove_partial_writes,
    resume_problems,
    verify_checkpoint,
)
from diffrl.train.manifest import overlap

WRITTEN = ("config.yaml", "metrics.jsonl", "report.html", "metrics.png", "eval_curve.png")
"""Files a run writes in place at its folder's top: a symlink there would carry the write
elsewhere (``run.json`` and ``eval_curve.json`` are replaced whole: a link is replaced, not followed)."""
NO_RUN = {"run_id": None}
"""``run.json`` of a diffrl folder whose run failed before it logged or saved anything."""
LOCK = ".lock"


def row_kind(row: dict[str, Any]) -> str:
    """A ``metrics.jsonl`` row's kind: ``eval`` (an eval point's metrics) or ``train``."""
    return "eval" if any(str(k).startswith("eval/") for k in row) else "train"


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
        # absolute now: a plugin's os.chdir later in the run moves none of the run's files
        self.path = Path(path).absolute()
        self._lock_fd: int | None = None
        self.finished = False
        """Set by :meth:`resume_point`: the checkpoint resumed is this folder's own ``final`` of a
        run that trained every iteration; only its report may be left to write."""

    # ---- the lock -------------------------------------------------------------------------------
    def check_destination(self, config: Config | None = None) -> None:
        """Refuse a folder a run must not write into (before anything is written there): one that
        holds other files than a diffrl run's, or that is or lies inside an input of ``config``
        (its model folder, the checkpoint it resumes) or any checkpoint."""
        inputs: dict[str, Any] = {}
        if config is not None:
            inputs["the model folder (model.path)"] = config.model.path
            resume = config.train.resume
            if resume not in (None, "latest") and (Path(resume).expanduser() / "checkpoint.json").is_file():
                inputs["the checkpoint train.resume names"] = resume  # (not one: refused when read)
        why = overlap(self.path, inputs)
        if why is not None:
            raise RunFolderError(
                f"run.output_dir {why}: a run writes its files there; give another folder (run.name=OTHER "
                "or run.output_dir=PATH)"
            )
        for name in WRITTEN:
            file = self.path / name
            if file.is_symlink() or (file.exists() and not file.is_file()):
                where = f"a symlink to {quoted(os.readlink(file))}" if file.is_symlink() else "not a file"
                raise RunFolderError(
                    f"output folder {quoted(str(self.path))}: {name} is {where}; the run writes {name} "
                    "and would write through it or fail: replace it with a plain file (or remove it), or "
                    "give another folder (run.name=OTHER or run.output_dir=PATH)"
                )
        if not self.path.is_dir() or self.is_run_folder():
            return
        foreign = sorted(p.name for p in self.path.iterdir() if p.name != LOCK)
        if foreign:
            shown = ", ".join(repr(n[:80]) for n in foreign[:3]) + (" ..." if len(foreign) > 3 else "")
            raise RunFolderError(
                f"output folder {str(self.path)!r} holds files that are not a diffrl run's ({shown}); a run "
                "writes config.yaml, metrics.jsonl, report.html and more into its folder and would replace "
                "yours: give a new or empty folder (run.name=OTHER or run.output_dir=PATH)"
            )

    def acquire(self, config: Config | None = None) -> None:
        """Take the folder's lock, or raise naming the process that holds it (first, with
        :meth:`check_destination`, refuse a folder the run must not write into)."""
        self.check_destination(config)
        self.path.mkdir(parents=True, exist_ok=True)
        lock = self.path / LOCK
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
        try:  # again under the lock: another process may have written here since the first check
            self.check_destination(config)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing drops the flock
            self._lock_fd = None

    # ---- what the folder holds ------------------------------------------------------------------
    @property
    def metrics_file(self) -> Path:
        return self.path / "metrics.jsonl"

    def is_run_folder(self) -> bool:
        """True when diffrl made this folder a run's (its ``run.json``, metrics or checkpoints)."""
        return any((self.path / name).exists() for name in ("run.json", "metrics.jsonl", "checkpoints"))

    def holds_run(self) -> bool:
        """True when an earlier run wrote here (metrics, checkpoints or its id)."""
        ckpts = self.path / "checkpoints"
        return (
            ((self.path / "run.json").is_file() and self._run_json() != NO_RUN)
            or (self.metrics_file.is_file() and self.metrics_file.stat().st_size > 0)
            or (ckpts.is_dir() and any(ckpts.iterdir()))
        )

    def _run_json(self) -> Any:
        try:  # bounded, never blocking (a FIFO in its place); UserFileError is a ValueError
            return json.loads(read_text(self.path / "run.json", "run.json", "", max_bytes=1 << 20))
        except (OSError, ValueError, RecursionError):  # RecursionError: nested thousands deep
            return None

    def run_id(self) -> str | None:
        info = self._run_json()
        run_id = info.get("run_id") if isinstance(info, dict) else None
        return run_id if isinstance(run_id, str) else None

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
            # still a diffrl folder (its config.yaml is ours), holding no run
            write_atomic(self.path / "run.json", json.dumps(NO_RUN) + "\n")

    def keep_metrics_up_to(self, step: int, evaluated: bool = True) -> int:
        """Keep the metric rows the checkpoint of ``step`` covers: drop those after ``step``
        (written by a process that died after its last checkpoint), the eval row of ``step`` unless
        the checkpoint holds that eval (``evaluated``; else the resumed run evaluates it again), a
        torn line, and any second row of a (kind, step). Returns how many were dropped."""
        if not self.metrics_file.is_file():
            return 0
        kept, seen, dropped = [], set(), 0
        for line in self.metrics_file.read_text().splitlines():
            try:
                row = json.loads(line)
                key = (row_kind(row), int(row["step"]))
                keep = key[1] < step or (key[1] == step and (evaluated or key[0] != "eval"))
            except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError):
                keep, key = False, None
            if keep and key not in seen:
                kept.append(line)
                seen.add(key)
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
        self.finished = self._own_final(config, path, info)
        problems = resume_problems(config, info, path, finished_here=self.finished)
        if problems:
            raise ConfigError(problems, "train.resume")
        return path, info

    def _own_final(self, config: Config, path: Path, info: dict[str, Any]) -> bool:
        """True when ``path`` is this folder's own last checkpoint of a run that trained all of
        ``train.iterations`` (what is left to do is the report: a process killed while writing it)."""
        own = path.resolve().parent == (self.path / "checkpoints").resolve()
        done = info["loop"].get("final") is True and info["iteration"] == config.train.iterations
        return own and done and self.run_id() == info["run_id"]

    def begin(self, config: Config) -> tuple[Path | None, dict[str, Any] | None, str]:
        """Where this run starts: the checkpoint to continue from and its verified info (None, None
        for a fresh start) and the run's id; drops the metric rows written after that checkpoint.
        A fresh start where ``train.resume=latest`` found no checkpoint keeps the rows an earlier
        attempt logged, set aside (:meth:`set_aside_metrics`): nothing the folder held is lost."""
        resume_from, info = self.resume_point(config)
        run_id = self.claim(config, info, resume_from)
        if info is None and config.train.resume == "latest":
            self.set_aside_metrics()
        step = int(info["iteration"]) if info else -1
        evaluated = bool(info) and any(e.get("step") == step for e in info["loop"].get("evals", []))
        self.keep_metrics_up_to(step, evaluated)
        if info is None or self.run_id() != run_id:
            self.set_run_id(run_id)
        return resume_from, info, run_id

    def set_aside_metrics(self) -> Path | None:
        """Rename a non-empty ``metrics.jsonl`` to the first free ``metrics.earlier-N.jsonl`` and say
        so: the rows of an attempt that left no checkpoint (killed before its first save, or its
        ``checkpoints/`` removed), which a fresh run in this folder would otherwise replace."""
        if not (self.metrics_file.is_file() and self.metrics_file.stat().st_size > 0):
            return None
        n = 1
        while (self.path / f"metrics.earlier-{n}.jsonl").exists():
            n += 1
        kept = self.path / f"metrics.earlier-{n}.jsonl"
        with self.metrics_file.open("rb") as f:
            rows = sum(1 for line in f if line.strip())
        self.metrics_file.rename(kept)
        print(
            f"train.resume=latest starts over: the {rows} metric row(s) an earlier attempt logged "
            f"here, with no checkpoint to resume them from, are kept in {kept.name}",
            flush=True,
        )
        return kept

    def claim(self, config: Config, info: dict[str, Any] | None, path: Path | None = None) -> str:
        """This run's id; refuses a folder that holds another run. A folder whose ``run.json`` is
        gone, resuming a checkpoint of its own ``checkpoints/``, takes that checkpoint's run id."""
        held = self.run_id() if self.holds_run() else None
        run_json = self.path / "run.json"
        if info is not None and held is None and self.holds_run():
            own = path is not None and path.resolve().parent == (self.path / "checkpoints").resolve()
            if own and not run_json.exists() and not run_json.is_symlink():
                print(
                    f"{run_json} is missing: this folder's run id is taken from the checkpoint resumed "
                    f"({path.name}) and run.json written again",
                    flush=True,
                )
                return str(info.get("run_id", ""))
            raise RunFolderError(
                f"output folder {str(self.path)!r} holds run records but its run.json "
                + ("is missing" if not run_json.exists() else "holds no run id diffrl wrote")
                + f", so the checkpoint {str(path or config.train.resume)!r} cannot be matched to it: resume "
                "a checkpoint of this folder's own checkpoints/ (train.resume=latest, or its path), or "
                "resume into a new folder (run.name=OTHER)"
            )
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
