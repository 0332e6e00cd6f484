import pytest
import torch
from safetensors.torch import load_file

from diffrl.algorithms.advantages import (
    FEATURE_POOL,
    aggregation_problems,
    batch_advantages,
    descending_ranks,
    diversity_weights,
    gardo_gate,
    group_advantages,
    pixel_features,
)
from diffrl.config import RewardConfig
from diffrl.core.rollout import Conditioning, RewardScores, RolloutBatch


@pytest.mark.parametrize("global_std", [True, False])
def test_matches_reference(reference_dir, global_std):
    ref = load_file(str(reference_dir / f"advantages_global_std_{global_std}.safetensors"))
    out = group_advantages(ref["rewards"], ref["group_id"], global_std=global_std)
    torch.testing.assert_close(out.advantages, ref["advantages"])
    # the reference has one group whose samples all scored the same
    assert out.zero_std.any() and (out.advantages[out.zero_std] == 0).all()


def test_layout_does_not_matter_and_dr_grpo_and_clip():
    r = torch.tensor([1.0, 0.0, 3.0, 5.0, 2.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 1, 1, 2, 2])
    a = group_advantages(r, g).advantages
    perm = torch.tensor([5, 2, 0, 4, 1, 3])
    torch.testing.assert_close(group_advantages(r[perm], g[perm]).advantages, a[perm])
    torch.testing.assert_close(
        group_advantages(r, g, scale_by_std=False).advantages,
        torch.tensor([0.5, -0.5, -1, 1, 0, 0], dtype=torch.float64),
    )
    assert group_advantages(r * 100, g, scale_by_std=False, clip=5.0).advantages.abs().max() == 5.0


def _batch(group_id, **scores):
    """A RolloutBatch with only what advantages read: group ids and each reward's scores."""
    n = len(group_id)
    return RolloutBatch(
        prompts=[""] * n,
        metadata=[{}] * n,
        prompt_index=torch.as_tensor(group_id),
        sample_index=torch.arange(n),
        group_id=torch.as_tensor(group_id),
        micro_group=torch.zeros(n, dtype=torch.long),
        x0=torch.zeros(n, 1),
        cond=Conditioning({"c": torch.zeros(n, 1)}),
        reward_scores=RewardScores({k: torch.as_tensor(v, dtype=torch.float64) for k, v in scores.items()}),
    )


def _by_hand(group_id, weighted):
    """norm_batch(Σ_k w_k · norm_group(r_k)) written out group by group."""
    g = torch.as_tensor(group_id)
    total = torch.zeros(len(g), dtype=torch.float64)
    for w, r in weighted:
        r = torch.as_tensor(r, dtype=torch.float64)
        for k in g.unique():
            m = g == k
            total[m] += w * (r[m] - r[m].mean()) / (r[m].std(unbiased=False) + 1e-4)
    return (total - total.mean()) / (total.std(unbiased=False) + 1e-4)


REWARDS = [RewardConfig(name="small", weight=1.0), RewardConfig(name="big", weight=0.5)]
GROUPS = [0, 0, 0, 1, 1, 1]
SMALL = [0.1, 0.2, 0.0, 0.3, 0.1, 0.2]  # a reward on a small scale ...
BIG = [300.0, 100.0, 200.0, 100.0, 300.0, 200.0]  # ... and one on a large one, ranking the other way


def test_per_reward_normalises_each_reward_in_its_group_before_the_weighted_sum():
    batch = _batch(GROUPS, small=SMALL, big=BIG)
    total = 1.0 * torch.tensor(SMALL, dtype=torch.float64) + 0.5 * torch.tensor(BIG, dtype=torch.float64)
    per = batch_advantages(batch, total, REWARDS, "per_reward")
    torch.testing.assert_close(per.advantages, _by_hand(GROUPS, [(1.0, SMALL), (0.5, BIG)]))
    assert per.advantages.mean().abs() < 1e-12 and abs(per.advantages.std(unbiased=False).item() - 1) < 1e-3
    # summed first, the big reward decides every sign; per reward, the small one counts twice as much
    summed = batch_advantages(batch, total, REWARDS, "sum")
    assert torch.equal(summed.advantages, group_advantages(total, batch.group_id).advantages)
    assert summed.advantages[[0, 1, 3, 4]].sign().tolist() == [1, -1, -1, 1]  # BIG's ranking
    assert summed.advantages[1] < 0 < per.advantages[1]  # sample 1: best on small, worst on big
    # a reward's scale does not matter per reward (up to the 1e-4 of the std)
    scaled = batch_advantages(
        _batch(GROUPS, small=[s * 1000 for s in SMALL], big=BIG), total, REWARDS, "per_reward"
    )
    torch.testing.assert_close(scaled.advantages, per.advantages, atol=3e-3, rtol=0)


