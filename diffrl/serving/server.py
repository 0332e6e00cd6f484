"""Serve any diffrl reward over HTTP: ``diffrl serve-reward``, and the ``remote`` reward's far end.

A reward model can then live on a machine (or GPU) of its own, shared by several trainers; the
trainer's side is :class:`~diffrl.rewards.remote.RemoteReward`. The server is a FastAPI app run by
uvicorn; the reward is built as a recipe builds it (:func:`~diffrl.rewards.base.build_reward`: a
registry name or a user's dotted path, with its params checked first).

Peers' protocols: ``--protocol flow_factory``, ``verl_omni``, ``flow_grpo`` (or
``verl_omni_json``) answers Flow-Factory's JSON, verl-omni's or flow_grpo's pickled contract
instead (:mod:`diffrl.transport.protocols`: their paths, fields and answers) with the same limits,
token and deadlines; their bodies are read into the fields below, bounded before parsing and
decoding, and their JPEGs' sizes read from their frame headers before any is decoded. A pickle is
read only through :mod:`diffrl.transport.pickled`'s restricted unpickler, and only on the two
pickle protocols (on the others it is a 415). ``/health`` then also says ``"protocol"``.

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
    audio_shape, sample_rate   with audio: [B, C, S] and the rate in Hz (4000 to 384000)
    sources   optional: an array of B PNG files (bin) or nil: each sample's source image (an
              editing family's), which the reward gets as ``metadata[i]["source_image"]``
              (uint8 ``(3, H, W)``, as in the trainer)

No other field: an unknown one (a typo would be ignored silently) and one that does not come
with the rest (``shape`` in a PNG body, ``frames`` in a raw one, ``audio_shape`` without
``audio``) are a 400 naming it. A PNG is a still one (an animated PNG is a 400: it would be scored
on its first frame) of at most 64 chunks plus one per KB. ``metadata`` holds strings, numbers, bools, nil, bytes, arrays and maps,
nested at most :data:`MAX_METADATA_DEPTH` deep.

A server whose reward hears (``Reward.audio``, e.g. ``clap``) gets clips whole with their sound
(the ``remote`` reward with ``audio: true`` sends them so); an image reward given clips scores their
frames and each clip gets the mean, as in the trainer.

Optional header ``X-Timeout-S``: how many seconds this attempt of the client waits (a header, not
a body field, so that a retry resends the same body with what is left): a decimal number of seconds
(``12`` or ``12.5``; no sign, exponent, ``inf`` or ``nan``), > 0 and at most the server's
``max_timeout_s`` (default 3600; a request without the header gets that maximum). Counted from
when the request's head arrived: a request still waiting (for a slot, or queued) when it has
passed is not scored (HTTP 504), and the reward call gets what is left of it.

The reward gets ``uint8 / 255`` as float32 ``(B, 3, H, W)``: exactly what it gets in the trainer
(the rollout keeps uint8 images), so remote scores are bit-identical to in-process ones.

Answer 200, ``application/msgpack``: ``{"scores": [B floats]}`` (float64). A NaN score is sent as
NaN (msgpack carries it, JSON could not): the client counts it as a failed sample, as it would
in-process. Every error is JSON ``{"detail": "..."}`` (FastAPI's shape), with status:

- 400: the body is not such a map (the detail says which field is wrong), an image is not an
  8-bit RGB still PNG or is more than ``max_aspect_ratio`` times longer than wide (or wider than
  long), ``X-Timeout-S`` is malformed or out of range, a header of :data:`SINGLE_HEADERS` comes
  twice, or the HTTP itself is malformed;
- 401: the token is missing or wrong;
- 408: the request's head (``head_timeout_s``, default 10 s from the connection or the previous
  answer) or body (``body_timeout_s``, default 60 s, and never past ``X-Timeout-S``) did not
  arrive in time: slow clients are cut off, whatever pace they drip at;
- 413: the body is over ``--max-request-mb`` (refused from ``Content-Length``, or as soon as the
  streamed bytes pass the limit, never read whole), or its images hold too many pixels or are too
  many, or the body holds too many msgpack objects (:class:`ServerLimits`; from the PNG headers
  and while unpacking, before any image is decoded);
- 415: the body has a ``Content-Encoding`` (the server decompresses nothing);
- 500: the reward raised, or returned the wrong shape; the detail names the reward and the error;
- 503: the server holds its maximum of connections (``max_connections``), or cannot score (it
  is stopping, or broken: see ``/health``);
- 504: the client's ``X-Timeout-S`` passed before the reward finished (or started).

``GET /health``: JSON ``{"status": "ok", "reward": NAME, "token_required": bool,
"max_request_mb": N, "max_timeout_s": N, "max_image_pixels": N, "max_request_pixels": N,
"max_aspect_ratio": N, "audio": bool}`` (``audio``: the reward hears). It needs no token, so that a load balancer's or
orchestrator's probe (which seldom carries secrets) can use it; it tells nothing a caller could
score with, and never runs the reward. It answers 503 ``{"status": "broken", "detail": ...}`` when
the server can score no more: the reward's call lane has died, or a call has overrun its deadline
by :data:`STUCK_S` (a reward whose own ``submit`` ignores deadlines), or the server is stopping.

Auth: with a token (``--token-file`` / ``--token-env``) every ``/score`` must carry
``Authorization: Bearer <token>`` (compared with :func:`hmac.compare_digest`). Without one the
server binds only a loopback address: anything else is refused at start, and so is a token of
fewer than :data:`MIN_TOKEN_CHARS` characters (or fewer than :data:`MIN_TOKEN_DISTINCT` different
ones) on an address other machines can reach.

Concurrency: bodies are read concurrently, up to ``max_active x --max-request-mb`` of them in all;
at most ``max_active`` (default 4) requests are decoded, queued or scored at once (the others wait,
within their ``X-Timeout-S``), so memory stays bounded however many clients come
(:class:`ServerLimits` says by how much), and a client sending its body slowly holds no slot.
Decoding runs on worker threads, but the reward runs one batch at a time, first come first served,
on a single worker thread (a reward need not be thread-safe nor fit on its GPU twice). The event loop thread never decodes nor scores, so it keeps
accepting, refusing (401, 413) and answering /health while the reward works.
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import io
import ipaddress
import json
import logging
import math
import re
import socket
import struct
import threading
import time
import types
import typing
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

import h11
import msgpack
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from PIL import Image
from starlette.requests import ClientDisconnect
from uvicorn.protocols.http.h11_impl import H11Protocol

from diffrl.config import Range, RewardConfig
from diffrl.config.binding import bind_signature
from diffrl.core.errors import quoted
from diffrl.core.registry import RegistryError, did_you_mean
from diffrl.core.rollout import Audio
from diffrl.rewards.base import Reward, RewardError, build_reward, param_name_problems, submit_scores
from diffrl.rewards.registry import REWARDS
from diffrl.serving.limits import ServerLimits
from diffrl.transport.protocols import (
    DIFFRL,
    PICKLE_PROTOCOLS,
    PROTOCOLS,
    Protocol,
    ProtocolError,
    is_pickle,
    protocol_problem,
)
from diffrl.transport.workers import DeadlineExceeded, deadline_after, seconds_left

LOG = logging.getLogger(__name__)  # warnings reach stderr even unconfigured: the operator sees failures
MSGPACK = "application/msgpack"
MIN_TOKEN_CHARS = 16
MIN_TOKEN_DISTINCT = 8
"""A token for an address other machines can reach: at least this many characters, and this many
different ones (``openssl rand -hex 32`` gives 64 of 16)."""
STUCK_S = 30.0
"""A call this long past its deadline means the server's worker is stuck: ``/health`` answers 503."""
MAX_OBJECTS = 2**20
"""msgpack objects (array items, map entries) in one body: 64 MB of nils would otherwise become
64 M list slots (512 MB) before any field is checked."""
MAX_ARRAY_LEN = 2**16
"""Items of any one msgpack array or map (a request's prompts, images, metadata are arrays)."""
TIMEOUT_TEXT = re.compile(r"[0-9]{1,9}(?:\.[0-9]{0,9})?|\.[0-9]{1,9}")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
JPEG_SIGNATURE = b"\xff\xd8\xff"
JPEG_FRAMES = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
"""The JPEG markers that start a frame header (SOF0-15, less DHT, JPG and DAC)."""
MAX_JPEG_SCANS = 100
"""Scans one JPEG may hold (a baseline JPEG has 1, a progressive one about 10): the decoder passes
over the whole image once a scan, so 64 MB of tiny scans would take it minutes."""
PNG_COLOURS = {0: "grayscale", 2: "RGB", 3: "palette", 4: "grayscale+alpha", 6: "RGBA"}


