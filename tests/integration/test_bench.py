"""``diffrl bench`` end to end on the tiny base model: the OCR and GenEval suites with the shipped
test prompts (GenEval on tiny random OWL-ViT and CLIP folders) print their tables and write
bench.json; a run folder given as --out gets a Benchmarks section in its report; bad inputs are
refused with one clear line (rows of test_bad_inputs' kind)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from diffrl.cli import main
from tests.integration.test_bad_inputs import BAD, Case, _check, _setup, run_row
from tests.unit.bench.tiny_detector import write_models

ROOT = Path(__file__).resolve().parents[2]
FEW_STEPS = ["sampling.num_steps=3"]
"""The tiny model's samples in 3 steps: what is tested is the scoring and the tables."""


@pytest.fixture(scope="module")
def geneval_models(tmp_path_factory):
    return write_models(tmp_path_factory.mktemp("bench_models"))


def test_ocr_paired_against_itself_into_a_run_folder(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')  # a run folder to report reads
    argv = ["bench", "base", "--suite", "ocr", "--num-prompts", "2", "--baseline", "base", "--out", str(run)]
    code = main([*argv, *FEW_STEPS])
    out = capsys.readouterr().out
    print(out)
    assert code == 0
    header = next(line for line in out.splitlines() if line.startswith("accuracy"))
    assert header.split() == ["accuracy", "n", "target", "baseline", "difference", "+-", "SE", "(paired)"]
    row = next(line for line in out.splitlines() if line.startswith("ocr "))
    # the same model on the same prompts and seeds: the difference is exactly 0
    assert row.split()[:2] == ["ocr", "2"] and row.split()[-3:] == ["+0.0000", "+-", "0.0000"]
    result = json.loads((run / "bench.json").read_text())["suites"]["ocr"]
    (ocr,) = result["tables"]["accuracy"]
    assert ocr["n"] == 2 and ocr["target"] == ocr["baseline"] and result["samples_per_prompt"] == 1
    samples = result["samples"]
    assert [s["scores"]["accuracy"] for s in samples] == [s["baseline_scores"]["accuracy"] for s in samples]
    assert ocr["target"] == pytest.approx(sum(s["scores"]["accuracy"] for s in samples) / 2)
    assert (run / "bench_ocr.png").is_file() and not (run / ".diffrl-output").exists()
    assert main(["report", str(run)]) == 0
    page = (run / "report.html").read_text()
    assert (
        "<h2>Benchmarks</h2>" in page
        and "<h3>ocr</h3>" in page
        and "<td>ocr</td><td class=num>2</td>" in page
    )


def test_geneval_prints_every_tags_row(tmp_path, capsys, geneval_models):
    detector, clip = geneval_models
    argv = ["bench", "base", "--suite", "geneval", "--num-prompts", "6", "--samples-per-prompt", "1"]
    assert (
        main(
            [
                *argv,
                "--out",
                str(tmp_path / "b"),
                "--detector",
                str(detector),
                "--clip",
                str(clip),
                *FEW_STEPS,
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    print(out)
    tags = ["single_object", "two_object", "counting", "colors", "position", "color_attr"]
    rows = {
        line.split()[0]: line.split()
        for line in out.splitlines()
        if line.split()[:1] and line.split()[0] in tags
    }
    assert list(rows) == tags
    result = json.loads((tmp_path / "b" / "bench.json").read_text())["suites"]["geneval"]
    table = result["tables"]["correct"]
    assert [r["category"] for r in table] == [*tags, "overall (mean of categories)"]
    # GenEval's score: the mean over tags of each tag's share of correct images
    assert table[-1]["target"] == pytest.approx(sum(r["target"] for r in table[:-1]) / 6)
    assert all(s["scores"]["correct"] in (0.0, 1.0) for s in result["samples"])
    wrong = [s for s in result["samples"] if s["scores"]["correct"] == 0.0]
    assert all(s["note"] for s in wrong)  # GenEval's reason, e.g. "expected bench>=1, found 0"
    assert (tmp_path / "b" / ".diffrl-output").is_file() and (tmp_path / "b" / "bench_geneval.png").is_file()


GENEVAL_BAD_LINE = (
    '{"tag": "counting", "include": [{"class": "apple", "count": 0}], "prompt": "a photo of apples"}\n'
)

CASES = [
    Case("unknown-suite", ["bench", "base", "--suite", "genevel"], BAD, "Did you mean 'geneval'?"),
    Case("no-suite", ["bench", "base"], BAD, "the following arguments are required: --suite"),
    Case(
        "missing-prompts",
        ["bench", "base", "--suite", "ocr", "--prompts", "{tmp}/nope.txt"],
        BAD,
        "--prompts (ocr) '{tmp}/nope.txt' does not exist",
    ),
    Case(
        "malformed-jsonl",
        ["bench", "base", "--suite", "geneval", "--prompts", "{tmp}/m.jsonl"],
        BAD,
        'line 1: "include"[0]: "count" must be an integer in [1, 1000], got 0',
        files={"m.jsonl": GENEVAL_BAD_LINE},
    ),
    Case(
        "ocr-without-quotes",
        ["bench", "base", "--suite", "ocr", "--prompts", "{tmp}/t.txt"],
        BAD,
        "line 1 ('a cat') quotes no text to render",
        files={"t.txt": "a cat\n"},
    ),
    Case(
        "drawbench-no-category",
        ["bench", "base", "--suite", "drawbench", "--prompts", "{tmp}/d.csv"],
        BAD,
        "lacks the column(s) Category",
        files={"d.csv": "Prompts\nA red car.\n"},
    ),
    Case(
        "too-many-prompts",
        ["bench", "base", "--suite", "ocr", "--num-prompts", "100"],
        BAD,
        "--num-prompts 100:",
    ),
    Case("geneval-without-models", ["bench", "base", "--suite", "geneval"], BAD, "needs --detector FOLDER"),
    Case(
        "detector-not-one",
        ["bench", "base", "--suite", "geneval", "--detector", "{tmp}/empty", "--clip", "{tmp}/empty"],
        BAD,
        "--detector: '{tmp}/empty' has no config.json",
        files={"empty/": ""},
    ),
    Case(
        "detector-is-clip",
        ["bench", "base", "--suite", "geneval", "--detector", "{tmp}/clip", "--clip", "{tmp}/clip"],
        BAD,
        "holds a 'clip' model; reward 'geneval' expects an OWL-ViT or OWLv2 detector",
        prepare=lambda tmp: write_models(tmp),
    ),
    Case(
        "drawbench-no-rewards",
        ["bench", "base", "--suite", "drawbench", "--rewards", " , "],
        BAD,
        "names no reward",
    ),
    Case(
        "drawbench-empty-rewards",
        ["bench", "base", "--suite", "drawbench", "eval.rewards=[]"],
        BAD,
        "scores with eval.rewards, which is empty",
    ),
    Case(
        "detector-for-ocr",
        ["bench", "base", "--suite", "ocr", "--detector", "{tmp}/owlvit"],
        BAD,
        "--detector: --suite ocr does not use it (only geneval does); leave it out",
    ),
    Case(
        "clip-for-drawbench",
        ["bench", "base", "--suite", "drawbench", "--clip", "{tmp}/clip"],
        BAD,
        "--clip: --suite drawbench does not use it (only geneval does); leave it out",
    ),
    Case(
        "rewards-for-geneval",
        ["bench", "base", "--suite", "geneval", "--rewards", "pickscore"],
        BAD,
        "--rewards: --suite geneval does not use it (only drawbench does); leave it out",
    ),
    Case(
        "out-is-another-commands",
        ["bench", "base", "--suite", "ocr", "--out", "{tmp}/o"],
        BAD,
        "holds files that are not an earlier `diffrl bench` output",
        files={"o/grid.png": "x"},
    ),
    Case(
        "bad-threshold",
        ["bench", "base", "--suite", "geneval", "--threshold", "2"],
        BAD,
        "must be a number in [0, 1]",
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_bench_input(case: Case, tmp_path, request, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = _setup(case, tmp_path, request)
    case = Case(case.id, argv, case.code, case.message.replace("{tmp}", str(tmp_path)))
    _check(case, *run_row(case, argv, monkeypatch, capsys))


def test_report_of_a_bench_json_holding_an_integer_past_floats_range(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "train/loss": 0.5}\n')
    row = {"category": "ocr", "n": 1, "target": 10**400, "baseline": 0.5, "difference": 10**400, "se": 0}
    result = {"target": "base", "baseline": "base", "num_prompts": 1, "tables": {"accuracy": [row]}}
    (run / "bench.json").write_text(json.dumps({"suites": {"ocr": result}}))
    assert main(["report", str(run)]) == 0  # was exit 70: OverflowError in math.isfinite
    page = (run / "report.html").read_text()
    assert "<td class=num>nan</td><td class=num>0.5000</td><td class=num>nan ± 0.0000</td>" in page


@pytest.mark.skipif(importlib.util.find_spec("scipy") is not None, reason="scipy is installed here")
def test_an_owlv2_folder_without_scipy_is_refused_by_name(tmp_path, capsys, geneval_models):
    owl = tmp_path / "owlv2"
    owl.mkdir()
    (owl / "config.json").write_text('{"model_type": "owlv2"}')
    (owl / "model.safetensors").write_bytes(b"")  # never read: refused before anything loads
    argv = ["bench", "base", "--suite", "geneval", "--detector", str(owl), "--clip", str(geneval_models[1])]
    assert main([*argv, "--out", str(tmp_path / "out")]) == BAD
    err = capsys.readouterr().err
    assert "is an OWLv2 folder, whose image processor needs scipy" in err and "Traceback" not in err
