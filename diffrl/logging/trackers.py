"""Experiment trackers: where a run's metrics, eval grids and metadata go besides ``metrics.jsonl``.

``run.loggers`` names them: ``jsonl`` (``RUN_DIR/metrics.jsonl``, always written, listed or not),
``tensorboard`` (:mod:`diffrl.logging.tensorboard`) and ``wandb`` (:mod:`diffrl.logging.wandb`),
or a dotted path ``my_pkg.my_mod:MyTracker`` to a class that follows :class:`Tracker` and is built
as ``MyTracker(run: TrackerRun)``. A backend's module imports its package at the top, and is
imported only when a run names it (the registry's strings), so the packages stay optional.
"""

from __future__ import annotations

import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from diffrl.core.errors import DiffrlError
from diffrl.core.registry import Registry, RegistryError, did_you_mean
from diffrl.core.user_code import PluginError

TRACKERS = Registry(
    "logger",
    {
        "tensorboard": "diffrl.logging.tensorboard:TensorBoardTracker",
        "wandb": "diffrl.logging.wandb:WandbTracker",
    },
)
ALWAYS = "jsonl"
"""The logger every run has: ``metrics.jsonl`` (:class:`~diffrl.logging.MetricsLogger`)."""

PACKAGES = {
    "tensorboard": ("tensorboard", "pip install 'diffrl[tensorboard]' (or pip install 'tensorboard>=2.16')"),
    "wandb": ("wandb", "pip install 'diffrl[wandb]' (or pip install 'wandb>=0.17')"),
}
"""A built-in tracker's package (checked before anything loads) and the command that installs it."""


class TrackerError(DiffrlError):
    """A logger of ``run.loggers`` could not start (its package missing, its service refusing)."""


@dataclass
class TrackerRun:
    """What a tracker knows of the run it logs.

    ``run_dir``: the run's output folder (a tracker writes under ``run_dir / <its name>``);
    ``run_id``: diffrl's id of the run (``run.json``), the same for every process of a resumed run;
    ``name``: ``run.name``; ``project``: where a hosted tracker files the run (``run.wandb_project``);
    ``first_step``: the first step this process logs, 0 for a new run and a resumed checkpoint's
    step + 1, so a tracker drops what an earlier process logged after that checkpoint (as
    ``metrics.jsonl`` does); a resumed run may still log an eval at the checkpoint's step, if it
    was not done before the checkpoint.
    """

    run_dir: Path
    run_id: str
    name: str
    project: str
    first_step: int = 0

    @property
    def resumed(self) -> bool:
        return self.first_step > 0


class Tracker(Protocol):
    """An experiment tracker: the driver calls these from its process only (never a Ray worker's)."""

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        """Every metric of a step (training and eval), as ``metrics.jsonl`` has them."""

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        """An image file the run wrote (an eval grid), under ``name`` (e.g. ``eval/grid``)."""

    def log_metadata(self, config: dict[str, Any], text: str) -> None:
        """Once at start-up: the resolved config (as ``config.yaml``) and the start-up text (the
        batch arithmetic)."""

    def close(self, ok: bool) -> None:
        """Flush and finish, once: ``ok`` is whether the run ended well (False: it failed or was
        stopped, e.g. for a hosted tracker to mark the run failed)."""


METHODS = ("log_scalars", "log_image", "log_metadata", "close")
"""What the driver calls on a tracker (:class:`Tracker`)."""

CALL_TIMEOUT_S = 600.0
"""How long one call of a tracker (its start, a log, its close) may take: a tracker that hangs
(a hosted service that stopped answering) stops the run with an error naming it after this,
rather than holding it for ever. Generous: a hosted tracker's close uploads what it holds."""


