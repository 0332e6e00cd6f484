"""Startup benchmark: how long the command line takes to answer, and its memory, side by side.

    python benchmarks/startup.py [--rounds 5]

Runs each command below as a fresh process, against ``python -c pass`` (the interpreter's own
start) in the same run: the commands interleave round by round, each figure is the median of the
rounds with the spread (min-max) beside it. ``diffrl`` is run as ``python -m diffrl.cli`` (what the
``diffrl`` script calls) from this source tree. Peak RSS is each child's own high-water mark
(``os.wait4``'s rusage; ``ru_maxrss`` is in KiB on Linux).

Prints a markdown table (command, median wall s, spread, ratio to ``python -c pass``, peak RSS MB)
and, for ``diffrl --help``, whether it stays under the limits of issue 32 (1 s, 80 MB): PASS or MISS
only when every round is on the same side of a limit, else inconclusive and exit code 4
(``diffrl.bench.verdict``). On a shared machine the wall times move with the load: read the ratios,
and say so when you quote the seconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from diffrl.bench.verdict import Claim, Verdict, conclude, judge  # torch-free

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
DIFFRL = [PY, "-m", "diffrl.cli"]


@dataclass(frozen=True)
class Contender:
    label: str
    argv: list[str]
    exit_code: int
    """What the command must exit with (a config error exits 2): a run that does not is refused."""


CONTENDERS = [
    Contender("python -c pass", [PY, "-c", "pass"], 0),
    Contender("python -c 'import diffrl'", [PY, "-c", "import diffrl"], 0),
    Contender("diffrl --help", [*DIFFRL, "--help"], 0),
    Contender("diffrl recipes", [*DIFFRL, "recipes"], 0),
    Contender("diffrl train --help", [*DIFFRL, "train", "--help"], 0),
    Contender(
        "diffrl train recipes/tiny_demo.yaml train.lr_typo=1 (config error)",
        [*DIFFRL, "train", "recipes/tiny_demo.yaml", "train.lr_typo=1"],
        2,
    ),
]
LIMITS = {"diffrl --help": (1.0, 80.0)}
"""Issue 32's acceptance: seconds, MB."""


def measure(contender: Contender) -> tuple[float, float]:
    """One run of ``contender``: (wall seconds, peak RSS in MB) of its process alone."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    proc = subprocess.Popen(
        contender.argv, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = code = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
    if code != contender.exit_code:
        raise SystemExit(f"{contender.label!r} exited {code}, expected {contender.exit_code}: fix it first")
    return wall, usage.ru_maxrss / 1024


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    walls: dict[str, list[float]] = {c.label: [] for c in CONTENDERS}
    rss: dict[str, list[float]] = {c.label: [] for c in CONTENDERS}
    for c in CONTENDERS:  # one unmeasured run each: the first reads the files from disk
        measure(c)
    for r in range(args.rounds):
        # rotate the order each round: no contender always runs right after the same other one
        for c in CONTENDERS[r % len(CONTENDERS) :] + CONTENDERS[: r % len(CONTENDERS)]:
            wall, mb = measure(c)
            walls[c.label].append(wall)
            rss[c.label].append(mb)
    base = statistics.median(walls[CONTENDERS[0].label])
    print(
        f"startup, {args.rounds} interleaved rounds, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs\n"
    )
    print("| command | median wall s | spread s (min-max) | x `python -c pass` | peak RSS MB |")
    print("|---|---:|---:|---:|---:|")
    for c in CONTENDERS:
        w = walls[c.label]
        print(
            f"| `{c.label}` | {statistics.median(w):.3f} | {min(w):.3f}-{max(w):.3f} | "
            f"{statistics.median(w) / base:.1f} | {statistics.median(rss[c.label]):.0f} |"
        )
    print()
    verdicts: list[Verdict] = []
    for label, (seconds, mb) in LIMITS.items():
        # within the limit only when every round is (each round's own figure, not the median)
        wall = judge(walls[label], Claim(seconds, at_least=False, fmt="{:.2f} s"))
        memory = judge(rss[label], Claim(mb, at_least=False, fmt="{:.0f} MB"))
        verdicts += [wall, memory]
        print(f"{label}: wall {wall}; peak RSS {memory}")
    return conclude(verdicts)  # an inconclusive verdict: a non-zero exit


if __name__ == "__main__":
    sys.exit(main())
