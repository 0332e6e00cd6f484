"""Outputs that would destroy inputs (issue 36, class 7), and run folders that would leave runs/:
each is refused with exit 2 and an ``error:`` line naming the option and the fix, before anything
is written or deleted (every file and link under the row's ``tmp_path`` is as it was).

Rows use :class:`tests.integration.test_bad_inputs.Case` (``{tmp}``: the row's ``tmp_path``;
``{ckpt}``: a private copy of the tiny checkpoint) and run in process through
:func:`diffrl.cli.main`, from ``{tmp}/work`` (a relative path lands there, never in the repository).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from diffrl.train.run_folder import RunFolder
from tests.integration.test_bad_inputs import BAD, ROOT, Case, _check, _setup, run_row

SFT = str(ROOT / "recipes" / "tiny_sft.yaml")
RUN = {"run/metrics.jsonl": '{"step": 1, "train/loss": 0.5}\n', "run/run.json": '{"run_id": "r1"}'}
"""A run folder ``report`` reads (one metrics row)."""
SAMPLED = {
    "out/.diffrl-output": '{"command": "sample"}\n',
    "out/prompts.txt": "a\nb\n",
    "out/grid.png": "png",
}
"""An earlier ``sample --out {tmp}/out``'s folder."""
EVALUATED = {"out/.diffrl-output": '{"command": "eval"}\n', "out/scores.json": "{}", "out/grid.png": "png"}
REPORT_PAGE = '<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>diffrl report: old</title>'
"""The head of a page ``diffrl report`` wrote."""
NOT_A_PAGE = "is not an .html file; the report is an HTML page and would replace it"
NOT_SAMPLES = "holds files that are not an earlier `diffrl sample` output"
NOT_EVALS = "holds files that are not an earlier `diffrl eval` output"
NOT_PLAIN = "run.name names one folder: it must not"
"""(run.name is checked where the config binds: diffrl/config/schema.py.)"""
INSIDE = "writing there would damage what this command reads"
QUICK = ["model.path=random", "train.iterations=1", "eval.enabled=false"]
"""A train row's settings should a refusal ever fail: one iteration of a random model."""


def link(name: str, target: str):
    """``prepare``: ``{tmp}/name`` a symlink to ``target`` (``{tmp}`` and ``{ckpt}`` filled)."""

    def make(tmp: Path) -> None:
        path = tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.symlink_to(target.replace("{ckpt}", str(tmp / "ckpt")).replace("{tmp}", str(tmp)))

    return make


def fifo(name: str):
    def make(tmp: Path) -> None:
        os.mkfifo(tmp / name)

    return make


