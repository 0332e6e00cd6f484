"""Diffusion-DPO (:mod:`diffrl.algorithms.dpo`): the loss against its formula, the direction of its
gradient, the pairs it forms, its seeding, and the pair folder's and config's errors."""

import json
import math

import pytest
import torch
from PIL import Image

from diffrl.algorithms.dpo import DPO, DPOExamples, diffusion_dpo_loss, select_pairs
from diffrl.config import ConfigError
from diffrl.core.rollout import Conditioning, RolloutBatch, TrainSignals
from diffrl.data.offline import DatasetError, PreferencePairDataset, scan_pair_folder
from diffrl.preflight import load_config
from diffrl.sampling.collector import OfflineCollector

LATENT = (2, 3, 4)


class ScaledPolicy:
    """``v = θ ⊙ x_t + σ`` with a learnable ``θ`` per latent element; the reference keeps ``θ_ref``."""

    def __init__(self, theta: torch.Tensor, theta_ref: torch.Tensor):
        self.theta = torch.nn.Parameter(theta.clone())
        self.theta_ref = theta_ref

    def velocity(self, x_t, sigma, cond, **kw):
        return self.theta * x_t + sigma.view(-1, 1, 1, 1)

    def reference_velocity(self, x_t, sigma, cond, **kw):
        return self.theta_ref * x_t + sigma.view(-1, 1, 1, 1)


def _algo(**params) -> DPO:
    return DPO(DPO.Params(**params), load_config({}, check_files=False))


def _examples(n=3, seed=0) -> DPOExamples:
    g = torch.Generator().manual_seed(seed)
    return DPOExamples(
        sample_id=torch.arange(n),
        x0_w=torch.randn(n, *LATENT, generator=g),
        x0_l=torch.randn(n, *LATENT, generator=g),
        noise=torch.randn(n, *LATENT, generator=g),
        t=torch.rand(n, generator=g) * 0.9 + 0.05,
        cond=Conditioning({"h": torch.zeros(n, 2)}),
        reward_gap=torch.ones(n),
        pairs=torch.full((n,), float(n)),
        skipped=torch.zeros(n),
    )


def test_loss_is_the_formula_on_fixed_errors():
    mw, ml = torch.tensor([0.30, 0.50, 0.20]), torch.tensor([0.40, 0.45, 0.20])
    rw, rl = torch.tensor([0.35, 0.50, 0.10]), torch.tensor([0.35, 0.40, 0.30])
    beta = 10.0
    terms = diffusion_dpo_loss(mw, ml, rw, rl, beta)
    by_hand = []
    for a, b, c, d in zip(mw.tolist(), ml.tolist(), rw.tolist(), rl.tolist()):
        z = -beta / 2 * ((a - c) - (b - d))
        by_hand.append((z, math.log(1 + math.exp(-z))))  # -log sigmoid(z)
    torch.testing.assert_close(terms.inside, torch.tensor([z for z, _ in by_hand]))
    assert terms.loss.item() == pytest.approx(sum(loss for _, loss in by_hand) / 3, rel=1e-6)


def test_compute_loss_by_hand_shares_t_and_noise_and_reports_metrics():
    ex = _examples()
    theta = torch.full(LATENT, 0.3)
    theta_ref = torch.full(LATENT, 0.1)
    algo = _algo(beta=50.0)
    loss, metrics = algo.compute_loss(ScaledPolicy(theta, theta_ref), ex)

    s = ex.t.view(-1, 1, 1, 1)

    def err(th, x0):  # x_t = (1 - t) x0 + t eps, target eps - x0, mean over the latent
        x_t = (1 - s) * x0 + s * ex.noise
        return ((th * x_t + s) - (ex.noise - x0)).pow(2).flatten(1).mean(1)

    z = -25.0 * (
        (err(theta, ex.x0_w) - err(theta_ref, ex.x0_w)) - (err(theta, ex.x0_l) - err(theta_ref, ex.x0_l))
    )
    torch.testing.assert_close(loss, torch.nn.functional.softplus(-z).mean())
    assert metrics["train/dpo_loss"] == pytest.approx(loss.item())
    assert metrics["train/reward_margin"] == pytest.approx(z.mean().item(), rel=1e-5)
    assert metrics["train/implicit_acc"] == pytest.approx((z > 0).float().mean().item())
    assert metrics["train/model_w_err"] == pytest.approx(err(theta, ex.x0_w).mean().item(), rel=1e-5)
    assert metrics["train/dpo_pairs"] == 3 and metrics["train/dpo_skipped_groups"] == 0
    assert metrics["train/pair_reward_gap"] == 1.0