def test_per_reward_layout_zero_std_and_problems():
    perm = torch.tensor([4, 1, 5, 0, 3, 2])
    g = torch.tensor(GROUPS)
    batch = _batch(GROUPS, small=SMALL, big=BIG)
    shuffled = _batch(g[perm].tolist(), small=torch.tensor(SMALL)[perm], big=torch.tensor(BIG)[perm])
    a = batch_advantages(batch, torch.zeros(6), REWARDS, "per_reward").advantages
    torch.testing.assert_close(
        batch_advantages(shuffled, torch.zeros(6), REWARDS, "per_reward").advantages, a[perm]
    )
    flat = _batch(GROUPS, small=[1, 1, 1, 0, 1, 2], big=[5, 5, 5, 0, 0, 1])
    assert (
        batch_advantages(flat, torch.zeros(6), REWARDS, "per_reward").zero_std.tolist()
        == [True] * 3 + [False] * 3
    )
    no_scores = _batch(GROUPS)
    no_scores.reward_scores = None
    with pytest.raises(ValueError, match="need each reward's scores"):
        batch_advantages(no_scores, torch.zeros(6), REWARDS, "per_reward")
    assert "must be one of sum, per_reward" in aggregation_problems("mean")[0]
    assert "equal the plain sum" in aggregation_problems("per_reward", scale_by_std=False)[0]
    assert aggregation_problems("per_reward") == [] == aggregation_problems("sum", scale_by_std=False)


def test_gardo_diversity_weights_golden():
    """GARDO's diversity-aware shaping (tinnerhrhe/GARDO stat_tracking.py, type gardo), by hand:
    group 0 = (1,0), (1,0), (0,1) with rewards 1, 2, 3 (mean 2): nearest cosine distances 0, 0, 1
    (mean 1/3), so the below-mean sample keeps 1 and the others get 0/(1/3) and 1/(1/3); group 1
    has one sample (1)."""
    features = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [5.0, 5.0]])
    rewards = torch.tensor([1.0, 2.0, 3.0, 7.0])
    w = diversity_weights(features, rewards, torch.tensor([0, 0, 0, 1]))
    assert w.tolist() == pytest.approx([1.0, 0.0, 3.0, 1.0])
    # identical samples: no distance to share out, the advantages stay as they are
    same = diversity_weights(torch.ones(2, 4), torch.tensor([0.0, 1.0]), torch.tensor([0, 0]))
    assert same.tolist() == [1.0, 1.0]


def test_pixel_features_are_centred_and_pooled():
    images = torch.full((2, 3, 64, 64), 255, dtype=torch.uint8)
    images[1] = 0
    f = pixel_features(images)
    assert f.shape == (2, 3 * FEATURE_POOL * FEATURE_POOL)
    assert f[0].eq(1.0).all() and f[1].eq(-1.0).all()


def test_gardo_gate_golden():
    """GARDO's gate as its script computes it: trained ranks 1..4, auxiliary ranks 4..1, so
    u = -3, -1, 1, 3; of u >= 0 (1, 3) the median is 2 (share 0.5): only the last is gated. Two
    auxiliary rewards are averaged rank by rank."""
    trained = torch.tensor([4.0, 3.0, 2.0, 1.0])
    aux = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert descending_ranks(trained).tolist() == [1.0, 2.0, 3.0, 4.0]
    assert gardo_gate(trained, [aux], 0.5).tolist() == [False, False, False, True]
    # an auxiliary reward that agrees with the trained one halves u: -1.5, -0.5, 0.5, 1.5
    assert gardo_gate(trained, [aux, trained], 0.5).tolist() == [False, False, False, True]
    # the rewards all agree: u = 0 everywhere, nothing above the threshold
    assert not gardo_gate(trained, [trained], 0.1).any()
