"""``run.loggers``: a tiny SFT run logs every metric of ``metrics.jsonl`` to TensorBoard at the same
step, its eval grids as images, its config and batch arithmetic as text, and W&B (offline) writes
its run folder; a resumed run's TensorBoard shows no step twice."""

import json
import math

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from tensorboard.backend.event_processing import event_accumulator as ea

from diffrl.launch import train
from diffrl.logging.wandb import wandb_id
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides

SMALL = {"train.batch_size": 2, "train.micro_batch_size": 2, "eval.num_prompts": 2}


def _events(run_dir) -> ea.EventAccumulator:
    sizes = {ea.SCALARS: 0, ea.IMAGES: 0, ea.TENSORS: 0}
    return ea.EventAccumulator(str(run_dir / "tensorboard"), size_guidance=sizes).Reload()


def _rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _timeless(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "time" and not k.startswith("perf/")}


def _assert_scalars_match(acc: ea.EventAccumulator, rows: list[dict]) -> None:
    """Every metric of every row is the event at the same step (float32), and nothing else is."""
    logged = {(row["step"], k) for row in rows for k in row if k not in ("step", "time")}
    tags = acc.Tags()["scalars"]
    assert set(tags) == {k for _, k in logged}
    events = {}
    for tag in tags:
        steps = [e.step for e in acc.Scalars(tag)]
        assert len(steps) == len(set(steps)), f"{tag}: a step shows twice: {steps}"
        events.update({(e.step, tag): e.value for e in acc.Scalars(tag)})
    assert events.keys() == logged
    for row in rows:
        for k, v in row.items():
            if k in ("step", "time"):
                continue
            got, want = events[row["step"], k], float(np.float32(v))
            assert (math.isnan(got) and math.isnan(want)) or got == pytest.approx(want, rel=1e-6), (
                k,
                row["step"],
            )


def test_every_metric_reaches_tensorboard_and_wandb_writes_its_offline_run(tmp_path, monkeypatch):
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(name, value)
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb_home" / name.lower()))
    loggers = {"run.loggers": "[jsonl, tensorboard, wandb]"}
    result = train(load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **SMALL, **loggers)))
    out = result.output_dir

    acc = _events(out)
    rows = _rows(out)
    assert {"train/loss", "eval/ocr_mean", "perf/iteration_time"} <= {k for r in rows for k in r}
    _assert_scalars_match(acc, rows)
    grids = acc.Images("eval/grid")
    assert [g.step for g in grids] == [e["step"] for e in result.evals] == [0, 2]
    for g in grids:
        png = Image.open(out / "eval" / f"step_{g.step:05d}.png")
        assert (g.width, g.height) == png.size
    [config_text] = acc.Tensors("config/text_summary")
    assert "tensorboard" in config_text.tensor_proto.string_val[0].decode()  # the resolved run.loggers
    [arithmetic] = acc.Tensors("batch_arithmetic/text_summary")
    assert "batch arithmetic" in arithmetic.tensor_proto.string_val[0].decode()

    run_id = json.loads((out / "run.json").read_text())["run_id"]
    [wandb_run] = (out / "wandb").glob("offline-run-*")
    assert (wandb_run / f"run-{wandb_id(run_id)}.wandb").is_file()

    # the trackers only watch: the same run without them trains to the same bits
    plain = train(load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path / "plain", **SMALL)))
    assert [_timeless(r) for r in _rows(plain.output_dir)] == [_timeless(r) for r in rows]
    for name in ("trainable.safetensors", "optimizer.safetensors"):
        want, got = (load_file(str(r.checkpoint / name)) for r in (plain, result))
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want), name


def test_a_resumed_run_shows_each_step_once_in_tensorboard(tmp_path):
    extra = {**SMALL, "run.loggers": "[tensorboard]", "train.iterations": 3, "train.save_every": 1}
    extra["eval.enabled"] = "false"
    first = train(load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **extra)))
    assert [e.step for e in _events(first.output_dir).Scalars("train/loss")] == [1, 2, 3]
    # resumed from an earlier checkpoint: steps 2 and 3 again, logged by the second process
    earlier = first.output_dir / "checkpoints" / "step_00001"
    resumed = train(
        load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **extra, **{"train.resume": earlier}))
    )
    assert [h["step"] for h in resumed.history] == [2, 3]
    acc = _events(resumed.output_dir)
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2, 3]
    _assert_scalars_match(acc, _rows(resumed.output_dir))
