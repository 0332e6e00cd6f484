import torch

from diffrl.algorithms.sft import SFT, SFTExamples, flow_matching_loss
from diffrl.core.rollout import Conditioning
from diffrl.preflight import load_config


class FakeFamily:
    def encode_prompts(self, prompts, sources=None):
        return Conditioning({"h": torch.zeros(len(prompts), 2, 3)})


class LinearPolicy:
    """A policy whose velocity is a known linear function, to check the loss by hand."""

    def __init__(self):
        self.w = torch.nn.Parameter(torch.tensor(0.5))
        self.family = FakeFamily()

    def velocity(self, x_t, sigma, cond, **kw):
        return self.w * x_t + sigma.view(-1, 1, 1, 1)


def _examples(n=4):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(n, 3, 4, 8, generator=g)
    noise = torch.randn(n, 3, 4, 8, generator=g)
    sigma = torch.rand(n, generator=g)
    return SFTExamples(sample_id=torch.arange(n), x0=x0, prompts=["p"] * n, noise=noise, sigma=sigma)


def test_flow_matching_loss_by_hand():
    ex = _examples()
    policy = LinearPolicy()
    algo = SFT(SFT.Params(), load_config({}))
    loss, metrics = algo.compute_loss(policy, ex)
    s = ex.sigma.view(-1, 1, 1, 1)
    x_t = (1 - s) * ex.x0 + s * ex.noise
    expected = ((0.5 * x_t + s) - (ex.noise - ex.x0)).pow(2).mean()
    torch.testing.assert_close(loss, expected)
    assert metrics["train/fm_loss"] == loss.item()


def test_loss_is_zero_for_the_true_velocity():
    ex = _examples()
    v = ex.noise - ex.x0
    assert flow_matching_loss(v, ex.x0, ex.noise).abs().max() == 0


def test_micro_batch_split_gives_the_same_gradient():
    ex = _examples(4)
    algo = SFT(SFT.Params(), load_config({}))
    grads = []
    for mb_size in (4, 2, 1):
        policy = LinearPolicy()
        for mb in ex.micro_batches(mb_size):
            loss, _ = algo.compute_loss(policy, mb)
            (loss * len(mb) / len(ex)).backward()
        grads.append(policy.w.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2])


def test_train_data_draws_depend_on_identity_not_batch_layout():
    from diffrl.core.rollout import RolloutBatch

    algo = SFT(SFT.Params(cond_dropout=0.5), load_config({}))
    n = 6
    batch = RolloutBatch(
        prompts=[f"p{i}" for i in range(n)],
        metadata=[{}] * n,
        prompt_index=torch.arange(n) * 7,
        sample_index=torch.arange(n),
        group_id=torch.arange(n),
        micro_group=torch.zeros(n, dtype=torch.long),
        x0=torch.zeros(n, 3, 4, 8),
        cond=Conditioning({"h": torch.zeros(n, 2, 3)}),
    )
    full = algo.build_train_data(batch, algo.postprocess_rewards(batch, None), iteration=3)
    part = algo.build_train_data(batch.select([4, 1]), algo.postprocess_rewards(batch, None), iteration=3)
    torch.testing.assert_close(part.noise, full.noise[[4, 1]])
    torch.testing.assert_close(part.sigma, full.sigma[[4, 1]])
    assert part.prompts == [full.prompts[4], full.prompts[1]]
    assert 0 < full.prompts.count("") < n  # about half the prompts dropped for CFG
    other_iter = algo.build_train_data(batch, algo.postprocess_rewards(batch, None), iteration=4)
    assert not torch.equal(other_iter.noise, full.noise)
    assert 0 < full.sigma.min() and full.sigma.max() < 1
