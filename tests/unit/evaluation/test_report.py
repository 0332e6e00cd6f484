"""The end-of-run pictures (first-vs-last grids, training curves) and the one-page report."""

import json
import re

import numpy as np
import torch
from PIL import Image

from diffrl.cli import main
from diffrl.core.errors import EXIT_USER_ERROR
from diffrl.evaluation.evaluate import EvalResult, eval_grid_path, eval_table, save_grid
from diffrl.evaluation.report import (
    STYLE,
    compose_side_by_side,
    metric_panels,
    plot_metrics,
    read_metrics,
    save_compare,
    write_report,
)

EVALS = [
    {"step": 0, "train_time_s": 0.0, "eval/reward_mean": 0.25},
    {"step": 4, "train_time_s": 60.0, "eval/reward_mean": 0.75},
]


def _grid(run, step, value):
    save_grid(torch.full((2, 3, 8, 16), value), eval_grid_path(run, step), captions=["a", "b"])


def test_compare_sets_the_two_grids_side_by_side_under_their_labels(tmp_path):
    left, right = tmp_path / "l.png", tmp_path / "r.png"
    Image.new("RGB", (40, 20), (0, 0, 0)).save(left)
    Image.new("RGB", (30, 20), (255, 0, 0)).save(right)
    out = np.asarray(Image.open(compose_side_by_side(left, right, ("step 0", "step 9"), tmp_path / "c.png")))
    header = out.shape[0] - 20
    assert header > 0 and out.shape[1] > 70
    assert (out[header:, :40] == 0).all()  # the left image under the header
    assert (out[header:, -30:] == [255, 0, 0]).all()  # the right one, at the right edge
    assert (out[:header].min(axis=-1) < 200).any()  # the labels


def test_compare_png_of_a_run_needs_two_evals_with_their_grids(tmp_path):
    run = tmp_path / "run"
    _grid(run, 0, 0.0)
    assert save_compare(run, EVALS[:1]) is None  # one eval: nothing to compare
    assert save_compare(run, EVALS) is None  # the last grid is missing
    assert not (run / "eval" / "compare.png").exists()
    _grid(run, 4, 1.0)
    path = save_compare(run, EVALS)
    grid = Image.open(eval_grid_path(run, 0))
    assert path == run / "eval" / "compare.png" and Image.open(path).width > 2 * grid.width


def test_panels_are_those_of_the_metrics_a_run_logged():
    sft = [
        {"step": 0, "eval/reward_mean": 0.1},
        {"step": 1, "train/loss": 0.5, "train/grad_norm": 1.0, "train/fm_loss": 0.5},
    ]
    assert [(p.title, p.keys) for p in metric_panels(sft)] == [
        ("reward", ("eval/reward_mean",)),
        ("loss", ("train/loss",)),
        ("grad norm", ("train/grad_norm",)),
    ]
    grpo = [
        {"step": 1, "rollout/reward/raw_mean": 0.2, "train/approx_kl": 0.01, "train/kl_loss": 0.0},
        {
            "step": 2,
            "train/log_prob_mean_abs_diff": float("nan"),
            "train/approx_kl": 0.02,
            "train/kl_loss": 0.0,
        },
    ]
    # a KL term that stayed 0 (its coefficient off) and a metric never finite get no line
    assert [(p.title, p.keys) for p in metric_panels(grpo)] == [
        ("reward", ("rollout/reward/raw_mean",)),
        ("KL", ("train/approx_kl",)),
    ]