class ServerError(RewardError):
    """A reward server that cannot start: bad reward, params, token, address or limits."""


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


def token_problem(token: str, public: bool) -> str | None:
    """Why ``token`` cannot guard a server (None when it can); ``public``: bound to an address
    other machines can reach, where it must have :data:`MIN_TOKEN_CHARS` characters,
    :data:`MIN_TOKEN_DISTINCT` of them different. The message never shows the token."""
    make = "make one with: openssl rand -hex 32"
    if not all(33 <= ord(c) <= 126 for c in token):
        return f"the token must be printable ASCII without spaces (an HTTP header carries it); {make}"
    if public and (len(token) < MIN_TOKEN_CHARS or len(set(token)) < MIN_TOKEN_DISTINCT):
        return (
            f"the token is too weak for an address other machines can reach: {len(token)} characters, "
            f"{len(set(token))} different; it needs at least {MIN_TOKEN_CHARS} characters, "
            f"{MIN_TOKEN_DISTINCT} different ({make})"
        )
    return None


def bind_problem(host: str | None, token: str | None) -> str | None:
    """Why the server must not bind ``host`` with ``token`` (None when it may); ``host=None``: a
    Ray node's address (:mod:`diffrl.distributed.ray.reward_server`), never loopback."""
    public = host is None or not is_loopback(host)
    where = (
        f"--host {host} is not a loopback address"
        if host
        else "without --host it binds its Ray node's address"
    )
    if token is not None:
        problem = token_problem(token, public)
        return None if problem is None else (f"{where}, and {problem}" if public else problem)
    if not public:
        return None
    return (
        f"{where}, and the server has no token: anyone who can reach it could use the reward. Give a "
        "token (--token-file FILE or --token-env VAR; clients send it from their token_env), or bind 127.0.0.1"
    )