# one row a line: the table reads down its columns
# fmt: off
CASES: list[Case] = [
    # ---- report --out: only a new .html file or an earlier report; nothing the report reads
    Case("c7-report-out-onto-config", ["report", "{tmp}/run", "--out", "{tmp}/run/config.yaml"], BAD, f"--out '{{tmp}}/run/config.yaml' {NOT_A_PAGE}", files={**RUN, "run/config.yaml": "run: {name: r}\n"}),
    Case("c7-report-out-onto-metrics", ["report", "{tmp}/run", "--out", "{tmp}/run/metrics.jsonl"], BAD, NOT_A_PAGE, files=RUN),
    Case("c7-report-out-onto-a-recipe", ["report", "{tmp}/run", "--out", "{tmp}/recipe.yaml"], BAD, NOT_A_PAGE, files={**RUN, "recipe.yaml": "train: {lr: 1.0e-4}\n"}),
    Case("c7-report-out-new-non-html", ["report", "{tmp}/run", "--out", "{tmp}/report.txt"], BAD, NOT_A_PAGE, files=RUN),
    Case("c7-report-out-onto-a-users-page", ["report", "{tmp}/run", "--out", "{tmp}/mine.html"], BAD, "--out '{tmp}/mine.html' exists and is not a page `diffrl report` wrote", files={**RUN, "mine.html": "<p>mine</p>\n"}),
    Case("c7-report-out-symlink-to-config", ["report", "{tmp}/run", "--out", "{tmp}/page.html"], BAD, "(a symlink to '{tmp}/run/config.yaml') is not an .html file", files={**RUN, "run/config.yaml": "run: {name: r}\n"}, prepare=link("page.html", "{tmp}/run/config.yaml")),
    Case("c7-report-out-symlink-to-a-device", ["report", "{tmp}/run", "--out", "{tmp}/page.html"], BAD, "(a symlink to '/dev/null') is not an .html file", files=RUN, prepare=link("page.html", "/dev/null")),
    Case("c7-report-out-fifo", ["report", "{tmp}/run", "--out", "{tmp}/page.html"], BAD, "--out '{tmp}/page.html' is a FIFO (named pipe)", files=RUN, prepare=fifo("page.html")),
    Case("c7-report-out-dangling-symlink", ["report", "{tmp}/run", "--out", "{tmp}/page.html"], BAD, "is a symlink to '{tmp}/gone/x.html', which does not exist", files=RUN, prepare=link("page.html", "{tmp}/gone/x.html")),
    Case("c7-report-out-in-a-runs-checkpoints", ["report", "{tmp}/run", "--out", "{tmp}/run/checkpoints/report.html"], BAD, "lies inside the checkpoint folder", files={**RUN, "run/checkpoints/": ""}),
    Case("c7-report-default-page-is-a-users", ["report", "{tmp}/run"], BAD, "RUN_DIR's report.html '{tmp}/run/report.html' exists and is not a page `diffrl report` wrote; the report would replace it: move it away, or give --out FILE.html", files={**RUN, "run/report.html": "<p>mine</p>\n"}),
    Case("c7-report-picture-links-out", ["report", "{tmp}/run"], BAD, "RUN_DIR's metrics.png ('{tmp}/run/metrics.png') leads to '{tmp}/mine.png', outside the run folder", files={**RUN, "mine.png": "mine"}, prepare=link("run/metrics.png", "{tmp}/mine.png")),
    Case("c7-report-eval-folder-links-out", ["report", "{tmp}/run"], BAD, "RUN_DIR's eval/compare.png", files={**RUN, "grids/compare.png": "mine"}, prepare=link("run/eval", "{tmp}/grids")),
    Case("c7-report-over-an-earlier-report", ["report", "{tmp}/run", "--out", "{tmp}/old.html"], 0, "report: {tmp}/old.html", files={**RUN, "old.html": REPORT_PAGE}),
    # ---- sample --out: a new or empty folder, or an earlier sample's; no input inside it
    Case("c7-sample-into-a-users-folder", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, f"--out '{{tmp}}/out' {NOT_SAMPLES} ('grid.png', 'prompts.txt')", files={"out/prompts.txt": "mine\n", "out/grid.png": "mine"}),
    Case("c7-sample-into-a-run-folder", ["sample", "base", "--prompt", "a", "--out", "{tmp}/run"], BAD, NOT_SAMPLES, files={**RUN, "run/config.yaml": "run: {name: r}\n"}),
    Case("c7-sample-into-an-eval-output", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, "--out '{tmp}/out' holds the output of `diffrl eval`", files=EVALUATED),
    Case("c7-sample-marker-garbled", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, NOT_SAMPLES, files={**SAMPLED, "out/.diffrl-output": "{"}),
    Case("c7-sample-marker-is-a-fifo", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, NOT_SAMPLES, files={"out/grid.png": "mine"}, prepare=fifo("out/.diffrl-output")),
    Case("c7-sample-prompts-inside-out", ["sample", "base", "--prompts", "{tmp}/out/prompts.txt", "--out", "{tmp}/out"], BAD, "--out '{tmp}/out' holds --prompts ('{tmp}/out/prompts.txt')", files=SAMPLED),
    Case("c7-sample-prompts-linked-into-out", ["sample", "base", "--prompts", "{tmp}/p.txt", "--out", "{tmp}/out"], BAD, "holds --prompts ('{tmp}/p.txt')", files=SAMPLED, prepare=link("p.txt", "{tmp}/out/prompts.txt")),
    Case("c7-sample-image-inside-out", ["sample", "base", "--prompt", "a", "--image", "{tmp}/out/0000.png", "--out", "{tmp}/out"], BAD, "holds --image ('{tmp}/out/0000.png')", files={**SAMPLED, "out/0000.png": "png"}),
    Case("c7-sample-recipe-inside-out", ["sample", "{tmp}/out/r.yaml", "--prompt", "a", "--out", "{tmp}/out"], BAD, "holds the target ('{tmp}/out/r.yaml')", files={**SAMPLED, "out/r.yaml": "model: {family: tiny}\n"}),
    Case("c7-sample-out-holds-the-checkpoint", ["sample", "{ckpt}", "--prompt", "a", "--out", "{tmp}"], BAD, "--out '{tmp}' holds the target's checkpoint ('{tmp}/ckpt')", files={".diffrl-output": '{"command": "sample"}'}),
    Case("c7-sample-out-symlink-to-checkpoint", ["sample", "{ckpt}", "--prompt", "a", "--out", "{tmp}/link"], BAD, INSIDE, prepare=link("link", "{ckpt}")),
    Case("c7-sample-out-in-a-runs-checkpoints", ["sample", "base", "--prompt", "a", "--out", "{tmp}/run/checkpoints/new"], BAD, "lies inside the checkpoint folder", files={**RUN, "run/checkpoints/": ""}),
    Case("c7-sample-out-dangling-symlink", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, "--out '{tmp}/out' is a symlink to '{tmp}/gone', which does not exist", prepare=link("out", "{tmp}/gone")),
    Case("c7-sample-out-fifo", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, "cannot be a folder: it is a file", prepare=fifo("out")),
    Case("c7-sample-out-is-the-prompts-file", ["sample", "base", "--prompts", "{tmp}/p.txt", "--out", "{tmp}/p.txt"], BAD, "--out '{tmp}/p.txt' cannot be a folder: it is a file", files={"p.txt": "a\n"}),
    Case("c7-sample-own-folder-links-out", ["sample", "base", "--prompt", "a", "--out", "{tmp}/out"], BAD, "--out '{tmp}/out' holds a symlink that leads out of it: '{tmp}/out/0000.png' -> '{tmp}/mine.png'", files={**SAMPLED, "mine.png": "mine"}, prepare=link("out/0000.png", "{tmp}/mine.png")),
    Case("c7-sample-out-holds-a-link-into-the-checkpoint", ["sample", "{ckpt}", "--prompt", "a", "--out", "{tmp}/out"], BAD, "holds a symlink into what this command reads: '{tmp}/out/0000.png' lies inside the target's checkpoint", files={"out/.diffrl-output": '{"command": "sample"}'}, prepare=link("out/0000.png", "{ckpt}/trainable.safetensors")),
    # ---- eval --out: likewise
    Case("c7-eval-into-a-users-folder", ["eval", "base", "--out", "{tmp}/out"], BAD, f"--out '{{tmp}}/out' {NOT_EVALS} ('scores.json')", files={"out/scores.json": "mine"}),
    Case("c7-eval-into-a-sample-output", ["eval", "base", "--out", "{tmp}/out"], BAD, "holds the output of `diffrl sample`; eval writes grid.png and scores.json there", files=SAMPLED),
    Case("c7-eval-into-the-runs-folder", ["eval", "base", "--out", "{tmp}/runs"], BAD, NOT_EVALS, files={"runs/r1/run.json": '{"run_id": "r1"}'}),
    Case("c7-eval-prompts-inside-out", ["eval", "base", "--prompts", "{tmp}/out/p.txt", "--out", "{tmp}/out"], BAD, "holds eval.prompts ('{tmp}/out/p.txt')", files={**EVALUATED, "out/p.txt": "a\n"}),
    Case("c7-eval-out-holds-the-checkpoint", ["eval", "{ckpt}", "--out", "{tmp}"], BAD, "--out '{tmp}' holds the target's checkpoint", files={".diffrl-output": '{"command": "eval"}'}),
    Case("c7-eval-out-holds-the-baseline", ["eval", "base", "--baseline", "{ckpt}", "--out", "{tmp}"], BAD, "--out '{tmp}' holds the baseline's checkpoint", files={".diffrl-output": '{"command": "eval"}'}),
    Case("c7-eval-out-dangling-symlink", ["eval", "base", "--out", "{tmp}/out"], BAD, "is a symlink to '{tmp}/gone', which does not exist", prepare=link("out", "{tmp}/gone")),
    Case("c7-eval-out-is-the-recipe", ["eval", "{tmp}/r.yaml", "--out", "{tmp}/r.yaml"], BAD, "--out '{tmp}/r.yaml' cannot be a folder: it is a file", files={"r.yaml": "model: {family: tiny}\n"}),
    # ---- export OUT_DIR: --force writes into a folder, never through a link into what it reads
    Case("c7-export-force-through-a-link-into-the-checkpoint", ["export", "{ckpt}", "{tmp}/out", "--force"], BAD, "OUT_DIR '{tmp}/out' holds a symlink into what this command reads: '{tmp}/out/transformer' is the checkpoint's checkpoint", files={"out/keep.txt": "mine"}, prepare=link("out/transformer", "{ckpt}")),
    Case("c7-export-force-through-a-link-out", ["export", "{ckpt}", "{tmp}/out", "--force"], BAD, "OUT_DIR '{tmp}/out' holds a symlink that leads out of it: '{tmp}/out/text_encoder' -> '{tmp}/base/text_encoder'", files={"base/text_encoder/config.json": "{}"}, prepare=link("out/text_encoder", "{tmp}/base/text_encoder")),
    Case("c7-export-into-the-checkpoint-by-a-symlinked-path", ["export", "{ckpt}", "{tmp}/link", "--force"], BAD, INSIDE, prepare=link("link", "{ckpt}")),
    Case("c7-export-into-the-checkpoints-parent-link", ["export", "{ckpt}", "{tmp}/link/final", "--force"], BAD, INSIDE, prepare=link("link", "{ckpt}")),
    Case("c7-export-out-fifo", ["export", "{ckpt}", "{tmp}/out"], BAD, "OUT_DIR '{tmp}/out' cannot be a folder: it is a file", prepare=fifo("out")),
    # ---- train: run.name names a folder directly inside runs/; a run writes through no link
    Case("c7-run-name-dotdot", ["train", SFT, "run.name=../escaped", *QUICK], BAD, f"{NOT_PLAIN} hold '/' (a path separator), got '../escaped'", trains=True),
    Case("c7-run-name-up-two", ["train", SFT, "run.name=../..", *QUICK], BAD, NOT_PLAIN, trains=True),
    Case("c7-run-name-slash", ["train", SFT, "run.name=a/b", *QUICK], BAD, NOT_PLAIN, trains=True),
    Case("c7-run-name-absolute", ["train", SFT, "run.name={tmp}/abs", *QUICK], BAD, NOT_PLAIN, trains=True),
    Case("c7-run-name-dot", ["train", SFT, "run.name=.", *QUICK], BAD, "run.name must not be '.'", trains=True),
    Case("c7-run-name-backslash", ["train", SFT, "run.name=..\\x", *QUICK], BAD, NOT_PLAIN, trains=True),
    Case("c7-run-config-yaml-links-out", ["train", SFT, "run.output_dir={tmp}/run", *QUICK], BAD, "output folder '{tmp}/run': config.yaml is a symlink to '{tmp}/recipe.yaml'; the run writes config.yaml", files={"run/run.json": '{"run_id": null}', "recipe.yaml": "mine: true\n"}, prepare=link("run/config.yaml", "{tmp}/recipe.yaml"), trains=True),
    Case("c7-run-report-is-a-folder", ["train", SFT, "run.output_dir={tmp}/run", *QUICK], BAD, "report.html is not a file", files={"run/run.json": '{"run_id": null}', "run/report.html/": ""}, trains=True),
    Case("c7-run-metrics-is-a-fifo", ["train", SFT, "run.output_dir={tmp}/run", *QUICK], BAD, "metrics.jsonl is not a file", files={"run/run.json": '{"run_id": null}'}, prepare=fifo("run/metrics.jsonl"), trains=True),
]
# fmt: on


