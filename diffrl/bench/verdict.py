"""PASS or MISS only where every round agrees: the one verdict rule of the scripts under ``benchmarks/``.

A benchmark claims an effect against a threshold ("the collector is at least 1.15x the diffusers
pipeline", "``diffrl --help`` answers within 1 s"). It measures its contenders interleaved, round by
round, so a noisy neighbour hits all of them alike, and each round gives one figure of the claim:
the ratio of the two sides in that round (:func:`paired_ratios`), or the round's own value against
an absolute limit. :func:`judge` gives the verdict from those figures, never from their median alone:

- **PASS** when every round is on the passing side of the threshold (``>=`` it for an "at least"
  claim, ``<=`` it for an "at most" one; the threshold itself passes);
- **MISS** when every round is on the failing side;
- **inconclusive** otherwise (the rounds fall on both sides), or when there are fewer rounds than
  the claim needs to show a spread at all (:attr:`Claim.min_rounds`, 2 unless a figure is exact).

This is "the spread is smaller than the effect", made exact. The *effect* is how far the rounds'
median lies from the threshold; the *spread* is how far the rounds reach from their median towards
the threshold, the other verdict's side (``median - lowest`` when the median is above it,
``highest - median`` when below). Every round lies on the median's side of the threshold exactly
when that spread is not larger than the effect, so an inconclusive verdict reads
``inconclusive: spread X exceeds the effect Y``, then the rounds' range, the target and the median.
A spread away from the threshold (a round far on the passing side of a PASS) does not weaken the
claim and does not count.

A script prints each verdict beside its figure, writes its results as before, and ends with
``sys.exit(conclude(verdicts))``: exit code :data:`EXIT_INCONCLUSIVE` when any verdict is
inconclusive (a MISS is a measured answer and exits 0), so a noisy run cannot pass for a result.
Torch-free: ``benchmarks/startup.py`` imports it without loading torch.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

EXIT_INCONCLUSIVE = 4
"""A benchmark's exit code when a verdict is inconclusive (1 is a crash, 2 a usage error)."""

Status = Literal["PASS", "MISS", "inconclusive"]


@dataclass(frozen=True)
class Claim:
    """What a benchmark claims of each round's figure: at least (``at_least``) or at most
    ``threshold``. ``fmt`` formats the figures and the threshold in the verdict (``"{:.3f}"``,
    ``"{:.2f} s"``, ``"{:+.1%}"``)."""

    threshold: float
    at_least: bool = True
    fmt: str = "{:.3f}"
    min_rounds: int = 2
    """Rounds needed for any verdict: one round shows no spread. 1 only for a figure that does not
    vary between runs (a count of bytes), where one measurement is the whole answer."""

    def passes(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold

    def describe(self) -> str:
        """The claim as the verdict names it: ``>= 1.150``."""
        return f"{'>=' if self.at_least else '<='} {self.fmt.format(self.threshold)}"


@dataclass(frozen=True)
class Verdict:
    """A claim judged on its rounds' figures; ``str()`` is the line a benchmark prints."""

    claim: Claim
    rounds: tuple[float, ...]
    status: Status
    label: str = "rounds"
    """What one figure is: a round, or (:func:`unpaired_ratios`) a pairing."""

    @property
    def conclusive(self) -> bool:
        return self.status != "inconclusive"

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def effect(self) -> float:
        """How far the rounds' median lies from the threshold (>= 0)."""
        return abs(self.median - self.claim.threshold)

    @property
    def spread(self) -> float:
        """How far the rounds reach from their median towards the other verdict (>= 0): towards the
        failing side when the median passes, towards the passing side when it fails."""
        median, up = self.median, self.claim.at_least != self.claim.passes(self.median)
        return max(self.rounds) - median if up else median - min(self.rounds)

    def span(self) -> str:
        """``3 rounds 1.203-1.410`` (a single figure once)."""
        lo, hi = (self.claim.fmt.format(v) for v in (min(self.rounds), max(self.rounds)))
        values = lo if lo == hi else f"{lo}-{hi}"
        name = self.label if len(self.rounds) != 1 else self.label.removesuffix("s")
        return f"{len(self.rounds)} {name} {values}"

    def __str__(self) -> str:
        c, f, n = self.claim, self.claim.fmt, len(self.rounds)
        if n < c.min_rounds:
            return (
                f"inconclusive: {n or 'no'} {self.label if n != 1 else self.label.removesuffix('s')}, "
                f"no spread to judge against the target {c.describe()} (need at least {c.min_rounds})"
            )
        every = "all " if n > 1 else ""
        if self.status == "PASS":
            return f"PASS ({self.span()}, {every}{c.describe()})"
        if self.status == "MISS":
            return f"MISS ({self.span()}, {every}{'<' if c.at_least else '>'} {f.format(c.threshold)})"
        return (
            f"inconclusive: spread {f.format(self.spread)} exceeds the effect {f.format(self.effect)} "
            f"({self.span()} on both sides of the target {c.describe()}, median {f.format(self.median)}; "
            "measure more rounds, or on a quieter machine)"
        )


def judge(rounds: Iterable[float], claim: Claim, label: str = "rounds") -> Verdict:
    """The verdict of ``claim`` on each round's figure (the rule: the module's docstring)."""
    values = tuple(float(v) for v in rounds)
    if len(values) < claim.min_rounds:
        status: Status = "inconclusive"
    elif all(claim.passes(v) for v in values):
        status = "PASS"
    elif not any(claim.passes(v) for v in values):
        status = "MISS"
    else:
        status = "inconclusive"
    return Verdict(claim, values, status, label)


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Round ``i``'s ``numerators[i] / denominators[i]``: the figure of a ratio claim when both sides
    ran in every round (e.g. seconds of the baseline / seconds of the contender)."""
    if len(numerators) != len(denominators):
        raise ValueError(f"paired rounds need as many of each side: {len(numerators)} vs {len(denominators)}")
    return [n / d for n, d in zip(numerators, denominators)]


def unpaired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Every ``numerators[j] / denominators[i]``: for two sides that did not run in the same rounds
    (one run after the other), so no round pairs them. Their extremes (the lowest numerator over
    the highest denominator, and the reverse) are the widest the measurements allow; judge them with
    ``label="pairings"``."""
    return [n / d for n in numerators for d in denominators]


def conclude(verdicts: Iterable[Verdict]) -> int:
    """The benchmark's exit code: :data:`EXIT_INCONCLUSIVE` (and a line on stderr saying why) when
    any verdict is inconclusive, else 0. Call it after the results are printed and written."""
    open_ = [v for v in verdicts if not v.conclusive]
    if not open_:
        return 0
    print(
        f"{len(open_)} verdict(s) inconclusive (the rounds' spread exceeds the effect claimed): "
        f"exit code {EXIT_INCONCLUSIVE}",
        file=sys.stderr,
    )
    return EXIT_INCONCLUSIVE
