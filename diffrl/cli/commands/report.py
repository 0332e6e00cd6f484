"""``diffrl report RUN_DIR``: its arguments and where the page and its pictures may go; the page
is built in :mod:`diffrl.cli.report`."""

from __future__ import annotations

import argparse
from pathlib import Path

from diffrl.cli.arguments import Command
from diffrl.cli.outputs import check_out_dir, check_page_out, check_run_pictures
from diffrl.core.errors import DiffrlError
from diffrl.train.manifest import checkpoint_around


def arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", help="a training run's output folder, e.g. runs/tiny_demo")
    p.add_argument("--out", help="the HTML file to write (default: RUN_DIR/report.html)")


def inputs(args: argparse.Namespace) -> None:
    run_dir = Path(args.run_dir).expanduser()
    around = checkpoint_around(run_dir)
    if around is not None:  # the report's pictures and page would join the checkpoint's files
        raise DiffrlError(
            f"RUN_DIR {str(run_dir)!r} is a checkpoint (or inside one: {str(around)!r}); give the run's "
            "output folder, e.g. runs/NAME"
        )
    out = Path(args.out).expanduser() if args.out else None
    if out is not None:
        if out.is_dir():
            raise DiffrlError(
                f"--out {str(out)!r} is a folder; give the HTML file to write, e.g. {out / 'report.html'}"
            )
        check_out_dir(out.parent, "--out's folder")  # not into a checkpoint
        check_page_out(out, "--out", "give a new .html file (or an earlier report), e.g. --out report.html")
    else:
        check_page_out(
            run_dir / "report.html", "RUN_DIR's report.html", "move it away, or give --out FILE.html"
        )
    check_run_pictures(run_dir)


COMMAND = Command(
    "a run folder -> one self-contained HTML page: curves, captioned eval grids, the first "
    "and last eval side by side, final numbers, config (a run writes RUN_DIR/report.html itself)",
    "diffrl.cli.report:run",
    arguments,
    inputs,
)
