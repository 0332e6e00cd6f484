"""``diffrl report RUN_DIR``: a run folder -> one self-contained HTML page."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from diffrl.bench.report import bench_section
from diffrl.evaluation.report import build_report
from diffrl.trust.report import trust_section


def run(args: argparse.Namespace, inputs: None) -> int:
    """Write the page (with the benchmarks' tables of ``diffrl bench --out RUN_DIR``, if any); what of the run folder could not be read is a warning each (the page
    lists it too), and the exit code is still 0: the page holds all the rest."""
    out = Path(args.out).expanduser() if args.out else None
    report = build_report(Path(args.run_dir).expanduser(), out, bench_section, trust_section)
    for problem in report.unread:
        print(f"warning: {problem}", file=sys.stderr)
    print(f"report: {report.path}")
    return 0
