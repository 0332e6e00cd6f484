"""``train.keep_best`` end to end on the tiny model: ``checkpoints/best`` holds the iteration the
record names, a resumed run keeps the same record and the same best checkpoint as the whole run,
and ``diffrl eval`` / ``diffrl export`` take ``RUN_DIR/best``."""

import json

import pytest
import torch
from safetensors.torch import load_file

from diffrl.cli import main
from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.train.checkpoint import iteration_of
from tests.conftest import tiny_overrides
from tests.integration.test_watch import ROOT, TINY

KEEP = {
    **TINY,
    "train.iterations": 2,
    "train.save_every": 1,
    "train.eval_every": 0,
    "train.keep_best": "{every: 1}",
    "eval.num_prompts": 2,
}


def _run(tmp_path, name, **extra):
    overrides = tiny_overrides(tmp_path / name, **{**KEEP, **extra})
    return train(load_config(f"{ROOT}/recipes/tiny_grpo_ocr_small.yaml", overrides))


def _record(checkpoint):
    return json.loads((checkpoint / "checkpoint.json").read_text())["loop"]["best"]


def test_the_best_checkpoint_moves_on_paired_wins_resumes_exactly_and_evaluates(tmp_path, capsys):
    whole = _run(tmp_path, "whole")
    # keep_best every 1 evaluates every iteration though eval_every is 0
    assert [e["step"] for e in whole.evals] == [0, 1, 2]
    best = whole.output_dir / "checkpoints" / "best"
    record = _record(whole.checkpoint)
    assert record["saved"] and iteration_of(best) == record["iteration"] >= 1
    assert _record(best)["iteration"] == record["iteration"]
    # the record's rule, from the logged comparisons: each move beat the best before it by > SE
    moves = [e for e in whole.evals if e.get("keep_best/iteration") == e["step"] and e["step"] > 0]
    assert moves and all(e["keep_best/gain"] > e["keep_best/gain_se"] for e in moves)
    assert moves[-1]["step"] == record["iteration"]
    stays = [e for e in whole.evals if "keep_best/gain" in e and e not in moves]
    assert all(e["keep_best/gain"] <= e["keep_best/gain_se"] for e in stays)

    half = whole.output_dir / "checkpoints" / "step_00001"  # the resumed run trains iteration 2
    resumed = _run(tmp_path, "resumed", **{"train.resume": str(half)})
    assert _record(resumed.checkpoint) == record
    again = resumed.output_dir / "checkpoints" / "best"
    if record["iteration"] > 1:  # moved after the resume: written by the resumed run, bit for bit
        a, b = load_file(str(best / "trainable.safetensors")), load_file(str(again / "trainable.safetensors"))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    capsys.readouterr()
    out = tmp_path / "eval_out"
    watch = "eval.watch=[{name: tests.integration.test_watch:darkness}]"  # eval scores held-out judges too
    code = main(["eval", str(whole.output_dir / "best"), "--out", str(out), "--trust-checkpoint-code", watch])
    scores = json.loads((out / "scores.json").read_text())
    assert code == 0 and "watched tests.integration.test_watch:darkness: mean" in capsys.readouterr().out
    darkness = scores["watch"]["tests.integration.test_watch:darkness"]
    assert darkness == [pytest.approx(1 - r, abs=1e-6) for r in scores["reward"]]  # 1 - brightness
    assert main(["export", str(whole.output_dir / "best"), str(tmp_path / "exported")]) == 0
    assert any((tmp_path / "exported").iterdir())
