"""``diffrl report`` on a run folder whose files are damaged (issue 36, class 9).

The choice: a report is read-only and its reader wants whatever can be shown, so a file that
cannot be read (no regular file, not UTF-8, JSON cut short, rows of the wrong types) never fails
the command nor makes it wait: it is left out, said in a ``warning:`` line each and in the page's
first section ("Not read"), and the rest is written (exit 0)."""

from __future__ import annotations

import json
import os
import struct
import zlib
from collections.abc import Callable
from pathlib import Path

import pytest
from PIL import Image

from diffrl.cli import main

ROWS = [{"step": 1, "train/loss": 0.5, "rollout/reward/raw_mean": 0.25}, {"step": 2, "train/loss": 0.4}]
METRICS = "".join(json.dumps(r) + "\n" for r in ROWS)
EVALS = json.dumps([{"step": 0, "eval/reward_mean": 0.1}, {"step": 2, "eval/reward_mean": 0.3}])


def fifo(path: Path) -> None:
    os.mkfifo(path)


def folder(path: Path) -> None:
    path.mkdir()


def loop(path: Path) -> None:
    path.symlink_to(path.name)


def dangling(path: Path) -> None:
    path.symlink_to("missing")


def text(content: str | bytes) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())

    return write


def png_claiming(width: int, height: int) -> Callable[[Path], None]:
    """A PNG whose header claims ``width x height`` pixels (a few bytes: no pixel data)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b""))
        + chunk(b"IEND", b"")
    )
    return text(body)


BOMB = "run:\n  a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"  {b}: &{b} [{', '.join([f'*{a}'] * 9)}]\n" for a, b in zip("abcdefg", "bcdefgh", strict=True)
)
"""A YAML alias bomb: 400 bytes that stand for 9^8 values (printing a setting of it would expand them)."""

KINDS = {"fifo": (fifo, "is a FIFO (named pipe), not a regular file"), "folder": (folder, "is a folder")}
KINDS |= {
    "symlink-loop": (loop, "is a symlink loop"),
    "dangling": (dangling, "is a symlink to a missing file"),
}

# (id, file of the run folder, how it is damaged, a piece of the warning)
CASES = [
    *[
        (f"{f}-{k}", f, make, said)
        for f in ("metrics.jsonl", "eval_curve.json", "config.yaml")
        for k, (make, said) in KINDS.items()
    ],
    ("curve-brace", "eval_curve.json", text("{"), "is not valid JSON (Expecting property name"),
    ("curve-empty-file", "eval_curve.json", text(""), "is not valid JSON (Expecting value at line 1)"),
    ("curve-object", "eval_curve.json", text("{}"), "holds an object, not the array of evals"),
    ("curve-null", "eval_curve.json", text("null"), "holds null, not the array of evals"),
    ("curve-numbers", "eval_curve.json", text("[1, 2]"), "entries 0, 1 (counted from 0) are not evals"),
    ("curve-no-step", "eval_curve.json", text('[{"eval/reward_mean": 1}]'), "entries 0 (counted from 0)"),
    ("curve-step-text", "eval_curve.json", text('[{"step": "a", "eval/reward_mean": "x"}]'), "entries 0"),
    ("curve-step-float", "eval_curve.json", text('[{"step": 1.5, "eval/reward_mean": 1}]'), "entries 0"),
    ("curve-step-bool", "eval_curve.json", text('[{"step": true}]'), "entries 0"),
    (
        "curve-value-object",
        "eval_curve.json",
        text('[{"step": 1, "eval/reward_mean": {"a": 1}}]'),
        "values that are not numbers were left out (eval/reward_mean)",
    ),
    (
        "curve-not-utf8",
        "eval_curve.json",
        text(b"\xff\xfe["),
        "is not UTF-8 text (line 1, column 1: byte 0xff)",
    ),
    (
        "metrics-cut-short",
        "metrics.jsonl",
        text(METRICS + '{"step": 3, "train/lo'),
        'line(s) 3 are not metric rows ({"step": N, ...}) and were skipped (the last one cut short',
    ),
    (
        "metrics-garbage",
        "metrics.jsonl",
        text("garbage\n" + METRICS + "[1]\n{}\n"),
        "line(s) 1, 4, 5 are not metric rows",
    ),
    (
        "metrics-step-text",
        "metrics.jsonl",
        text('{"step": "x", "train/loss": 1}\n' + METRICS),
        "line(s) 1 are not metric rows",
    ),
    (
        "metrics-step-null",
        "metrics.jsonl",
        text('{"step": null}\n' + METRICS),
        "line(s) 1 are not metric rows",
    ),
    (
        "metrics-value-text",
        "metrics.jsonl",
        text('{"step": 1, "train/loss": "low"}\n'),
        "values that are not numbers were left out (train/loss)",
    ),
    (
        "metrics-not-utf8",
        "metrics.jsonl",
        text(METRICS.encode() + b"\xff\n"),
        "is not UTF-8 text (line 3, column 1",
    ),
    ("config-not-utf8", "config.yaml", text(b"run: {name: \xff}\n"), "is not UTF-8 text (line 1, column 13"),
    ("config-not-yaml", "config.yaml", text("run: [\n"), "is not valid YAML"),
    ("config-a-list", "config.yaml", text("- 1\n"), "holds an array, not a config mapping"),
    ("grid-fifo", "eval/step_00000.png", fifo, "eval/compare.png not drawn: eval grid"),
    ("curve-nested-deep", "eval_curve.json", text("[" * 100_000 + "]" * 100_000), "is nested too deeply"),
    (
        "metrics-nested-deep",
        "metrics.jsonl",
        text(METRICS + "[" * 100_000 + "\n"),
        "line(s) 3 are not metric rows",
    ),
    # a grid past PIL's own refusal (2 x 89 M pixels), and one below PIL's warning but past what a run writes
    (
        "grid-claims-30000-square",
        "eval/step_00000.png",
        png_claiming(30_000, 30_000),
        "more pixels than any eval grid",
    ),
    # class 9 (issue 36): steps and values no run writes; each row skipped or left out, said, never exit 70
    *[
        (
            f"c9-metrics-step-{k}",
            "metrics.jsonl",
            text(f'{{"step": {v}, "train/loss": 1}}\n' + METRICS),
            "line(s) 1 are",
        )
        for k, v in {
            "401-digits": "1" + "0" * 400,
            "5000-digits": "9" * 5000,
            "1e400": "1e400",
            "nan": "NaN",
            "inf": "Infinity",
            "negative": -1,
            "bool": "true",
            "float": 2.5,
        }.items()
    ],
    *[
        (
            f"c9-metrics-value-{k}",
            "metrics.jsonl",
            text(f'{{"step": 3, "train/loss": {v}}}\n' + METRICS),
            "left out (train/loss)",
        )
        for k, v in {
            "inf": "Infinity",
            "minus-inf": "-Infinity",
            "401-digits": "9" * 401,
            "1e300": "1e300",
        }.items()
    ],
    (
        "c9-metrics-line-of-50-mb",
        "metrics.jsonl",
        text(METRICS + '{"step": 3, "note": "' + "a" * 50_000_000 + '"}\n'),
        "values that are not numbers were left out (note)",
    ),
    ("c9-curve-step-401-digits", "eval_curve.json", text('[{"step": 1' + "0" * 400 + "}]"), "entries 0"),
    (
        "c9-curve-number-5000-digits",
        "eval_curve.json",
        text('[{"step": ' + "9" * 5000 + "}]"),
        "holds a value JSON cannot read",
    ),
    (
        "c9-curve-value-inf",
        "eval_curve.json",
        text('[{"step": 0, "eval/reward_mean": Infinity}, {"step": 2, "eval/reward_mean": 0.3}]'),
        "values that are not numbers were left out (eval/reward_mean)",
    ),
    (
        "c9-config-alias-bomb",
        "config.yaml",
        text(BOMB),
        "is not a config diffrl wrote (line 7: this value expands to more than 100,000 values",
    ),
    (
        "c9-config-nested-deep",
        "config.yaml",
        text("a: " + "[" * 5000 + "]" * 5000 + "\n"),
        "nested more than 40 levels deep",
    ),
    ("grid-claims-9000-square", "eval/step_00002.png", png_claiming(9_000, 9_000), "9000x9000; replace it"),
    (
        "grid-not-an-image",
        "eval/step_00000.png",
        text("no png"),
        "eval/compare.png not drawn: cannot identify image file",
    ),
]


def make_run(tmp_path: Path, name: str, damage: Callable[[Path], None]) -> Path:
    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(METRICS)
    (run / "eval_curve.json").write_text(EVALS)
    (run / "config.yaml").write_text("run: {name: damaged}\nalgorithm: {name: grpo}\n")
    for step in (0, 2):
        Image.new("RGB", (16, 8), (step * 60, 0, 0)).save(run / "eval" / f"step_{step:05d}.png")
    (run / name).unlink()
    damage(run / name)
    return run


@pytest.mark.parametrize(("name", "damage", "said"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_damaged_file_is_left_out_and_said_the_rest_is_written(name, damage, said, tmp_path, capsys):
    run = make_run(tmp_path, name, damage)
    assert main(["report", str(run)]) == 0
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning: ")]
    assert any(said in w for w in warnings), captured.err
    assert any(name.split("/")[-1] in w for w in warnings)  # each names the file
    page = (run / "report.html").read_text()
    assert "<h2>Not read</h2>" in page and "<h2>Config</h2>" in page
    if name != "metrics.jsonl":  # what is whole is still there
        assert "<code>train/loss</code>" in page
    if name != "eval_curve.json":
        assert "0.3000" in page  # the last eval in the eval table


def test_an_undamaged_run_has_no_not_read_section(tmp_path, capsys):
    run = make_run(tmp_path, "config.yaml", text("run: {name: fine}\n"))
    assert main(["report", str(run)]) == 0
    assert "warning" not in capsys.readouterr().err
    assert "Not read" not in (run / "report.html").read_text()


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_left_out(tmp_path, capsys):
    run = make_run(tmp_path, "eval_curve.json", text(EVALS))
    (run / "eval_curve.json").chmod(0)
    try:
        assert main(["report", str(run)]) == 0
    finally:
        (run / "eval_curve.json").chmod(0o644)
    assert "cannot be read (permission denied)" in capsys.readouterr().err


def test_a_run_whose_only_file_is_a_fifo_is_still_a_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "metrics.jsonl")
    assert main(["report", str(run)]) == 0
    assert "is a FIFO (named pipe)" in capsys.readouterr().err
