"""The sglang engine's contract on recorded ``/rollout/generate`` exchanges (``tests/data/sglang/``,
recorded from a real sglang 0.5.23 server by ``tests/data/sglang/record.py``): the requests diffrl
builds from a rollout plan, the answers mapped to a :class:`RolloutBatch`, and the alignment of
diffrl's kernels and forward with the server's on the recorded transitions; and the LoRA sync's
adapter folder and the checksums it is checked by, against what the server held after
``/v1/set_lora``. No server runs here."""

from __future__ import annotations

import json
import socket
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch
from peft import LoraConfig as PeftLoraConfig
from safetensors import safe_open

from diffrl.algorithms.registry import build_algorithm
from diffrl.config import ConfigError
from diffrl.config.schema import LoraConfig
from diffrl.core.parallel import LISTEN_PORTS_FROM, ephemeral_ports, state_checksum
from diffrl.data.prompts import load_prompts
from diffrl.models.flux import FluxFamily
from diffrl.models.registry import load_family
from diffrl.sampling.kernels import resolve_kernel
from diffrl.sampling.sglang import SglangEngine, default_model_id, sync_mode
from diffrl.sampling.sglang_lora import sampling_adapter, served_state, tensor_sha256
from diffrl.sampling.sglang_server import (
    LAUNCH_TRIES,
    EngineServerError,
    EngineUnreachable,
    ServeCommand,
    Server,
    as_tensor,
    decode_rollout,
    server_ports,
)
from diffrl.train.actor import apply_lora
from tests.integration.family_checks import family_config
from tests.integration.test_flux import SIZE, write_tiny_flux

DATA = Path(__file__).resolve().parents[2] / "data" / "sglang"
EXCHANGES = {
    "flux_sde": (
        {"algorithm.params": "{sampler: sde, step_strategy: {name: sde_window, size: 2, range: [0, 3]}}"},
        True,
    ),
    "flux_cps": (
        {"algorithm.params": "{sampler: cps, step_strategy: {name: sde_window, size: 2, range: [0, 3]}}"},
        True,
    ),
    "flux_ode": ({"algorithm.name": "diffusion_nft", "algorithm.params": "{}"}, False),
}
"""Recorded exchange -> (the algorithm's overrides, whether the engine asks for debug tensors)."""


def engine(tmp_path: Path, flux_dir: Path, algorithm: dict, debug: bool):
    """An sglang engine for one micro-group of 2 samples of one prompt (no server started: the
    engine starts or connects at its first sync), and rollout 0's plan."""
    config = family_config(
        tmp_path,
        {
            "model.family": "flux",
            "model.path": str(flux_dir),
            "sampling.guidance_scale": 1.0,
            "sampling.height": SIZE,
            "sampling.width": SIZE,
        },
        **algorithm,
        **{
            "rollout.batch_size": 1,
            "train.batch_size": 2,
            "rollout.engine": "sglang",
            "rollout.engine_options": f"{{debug_alignment: {str(debug).lower()}, urls: ['http://127.0.0.1:9']}}",
        },
    )
    spec = build_algorithm(config).collection_spec()
    eng = SglangEngine(config, load_family(config), spec, load_prompts(config.data.prompts))
    return eng, eng.plan(0)


@pytest.fixture(scope="module")
def flux_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny_flux")
    write_tiny_flux(path)
    return path


LORA = LoraConfig(rank=4, alpha=8.0)
"""The recorded adapter's settings: alpha is not the rank, so the scale alpha / r is in play."""


def lora_family(flux_dir: Path) -> FluxFamily:
    """The tiny FLUX.1 with a rank-4 adapter whose A and B are drawn from a seeded generator (what
    ``record.py`` sent the server)."""
    family = FluxFamily.load(
        str(flux_dir), torch.device("cpu"), torch.float32, FluxFamily.description.Options()
    )
    apply_lora(family, LORA)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in sorted(family.transformer.named_parameters()):
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return family


@pytest.mark.parametrize("name", list(EXCHANGES))
def test_requests_are_built_from_the_plan_as_recorded(tmp_path, flux_dir, name):
    eng, plan = engine(tmp_path, flux_dir, *EXCHANGES[name])
    requests = eng.requests(plan.micro_groups[0], plan.steps)
    assert requests == json.loads((DATA / f"{name}.json").read_text())
    # one request for the prompt's 2 samples; sglang's i-th output draws from seed + i
    (request,) = requests
    assert request["num_outputs_per_prompt"] == 2
    assert request["seed"] == eng.sample_seed(plan.micro_groups[0][0][0], 0)


