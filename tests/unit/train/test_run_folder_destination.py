"""Where a run may write (issue 36, class 7) and what its metrics keep on resume (class 8): a new,
empty or diffrl folder only; one process per folder, also when two start into a new folder at
once; one metrics row per (kind, step)."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path

import pytest

from diffrl.preflight import load_config
from diffrl.train.run_folder import NO_RUN, RunFolder, RunFolderError


@pytest.mark.parametrize(
    "files",
    [
        {},
        {".lock": "123\n"},
        {"run.json": json.dumps(NO_RUN), "config.yaml": "run: {}\n"},  # a fresh run that failed to start
        {"run.json": '{"run_id": "r1"}', "config.yaml": "x", "report.html": "x"},  # a run's own files
        {"metrics.jsonl": "", "config.yaml": "x"},  # an older diffrl's failed start
    ],
    ids=["empty", "lock-only", "never-started", "a-run", "metrics-only"],
)
def test_a_run_may_write_into_an_empty_or_a_diffrl_folder(tmp_path, files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    RunFolder(tmp_path).check_destination()


@pytest.mark.parametrize(
    "files, shown",
    [
        ({"config.yaml": "mine", "report.html": "mine"}, "('config.yaml', 'report.html')"),
        ({"notes.txt": "x", ".lock": ""}, "('notes.txt')"),
        ({f"f{i}": "x" for i in range(5)}, "('f0', 'f1', 'f2' ...)"),
        ({"run.json/": ""}, None),  # a folder named run.json is a run folder's marker: allowed
    ],
    ids=["config-and-report", "notes", "many", "run-json-folder"],
)
def test_a_folder_of_other_files_is_refused_and_left_alone(tmp_path, files, shown):
    for name, text in files.items():
        if name.endswith("/"):
            (tmp_path / name).mkdir()
        else:
            (tmp_path / name).write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    folder = RunFolder(tmp_path)
    if shown is None:
        folder.acquire()
        folder.release()
        return
    with pytest.raises(RunFolderError, match="holds files that are not a diffrl run's"):
        folder.acquire()
    assert shown in str(pytest.raises(RunFolderError, folder.check_destination).value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # not even a lock file added


@pytest.mark.parametrize(
    "where, message",
    [
        ("model/run", "lies inside the model folder (model.path)"),
        ("model", "is the model folder (model.path)"),
        ("ckpt/run", "lies inside the checkpoint train.resume names"),
        ("other/checkpoints/final/x", "lies inside the checkpoint folder"),
    ],
)
def test_a_run_is_refused_inside_its_inputs_and_any_checkpoint(tmp_path, where, message):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "model_index.json").write_text("{}")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "checkpoint.json").write_text("{}")
    (tmp_path / "other" / "checkpoints" / "final").mkdir(parents=True)
    (tmp_path / "other" / "run.json").write_text('{"run_id": "r"}')
    config = load_config(
        {"model": {"path": str(tmp_path / "model")}, "train": {"resume": str(tmp_path / "ckpt")}},
        check_files=False,
    )
    with pytest.raises(RunFolderError, match=re.escape(message)):
        RunFolder(tmp_path / where).check_destination(config)
    assert not (tmp_path / where / ".lock").exists()


def _race(path: str, barrier, results) -> None:
    folder = RunFolder(Path(path))
    barrier.wait()
    try:
        folder.acquire()
        results.put("acquired")
        barrier.wait()  # hold the lock until both have tried
    except RunFolderError:
        results.put("refused")
        barrier.wait()


def test_two_processes_starting_into_one_new_folder_at_once_one_is_refused(tmp_path):
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [
        ctx.Process(target=_race, args=(str(tmp_path / "new" / "run"), barrier, results)) for _ in range(2)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert sorted(results.get(timeout=5) for _ in procs) == ["acquired", "refused"]


def test_metric_rows_stay_unique_by_kind_and_step_on_resume(tmp_path):
    folder = RunFolder(tmp_path)
    rows = [
        {"step": 0, "eval/reward_mean": 0.1},
        {"step": 1, "train/loss": 1.0},
        {"step": 1, "train/loss": 1.0},  # logged twice by an older diffrl
        {"step": 1, "eval/reward_mean": 0.2},
        {"step": 2, "train/loss": 0.9},
        {"step": 2, "eval/reward_mean": 0.3},  # logged after the checkpoint of step 2 was saved
        {"step": 3, "train/loss": 0.8},
    ]
    folder.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    # the checkpoint of step 2 lacks its eval: the resumed run evaluates step 2 again
    assert folder.keep_metrics_up_to(2, evaluated=False) == 3
    kept = [json.loads(line) for line in folder.metrics_file.read_text().splitlines()]
    assert [(r["step"], next(iter(set(r) - {"step"}))) for r in kept] == [
        (0, "eval/reward_mean"),
        (1, "train/loss"),
        (1, "eval/reward_mean"),
        (2, "train/loss"),
    ]
