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


def test_latest_with_no_checkpoint_sets_the_earlier_rows_aside_and_starts_fresh(tmp_path, capsys):
    """A folder whose ``checkpoints/`` was removed (or whose run died before its first save): the
    fresh start keeps what the earlier attempt logged, under a name of its own, and says so."""
    out = tmp_path / "run"
    out.mkdir()
    rows = "".join(json.dumps({"step": s, "train/loss": 1.0 / (s + 1)}) + "\n" for s in range(1, 6))
    (out / "metrics.jsonl").write_text(rows)
    (out / "run.json").write_text('{"run_id": "old"}')
    (out / "metrics.earlier-1.jsonl").write_text("an even earlier attempt\n")  # taken: the next number
    config = load_config({"run": {"output_dir": str(out)}, "train": {"resume": "latest", "iterations": 9}})
    folder = RunFolder(out)
    resume_from, info, run_id = folder.begin(config)
    assert (resume_from, info) == (None, None) and run_id != "old" and folder.run_id() == run_id
    assert (out / "metrics.earlier-2.jsonl").read_text() == rows
    assert (out / "metrics.earlier-1.jsonl").read_text() == "an even earlier attempt\n"
    assert not (out / "metrics.jsonl").exists()
    printed = capsys.readouterr().out
    assert (
        "starting a fresh run" in printed
        and "5 metric row(s)" in printed
        and "metrics.earlier-2.jsonl" in printed
    )


def _own_checkpoint(out, actor, run_id="r1"):
    save_checkpoint(
        out / "checkpoints" / "step_00002", actor, actor.config, 2, run_id=run_id, loop_state={"evals": []}
    )
    (out / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0}) + "\n")
    return _actors_config(out, "latest")


def _actors_config(out, resume):
    """The ``actor`` fixture's settings (what its checkpoints were trained with), resuming ``resume``."""
    return load_config(
        {
            "run": {"output_dir": str(out)},
            "model": {"path": "random", "lora": {"rank": 2}},
            "train": {"ema_decay": 0.9, "resume": resume, "iterations": 9},
        }
    )


def test_a_missing_run_json_is_restored_from_the_folders_own_checkpoint(tmp_path, actor, capsys):
    out = tmp_path / "run"
    config = _own_checkpoint(out, actor)
    folder = RunFolder(out)
    resume_from, info, run_id = folder.begin(config)
    assert resume_from == out / "checkpoints" / "step_00002" and run_id == "r1" == folder.run_id()
    assert (
        "run.json is missing: this folder's run id is taken from the checkpoint resumed"
        in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "run_json", ["not json", '{"run_id": 7}', None], ids=["garbage", "no-id", "other-ckpt"]
)
def test_a_run_json_that_cannot_match_the_checkpoint_is_refused_naming_it(tmp_path, actor, run_json):
    out = tmp_path / "run"
    config = _own_checkpoint(out, actor)
    if run_json is None:  # run.json gone, and the checkpoint resumed is another folder's
        other = tmp_path / "other"
        save_checkpoint(other / "ckpt", actor, actor.config, 2, run_id="r2", loop_state={"evals": []})
        config = _actors_config(out, str(other / "ckpt"))
        why = "is missing"
    else:
        (out / "run.json").write_text(run_json)
        why = "holds no run id diffrl wrote"
    with pytest.raises(RunFolderError, match=f"its run.json {why}, so the checkpoint .* cannot be matched"):
        RunFolder(out).begin(config)
    assert (out / "metrics.jsonl").read_text()  # nothing dropped
