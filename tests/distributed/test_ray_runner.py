"""runner=ray (2 rollout engines, 2 FSDP2 trainer ranks on gloo, an OCR reward worker) against
the single-process runner, on the shipped tiny base with the real OCR reward.

Tolerances. Iteration 0 is exact in its rewards: the local run samples with the thread count the
runner gives each engine (:func:`train_local`), so its images are the engines' bits (with 2 threads
against 1 a GEMM rounds differently, and a pixel on a uint8 rounding boundary flips: seen for Wan
on 1 seed in 8). Everything downstream of an update is not: the two ranks reduce gradients in
another order than one process does, so the gradients differ in the last float32 bits.
- Losses and gradient norms agree to 1e-5 relative, and the final LoRA weights to 1e-5 absolute
  (1% of one Adam step at lr 1e-3; measured 3e-6): Adam's normalisation enlarges the gradients'
  last-bit differences for the weights with the smallest gradients.
- Rewards after the first update agree to :data:`REWARD_ATOL`: the images come from weights that
  differ in the last bits, and a pixel that lands on the other side of a uint8 rounding boundary
  moves a brightness reward by one level (measured: 1.3e-6 for FLUX, one level of one of its four
  16 x 16 images, 1 / (255 * 768 * 4); 1e-7 for Wan). A text reward (OCR) reads the same text from
  such images (measured: equal), so for it the tolerance is equality.
"""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from diffrl.algorithms.registry import build_algorithm
from diffrl.distributed.ray.dispatch import TrainerRankDied
from diffrl.distributed.ray.runner import RayRunner
from diffrl.launch import train
from diffrl.preflight import load_config
from diffrl.train.gather import collect_rollout
from tests.conftest import ROOT, SMALL_ROLLOUT

ray = pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")

LOSS_RTOL, WEIGHT_ATOL = 1e-5, 1e-5  # losses also to 1e-7 absolute: Flow-GRPO's first loss is -mean(A) ~ 0
REWARD_ATOL = 1e-5  # rewards after an update: 8 uint8 levels of the FLUX test's batch mean (measured: 1)
TRAINABLE = 31_744  # LoRA r=4 on the tiny transformer's attention projections


def config(tmp_path, algorithm: str, runner: str, **extra):
    params = {
        "flow_grpo": "{step_strategy: {name: sde_window, size: 2, range: [0, 6]}}",
        "diffusion_nft": "{timestep_fraction: 0.5}",
    }[algorithm]
    overrides = {
        "run.output_dir": str(tmp_path / runner),
        "runner": runner,
        "parallel.engines": 2,
        "parallel.trainer_ranks": 2,
        "algorithm.name": algorithm,
        "algorithm.params": params,
        "model.path": "base",
        "model.lora": "{rank: 4, alpha: 8}",
        "sampling.num_steps": 8,
        **SMALL_ROLLOUT,
        "train.iterations": 2,
        "train.lr": 1e-3,
        "eval.enabled": "false",
        "rewards": "[{name: ocr}]",
        **extra,
    }
    recipe = ROOT / "recipes" / "tiny_grpo_ocr_small.yaml"
    return load_config(str(recipe), [f"{k}={v}" for k, v in overrides.items()])