def test_equal_to_the_reference_the_loss_is_log2():
    theta = torch.full(LATENT, 0.2)
    loss, metrics = _algo().compute_loss(ScaledPolicy(theta, theta), _examples())
    assert loss.item() == pytest.approx(math.log(2))
    assert metrics["train/reward_margin"] == 0.0 and metrics["train/implicit_acc"] == 0.0


def test_an_sgd_step_lowers_the_chosen_error_relative_to_the_rejected():
    ex = _examples(n=4, seed=1)
    theta = torch.full(LATENT, 0.2)
    policy = ScaledPolicy(theta, theta.clone())
    algo = _algo(beta=20.0)

    def relative(p):  # (e_w - e_ref_w) - (e_l - e_ref_l) per pair, the quantity DPO lowers
        with torch.no_grad():
            return -algo.compute_loss(p, ex)[1]["train/reward_margin"] / 10.0

    before_loss, before = algo.compute_loss(policy, ex)[0], relative(policy)
    before_loss.backward()
    with torch.no_grad():
        policy.theta -= 0.05 * policy.theta.grad
    after_loss, m = algo.compute_loss(policy, ex)
    assert relative(policy) < before == 0.0
    assert after_loss < before_loss
    assert m["train/implicit_acc"] > 0.5


def test_pairs_are_each_groups_best_and_worst_and_ties_are_skipped():
    scores = torch.tensor([0.1, 0.9, 0.5, 0.3, 0.3, 0.3, 0.7, 0.2, 0.7, 0.2, 1.0])
    group_id = torch.tensor([5, 5, 5, 2, 2, 2, 9, 9, 9, 9, 4])
    pairs = select_pairs(scores, group_id)
    # groups in ascending id: 2 (all tied: skipped), 4 (one sample: skipped), 5, 9 (ties: first row)
    assert pairs.chosen.tolist() == [1, 6] and pairs.rejected.tolist() == [0, 7]
    assert pairs.skipped == 2


def _batch(order=None, rewards=None, n_groups=2, k=3) -> RolloutBatch:
    g = torch.Generator().manual_seed(3)
    n = n_groups * k
    batch = RolloutBatch(
        prompts=[f"p{i // k}" for i in range(n)],
        metadata=[{} for _ in range(n)],
        prompt_index=torch.arange(n) // k,
        sample_index=torch.arange(n) % k,
        group_id=torch.arange(n) // k + 10,
        micro_group=torch.zeros(n, dtype=torch.long),
        x0=torch.randn(n, *LATENT, generator=g),
        cond=Conditioning({"h": torch.arange(n, dtype=torch.float32).view(n, 1)}),
        rewards=torch.rand(n, generator=g) if rewards is None else rewards,
    )
    return batch if order is None else batch.select(order)


def test_examples_are_seeded_by_pair_identity_not_batch_layout():
    algo = _algo(num_timesteps=2)
    batch = _batch()
    ex = algo.build_train_data(batch, algo.postprocess_rewards(batch, batch.rewards), iteration=4)
    assert len(ex) == 4  # 2 pairs x 2 timesteps
    order = torch.tensor([5, 3, 4, 0, 2, 1])
    shuffled = batch.select(order)
    ex2 = algo.build_train_data(shuffled, algo.postprocess_rewards(shuffled, shuffled.rewards), iteration=4)
    for a in range(len(ex)):  # the same pair finds the same t and noise wherever its rows are
        b = next(b for b in range(len(ex2)) if torch.equal(ex2.x0_w[b], ex.x0_w[a]) and ex2.t[b] == ex.t[a])
        torch.testing.assert_close(ex2.noise[b], ex.noise[a])
        torch.testing.assert_close(ex2.x0_l[b], ex.x0_l[a])
    other = algo.build_train_data(batch, algo.postprocess_rewards(batch, batch.rewards), iteration=5)
    assert not torch.equal(other.noise, ex.noise)
    # the chosen sample is the group's best
    w = ex.sample_id[0]
    assert batch.rewards[w] == batch.rewards[:3].max()
    torch.testing.assert_close(ex.cond.tensors["h"], batch.cond.tensors["h"][ex.sample_id])


def test_all_tied_groups_give_no_examples():
    algo = _algo()
    batch = _batch(rewards=torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0, 0.0]))
    ex = algo.build_train_data(batch, algo.postprocess_rewards(batch, batch.rewards), iteration=0)
    assert len(ex) == 0 and ex.noise.shape == (0, *LATENT)


def _pair_folder(tmp_path, rows: list[str], images=("a.png", "b.png")):
    for name in images:
        Image.new("RGB", (16, 8), (200, 10, 10)).save(tmp_path / name)
    (tmp_path / "metadata.jsonl").write_text("\n".join(rows) + "\n")
    return tmp_path


GOOD = json.dumps({"prompt": "a cat", "chosen": "a.png", "rejected": "b.png"})


