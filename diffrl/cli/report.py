"""``diffrl report RUN_DIR``: a run folder -> one self-contained HTML page."""

from __future__ import annotations

import argparse
from pathlib import Path

from diffrl.train.report import write_report


def run(args: argparse.Namespace, inputs: None) -> int:
    out = Path(args.out).expanduser() if args.out else None
    print(f"report: {write_report(Path(args.run_dir).expanduser(), out)}")
    return 0
