"""sglang-diffusion servers: start one, wait for it, stop it, and the HTTP calls diffrl makes.

The server is sglang's own process (``sglang serve``, in an environment of its own: see
``docs/engines.md``); this module knows its command line and its post-training endpoints
(sglang 0.5.23, ``multimodal_gen/runtime/entrypoints/post_training/``):

- ``POST /rollout/generate``: JSON :class:`RolloutRequest` in, msgpack out, one dict per image;
  tensors as ``{"__tensor__": True, "data": <safetensors bytes holding "t">, "shape", "dtype"}``
  (``post_training/utils.py::_maybe_serialize``);
- ``POST /update_weights_from_disk {"model_path", "target_modules"}``;
- ``POST /get_weights_checksum {"module_names"}`` -> ``{name: sha256}``: sha256 over the module's
  parameters sorted by name, each the name's bytes then the tensor's raw bytes
  (``loader/weight_utils.py::compute_weights_checksum``);
- ``POST /v1/set_lora``, ``GET /v1/list_loras`` (``entrypoints/openai/common_api.py``) and
  ``POST /update_weights_from_tensor_checker`` (``post_training/tensor_update_checker.py``): the
  LoRA sync's (:mod:`diffrl.sampling.sglang_lora`).

Nothing here loads a model: the server does.
"""

from __future__ import annotations

import ctypes
import http.client
import json
import os
import signal
import subprocess
import time
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgpack
import torch
from safetensors.torch import load as load_safetensors

from diffrl.core.errors import DiffrlError
from diffrl.core.parallel import listen_port


class EngineServerError(DiffrlError, RuntimeError):
    """A serving engine that cannot be started or reached, or that answered with an error."""


class PortTaken(EngineServerError):
    """A launched server stopped because a port it was given was bound meanwhile."""


class EngineUnreachable(EngineServerError):
    """The server did not answer (refused, reset, timed out): a restart may cure it."""


def server_ports(host: str = "127.0.0.1") -> tuple[int, int, int]:
    """Free ports for a server: its HTTP port, then its torch.distributed master and scheduler
    ports, none of them the HTTP port + 1: sglang binds its offline-job broker there
    (``ServerArgs.broker_port``), and a master port that lands on it stops the server (measured
    with ``--num-gpus 2``: "Address already in use").

    They are drawn below the kernel's ephemeral range where there is room: a port free now is only
    bound by the server seconds later, once it has loaded, and a port of the ephemeral range can be
    taken in between as the local port of any outgoing connection (Ray's, a reward's): the CI saw a
    restarted server stop on "[Errno 98] ... address already in use". A port drawn here can still be
    taken by another program that binds one explicitly: :meth:`Server.launch` then starts again on
    other ports (:func:`~diffrl.core.parallel.listen_port`)."""
    port = listen_port(host, pair=True)
    master = listen_port(host, avoid=(port, port + 1))
    scheduler = listen_port(host, avoid=(port, port + 1, master))
    return port, master, scheduler


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the server's process, before exec: SIGTERM it when the process that started it dies
    (Linux ``prctl``), so a killed engine leaves no server behind; elsewhere a no-op."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def log_tail(path: Path | None, lines: int = 25) -> str:
    if path is None or not path.exists():
        return ""
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join("    " + line for line in text)


def this_launch_log(path: Path, offset: int) -> str:
    """What one launch wrote to a server log that earlier launches appended to too."""
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


PORT_TAKEN = "address already in use"
"""What a server's log says when one of its ports was bound meanwhile (uvicorn, ZMQ, gloo)."""
LAUNCH_TRIES = 3

DIFFUSERS_FALLBACK = "Falling back to diffusers backend"
"""What sglang logs when it cannot resolve a native pipeline for the model (0.5.23 ``registry.py``)."""


@dataclass
class ServeCommand:
    """How to start one server: ``sglang serve`` with the model folder and diffrl's flags."""

    executable: str
    """The ``sglang`` command of sglang's environment (a path, or a name on PATH)."""
    model_path: str
    model_id: str | None
    precision: str
    """``fp32`` or ``bf16`` for the transformer, text encoders and VAE alike."""
    extra_args: list[str]
    sequence_parallel: int = 1
    """Ranks (GPUs) the server spans, its transformer's attention Ulysses over all of them."""

    def argv(self, host: str, port: int, num_text_encoders: int, internal: tuple[int, int]) -> list[str]:
        """``internal``: the (torch.distributed master, scheduler) ports: sglang's defaults are fixed
        (30005, 5555 + a random 0-100), checked for being free when it starts and bound later, so two
        servers starting side by side (two engines on one host) could both take them; the
        second then dies with EADDRINUSE (seen in CI)."""
        args = [self.executable, "serve", "--model-path", self.model_path]
        if self.model_id:
            args += ["--model-id", self.model_id]
        # --sleep-on-idle: the scheduler otherwise busy-polls a core; the precision flags go
        # together (a fp32 transformer with bf16 encoders fails with a dtype mismatch)
        args += ["--warmup-mode", "off", "--sleep-on-idle", "--host", host, "--port", str(port)]
        args += ["--master-port", str(internal[0]), "--scheduler-port", str(internal[1])]
        args += ["--dit-precision", self.precision, "--vae-precision", self.precision]
        args += ["--text-encoder-precisions", *[self.precision] * num_text_encoders]
        if self.sequence_parallel > 1:  # one server process per rank, the sequence split over all
            n = str(self.sequence_parallel)
            args += ["--num-gpus", n, "--sp-degree", n, "--ulysses-degree", n]
        return args + list(self.extra_args)


