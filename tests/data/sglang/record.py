"""Record ``/rollout/generate`` exchanges of a real sglang-diffusion server for the contract test
(``tests/unit/sampling/test_sglang.py``): the requests diffrl's engine builds for one micro-group
of 2 samples of one prompt (sde, cps, and ode without a trajectory) on the tiny random FLUX.1 of
``tests/integration/test_flux.py``, and the server's msgpack answers, stored here.

    DIFFRL_SGLANG=$(.ci/sglang-env) python tests/data/sglang/record.py

Run it again when sglang's pin changes (``constraints/sglang.txt``)."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from diffrl.sampling.sglang_server import ServeCommand, Server  # noqa: E402
from tests.unit.sampling.test_sglang import EXCHANGES, engine  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "flux"
        from tests.integration.test_flux import write_tiny_flux

        write_tiny_flux(folder)
        command = ServeCommand(
            os.environ.get("DIFFRL_SGLANG", "sglang"), str(folder), "FLUX.1-dev", "fp32", []
        )
        server = Server.launch(command, Path(tmp) / "server.log", 2, 300)
        try:
            for name, (algorithm, debug) in EXCHANGES.items():
                eng, plan = engine(Path(tmp) / name, folder, algorithm, debug)
                requests = eng.requests(plan.micro_groups[0], plan.steps)
                (request,) = requests  # one prompt's 2 samples: one request
                answer = server.post("/rollout/generate", request, 120)
                (HERE / f"{name}.json").write_text(json.dumps(requests, indent=1) + "\n")
                (HERE / f"{name}.msgpack").write_bytes(answer)
                print(name, len(answer), "bytes")
        finally:
            server.stop()


if __name__ == "__main__":
    main()
