"""``eval.watch`` (held-out judges) and ``eval.watch_alarm`` end to end on the tiny model: the
watched rewards' curves are logged with their paired gains, the alarm fires when the trained reward
rises while a watched one falls, and ``stop: true`` ends the run cleanly (final eval, checkpoint,
report); the config mistakes around them are refused before anything loads."""

import json

import pytest

from diffrl.launch import train
from diffrl.preflight import load_config
from tests.conftest import tiny_overrides
from tests.integration.test_bad_inputs import BAD, GRPO, ROOT, Case, _check, _setup, run_row

BRIGHTNESS = "[{name: tests.rewards:brightness}]"
DARKNESS = "tests.integration.test_watch:darkness"
TINY = {
    "model.lora": "{rank: 4, alpha: 8}",
    "rollout.batch_size": 2,
    "rollout.n_samples_per_prompt": 2,
    "rollout.micro_group_size": 2,
    "rollout.num_steps_per_rollout": 1,
    "algorithm.params.step_strategy": "{name: all}",
    "train.lr": 1e-3,
    "train.eval_every": 1,
    "rewards": BRIGHTNESS,
    "eval.rewards": BRIGHTNESS,
    "eval.num_prompts": 4,
    "eval.samples_per_prompt": 2,
    "eval.batch_size": 8,
}


def darkness(images, prompts, metadata):
    """A watched reward that falls exactly as much as brightness (the trained one) rises: the
    alarm's direction is certain whatever the run learns, so only its size is the run's."""
    return (1.0 - images.float().mean(dim=(1, 2, 3))).tolist()


def test_a_watched_reward_that_falls_as_the_trained_one_rises_trips_the_alarm_and_stops(tmp_path):
    extra = {
        "train.iterations": 3,
        "eval.watch": f"[{{name: {DARKNESS}}}]",
        # min_drop 0: the alarm's mechanics on a fall of ~2e-4 (one tiny iteration); the default
        # floor's false alarms and detections are measured in docs/results/hacking.md
        "eval.watch_alarm": "{k_se: 2.0, min_drop: 0, window: 1, stop: true}",
    }
    config = load_config(f"{ROOT}/{GRPO}", tiny_overrides(tmp_path, **{**TINY, **extra}))
    named = (
        rf"alarm at iteration 1: .*eval total: 'tests.rewards:brightness'.* watched reward '{DARKNESS}' fell"
    )
    with pytest.warns(UserWarning, match=named):
        result = train(config)
    # brightness rose over iteration 1 (many SE: a tiny LoRA moves every pixel alike), so darkness fell
    key = f"eval/watch/{DARKNESS}"
    assert [e["step"] for e in result.evals] == [0, 1]
    first, second = result.evals
    assert f"{key}_mean" in first and first["alarm/reward_hacking"] == 0.0
    assert second["alarm/reward_hacking"] == 1.0
    assert second["eval/reward_gain"] > 2 * second["eval/reward_gain_se"] > 0
    assert second[f"{key}_gain"] == pytest.approx(-second["eval/reward_gain"], abs=1e-6)
    # stopped as at the time budget: the final checkpoint at the alarm's iteration, the report written
    info = json.loads((result.checkpoint / "checkpoint.json").read_text())
    assert info["iteration"] == 1 and info["loop"]["watch"]["fired"][0]["step"] == 1
    assert [h["step"] for h in result.history] == [1]
    page = (result.output_dir / "report.html").read_text()
    assert (
        "Can this run be trusted?" in page and "iteration 1: reward hacking (eval.watch_alarm) alarm" in page
    )
    assert (result.output_dir / "trust.png").is_file() and "trust.png" in page


CASES = [
    Case(
        "watch-alarm-without-watch",
        ["train", GRPO, "eval.watch_alarm={k_se: 2}"],
        BAD,
        "eval.watch_alarm compares the trained reward with watched ones, and eval.watch is empty",
    ),
    Case(
        "watch-unknown-reward",
        ["train", GRPO, "eval.watch=[{name: aesthetik}]"],
        BAD,
        "eval.watch[0].name: ",
    ),
    Case(
        "keep-best-unknown-metric",
        ["train", GRPO, "train.keep_best={metric: eval/aesthetic_mean}"],
        BAD,
        "train.keep_best.metric 'eval/aesthetic_mean' is no metric this run's evals log; use one of: "
        "eval/reward_mean, eval/ocr_mean",
    ),
    Case(
        "keep-best-without-evals",
        ["train", GRPO, "train.keep_best={every: 2}", "eval.enabled=false"],
        BAD,
        "train.keep_best compares evals, and eval.enabled is false",
    ),
    Case(
        "keep-best-every-zero",
        ["train", GRPO, "train.keep_best={every: 0}"],
        BAD,
        "train.keep_best.every must be in [1, 1_000_000_000]",
    ),
    Case(
        "keep-best-eval-too-large-to-pair",
        ["train", GRPO, "train.keep_best={every: 2}", "eval.num_prompts=200000"],
        BAD,
        "pair at most 100,000 eval samples",
    ),
    Case(
        "eval-best-of-a-run-without-one",
        ["eval", "{tmp}/run/best", "--out", "{tmp}/out"],
        BAD,
        "has no best checkpoint",
        files={"run/metrics.jsonl": "", "run/checkpoints/": ""},
    ),
    Case(
        "export-best-of-a-run-without-one",
        ["export", "{tmp}/run/best", "{tmp}/out"],
        BAD,
        "it keeps one with train.keep_best",
        files={"run/metrics.jsonl": ""},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_refused_before_anything_loads(case, tmp_path, request, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    _check(case, *run_row(case, _setup(case, tmp_path, request), monkeypatch, capsys))