class Server:
    """One sglang-diffusion server: launched here (a process group of its own, its log in
    ``log_path``) or given by URL (``process`` None: diffrl neither starts nor stops it)."""

    def __init__(self, url: str, process: subprocess.Popen | None = None, log_path: Path | None = None):
        self.url = url.rstrip("/")
        self.process = process
        self.log_path = log_path
        parsed = urllib.parse.urlsplit(self.url)
        if parsed.scheme != "http" or not parsed.hostname:
            raise EngineServerError(f"an sglang server URL must be http://host:port, got {url!r}")
        self.host, self.port = parsed.hostname, parsed.port or 80

    @classmethod
    def launch(
        cls, command: ServeCommand, log_path: Path, num_text_encoders: int, timeout_s: float
    ) -> Server:
        """Start ``sglang serve`` on free loopback ports and wait for ``/health``; a server that
        stops because one of its ports was taken meanwhile is started again on others (3 tries)."""
        tries = LAUNCH_TRIES
        while True:
            try:
                return cls._launch_once(command, log_path, num_text_encoders, timeout_s)
            except PortTaken:
                tries -= 1
                if tries == 0:
                    raise

    @classmethod
    def _launch_once(
        cls, command: ServeCommand, log_path: Path, num_text_encoders: int, timeout_s: float
    ) -> Server:
        host = "127.0.0.1"
        port, master, scheduler = server_ports(host)
        log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = command.argv(host, port, num_text_encoders, (master, scheduler))
        with open(log_path, "ab") as log:
            written = log.tell()
            log.write(f"$ {' '.join(argv)}\n".encode())
            log.flush()
            try:
                process = subprocess.Popen(
                    argv,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                    preexec_fn=_die_with_parent,
                )
            except OSError as e:
                raise EngineServerError(
                    f"cannot start the sglang server ({argv[0]!r}: {e}); install sglang-diffusion in an "
                    "environment of its own and set rollout.engine_options.command to its 'sglang' "
                    "command (docs/engines.md)"
                ) from e
        server = cls(f"http://{host}:{port}", process, log_path)
        try:
            server.wait_healthy(timeout_s)
            if DIFFUSERS_FALLBACK in log_path.read_text(errors="replace"):
                raise EngineServerError(
                    f"sglang did not recognise the model in {command.model_path} and serves it with its "
                    "diffusers backend, which cannot draw rollouts (no /rollout/generate); set "
                    "rollout.engine_options.model_id to the model's name as sglang knows it (e.g. "
                    f"FLUX.1-dev; was {command.model_id!r}). Its log: {log_path}"
                )
        except EngineServerError as e:
            server.stop()
            if PORT_TAKEN in this_launch_log(log_path, written).lower():
                raise PortTaken(str(e)) from e
            raise
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is None or self.process.poll() is None

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise EngineServerError(
                    f"the sglang server exited with code {self.process.returncode} before it was "
                    f"ready; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}"
                )
            try:
                status, _, _ = self.request("GET", "/health", None, timeout_s=5.0)
                if status == 200:
                    return
            except EngineUnreachable:
                pass
            if time.monotonic() > deadline:
                raise EngineServerError(
                    f"the sglang server at {self.url} was not healthy within {timeout_s:.0f} s "
                    f"(rollout.engine_options.start_timeout_s)"
                    + (
                        f"; the end of its log ({self.log_path}):\n{log_tail(self.log_path)}"
                        if self.log_path
                        else ""
                    )
                )
            time.sleep(0.5)

    def stop(self, grace_s: float = 10.0) -> None:
        """Stop a server launched here: SIGTERM to its process group, SIGKILL after ``grace_s``."""
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        try:  # the scheduler it spawned is in the same group: make sure none outlives it
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # ---- HTTP ------------------------------------------------------------------------------------
    def request(
        self, method: str, path: str, body: dict | None, timeout_s: float, max_bytes: int = 1 << 30
    ) -> tuple[int, bytes, str]:
        """``(status, body, content type)``; :class:`EngineUnreachable` when the server does not
        answer, :class:`EngineServerError` when its answer exceeds ``max_bytes``."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            length = resp.getheader("Content-Length")
            if length is not None and int(length) > max_bytes:
                raise EngineServerError(
                    f"{path}: the server's answer is {int(length):,} bytes, over the "
                    f"{max_bytes:,} allowed (rollout.engine_options.max_response_mb)"
                )
            payload = resp.read(max_bytes + 1)
            if len(payload) > max_bytes:
                raise EngineServerError(f"{path}: the server's answer exceeds {max_bytes:,} bytes")
            if length is not None and len(payload) < int(length):
                # http.client's read(amt) returns what came before the connection closed, without
                # IncompleteRead: a server killed mid-answer (seen in CI as undecodable msgpack)
                raise EngineUnreachable(
                    f"{self.url}{path}: the answer broke off after {len(payload):,} of {int(length):,} bytes"
                )
            return resp.status, payload, resp.getheader("Content-Type") or ""
        except (OSError, http.client.HTTPException) as e:  # refused, reset, timed out
            raise EngineUnreachable(f"{self.url}{path}: {type(e).__name__}: {e}") from e
        finally:
            conn.close()

    def post(self, path: str, body: dict, timeout_s: float, max_bytes: int = 1 << 30) -> bytes:
        status, payload, _ = self.request("POST", path, body, timeout_s, max_bytes)
        if status != 200:
            raise EngineServerError(
                f"{self.url}{path} answered {status}: {payload[:500].decode(errors='replace')}"
            )
        return payload

    def generate(self, request: dict[str, Any], timeout_s: float, max_bytes: int) -> list[dict[str, Any]]:
        """``POST /rollout/generate``: one decoded dict per image (tensors as tensors)."""
        payload = self.post("/rollout/generate", request, timeout_s, max_bytes)
        try:
            return decode_rollout(payload)
        except Exception as e:
            if not self.alive():  # it died while answering: what came is a piece of the answer
                raise EngineUnreachable(f"{self.url}: the server died while answering ({e})") from e
            raise

    def update_weights_from_disk(self, folder: Path, timeout_s: float) -> None:
        payload = self.post(
            "/update_weights_from_disk",
            {"model_path": str(folder), "target_modules": ["transformer"]},
            timeout_s,
        )
        answer = json.loads(payload)
        if not answer.get("success", False):
            raise EngineServerError(
                f"the sglang server refused the weights in {folder}: {answer.get('message')}"
            )

    def weights_checksum(self, module: str, timeout_s: float) -> str:
        answer = json.loads(self.post("/get_weights_checksum", {"module_names": [module]}, timeout_s))
        return str(answer.get(module, answer))

    def set_lora(self, folder: Path, nickname: str, target: str, timeout_s: float) -> None:
        """``POST /v1/set_lora``: the diffusers-format adapter in ``folder`` on ``target``, applied
        unmerged (``merge_mode: dynamic``) at strength 1; alpha from the file's metadata."""
        body = {
            "lora_nickname": nickname,
            "lora_path": str(folder),
            "target": target,
            "strength": 1.0,
            "merge_mode": "dynamic",
        }
        self.post("/v1/set_lora", body, timeout_s)

    def lora_status(self, timeout_s: float) -> dict[str, Any]:
        """``GET /v1/list_loras``: ``{"loaded_adapters": [...], "active": {module: [{"nickname",
        "path", "mode", "strength", ...}]}}``."""
        status, payload, _ = self.request("GET", "/v1/list_loras", None, timeout_s)
        if status != 200:
            raise EngineServerError(f"{self.url}/v1/list_loras answered {status}: {payload[:500]!r}")
        return json.loads(payload)

    def check_tensors(self, module: str, expected: dict[str, str], timeout_s: float) -> tuple[bool, str]:
        """``POST /update_weights_from_tensor_checker``: whether ``module`` holds a tensor of each
        name with that sha256 (dtype, shape, bytes), and the server's message (the first names
        missing or different)."""
        body = {"target_module": module, "expected_named_tensors_sha256": expected}
        status, payload, _ = self.request("POST", "/update_weights_from_tensor_checker", body, timeout_s)
        try:
            answer = json.loads(payload)
        except ValueError:
            answer = {}
        if status not in (200, 400) or not isinstance(answer, dict):
            raise EngineServerError(
                f"{self.url}/update_weights_from_tensor_checker answered {status}: {payload[:500]!r}"
            )
        return bool(answer.get("success")), str(answer.get("message"))


def decode_tensors(obj: Any) -> Any:
    """msgpack's plain values with every serialized tensor turned back into a tensor."""
    if isinstance(obj, dict):
        if obj.get("__tensor__"):
            return load_safetensors(obj["data"])["t"]
        return {k: decode_tensors(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [decode_tensors(v) for v in obj]
    return obj


def decode_rollout(payload: bytes) -> list[dict[str, Any]]:
    try:
        items = msgpack.unpackb(payload, raw=False)
    except (ValueError, msgpack.UnpackException) as e:
        raise EngineServerError(f"/rollout/generate: the answer is not msgpack ({e})") from e
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise EngineServerError("/rollout/generate: the answer is not a list of images")
    return [decode_tensors(i) for i in items]


def as_tensor(item: dict[str, Any], *path: str) -> torch.Tensor:
    """``item[path[0]][path[1]]...`` as a tensor, or a clear error naming what is missing."""
    value: Any = item
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    if not isinstance(value, torch.Tensor):
        raise EngineServerError(f"/rollout/generate: the answer has no tensor {'.'.join(path)}")
    return value