@pytest.mark.parametrize("name", ["flux_sde", "flux_cps"])
def test_recorded_transitions_map_to_a_batch_that_replays_the_servers_log_probs(tmp_path, flux_dir, name):
    eng, plan = engine(tmp_path, flux_dir, *EXCHANGES[name])
    answers = decode_rollout((DATA / f"{name}.msgpack").read_bytes())
    batch = eng._batch(plan.micro_groups[0], 0, plan.steps, answers)
    steps = plan.steps
    assert batch.x0.shape == (2, 4, SIZE // 2, SIZE // 2) and batch.images.dtype == torch.uint8
    assert batch.traj_x.shape == (2, len(steps), 4, SIZE // 2, SIZE // 2)
    assert torch.equal(
        batch.traj_log_prob, torch.stack([as_tensor(a, "rollout_log_probs") for a in answers])[:, steps]
    )
    assert torch.equal(batch.traj_next[:, 0], batch.traj_x[:, 1])  # a window of consecutive steps
    # diffrl's kernel on the server's own velocity: the server's transitions and log-probs
    kernel = resolve_kernel(eng.spec.sampler)
    family = eng.family
    velocity = torch.stack([as_tensor(a, "rollout_debug_tensors", "rollout_model_outputs") for a in answers])
    for k, i in enumerate(steps):
        v = family.unpack_latents(velocity[:, i], SIZE, SIZE)
        out = kernel.step(
            batch.traj_x[:, k],
            v,
            batch.traj_sigma[:, k],
            batch.traj_sigma_next[:, k],
            noise_level=eng.spec.noise_level,
            sigma_max=eng.sigmas[1].item(),
            prev_sample=batch.traj_next[:, k],
        )
        assert (out.log_prob - batch.traj_log_prob[:, k]).abs().max() < 1e-5
        # diffrl's forward with diffrl's encoding of the prompt: the server's velocity
        ours = family.velocity(batch.traj_x[:, k], batch.traj_sigma[:, k], batch.cond)
        assert (ours - v).abs().max() < 1e-5


def test_final_samples_without_a_trajectory(tmp_path, flux_dir):
    eng, plan = engine(tmp_path, flux_dir, *EXCHANGES["flux_ode"])
    answers = decode_rollout((DATA / "flux_ode.msgpack").read_bytes())
    batch = eng._batch(plan.micro_groups[0], 0, plan.steps, answers)
    assert batch.traj_x is None and batch.traj_log_prob is None
    assert batch.x0.shape == (2, 4, SIZE // 2, SIZE // 2) and torch.isfinite(batch.x0).all()
    # the samples differ: sglang's per-output seeds gave each its own noise
    assert not torch.equal(batch.x0[0], batch.x0[1])


def test_a_wrong_schedule_is_refused(tmp_path, flux_dir):
    eng, plan = engine(tmp_path, flux_dir, *EXCHANGES["flux_sde"])
    answers = decode_rollout((DATA / "flux_sde.msgpack").read_bytes())
    eng.sigmas = eng.sigmas * 0.5
    with pytest.raises(Exception, match="sigmas"):
        eng._batch(plan.micro_groups[0], 0, plan.steps, answers)


def test_the_model_id_comes_from_the_folders_pipeline_class(tmp_path):
    assert default_model_id(tmp_path) is None  # no model_index.json
    (tmp_path / "model_index.json").write_text('{"_class_name": "FluxPipeline"}')
    assert default_model_id(tmp_path) == "FLUX.1-dev"
    (tmp_path / "model_index.json").write_text('{"_class_name": "SomeOtherPipeline"}')
    assert default_model_id(tmp_path) is None
    (tmp_path / "model_index.json").write_text("[not json")
    assert default_model_id(tmp_path) is None


def test_each_server_gets_its_own_internal_ports():
    """sglang's master and scheduler ports default to fixed numbers: two servers starting side by
    side would race for them, so each launch names its own."""
    argv = ServeCommand("sglang", "/m", "FLUX.1-dev", "fp32", []).argv("127.0.0.1", 1234, 2, (4001, 4002))
    assert argv[argv.index("--master-port") + 1] == "4001"
    assert argv[argv.index("--scheduler-port") + 1] == "4002"
    assert argv[argv.index("--port") + 1] == "1234"


def test_server_ports_lie_outside_the_kernels_ephemeral_range():
    """A port the kernel may hand an outgoing connection meanwhile is not given to a server: the
    three are distinct, bindable, between Ray's worker ports and the ephemeral range, and neither
    internal port is the HTTP port + 1 (sglang's broker)."""
    low, _ = ephemeral_ports()
    for _ in range(20):
        port, master, scheduler = server_ports()
        assert len({port, port + 1, master, scheduler}) == 4
        if low - 1 > LISTEN_PORTS_FROM + 100:
            assert all(LISTEN_PORTS_FROM <= p < low - 1 for p in (port, master, scheduler))


FAKE_SGLANG = """#!{python}
import http.server, pathlib, sys
port = int(sys.argv[sys.argv.index("--port") + 1])
tries = pathlib.Path({tries!r})
tries.write_text(tries.read_text() + "x" if tries.exists() else "x")
if len(tries.read_text()) <= {taken}:
    print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {{port}}): "
          "address already in use", flush=True)
    sys.exit(1)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "0"); self.end_headers()
http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


@pytest.mark.parametrize("taken", [1, 2, 3])
def test_a_server_whose_port_was_taken_meanwhile_starts_again_on_another(tmp_path, taken):
    """The CI saw a restarted server stop on "address already in use" (its port, free when drawn,
    was bound by the time the server had loaded). Such a launch is tried again on other ports, three
    times in all; a server that never gets a port is an error naming its log."""
    script = tmp_path / "sglang"
    tries = tmp_path / "tries"
    script.write_text(FAKE_SGLANG.format(python=sys.executable, tries=str(tries), taken=taken))
    script.chmod(0o755)
    command = ServeCommand(str(script), str(tmp_path), "FLUX.1-dev", "fp32", [])
    log = tmp_path / "server.log"
    if taken == LAUNCH_TRIES:
        with pytest.raises(EngineServerError, match="address already in use") as e:
            Server.launch(command, log, 1, timeout_s=30)
        assert str(log) in str(e.value) and tries.read_text() == "x" * LAUNCH_TRIES
        return
    server = Server.launch(command, log, 1, timeout_s=30)
    try:
        assert server.alive() and server.request("GET", "/health", None, timeout_s=5)[0] == 200
        assert tries.read_text() == "x" * (taken + 1)
        ports = [
            line.split("--port ")[1].split()[0] for line in log.read_text().splitlines() if line[:2] == "$ "
        ]
        assert len(ports) == taken + 1 and ports[-1] == str(server.port)
    finally:
        server.stop()
    assert not server.alive()


def test_an_answer_that_breaks_off_reads_as_an_unreachable_server():
    """A server killed mid-answer: fewer bytes than its Content-Length, then the connection closes.
    http.client returns the piece without an error; the client must treat it as a dead server (so
    the engine restarts it), not decode the piece."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer_half() -> None:
        conn, _ = listener.accept()
        request = b""
        while not request.endswith(b"{}"):  # the whole request (its body is "{}"): no reset on close
            request += conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/msgpack\r\nContent-Length: 1000\r\n\r\n"
            + b"x" * 10
        )
        conn.close()

    server = threading.Thread(target=answer_half)
    server.start()
    try:
        with pytest.raises(EngineUnreachable, match="broke off after 10 of 1,000 bytes"):
            Server(f"http://127.0.0.1:{port}").request("POST", "/rollout/generate", {}, timeout_s=10)
    finally:
        server.join()
        listener.close()


def test_the_lora_sync_computes_what_the_server_held_after_set_lora(flux_dir):
    """``flux_lora.json``: the server's ``/get_weights_checksum`` after ``/v1/set_lora`` (dynamic)
    of this adapter, the names its tensor checker accepted with their sha256, and the adapter's
    own. The engine checks a server's first adapter with the first, later ones with the last."""
    recorded = json.loads((DATA / "flux_lora.json").read_text())
    family = lora_family(flux_dir)
    adapter = sampling_adapter(family.transformer)
    state = served_state(family.transformer, adapter, torch.float32)
    # sglang's names: every linear layer wrapped (its weight under base_layer), the adapter beside it
    assert sorted(state) == recorded["names"]
    assert "transformer_blocks.0.attn.to_q.base_layer.weight" in state
    assert (
        "transformer_blocks.0.attn.to_q.lora_A" in state
        and "transformer_blocks.0.norm1.linear.base_layer.bias" in state
    )
    assert {k: tensor_sha256(v) for k, v in adapter.served().items()} == recorded["adapter_sha256"]
    assert state_checksum(state) == recorded["checksum"]
    # a bf16 server holds the base in bf16 and the adapter as sent (float32)
    half = served_state(family.transformer, adapter, torch.bfloat16)
    assert half["proj_out.base_layer.weight"].dtype == torch.bfloat16
    assert half["transformer_blocks.0.attn.to_q.lora_B"].dtype == torch.float32


def test_the_adapter_folder_is_a_diffusers_lora_that_diffusers_reads_back(tmp_path, flux_dir):
    family = lora_family(flux_dir)
    adapter = sampling_adapter(family.transformer)
    folder = adapter.write(tmp_path / "adapter")
    with safe_open(str(folder / "pytorch_lora_weights.safetensors"), "pt") as f:
        keys, meta = set(f.keys()), json.loads(f.metadata()["lora_adapter_metadata"])
    assert keys == {f"transformer.{k}" for k in adapter.layers}
    assert meta["transformer.lora_alpha"] == 8 and meta["transformer.r"] == 4  # sglang reads alpha here
    from diffusers import FluxPipeline

    read = FluxPipeline.lora_state_dict(str(folder))
    read = read[0] if isinstance(read, tuple) else read
    assert set(read) == keys and all(
        torch.equal(read[f"transformer.{k}"], v) for k, v in adapter.layers.items()
    )
    assert adapter.nbytes == sum(v.numel() * 4 for v in adapter.layers.values())


def test_the_adapter_sent_is_the_one_the_transformer_samples_with(flux_dir):
    """DiffusionNFT samples with a second adapter (``old``): that one is sent, under the same names."""
    family = lora_family(flux_dir)
    live = sampling_adapter(family.transformer)
    with warnings.catch_warnings():  # peft warns about a second adapter: here it is the point
        warnings.filterwarnings("ignore", message="Already found a `peft_config`")
        family.transformer.add_adapter(
            PeftLoraConfig(r=LORA.rank, lora_alpha=LORA.alpha, target_modules=family.lora_targets(None)),
            adapter_name="old",
        )
    family.transformer.set_adapter("old")
    old = sampling_adapter(family.transformer)
    assert set(old.layers) == set(live.layers)
    assert not any(torch.equal(old.layers[k], live.layers[k]) for k in live.layers if "lora_A" in k)
    params = dict(family.transformer.named_parameters())
    k = "transformer_blocks.0.attn.to_q.lora_A.weight"
    assert torch.equal(old.layers[k], params[k.replace(".weight", ".old.weight")])


def test_sync_lora_needs_an_adapter_sglang_loads(tmp_path, flux_dir):
    """``sync: lora`` is refused before anything loads without LoRA, or with an alpha sglang refuses
    (its peft_adapter.py: a positive integer); ``auto`` sends the adapter where it can."""
    family = {
        "model.family": "flux",
        "model.path": str(flux_dir),
        "sampling.guidance_scale": 1.0,
        "rollout.engine": "sglang",
    }
    lora = {**family, "rollout.engine_options": "{sync: lora, urls: ['http://127.0.0.1:9']}"}
    with pytest.raises(ConfigError, match=r"sync=lora sends the LoRA adapter, and model.lora is null"):
        family_config(tmp_path, lora, **{"model.lora": "null"})
    with pytest.raises(ConfigError, match=r"integer alpha only, and model.lora.alpha is 2.5.*e.g. 2\)"):
        family_config(tmp_path, lora, **{"model.lora": "{rank: 4, alpha: 2.5}"})
    assert family_config(tmp_path, lora).rollout.engine_options["sync"] == "lora"
    auto = {**family, "rollout.engine_options": "{urls: ['http://127.0.0.1:9']}"}
    for setting, mode in [
        ("{rank: 4, alpha: 8}", "lora"),
        ("{rank: 4, alpha: 2.5}", "merged"),
        ("null", "merged"),
    ]:
        assert sync_mode(family_config(tmp_path, auto, **{"model.lora": setting}), "auto") == mode
