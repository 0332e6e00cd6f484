"""``rollout.engine: sglang`` against a real sglang-diffusion server on the CPU (a tiny random FLUX.1
written by ``save_pretrained``), through the Ray runner: Flow-GRPO replays the server's transitions
(its recorded log-probs against diffrl's replay), DiffusionNFT trains on its final samples, the
server holds exactly the trainer's weights after each sync (the LoRA adapter alone by default, the
merged transformer with ``sync: merged``), a server killed mid-rollout is restarted with nothing
lost (the base weights and the last adapter), and rollouts drawn one update ahead
(``train.off_policy_steps: 1``) are the server's with the weights the driver says.

The server runs in sglang's own environment (``.ci/sglang-env`` makes it; ``$DIFFRL_SGLANG``
names its ``sglang`` command). Without one these tests are skipped; ``.ci/run`` always has one.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from diffrl.config.schema import LoraConfig
from diffrl.core.parallel import state_checksum
from diffrl.distributed.ray.weight_sync import load_state
from diffrl.launch import train
from diffrl.models.flux import FluxFamily
from diffrl.sampling.sglang_lora import sampling_adapter, served_state
from diffrl.sampling.sglang_server import ServeCommand, Server
from diffrl.train.actor import apply_lora
from diffrl.train.checkpoint import ROLLOUT_WEIGHTS, load_trainable_state
from tests.integration.family_checks import family_config
from tests.integration.test_flux import SIZE, write_tiny_flux

pytest.importorskip("ray", reason="runner=ray needs the ray package (pip install -e '.[test]')")
SGLANG = os.environ.get("DIFFRL_SGLANG") or shutil.which("sglang")
pytestmark = [
    pytest.mark.skipif(
        SGLANG is None, reason="no sglang-diffusion environment: run .ci/sglang-env and set DIFFRL_SGLANG"
    ),
    # the slow tier (.ci/run runs it after the default run): each test starts servers of its own,
    # 45-50 s each on 2 cores, and the module takes 8-10 minutes in one worker
    pytest.mark.slow,
]
# one xdist worker runs the whole module (tests/conftest.py): its server and reference run are built once
ALIGNMENT = 1e-6
"""fp32 server, fp32 replay: ``train/log_prob_mean_abs_diff`` measured 3e-8 to 6e-8 with the merged
sync (the LoRA merged into the server's weights, unmerged in diffrl's forward), 4.1e-8 and 6.0e-8
with the adapter (unmerged on both sides: the server's kernel and encoders still differ in the last
bits)."""


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_flux_sglang")
    write_tiny_flux(path)
    return path


@pytest.fixture(scope="module")
def server(flux_dir, tmp_path_factory):
    """One server for the module's runs given by URL (diffrl does not stop those)."""
    log = tmp_path_factory.mktemp("sglang") / "server.log"
    s = Server.launch(ServeCommand(SGLANG, str(flux_dir), "FLUX.1-dev", "fp32", []), log, 2, 300)
    yield s
    s.stop()


def config(tmp_path, flux_dir, algorithm: str, engine_options: str, **extra):
    family = {
        "model.family": "flux",
        "model.path": str(flux_dir),
        "sampling.guidance_scale": 1.0,
        "sampling.height": SIZE,
        "sampling.width": SIZE,
    }
    params = {"flow_grpo": {}, "diffusion_nft": {"algorithm.name": "diffusion_nft", "algorithm.params": "{}"}}
    settings = {
        "runner": "ray",
        "parallel.engines": 1,
        "parallel.trainer_ranks": 1,
        "train.iterations": 2,
        "rollout.engine": "sglang",
        "rollout.engine_options": engine_options,
        **params[algorithm],
    }
    return family_config(tmp_path, family, **{**settings, **extra})


def held_weights(flux_dir, checkpoint: Path, rollout: bool = False) -> str:
    """What a server holding the sampling weights of ``checkpoint`` reports: the trained LoRA (or
    with ``rollout`` a pipelined run's next rollout's, ``rollout_weights.safetensors``), as the
    adapter on the base weights (the LoRA sync)."""
    family = FluxFamily.load(
        str(flux_dir), torch.device("cpu"), torch.float32, FluxFamily.description.Options()
    )
    apply_lora(family, LoraConfig(rank=4))
    if rollout:
        load_state(family.transformer, load_file(str(checkpoint / ROLLOUT_WEIGHTS)))
    else:
        load_trainable_state(family, load_file(str(checkpoint / "trainable.safetensors")), lora=True)
    module = family.transformer
    return state_checksum(served_state(module, sampling_adapter(module), torch.float32))


