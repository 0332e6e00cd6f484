"""The Benchmarks section of a run's report: bench.json's tables, escaped; a bench.json that cannot
be read is said (in the page's "Not read" list), never a crash."""

from __future__ import annotations

import json
import os

from diffrl.bench.report import bench_section

RESULT = {
    "target": "runs/x/checkpoints/final",
    "baseline": "base",
    "prompts": "test.txt",
    "num_prompts": 2,
    "samples_per_prompt": 1,
    "seed": 7,
    "tables": {
        "accuracy": [
            {
                "category": "<b>ocr</b>",
                "n": 2,
                "target": 0.5,
                "baseline": 0.25,
                "difference": 0.25,
                "se": None,
            }
        ]
    },
}


def test_tables_are_shown_escaped(tmp_path):
    (tmp_path / "bench.json").write_text(json.dumps({"suites": {"ocr": RESULT}}))
    unread: list[str] = []
    page = "".join(bench_section(tmp_path, unread))
    assert unread == []
    assert "<h3>ocr</h3>" in page and "&lt;b&gt;ocr&lt;/b&gt;" in page and "<b>ocr</b>" not in page
    assert "<td class=num>0.5000</td><td class=num>0.2500</td><td class=num>+0.2500 ± </td>" in page
    assert "baseline <code>base</code>" in page and "2 prompts × 1 samples, seed 7" in page


def test_no_bench_json_no_section(tmp_path):
    unread: list[str] = []
    assert bench_section(tmp_path, unread) == [] and unread == []


def test_what_cannot_be_read_is_said(tmp_path):
    unread: list[str] = []
    (tmp_path / "bench.json").write_text("[" * 100_000)
    assert bench_section(tmp_path, unread) == [] and "nested too deeply" in unread[0]
    (tmp_path / "bench.json").write_text(json.dumps({"suites": {"ocr": {"tables": 3}, "x": RESULT}}))
    unread.clear()
    page = "".join(bench_section(tmp_path, unread))
    assert "suite 'ocr' holds no tables" in unread[0] and "<h3>x</h3>" in page
    (tmp_path / "bench.json").unlink()
    os.mkfifo(tmp_path / "bench.json")  # never waited on
    unread.clear()
    assert bench_section(tmp_path, unread) == [] and "FIFO" in unread[0]


def test_an_integer_past_floats_range_is_no_number_not_a_crash(tmp_path):
    huge = 10**400  # valid JSON (under Python's 4,300 digits) that float() cannot hold
    row = {"category": "ocr", "n": huge, "target": huge, "baseline": -huge, "difference": huge, "se": huge}
    result = {**RESULT, "num_prompts": huge, "tables": {"accuracy": [row]}}
    (tmp_path / "bench.json").write_text(json.dumps({"suites": {"ocr": result}}))
    unread: list[str] = []
    page = "".join(bench_section(tmp_path, unread))
    assert unread == [] and len(page) < 5000
    assert "<td>ocr</td><td class=num></td><td class=num>nan</td><td class=num>nan</td>" in page
    assert "<td class=num>nan ± nan</td>" in page
