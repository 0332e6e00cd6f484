"""Serve any diffrl reward over HTTP: ``diffrl serve-reward``, and the ``remote`` reward's far end.

A reward model can then live on a machine (or GPU) of its own, shared by several trainers; the
trainer's side is :class:`~diffrl.rewards.remote.RemoteReward`. The server is a FastAPI app run by
uvicorn; the reward is built as a recipe builds it (:func:`~diffrl.rewards.base.build_reward`: a
registry name or a user's dotted path, with its params checked first).

Wire format (any language can be a client)
-------------------------------------------
``POST /score``, body ``application/msgpack``, a map::

    format    "png" | "raw"
    images    png: an array of B PNG files (bin), 8-bit RGB, all of one size
                   (clips: B*F PNGs, clip by clip, with frames = F)
              raw: one bin of B*3*H*W uint8 bytes, C-order (B, 3, H, W)
                   (clips: B*3*F*H*W bytes, (B, 3, F, H, W))
    shape     raw only: [B, 3, H, W] or [B, 3, F, H, W]
    frames    png only, optional: F, the frames of each clip
    prompts   array of B str
    metadata  array of B maps (optional: B empty maps)
    audio     optional: one bin of B*C*S float16 little-endian samples in [-1, 1], C-order
              (B, C, S): each clip's sound
    audio_shape, sample_rate   with audio: [B, C, S] and the rate in Hz
    sources   optional: an array of B PNG files (bin) or nil: each sample's source image (an
              editing family's), which the reward gets as ``metadata[i]["source_image"]``
              (uint8 ``(3, H, W)``, as in the trainer)

A server whose reward hears (``Reward.audio``, e.g. ``clap``) gets clips whole with their sound
(the ``remote`` reward with ``audio: true`` sends them so); an image reward given clips scores their
frames and each clip gets the mean, as in the trainer.

Optional header ``X-Timeout-S``: how many seconds this attempt of the client waits (a header, not
a body field, so that a retry resends the same body with what is left): a request still queued
when that has passed is not scored (HTTP 504), and the reward call gets what is left of it.

The reward gets ``uint8 / 255`` as float32 ``(B, 3, H, W)``: exactly what it gets in the trainer
(the rollout keeps uint8 images), so remote scores are bit-identical to in-process ones.

Answer 200, ``application/msgpack``: ``{"scores": [B floats]}`` (float64). A NaN score is sent as
NaN (msgpack carries it, JSON could not): the client counts it as a failed sample, as it would
in-process. Every error is JSON ``{"detail": "..."}`` (FastAPI's shape), with status:

- 400: the body is not such a map (the detail says which field is wrong); 401: the token is
  missing or wrong; 413: the body is over ``--max-request-mb`` (refused from ``Content-Length``,
  or as soon as the streamed bytes pass the limit, never read whole);
- 500: the reward raised, or returned the wrong shape; the detail names the reward and the error;
- 504: the client's ``X-Timeout-S`` passed before the reward finished (or started).

``GET /health``: JSON ``{"status": "ok", "reward": NAME, "token_required": bool,
"max_request_mb": N, "audio": bool}`` (``audio``: the reward hears). It needs no token, so that a load balancer's or orchestrator's probe (which
seldom carries secrets) can use it; it tells nothing a caller could score with, never runs the
reward, and ``/score`` is what the token protects.

Auth: with a token (``--token-file`` / ``--token-env``) every ``/score`` must carry
``Authorization: Bearer <token>`` (compared with :func:`hmac.compare_digest`). Without one the
server binds only a loopback address: anything else is refused at start.

Concurrency: requests from several trainers are read and decoded concurrently (decoding on
worker threads), but the reward runs one batch at a time, first come first served, on a single
worker thread (a reward need not be thread-safe nor fit on its GPU twice); the event loop thread
never decodes nor scores, so it keeps accepting, refusing (401, 413) and answering /health while
the reward works. A request carries no deadline of its own without ``X-Timeout-S`` (the
``remote`` client always sends one): a reward that hangs on such a request holds the queue.
"""

from __future__ import annotations

import asyncio
import hmac
import io
import ipaddress
import logging
import math
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import msgpack
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from PIL import Image

