"""A plugin that fails inside a Ray actor (issue 36, class 1): a user model family whose sampling
calls ``sys.exit(0)`` in a rollout engine, a user algorithm whose loss raises in a trainer rank.
Either ends the run with exit 2 and one ``error:`` line naming the plugin's dotted path and its
line: never exit 70, never a dead-rank stop, never an engine replaced again and again.

The plugins are this module's classes: the Ray workers import this repo (the ``ray_cluster``
fixture's PYTHONPATH), as they import a user's package on theirs.
"""

from __future__ import annotations

import sys

import pytest

from diffrl.algorithms.flow_grpo import FlowGRPO
from diffrl.core.errors import EXIT_USER_ERROR
from diffrl.models.tiny import TinyFamily
from tests.conftest import ROOT

pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")

HERE = "tests.distributed.test_ray_plugin_errors"


class ExitingFamily(TinyFamily):
    """Samples, then exits when it decodes the latents (as a wrapped command-line tool would)."""

    def decode(self, latents):
        sys.exit(0)


class FailingGRPO(FlowGRPO):
    """Flow-GRPO whose loss raises on the trainer rank."""

    def compute_loss(self, policy, examples):
        raise ValueError("no loss today")


CASES = {
    "family_exits_in_engine": (
        {"model.family": f"{HERE}:ExitingFamily"},
        f"plugin '{HERE}:ExitingFamily' called sys.exit(0) (at test_ray_plugin_errors.py:",
        "in ExitingFamily.decode, in a Ray rollout engine)",
    ),
    "algorithm_raises_in_rank": (
        {"algorithm.name": f"{HERE}:FailingGRPO"},
        f"plugin '{HERE}:FailingGRPO' raised ValueError: no loss today (at test_ray_plugin_errors.py:",
        "in FailingGRPO.compute_loss, in a Ray trainer rank)",
    ),
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.slow] if c == "family_exits_in_engine" else []) for c in CASES],
)
def test_a_plugin_failing_in_a_ray_actor_is_named(case, tmp_path, ray_cluster, monkeypatch, capsys):
    from diffrl.cli import main

    overrides, message, place = CASES[case]
    monkeypatch.chdir(ROOT)
    argv = [
        "train",
        "recipes/tiny_grpo_ocr_small.yaml",
        "runner=ray",
        "parallel.engines=1",
        "parallel.trainer_ranks=1",
        "model.lora={rank: 4, alpha: 8}",
        "sampling.num_steps=4",
        "algorithm.params.step_strategy={name: sde_window, size: 2, range: [0, 2]}",
        "rollout.batch_size=2",
        "rollout.n_samples_per_prompt=2",
        "rollout.micro_group_size=2",
        "train.batch_size=4",
        "train.micro_batch_size=4",
        "train.iterations=1",
        "eval.enabled=false",
        "rewards=[{name: tests.rewards:brightness}]",
        f"run.output_dir={tmp_path / 'run'}",
        *(f"{k}={v}" for k, v in overrides.items()),
    ]
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    assert code == EXIT_USER_ERROR, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {message}") and place in last, err
    assert "bug in diffrl" not in err and "Traceback" not in err and "died" not in err
