"""The diversity and collapse monitors (diffrl.trust.monitors) and how a rollout's metrics carry
them (the run's Trust, diffrl.trust.trust): golden values on hand-made images."""

import warnings

import pytest
import torch

from diffrl.config import Config
from diffrl.config.schema import MonitorConfig
from diffrl.core.rollout import Conditioning, RolloutBatch, RolloutStats
from diffrl.train.gather import rollout_metrics
from diffrl.trust.monitors import POOL, collapse_warning, diversity_metrics, pooled
from diffrl.trust.trust import Trust


def flat(levels: list[int], size: int = 8) -> torch.Tensor:
    """One flat uint8 image per level: ``(len(levels), 3, size, size)``."""
    return torch.tensor(levels, dtype=torch.uint8).view(-1, 1, 1, 1).expand(-1, 3, size, size).clone()


def test_golden_values_of_flat_images():
    # group 0: levels 10 and 30 (each pixel's std 10); group 1: 100 and 100 (std 0)
    images = flat([10, 30, 100, 100])
    m = diversity_metrics(images, torch.tensor([0, 0, 1, 1]))
    assert m["monitor/image_std"] == 0.0  # every image is flat
    assert m["monitor/within_group_std"] == pytest.approx(5.0)  # (10 + 0) / 2
    # group means 20 and 100: their std over the 2 groups is 40
    assert m["monitor/across_prompt_std"] == pytest.approx(40.0)
    assert m["monitor/near_duplicate_groups"] == 0.5  # group 1 only
    assert m["alarm/collapse"] == 1.0  # half the groups reach COLLAPSE_SHARE


