"""The driver's stage helpers (:mod:`diffrl.train.perf`, :mod:`diffrl.train.batches`): per-iteration metrics of optimizer
steps, the end-of-run stage summary, and what the progress bars count and show."""

import pytest

from diffrl.algorithms.registry import build_algorithm
from diffrl.preflight import load_config
from diffrl.sampling.collector import RolloutPlanner
from diffrl.train.batches import micro_group_count
from diffrl.train.perf import MfuPeak, mean_metrics, mfu_metrics, progress_postfix, stage_summary


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


class Runner:
    """A runner that states a peak (``None``: not known yet)."""

    def __init__(self, peak: float | None):
        self.peak = peak

    def peak_flops(self) -> float | None:
        return self.peak


def stages(rollout_flops: float, train_flops: float) -> dict[str, float]:
    """An iteration's metrics: the rollout's FLOPs in 2 s of denoising, the training's in 1.5 s."""
    return {
        "perf/rollout_flops": rollout_flops,
        "perf/rollout_denoise_time": 2.0,
        "perf/train_flops": train_flops,
        "perf/train_forward_backward_time": 1.5,
        "perf/optimizer_time": 0.5,
    }


def test_mfu_is_each_stages_flops_per_second_over_the_peak_and_shown_with_the_stage(capsys):
    metrics = stages(6e9, 9e9)  # 3 and 6 GFLOP/s
    peak = MfuPeak(Runner(1e10))
    assert peak.update(metrics) == 1e10 and not peak.raised
    mfu = mfu_metrics(metrics, peak_flops=1e10)
    assert mfu == pytest.approx({"perf/rollout_mfu": 0.3, "perf/train_mfu": 0.6})
    assert mfu_metrics(metrics, None) == {} and mfu_metrics({"perf/train_flops": 1.0}, 1e10) == {}
    line = stage_summary([{**metrics, **mfu, "perf/rollout_time": 2.5}], [], peak)
    assert "rollout 2.50 s (denoise 2.00, MFU 30.0%)" in line
    assert "training 2.00 s (forward+backward 1.50, optimizer 0.50, MFU 60.0%)" in line
    assert "raised" not in line and "raised" not in capsys.readouterr().out


def test_a_stage_faster_than_the_peak_raises_it_so_no_mfu_exceeds_100_percent(capsys):
    peak = MfuPeak(Runner(1e9))  # a measured peak that read low: 1 GFLOP/s
    history = []
    for metrics in (stages(6e9, 9e9), stages(4e9, 12e9), stages(2e9, 3e9)):  # training at 6, 8, 2 GFLOP/s
        flops = peak.update(metrics)
        mfu = mfu_metrics(metrics, flops)
        assert all(0 < v <= 1.0 for v in mfu.values()), mfu
        history.append({**metrics, **mfu, "perf/rollout_time": 2.0})
    assert history[0]["perf/train_mfu"] == pytest.approx(1.0)  # the stage that raised it: 100%, not 600%
    assert history[1]["perf/train_mfu"] == pytest.approx(1.0)  # raised again, to 8 GFLOP/s
    assert history[2]["perf/train_mfu"] == pytest.approx(0.25)  # against the raised peak
    assert peak.flops == 8e9 and peak.stated == 1e9 and peak.raised
    said = capsys.readouterr().out.splitlines()
    assert said == [  # once, at the first raise
        "MFU peak raised from 1.0 GFLOP/s to 6.0 GFLOP/s: the train stage ran faster than the peak, which "
        "was low (a measured one reads low on a busy machine); perf/*_mfu are against the fastest rate "
        "seen from here on, never above 100%"
    ]
    # the summary: every iteration against the final peak, 8 GFLOP/s, which it names
    line = stage_summary(history, [], peak)
    assert "rollout 2.00 s (denoise 2.00, MFU 25.0%)" in line  # (3 + 2 + 1) / 3 of 8
    assert "MFU 66.7%)" in line  # training: (6 + 8 + 2) / 3 of 8
    assert line.endswith("; MFU against 8.0 GFLOP/s, raised from 1.0 GFLOP/s by a stage's rate")


def test_no_mfu_without_a_peak_from_the_runner():
    peak = MfuPeak(object())  # a user's runner without peak_flops
    assert peak.update(stages(6e9, 9e9)) is None
    assert MfuPeak(Runner(None)).update(stages(6e9, 9e9)) is None  # not known yet
    assert "MFU" not in stage_summary([stages(6e9, 9e9)], [], peak)


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
