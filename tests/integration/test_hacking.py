"""A reward the tiny world hacks (brightness: the images wash out to white and a prompt's samples
grow alike) trips the collapse alarm within a bounded number of iterations; the same run with a
KL to the base (kl_beta 0.5) does not (docs/results/hacking.md has the longer runs and the
other regularisers). Seeded on CPU: the iterations are the same on any run of this machine; the
margins (the hacked run's groups near 35 levels at iteration 20, the KL run's near 70) are wide
enough for another CPU's rounding."""

import pytest

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides

HACKING = {
    "model.path": "base",
    "algorithm.name": "flow_grpo",
    "algorithm.params": "{step_strategy: {name: all}, clip_range: 0.2}",
    "rewards": "[{name: tests.rewards:brightness}]",
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 4,
    "rollout.micro_group_size": 8,
    "rollout.num_steps_per_rollout": 1,
    "train.batch_size": 8,
    "train.micro_batch_size": 8,
    "train.lr": 3e-3,
    "train.save_every": 0,
    "train.eval_every": 0,
    "model.lora": "{rank: 4}",
    "eval.enabled": "false",
    "sampling.num_steps": 3,
    "sampling.height": 8,
    "sampling.width": 8,
}
"""The world; the collapse alarm at its defaults (half the groups below half the base's spread:
~38-40 levels here, where the base draws groups 76-80 levels apart at 8 px)."""
ITERATIONS = 14
SEED = 1
"""The unregularised run's alarm fires at iteration 7 at this seed (18, 7, 7, 7, 10 at seeds 0-4 in
60 iterations; ``docs/results/hacking.md``), with ``kl_beta: 0.5`` never."""


def run(tmp_path, **extra):
    overrides = tiny_overrides(tmp_path, **{**HACKING, "run.seed": SEED, "train.iterations": ITERATIONS, **extra})
    return train(load_config("recipes/tiny_grpo_ocr_small.yaml", overrides)).history


def first_alarm(history) -> int | None:
    return next((m["step"] for m in history if m["alarm/collapse"] == 1.0), None)


def test_a_hacked_reward_trips_the_collapse_alarm_and_a_kl_holds_it_off(tmp_path):
    with pytest.warns(UserWarning, match="collapse alarm"):
        hacked = run(tmp_path / "hacked")
    tripped = first_alarm(hacked)
    assert tripped is not None and tripped <= ITERATIONS
    first, last = hacked[0], hacked[-1]
    assert last["rollout/reward/raw_mean"] > first["rollout/reward/raw_mean"] + 0.1  # it hacks
    assert last["monitor/within_group_std"] < first["monitor/within_group_std"] / 1.5  # and collapses
    held = run(
        tmp_path / "kl", **{"algorithm.params": "{step_strategy: {name: all}, clip_range: 0.2, kl_beta: 0.5}"}
    )
    assert first_alarm(held) is None
    assert all("monitor/kl_to_base" in m for m in held)
    assert held[-1]["monitor/within_group_std"] > hacked[-1]["monitor/within_group_std"]
