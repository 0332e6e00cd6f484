"""``run.loggers`` (:mod:`diffrl.logging.trackers`): names checked before anything loads, a tracker
that cannot start is a clear error before any model loads, and every metric reaches each tracker."""

import importlib.util
import json
from pathlib import Path

import pytest

from diffrl import launch
from diffrl.config import ConfigError
from diffrl.logging import MetricsLogger, TrackerError, TrackerRun, start_trackers
from diffrl.preflight import load_config
from diffrl.train import loop
from tests.conftest import tiny_overrides


class Recording:
    """A tracker that keeps what it is given (reached as ``tests.unit.logging.test_trackers:Recording``)."""

    started: list["Recording"] = []

    def __init__(self, run: TrackerRun):
        self.run, self.calls, self.closed = run, [], None
        Recording.started.append(self)

    def log_scalars(self, step, metrics):
        self.calls.append(("scalars", step, metrics))

    def log_image(self, step, name, image_path):
        self.calls.append(("image", step, name, image_path))

    def log_metadata(self, config, text):
        self.calls.append(("metadata", config, text))

    def close(self, ok):
        self.closed = "ok" if ok else "failed"


class Refusing(Recording):  # a whole tracker (run.loggers checks its methods), whose start fails
    def __init__(self, run: TrackerRun):
        raise ConnectionError("api.wandb.ai unreachable")


RECORDING = "tests.unit.logging.test_trackers:Recording"
REFUSING = "tests.unit.logging.test_trackers:Refusing"


def test_an_unknown_logger_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError) as e:
        load_config({}, ["run.loggers=[jsonl, tensorbord]"])
    assert "run.loggers[1]: unknown logger 'tensorbord'. Did you mean 'tensorboard'?" in str(e.value)
    assert "Known: jsonl, tensorboard, wandb" in str(e.value)


def test_a_logger_whose_package_is_missing_is_refused_with_the_pip_command(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ConfigError) as e:
        load_config({}, ["run.loggers=[tensorboard, wandb]"])
    assert "run.loggers[1]: logger 'wandb' needs the wandb package: pip install 'diffrl[wandb]'" in str(
        e.value
    )
    assert "tensorboard" not in str(e.value)  # installed here
    # the commands that do not train log nowhere: no logger checks
    load_config({}, ["run.loggers=[wandb]"], sections=("run", "model", "sampling", "eval"))


def test_the_default_is_jsonl_and_a_users_tracker_class_validates():
    assert load_config({}).run.loggers == ["jsonl"]
    assert load_config({}, [f"run.loggers=[{RECORDING}]"]).run.loggers == [RECORDING]


def test_a_tracker_that_fails_to_start_is_a_clear_error_and_the_started_ones_close(tmp_path):
    Recording.started.clear()
    run = TrackerRun(tmp_path, "abc", "r", "diffrl")
    with pytest.raises(
        TrackerError, match=r"logger '.*Refusing' could not start: ConnectionError: api.wandb.ai"
    ):
        start_trackers(["jsonl", RECORDING, REFUSING], run)
    [recording] = Recording.started
    assert recording.closed == "failed"


def test_the_driver_starts_the_trackers_before_any_model_loads(tmp_path, monkeypatch):
    def no_runner(*args):
        raise AssertionError("the runner was built before the trackers started")

    config = load_config(
        "recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **{"run.loggers": f"[{REFUSING}]"})
    )
    with pytest.raises(TrackerError, match="Refusing' could not start"):
        loop.train(config, no_runner)  # the session builds the runner it is handed
    # the logger fixed: the same folder trains (nothing of the failed start holds it)
    fixed = load_config("recipes/tiny_sft.yaml", tiny_overrides(tmp_path, **{"train.iterations": 1}))
    assert launch.train(fixed).history[-1]["step"] == 1


def test_every_metric_image_and_the_metadata_reach_each_tracker(tmp_path, capsys):
    recording = Recording(TrackerRun(tmp_path, "abc", "r", "diffrl"))
    logger = MetricsLogger(tmp_path / "metrics.jsonl", trackers=[recording])
    metrics = {"train/loss": 0.5, "perf/iteration_time": 1.0, "train/skipped": 0}
    logger.log(3, metrics, keys=["train/loss"])
    logger.log_image(3, "eval/grid", Path("grid.png"))
    logger.log_metadata({"run": {"name": "r"}}, "batch arithmetic: ...")
    logger.close()
    assert recording.calls == [
        ("scalars", 3, metrics),  # all of them, not only those shown
        ("image", 3, "eval/grid", Path("grid.png")),
        ("metadata", {"run": {"name": "r"}}, "batch arithmetic: ..."),
    ]
    assert recording.closed == "ok"
    assert capsys.readouterr().out == "[step 3] train/loss=0.500\n"  # 3 significant digits
    [row] = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert row["step"] == 3 and row["train/loss"] == 0.5