from diffrl.config import RewardConfig
from diffrl.registry import RegistryError
from diffrl.rewards.base import Reward, RewardError, build_reward, param_name_problems, submit_scores
from diffrl.rewards.registry import REWARDS
from diffrl.rewards.workers import DeadlineExceeded, seconds_left
from diffrl.rollout import Audio

LOG = logging.getLogger(__name__)  # warnings reach stderr even unconfigured: the operator sees failures
MSGPACK = "application/msgpack"
DEFAULT_MAX_REQUEST_MB = 64.0


class ServerError(RewardError):
    """A reward server that cannot start: bad reward, params, token or address."""


# ------------------------------------------------------------------------------------------------
# Start-up checks
# ------------------------------------------------------------------------------------------------


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def bind_problem(host: str | None, token: str | None) -> str | None:
    """Why the server must not bind ``host`` (None when it may); ``host=None``: a Ray node's
    address (:mod:`diffrl.distributed.ray.reward_server`), never loopback."""
    if token is not None or (host is not None and is_loopback(host)):
        return None
    where = (
        f"--host {host} is not a loopback address"
        if host
        else "without --host it binds its Ray node's address"
    )
    return (
        f"{where}, and the server has no token: anyone who can reach it could use the reward. Give a "
        "token (--token-file FILE or --token-env VAR; clients send it from their token_env), or bind 127.0.0.1"
    )


def build_served_reward(name: str, params: dict[str, Any]) -> Reward:
    """The reward ``name`` with ``params``, checked as preflight checks a recipe's rewards (all
    problems at once), then built. Raises :class:`ServerError`, also for a video reward (the
    ``remote`` reward sends a video's frames, one image each)."""
    try:
        obj = REWARDS.resolve(name)
    except RegistryError as e:
        raise ServerError(f"--reward: {e}") from e
    if not isinstance(params, dict):
        raise ServerError(f"--params must be a mapping of name: value, got {params!r}")
    problems = param_name_problems(obj, params)
    if not problems and isinstance(obj, type) and issubclass(obj, Reward):
        problems = obj.param_problems(params, True)
    if problems:
        raise ServerError(f"reward {name!r} --params: " + "; ".join(problems))
    try:
        reward = build_reward(RewardConfig(name=name, params=params))
    except RegistryError as e:
        raise ServerError(str(e)) from e
    if reward.video:
        reward.close()
        raise ServerError(
            f"reward {name!r} scores whole videos (video = True); a reward server serves image rewards "
            "(the remote reward sends a video's frames, one image each, and averages their scores)"
        )
    reward.start()  # its workers start while the server comes up, not at the first request
    return reward


# ------------------------------------------------------------------------------------------------
# Requests
# ------------------------------------------------------------------------------------------------


@dataclass
class ScoreRequest:
    """A decoded ``/score`` body: ``images (B, 3, H, W)`` or clips ``(B, 3, F, H, W)`` uint8;
    ``audio`` their sound (float16 ``(B, C, S)``), if sent; ``timeout_s``: its ``X-Timeout-S``
    header, counted from ``received`` (``time.monotonic()``)."""

    images: torch.Tensor
    prompts: list[str]
    metadata: list[dict[str, Any]]
    audio: Audio | None = None
    timeout_s: float | None = None
    received: float = field(default_factory=time.monotonic)


def _bad(detail: str) -> HTTPException:
    return HTTPException(400, detail=f"bad request: {detail}")


def decode_png(data: Any, i: int) -> np.ndarray:
    if not isinstance(data, bytes):
        raise _bad(f"images[{i}] must be PNG bytes (msgpack bin), got {type(data).__name__}")
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format != "PNG" or img.mode != "RGB":
                raise _bad(f"images[{i}] is a {img.format} {img.mode} image; send 8-bit RGB PNGs")
            return np.asarray(img)  # (H, W, 3) uint8
    except OSError as e:
        raise _bad(f"images[{i}] is not a readable PNG ({e})") from e


def request_timeout(request: Request) -> float | None:
    """The ``X-Timeout-S`` header: seconds the client waits (None: no header)."""
    value = request.headers.get("x-timeout-s")
    if value is None:
        return None
    try:
        timeout = float(value)
    except ValueError:
        timeout = math.nan
    if not timeout > 0:  # NaN fails too
        raise _bad(f"X-Timeout-S must be a number of seconds > 0, got {value!r}")
    return timeout