def adapter_bytes(checkpoint: Path) -> int:
    """Bytes of the trained adapter (float32): what a LoRA sync sends."""
    return sum(
        t.numel() * t.element_size() for t in load_file(str(checkpoint / "trainable.safetensors")).values()
    )


@pytest.fixture(scope="module")
def grpo_run(ray_cluster, tmp_path_factory, flux_dir, server):
    """Two Flow-GRPO iterations on the module's server (the killed run is compared with it too)."""
    return train(
        config(tmp_path_factory.mktemp("grpo"), flux_dir, "flow_grpo", f"{{urls: ['{server.url}']}}")
    )


def test_flow_grpo_replays_the_servers_transitions_and_the_server_holds_the_trainers_weights(
    flux_dir, server, grpo_run
):
    result = grpo_run
    for m in result.history:
        assert m["train/log_prob_mean_abs_diff"] < ALIGNMENT
        # sync: auto with model.lora's integer alpha: the adapter alone
        assert m["sync/engine_bytes"] == adapter_bytes(result.checkpoint) and m["perf/engine_sync_time"] > 0
        assert m["rollout/engine_restarts"] == 0
        assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0
    # after the last update the engine sent the new adapter: the server holds exactly it, on the base
    assert server.weights_checksum("transformer", 60) == held_weights(flux_dir, result.checkpoint)
    applied = server.lora_status(60)["active"]["transformer"][0]
    assert applied["mode"] == "unmerged" and applied["strength"] == 1.0


