"""SFT end to end on a random tiny model, then ``eval`` and ``sample`` on its checkpoint."""

import json

import pytest
import torch
from PIL import Image

from diffrl.cli import main
from diffrl.cli.inference import load_for_inference, load_target
from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sft_two_iterations_then_eval_and_sample(tmp_path, capsys, lora):
    extra = {"model.lora": "{rank: 4}", "model.options": "{}", "train.ema_decay": 0.9} if lora else {}
    cfg = load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **extra))
    result = train(cfg)

    assert [h["step"] for h in result.history] == [1, 2]
    assert all(h["train/skipped_nonfinite"] == 0 for h in result.history)
    assert [e["step"] for e in result.evals] == [0, 2]
    rows = [json.loads(line) for line in (result.output_dir / "metrics.jsonl").read_text().splitlines()]
    assert any("train/loss" in r for r in rows) and any("eval/ocr_mean" in r for r in rows)
    assert (result.output_dir / "eval" / "step_00002.png").is_file()
    # the run in pictures: step 0 beside step 2, the training curves, one page holding them
    assert (
        Image.open(result.output_dir / "eval" / "compare.png").width
        > Image.open(result.output_dir / "eval" / "step_00002.png").width
    )
    assert (result.output_dir / "metrics.png").is_file()
    assert "data:image/png;base64," in (result.output_dir / "report.html").read_text()
    info = json.loads((result.checkpoint / "checkpoint.json").read_text())
    assert info["family"] == "tiny" and (info["lora"] is not None) == lora

    capsys.readouterr()
    out = tmp_path / "eval"
    assert main(["eval", str(result.checkpoint), "--num-prompts", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "ocr: mean" in printed and "mean reward:" in printed
    assert Image.open(out / "grid.png").size[0] > 0

    # paired comparison (a reward that varies from sample to sample): a model against itself gives
    # exactly the same scores, sample by sample; against the shipped base, a difference
    brightness = "eval.rewards=[{name: tests.rewards:brightness}]"
    args = ["eval", str(result.checkpoint), brightness, "--num-prompts", "2", "--samples-per-prompt", "2"]
    assert main([*args, "--baseline", str(result.checkpoint), "--out", str(out)]) == 0
    assert "difference +0.0000 +- 0.0000" in capsys.readouterr().out
    scores = json.loads((out / "scores.json").read_text())
    assert len(scores["reward"]) == 4 and len(set(scores["reward"])) == 4
    assert scores["reward"] == scores["baseline_reward"]
    assert main([*args, "--baseline", "base", "--out", str(out)]) == 0
    assert "baseline base: mean reward" in capsys.readouterr().out
    scores = json.loads((out / "scores.json").read_text())
    assert scores["reward"] != scores["baseline_reward"]

    samples = tmp_path / "samples"
    assert (
        main(
            [
                "sample",
                str(result.checkpoint),
                "--prompt",
                'the text "AB3"',
                "--prompt",
                'the number "42"',
                "--out",
                str(samples),
            ]
        )
        == 0
    )
    assert Image.open(samples / "0001.png").size == (64, 32)
    assert (samples / "prompts.txt").read_text().splitlines() == ['the text "AB3"', 'the number "42"']

    # export writes a diffusers-layout model (LoRA merged) with the checkpoint's velocity
    exported = tmp_path / "exported"
    assert main(["export", str(result.checkpoint), str(exported)]) == 0
    config, ckpt = load_target(str(result.checkpoint), [])
    trained = load_for_inference(config, ckpt)
    plain = load_for_inference(*load_target(str(exported), []))
    x, s = torch.randn(2, 3, 32, 64), torch.tensor([0.9, 0.4])
    cond = trained.encode_prompts(['the text "AB3"', ""])
    with torch.no_grad():
        torch.testing.assert_close(
            plain.velocity(x, s, cond), trained.velocity(x, s, cond), atol=1e-5, rtol=1e-4
        )

    if lora:  # a checkpoint given to another family is refused with a clear error
        code = main(
            [
                "eval",
                str(result.checkpoint),
                "model.family=tests.unit.train.test_checkpoint:OtherFamily",
            ]
        )
        assert code == 2
        assert "trained on the 'tiny' family" in capsys.readouterr().err


def test_cli_reports_bad_input_clearly(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["train", "recipes/tiny_sft.yaml", "train.lerning_rate=1", "train.batch_size=3"]) == 2
    err = capsys.readouterr().err
    assert "unknown key 'train.lerning_rate'" in err and "multiple of train.micro_batch_size" in err


def test_recipes_command_lists_each_with_a_line(capsys):
    assert main(["recipes"]) == 0
    assert "tiny_sft.yaml" in capsys.readouterr().out


def test_time_budget_stops_early_then_evaluates_and_saves(tmp_path):
    cfg = load_config(
        "recipes/tiny_sft.yaml",
        tiny_overrides(tmp_path, **{"train.iterations": 50, "train.time_budget_minutes": 1e-6}),
    )
    result = train(cfg)
    assert [h["step"] for h in result.history] == [1]
    assert [e["step"] for e in result.evals] == [0, 1]
    assert result.evals[-1]["train_time_s"] > 0
    assert json.loads((result.checkpoint / "checkpoint.json").read_text())["iteration"] == 1
