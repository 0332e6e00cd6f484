"""The run folder: one process per folder, a folder holding a run needs resume or a new name,
resume=latest refuses when no checkpoint verifies, metrics past the checkpoint are dropped."""

from __future__ import annotations

import json

import pytest

from diffrl.preflight import load_config
from diffrl.train.checkpoint import CheckpointError, save_checkpoint
from diffrl.train.run_folder import RunFolder, RunFolderError


def test_latest_refuses_when_no_checkpoint_verifies(tmp_path, actor):
    out = tmp_path / "run"
    ckpt = save_checkpoint(
        out / "checkpoints" / "step_00002", actor, actor.config, 2, run_id="r1", loop_state={"evals": []}
    )
    weights = ckpt / "trainable.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated: it no longer verifies
    config = load_config({"run": {"output_dir": str(out)}, "train": {"resume": "latest", "iterations": 9}})
    with (
        pytest.raises(CheckpointError, match="no checkpoint in .* verifies"),
        pytest.warns(UserWarning, match="train.resume=latest skips checkpoint .*step_00002"),
    ):
        RunFolder(out).resume_point(config)


def test_a_second_process_on_the_folder_is_refused_with_the_pid(tmp_path):
    first, second = RunFolder(tmp_path / "run"), RunFolder(tmp_path / "run")
    first.acquire()
    try:
        # flock locks belong to the open file: a second open is refused even in this process
        with pytest.raises(RunFolderError, match=r"in use by another diffrl process \(PID \d+\)"):
            second.acquire()
    finally:
        first.release()
    second.acquire()  # free again once the holder lets go (or dies)
    second.release()


def test_a_folder_holding_a_run_needs_resume_or_a_new_name(tmp_path):
    folder = RunFolder(tmp_path / "run")
    folder.acquire()
    (folder.path / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    config = load_config({"run": {"output_dir": str(folder.path)}})
    with pytest.raises(
        RunFolderError, match="train.resume=latest, or start a new one elsewhere with run.name"
    ):
        folder.claim(config, None)
    folder.release()


def test_metrics_after_the_checkpoint_are_dropped_on_resume(tmp_path):
    folder = RunFolder(tmp_path)
    rows = [{"step": 0, "eval/reward_mean": 0.1}, *({"step": s, "train/loss": s} for s in (1, 2, 3))]
    rows.insert(3, {"step": 2, "eval/reward_mean": 0.2})  # the eval at step 2, after its iteration
    folder.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "v"')
    assert folder.keep_metrics_up_to(2) == 2  # step 3 and the torn line
    kept = [json.loads(line)["step"] for line in folder.metrics_file.read_text().splitlines()]
    assert kept == [0, 1, 2, 2]
