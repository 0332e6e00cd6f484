"""``parallel.sequence: 2`` on 2 gloo trainer ranks (:class:`~diffrl.distributed.ray.actors.TrainerRank`,
driven here without Ray): Flow-GRPO's and DiffusionNFT's updates of a tiny Wan 2.2 (two experts,
LoRA), each sample's tokens split over the ranks (Ulysses), give the one-process losses, gradient
norms, LoRA gradients and replayed log-probs; resuming from a checkpoint saved between two
updates repeats the second update bit for bit.

Tolerance: the two ranks add their tokens' gradient parts (and FSDP2 reduces over both) in another
order than one process sums them, so the gradients differ in the last float32 bits (see
:data:`GRAD_RTOL`); losses to 1e-5 relative.
"""

from __future__ import annotations

import os

import pytest
import torch

from diffrl.algorithms.registry import build_algorithm
from diffrl.core.parallel import free_port, full_tensor
from diffrl.distributed.ray.sharding import shard_steps
from diffrl.train import gather
from diffrl.train.runner import LocalRunner
from tests.integration.test_wan import wan_config, write_tiny_wan
from tests.ranks import run_ranks

RTOL = 1e-5
GRAD_RTOL = (1e-5, 1e-4)
"""Per update, the gradients' largest difference over the largest gradient entry. The first
update starts from the same weights (measured 1.2e-7 Flow-GRPO, 4.1e-7 NFT); the second from
weights one Adam step apart in the last bits, which Adam's normalisation enlarges for the entries
with the smallest gradients (measured 8.3e-6, 9.0e-7)."""
ALGORITHMS = {
    # all 3 steps of each sample: both experts (routed by timestep) train
    "flow_grpo": "{step_strategy: {name: all}}",
    "diffusion_nft": "{}",
}
KEYS = ("train/loss", "train/grad_norm")


def runner_settings(algorithm: str, runner: str) -> dict[str, object]:
    """An update of ``algorithm`` (its :data:`ALGORITHMS` params) of a rank-4 LoRA on ``runner``:
    ``ray``, 2 trainer ranks in one sequence group; ``local``, one process."""
    ray = runner == "ray"
    return {
        "runner": runner,
        "algorithm.name": algorithm,
        "algorithm.params": ALGORITHMS[algorithm],
        "model.lora": "{rank: 4}",
        "parallel.trainer_ranks": 2 if ray else 1,
        "parallel.sequence": 2 if ray else 1,
    }


def _config(tmp_path, folder, algorithm: str, runner: str):
    return wan_config(tmp_path / runner, folder, **runner_settings(algorithm, runner))


def _grads(module) -> dict[str, torch.Tensor]:
    """The trainable tensors' gradients, whole (a collective on FSDP2 ranks)."""
    return {n: full_tensor(p.grad).clone() for n, p in module.named_parameters() if p.requires_grad}


def _one_process(config):
    """One rollout of ``config`` (local runner), and two updates on its examples: the examples,
    and per update its metrics and gradients."""
    torch.manual_seed(config.run.seed)
    algorithm = build_algorithm(config)
    runner = LocalRunner(config, algorithm, algorithm.collection_spec())
    try:
        rollout = gather.Rollout()
        for part in runner.sample(0):
            rollout.add(part, runner.score(part))
        batch, _ = rollout.finish()
        batch = gather.scored_samples(batch)
        examples = algorithm.build_train_data(batch, algorithm.postprocess_rewards(batch, batch.rewards), 0)
        updates = []
        for _ in range(2):
            [metrics] = runner.optimize([examples])
            updates.append((metrics, _grads(runner.actor.module)))
        return examples, updates
    finally:
        runner.close()


