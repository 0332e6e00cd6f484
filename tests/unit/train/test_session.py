"""The train session, a run's life in its output folder: whatever fails, the runner and the loggers
close (the trackers told the run failed) and the lock is released; a fresh run that did not start
forgets its id, one that did keeps it and writes no report."""

from __future__ import annotations

import pytest

from diffrl.launch import runner_class
from diffrl.preflight import load_config
from diffrl.train.run_folder import RunFolder
from diffrl.train.runner import LocalRunner
from diffrl.train.session import TrainSession
from tests.conftest import tiny_overrides
from tests.unit.logging.test_trackers import RECORDING, Recording


class Unloadable(LocalRunner):
    """A runner whose model cannot load."""

    def __init__(self, config, algorithm, spec):
        raise OSError("model weights not found")


class Closing(LocalRunner):
    """The local runner, noting that it closed."""

    closed: list[str] = []

    def close(self) -> None:
        super().close()
        Closing.closed.append("closed")


class FailingToClose(LocalRunner):
    def close(self) -> None:
        super().close()
        raise RuntimeError("a reward pool would not stop")


def _config(tmp_path, runner: str):
    extra = {
        "runner": f"tests.unit.train.test_session:{runner}",
        "run.loggers": f"[jsonl, {RECORDING}]",
        "eval.enabled": "false",
        "data.dataset_size": 4,
        "model.options.train_text_encoder": "false",  # a runner of ours is not "local"
    }
    return load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **extra))


def _lock_is_free(folder: RunFolder) -> bool:
    folder.acquire()  # raises while another holder keeps it
    folder.release()
    return True


def test_a_fresh_run_whose_model_fails_to_load_closes_its_loggers_and_leaves_the_folder_as_it_was(tmp_path):
    Recording.started.clear()
    config = _config(tmp_path, "Unloadable")
    with pytest.raises(OSError, match="model weights not found"):
        with TrainSession(config, runner_class(config)):
            pytest.fail("the session opened without a runner")
    [tracker] = Recording.started
    assert tracker.closed == "failed"
    folder = RunFolder(config.run.resolved_output_dir())
    assert not folder.holds_run() and folder.run_id() is None  # the same command trains here once fixed
    assert _lock_is_free(folder)


def test_a_run_that_fails_while_it_iterates_closes_everything_and_keeps_its_id(tmp_path):
    Recording.started.clear()
    Closing.closed.clear()
    config = _config(tmp_path, "Closing")
    with pytest.raises(RuntimeError, match="an iteration failed"):
        with TrainSession(config, runner_class(config)) as session:
            session.logger.log(1, {"train/loss": 0.5})  # what an iteration leaves in the folder
            raise RuntimeError("an iteration failed")
    assert Closing.closed == ["closed"]
    [tracker] = Recording.started
    assert tracker.closed == "failed"
    folder = RunFolder(session.out)
    assert folder.holds_run() and folder.run_id() == session.run_id  # resume=latest continues it
    assert not (session.out / "report.html").exists()  # a failed run writes no pictures
    assert _lock_is_free(folder)


def test_the_loggers_close_and_the_lock_is_released_when_the_runner_fails_to_close(tmp_path):
    Recording.started.clear()
    config = _config(tmp_path, "FailingToClose")
    with pytest.raises(RuntimeError, match="a reward pool would not stop"):
        with TrainSession(config, runner_class(config)):
            pass
    [tracker] = Recording.started
    assert tracker.closed == "ok"  # the run itself ended well
    assert _lock_is_free(RunFolder(config.run.resolved_output_dir()))


def test_a_run_that_ends_well_writes_its_report_and_says_so_once(tmp_path, capsys):
    config = _config(tmp_path, "Closing")
    with TrainSession(config, runner_class(config)) as session:
        session.logger.log(1, {"train/loss": 0.5})
    out = capsys.readouterr().out
    assert out.count("report: ") == 1, out
    assert f"report: {session.out / 'report.html'}" in out and (session.out / "report.html").is_file()


def test_pictures_that_cannot_be_written_are_a_warning_naming_diffrl_report(tmp_path):
    Recording.started.clear()
    config = _config(tmp_path, "Closing")
    out = config.run.resolved_output_dir()
    with pytest.warns(UserWarning, match=r"could not write the run's pictures .* `diffrl report .*`"):
        with TrainSession(config, runner_class(config)) as session:
            session.logger.log(1, {"train/loss": 0.5})
            # the page cannot be written where a folder is (one made while the run ran: a run
            # refuses to start on a folder there)
            (out / "report.html").mkdir()
    [tracker] = Recording.started
    assert tracker.closed == "ok"  # the run itself ended well: its checkpoint and metrics stand
    (out / "report.html").rmdir()  # (a run, or this check's acquire, refuses a folder there)
    assert _lock_is_free(RunFolder(out))
