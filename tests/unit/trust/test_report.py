"""The report's trust section (diffrl/trust/report.py, a panel of diffrl/evaluation/report.py's page): the paired-gain and diversity plot, the
alarms at their iteration, the best checkpoint, the group-health rows of the metrics a run logged."""

import json

from diffrl.evaluation.report import build_report
from diffrl.trust.report import AlarmSpell, alarm_spells, best_point, trust_section


def test_the_section_shows_alarms_the_best_and_the_health_rows_logged(tmp_path):
    rows = [
        {"step": 1, "train/ratio_mean": 0.98, "monitor/within_group_std": 0.2, "rollout/zero_std_ratio": 0.0},
        {"step": 2, "train/ratio_mean": 0.97, "monitor/within_group_std": 0.1, "alarm/collapse": 1.0},
    ]
    evals = [
        {"step": 0, "eval/reward_mean": 0.4, "keep_best/iteration": 0.0},
        {
            "step": 1,
            "eval/reward_gain": 0.05,
            "eval/reward_gain_se": 0.01,
            "eval/watch/aesthetic_gain": -0.1,
            "eval/watch/aesthetic_gain_se": 0.02,
            "alarm/reward_hacking": 1.0,
            "keep_best/gain": 0.05,
            "keep_best/gain_se": 0.01,
            "keep_best/iteration": 1.0,
        },
        {
            "step": 2,
            "eval/reward_gain": 0.06,
            "eval/reward_gain_se": 0.01,
            "alarm/reward_hacking": 0.0,
            "keep_best/gain": 0.01,
            "keep_best/gain_se": 0.02,
            "keep_best/iteration": 1.0,
        },
    ]
    assert alarm_spells(rows, evals) == [
        AlarmSpell(1, 1, 1, "reward hacking (eval.watch_alarm)"),
        AlarmSpell(2, 2, 1, "collapse"),
    ]
    assert best_point(evals)["step"] == 1  # step 2 did not beat it by more than its SE
    page = "".join(trust_section(tmp_path, rows, evals))
    assert "iteration 1: reward hacking" in page and "iteration 2: collapse alarm" in page
    assert "Best checkpoint" in page and "iteration 1," in page
    assert "<code>train/ratio_mean</code>" in page and "GRPO-Guard" in page
    assert "<code>rollout/zero_std_ratio</code>" in page and "train/clip_frac_high" not in page
    assert (tmp_path / "trust.png").is_file()


def test_a_run_without_watch_monitors_or_best_gets_no_section(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 0.5}) + "\n")
    (tmp_path / "eval_curve.json").write_text(json.dumps([{"step": 0, "eval/reward_mean": 0.3}]))
    page = build_report(tmp_path, panels=trust_section).path.read_text()
    assert "Can this run be trusted?" not in page and not (tmp_path / "trust.png").exists()


def test_an_alarm_firing_iteration_after_iteration_is_one_spell(tmp_path):
    fired = [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    rows = [
        {"step": i + 1, "alarm/collapse": f, "monitor/within_group_std": 1.0} for i, f in enumerate(fired)
    ]
    rows.insert(3, {"step": 3.5})  # a row that did not log the alarm does not end a spell
    assert alarm_spells(rows, []) == [AlarmSpell(1, 2, 2, "collapse"), AlarmSpell(4, 6, 3, "collapse")]
    page = "".join(trust_section(tmp_path, rows, []))
    assert "iterations 1-2 (2 in a row): collapse alarm" in page and "iterations 4-6 (3 in a row)" in page
