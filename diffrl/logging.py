"""Metrics to the console and to a JSONL file per run; progress lines with an ETA."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path


def fmt(v: float) -> str:
    if isinstance(v, float):
        if math.isnan(v) or v == 0 or 1e-3 <= abs(v) < 1e4:
            return f"{v:.4f}"
        return f"{v:.3e}"
    return str(v)


class MetricsLogger:
    def __init__(self, path: Path | None, echo: bool = True):
        self.path = path
        self.echo = echo
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
        if self.echo and echo:
            shown = {k: metrics[k] for k in (keys or metrics) if k in metrics}
            print(f"[step {step}] " + "  ".join(f"{k}={fmt(v)}" for k, v in shown.items()), flush=True)

    def close(self) -> None:
        if self._file:
            self._file.close()


class Progress:
    """``label 12/100 (12%) 3.1 it/s, ETA 0:28`` printed at most every ``every`` seconds."""

    def __init__(self, label: str, total: int, unit: str = "it", every: float = 5.0):
        self.label, self.total, self.unit, self.every = label, total, unit, every
        self.start = time.time()
        self.last = 0.0

    def update(self, done: int, force: bool = False) -> None:
        now = time.time()
        if not force and now - self.last < self.every and done < self.total:
            return
        self.last = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_s = (
            "?" if math.isnan(eta) else time.strftime("%M:%S" if eta < 3600 else "%H:%M:%S", time.gmtime(eta))
        )
        pct = 100 * done / max(1, self.total)
        print(
            f"{self.label} {done}/{self.total} ({pct:.0f}%) {rate:.2f} {self.unit}/s, ETA {eta_s}",
            file=sys.stderr,
            flush=True,
        )