def decode_request(body: bytes) -> ScoreRequest:
    """The msgpack body -> :class:`ScoreRequest`; :class:`HTTPException` 400 on anything else."""
    try:
        msg = msgpack.unpackb(body, raw=False)
    except Exception as e:  # msgpack raises several unrelated types on bad input
        raise _bad(f"the body is not msgpack ({type(e).__name__}: {e})") from e
    if not isinstance(msg, dict):
        raise _bad(f"the body must be a msgpack map, got {type(msg).__name__}")
    fmt, images = msg.get("format"), msg.get("images")
    if fmt == "png":
        if not isinstance(images, list) or not images:
            raise _bad("format png: images must be a non-empty array of PNG files")
        frames = msg.get("frames")
        if frames is not None and not (isinstance(frames, int) and frames > 0 and len(images) % frames == 0):
            raise _bad(f"frames must be a positive int dividing the {len(images)} PNGs, got {frames!r}")
        arrays = [decode_png(d, i) for i, d in enumerate(images)]
        if len({a.shape for a in arrays}) > 1:
            raise _bad(f"images differ in size: {sorted({a.shape[:2] for a in arrays})}; send one size")
        pixels = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
        if frames is not None:  # (B * F, 3, H, W), clip by clip -> (B, 3, F, H, W)
            pixels = pixels.view(-1, frames, *pixels.shape[1:]).transpose(1, 2).contiguous()
    elif fmt == "raw":
        shape = msg.get("shape")
        if not (
            isinstance(shape, list)
            and len(shape) in (4, 5)
            and all(isinstance(s, int) and s > 0 for s in shape)
        ):
            raise _bad(
                f"format raw needs shape [B, 3, H, W] or [B, 3, F, H, W] of positive ints, got {shape!r}"
            )
        if shape[1] != 3:
            raise _bad(f"shape {shape}: images must have 3 channels (RGB)")
        if not isinstance(images, bytes) or len(images) != math.prod(shape):
            got = len(images) if isinstance(images, bytes) else type(images).__name__
            raise _bad(f"format raw: images must be {math.prod(shape)} bytes for shape {shape}, got {got}")
        pixels = torch.frombuffer(bytearray(images), dtype=torch.uint8).view(shape)
    else:
        raise _bad(f"format must be 'png' or 'raw', got {fmt!r}")
    b = pixels.shape[0]
    prompts = msg.get("prompts")
    if not isinstance(prompts, list) or len(prompts) != b or not all(isinstance(p, str) for p in prompts):
        raise _bad(f"prompts must be an array of {b} strings (one per image)")
    metadata = msg.get("metadata")
    metadata = [{} for _ in range(b)] if metadata is None else metadata
    if not isinstance(metadata, list) or len(metadata) != b or not all(isinstance(m, dict) for m in metadata):
        raise _bad(f"metadata must be an array of {b} maps (one per image)")
    return ScoreRequest(pixels, prompts, decode_sources(msg, metadata), decode_audio(msg, b))


def decode_sources(msg: dict[str, Any], metadata: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``metadata`` with the body's optional ``sources`` (PNGs or nil, one per sample) put back
    as ``"source_image"``: uint8 ``(3, H, W)``, as the trainer's rewards get it."""
    sources = msg.get("sources")
    if sources is None:
        return metadata
    if not isinstance(sources, list) or len(sources) != len(metadata):
        raise _bad(f"sources must be an array of {len(metadata)} PNG files or nils (one per image)")
    out = []
    for i, (meta, data) in enumerate(zip(metadata, sources)):
        if data is not None:
            try:
                pixels = decode_png(data, i)
            except HTTPException as e:
                raise _bad(str(e.detail).removeprefix("bad request: ").replace("images[", "sources[")) from e
            meta = {**meta, "source_image": torch.from_numpy(pixels.copy()).permute(2, 0, 1).contiguous()}
        out.append(meta)
    return out


def decode_audio(msg: dict[str, Any], b: int) -> Audio | None:
    """The body's optional ``audio`` -> float16 ``Audio (B, C, S)``."""
    data = msg.get("audio")
    if data is None:
        return None
    shape, rate = msg.get("audio_shape"), msg.get("sample_rate")
    if (
        not (isinstance(shape, list) and len(shape) == 3 and all(isinstance(s, int) and s > 0 for s in shape))
        or shape[0] != b
    ):
        raise _bad(f"audio_shape must be [{b}, C, S] of positive ints (one clip per prompt), got {shape!r}")
    if not isinstance(rate, int) or isinstance(rate, bool) or rate <= 0:
        raise _bad(f"sample_rate must be a positive int (Hz), got {rate!r}")
    if not isinstance(data, bytes) or len(data) != 2 * math.prod(shape):
        got = len(data) if isinstance(data, bytes) else type(data).__name__
        raise _bad(f"audio must be {2 * math.prod(shape)} bytes of float16 for shape {shape}, got {got}")
    wave = torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float16).reshape(shape))
    if not torch.isfinite(wave).all():
        raise _bad("audio holds NaN or infinite samples")
    return Audio(wave, rate)


