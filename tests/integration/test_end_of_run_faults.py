"""Faults at the end of a run (issue 36, class 8): every phase of a run can be resumed, metric rows
stay unique by (kind, step) whatever stops the run, and a full disk while saving is a clear error
that leaves the checkpoints before it intact.

The kill test is a chain of real processes (``crash_driver``: SIGTERM during an iteration, SIGKILL
right after the resumed run's start-up eval, SIGKILL as the report starts), each resumed with
``train.resume=latest``, on the tiny recipe's 2 iterations."""

from __future__ import annotations

import errno
import json
import os
import signal
from collections import Counter
from pathlib import Path

import pytest
from safetensors import SafetensorError

from diffrl.core.errors import EXIT_USER_ERROR
from diffrl.train.manifest import verify_checkpoint
from diffrl.train.run_folder import row_kind
from tests.conftest import ROOT, TINY_RUN
from tests.integration.crash_driver import run_forked

BRIGHTNESS = "[{name: tests.rewards:brightness}]"
SETTINGS = {
    **TINY_RUN,
    "model.lora": "{rank: 4}",
    "train.iterations": 2,
    "train.save_every": 1,
    "train.eval_every": 1,
    "rewards": BRIGHTNESS,
    "eval.rewards": BRIGHTNESS,
    "eval.num_prompts": 2,
    "eval.batch_size": 2,
}


def _run(out: Path, mode: str, at: int, *extra: str):
    overrides = [f"{k}={v}" for k, v in {**SETTINGS, "run.output_dir": str(out)}.items()] + list(extra)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return run_forked([mode, str(at), "--", "recipes/tiny_nft_ocr.yaml", *overrides], ROOT, env, 600)


def _rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_stops_and_kills_at_the_end_of_a_run_resume_to_one_row_per_step_and_a_report(tmp_path):
    out = tmp_path / "run"
    # SIGTERM in the last iteration's optimizer step: saved at iteration 2, before its eval
    stopped = _run(out, "term-optimizer", 1)
    assert stopped.returncode == 75, stopped.stderr
    assert verify_checkpoint(out / "checkpoints" / "step_00002")["loop"]["evals"][-1]["step"] == 1
    # the resumed run evaluates step 2 at start-up, logs it, and is killed right after
    killed = _run(out, "kill-eval", 2, "train.resume=latest")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    # the next one finishes, saves `final`, and is killed as its report starts
    killed = _run(out, "kill-report", 0, "train.resume=latest")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert verify_checkpoint(out / "checkpoints" / "final")["loop"]["final"] is True
    assert not (out / "report.html").exists()
    rows = _rows(out)
    # a rerun writes what is left (no "nothing left to run"), and loads no model for it
    done = _run(out, "none", 0, "train.resume=latest")
    assert done.returncode == 0, done.stderr
    assert "this run finished" in done.stdout and "writing what it had left" in done.stdout
    assert (out / "report.html").is_file() and (out / "eval_curve.png").is_file()
    assert _rows(out) == rows  # nothing logged again
    keys = Counter((row_kind(r), r["step"]) for r in rows)
    assert keys == {("eval", 0): 1, ("train", 1): 1, ("eval", 1): 1, ("train", 2): 1, ("eval", 2): 1}
    curve = json.loads((out / "eval_curve.json").read_text())
    assert [e["step"] for e in curve] == [0, 1, 2]


STORAGE = [
    OSError(errno.ENOSPC, "No space left on device"),
    OSError(errno.EDQUOT, "Disk quota exceeded"),
    OSError(errno.EFBIG, "File too large"),
    OSError(errno.EROFS, "Read-only file system"),
    OSError(errno.EIO, "Input/output error"),
    SafetensorError(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
    ),
]