def test_metrics_png_from_a_metrics_file(tmp_path):
    rows = [{"step": s, "time": 0.0, "train/loss": 1 / s, "train/grad_norm": 0.1} for s in range(1, 6)]
    f = tmp_path / "metrics.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 6, "train/lo')  # cut by a crash
    assert read_metrics(f) == rows
    assert Image.open(plot_metrics(read_metrics(f), tmp_path / "metrics.png")).width > 0
    assert plot_metrics([{"step": 1, "perf/iteration_time": 1.0}], tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


def _run_folder(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "run:\n  name: demo\nmodel:\n  family: tiny\n  path: base\nalgorithm:\n  name: flow_grpo\n"
        "sampling:\n  negative_prompt: '<script>alert(1)</script> & co'\n"
    )
    rows = [
        {"step": 0, "eval/reward_mean": 0.25},
        *(
            {"step": s, "rollout/reward/raw_mean": s / 10, "train/loss": 1.0, "train/approx_kl": 0.01}
            for s in (1, 2, 3, 4)
        ),
        {"step": 4, "eval/reward_mean": 0.75},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_curve.json").write_text(json.dumps(EVALS))
    _grid(run, 0, 0.0)
    _grid(run, 4, 1.0)
    return run


def test_the_report_is_one_self_contained_page(tmp_path):
    run = _run_folder(tmp_path)
    page = write_report(run).read_text()
    assert (run / "report.html").is_file()
    assert (run / "metrics.png").is_file() and (run / "eval" / "compare.png").is_file()  # drawn first
    sources = re.findall(r'src="([^"]*)"', page)
    # metrics.png, eval_curve.png, compare.png and the two grids, each embedded
    assert len(sources) == 5 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert 'src="http' not in page and "<link" not in page and "<script" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; co" in page  # the config, escaped
    assert "<h1>demo</h1>" in page and "flow_grpo" in page and "tiny" in page
    for line in eval_table(EVALS).splitlines():  # the eval table
        assert line in page
    assert "<code>train/approx_kl</code></td><td class=num>0.0100</td><td class=num>4</td>" in page
    assert "step 4 · mean eval reward 0.750" in page


def test_report_cli_writes_the_page_and_refuses_a_folder_that_is_no_run(tmp_path, capsys):
    run = _run_folder(tmp_path)
    out = tmp_path / "pages" / "r.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert str(out) in capsys.readouterr().out and out.read_text().startswith("<!doctype html>")
    assert not (run / "report.html").exists()

    assert main(["report", str(tmp_path / "missing")]) == EXIT_USER_ERROR
    assert "no such folder" in capsys.readouterr().err
    assert main(["report", str(run / "eval")]) == EXIT_USER_ERROR  # a folder inside the run
    err = capsys.readouterr().err
    assert "not a diffrl run folder" in err and "Traceback" not in err
    assert main(["report", str(run), "--out", str(tmp_path)]) == EXIT_USER_ERROR
    assert "is a folder" in capsys.readouterr().err


def test_a_run_without_evals_or_metrics_yet_still_gets_a_page(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("run:\n  name: fresh\n")
    page = write_report(run).read_text()
    assert "no eval yet" in page and "no metrics logged yet" in page and "data:image" not in page


def test_compare_goes_one_above_the_other_when_side_by_side_is_wider_than_a_page(tmp_path):
    left, right = tmp_path / "l.png", tmp_path / "r.png"
    Image.new("RGB", (40, 20), (0, 0, 0)).save(left)
    Image.new("RGB", (30, 20), (255, 0, 0)).save(right)
    out = np.asarray(
        Image.open(compose_side_by_side(left, right, ("a", "b"), tmp_path / "c.png", max_width=60))
    )
    assert out.shape[1] == 40 and out.shape[0] > 2 * 20  # as wide as the wider image, both stacked
    assert (out[-20:, :30] == [255, 0, 0]).all()  # the second image at the bottom
    top = next(y for y in range(out.shape[0]) if (out[y, :40] == 0).all())  # the first image's top row
    assert (out[top : top + 20, :40] == 0).all() and top + 20 < out.shape[0] - 20


def test_the_report_fits_a_laptop_page_and_says_how_many_samples_each_grid_shows(tmp_path):
    run = _run_folder(tmp_path)
    for step in (0, 4):  # the grids as an eval writes them: 1 of the 2 samples drawn
        result = EvalResult(["a", "b"], torch.full((2, 3, 8, 16), 0.5), seed=5, index=[0, 1], source="p.txt")
        result.save_grid(eval_grid_path(run, step), 1)
    page = write_report(run).read_text()
    # every image at most the page's width: no image wider than the page, nothing to scroll sideways
    assert "img { max-width: 100%; height: auto; }" in STYLE and "max-width: none" not in page
    assert page.count("· 1 of 2 samples shown</figcaption>") == 2  # beside each grid
    assert "<code>diffrl sample CHECKPOINT --prompts p.txt --num-prompts i+1" in page  # how to redraw a tile