# ------------------------------------------------------------------------------------------------
# The app
# ------------------------------------------------------------------------------------------------


class _Expired(Exception):
    """The client's deadline passed before its request was scored."""


def score_request(reward: Reward, name: str, req: ScoreRequest) -> list[float]:
    """Score one request (on the worker thread): ``(B,)`` scores as floats, NaN kept."""
    deadline = None if req.timeout_s is None else req.received + req.timeout_s
    left = seconds_left(deadline)
    if left == 0.0:
        raise _Expired(f"the client's X-Timeout-S={req.timeout_s:g} passed while the request was queued")
    images = req.images.float() / 255.0  # what RewardSet.submit hands a reward in the trainer
    audio = req.audio.float() if req.audio is not None and reward.audio else None
    try:
        scores = submit_scores(reward, images, req.prompts, req.metadata, left, audio).result()
    except DeadlineExceeded as e:
        raise _Expired(
            f"reward {name!r} did not finish within the client's X-Timeout-S={req.timeout_s:g}"
        ) from e
    except Exception as e:
        raise RewardError(f"reward {name!r} raised {type(e).__name__}: {e}") from e
    b = len(req.prompts)
    if scores.shape != (b,):
        raise RewardError(
            f"reward {name!r} returned shape {tuple(scores.shape)} for {b} images, expected ({b},)"
        )
    return [float(s) for s in scores.double()]


async def read_limited(request: Request, limit: int) -> bytes:
    """The body, or 413 as soon as it is known to pass ``limit`` bytes (from Content-Length, or
    while it streams in: chunked bodies have no length)."""
    mb = limit / 2**20
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise _bad(f"Content-Length {length!r} is not a number")
        if int(length) > limit:
            raise HTTPException(
                413,
                detail=f"request of {int(length) / 2**20:.1f} MB is over this server's --max-request-mb {mb:g}",
            )
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HTTPException(413, detail=f"request is over this server's --max-request-mb {mb:g}")
        parts.append(chunk)
    return b"".join(parts)


