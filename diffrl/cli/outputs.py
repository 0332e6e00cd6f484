"""Where a command's outputs may go, checked before its world loads (torch-free), so that no
output destroys an input: an output never lies inside a checkpoint or an input folder
(:func:`check_out_dir`), an output folder holds only what the same command wrote there before, no
input lies inside it, and a report page replaces only a report page.

```
OUT/.diffrl-output   {"command": "sample"}: written first into the folder of ``eval --out`` or
                     ``sample --out``; what lets the same command write there again
```
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path

from diffrl.core.errors import DiffrlError, quoted
from diffrl.core.user_files import file_kind
from diffrl.train.manifest import overlap

MARKER = ".diffrl-output"
MARKER_BYTES = 4096
WRITES = {
    "eval": "grid.png and scores.json",
    "sample": "NNNN.png (videos: NNNN.mp4 and NNNN/), prompts.txt and grid.png",
    "bench": "bench.json and bench_SUITE.png",
}
"""What each command that takes an output folder writes there (for messages)."""
SHOWN = 3
"""Entries of a refused folder a message names."""
PAGE_SUFFIXES = (".html", ".htm")
REPORT_HEAD = b"<title>diffrl report: "
"""What every page ``diffrl report`` writes holds in its first bytes (its ``<title>``)."""
HEAD_BYTES = 4096


def check_out_dir(
    path: Path, flag: str, empty: bool = False, inputs: dict[str, Path | str | None] | None = None
) -> None:
    """Refuse an output folder that cannot be one (it, or a parent, is a file) before anything
    loads; one that is or lies inside an input (``inputs``: role -> folder) or any checkpoint,
    whose files the output would replace or join; with ``empty``, also one that holds files."""
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                where = "it" if p == path else f"its parent {str(p)!r}"
                raise DiffrlError(
                    f"{flag} {str(path)!r} cannot be a folder: {where} is a file; give a folder path"
                )
            break
    why = overlap(path, inputs or {})
    if why is not None:
        raise DiffrlError(
            f"{flag} {why}: writing there would damage what this command reads; give another folder"
        )
    if empty and path.is_dir() and any(path.iterdir()):
        n = sum(1 for _ in path.iterdir())
        raise DiffrlError(
            f"{flag} {str(path)!r} is not empty ({n} {'entry' if n == 1 else 'entries'}); give a new or empty folder, or pass --force "
            "to write into it (files of the same name are replaced)"
        )


def check_command_out(
    out: Path,
    flag: str,
    command: str,
    folders: dict[str, Path | str | None],
    files: list[tuple[str, Path | str | None]],
) -> None:
    """:func:`check_out_dir` against the input ``folders``, then no input (``folders``, ``files``)
    inside ``out``, no symlink in ``out`` into one, and ``out`` new, empty or ``command``'s
    earlier output."""
    check_out_dir(out, flag, inputs=folders)
    check_inputs_outside(out, flag, command, [*folders.items(), *files])
    check_links_inside(out, flag, folders)
    check_out_folder(out, flag, command)


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _dangling(path: Path, flag: str) -> None:
    """Refuse a symlink that points nowhere (writing through it would create its target, wherever
    that is, or fail halfway)."""
    if path.is_symlink() and not path.exists():
        raise DiffrlError(
            f"{flag} {quoted(str(path))} is a symlink to {quoted(os.readlink(path))}, which does not exist; "
            "give the path itself (a new or existing folder), not a dangling link"
        )


def owner(folder: Path) -> str | None:
    """The command whose output folder ``folder`` is (its :data:`MARKER`), or None."""
    try:  # a regular file of a few bytes: never waits on a FIFO, never reads a huge file
        fd = os.open(folder / MARKER, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            info = json.loads(f.read(MARKER_BYTES))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None
    command = info.get("command") if isinstance(info, dict) else None
    return command if isinstance(command, str) else None


def check_out_folder(out: Path, flag: str, command: str) -> None:
    """Refuse ``out`` as ``command``'s output folder when it exists and holds files that are not
    an earlier output of ``command`` (someone's ``grid.png`` or ``prompts.txt``, a run folder,
    another command's output): the command would replace or join them. A dangling symlink too."""
    _dangling(out, flag)
    if not out.is_dir():
        return
    names = sorted(p.name for p in islice(out.iterdir(), 1000))
    if not names:
        return
    made_by = owner(out)
    if made_by == command:
        return
    if made_by is not None:
        raise DiffrlError(
            f"{flag} {quoted(str(out))} holds the output of `diffrl {made_by if made_by in WRITES else quoted(made_by, 40)}`; {command} writes "
            f"{WRITES[command]} there and would mix with or replace it: give a new or empty folder"
        )
    shown = ", ".join(quoted(n, 80) for n in names[:SHOWN]) + (" ..." if len(names) > SHOWN else "")
    raise DiffrlError(
        f"{flag} {quoted(str(out))} holds files that are not an earlier `diffrl {command}` output ({shown}); "
        f"{command} writes {WRITES[command]} there and would replace yours: give a new or empty folder "
        f"(an earlier {command} marks its folder with {MARKER}; one of an older diffrl has none: empty it)"
    )


def claim_out_folder(out: Path, flag: str, command: str) -> None:
    """Make ``out`` ``command``'s output folder before anything else is written there: checked
    again (files may have arrived since start-up), created, its :data:`MARKER` written first."""
    check_out_folder(out, flag, command)
    out.mkdir(parents=True, exist_ok=True)
    if owner(out) != command:
        (out / MARKER).write_text(json.dumps({"command": command}) + "\n")


def check_inputs_outside(
    out: Path, flag: str, command: str, inputs: Iterable[tuple[str, str | Path | None]]
) -> None:
    """Refuse an input (``inputs``: (its role, a file or folder the command reads); None or a
    path that does not exist skipped) that is ``out`` or lies inside it: ``command`` would write
    over it or beside it (an earlier output's ``prompts.txt`` sampled again, rewritten)."""
    where = _real(out)
    for role, given in inputs:
        if given is None or not Path(given).expanduser().exists():
            continue
        path = _real(Path(given).expanduser())
        if path == where or where in path.parents:
            raise DiffrlError(
                f"{flag} {quoted(str(out))} holds {role} ({quoted(str(given))}); {command} writes "
                f"{WRITES[command]} there and would replace or mix with what it reads: give another folder"
            )


MAX_WALKED = 10_000
"""Entries of an output folder :func:`check_links_inside` looks at, at most."""


def check_links_inside(out: Path, flag: str, inputs: Mapping[str, str | Path | None]) -> None:
    """Refuse an output folder holding a symlink that leads out of it: a file written through it
    (``transformer/`` linked to a base model's, with ``--force``) would replace the link's target,
    an input of this command (``inputs``: role -> folder; or any checkpoint) or anyone's file."""
    if not out.is_dir():
        return
    root, seen = _real(out), 0
    for parent, dirs, files in os.walk(out):  # links to folders are listed, not followed
        for name in [*dirs, *files]:
            seen += 1
            if seen > MAX_WALKED:
                return
            path = Path(parent) / name
            if not path.is_symlink():
                continue
            why, target = overlap(path, inputs), _real(path)
            if why is not None:
                raise DiffrlError(
                    f"{flag} {quoted(str(out))} holds a symlink into what this command reads: {why}; "
                    "writing through it would damage it: remove the link, or give a new folder"
                )
            if root not in target.parents:
                raise DiffrlError(
                    f"{flag} {quoted(str(out))} holds a symlink that leads out of it: {quoted(str(path))} -> "
                    f"{quoted(str(target))}; a file written through it would replace that: remove the link, "
                    "or give a new folder"
                )


def is_report(path: Path) -> bool:
    """True when ``path`` is a page ``diffrl report`` wrote (:data:`REPORT_HEAD` in its head)."""
    try:
        with path.open("rb") as f:
            return REPORT_HEAD in f.read(HEAD_BYTES)
    except OSError:
        return False


def check_page_out(page: Path, flag: str, fix: str) -> None:
    """Refuse a report page's path that would replace something else: a name that is not
    ``.html`` (a config, the metrics, a recipe), an existing file that is not a diffrl report, a
    FIFO or device (writing would block or go elsewhere), a dangling symlink; a symlink is judged
    by its target. ``fix`` ends the message (what to give instead)."""
    _dangling(page, flag)
    target = _real(page)
    if page.suffix.lower() not in PAGE_SUFFIXES or target.suffix.lower() not in PAGE_SUFFIXES:
        named = f" (a symlink to {quoted(str(target))})" if page.is_symlink() else ""
        raise DiffrlError(
            f"{flag} {quoted(str(page))}{named} is not an .html file; the report is an HTML page and "
            f"would replace it: {fix}"
        )
    try:
        mode = os.stat(target).st_mode
    except OSError:  # none yet (or a parent that is a file: said where the folder is checked)
        return
    if not stat.S_ISREG(mode):
        raise DiffrlError(
            f"{flag} {quoted(str(page))} is {file_kind(mode)}, not a file the report can replace: {fix}"
        )
    if not is_report(target):
        raise DiffrlError(
            f"{flag} {quoted(str(page))} exists and is not a page `diffrl report` wrote; the report would "
            f"replace it: {fix}"
        )


RUN_PICTURES = ("metrics.png", "eval_curve.png", "eval/compare.png")
"""What ``diffrl report`` draws into the run folder (besides its page)."""


def check_run_pictures(run_dir: Path) -> None:
    """Refuse a run folder where a picture the report draws would land outside the folder (a
    symlink to someone's file, or a symlinked ``eval/``) or on a FIFO or device."""
    root = _real(run_dir)
    for name in RUN_PICTURES:
        path = run_dir / name
        _dangling(path, f"RUN_DIR's {name}")
        target = _real(path)
        if root not in target.parents:
            raise DiffrlError(
                f"RUN_DIR's {name} ({quoted(str(path))}) leads to {quoted(str(target))}, outside the run "
                "folder; the report draws it anew and would replace that file: remove the link (or copy "
                "the run folder with cp -rL) and run the report again"
            )
        try:
            mode = os.stat(target).st_mode
        except OSError:  # none yet (or RUN_DIR is no folder: said when it is read)
            continue
        if not stat.S_ISREG(mode):
            raise DiffrlError(
                f"RUN_DIR's {name} ({quoted(str(path))}) is {file_kind(mode)}; the report draws it anew: "
                "remove it and run the report again"
            )