def train_local(cfg):
    """``train(cfg)`` with runner=local, on as many threads as RayRunner gives each engine (and rank):
    the same GEMM kernels, so iteration 0's images are the engines' bits."""
    assert cfg.runner == "local"
    threads = torch.get_num_threads()
    # Cluster.place: the machine's cores shared by the larger of the two actor groups
    torch.set_num_threads(
        max(1, (os.cpu_count() or 1) // max(cfg.parallel.trainer_ranks, cfg.parallel.engines))
    )
    try:
        return train(cfg)
    finally:
        torch.set_num_threads(threads)


def assert_rewards_match(local: dict[str, float], distributed: dict[str, float], iteration: int) -> None:
    """Exactly before the first update, to :data:`REWARD_ATOL` after (see the module's docstring)."""
    tolerance = 0.0 if iteration == 0 else REWARD_ATOL
    for key in ("rollout/reward/raw_mean", "rollout/reward/raw_std"):
        assert distributed[key] == pytest.approx(local[key], rel=0, abs=tolerance), (key, iteration)


# DiffusionNFT also keeps an EMA of the (sharded) LoRA weights and evaluates with it
EXTRA = {
    "flow_grpo": {},
    "diffusion_nft": {
        "parallel.engines": 1,  # the engines' union is Flow-GRPO's case; this one's claims are the EMA's
        "train.ema_decay": 0.5,
        "eval.enabled": "true",
        "eval.num_prompts": 4,
        "eval.batch_size": 4,
    },
}


# the default run holds Flow-GRPO; DiffusionNFT, the other recipes and the faults are the slow tier
@pytest.mark.parametrize("algorithm", ["flow_grpo", pytest.param("diffusion_nft", marks=pytest.mark.slow)])
def test_ray_run_equals_local_run(tmp_path, ray_cluster, algorithm):
    local = train_local(config(tmp_path, algorithm, "local", **EXTRA[algorithm]))
    distributed = train(config(tmp_path, algorithm, "ray", **EXTRA[algorithm]))
    for iteration, (a, b) in enumerate(zip(local.history, distributed.history, strict=True)):
        assert_rewards_match(a, b, iteration)
        assert b["rollout/reward/raw_std"] > 0  # the advantages, and so the gradients, are not all 0
        assert b["train/loss"] == pytest.approx(a["train/loss"], rel=LOSS_RTOL, abs=1e-7)
        assert b["train/grad_norm"] == pytest.approx(a["train/grad_norm"], rel=LOSS_RTOL)
        assert b["sync/checksum_match"] == 1.0 and b["rollout/reissued"] == 0
        assert b["sync/bytes"] == 4 * TRAINABLE  # only the LoRA tensors travel (float32)
        # the stage breakdown: the engines' sampling stages (summed over engines), the ranks' step
        assert b["perf/rollout_denoise_time"] > 0 and b["perf/train_forward_backward_time"] > 0
        # the engines count their model FLOPs (an MFU per device); FSDP2-sharded ranks do not
        assert b["perf/rollout_flops"] == a["perf/rollout_flops"] > 0 and b["perf/rollout_mfu"] > 0
        assert b["perf/train_flops"] == 0 and "perf/train_mfu" not in b
    if algorithm == "flow_grpo":  # the first replay on the ranks equals the engines' log-probs
        assert distributed.history[0]["train/log_prob_mean_abs_diff"] < 1e-6
    w_local = load_file(str(local.checkpoint / "trainable.safetensors"))
    w_ray = load_file(str(distributed.checkpoint / "trainable.safetensors"))
    assert w_local.keys() == w_ray.keys() and all("lora_" in k for k in w_ray)
    assert sum(v.numel() for v in w_ray.values()) == TRAINABLE
    moved = 0.0
    for k in w_local:
        torch.testing.assert_close(w_ray[k], w_local[k], rtol=0, atol=WEIGHT_ATOL)
        moved = max(moved, (w_local[k] - _initial(tmp_path, k)).abs().max().item())
    assert moved > 20 * WEIGHT_ATOL  # training moved the weights far more than the tolerance
    if algorithm == "diffusion_nft":  # EMA of sharded weights, gathered for the checkpoint and the eval
        e_local = load_file(str(local.checkpoint / "ema.safetensors"))
        e_ray = load_file(str(distributed.checkpoint / "ema.safetensors"))
        assert e_local.keys() == e_ray.keys()
        # the EMA file names the module's parameters (peft's adapter name included)
        assert {k.replace(".default.", ".") for k in e_local} == w_local.keys()
        for k in e_local:
            torch.testing.assert_close(e_ray[k], e_local[k], rtol=0, atol=WEIGHT_ATOL)
        # the EMA lags the live weights (decay 0.5 over 2 steps), so evaluating with it is visible
        lag = max((e_local[k] - w_local[k.replace(".default.", ".")]).abs().max().item() for k in e_local)
        assert lag > 20 * WEIGHT_ATOL
        assert len(local.evals) == len(distributed.evals) == 2  # before training and at the end
        before, after = (e["eval/reward_mean"] for e in distributed.evals)
        assert before == local.evals[0]["eval/reward_mean"]  # the base, sampled alike
        assert after == pytest.approx(local.evals[1]["eval/reward_mean"], rel=0, abs=REWARD_ATOL)


_INITIAL: dict[str, torch.Tensor] = {}


def _initial(tmp_path, key):
    """The LoRA init (seeded, the same in both runs)."""
    if not _INITIAL:
        from diffrl.models.registry import load_family
        from diffrl.train.actor import apply_lora
        from diffrl.train.checkpoint import trainable_state

        cfg = config(tmp_path, "flow_grpo", "local")
        torch.manual_seed(cfg.run.seed)
        build_algorithm(cfg)
        family = load_family(cfg)
        apply_lora(family, cfg.model.lora)

        class _A:  # trainable_state reads .module and .config
            module, config = family.transformer, cfg

        _INITIAL.update(trainable_state(_A))
    return _INITIAL[key]


@pytest.mark.slow
def test_uneven_shares_after_dropped_samples_still_match_the_local_run(tmp_path, ray_cluster):
    """A NaN reward per micro-group drops 3 of 12 samples: the ranks get 5 and 4 samples, run the same
    number of micro-batches (the collectives pair up) and the update is still the local one."""
    extra = {
        "parallel.engines": 1,  # the ranks' shares are the claim (the engines' union is the one above)
        "rewards": "[{name: tests.rewards:flaky}]",
        "rollout.batch_size": 3,
        "train.batch_size": 12,
        "train.iterations": 1,
    }
    with pytest.warns(UserWarning, match=r"3 sample\(s\) dropped"):  # each run says what it dropped
        local = train_local(config(tmp_path, "flow_grpo", "local", **extra)).history[0]
    with pytest.warns(UserWarning, match=r"3 sample\(s\) dropped"):
        distributed = train(config(tmp_path, "flow_grpo", "ray", **extra)).history[0]
    assert local["rollout/reward_failed"] == distributed["rollout/reward_failed"] == 3
    assert distributed["train/loss"] == pytest.approx(local["train/loss"], rel=LOSS_RTOL, abs=1e-7)
    assert distributed["train/grad_norm"] == pytest.approx(local["train/grad_norm"], rel=LOSS_RTOL)


@pytest.mark.slow
def test_engine_and_reward_worker_killed_mid_rollout_are_replaced(tmp_path, ray_cluster):
    """More engines than ranks (2 engines share one rank's bundle); an engine killed with its two
    micro-groups in flight, then a reward worker killed: both re-issued, the same rewards."""
    cfg = config(  # the reward worker in the rank's bundle (ray.rewards_on_gpu; CPUs here)
        tmp_path,
        "flow_grpo",
        "ray",
        **{"rollout.micro_group_size": 2, "parallel.trainer_ranks": 1, "ray.rewards_on_gpu": "true"},
    )
    algorithm = build_algorithm(cfg)
    runner = RayRunner(cfg, algorithm, algorithm.collection_spec())
    try:
        reference, _ = collect_rollout(runner, 0)
        killed = []

        def kill_engine_one(engine: int, micro_group: int) -> None:
            if engine == 1 and not killed:  # in flight: it never finishes, nor the one queued behind
                killed.append(micro_group)
                ray.kill(runner.dispatch.engines.actors[1], no_restart=True)

        runner.dispatch.on_dispatch = kill_engine_one
        batch, _ = collect_rollout(runner, 0)
        assert killed and runner.dispatch.reissued == 2
        assert torch.equal(batch.rewards, reference.rewards)
        assert torch.equal(batch.sample_index, reference.sample_index)

        def kill_reward_worker(engine: int, micro_group: int) -> None:
            if micro_group == 2:
                ray.kill(runner.dispatch.reward_pools[0].actors[0], no_restart=True)

        runner.dispatch.on_dispatch = kill_reward_worker
        batch, _ = collect_rollout(runner, 0)
        assert runner.dispatch.reissued >= 1
        assert torch.equal(batch.rewards, reference.rewards)
        # the iteration goes on: an update, then a sync that reaches the replacement engine
        signals = algorithm.postprocess_rewards(batch, batch.rewards)
        [metrics] = runner.optimize([algorithm.build_train_data(batch, signals, 0)])
        assert metrics["train/grad_norm"] > 0
        metrics = runner.end_iteration()
        assert metrics["sync/checksum_match"] == 1.0 and metrics["rollout/reissued"] >= 1
    finally:
        runner.close()


@pytest.mark.slow
def test_dead_trainer_rank_stops_the_run_naming_the_last_checkpoint(tmp_path, ray_cluster):
    """Rank 1 dies; rank 0 is then stuck in an FSDP collective of the update: the run stops at once
    with an error naming the last checkpoint."""
    cfg = config(tmp_path, "flow_grpo", "ray", **{"parallel.engines": 1})
    algorithm = build_algorithm(cfg)
    runner = RayRunner(cfg, algorithm, algorithm.collection_spec())
    try:
        runner.save(tmp_path / "ckpt_step_0", 0, "run-id", {})
        assert (tmp_path / "ckpt_step_0" / "trainable.safetensors").is_file()
        batch, _ = collect_rollout(runner, 0)
        signals = algorithm.postprocess_rewards(batch, batch.rewards)
        examples = algorithm.build_train_data(batch, signals, 0)
        ray.kill(runner.ranks[1], no_restart=True)
        with pytest.raises(TrainerRankDied, match="ckpt_step_0"):
            runner.optimize([examples])
    finally:
        runner.close()


def _tiny_flux(folder):
    from tests.integration.test_flux import flux_config, write_tiny_flux

    write_tiny_flux(folder)
    return flux_config


def _tiny_wan22(folder):
    from tests.integration.test_wan import wan_config, write_tiny_wan

    write_tiny_wan(folder, two_experts=True)
    return wan_config


@pytest.mark.slow
@pytest.mark.parametrize("write", [_tiny_flux, _tiny_wan22], ids=["flux", "wan22"])
def test_real_families_run_on_ray_as_in_one_process(tmp_path, ray_cluster, write):
    """Two Flow-GRPO iterations of tiny FLUX.1 (packed latents, embedded guidance) and tiny Wan 2.2
    (two experts routed by timestep, both sharded by FSDP2) on an engine + 2 ranks equal the single
    process: rewards exactly in the first iteration and to REWARD_ATOL in the second; losses and
    gradient norms to 1e-4 relative in the first, 1e-3 in the second. The brightness reward of these
    random models barely varies (Wan's group std ~2e-4), so the advantages, (r - mean) / (std + 1e-4),
    enlarge a pixel's uint8 flip (2.6e-7 of a Wan reward) to ~1e-3 of an advantage. Measured over 8
    seeds: first iteration <= 2e-7; second <= 4e-5 (FLUX 5e-5 and Wan 5.6e-4 in a third)."""
    folder = tmp_path / "model"
    make = write(folder)
    runs = {}
    for runner in ("local", "ray"):
        # one engine: the engines' union is test_ray_run_equals_local_run's claim, on any family
        extra = {"parallel.engines": 1, "parallel.trainer_ranks": 2, "ray.num_reward_workers": 1}
        cfg = make(tmp_path / runner, folder, **{"runner": runner, "train.iterations": 2, **extra})
        runs[runner] = (train_local if runner == "local" else train)(cfg).history
    for iteration, (local, distributed) in enumerate(zip(runs["local"], runs["ray"], strict=True)):
        assert_rewards_match(local, distributed, iteration)
        rtol = 1e-4 if iteration == 0 else 1e-3
        for key in ("train/loss", "train/grad_norm"):
            assert distributed[key] == pytest.approx(local[key], rel=rtol, abs=1e-7), (key, iteration)
