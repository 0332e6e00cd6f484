import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.data.offline import build_offline_dataset
from diffrl.models.registry import load_family
from diffrl.preflight import load_config
from diffrl.sampling.collector import OfflineCollector
from diffrl.train.actor import Actor


def _setup(micro: int, **train):
    cfg = load_config(
        {"model": {"path": "random"}, "train": {"batch_size": 4, "micro_batch_size": micro, **train}}
    )
    family = load_family(cfg)
    actor = Actor(family, cfg)
    algo = build_algorithm(cfg)
    batch = OfflineCollector(build_offline_dataset(cfg, 32, 64), family, 4, cfg.run.seed).collect(0)
    examples = algo.build_train_data(batch, algo.postprocess_rewards(batch, None), 0)
    return actor, algo, examples


def test_micro_batch_size_does_not_change_the_update():
    results = []
    for micro in (4, 1):
        actor, algo, examples = _setup(micro)
        metrics = actor.train_step(examples, algo)
        results.append((metrics, [p.detach().clone() for p in actor.params]))
    (m4, p4), (m1, p1) = results
    assert m4["train/loss"] == pytest.approx(m1["train/loss"], rel=1e-5)
    assert m4["train/grad_norm"] == pytest.approx(m1["train/grad_norm"], rel=1e-4)
    for a, b in zip(p4, p1):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_non_finite_loss_skips_the_step_and_is_reported():
    actor, algo, examples = _setup(2)
    before = [p.detach().clone() for p in actor.params]

    def nan_loss(policy, ex):
        loss, m = type(algo).compute_loss(algo, policy, ex)
        return loss * float("nan"), m

    algo.compute_loss = nan_loss
    with pytest.warns(UserWarning, match="optimizer step skipped"):
        metrics = actor.train_step(examples, algo)
    assert metrics["train/skipped_nonfinite"] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(before, actor.params))


def test_lr_schedule_warmup_and_cosine():
    actor, algo, examples = _setup(4, lr=1.0e-3, warmup_steps=2, lr_schedule="cosine", iterations=4)
    lrs = []
    for _ in range(4):
        lrs.append(actor.train_step(examples, algo)["train/lr"])
    assert lrs[0] == pytest.approx(1e-3)  # after the 1st step: end of warmup
    assert lrs[1] > lrs[2] > lrs[3] >= 0