def test_pair_folder_reads_chosen_then_rejected(tmp_path):
    Image.new("RGB", (32, 16), (0, 0, 255)).save(tmp_path / "c.png")
    folder = _pair_folder(
        tmp_path, [GOOD, "", json.dumps({"prompt": "x", "chosen": "c.png", "rejected": "a.png", "score": 1})]
    )
    ds = PreferencePairDataset(folder, 8, 16)
    assert len(ds) == 2
    images, prompt = ds[1]
    assert images.shape == (2, 3, 8, 16) and prompt == "x"
    assert images[0, 2].mean() > 0.99 and images[1, 0].mean() > 0.7  # blue chosen, red rejected


@pytest.mark.parametrize(
    "row, message",
    [
        ('{"prompt": "a", "chosen": "a.png",', r"line 2: not valid JSON"),
        ('["a", "b"]', r"line 2: a JSON list, not an object"),
        ('{"prompt": "a", "chosen": "a.png"}', r"line 2: no 'rejected' field"),
        (
            '{"prompt": "", "chosen": "a.png", "rejected": "b.png"}',
            r"line 2: field 'prompt' must be a non-empty string",
        ),
        (
            '{"prompt": "a", "chosen": "a.png", "rejected": "gone.png"}',
            r"line 2: field 'rejected': image 'gone.png' not found",
        ),
        (
            '{"prompt": "a", "chosen": "a.png", "rejected": "a.png"}',
            r"line 2: 'chosen' and 'rejected' are the same file",
        ),
    ],
)
def test_pair_folder_errors_name_the_line_and_field(tmp_path, row, message):
    folder = _pair_folder(tmp_path, [GOOD, row])
    with pytest.raises(DatasetError, match=message):
        scan_pair_folder(folder)
    # reported by config validation, before anything loads
    with pytest.raises(ConfigError, match=message):
        load_config(_offline(folder))


def test_pair_folder_missing_folder_or_metadata(tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        scan_pair_folder(tmp_path / "nope")
    with pytest.raises(DatasetError, match="has no metadata.jsonl"):
        scan_pair_folder(tmp_path)
    (tmp_path / "metadata.jsonl").write_text("\n\n")
    with pytest.raises(DatasetError, match="holds no pairs"):
        scan_pair_folder(tmp_path)


def _offline(folder, **extra) -> dict:
    return {
        "algorithm": {"name": "dpo", "params": {"pairs": "offline"}},
        "data": {"dataset": str(folder)},
        "train": {"batch_size": 2, "micro_batch_size": 2},
        **extra,
    }


def test_config_errors():
    base = {"algorithm": {"name": "dpo"}, "rewards": [{"name": "ocr"}]}
    with pytest.raises(ConfigError, match="rollout.n_samples_per_prompt must be >= 2, got 1"):
        load_config({**base, "rollout": {"n_samples_per_prompt": 1, "batch_size": 16}})
    with pytest.raises(ConfigError, match="trains on a folder of preference pairs: set data.dataset"):
        load_config({"algorithm": {"name": "dpo", "params": {"pairs": "offline"}}}, check_files=False)
    with pytest.raises(
        ConfigError, match=r"algorithm.params.beta must be in \(0, 100000\] \(DPO's KL strength"
    ):
        load_config({**base, "algorithm": {"name": "dpo", "params": {"beta": 0}}})


class FakeFamily:
    device = "cpu"

    def encode_images(self, images):
        return images[:, :2] * 2 - 1

    def encode_prompts(self, prompts, sources=None):
        return Conditioning({"h": torch.tensor([float(len(p)) for p in prompts]).view(-1, 1)})


def test_offline_batch_lays_pairs_out_as_groups_and_trains_chosen_first(tmp_path):
    Image.new("RGB", (16, 8), (0, 0, 255)).save(tmp_path / "c.png")
    rows = [GOOD, json.dumps({"prompt": "dog", "chosen": "c.png", "rejected": "a.png"})]
    ds = PreferencePairDataset(_pair_folder(tmp_path, rows), 8, 16)
    batch = OfflineCollector(ds, FakeFamily(), batch_size=3, seed=0).collect(0)  # an epoch boundary
    assert len(batch) == 6
    assert batch.group_id.tolist() == [0, 0, 1, 1, 2, 2] and batch.sample_index.tolist() == [0, 1] * 3
    assert batch.prompts[0] == batch.prompts[1]
    algo = _algo(pairs="offline")
    signals = algo.postprocess_rewards(batch, None)
    assert isinstance(signals, TrainSignals)
    ex = algo.build_train_data(batch, signals, iteration=0)
    assert ex.sample_id.tolist() == [0, 2, 4]  # three pairs, even the one drawn twice
    torch.testing.assert_close(ex.x0_w, batch.x0[[0, 2, 4]])
    torch.testing.assert_close(ex.x0_l, batch.x0[[1, 3, 5]])
