"""The driver's stage helpers (:mod:`diffrl.train.perf`, :mod:`diffrl.train.batches`): per-iteration metrics of optimizer
steps, the end-of-run stage summary, and what the progress bars count and show."""

import pytest

from diffrl.algorithms.registry import build_algorithm
from diffrl.preflight import load_config
from diffrl.sampling.collector import RolloutPlanner
from diffrl.train.batches import micro_group_count
from diffrl.train.perf import mean_metrics, mfu_metrics, progress_postfix, stage_summary


def test_step_metrics_are_averaged_and_times_added_up():
    rows = [
        {"train/loss": 1.0, "perf/optimizer_time": 0.5, "perf/train_forward_backward_time": 2.0},
        {"train/loss": 3.0, "perf/optimizer_time": 0.25, "perf/train_forward_backward_time": 1.0},
    ]
    assert mean_metrics(rows) == {
        "train/loss": 2.0,
        "perf/optimizer_time": 0.75,
        "perf/train_forward_backward_time": 3.0,
    }
    assert mean_metrics([]) == {}


def test_the_summary_gives_each_stages_mean_seconds_and_leaves_out_the_absent_ones():
    history = [
        {
            "perf/rollout_time": 4.0,
            "perf/rollout_encode_time": 0.5,
            "perf/rollout_denoise_time": 3.0,
            "perf/rollout_decode_time": 0.25,
            "perf/reward_wait_time": 1.0,
            "perf/train_forward_backward_time": 2.0,
            "perf/optimizer_time": 0.5,
            "perf/before_update_time": 0.004,  # under 5 ms a part is not shown (it is in the sum)
        },
        {  # an iteration whose every sample failed: no training
            "perf/rollout_time": 2.0,
            "perf/rollout_encode_time": 0.5,
            "perf/rollout_denoise_time": 1.0,
            "perf/rollout_decode_time": 0.25,
            "perf/reward_wait_time": 0.0,
        },
    ]
    evals = [{"step": 0, "perf/eval_time": 3.0}, {"step": 2, "perf/eval_time": 1.0}, {"step": 1}]
    assert stage_summary(history, evals) == (
        "seconds per iteration (mean of 2): rollout 3.00 s (encode 0.50, denoise 2.00, decode 0.25); "
        "reward wait 0.50 s; training 1.25 s (forward+backward 1.00, optimizer 0.25); "
        "eval 2.00 s each (2 evals)"
    )  # no weight sync (one process), no before-update pass (not AWM)


@pytest.mark.parametrize("history", [[], [{"perf/iteration_time": 1.0}]])
def test_the_summary_of_a_run_without_stage_times(history):
    expected = (
        "stage times: no iteration ran" if not history else "stage times: none recorded in 1 iteration(s)"
    )
    assert stage_summary(history, []) == expected


def test_mfu_is_each_stages_flops_per_second_over_the_peak_and_shown_with_the_stage():
    metrics = {
        "perf/rollout_flops": 6e9,
        "perf/rollout_denoise_time": 2.0,
        "perf/train_flops": 9e9,
        "perf/train_forward_backward_time": 1.5,
        "perf/optimizer_time": 0.5,
    }
    mfu = mfu_metrics(metrics, peak_flops=1e10)
    assert mfu == pytest.approx({"perf/rollout_mfu": 0.3, "perf/train_mfu": 0.6})
    assert mfu_metrics(metrics, None) == {} and mfu_metrics({"perf/train_flops": 1.0}, 1e10) == {}
    line = stage_summary([{**metrics, **mfu, "perf/rollout_time": 2.5}], [])
    assert "rollout 2.50 s (denoise 2.00, MFU 30.0%)" in line
    assert "training 2.00 s (forward+backward 1.50, optimizer 0.50, MFU 60.0%)" in line


@pytest.mark.parametrize(
    "sizes", [(2, 4, 4), (3, 3, 4), (1, 5, 8)], ids=["even", "a short last group", "one group"]
)
def test_the_rollout_bar_counts_the_micro_groups_the_planner_makes(sizes):
    prompts, samples, group = sizes
    config = load_config(
        "recipes/tiny_grpo_ocr_small.yaml",
        [
            f"rollout.batch_size={prompts}",
            f"rollout.n_samples_per_prompt={samples}",
            f"rollout.micro_group_size={group}",
            f"train.batch_size={prompts * samples}",
            "train.micro_batch_size=1",
        ],
    )
    spec = build_algorithm(config).collection_spec()
    planned = RolloutPlanner(config, spec, num_prompts=8).plan(0).micro_groups
    assert micro_group_count(config, spec) == len(planned)


def test_the_training_bar_shows_the_reward_or_else_the_loss_and_the_iteration_time():
    metrics = {"rollout/reward/raw_mean": 0.5, "train/loss": 2.0, "perf/iteration_time": 3.0, "x": 1.0}
    assert progress_postfix(metrics) == {"reward": 0.5, "last_iter_s": 3.0}
    assert progress_postfix({"train/loss": 2.0}) == {"loss": 2.0}