def _snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root``: a file's bytes, a link's target, a folder or FIFO as such."""
    seen: dict[str, object] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            path = Path(dirpath) / name
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                seen[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISREG(mode):
                seen[str(path)] = path.read_bytes()
            else:
                seen[str(path)] = stat.S_IFMT(mode)
    return seen


def test_the_table_is_well_formed():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)) and all(i.startswith("c7-") for i in ids)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused_before_anything_is_written(case: Case, tmp_path, request, capsys, monkeypatch):
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")  # a relative path (runs/<run.name>) lands here
    argv = _setup(case, tmp_path, request)
    before = _snapshot(tmp_path)
    code, out, err = run_row(case, argv, monkeypatch, capsys)
    filled = Case(case.id, argv, case.code, case.message.replace("{tmp}", str(tmp_path)))
    _check(filled, code, out, err)
    if case.code != 0:
        assert err.count("error:") == 1, err
        assert _snapshot(tmp_path) == before, "something was written or deleted before the refusal"


# ---- what is allowed: an earlier output of the same command is written again ---------------------


def test_sample_writes_again_into_its_own_folder_and_marks_it_first(tmp_path, monkeypatch, capsys):
    from diffrl.cli import main
    from diffrl.cli.outputs import MARKER

    monkeypatch.chdir(tmp_path)
    argv = ["sample", "base", "sampling.num_steps=1", "--out", "out"]
    assert main([*argv, "--prompt", "a"]) == 0
    assert json.loads((tmp_path / "out" / MARKER).read_text()) == {"command": "sample"}
    assert main([*argv, "--prompt", "b"]) == 0  # its own output: written again
    assert (tmp_path / "out" / "prompts.txt").read_text() == "b\n"
    assert main(["eval", "base", "--out", "out"]) == BAD  # another command's output
    assert "holds the output of `diffrl sample`" in capsys.readouterr().err


# ---- a plugin that changes the working directory mid-run moves no output -------------------------

CHDIR_TO = "DIFFRL_TEST_CHDIR_TO"


class ChdirTracker:
    """A logger plugin that changes the working directory once the run has started."""

    def __init__(self, run):
        self.run = run

    def log_metadata(self, config, text):
        os.chdir(os.environ[CHDIR_TO])

    def log_scalars(self, step, metrics):
        pass

    def log_image(self, step, name, image_path):
        pass

    def close(self, ok):
        pass


def test_a_plugins_chdir_does_not_split_the_run_folder(tmp_path, monkeypatch):
    """``runs/<name>`` is made absolute when the run starts: the checkpoint and the report a run
    writes after a plugin's ``os.chdir`` land beside its config.yaml, not under the new directory."""
    from diffrl.cli import main

    (tmp_path / "work").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.setenv(CHDIR_TO, str(tmp_path / "elsewhere"))
    monkeypatch.chdir(tmp_path / "work")
    tracker = f"{__name__}:ChdirTracker"
    settings = [
        "train.batch_size=2",
        "train.micro_batch_size=2",
        "data.dataset_size=4",
        f"run.loggers=[jsonl, {tracker}]",
    ]
    assert main(["train", SFT, "run.name=moved", *QUICK, *settings]) == 0
    run = tmp_path / "work" / "runs" / "moved"
    assert (run / "checkpoints" / "final" / "checkpoint.json").is_file()
    assert (run / "report.html").is_file() and (run / "config.yaml").is_file()
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_a_run_folder_is_absolute_from_the_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = RunFolder(Path("runs") / "x")
    monkeypatch.chdir("/")
    assert folder.path == tmp_path / "runs" / "x" and folder.metrics_file.is_absolute()


def test_encode_once_writes_into_runs_name_without_an_output_dir(tmp_path, monkeypatch):
    """The prompt cache goes into the run folder ``runs/<run.name>`` (was: exit 70, a TypeError on
    ``run.output_dir`` unset)."""
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.sampling.prompt_cache import CACHE_FILE, encode_once

    (tmp_path / "p.txt").write_text('the text "A"\n')
    prompts = [
        f"data.prompts={tmp_path / 'p.txt'}",
        f"eval.prompts={tmp_path / 'p.txt'}",
        "eval.num_prompts=1",
    ]
    config = load_config(
        str(ROOT / "recipes" / "tiny_nft_ocr.yaml"),
        ["model.path=random", "model.encode_once=true", "run.name=cached", *prompts],
    )
    monkeypatch.chdir(tmp_path)
    assert encode_once(load_family(config), config).encoded
    assert (tmp_path / "runs" / "cached" / CACHE_FILE).is_file()