def served_params(obj: Any, params: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``--params`` bound for the reward ``obj`` (a Reward class or a function), and what is wrong
    with them, found as preflight finds a recipe's ``rewards[i].params`` problems: unknown names,
    then each value's type and :class:`~diffrl.config.Range` from the reward's annotations
    (``num_workers: Annotated[int, Range(0, 256)]``; ``2.0`` binds as 2), then the reward's own
    checks, less those of a param already reported. Each is named ``--params.NAME``."""
    problems = param_name_problems(obj, params)
    if problems:
        return params, problems
    is_reward = isinstance(obj, type) and issubclass(obj, Reward)
    fn = obj.__init__ if is_reward else obj
    bound, typed = bind_signature(fn, params, "--params")
    typed = [_with_range(p, fn) for p in typed]
    flagged = {p.removeprefix("--params.").split(" ")[0].rstrip(":") for p in typed}
    # the reward's own checks see no value whose type or range is wrong (they would compare 'two' > 0)
    own = obj.param_problems({k: v for k, v in bound.items() if k not in flagged}, True) if is_reward else []
    return bound, typed + [p for p in own if re.split(r"[ :]", p)[0] not in flagged]


def _with_range(problem: str, fn: Any) -> str:
    """``problem`` (``--params.NAME: expected an integer, got 'two'``) with NAME's declared range,
    when the message lacks it."""
    name = problem.removeprefix("--params.").split(" ")[0].rstrip(":")
    try:
        hint = typing.get_type_hints(fn, include_extras=True).get(name)
    except Exception:  # noqa: BLE001 - bind_signature read them already; be safe all the same
        return problem
    ranges = [a for part in _parts(hint) for a in getattr(part, "__metadata__", ()) if isinstance(a, Range)]
    if not ranges or " must be in " in problem or " must be [" in problem:
        return problem
    return f"{problem}; give one {ranges[0].text()}"


def _parts(hint: Any) -> list[Any]:
    """``hint`` and, for a union (``Annotated[int, Range(..)] | None``), its members."""
    return (
        [hint, *typing.get_args(hint)]
        if typing.get_origin(hint) in (typing.Union, types.UnionType)
        else [hint]
    )


def check_served_reward(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """``params`` bound for the reward ``name``, or :class:`ServerError` unless ``name`` is a
    reward and ``params`` suit it (:func:`served_params`, all problems at once). Imports the
    reward's module, loads nothing: ``serve-reward --ray`` checks here before Ray starts."""
    try:
        obj = REWARDS.resolve(name)
    except RegistryError as e:
        raise ServerError(f"--reward: {e}") from e
    if not isinstance(params, dict):
        raise ServerError(f"--params must be a mapping of name: value, got {quoted(params)}")
    bound, problems = served_params(obj, params)
    if isinstance(obj, type) and issubclass(obj, Reward) and obj.judges_groups(params):
        problems.append(
            "it judges a prompt's samples together, and a request to this server carries no groups "
            "(the wire format has none); serve it with single-image judging, or use it in the trainer"
        )
    if problems:
        raise ServerError(f"reward {name!r}: " + "; ".join(problems))
    return bound


def served_protocol(name: str) -> Protocol:
    """The protocol ``--protocol name`` names, or :class:`ServerError` (an unknown name with a
    did-you-mean; a peer's pickle protocol, refused saying why)."""
    problem = protocol_problem(name)
    if problem is not None:
        raise ServerError(f"--protocol: {problem.removeprefix('protocol ')}")
    return PROTOCOLS[name]


def build_served_reward(name: str, params: dict[str, Any]) -> Reward:
    """The reward ``name`` with ``params``, checked as preflight checks a recipe's rewards (all
    problems at once), then built. Raises :class:`ServerError`, also for a video reward (the
    ``remote`` reward sends a video's frames, one image each)."""
    params = check_served_reward(name, params)
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


def _too_large(detail: str) -> HTTPException:
    return HTTPException(413, detail=f"request too large: {detail}")


def _shown(value: str, most: int = 40) -> str:
    return repr(value if len(value) <= most else value[:most] + "...")


def _is_count(value: Any) -> bool:
    """A positive int (msgpack's bools are Python bools, which are ints: not counts)."""
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def request_timeout(value: str | None, most: float) -> float:
    """The ``X-Timeout-S`` header: the seconds the client waits, a decimal number (``30``,
    ``2.5``) > 0 and at most ``most`` (the server's ``max_timeout_s``), which is also what a
    request without the header gets; :class:`HTTPException` 400 otherwise."""
    if value is None:
        return most
    if not TIMEOUT_TEXT.fullmatch(value):
        raise _bad(f"X-Timeout-S must be a decimal number of seconds such as 30 or 2.5, got {_shown(value)}")
    timeout = float(value)
    if not 0 < timeout <= most:
        raise _bad(
            f"X-Timeout-S must be > 0 and at most {most:g} s (this server's maximum), got {_shown(value)}"
        )
    return timeout


SINGLE_HEADERS = (
    "authorization",
    "content-length",
    "content-type",
    "content-encoding",
    "transfer-encoding",
    "x-timeout-s",
)
"""Headers a ``/score`` request may send once: given twice, which one counts would be a guess (a
proxy may read the other), so the request is refused."""


def header_problem(values: Callable[[str], list[str]]) -> HTTPException | None:
    """400 when a header of :data:`SINGLE_HEADERS` comes more than once, 415 for a body in a
    ``Content-Encoding`` (the server decompresses nothing: a gzip bomb stays the bytes it is);
    ``values(name)``: the request's values of that header."""
    for name in SINGLE_HEADERS:
        if len(got := values(name)) > 1:
            return _bad(f"the header {name} is given {len(got)} times; give it once")
    encoding = values("content-encoding")
    if encoding and encoding[0].strip().lower() != "identity":
        return HTTPException(
            415,
            detail=f"Content-Encoding {_shown(encoding[0])} is not supported; send the body uncompressed",
        )
    return None


def content_length_problem(value: str | None, limit: int) -> HTTPException | None:
    """413 when ``Content-Length`` says the body is over ``limit`` bytes (400 if it is no number:
    h11 refuses those first, this is for any other caller)."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        return _bad(f"Content-Length {_shown(value)} is not a number of bytes")
    if len(value) > 20 or int(value) > limit:
        size = f"{int(value) / 2**20:.1f} MB" if len(value) <= 20 else f"{len(value)}-digit"
        return HTTPException(
            413, detail=f"request of {size} is over this server's --max-request-mb {limit / 2**20:g}"
        )
    return None


def png_size(data: Any, where: str) -> tuple[int, int]:
    """``(width, height)`` of an 8-bit RGB PNG, read from its header (nothing is decoded);
    :class:`HTTPException` 400 for anything else."""
    if not isinstance(data, bytes):
        raise _bad(f"{where} must be PNG bytes (msgpack bin), got {type(data).__name__}")
    if len(data) < 33 or data[:8] != PNG_SIGNATURE or data[12:16] != b"IHDR":
        raise _bad(f"{where} is not a PNG file (no PNG signature and header); send 8-bit RGB PNGs")
    width, height, depth, colour = struct.unpack(">IIBB", data[16:26])
    if width == 0 or height == 0:
        raise _bad(f"{where} is a PNG of {width}x{height} pixels")
    if (depth, colour) != (8, 2):
        kind = PNG_COLOURS.get(colour, f"colour type {colour}")
        raise _bad(
            f"{where} is a PNG of {depth}-bit {kind} pixels; send 8-bit RGB PNGs (convert it to RGB first)"
        )
    if (problem := _chunks_problem(data)) is not None:
        raise _bad(f"{where} {problem}")
    return width, height


def _chunks_problem(data: bytes) -> str | None:
    """What is wrong with the PNG ``data``'s chunks, read from their headers only (None: nothing):
    an ``acTL`` chunk before the first ``IDAT`` (an animated PNG, which would be scored on its
    first frame), or more than 64 chunks plus one per KB (PIL reads each chunk in Python: 60 MB
    of empty chunks took it 25 s). At most that many steps."""
    most = 64 + len(data) // 1024
    pos, count, pixels_seen = 8, 0, False
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        count += 1
        if count > most:
            return f"holds over {most} PNG chunks (64 and one per KB at most); send a plain PNG"
        if kind == b"acTL" and not pixels_seen:
            return (
                "is an animated PNG (APNG), which would be scored on its first frame only; send one "
                "still PNG per image (a clip: its frames as PNGs, with frames = F)"
            )
        if kind == b"IEND":
            return None
        pixels_seen |= kind == b"IDAT"
        pos += 12 + length
    return None


def check_pixels(sizes: list[tuple[str, int, int]], limits: ServerLimits) -> None:
    """413 if an image (``where, width, height``) or all of them together are over the limits;
    400 if an image's sides are further apart than ``max_aspect_ratio``."""
    total = 0
    for where, width, height in sizes:
        if width * height > limits.max_image_pixels:
            raise _too_large(
                f"{where} is {width}x{height} pixels, over this server's {limits.max_image_pixels} "
                "pixels per image; send smaller images"
            )
        if max(width, height) > limits.max_aspect_ratio * min(width, height):
            raise _bad(
                f"{where} is {width}x{height} pixels, a side over {limits.max_aspect_ratio:g} times the other "
                "(this server's --max-aspect-ratio); send images of a usual shape"
            )
        total += width * height
    if total > limits.max_request_pixels:
        raise _too_large(
            f"its images hold {total} pixels, over this server's {limits.max_request_pixels} per request "
            f"(what --max-request-mb {limits.max_request_mb:g} of raw RGB bytes carries); send fewer "
            "images per request (lower rollout.micro_group_size) or raise the server's --max-request-mb"
        )


def decode_png(data: bytes, where: str, size: tuple[int, int]) -> np.ndarray:
    """The ``(H, W, 3)`` uint8 pixels of a PNG whose header :func:`png_size` read as ``size``."""
    try:
        with Image.open(io.BytesIO(data), formats=["PNG"]) as img:
            if img.mode == "RGB" and img.size == size:
                pixels = np.asarray(img)  # decodes: at most size pixels (PIL sizes its buffer so)
            else:
                pixels = None
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, zlib.error, ... on damaged files
        raise _bad(f"{where} is not a readable PNG ({type(e).__name__}: {str(e)[:200]})") from e
    if pixels is None or pixels.shape != (size[1], size[0], 3):
        raise _bad(f"{where} is not a readable 8-bit RGB PNG of {size[0]}x{size[1]} pixels")
    return pixels


def jpeg_size(data: bytes, where: str) -> tuple[int, int]:
    """``(width, height)`` of an 8-bit 3-component (RGB) JPEG, read from its frame header (nothing
    is decoded), walking its segments' headers from the start: at most 64 steps plus one per KB;
    :class:`HTTPException` 400 for anything else (no frame header before the first scan, a
    grayscale or CMYK one, a damaged segment, over :data:`MAX_JPEG_SCANS` scans)."""
    send = "send 8-bit RGB JPEGs, as verl-omni's and flow_grpo's clients make them"
    if data.count(b"\xff\xda") > MAX_JPEG_SCANS:  # start-of-scan markers (FF is escaped in scan data)
        raise _bad(f"{where} holds over {MAX_JPEG_SCANS} JPEG scans; {send}")
    pos, steps, most = 2, 0, 64 + len(data) // 1024
    while pos + 4 <= len(data):
        steps += 1
        if steps > most:
            raise _bad(f"{where} holds over {most} JPEG markers (64 and one per KB at most); {send}")
        if data[pos] != 0xFF:
            raise _bad(f"{where} is a damaged JPEG (no marker at byte {pos}); {send}")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD7:  # markers without a length
            pos += 2
            continue
        if marker in (0xDA, 0xD9):  # start of scan, end of image: no frame header came first
            break
        if marker in JPEG_FRAMES:
            if pos + 10 > len(data):
                break
            precision, height, width, components = struct.unpack(">BHHB", data[pos + 4 : pos + 10])
            if width == 0 or height == 0:
                raise _bad(f"{where} is a JPEG of {width}x{height} pixels")
            if (precision, components) != (8, 3):
                raise _bad(f"{where} is a JPEG of {components} {precision}-bit components; {send}")
            return width, height
        pos += 2 + struct.unpack(">H", data[pos + 2 : pos + 4])[0]
    raise _bad(f"{where} is not a JPEG with a frame header before its image data; {send}")


def image_size(data: Any, where: str, kinds: tuple[str, ...] = ("png",)) -> tuple[int, int]:
    """``(width, height)`` of an image file of one of ``kinds`` (``png``, ``jpeg``), from its header."""
    if "jpeg" in kinds and isinstance(data, bytes) and data.startswith(JPEG_SIGNATURE):
        return jpeg_size(data, where)
    if "jpeg" in kinds and isinstance(data, bytes) and not data.startswith(PNG_SIGNATURE):
        raise _bad(f"{where} is neither a JPEG nor a PNG file; send 8-bit RGB JPEGs (or PNGs)")
    return png_size(data, where)


def decode_image(data: bytes, where: str, size: tuple[int, int]) -> np.ndarray:
    """The ``(H, W, 3)`` uint8 pixels of a PNG or JPEG whose header :func:`image_size` read as ``size``."""
    if not data.startswith(JPEG_SIGNATURE):
        return decode_png(data, where, size)
    try:
        with Image.open(io.BytesIO(data), formats=["JPEG"]) as img:
            if img.mode == "RGB" and img.size == size:
                pixels = np.asarray(img)  # decodes: at most size pixels (PIL sizes its buffer so)
            else:
                pixels = None
    except Exception as e:  # PIL raises OSError, SyntaxError, ValueError, ... on damaged files
        raise _bad(f"{where} is not a readable JPEG ({type(e).__name__}: {str(e)[:200]})") from e
    if pixels is None or pixels.shape != (size[1], size[0], 3):
        raise _bad(f"{where} is not a readable 8-bit RGB JPEG of {size[0]}x{size[1]} pixels")
    return pixels


class _TooMany(Exception):
    """A msgpack body with more than :data:`MAX_OBJECTS` objects."""


class _Reader:
    """A file over ``data`` for :class:`msgpack.Unpacker`, without copying it whole."""

    def __init__(self, data: bytes | bytearray):
        self.view, self.pos = memoryview(data), 0

    def read(self, n: int) -> bytes:
        chunk = bytes(self.view[self.pos : self.pos + n])
        self.pos += len(chunk)
        return chunk


def _unpack_options() -> dict[str, Any]:
    """msgpack's options for a body: :data:`MAX_ARRAY_LEN` per array or map, and at most
    :data:`MAX_OBJECTS` objects in all (counted by the hooks, per call of this)."""
    count = 0

    def counted(obj: Any) -> Any:
        nonlocal count
        count += len(obj)
        if count > MAX_OBJECTS:
            raise _TooMany
        return obj

    return {
        "raw": False,
        "max_array_len": MAX_ARRAY_LEN,
        "max_map_len": MAX_ARRAY_LEN,
        "list_hook": counted,
        "object_hook": counted,
    }


def _failing_field(body: bytes | bytearray) -> tuple[str, BaseException] | None:
    """The body's top-level field whose value fails to unpack, and its error (None: the body is
    no map of str keys, or the failure is not inside one value). Field by field, so that an error
    names where it is; each value is dropped once read."""
    size = max(len(body), 1)
    unpacker = msgpack.Unpacker(
        _Reader(body), read_size=min(size, 2**16), max_buffer_size=size, **_unpack_options()
    )
    try:
        n = unpacker.read_map_header()
    except Exception:  # noqa: BLE001 - no map: the caller's message stands
        return None
    for _ in range(n):
        try:
            key = unpacker.unpack()
        except Exception:  # noqa: BLE001
            return None
        if not isinstance(key, str):
            return None
        try:
            unpacker.unpack()
        except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types on bad input
            return key, e
    return None


def unpack(body: bytes | bytearray) -> Any:
    """The msgpack body, with at most :data:`MAX_OBJECTS` objects in all and
    :data:`MAX_ARRAY_LEN` in any array or map (413 past them); 400 if it is not msgpack. Either
    names the body's field where the problem is, when it is inside one."""
    try:
        return msgpack.unpackb(body, **_unpack_options())
    except Exception as e:  # noqa: BLE001 - msgpack raises several unrelated types on bad input
        failed = _failing_field(body)
        if failed is None:
            raise _unpack_error(e, "the body") from e
        where, error = failed
        raise _unpack_error(error, _shown(where)) from e


def _unpack_error(e: BaseException, where: str) -> HTTPException:
    if isinstance(e, _TooMany):
        return _too_large(f"{where} holds over {MAX_OBJECTS} msgpack objects (in all)")
    if isinstance(e, ValueError) and "exceeds max_" in str(e):  # "N exceeds max_array_len(M)" (or map)
        return _too_large(
            f"an array or map in {where} holds {str(e).split()[0]} items, over this server's {MAX_ARRAY_LEN}"
        )
    if isinstance(e, msgpack.StackError):
        return _bad(f"{where} is nested too deep for msgpack (over 1024 levels)")
    return _bad(f"{where} is not msgpack ({type(e).__name__}: {str(e)[:200]})")


def decode_request(
    body: bytes | bytearray, limits: ServerLimits | None = None, protocol: Protocol = DIFFRL
) -> ScoreRequest:
    """The body -> :class:`ScoreRequest`, or :class:`HTTPException` 400 (a field is wrong), 413
    (too many images, pixels or objects) or 415 (a Python pickle, but for a pickle protocol), never
    anything else. Every field and every image header is checked before any image is decoded, so a
    request costs at most what ``limits`` allow. ``protocol``: diffrl's msgpack, or a peer's JSON or
    pickle, read into the same fields (:meth:`~diffrl.transport.protocols.Protocol.message`), its
    images PNG or (``protocol.images``) JPEG files."""
    limits = limits or ServerLimits()
    if is_pickle(body) and not protocol.pickled:
        raise HTTPException(
            415,
            detail=f"the body is a Python pickle, and this server answers protocol {protocol.name}; "
            f"{PICKLE_PROTOCOLS} (serve-reward --protocol verl_omni or flow_grpo)",
        )
    if protocol is DIFFRL:
        msg = unpack(body)
    else:
        try:
            msg = protocol.message(body, limits.max_images)
        except ProtocolError as e:
            prefix = {400: "bad request: ", 413: "request too large: "}.get(e.status, "")
            raise HTTPException(e.status, detail=prefix + e.detail) from e
    if not isinstance(msg, dict):
        raise _bad(f"the body must be a msgpack map, got {type(msg).__name__}")
    field_problem(msg)
    fmt, images = msg.get("format"), msg.get("images")
    sizes: list[tuple[str, int, int]] = []
    if fmt == "png":
        if not isinstance(images, list) or not images:
            raise _bad("format png: images must be a non-empty array of PNG files")
        if len(images) > limits.max_images:
            raise _too_large(f"{len(images)} images, over this server's {limits.max_images} per request")
        frames = msg.get("frames")
        if frames is not None and not (_is_count(frames) and len(images) % frames == 0):
            raise _bad(
                f"frames must be a positive int dividing the {len(images)} PNGs, got {str(frames)[:100]}"
            )
        shapes = {image_size(d, f"images[{i}]", protocol.images) for i, d in enumerate(images)}
        if len(shapes) > 1:
            raise _bad(f"images differ in size: {sorted(shapes)[:4]} (width, height); send one size")
        (width, height) = next(iter(shapes))
        sizes += [(f"images[{i}]", width, height) for i in range(len(images))]
        b = len(images) // (frames or 1)
    elif fmt == "raw":
        shape = msg.get("shape")
        if not (isinstance(shape, list) and len(shape) in (4, 5) and all(_is_count(s) for s in shape)):
            raise _bad(
                f"format raw needs shape [B, 3, H, W] or [B, 3, F, H, W] of positive ints, got {str(shape)[:100]}"
            )
        if shape[1] != 3:
            raise _bad(f"shape {shape}: images must have 3 channels (RGB)")
        stills = shape[0] * (shape[2] if len(shape) == 5 else 1)
        if stills > limits.max_images:
            raise _too_large(f"{stills} images, over this server's {limits.max_images} per request")
        if not isinstance(images, bytes) or len(images) != math.prod(shape):
            got = len(images) if isinstance(images, bytes) else type(images).__name__
            raise _bad(f"format raw: images must be {math.prod(shape)} bytes for shape {shape}, got {got}")
        sizes += [(f"images[{i}]", shape[-1], shape[-2]) for i in range(stills)]
        b = shape[0]
    else:
        raise _bad(f"format must be 'png' or 'raw', got {str(fmt)[:100]!r}")
    prompts = msg.get("prompts")
    if not isinstance(prompts, list) or len(prompts) != b or not all(isinstance(p, str) for p in prompts):
        raise _bad(f"prompts must be an array of {b} strings (one per image)")
    metadata = msg.get("metadata")
    metadata = [{} for _ in range(b)] if metadata is None else metadata
    if not isinstance(metadata, list) or len(metadata) != b or not all(isinstance(m, dict) for m in metadata):
        raise _bad(f"metadata must be an array of {b} maps (one per image)")
    if any("source_image" in m for m in metadata):
        raise _bad("metadata must not hold source_image: send source images as sources (PNGs)")
    for i, m in enumerate(metadata):
        metadata_problem(m, f"metadata[{i}]")
    sources = source_sizes(msg.get("sources"), b)
    check_pixels(sizes + [(w, x, y) for w, (x, y) in sources.items()], limits)
    audio = decode_audio(msg, b)
    if fmt == "png":
        arrays = [decode_image(d, f"images[{i}]", (width, height)) for i, d in enumerate(images)]
        pixels = torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous()
        if frames is not None:  # (B * F, 3, H, W), clip by clip -> (B, 3, F, H, W)
            pixels = pixels.view(-1, frames, *pixels.shape[1:]).transpose(1, 2).contiguous()
    else:
        pixels = torch.frombuffer(bytearray(images), dtype=torch.uint8).view(shape)
    for where, size in sources.items():
        i = int(where[len("sources[") : -1])
        source = decode_png(msg["sources"][i], where, size)
        metadata[i] = {
            **metadata[i],
            "source_image": torch.from_numpy(source.copy()).permute(2, 0, 1).contiguous(),
        }
    return ScoreRequest(pixels, prompts, metadata, audio)


FIELDS = {
    "format": None,
    "images": None,
    "shape": "format raw",
    "frames": "format png (raw clips give shape [B, 3, F, H, W])",
    "prompts": None,
    "metadata": None,
    "sources": None,
    "audio": None,
    "audio_shape": "audio",
    "sample_rate": "audio",
}
"""A ``/score`` body's fields -> what they come with (None: any body)."""


def field_problem(msg: dict[Any, Any]) -> None:
    """400 for a field the wire format does not have (a typo would otherwise be ignored: a client
    sending ``sourcse`` would be scored without its source images), or one that does not come
    with the rest (``shape`` in a PNG body, ``sample_rate`` without ``audio``)."""
    for key in msg:
        if key not in FIELDS:
            shown = _shown(key) if isinstance(key, str) else repr(key)[:40]
            hint = did_you_mean(key[:100], list(FIELDS)) if isinstance(key, str) else ""
            raise _bad(
                f"unknown field {shown}.{hint} A /score body has: {', '.join(FIELDS)} (the wire format: "
                "diffrl/serving/server.py)"
            )
    for key, needs in FIELDS.items():
        if key not in msg or needs is None:
            continue
        if needs == "audio" and "audio" not in msg:
            raise _bad(f"{key} is sent with audio only, and the body has no audio")
        if (
            needs.startswith("format")
            and msg.get("format") in ("png", "raw")
            and needs.split()[1] != msg["format"]
        ):
            raise _bad(f"{key} is a field of {needs}, and this body is format {msg['format']}")


MAX_METADATA_DEPTH = 32
"""Maps and arrays nested in one sample's metadata at most (a prompt set's metadata nests a few
levels; a reward walking a deeper one could overflow its stack)."""
METADATA_TYPES = (str, int, float, bool, bytes, type(None), list, dict)


def metadata_problem(metadata: dict[str, Any], where: str) -> None:
    """400 if ``metadata`` nests deeper than :data:`MAX_METADATA_DEPTH` or holds anything but
    strings, numbers, bools, nil, bytes, arrays and maps (a msgpack extension, a timestamp).
    Iterative: its objects are bounded by :data:`MAX_OBJECTS` already."""
    stack: list[tuple[Any, int]] = [(metadata, 1)]
    while stack:
        value, depth = stack.pop()
        if not isinstance(value, METADATA_TYPES):
            raise _bad(
                f"{where} holds a msgpack extension ({type(value).__name__}); metadata holds strings, "
                "numbers, bools, nil, bytes, arrays and maps only"
            )
        if isinstance(value, list | dict):
            if depth > MAX_METADATA_DEPTH:
                raise _bad(f"{where} nests deeper than {MAX_METADATA_DEPTH} levels of maps and arrays")
            stack += [(v, depth + 1) for v in (value.values() if isinstance(value, dict) else value)]


def source_sizes(sources: Any, b: int) -> dict[str, tuple[int, int]]:
    """The body's optional ``sources`` (PNGs or nil, one per sample: an editing family's source
    images, which the reward gets as ``metadata[i]["source_image"]``, uint8 ``(3, H, W)`` as in the
    trainer): ``"sources[i]"`` -> its ``(width, height)``, read from its header."""
    if sources is None:
        return {}
    if not isinstance(sources, list) or len(sources) != b:
        raise _bad(f"sources must be an array of {b} PNG files or nils (one per image)")
    return {f"sources[{i}]": png_size(d, f"sources[{i}]") for i, d in enumerate(sources) if d is not None}


SAMPLE_RATES = (4000, 384_000)
"""The sample rates a request's sound may have, in Hz: a reward resamples it to its own (CLAP: 48
kHz), and a clip of 1 M samples claiming 1 Hz would become 48 G samples there."""


def decode_audio(msg: dict[str, Any], b: int) -> Audio | None:
    """The body's optional ``audio`` -> float16 ``Audio (B, C, S)``."""
    data = msg.get("audio")
    if data is None:
        return None
    shape, rate = msg.get("audio_shape"), msg.get("sample_rate")
    if (
        not (isinstance(shape, list) and len(shape) == 3 and all(_is_count(s) for s in shape))
        or shape[0] != b
    ):
        raise _bad(
            f"audio_shape must be [{b}, C, S] of positive ints (one clip per prompt), got {str(shape)[:100]}"
        )
    if not (_is_count(rate) and SAMPLE_RATES[0] <= rate <= SAMPLE_RATES[1]):
        raise _bad(
            f"sample_rate must be an int in [{SAMPLE_RATES[0]}, {SAMPLE_RATES[1]}] (Hz), got {str(rate)[:100]}"
        )
    if not isinstance(data, bytes) or len(data) != 2 * math.prod(shape):
        got = len(data) if isinstance(data, bytes) else type(data).__name__
        raise _bad(f"audio must be {2 * math.prod(shape)} bytes of float16 for shape {shape}, got {got}")
    wave = torch.from_numpy(np.frombuffer(data, dtype="<f2").astype(np.float16).reshape(shape))
    if not torch.isfinite(wave).all():
        raise _bad("audio holds NaN or infinite samples")
    return Audio(wave, rate)


def decode_checked(
    body: bytes | bytearray, limits: ServerLimits, protocol: Protocol = DIFFRL
) -> ScoreRequest:
    """:func:`decode_request`, where anything but its 4xx is the server's failure, not a crash:
    logged with its traceback for the operator, answered as JSON (503 for memory, 400 else)."""
    try:
        return decode_request(body, limits, protocol)
    except HTTPException:
        raise
    except MemoryError as e:
        raise HTTPException(
            503, detail="the server ran out of memory decoding the request; retry later"
        ) from e
    except Exception as e:
        LOG.exception("decoding a /score body failed unexpectedly")
        raise _bad(f"the body could not be decoded ({type(e).__name__}: {str(e)[:200]})") from e


# ------------------------------------------------------------------------------------------------
# The app
# ------------------------------------------------------------------------------------------------


class _Expired(Exception):
    """The client's deadline passed before its request was scored."""


class _Scoring:
    """The deadline of the call on the server's worker thread now (None: idle)."""

    deadline: float | None = None


def score_request(
    reward: Reward, name: str, req: ScoreRequest, scoring: _Scoring | None = None
) -> list[float]:
    """Score one request (on the worker thread): ``(B,)`` scores as floats, NaN kept. Whatever
    the reward raises (``BaseException`` included: a ``sys.exit`` of the reward's) is a
    :class:`RewardError` naming it."""
    deadline = None if req.timeout_s is None else req.received + req.timeout_s
    left = seconds_left(deadline)
    if left == 0.0:
        raise _Expired(f"the client's X-Timeout-S={req.timeout_s:g} passed while the request was queued")
    if scoring is not None:
        scoring.deadline = deadline
    try:
        images = req.images.float() / 255.0  # what RewardSet.submit hands a reward in the trainer
        audio = req.audio.float() if req.audio is not None and reward.audio else None
        scores = submit_scores(reward, images, req.prompts, req.metadata, left, audio).result()
    except DeadlineExceeded as e:
        raise _Expired(
            f"reward {name!r} did not finish within the client's X-Timeout-S={req.timeout_s:g}"
        ) from e
    except BaseException as e:  # on a worker thread: never a real Ctrl-C, always the reward's doing
        raise RewardError(f"reward {name!r} raised {type(e).__name__}: {str(e)[:500]}") from e
    finally:
        if scoring is not None:
            scoring.deadline = None
    b = len(req.prompts)
    if scores.shape != (b,):
        raise RewardError(
            f"reward {name!r} returned shape {tuple(scores.shape)} for {b} images, expected ({b},)"
        )
    return [float(s) for s in scores.double()]


async def read_body(request: Request, limit: int, timeout_s: float) -> bytearray:
    """The body, or 413 as soon as it is known to pass ``limit`` bytes (from Content-Length, or
    while it streams in: chunked bodies have no length), or 408 if it has not all come within
    ``timeout_s`` (in all, however it drips)."""
    if (problem := content_length_problem(request.headers.get("content-length"), limit)) is not None:
        raise problem
    data = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for chunk in request.stream():
                if len(data) + len(chunk) > limit:
                    raise HTTPException(
                        413, detail=f"request is over this server's --max-request-mb {limit / 2**20:g}"
                    )
                data += chunk
    except TimeoutError as e:
        raise HTTPException(
            408, detail=f"request body not received within {timeout_s:.3g} s; send it faster or whole"
        ) from e
    except ClientDisconnect as e:
        raise _bad("the client disconnected before its body was read") from e
    return data


def create_app(
    reward: Reward,
    name: str,
    token: str | None = None,
    limits: ServerLimits | None = None,
    protocol: Protocol = DIFFRL,
) -> FastAPI:
    """The FastAPI app serving ``reward`` (called ``name`` in answers and errors) in ``protocol``:
    ``POST`` at its paths (diffrl's: ``/score``), and ``GET /health``."""
    limits = limits or ServerLimits()
    app = FastAPI(title=f"diffrl reward {name}", docs_url=None, redoc_url=None, openapi_url=None)
    # the reward scores one batch at a time, first come first served
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-server")
    expected = None if token is None else f"Bearer {token}".encode()
    slots = asyncio.Semaphore(limits.max_active)  # bound to the server's loop at its first use
    buffered = _ByteBudget(limits.max_active * limits.max_request_bytes)
    scoring = _Scoring()
    app.state.worker, app.state.closed = worker, threading.Event()
    app.state.stopping = lambda: False  # RewardServer tells its uvicorn's should_exit

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
        if not hmac.compare_digest(got.encode("latin-1"), expected):
            raise HTTPException(
                401, detail="token wrong: the server refused it", headers={"WWW-Authenticate": "Bearer"}
            )

    def broken() -> str | None:
        """Why the server can score no more (None: it can)."""
        if app.state.stopping() or app.state.closed.is_set():
            return "the server is stopping"
        calls = reward.__dict__.get("_calls")
        if calls is not None and calls.dead():
            return f"reward {name!r}'s call thread has died: it can score no more; restart the server"
        deadline = scoring.deadline
        if deadline is not None and time.monotonic() > deadline + STUCK_S:
            return (
                f"reward {name!r} is stuck: its call is {time.monotonic() - deadline:.0f} s past its deadline "
                "and holds the server's worker; restart the server"
            )
        return None

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        # a bug of the server's (each client error is a 4xx above): the operator's log has it whole
        LOG.error("HTTP 500 for %s %s", request.method, request.url.path, exc_info=exc)
        return JSONResponse(
            {
                "detail": f"internal error of the reward server ({type(exc).__name__}); its log has the details"
            },
            status_code=500,
        )

    @app.get("/health")
    async def health() -> JSONResponse:
        problem = broken()
        if problem is not None:
            return JSONResponse({"status": "broken", "reward": name, "detail": problem}, status_code=503)
        return JSONResponse(
            {
                "status": "ok",
                "reward": name,
                "token_required": token is not None,
                "max_request_mb": limits.max_request_mb,
                "max_timeout_s": limits.max_timeout_s,
                "max_image_pixels": limits.max_image_pixels,
                "max_request_pixels": limits.max_request_pixels,
                "max_aspect_ratio": limits.max_aspect_ratio,
                "audio": bool(reward.audio),
                # a peer's protocol only: diffrl's health answer predates protocols
                **({} if protocol is DIFFRL else {"protocol": protocol.name}),
            }
        )

    async def score(request: Request) -> Response:
        received = time.monotonic()
        if (problem := header_problem(request.headers.getlist)) is not None:
            raise problem
        authorize(request)
        timeout = request_timeout(request.headers.get("x-timeout-s"), limits.max_timeout_s)
        if (
            problem := content_length_problem(request.headers.get("content-length"), limits.max_request_bytes)
        ) is not None:
            raise problem  # before waiting for a slot
        deadline = received + timeout
        length = request.headers.get("content-length")
        if length is not None and "transfer-encoding" in request.headers:
            # h11 reads the chunks and ignores the length: the body could outgrow what it reserved
            raise _bad("give Content-Length or Transfer-Encoding, not both")
        need = limits.max_request_bytes if length is None else int(length)  # chunked: the most it may be
        if not await buffered.reserve(need, seconds_left(deadline)):
            raise _busy(timeout)
        try:
            body = await read_body(
                request, limits.max_request_bytes, min(limits.body_timeout_s, seconds_left(deadline))
            )
            # only now a slot: a client still sending its body (however slowly) holds none
            try:
                await asyncio.wait_for(slots.acquire(), seconds_left(deadline))
            except TimeoutError as e:
                raise _busy(timeout) from e
            try:
                return await decode_and_score(body, timeout, received, deadline)
            finally:
                slots.release()
        finally:
            buffered.release(need)

    async def decode_and_score(body: bytearray, timeout: float, received: float, deadline: float) -> Response:
        try:
            # PNG decoding: off the loop thread
            req = await asyncio.to_thread(decode_checked, body, limits, protocol)
            del body
            req.timeout_s, req.received = timeout, received
            if reward.audio and req.audio is None:
                raise _bad(
                    f"reward {name!r} scores sound and the request has none; send audio (the remote reward: "
                    "audio: true)"
                )
            if (problem := broken()) is not None:
                raise HTTPException(503, detail=f"the reward server cannot score: {problem}")
            future = asyncio.get_running_loop().run_in_executor(
                worker, score_request, reward, name, req, scoring
            )
            # score_request returns by the deadline; past it (and STUCK_S) the worker is stuck: do not wait on
            scores = await asyncio.wait_for(future, seconds_left(deadline) + STUCK_S)
        except (TimeoutError, _Expired) as e:
            detail = (
                str(e)
                if isinstance(e, _Expired)
                else f"reward {name!r} did not finish within the client's X-Timeout-S={timeout:g}"
            )
            LOG.warning("HTTP 504: %s", detail)
            raise HTTPException(504, detail=detail) from e
        except RewardError as e:
            LOG.warning("HTTP 500: %s", e)
            raise HTTPException(500, detail=str(e)) from e
        except RuntimeError as e:  # the worker was shut down under us: the server is stopping
            raise HTTPException(503, detail="the reward server is stopping") from e
        return Response(protocol.answer(scores), media_type=protocol.content_type)

    for path in protocol.paths:
        app.post(path)(score)
    return app


def _busy(timeout: float) -> HTTPException:
    return HTTPException(
        504, detail=f"the server was busy with other requests for the client's X-Timeout-S={timeout:g}"
    )


class _ByteBudget:
    """Bytes of request bodies the server may hold at once: a request reserves its size before
    its body is read and releases it when answered (on the server's event loop only)."""

    def __init__(self, total: int):
        self.total = self.free = total
        self._freed = asyncio.Event()  # bound to the server's loop at its first use

    async def reserve(self, n: int, timeout_s: float | None) -> bool:
        """Take ``n`` bytes, waiting up to ``timeout_s`` for them; False if they did not come."""
        deadline = deadline_after(timeout_s)
        while self.free < n:
            self._freed.clear()
            try:
                await asyncio.wait_for(self._freed.wait(), seconds_left(deadline))
            except TimeoutError:
                return False
        self.free -= n
        return True

    def release(self, n: int) -> None:
        self.free += n
        self._freed.set()


# ------------------------------------------------------------------------------------------------
# Connections
# ------------------------------------------------------------------------------------------------


class GuardedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with what it lacks against slow or hostile clients.

    - A request's head must arrive within ``head_timeout_s`` of the connection (or of the previous
      answer on it), in all, however slowly it drips: else 408 and the connection closes.
    - A body the app answered without reading (401, 404, 413) may drain for ``head_timeout_s``
      more, then the connection closes (uvicorn would read it forever).
    - Past ``max_connections`` open connections a new one is answered 503 and closed at once.
    - Malformed HTTP gets a JSON 400 (uvicorn's is plain text).

    A body the app reads has the app's deadline (:func:`read_body`).
    """

    def __init__(self, *args: Any, limits: ServerLimits, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.limits = limits
        self._phase: str | None = None
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._answer(
                503, f"the server holds its maximum of {self.limits.max_connections} connections; retry"
            )
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        self._answer(
            400,
            "bad request: not valid HTTP/1.1 (a malformed request line, header or Content-Length, or a "
            "head over 16 KB)",
        )

    def _watch(self) -> None:
        """Arm the deadline of what the connection waits for now (kept while that does not change)."""
        theirs, ours = self.conn.their_state, self.conn.our_state
        if self.transport.is_closing():
            phase = None
        elif theirs is h11.IDLE:
            phase = "head"
        elif theirs is h11.SEND_BODY and ours in (h11.DONE, h11.MUST_CLOSE):
            phase = "drain"
        else:  # a body the app reads (its own deadline), or an answer under way
            phase = None
        if phase == self._phase:
            return
        self._cancel()
        self._phase = phase
        if phase is not None:
            self._timer = self.loop.call_later(self.limits.head_timeout_s, self._expire, phase)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, phase: str) -> None:
        self._timer = None
        if phase == "head":
            self._answer(408, f"request head not received within {self.limits.head_timeout_s:g} s")
        else:
            self.transport.close()

    def _answer(self, status: int, detail: str) -> None:
        """Answer ``status`` with a JSON detail and close (no request needed: written raw)."""
        self._cancel()
        self._phase = None
        body = json.dumps({"detail": detail}).encode()
        reason = {400: "Bad Request", 408: "Request Timeout", 503: "Service Unavailable"}[status]
        head = (
            f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
        )
        if not self.transport.is_closing():
            self.transport.write(head.encode() + body)
            self.transport.close()


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
    its own (tests, the Ray actor). ``limits``: :class:`ServerLimits` (its ``max_request_mb`` is
    replaced by ``max_request_mb`` when that is given).
    """

    GRACEFUL_S = 10
    """At shutdown, requests still under way get this long, then they are cancelled."""

    def __init__(
        self,
        reward: Reward,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        max_request_mb: float | None = None,
        log_level: str = "warning",
        sock: socket.socket | None = None,
        limits: ServerLimits | None = None,
        protocol: str = "diffrl",
    ):
        problem = bind_problem(host, token)
        if problem:
            raise ServerError(problem)
        self.protocol = served_protocol(protocol)
        if reward.audio and not self.protocol.hears:
            raise ServerError(
                f"reward {name!r} hears (it scores sound), and protocol {protocol} carries none; serve it "
                "with --protocol diffrl"
            )
        self.limits = limits or ServerLimits()
        if max_request_mb is not None:
            self.limits = replace(self.limits, max_request_mb=max_request_mb)
        if problems := self.limits.problems():
            raise ServerError("reward server limits: " + "; ".join(problems))
        self.reward, self.name, self.host = reward, name, host
        self.sock = bind_socket(host, port) if sock is None else sock
        self.port = self.sock.getsockname()[1]
        self.app = create_app(reward, name, token, self.limits, self.protocol)
        config = uvicorn.Config(
            self.app,
            log_level=log_level,
            access_log=False,
            http=functools.partial(GuardedH11Protocol, limits=self.limits),  # type: ignore[arg-type]
            ws="none",  # no WebSocket upgrade: it would leave the guarded protocol
            timeout_graceful_shutdown=self.GRACEFUL_S,
        )
        self.server = uvicorn.Server(config)
        self.app.state.stopping = lambda: self.server.should_exit
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
        self.app.state.closed.set()
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
    on_ready: Callable[[RewardServer], None] | None = None,
    limits: ServerLimits | None = None,
    protocol: str = "diffrl",
) -> None:
    """Build the reward ``name`` and serve it until SIGINT/SIGTERM (what ``diffrl serve-reward``
    runs). The address, token and limits are checked before the reward loads (a model may take
    minutes), and so is ``protocol``."""
    problem = bind_problem(host, token)
    if problem:
        raise ServerError(problem)
    served_protocol(protocol)
    limits = limits or ServerLimits()
    if problems := limits.problems():
        raise ServerError("reward server limits: " + "; ".join(problems))
    sock = bind_socket(host, port)  # before the reward loads: a busy port fails in a second
    try:
        reward = build_served_reward(name, params)
    except BaseException:
        sock.close()
        raise
    try:
        server = RewardServer(reward, name, host, port, token, sock=sock, limits=limits, protocol=protocol)
    except BaseException:
        reward.close()
        sock.close()
        raise
    if on_ready is not None:
        threading.Thread(target=server.when_started, args=(on_ready,), daemon=True).start()
    server.run()
