"""What a run shows in the terminal: metric values (:func:`fmt`), lines that do not garble a
progress bar (:func:`console`), and :class:`Progress`, a tqdm bar on a terminal and plain periodic
lines elsewhere (CI, log files)."""

from __future__ import annotations

import math
import sys
import time
from typing import ClassVar, TextIO

from tqdm import tqdm


def fmt(v: float) -> str:
    """A metric as the terminal shows it: 3 significant digits (``0.479``, ``58.2``, ``0.00123``),
    whole numbers from 100 up (``412``, ``3601``), powers of ten past 1e5 or below 1e-3
    (``1.23e-05``); a run's noise is in the second or third digit, so more digits are noise.
    ``metrics.jsonl`` keeps every value exact. Ints as they are."""
    if not isinstance(v, float):
        return str(v)
    if not math.isfinite(v) or v == 0:
        return f"{v:g}"  # nan, inf, -inf, 0
    if 100 <= abs(v) < 1e5:
        return f"{v:.0f}"
    if 1e-3 <= abs(v) < 100:
        return f"{v:#.3g}".rstrip(".")  # '#': keeps trailing zeros (0.500), so a column of them aligns
    return f"{v:.2e}"


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal (a closed or odd stream is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def console(line: str) -> None:
    """Print ``line`` to stdout, above the progress bars while one is drawn (so it does not garble them)."""
    if Progress.drawing():
        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)


def clock(seconds: float) -> str:
    """``0:28``, ``12:05``, ``1:02:03``, ``27:00:00`` (hours past a day keep counting)."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def speed(rate: float, unit: str) -> str:
    """``rate`` things a second as a person reads it: ``2.66 img/s``, or the seconds each takes
    below one a second (``11.2 s/group``, as tqdm's bar says it), 3 significant digits."""
    if rate <= 0:
        return f"? {unit}/s"
    return f"{fmt(float(rate))} {unit}/s" if rate >= 1 else f"{fmt(1 / rate)} s/{unit}"


class Progress:
    """Progress through ``total`` things (``unit``: what they are called).

    On a terminal (``stream``, default stderr, is a tty) a tqdm bar; elsewhere the plain line
    ``label 12/100 (12%) 3.1 it/s, ETA 0:28`` at most every ``every`` seconds. The ``postfix``
    given to :meth:`update` (e.g. the reward) shows after the bar, or at the end of the line.

    Progress opened while another is open nests under it: its bar sits one row below and vanishes
    when it closes (tqdm's ``leave=False``), and as plain lines it prints only once ``every`` seconds
    have passed (no first or last line), so a short inner loop prints nothing. The outermost
    (e.g. the training iterations) stays at row 0, its first and last line always printed.
    A Progress closes by itself when ``done`` reaches ``total``; otherwise call :meth:`close`
    (or use it as a context manager). ``initial``: what was done before (a resumed run's
    iterations), left out of the rate.
    """

    _open: ClassVar[list[Progress]] = []

    def __init__(
        self,
        label: str,
        total: int,
        unit: str = "it",
        every: float = 5.0,
        initial: int = 0,
        stream: TextIO | None = None,
    ):
        self.label, self.total, self.unit, self.every, self.initial = label, total, unit, every, initial
        self.stream = stream if stream is not None else sys.stderr
        self.nested = bool(Progress._open)
        self.start = time.time()
        self.last = self.start if self.nested else 0.0
        self.done = initial
        self.closed = False
        self.bar: tqdm | None = None
        if is_terminal(self.stream):
            self.bar = tqdm(
                total=total,
                initial=initial,
                desc=label,
                unit=unit,
                file=self.stream,
                position=len(Progress._open),
                leave=not self.nested,
                dynamic_ncols=True,
            )
        Progress._open.append(self)

    @classmethod
    def drawing(cls) -> bool:
        """Whether a bar is on the terminal now."""
        return any(p.bar is not None for p in cls._open)

    def update(self, done: int, force: bool = False, postfix: dict[str, float] | None = None) -> None:
        """``done`` of ``total`` are done; ``postfix``: values to show with it (name -> value);
        ``force``: print a plain line now."""
        if self.closed:
            return
        self.done, postfix = done, postfix or {}
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix({k: fmt(v) for k, v in postfix.items()}, refresh=False)
            self.bar.update(done - self.bar.n)
        else:
            self._line(done, force, postfix)
        if done >= self.total:
            self.close()

    def _line(self, done: int, force: bool, postfix: dict[str, float]) -> None:
        now = time.time()
        finished = done >= self.total and not self.nested
        if not force and not finished and now - self.last < self.every:
            return
        self.last = now
        elapsed = now - self.start
        rate = (done - self.initial) / elapsed if elapsed > 0 else 0.0
        eta = (self.total - done) / rate if rate > 0 else float("nan")
        eta_s = "?" if math.isnan(eta) else clock(eta)
        pct = 100 * done / max(1, self.total)
        extra = "".join(f"  {k}={fmt(v)}" for k, v in postfix.items())
        print(
            f"{self.label} {done}/{self.total} ({pct:.0f}%) {speed(rate, self.unit)}, ETA {eta_s}{extra}",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        """Take the bar off the terminal (the outermost stays); idempotent."""
        if self.closed:
            return
        self.closed = True
        if self.bar is not None:
            self.bar.close()
        if self in Progress._open:
            Progress._open.remove(self)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