def test_the_merged_sync_sends_the_whole_transformer_and_draws_the_same_rollout(
    ray_cluster, tmp_path, flux_dir, grpo_run
):
    """``sync: merged`` on a server of its own (a server that took an adapter keeps its layers
    wrapped): the whole transformer, the LoRA merged in, checked by the server's checksum each sync;
    the same seeds draw the same rollout as the adapter's (rewards to a uint8 level)."""
    engine = f"{{command: '{SGLANG}', sync: merged}}"
    run = train(config(tmp_path, flux_dir, "flow_grpo", engine))
    lora = grpo_run.history
    for m, a in zip(run.history, lora):
        assert m["train/log_prob_mean_abs_diff"] < ALIGNMENT and m["rollout/engine_restarts"] == 0
        assert m["sync/engine_bytes"] > 10 * a["sync/engine_bytes"]
        assert m["rollout/reward/raw_mean"] == pytest.approx(a["rollout/reward/raw_mean"], rel=0, abs=1e-5)
    base = load_file(str(flux_dir / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert run.history[0]["sync/engine_bytes"] == sum(t.numel() * 4 for t in base.values())


def test_nft_trains_on_the_servers_final_samples(ray_cluster, tmp_path, flux_dir, server):
    result = train(config(tmp_path, flux_dir, "diffusion_nft", f"{{urls: ['{server.url}']}}"))
    assert len(result.history) == 2
    for m in result.history:
        assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0
        assert m["rollout/reward_failed"] == 0


def _kill_after(log_glob: Path, requests: int, killed: list[int], stop: threading.Event) -> None:
    """Kill the engine's server (its process group) once its log shows ``requests`` rollouts served."""
    while not stop.is_set():
        for servers in log_glob.parent.glob(log_glob.name):
            for s in json.loads(servers.read_text() or "[]"):
                log = Path(s["log"])
                if (
                    log.exists()
                    and log.read_text(errors="replace").count("POST /rollout/generate") >= requests
                ):
                    os.killpg(s["pid"], signal.SIGKILL)
                    killed.append(s["pid"])
                    return
        time.sleep(0.02)


def test_a_server_killed_mid_rollout_is_restarted_and_nothing_is_lost(
    ray_cluster, tmp_path, flux_dir, grpo_run
):
    whole = grpo_run
    killed: list[int] = []
    stop = threading.Event()
    out = tmp_path / "killed" / "run"
    # 2 micro-groups (one request each) per iteration: the third request is iteration 2's first
    watcher = threading.Thread(target=_kill_after, args=(out / "sglang" / "servers-*.json", 3, killed, stop))
    watcher.start()
    try:
        run = train(
            config(
                tmp_path / "killed",
                flux_dir,
                "flow_grpo",
                f"{{command: '{SGLANG}'}}",  # model_id from model_index.json
            )
        )
    finally:
        stop.set()
        watcher.join()
    assert killed, "the server was never killed"
    assert run.history[-1]["rollout/engine_restarts"] >= 1
    for a, b in zip(whole.history, run.history):
        assert b["rollout/reward_failed"] == 0
        assert a["rollout/reward/raw_mean"] == pytest.approx(b["rollout/reward/raw_mean"], abs=1e-6)
        assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-5, abs=1e-7)
    # the same trained weights (to float tolerance: only the seeds are guaranteed, not the bits)
    a, b = (load_file(str(r.checkpoint / "trainable.safetensors")) for r in (whole, run))
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_server_spanning_two_ranks_rolls_out_for_sequence_parallel_trainer_ranks(
    ray_cluster, tmp_path, flux_dir, grpo_run
):
    """Long sequences end to end on the CPU: diffrl starts the server with ``sequence_parallel: 2``
    (``--num-gpus 2 --sp-degree 2 --ulysses-degree 2``: two worker processes, each sample's tokens
    split over them) and 2 trainer ranks split each sample's tokens too (``parallel.sequence:
    2``). The replay still matches the server's log-probs (measured 3.4e-8 and 4.8e-8, as with one
    worker), and the rollout is the one-worker server's (same seeds; rewards to a uint8 level)."""
    engine = f"{{command: '{SGLANG}', sequence_parallel: 2}}"
    sp = {"parallel.trainer_ranks": 2, "parallel.sequence": 2, "ray.colocate": "false"}
    run = train(config(tmp_path, flux_dir, "flow_grpo", engine, **sp, **{"train.iterations": 1}))
    [m] = run.history
    assert m["train/log_prob_mean_abs_diff"] < ALIGNMENT
    assert m["sync/engine_bytes"] > 0 and m["rollout/engine_restarts"] == 0
    reference = grpo_run.history[0]["rollout/reward/raw_mean"]
    assert m["rollout/reward/raw_mean"] == pytest.approx(reference, rel=0, abs=1e-5)
    assert m["train/loss"] == pytest.approx(grpo_run.history[0]["train/loss"], rel=1e-4, abs=1e-7)
    logs = list((tmp_path / "run" / "sglang").glob("server-*.log"))
    assert logs and "--ulysses-degree 2" in logs[0].read_text(errors="replace")


def test_rollouts_drawn_one_update_ahead_are_the_servers_with_the_weights_of_their_version(
    ray_cluster, tmp_path, flux_dir, server
):
    """``train.off_policy_steps: 1``: rollout 2 is drawn while the ranks train on rollout 1, with the
    weights of one update earlier. The first is on-policy: the server's log-probs are diffrl's
    replay's (< ALIGNMENT); the second is not (ρ = π_old/μ departs from 1 by far more), and after
    the run the server holds exactly the weights the checkpoint says the engines hold (those of
    the next rollout, one update behind the trained ones). The server given by URL took other
    runs' adapters before (in the module's order): its checksum is not the base's, so the engine's
    first sync reloads ``model.path`` into it and then checks the whole transformer."""
    grpo = "{step_strategy: {name: sde_window, size: 2, range: [0, 3]}, rollout_correction: tis}"
    ahead = {"train.off_policy_steps": 1, "train.lr": 1e-3, "algorithm.params": grpo}
    run = train(config(tmp_path, flux_dir, "flow_grpo", f"{{urls: ['{server.url}']}}", **ahead))
    rows = run.history
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0]
    assert rows[0]["train/rollout_log_prob_abs_diff"] < ALIGNMENT
    assert rows[1]["train/rollout_log_prob_abs_diff"] > 10 * ALIGNMENT  # measured 1.8e-4 (4.1e-8 on-policy)
    assert rows[1]["train/rollout_is_raw_mean"] != 1.0
    for r in rows:
        assert r["train/ratio_abs_minus_1"] == 0.0 and r["rollout/engine_restarts"] == 0
    held = server.weights_checksum("transformer", 60)
    assert held == held_weights(flux_dir, run.checkpoint, rollout=True)
    assert held != held_weights(flux_dir, run.checkpoint)  # the trained weights are one update ahead
