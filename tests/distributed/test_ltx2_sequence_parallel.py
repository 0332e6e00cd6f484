"""``ray.sequence_parallel: 2`` for LTX-2 on 2 gloo trainer ranks, as
``tests/distributed/test_sequence_parallel.py`` does for Wan (its helpers drive
:class:`~diffrl.distributed.ray.actors.TrainerRank` without Ray): Flow-GRPO's and DiffusionNFT's
updates of the tiny LTX-2.3 (LoRA, the pipeline's full guidance: CFG, STG, modality isolation),
each sample's video and audio tokens split over the ranks, give the one-process losses, gradient
norms, LoRA gradients and replayed log-probs; resuming from a checkpoint saved between two updates
repeats the second update bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from diffrl.parallel import free_port
from tests.distributed.test_sequence_parallel import ALGORITHMS, KEYS, RTOL, _one_process, _rank
from tests.integration.test_ltx2 import ltx2_config, write_tiny_ltx2
from tests.integration.test_ltx2_sequence_parallel import OPTIONS
from tests.ranks import run_ranks

GRAD_RTOL = (1e-5, 1e-4)
"""Per update, the gradients' largest difference over the largest gradient entry, Wan's bounds: the
first update starts from the same weights (measured 9.5e-7 Flow-GRPO, 4.9e-7 NFT), the second from
weights one Adam step apart in the last bits (measured 3.9e-6, 1.1e-6)."""


def _config(tmp_path, folder, algorithm: str, runner: str):
    ray = runner == "ray"
    return ltx2_config(
        tmp_path / runner,
        folder,
        **{
            "runner": runner,
            "algorithm.name": algorithm,
            "algorithm.params": ALGORITHMS[algorithm],
            "model.lora": "{rank: 4}",
            "model.options": OPTIONS,
            "ray.num_trainer_ranks": 2 if ray else 1,
            "ray.sequence_parallel": 2 if ray else 1,
        },
    )


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_two_sequence_ranks_update_tiny_ltx2_as_one_process(tmp_path, algorithm):
    folder = tmp_path / "ltx2"
    write_tiny_ltx2(folder)
    examples, reference = _one_process(_config(tmp_path, folder, algorithm, "local"))
    config = _config(tmp_path, folder, algorithm, "ray")
    run_ranks(_rank, config, examples, free_port(), str(tmp_path))
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
            torch.testing.assert_close(g, expected_grads[name], rtol=0, atol=GRAD_RTOL[i] * largest, msg=name)
            worst[i] = max(worst[i], (g - expected_grads[name]).abs().max().item() / largest)
        if i == 0:  # LoRA's B starts at 0: B's gradients, of every attention of both streams
            for attn in (
                "attn1",
                "audio_attn1",
                "attn2",
                "audio_attn2",
                "audio_to_video_attn",
                "video_to_audio_attn",
            ):
                assert any(g.abs().max() > 0 for k, g in grads.items() if f".{attn}.to_q.lora_B" in k), attn
    print(f"largest gradient difference / the largest gradient entry, per update: {worst}")
    # resumed from the checkpoint saved after the first update: the second update bit for bit
    (second, second_grads, second_state), (again, again_grads, again_state) = runs[1], runs[2]
    assert {k: again[k] for k in KEYS} == {k: second[k] for k in KEYS}
    assert all(torch.equal(again_grads[k], g) for k, g in second_grads.items())
    assert second_state.keys() == again_state.keys()
    assert all(torch.equal(again_state[k], v) for k, v in second_state.items())
