"""Record exchanges of a real sglang-diffusion server for the contract test
(``tests/unit/sampling/test_sglang.py``) on the tiny random FLUX.1 of
``tests/integration/test_flux.py``:

- ``/rollout/generate``: the requests diffrl's engine builds for one micro-group of 2 samples of one
  prompt (sde, cps, and ode without a trajectory), and the server's msgpack answers;
- ``flux_lora.json``: after ``/v1/set_lora`` of the test's seeded adapter (the LoRA sync's
  folder), the server's ``/get_weights_checksum``, the names of its transformer's tensors (those
  its ``/update_weights_from_tensor_checker`` accepted with diffrl's sha256 of each) and the
  adapter tensors' sha256. Recorded last: the adapter stays on the server.

    DIFFRL_SGLANG=$(.ci/sglang-env) python tests/data/sglang/record.py        # all
    DIFFRL_SGLANG=$(.ci/sglang-env) python tests/data/sglang/record.py lora   # flux_lora.json only

Run it again when sglang's pin changes (``constraints/sglang.txt``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import torch  # noqa: E402

from diffrl.core.parallel import state_checksum  # noqa: E402
from diffrl.sampling.sglang_lora import NICKNAME, TARGET, sampling_adapter, served_state, tensor_sha256  # noqa: E402
from diffrl.sampling.sglang_server import ServeCommand, Server  # noqa: E402
from tests.unit.sampling.test_sglang import EXCHANGES, LORA, engine, lora_family  # noqa: E402


def record_lora(server: Server, folder: Path, tmp: Path) -> None:
    family = lora_family(folder)
    adapter = sampling_adapter(family.transformer)
    server.set_lora(adapter.write(tmp / "adapter"), NICKNAME, TARGET, 120)
    state = served_state(family.transformer, adapter, torch.float32)
    held = server.weights_checksum(TARGET, 120)
    ok, message = server.check_tensors(TARGET, {k: tensor_sha256(v) for k, v in state.items()}, 120)
    if not ok or held != state_checksum(state):
        raise SystemExit(f"the server's transformer is not diffrl's served_state: {message}")
    record = {
        "lora": {"rank": LORA.rank, "alpha": LORA.alpha},
        "checksum": held,
        "checker": message,
        "names": sorted(state),
        "adapter_sha256": {k: tensor_sha256(v) for k, v in adapter.served().items()},
    }
    (HERE / "flux_lora.json").write_text(json.dumps(record, indent=1) + "\n")
    print("flux_lora", held)


def main() -> None:
    only_lora = sys.argv[1:] == ["lora"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "flux"
        from tests.integration.test_flux import write_tiny_flux

        write_tiny_flux(folder)
        command = ServeCommand(
            os.environ.get("DIFFRL_SGLANG", "sglang"), str(folder), "FLUX.1-dev", "fp32", []
        )
        server = Server.launch(command, Path(tmp) / "server.log", 2, 300)
        try:
            for name, (algorithm, debug) in [] if only_lora else EXCHANGES.items():
                eng, plan = engine(Path(tmp) / name, folder, algorithm, debug)
                requests = eng.requests(plan.micro_groups[0], plan.steps)
                (request,) = requests  # one prompt's 2 samples: one request
                answer = server.post("/rollout/generate", request, 120)
                (HERE / f"{name}.json").write_text(json.dumps(requests, indent=1) + "\n")
                (HERE / f"{name}.msgpack").write_bytes(answer)
                print(name, len(answer), "bytes")
            record_lora(server, folder, Path(tmp))
        finally:
            server.stop()


if __name__ == "__main__":
    main()