def _rank(rank: int, config, examples, port: int, out: str) -> None:
    from diffrl.distributed.ray.actors import TrainerRank

    trainer = TrainerRank(config, rank, 2, threads=1)
    trainer.setup("127.0.0.1", port)
    parts = shard_steps([examples], 2, config.train.micro_batch_size, sequence=2)[0][rank]
    runs = []
    for i in range(2):
        if i == 1:
            trainer.save(os.path.join(out, "ckpt"), 1, "sp", {})
        [metrics] = trainer.optimize(parts)
        runs.append((metrics, _grads(trainer.actor.module), trainer.live_state()))
    trainer.resume(os.path.join(out, "ckpt"))  # back to after the first update: the second again
    [metrics] = trainer.optimize(parts)
    runs.append((metrics, _grads(trainer.actor.module), trainer.live_state()))
    if rank == 0:
        torch.save(runs, os.path.join(out, "runs.pt"))
    torch.distributed.destroy_process_group()
    os._exit(0)  # skip the teardown where gloo's threads race C++ destructors (see test_wan)


def assert_sequence_ranks_match_one_process(tmp_path, local, ray, algorithm: str) -> dict:
    """Two updates of ``local`` (one process) and of ``ray`` (2 sequence ranks) on one rollout's
    examples: losses, gradient norms, log-probs and gradients agree (:data:`GRAD_RTOL`), and
    resuming between the updates repeats the second bit for bit. Returns the ranks' first-update
    gradients (for a family's own checks)."""
    examples, reference = _one_process(local)
    run_ranks(_rank, ray, examples, free_port(), str(tmp_path))
    runs = torch.load(tmp_path / "runs.pt", weights_only=False)
    worst = [0.0, 0.0]
    for i, ((expected, expected_grads), (metrics, grads, _)) in enumerate(
        zip(reference, runs[:2], strict=True)
    ):
        assert metrics["train/grad_norm"] > 0 and metrics["train/skipped_nonfinite"] == 0
        for key in KEYS:
            assert metrics[key] == pytest.approx(expected[key], rel=RTOL, abs=1e-7), key
        if algorithm == "flow_grpo":  # log-probs of the recorded transitions against the rollout's
            diff = metrics["train/log_prob_mean_abs_diff"]
            assert diff == pytest.approx(expected["train/log_prob_mean_abs_diff"], rel=0, abs=1e-6)
            if i == 0:  # before any update: the replay of the rollout's own forwards
                assert diff < 1e-4
                print(f"replayed log-prob difference: {diff:.2e}")
        assert grads.keys() == expected_grads.keys() and len(grads) > 0
        largest = max(g.abs().max().item() for g in expected_grads.values())
        for name, g in grads.items():
            atol = GRAD_RTOL[i] * largest
            torch.testing.assert_close(g, expected_grads[name], rtol=0, atol=atol, msg=name)
            worst[i] = max(worst[i], (g - expected_grads[name]).abs().max().item() / largest)
    print(f"largest gradient difference / the largest gradient entry, per update: {worst}")
    # resumed from the checkpoint saved after the first update: the second update bit for bit
    (second, second_grads, second_state), (again, again_grads, again_state) = runs[1], runs[2]
    assert {k: again[k] for k in KEYS} == {k: second[k] for k in KEYS}
    assert all(torch.equal(again_grads[k], g) for k, g in second_grads.items())
    assert second_state.keys() == again_state.keys()
    assert all(torch.equal(again_state[k], v) for k, v in second_state.items())
    return runs[0][1]


@pytest.mark.parametrize(
    "algorithm",
    [
        pytest.param("flow_grpo", id="flow_grpo"),
        pytest.param("diffusion_nft", id="diffusion_nft", marks=pytest.mark.slow),
    ],
)
def test_two_sequence_ranks_update_tiny_wan_as_one_process(tmp_path, algorithm):
    folder = tmp_path / "wan22"
    write_tiny_wan(folder, two_experts=True)
    local, ray = (_config(tmp_path, folder, algorithm, runner) for runner in ("local", "ray"))
    grads = assert_sequence_ranks_match_one_process(tmp_path, local, ray, algorithm)
    # both experts train (LoRA's B starts at 0, so A's first gradients are 0)
    for expert in ("transformer.", "transformer_2."):
        assert any(g.abs().max() > 0 for k, g in grads.items() if k.startswith(expert)), expert
