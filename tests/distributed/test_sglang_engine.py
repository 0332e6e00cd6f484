"""``rollout.engine: sglang`` against a real sglang-diffusion server on the CPU (a tiny random FLUX.1
written by ``save_pretrained``), through the Ray runner: Flow-GRPO replays the server's transitions
(its recorded log-probs against diffrl's replay), DiffusionNFT trains on its final samples, the
server holds exactly the trainer's weights after each sync, and a server killed mid-rollout is
restarted with nothing lost.

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
from diffrl.launch import train
from diffrl.models.flux import FluxFamily
from diffrl.sampling.sglang import merged_state
from diffrl.sampling.sglang_server import ServeCommand, Server
from diffrl.train.actor import apply_lora
from diffrl.train.checkpoint import load_trainable_state
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
"""fp32 server, fp32 replay: ``train/log_prob_mean_abs_diff`` measured 3e-8 to 6e-8 (the LoRA is
merged into the server's weights, unmerged in diffrl's forward: the last bits differ)."""


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


def held_weights(flux_dir, checkpoint: Path) -> str:
    """The checksum of the sampling weights of ``checkpoint``, merged as the engine sends them."""
    family = FluxFamily.load(
        str(flux_dir), torch.device("cpu"), torch.float32, FluxFamily.description.Options()
    )
    apply_lora(family, LoraConfig(rank=4))
    load_trainable_state(family, load_file(str(checkpoint / "trainable.safetensors")), lora=True)
    return state_checksum(merged_state(family.transformer, torch.float32))


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
        assert m["sync/engine_bytes"] > 0 and m["perf/engine_sync_time"] > 0
        assert m["rollout/engine_restarts"] == 0
        assert torch.isfinite(torch.tensor(m["train/loss"])) and m["train/grad_norm"] > 0
    # after the last update the engine sent the new weights: the server holds exactly them
    assert server.weights_checksum("transformer", 60) == held_weights(flux_dir, result.checkpoint)


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
