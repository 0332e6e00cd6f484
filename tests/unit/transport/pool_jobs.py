"""Jobs for the process-pool tests: importable by spawned workers, and light (no torch) so that
a worker starts in a fraction of a second."""

from __future__ import annotations

import os
import threading
import time


def pid() -> int:
    return os.getpid()


def hang() -> None:
    threading.Event().wait()


def square_after(x: float, seconds: float) -> float:
    time.sleep(seconds)
    return x * x


def square_when_told(x: float, folder: str) -> float:
    """``x * x`` once the test creates ``folder/go``; ``folder/running`` says it is running (the
    test kills or restarts its worker then, while it certainly is in flight; re-sent, it returns)."""
    with open(os.path.join(folder, "running"), "w"):
        pass
    while not os.path.exists(os.path.join(folder, "go")):
        time.sleep(0.01)
    return x * x


def scores(values: list[float], stuck: bool) -> list[float]:
    """``values`` back, or never (a reward worker stuck on one call)."""
    if stuck:
        hang()
    return values


def scores_or_die(values: list[float], die: bool) -> list[float]:
    """``values`` back, or the worker exits at once (a reward worker that crashes on one call)."""
    if die:
        os._exit(3)
    return values