class BoundedTracker:
    """A tracker whose every call runs on a daemon thread of its own and is waited for at most
    :data:`CALL_TIMEOUT_S`. A call still running then is the tracker's error
    (:class:`~diffrl.core.user_code.PluginError` for a dotted path, :class:`TrackerError` for a built-in
    one), and the tracker is called no more (its thread is left to it: Python cannot stop a thread;
    a daemon one does not hold up the process's exit). What a call raises is raised here, with its
    traceback (a plugin's error is named by it)."""

    def __init__(self, name: str, make: Any, run: TrackerRun):
        self.name, self.stuck = name, False
        self.tracker = self._call(f"{name}(run)", make, run)

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        if self.stuck:
            return None
        out: dict[str, Any] = {}

        def call() -> None:
            try:
                out["value"] = fn(*args)
            except BaseException as e:  # noqa: BLE001 - raised on the caller's thread below
                out["error"] = e

        thread = threading.Thread(target=call, name=f"tracker-{self.name}", daemon=True)
        thread.start()
        thread.join(CALL_TIMEOUT_S)
        if thread.is_alive():
            self.stuck = True
            message = (
                f"logger {self.name!r}: {what} did not return within {CALL_TIMEOUT_S:g} s; the "
                f"checkpoints already written are intact: fix it, or drop {self.name!r} from "
                "run.loggers (metrics.jsonl has every metric), and resume with train.resume=latest"
            )
            raise (PluginError(f"plugin {message}") if self.name not in PACKAGES else TrackerError(message))
        if "error" in out:
            raise out["error"]
        return out.get("value")

    def log_scalars(self, step: int, metrics: dict[str, float]) -> None:
        self._call("log_scalars()", self.tracker.log_scalars, step, metrics)

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        self._call("log_image()", self.tracker.log_image, step, name, image_path)

    def log_metadata(self, config: dict[str, Any], text: str) -> None:
        self._call("log_metadata()", self.tracker.log_metadata, config, text)

    def close(self, ok: bool) -> None:
        self._call("close()", self.tracker.close, ok)


def tracker_problems(names: list[str], where: str = "run.loggers") -> list[str]:
    """Every problem of a list of logger names: unknown names (with a "did you mean"), a backend's
    package not installed (with the pip command), a dotted path that does not import. Imports
    no backend package."""
    known = [ALWAYS, *TRACKERS.names()]
    errors = []
    for i, name in enumerate(names):
        if name in PACKAGES:
            package, pip = PACKAGES[name]
            if importlib.util.find_spec(package) is None:
                errors.append(f"{where}[{i}]: logger {name!r} needs the {package} package: {pip}")
        elif name != ALWAYS and ("." in name or ":" in name):
            try:
                obj = TRACKERS.resolve(name)
            except RegistryError as e:
                errors.append(f"{where}[{i}]: {e}")
            else:
                if not callable(obj):
                    errors.append(
                        f"{where}[{i}]: {name!r} is not a class (a tracker is built as Tracker(run))"
                    )
                elif missing := [m for m in METHODS if not callable(getattr(obj, m, None))]:
                    errors.append(
                        f"{where}[{i}]: {name!r} has no {', '.join(missing)} method; a tracker defines "
                        f"all of {', '.join(METHODS)} (see diffrl.logging.trackers.Tracker)"
                    )
        elif name != ALWAYS:
            errors.append(
                f"{where}[{i}]: unknown logger {name!r}.{did_you_mean(name, known)} "
                f"Known: {', '.join(known)}; or a dotted path 'package.module:Name' to a Tracker class."
            )
    if len(set(names)) != len(names):
        errors.append(f"{where} names a logger twice: {names}")
    return errors


def start_trackers(names: list[str], run: TrackerRun) -> list[Tracker]:
    """Start the trackers ``names`` lists (``jsonl`` aside: :class:`~diffrl.logging.MetricsLogger`
    writes it). A tracker that fails to start is a :class:`TrackerError` naming it, after the
    ones started before it are closed."""
    started: list[Tracker] = []
    try:
        for name in names:
            if name == ALWAYS:
                continue
            try:
                started.append(BoundedTracker(name, TRACKERS.resolve(name), run))
            except DiffrlError as e:
                raise TrackerError(f"run.loggers: logger {name!r} could not start: {e}") from e
            except Exception as e:  # the backend's own errors (no network, a bad key): a user's to fix
                fix = f"; {PACKAGES[name][1]}" if isinstance(e, ImportError) and name in PACKAGES else ""
                raise TrackerError(
                    f"run.loggers: logger {name!r} could not start: {type(e).__name__}: {e}{fix} "
                    f"(or drop {name!r} from run.loggers)"
                ) from e
    except BaseException:
        for tracker in started:
            try:
                tracker.close(ok=False)
            except Exception:  # noqa: S110 - the error that stopped the start is the one to report
                pass
        raise
    return started
