"""A run's metrics: to ``metrics.jsonl``, to the experiment trackers ``run.loggers`` names, and to
the console; progress bars (:class:`Progress`).

This layer knows no config: the driver hands it plain dicts and paths. The trackers:
:mod:`diffrl.logging.trackers`; the console and the bars: :mod:`diffrl.logging.console`.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from diffrl.logging.console import Progress, console, fmt, is_terminal
from diffrl.logging.trackers import (
    ALWAYS,
    TRACKERS,
    Tracker,
    TrackerError,
    TrackerRun,
    start_trackers,
    tracker_problems,
)

__all__ = [
    "ALWAYS",
    "TRACKERS",
    "MetricsLogger",
    "Progress",
    "Tracker",
    "TrackerError",
    "TrackerRun",
    "console",
    "fmt",
    "is_terminal",
    "start_trackers",
    "tracker_problems",
]


class MetricsLogger:
    """Each step's metrics to ``path`` (one JSON row per :meth:`log`: ``step``, ``time`` and the
    metrics) and to every tracker; the metrics ``keys`` names to the console (``echo``)."""

    def __init__(self, path: Path | None, echo: bool = True, trackers: Sequence[Tracker] = ()):
        self.path = path
        self.echo = echo
        self.trackers = list(trackers)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = path.open("a")
        else:
            self._file = None

    def log(
        self, step: int, metrics: dict[str, float], keys: list[str] | None = None, echo: bool = True
    ) -> None:
        row = {"step": step, "time": time.time(), **metrics}
        if self._file:
            self._file.write(json.dumps(row) + "\n")
            self._file.flush()
        scalars = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        for tracker in self.trackers:
            tracker.log_scalars(step, scalars)
        if self.echo and echo:
            shown = {k: metrics[k] for k in (keys or metrics) if k in metrics}
            console(f"[step {step}] " + "  ".join(f"{k}={fmt(v)}" for k, v in shown.items()))

    def log_image(self, step: int, name: str, image_path: Path) -> None:
        """An image the run wrote (``metrics.jsonl`` keeps no images: the file is in the run folder)."""
        for tracker in self.trackers:
            tracker.log_image(step, name, image_path)

    def log_metadata(self, config: dict[str, Any], text: str) -> None:
        """The resolved config and the start-up text to the trackers (``config.yaml`` has the config)."""
        for tracker in self.trackers:
            tracker.log_metadata(config, text)

    def close(self, ok: bool = True) -> None:
        """Close the file and every tracker (each, even when one fails to close); ``ok``: whether
        the run ended well (:meth:`Tracker.close`)."""
        if self._file:
            self._file.close()
            self._file = None
        trackers, self.trackers = self.trackers, []
        errors = []
        for tracker in trackers:
            try:
                tracker.close(ok)
            except Exception as e:  # a tracker that fails to flush must not hide the run's result
                errors.append(f"{type(tracker).__name__}: {type(e).__name__}: {e}")
        if errors:
            warnings.warn("a logger failed to close: " + "; ".join(errors), stacklevel=2)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float)