def test_a_full_disk_while_training_saves_is_a_clear_error(tmp_path, monkeypatch, capsys):
    """The issue's case: out of space inside safetensors' write of the final checkpoint -> exit 2,
    not 70, and the message says the checkpoint was not written and resuming is safe."""
    from diffrl.cli import main
    from diffrl.train import checkpoint

    def full(tensors, filename, metadata=None):
        raise STORAGE[-1]

    monkeypatch.setattr(checkpoint, "save_file", full)
    monkeypatch.chdir(ROOT)
    out = tmp_path / "run"
    argv = ["train", "recipes/tiny_sft.yaml", f"run.output_dir={out}", "model.path=random"]
    argv += ["train.iterations=1", "train.batch_size=2", "train.micro_batch_size=2", "eval.enabled=false"]
    code = main([*argv, "data.dataset_size=4"])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and "Traceback" not in err, err
    assert "No space left on device (errno ENOSPC); the checkpoint was not written" in err
    assert "resuming is safe" in err and "train.resume=latest" in err
    assert not list((out / "checkpoints").iterdir())  # no half-written folder left behind


def test_a_full_disk_while_exporting_is_a_clear_error(tmp_path, tiny_checkpoint, monkeypatch, capsys):
    from diffrl.cli import main
    from diffrl.models.tiny import TinyFamily

    def full(self, path, dtype=None):
        raise STORAGE[-1]

    monkeypatch.setattr(TinyFamily, "save_pretrained", full)
    code = main(["export", str(tiny_checkpoint), str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR and "Traceback" not in err, err
    assert f"could not write the export into {str(tmp_path / 'out')!r}: No space left on device" in err


@pytest.mark.parametrize("at", ["weights", "checkpoint.json"])
@pytest.mark.parametrize("error", STORAGE, ids=lambda e: getattr(e, "strerror", None) or "safetensors")
def test_a_storage_error_in_a_checkpoint_write_leaves_the_previous_one_intact(
    tmp_path, monkeypatch, error, at
):
    import torch

    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.train import checkpoint
    from diffrl.train.actor import Actor

    cfg = load_config({"model": {"path": "random", "lora": {"rank": 2}}})
    actor = Actor(load_family(cfg), cfg)
    path = tmp_path / "checkpoints" / "final"
    checkpoint.save_checkpoint(path, actor, cfg, 1, run_id="r1", loop_state={"evals": []})
    if at == "weights":

        def fail(tensors, filename, metadata=None):
            raise error

        monkeypatch.setattr(checkpoint, "save_file", fail)
    else:  # the last write: checkpoint.json's fsync
        real = os.fsync

        def fail(fd):
            if os.readlink(f"/proc/self/fd/{fd}").endswith("checkpoint.json"):
                raise error if isinstance(error, OSError) else OSError(errno.ENOSPC, "No space left")
            real(fd)

        monkeypatch.setattr(checkpoint.os, "fsync", fail)
    with torch.no_grad():
        actor.params[0].add_(1.0)
    with pytest.raises(
        checkpoint.CheckpointWriteError, match=r"the checkpoint was not written .* resuming is safe"
    ):
        checkpoint.save_checkpoint(path, actor, cfg, 2, run_id="r1", loop_state={"evals": []})
    assert verify_checkpoint(path)["iteration"] == 1  # the one before is whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["final"]  # no temporary folder left


def test_a_bug_in_a_checkpoint_write_is_not_called_a_full_disk(tmp_path, monkeypatch):
    from diffrl.models.registry import load_family
    from diffrl.preflight import load_config
    from diffrl.train import checkpoint
    from diffrl.train.actor import Actor

    def broken(tensors, filename, metadata=None):
        raise SafetensorError("You are trying to save a non contiguous tensor")

    cfg = load_config({"model": {"path": "random", "lora": {"rank": 2}}})
    actor = Actor(load_family(cfg), cfg)
    monkeypatch.setattr(checkpoint, "save_file", broken)
    with pytest.raises(SafetensorError):  # a bug stays a bug (exit 70), not a storage error
        checkpoint.save_checkpoint(tmp_path / "c", actor, cfg, 1, run_id="r1", loop_state={})
