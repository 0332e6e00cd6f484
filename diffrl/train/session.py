"""A train run's life in its output folder, in one place: open (or resume) -> the driver iterates ->
finish. :class:`TrainSession` is that life as a context manager; the driver (``train/loop.py``)
runs the iterations inside it.

```
open     lock the folder (run_folder.py); fresh or resume: the checkpoint verified and the folder's
         run id checked before any model loads; config.yaml; metrics.jsonl and the trackers (they
         too start before any model loads: one that cannot start fails the run at once); the
         algorithm and the runner; the start-up lines; a resumed run's checkpoint into the runner.
         A fresh run that fails here forgets its run id: once the problem is fixed, the same
         command trains into the same folder.
save     a checkpoint (step_NNNNN, or final), then train.keep_last pruning
finish   on every path: the runner closed, then the loggers (even when the runner fails to close;
         told whether the run ended well); on success, the run's pictures and report.html (a
         failure there is a warning: the checkpoint is saved); the lock released last.
```

Every phase can be resumed: a rerun with ``train.resume=latest`` of a run killed after its final
checkpoint (while it wrote its pictures) loads no model: it writes the eval curve and the report
from the final checkpoint and ends (``session.finished``).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from diffrl.algorithms.base import DiffusionAlgorithm
from diffrl.algorithms.registry import build_algorithm
from diffrl.config import Config, dump_config
from diffrl.core import determinism
from diffrl.core.errors import Interrupted
from diffrl.core.rollout import CollectionSpec
from diffrl.evaluation import report
from diffrl.evaluation.evaluate import EvalResult
from diffrl.logging import MetricsLogger, TrackerRun, console, start_trackers
from diffrl.models.registry import resolve_device
from diffrl.train.batches import describe_batches
from diffrl.train.checkpoint import (
    StorageError,
    config_changes,
    iteration_of,
    prune_checkpoints,
    storage_failure,
)
from diffrl.train.hygiene import CheckedAlgorithm
from diffrl.train.run_folder import RunFolder, write_atomic
from diffrl.train.runner import Runner
from diffrl.train.state import LoopState, TrainResult, interrupted_error
from diffrl.trust.best import BEST
from diffrl.trust.report import trust_section
from diffrl.trust.trust import Trust, Verdict


class TrainSession:
    """One train run in its output folder (``run.output_dir``, else ``runs/<run.name>``).

    Inside ``with TrainSession(config, runner_class) as session:`` the folder is locked and the run is ready to
    iterate: ``session.runner`` holds the model (a resumed run's checkpoint loaded), ``start`` is
    the first iteration to run, ``state`` what the checkpoint kept for the driver, ``result`` what
    the run returns (its ``history`` the driver's to fill).
    """

    def __init__(self, config: Config, runner_class: type[Runner]):
        self.config, self.runner_class = config, runner_class
        self.folder = RunFolder(config.run.resolved_output_dir())
        self.out = self.folder.path
        self.logger: MetricsLogger | None = None  # these two exist once open() got that far
        self.runner: Runner | None = None

    # ---- open ------------------------------------------------------------------------------------
    def __enter__(self) -> TrainSession:
        return self.open()

    def open(self) -> TrainSession:
        """Lock the folder and make the run ready to iterate (see the module's docstring)."""
        self.folder.acquire(self.config)
        try:
            self._open()
        except BaseException:
            self.folder.release()
            raise
        return self

    def _open(self) -> None:
        config = self.config
        self.resume_from, info, self.run_id = self.folder.begin(config)  # before any model loads
        self.start = int(info["iteration"]) if info else 0
        self.state = LoopState.resumed(info)
        self.trust = Trust(config, info["loop"] if info else None)
        self.result = TrainResult(self.out, self.out / "checkpoints" / "final", evals=self.state.evals)
        self.last_saved: Path | None = self.resume_from
        self.finished = self.folder.finished
        if self.finished:  # every iteration ran and `final` is saved: only the pictures are left
            if self.state.evals:
                write_atomic(self.out / "eval_curve.json", json.dumps(self.state.evals, indent=1))
            print(
                f"{self.out}: this run finished (checkpoint {self.resume_from}, iteration {self.start}); "
                "writing what it had left: its eval curve and report (raise train.iterations to train on)",
                flush=True,
            )
            return
        try:
            dump_config(config, self.out / "config.yaml")
            self.logger = MetricsLogger(self.folder.metrics_file)
            run = TrackerRun(
                self.out,
                self.run_id,
                config.run.name,
                config.run.wandb_project,
                self.start + 1 if info else 0,
            )
            # the trackers start before any model loads: one that cannot start fails the run at once
            self.logger.trackers = start_trackers(config.run.loggers, run)
            # before any model loads: MKL and oneDNN read their pins when they first run
            self.determinism = determinism.apply(
                config.run.deterministic, config.run.threads, str(resolve_device(config.run.device))
            )
            self.algorithm: DiffusionAlgorithm = build_algorithm(config)
            self.checked = CheckedAlgorithm(self.algorithm)  # the driver's calls, guarded and checked
            self.spec: CollectionSpec = self.algorithm.collection_spec()
            self.runner = self.runner_class(
                config, self.algorithm, self.spec
            )  # one failing to start cleans up
            head = (
                f"diffrl: {self.algorithm.name} on {config.model.family} ({config.model.path}) -> {self.out}"
            )
            arithmetic = describe_batches(config, self.spec, self.runner)
            arithmetic += f"\n  {self.determinism.describe()}"
            print(f"{head}\n{arithmetic}", flush=True)
            self.logger.log_metadata(config.to_dict(), f"{head}\n{arithmetic}")
            if self.resume_from is not None:
                self.runner.resume(self.resume_from)
                print(f"resumed from {self.resume_from} at iteration {self.start}", flush=True)
                _, changed = config_changes(config, self.resume_from)
                if changed:  # the others were refused before anything loaded (resume_problems)
                    print(
                        "settings changed since the checkpoint (they apply from here on; config.yaml "
                        "records them): " + "; ".join(changed),
                        flush=True,
                    )
        except BaseException:
            self.close(ok=False)
            if info is None:  # nothing ran: a rerun once the problem is fixed starts in the same folder
                self.folder.forget_fresh_start()
            raise

    # ---- while it runs ---------------------------------------------------------------------------
    def save(self, step: int, final: bool = False) -> Path:
        """A checkpoint of iteration ``step`` (``final``: the run's last), then ``train.keep_last``."""
        path = self.result.checkpoint if final else self.out / "checkpoints" / f"step_{step:05d}"
        self.last_saved = self.runner.save(path, step, self.run_id, self.loop_state(final))
        prune_checkpoints(self.out, self.config.train.keep_last, step)
        return self.last_saved

    def save_best(self, step: int) -> Path:
        """``checkpoints/best``: iteration ``step``, which just became the best (``train.keep_best``)."""
        return self.runner.save(self.out / "checkpoints" / BEST, step, self.run_id, self.loop_state(False))

    def loop_state(self, final: bool) -> dict:
        """What a checkpoint keeps for the driver: the loop's state and the run's trust."""
        return {**self.state.saved(final), **self.trust.state()}

    def record_eval(self, step: int, result: EvalResult, seconds: float, verdict: Verdict) -> None:
        """Keep the eval of ``step`` (its grid, metrics and ``eval_curve.json``) and, when the
        trust's verdict says so, move ``checkpoints/best`` to it."""
        self.state.record_eval(step, result, self.out, self.config.eval.grid_images, self.logger, seconds)
        if verdict.moved:
            console(f"best checkpoint: {self.save_best(step)}")

    def interrupted(self, signal_name: str, step: int, start: int) -> Interrupted:
        """A stop at ``step`` (this process began at ``start``): the last completed iteration saved
        (unless it is saved already), and the error that says how to go on."""
        saved = self.last_saved
        if step > start and (saved is None or iteration_of(saved) != step):
            saved = self.save(step)
        return interrupted_error(signal_name, step, saved)

    # ---- finish ----------------------------------------------------------------------------------
    def close(self, ok: bool) -> None:
        """Stop the runner's parts and close the loggers, the loggers even when the runner fails
        to stop (``ok``: whether the run ended well)."""
        try:
            if self.runner is not None:
                self.runner.close()
        finally:
            if self.logger is not None:
                self.logger.close(ok)

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish(ok=exc_type is None)

    def finish(self, ok: bool) -> None:
        """:meth:`close`, the report if the run ended well (``ok``), then release the folder."""
        try:
            self.close(ok)
            if ok:
                self.write_report()
        finally:
            self.folder.release()

    def write_report(self) -> None:
        """The run in pictures: eval curve, first-vs-last grids, training curves, one HTML page."""
        try:
            print(f"report: {report.write_report(self.out, panels=trust_section)}", flush=True)
        except Exception as e:  # the run is saved: a picture that fails costs only itself
            # (a full disk, an image too large for Pillow, a plotting error)
            warnings.warn(
                f"could not write the run's pictures and report ({e}); the checkpoint and metrics are "
                f"saved: write them again with `diffrl report {self.out}`",
                stacklevel=2,
            )


@contextmanager
def storage_errors(config: Config) -> Iterator[None]:
    """A full disk (or another storage failure) anywhere in the run is a
    :class:`~diffrl.train.checkpoint.StorageError` that says the last checkpoint is intact and how
    to resume."""
    try:
        yield
    except StorageError:  # said already, by the write that failed
        raise
    except Exception as e:  # safetensors reports a full disk as its own error, not an OSError
        fix = (
            "the checkpoints already written are intact, so resuming is safe: free space (or fix the "
            "device), then rerun the same command with train.resume=latest"
        )
        failure = storage_failure(e, f"into the run folder {str(config.run.resolved_output_dir())!r}", fix)
        if failure is None:
            raise
        raise failure from e
