"""The types that pass between the loop's stages (:mod:`diffrl.core.rollout`): what a collection spec
says a collector fills, the per-sample containers, and the uint8 images rollouts keep."""

import dataclasses

import pytest
import torch

from diffrl.core.rollout import CollectionSpec, Conditioning, RolloutBatch, TrainSignals, quantize

TRAJECTORY = {"traj_x", "traj_next", "traj_step", "traj_sigma", "traj_sigma_next"}
OPTIONAL = {f.name for f in dataclasses.fields(RolloutBatch) if f.default is None}
"""The RolloutBatch fields a collector may leave at None."""


def every_step(num_steps, rollout_id, seed):
    return list(range(num_steps))


def test_conditioning_select_and_cat():
    c = Conditioning({"a": torch.arange(6).view(3, 2)})
    assert Conditioning.cat([c.select([2]), c.select([0])]).tensors["a"].tolist() == [[4, 5], [0, 1]]


def test_an_offline_spec_provides_nothing_optional():
    assert CollectionSpec(online=False, needs_reward=False).provides() == frozenset()
    # a trajectory needs sampling: an offline spec provides none whatever it asks for
    offline = CollectionSpec(
        online=False, needs_reward=True, step_strategy=every_step, keep_trajectory=True, keep_log_prob=True
    )
    assert offline.provides() == frozenset()


def test_an_online_spec_provides_images_and_sigmas_and_rewards_when_it_needs_them():
    assert CollectionSpec(online=True, needs_reward=False).provides() == {"images", "sigmas"}
    assert CollectionSpec(online=True, needs_reward=True).provides() == {"images", "sigmas", "rewards"}


def test_a_trajectory_spec_provides_the_transitions_and_their_log_probs_when_kept():
    base = {"images", "sigmas", "rewards"}
    spec = CollectionSpec(online=True, needs_reward=True, sampler="sde", step_strategy=every_step)
    assert spec.provides() == base  # stochastic steps, but nothing kept
    kept = dataclasses.replace(spec, keep_trajectory=True)
    assert kept.provides() == base | TRAJECTORY
    with_log_prob = dataclasses.replace(kept, keep_log_prob=True)
    assert with_log_prob.provides() == base | TRAJECTORY | {"traj_log_prob"}
    with_mean = dataclasses.replace(with_log_prob, keep_mean=True)  # GRPO-Guard's RatioNorm
    assert with_mean.provides() == base | TRAJECTORY | {"traj_log_prob", "traj_mean"}
    # without a step strategy there is no stochastic step, so no transition to keep
    no_steps = dataclasses.replace(with_log_prob, step_strategy=None)
    assert no_steps.provides() == base
    # log-probs are of kept transitions only
    assert dataclasses.replace(spec, keep_log_prob=True).provides() == base


@pytest.mark.parametrize(
    "spec",
    [
        CollectionSpec(online=False, needs_reward=False),
        CollectionSpec(online=True, needs_reward=False),
        CollectionSpec(
            online=True, needs_reward=True, step_strategy=every_step, keep_trajectory=True, keep_log_prob=True
        ),
    ],
    ids=["offline", "online", "trajectory"],
)
def test_what_a_spec_provides_are_optional_rollout_batch_fields(spec):
    assert spec.provides() <= OPTIONAL


def test_train_signals_select_and_cat():
    s = TrainSignals({"adv": torch.tensor([0.1, 0.2, 0.3, 0.4]), "w": torch.tensor([1.0, 2.0, 3.0, 4.0])})
    assert len(s) == 4 and len(TrainSignals()) == 0
    picked = s.select([3, 0])
    assert len(picked) == 2
    assert picked.values["adv"].tolist() == s.values["adv"][[3, 0]].tolist()
    assert picked.values["w"].tolist() == [4.0, 1.0]
    whole = TrainSignals.cat([s.select([0, 1]), s.select([2, 3])])
    assert whole.values.keys() == s.values.keys()
    for k in s.values:
        assert torch.equal(whole.values[k], s.values[k])
    assert [len(p) for p in s.micro_batches(3)] == [3, 1]  # the Batch helpers work on it too


def test_quantize_maps_0_1_to_uint8_on_the_cpu():
    levels = torch.arange(256, dtype=torch.float32) / 255
    out = quantize(levels.view(1, 1, 16, 16))
    assert out.dtype == torch.uint8 and out.device.type == "cpu" and out.shape == (1, 1, 16, 16)
    assert out.flatten().tolist() == list(range(256))  # each of the 256 levels exactly


def test_quantize_clamps_out_of_range_values_and_keeps_videos_shape():
    x = torch.tensor([-0.5, -1e-6, 1.0 + 1e-6, 3.0])
    assert quantize(x).tolist() == [0, 0, 255, 255]
    video = torch.rand(2, 3, 4, 8, 8, requires_grad=True)  # (B, 3, F, H, W), from a graph
    out = quantize(video)
    assert out.shape == video.shape and out.dtype == torch.uint8 and not out.requires_grad
    # within half a level of the input
    assert (out.float() / 255 - video.detach()).abs().max() <= 0.5 / 255 + 1e-6