def test_diverse_groups_do_not_alarm():
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (8, 3, 16, 16), generator=g, dtype=torch.uint8)
    m = diversity_metrics(images, torch.arange(8) // 4)
    assert m["monitor/within_group_std"] > 50 and m["monitor/image_std"] > 50
    assert m["monitor/near_duplicate_groups"] == 0.0 and m["alarm/collapse"] == 0.0
    assert collapse_warning(m, 3) is None


def test_near_duplicates_up_to_rounding_are_caught():
    base = flat([120] * 4)
    base[1] += 1  # one level apart: the quantisation step, below NEAR_DUPLICATE_STD
    m = diversity_metrics(base, torch.zeros(4, dtype=torch.long))
    assert m["monitor/within_group_std"] < MonitorConfig().near_duplicate_std and m["alarm/collapse"] == 1.0
    line = collapse_warning(m, 7)
    assert line.startswith("iteration 7: collapse alarm: 100% of the prompt groups are near duplicates")
    assert "likely being hacked" in line
    # the base's own samples (iteration 0, nothing trained): said so, not blamed on the reward
    first = collapse_warning(m, 0)
    assert "in the base model's own samples" in first and "hacked" not in first


def test_single_sample_groups_and_one_group_leave_their_metrics_out():
    m = diversity_metrics(flat([0, 255]), torch.tensor([0, 1]))
    assert "monitor/within_group_std" not in m and "alarm/collapse" not in m
    assert m["monitor/across_prompt_std"] == pytest.approx(127.5)
    one = diversity_metrics(flat([0, 255]), torch.tensor([0, 0]))
    assert "monitor/across_prompt_std" not in one
    assert diversity_metrics(flat([])[:0], torch.zeros(0, dtype=torch.long)) == {}


def test_large_images_and_videos_are_pooled():
    assert pooled(torch.zeros(2, 3, 4 * POOL, 2 * POOL, dtype=torch.uint8)).shape == (2, 3 * POOL * POOL)
    video = torch.zeros(2, 3, 5, 16, 16, dtype=torch.uint8)
    assert pooled(video).shape == (2, 3 * 5 * 16 * 16)
    video[1] = 200  # one video bright, one dark, in one group
    m = diversity_metrics(video, torch.tensor([0, 0]))
    assert m["monitor/within_group_std"] == pytest.approx(100.0)


def test_rollout_metrics_carry_the_monitors_of_the_scored_samples_and_warn():
    batch = RolloutBatch(
        prompts=[""] * 4,
        metadata=[{}] * 4,
        prompt_index=torch.tensor([0, 0, 1, 1]),
        sample_index=torch.tensor([0, 1, 0, 1]),
        group_id=torch.tensor([0, 0, 1, 1]),
        micro_group=torch.zeros(4, dtype=torch.long),
        x0=torch.zeros(4, 1),
        cond=Conditioning({"c": torch.zeros(4, 1)}),
        images=flat([50, 50, 0, 200]),
        rewards=torch.tensor([1.0, 2.0, float("nan"), 0.5]),
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = {
            **rollout_metrics(batch, RolloutStats(reward_failed=1), iteration=2),
            **Trust(Config()).rollout_monitors(batch, iteration=2),
        }
    # the failed sample is left out: group 1 has one sample, group 0 is two equal images
    assert m["monitor/near_duplicate_groups"] == 1.0 and m["alarm/collapse"] == 1.0
    assert m["rollout/reward_failed_frac"] == 0.25 and m["rollout/reward_failed"] == 1.0
    assert any("collapse alarm" in str(w.message) for w in caught)


def test_the_thresholds_are_the_configs():
    images = flat([10, 30, 100, 130])  # within-group stds 10 and 15
    group_id = torch.tensor([0, 0, 1, 1])
    assert diversity_metrics(images, group_id)["alarm/collapse"] == 0.0
    loose = MonitorConfig(near_duplicate_std=12.0, collapse_share=0.5)
    m = diversity_metrics(images, group_id, loose)
    assert m["monitor/near_duplicate_groups"] == 0.5 and m["alarm/collapse"] == 1.0
    assert "below 12 levels" in collapse_warning(m, 1, loose)
    strict = MonitorConfig(near_duplicate_std=12.0, collapse_share=1.0)
    assert diversity_metrics(images, group_id, strict)["alarm/collapse"] == 0.0


def test_the_threshold_follows_the_first_rollouts_spread():
    images = flat([10, 30, 100, 130])  # within-group stds 10 and 15
    group_id = torch.tensor([0, 0, 1, 1])
    # a base that drew groups 24 levels apart: half of it (12) catches the group at 10
    m = diversity_metrics(images, group_id, base_spread=24.0)
    assert m["monitor/near_duplicate_threshold"] == 12.0
    assert m["monitor/near_duplicate_groups"] == 0.5 and m["alarm/collapse"] == 1.0
    line = collapse_warning(m, 5)
    assert "below 12 levels, monitor.collapse_relative 0.5 x the first rollout's spread" in line
    # a base as alike as these groups: the absolute floor rules, nothing fires
    m = diversity_metrics(images, group_id, base_spread=4.0)
    assert m["monitor/near_duplicate_threshold"] == MonitorConfig().near_duplicate_std
    assert m["alarm/collapse"] == 0.0
    off = MonitorConfig(collapse_relative=0.0)
    assert diversity_metrics(images, group_id, off, base_spread=24.0)["alarm/collapse"] == 0.0


def test_the_first_rollouts_spread_is_the_reference_and_survives_a_checkpoint():
    trust = Trust(Config())
    assert trust.base_spread is None
    trust.base_spread = 61.5
    saved = trust.state()
    assert Trust(Config(), saved).base_spread == 61.5
    # a checkpoint written before the reference existed: no reference (a later rollout may be
    # collapsed already), the absolute threshold only
    del saved["base_spread"]
    assert Trust(Config(), saved).base_spread == 0.0
    images, group_id = flat([10, 30, 100, 130]), torch.tensor([0, 0, 1, 1])
    assert diversity_metrics(images, group_id, base_spread=0.0)["monitor/near_duplicate_threshold"] == 2.0