def create_app(
    reward: Reward, name: str, token: str | None = None, max_request_mb: float = DEFAULT_MAX_REQUEST_MB
) -> FastAPI:
    """The FastAPI app serving ``reward`` (called ``name`` in answers and errors)."""
    app = FastAPI(title=f"diffrl reward {name}", docs_url=None, redoc_url=None, openapi_url=None)
    worker = ThreadPoolExecutor(
        max_workers=1, thread_name_prefix="reward-server"
    )  # one batch at a time, FIFO
    limit = int(max_request_mb * 2**20)
    expected = None if token is None else f"Bearer {token}".encode()
    app.state.worker = worker

    def authorize(request: Request) -> None:
        if expected is None:
            return
        got = request.headers.get("authorization")
        if got is None:
            raise HTTPException(
                401,
                detail="token missing: this server needs 'Authorization: Bearer <token>'",
                headers={"WWW-Authenticate": "Bearer"},
            )
        if not hmac.compare_digest(got.encode(), expected):
            raise HTTPException(
                401, detail="token wrong: the server refused it", headers={"WWW-Authenticate": "Bearer"}
            )

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {
            "status": "ok",
            "reward": name,
            "token_required": token is not None,
            "max_request_mb": max_request_mb,
            "audio": bool(reward.audio),
        }

    @app.post("/score")
    async def score(request: Request) -> Response:
        authorize(request)
        received, timeout = time.monotonic(), request_timeout(request)
        body = await read_limited(request, limit)
        req = await asyncio.to_thread(decode_request, body)  # PNG decoding: off the loop thread
        req.timeout_s, req.received = timeout, received
        if reward.audio and req.audio is None:
            raise _bad(
                f"reward {name!r} scores sound and the request has none; send audio (the remote reward: "
                "audio: true)"
            )
        try:
            scores = await asyncio.get_running_loop().run_in_executor(
                worker, score_request, reward, name, req
            )
        except _Expired as e:
            LOG.warning("HTTP 504: %s", e)
            raise HTTPException(504, detail=str(e)) from e
        except RewardError as e:
            LOG.warning("HTTP 500: %s", e)
            raise HTTPException(500, detail=str(e)) from e
        return Response(msgpack.packb({"scores": scores}), media_type=MSGPACK)

    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (``port=0``: a free one), not yet listening."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as e:
        sock.close()
        raise ServerError(
            f"cannot listen on {host}:{port}: {e.strerror or e}; pick another --port or --host"
        ) from e
    return sock


class RewardServer:
    """``reward`` served at ``http://host:port`` (``port=0``: a free one; :attr:`url` tells).

    The socket is bound here, so the URL is known before serving starts; :meth:`run` serves in
    this thread until stopped (SIGINT/SIGTERM in the main thread), :meth:`start` in a thread of
    its own (tests, the Ray actor).
    """

    def __init__(
        self,
        reward: Reward,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
        log_level: str = "warning",
        sock: socket.socket | None = None,
    ):
        problem = bind_problem(host, token)
        if problem:
            raise ServerError(problem)
        if not max_request_mb > 0:
            raise ServerError(f"--max-request-mb must be > 0, got {max_request_mb}")
        self.reward, self.name, self.host = reward, name, host
        self.sock = bind_socket(host, port) if sock is None else sock
        self.port = self.sock.getsockname()[1]
        self.app = create_app(reward, name, token, max_request_mb)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level, access_log=False))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host.strip('[]')}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def run(self) -> None:
        try:
            self.server.run(sockets=[self.sock])
        finally:
            self.close()

    def start(self, timeout_s: float = 30.0) -> RewardServer:
        """Serve on a daemon thread; return once it accepts connections."""
        self._thread = threading.Thread(target=self.run, name=f"reward-server-{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ServerError(f"reward server {self.url} did not start within {timeout_s:g} s")
            time.sleep(0.01)
        return self

    def when_started(self, fn: Callable[[RewardServer], None]) -> None:
        """Call ``fn(self)`` once the server accepts connections (from :meth:`run`'s side thread)."""
        while not self.server.started and not self.server.should_exit:
            time.sleep(0.01)
        if self.server.started:
            fn(self)

    def stop(self, timeout_s: float = 10.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout_s)

    def close(self) -> None:
        self.app.state.worker.shutdown(wait=False, cancel_futures=True)
        self.reward.close()
        if (calls := self.reward.__dict__.get("_calls")) is not None:
            calls.close()
        self.sock.close()


def serve(
    name: str,
    params: dict[str, Any],
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    max_request_mb: float = DEFAULT_MAX_REQUEST_MB,
    on_ready: Callable[[RewardServer], None] | None = None,
) -> None:
    """Build the reward ``name`` and serve it until SIGINT/SIGTERM (what ``diffrl serve-reward``
    runs). The address is checked before the reward loads (a model may take minutes)."""
    problem = bind_problem(host, token)
    if problem:
        raise ServerError(problem)
    sock = bind_socket(host, port)  # before the reward loads: a busy port fails in a second
    try:
        reward = build_served_reward(name, params)
    except BaseException:
        sock.close()
        raise
    server = RewardServer(reward, name, host, port, token, max_request_mb, sock=sock)
    if on_ready is not None:
        threading.Thread(target=server.when_started, args=(on_ready,), daemon=True).start()
    server.run()
