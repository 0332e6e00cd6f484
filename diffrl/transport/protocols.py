"""Reward-server wire protocols: diffrl's own and its peers', for both ends.

The ``remote`` reward (:mod:`diffrl.rewards.remote`) speaks one of them to a server (``params:
{protocol: ...}``), and ``diffrl serve-reward --protocol NAME`` (:mod:`diffrl.serving.server`)
answers one, so a reward server users already run for a peer framework can score a diffrl run,
and a diffrl-served reward can score theirs.
A protocol is a small object: the client side encodes a batch into a body and reads the answer's
scores (an answer that breaks the contract is an :class:`AnswerError`, never a traceback); the server
side reads a body into diffrl's ``/score`` fields (:data:`diffrl.serving.server.FIELDS`), or a
:class:`ProtocolError` (400 / 413 / 415), and encodes the scores.

``diffrl`` (default)
    msgpack ``POST {url}/score``: the wire format in :mod:`diffrl.serving.server`'s docstring.

``flow_factory``
    Flow-Factory's remote reward server. Contract from X-GenGroup/Flow-Factory
    ``src/flow_factory/rewards/my_reward_remote.py`` (``RemoteRewardClient.compute``,
    ``_build_payload``, ``_image_to_b64``) and ``reward_server/example_server.py``
    (``RewardServer.run``, ``_parse_request``), also in ``guidance/rewards.md`` ("Remote Reward
    Server"): ``POST {url}/compute``, JSON ``{"prompt": [B str], "image": [B base64 PNG] | null,
    "video": [B [F base64 PNG frames]] | null, "condition_images": [B [base64 PNG]] | null,
    "condition_videos": [...] | null}`` (base64 without a ``data:`` prefix); the server may read an
    ``"extra"`` map, which its client never sends. Answer ``{"rewards": [B floats]}``; an error is
    HTTP 500 ``{"detail": ...}`` (FastAPI's) or a 200 with a truthy ``"error"``. ``GET
    {url}/health`` answers ``{"status": "ok"}`` (the client checks only that it is 2xx).
    diffrl sends ``image`` and, for an editing family, each sample's source image as its one
    ``condition_images`` entry; a served reward gets ``video`` as clips (their frames scored, each
    clip the mean), ``condition_images`` as source images (one per sample at most), and refuses
    ``condition_videos``.

``verl_omni``
    The field contract of verl-omni's HTTP scorer, which is flow_grpo's reward-server contract:
    ``{"images", "prompts", "metadata"} -> {"scores"}``. From verl-project/verl-omni
    ``verl_omni/utils/reward_score/http_scorer_client.py`` (``compute_score``) and
    ``docs/start/http_scorer.md``; flow_grpo's side in yifan123/flow_grpo ``flow_grpo/rewards.py``
    (``unifiedreward_score_remote``, ``geneval_score``, ``deqa_score_remote``) and
    yifan123/reward-server ``app_deqa.py``. Those clients and servers **pickle** the body and the
    answer (``pickle.dumps`` / ``pickle.loads``), with JPEG bytes as images, ``POST`` to the URL as
    given (flow_grpo's servers route ``/``; verl-omni's test server ``/score``); an error is
    ``{"error": ...}`` with HTTP 500 (or 200). diffrl does not speak pickle (:data:`REFUSED`):
    unpickling a body runs whatever code its sender chose. ``verl_omni`` is that contract in JSON:
    ``POST {url}`` as given, ``Content-Type: application/json``, ``{"images": [B base64 PNG],
    "prompts": [B str], "metadata": [B maps]}`` -> ``{"scores": [B floats]}``. Inferred where the
    sources say nothing: images are base64 strings (a ``data:image/...;base64,`` prefix is accepted),
    PNG rather than JPEG (lossless: the server scores the rollout's exact pixels); ``metadata`` is one
    map per image (verl-omni sends ``{}``, "reserved"; a map is still accepted by a served reward);
    an editing family's source images go as an extra ``"sources": [B base64 PNG | null]``. A
    scorer of theirs reads this once its ``pickle.loads(body)`` is ``json.loads(body)`` with the
    images base64-decoded, and answers with ``json.dumps``.

Scores in a JSON answer are numbers; ``null`` or ``NaN`` fails that sample (counted), as a NaN does
in-process. A served reward's NaN goes out as JSON's ``NaN`` (Python's ``json`` reads it).
"""

from __future__ import annotations

import base64
import binascii
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import numpy as np
import torch
from PIL import Image

from diffrl.core.errors import RewardError, quoted
from diffrl.core.registry import did_you_mean
from diffrl.core.rollout import Audio, quantize

MAX_JSON_ITEMS = 2**20
"""Values (array items, object members) one JSON body may hold, counted from its bytes before it is
parsed (commas and brackets: an upper bound), as :data:`diffrl.serving.server.MAX_OBJECTS` bounds a
msgpack body: 64 MB of ``0,`` would otherwise become 32 M list slots."""
DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]*;base64,")
PICKLE_WHY = (
    "unpickling a body runs whatever code its sender put in it, so diffrl neither sends nor reads pickle"
)
JSON_FIX = (
    "use the same fields as JSON: protocol verl_omni ({'images': [base64 PNG], 'prompts': [...], "
    "'metadata': [...]} -> {'scores': [...]}; the peer's side reads and writes it with json.loads and "
    "json.dumps instead of pickle.loads and pickle.dumps)"
)
REFUSED = {
    "flow_grpo": "flow_grpo's reward servers (and verl-omni's HTTP scorer) read and answer Python pickle",
    "pickle": "a pickle protocol",
    "verl_omni_pickle": "verl-omni's HTTP scorer reads and answers Python pickle",
}
"""Protocol names of peers that speak pickle: refused, saying why (:func:`protocol_problem`)."""


class ProtocolError(Exception):
    """A request body that breaks its protocol (server side): ``status`` (400, 413, 415) and ``detail``."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status, self.detail = status, detail


class AnswerError(ValueError):
    """A server's answer that breaks its protocol (client side); the message says how."""


def encode_png(pixels: np.ndarray) -> bytes:
    """``(H, W, 3)`` uint8 -> PNG bytes (lossless: the server decodes the same pixels)."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG", compress_level=1)  # speed over size: it is sent once
    return out.getvalue()


def _plain(value: Any) -> Any:
    """Metadata values msgpack or JSON cannot write themselves: numpy and torch numbers and arrays."""
    if isinstance(value, np.generic | np.ndarray | torch.Tensor):
        return value.tolist()
    raise TypeError(f"a {type(value).__name__} cannot be sent")


def _split_sources(metadata: Sequence[dict]) -> tuple[list[dict], list[bytes | None] | None]:
    """``metadata`` without an editing family's ``source_image`` tensors, and those as PNGs (None:
    no sample has one)."""
    sources = [m.get("source_image") for m in metadata]
    if not any(isinstance(s, torch.Tensor) for s in sources):
        return list(metadata), None
    kept = [{k: v for k, v in m.items() if k != "source_image"} for m in metadata]
    pngs = [
        encode_png(np.ascontiguousarray(s.permute(1, 2, 0).numpy())) if isinstance(s, torch.Tensor) else None
        for s in sources
    ]
    return kept, pngs


def _metadata_error(e: Exception) -> RewardError:
    return RewardError(
        f"reward 'remote': cannot send the prompts' metadata ({e}); a remote reward's metadata "
        "must hold only strings, numbers, bools, None, lists and dicts"
    )


def encode_request(
    images: torch.Tensor,
    prompts: Sequence[str],
    metadata: Sequence[dict],
    fmt: str,
    audio: Audio | None = None,
) -> bytes:
    """``images (B, 3, H, W)`` or clips ``(B, 3, F, H, W)`` in [0, 1], and their ``audio``, -> the
    msgpack ``/score`` body (module docstring of :mod:`diffrl.serving.server`), pixels through
    :func:`quantize` (the rollout's uint8), sound as float16 (the rollout's precision)."""
    pixels = quantize(images)
    metadata, sources = _split_sources(metadata)
    msg: dict[str, Any] = {"format": fmt, "prompts": list(prompts), "metadata": metadata}
    if sources is not None:  # an editing family's source images travel as PNGs beside the metadata
        msg["sources"] = sources
    if fmt == "png":
        stills = pixels.transpose(1, 2).flatten(0, 1) if pixels.ndim == 5 else pixels  # video-major
        msg["images"] = [encode_png(np.ascontiguousarray(a)) for a in stills.permute(0, 2, 3, 1).numpy()]
        if pixels.ndim == 5:
            msg["frames"] = pixels.shape[2]
    else:
        msg["images"] = pixels.contiguous().numpy().tobytes()
        msg["shape"] = list(pixels.shape)
    if audio is not None:
        wave = audio.waveform.detach().to("cpu", torch.float16).contiguous()
        msg["audio"] = wave.numpy().astype("<f2").tobytes()
        msg["audio_shape"], msg["sample_rate"] = list(wave.shape), int(audio.sample_rate)
    try:
        return msgpack.packb(msg, default=_plain)
    except (TypeError, ValueError) as e:
        raise _metadata_error(e) from e


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _png_b64(images: torch.Tensor) -> list[str]:
    """``images (B, 3, H, W)`` in [0, 1] -> B base64 PNGs of the rollout's uint8 pixels."""
    if images.ndim != 4:
        raise RewardError(
            f"reward 'remote': this protocol sends still images (B, 3, H, W), got shape {tuple(images.shape)}"
        )
    pixels = quantize(images).permute(0, 2, 3, 1).numpy()
    return [_b64(encode_png(np.ascontiguousarray(a))) for a in pixels]


def _json_body(msg: dict[str, Any]) -> bytes:
    try:
        return json.dumps(msg, default=_plain, allow_nan=True).encode()
    except (TypeError, ValueError) as e:
        raise _metadata_error(e) from e


# -- reading JSON (both ends) --------------------------------------------------------------------


def read_json(body: bytes | bytearray, what: str = "the body") -> Any:
    """``body`` parsed as JSON, with at most :data:`MAX_JSON_ITEMS` values (counted before parsing,
    413 past them); 415 for a Python pickle (refused, :data:`PICKLE_WHY`); 400 for anything else
    that is not JSON, or nested too deep for the parser. Raises :class:`ProtocolError`."""
    if is_pickle(body):
        raise ProtocolError(
            415,
            f"{what} is a Python pickle (what flow_grpo's and verl-omni's servers and clients speak); "
            f"{PICKLE_WHY}. "
            f"Send JSON: {JSON_FIX.removeprefix('use the same fields as JSON: ')}",
        )
    items = body.count(b",") + body.count(b"[") + body.count(b"{")
    if items > MAX_JSON_ITEMS:
        raise ProtocolError(413, f"{what} holds over {MAX_JSON_ITEMS} JSON values (in all)")
    try:
        return json.loads(body)
    except RecursionError as e:
        raise ProtocolError(400, f"{what} is nested too deep for JSON") from e
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise ProtocolError(400, f"{what} is not JSON ({type(e).__name__}: {str(e)[:200]})") from e


def is_pickle(body: bytes | bytearray) -> bool:
    """``body`` opens as a pickle of protocol 2 or later does (``PROTO`` opcode): what verl-omni's
    and flow_grpo's clients send (``pickle.dumps`` with Python's default protocol)."""
    return len(body) >= 2 and body[0] == 0x80 and 2 <= body[1] <= 5


def decode_b64(value: Any, where: str) -> bytes:
    """An image sent as base64 text (optionally a ``data:image/...;base64,`` URL) -> its bytes;
    :class:`ProtocolError` 400 for anything else."""
    if not isinstance(value, str):
        raise ProtocolError(400, f"{where} must be a base64 string of an image, got {type(value).__name__}")
    if value.startswith("data:"):
        head = DATA_URL.match(value)
        if head is None:
            raise ProtocolError(400, f"{where} is a data URL but not data:image/...;base64,")
        value = value[head.end() :]
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ProtocolError(400, f"{where} is not valid base64 ({str(e)[:100]})") from e


def _b64_list(value: Any, where: str, max_images: int) -> list[bytes]:
    """A non-empty JSON array of base64 images, at most ``max_images`` (counted before decoding)."""
    if not isinstance(value, list) or not value:
        raise ProtocolError(400, f"{where} must be a non-empty array of base64 images")
    if len(value) > max_images:
        raise ProtocolError(413, f"{len(value)} images, over this server's {max_images} per request")
    return [decode_b64(v, f"{where}[{i}]") for i, v in enumerate(value)]


def checked_scores(answer: Any, key: str, n: int) -> list[float]:
    """The ``n`` scores under ``key`` of a JSON answer; ``null`` and ``NaN`` are failed samples
    (NaN). :class:`AnswerError` for a missing field, a wrong length or a value that is no number; a
    truthy ``"error"`` field is the server's own refusal, quoted."""
    if not isinstance(answer, dict):
        raise AnswerError(f"answered {type(answer).__name__} JSON, not an object {{{key!r}: [...]}}")
    if answer.get("error"):
        raise AnswerError(f"answered an error: {quoted(str(answer['error']), 300)}")
    if key not in answer:
        raise AnswerError(f"answered no {key!r} (its fields: {quoted(sorted(map(str, answer))[:8], 200)})")
    scores = answer[key]
    if not isinstance(scores, list):
        raise AnswerError(f"answered {key!r} = {quoted(scores, 100)}, not a list of {n} numbers")
    if len(scores) != n:
        raise AnswerError(f"answered {len(scores)} score(s) for {n} images")
    out = []
    for i, s in enumerate(scores):
        if s is None:
            out.append(math.nan)
        elif isinstance(s, int | float) and not isinstance(s, bool):
            try:
                out.append(float(s))
            except OverflowError:  # an integer past float's range: no score
                out.append(math.nan)
        else:
            raise AnswerError(f"answered {key}[{i}] = {quoted(s, 100)}, not a number")
    return out


# -- the protocols -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Protocol:
    """One wire protocol. ``paths``: where ``serve-reward`` answers it (``POST``); the client posts
    to ``url`` + ``paths[0]``, or to ``url`` itself when ``url_is_endpoint``. ``health``: the path
    its servers answer ``GET`` on (None: its contract has none). ``formats``: the image encodings
    the client may send; ``hears``: it can carry sound."""

    name: str
    paths: tuple[str, ...]
    content_type: str
    health: str | None = "/health"
    url_is_endpoint: bool = False
    formats: tuple[str, ...] = ("png",)
    hears: bool = False

    def endpoint(self, url_path: str) -> str:
        """The path the client posts to, for a ``url`` whose path is ``url_path``."""
        if self.url_is_endpoint:
            return url_path or "/"
        return url_path.rstrip("/") + self.paths[0]

    def encode(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        fmt: str,
        audio: Audio | None = None,
    ) -> bytes:
        """Client: a batch -> the request body (:class:`RewardError` for metadata it cannot carry)."""
        raise NotImplementedError

    def scores(self, data: bytes, content_type: str, n: int) -> list[float]:
        """Client: a 200 answer -> its ``n`` scores, or :class:`AnswerError`."""
        raise NotImplementedError

    def message(self, body: bytes | bytearray, max_images: int) -> dict[str, Any]:
        """Server: a JSON body -> diffrl's ``/score`` fields (``format: png``, PNG bytes), or
        :class:`ProtocolError`. (The ``diffrl`` protocol's msgpack is unpacked by the server.)"""
        raise NotImplementedError

    def answer(self, scores: list[float]) -> bytes:
        """Server: the scores -> the answer's body (of ``content_type``)."""
        raise NotImplementedError


class DiffrlProtocol(Protocol):
    def encode(self, images, prompts, metadata, fmt, audio=None) -> bytes:
        return encode_request(images, prompts, metadata, fmt, audio)

    def scores(self, data: bytes, content_type: str, n: int) -> list[float]:
        try:
            answer = msgpack.unpackb(data) if "msgpack" in content_type else json.loads(data)
            scores = torch.tensor(answer["scores"], dtype=torch.float64)
        except Exception as e:  # anything unreadable: not a diffrl reward server, or a broken one
            raise AnswerError(
                f"answered something that is not {{'scores': [...]}} ({type(e).__name__}: {str(e)[:200]}); "
                "is it a diffrl reward server?"
            ) from e
        if scores.shape != (n,):
            raise AnswerError(
                f"answered {scores.numel()} score(s) of shape {tuple(scores.shape)} for {n} images"
            )
        return scores.tolist()

    def answer(self, scores: list[float]) -> bytes:
        return msgpack.packb({"scores": scores})


class VerlOmniProtocol(Protocol):
    def encode(self, images, prompts, metadata, fmt, audio=None) -> bytes:
        metadata, sources = _split_sources(metadata)
        msg: dict[str, Any] = {"images": _png_b64(images), "prompts": list(prompts), "metadata": metadata}
        if sources is not None:
            msg["sources"] = [None if s is None else _b64(s) for s in sources]
        return _json_body(msg)

    def scores(self, data: bytes, content_type: str, n: int) -> list[float]:
        return checked_scores(_answer_json(data), "scores", n)

    def message(self, body: bytes | bytearray, max_images: int) -> dict[str, Any]:
        msg = _object(read_json(body))
        _known(msg, ("images", "prompts", "metadata", "sources"))
        images = _b64_list(msg.get("images"), "images", max_images)
        metadata = msg.get("metadata")
        if metadata is None or metadata == {}:  # verl-omni sends {} ("reserved for future use")
            metadata = [{} for _ in images]
        out: dict[str, Any] = {
            "format": "png",
            "images": images,
            "prompts": msg.get("prompts"),
            "metadata": metadata,
        }
        sources = msg.get("sources")
        if sources is not None:
            if not isinstance(sources, list) or len(sources) != len(images):
                raise ProtocolError(
                    400, f"sources must be an array of {len(images)} base64 images or nulls (one per image)"
                )
            out["sources"] = [
                None if s is None else decode_b64(s, f"sources[{i}]") for i, s in enumerate(sources)
            ]
        return out

    def answer(self, scores: list[float]) -> bytes:
        return json.dumps({"scores": scores}).encode()


class FlowFactoryProtocol(Protocol):
    def encode(self, images, prompts, metadata, fmt, audio=None) -> bytes:
        _, sources = _split_sources(metadata)
        conditions = None
        if sources is not None:
            conditions = [[] if s is None else [_b64(s)] for s in sources]
        msg = {
            "prompt": list(prompts),
            "image": _png_b64(images),
            "video": None,
            "condition_images": conditions,
            "condition_videos": None,
        }
        return _json_body(msg)

    def scores(self, data: bytes, content_type: str, n: int) -> list[float]:
        return checked_scores(_answer_json(data), "rewards", n)

    def message(self, body: bytes | bytearray, max_images: int) -> dict[str, Any]:
        msg = _object(read_json(body))
        _known(msg, ("prompt", "image", "video", "condition_images", "condition_videos", "extra"))
        if msg.get("condition_videos"):
            raise ProtocolError(
                400, "condition_videos are not supported; send condition_images (one per sample)"
            )
        if msg.get("extra") is not None and not isinstance(msg["extra"], dict):
            raise ProtocolError(400, "extra must be an object")
        image, video = msg.get("image"), msg.get("video")
        out: dict[str, Any] = {"format": "png", "prompts": msg.get("prompt")}
        if image and video:
            raise ProtocolError(400, "send image or video, not both")
        if video:
            if not isinstance(video, list) or not all(isinstance(v, list) and v for v in video):
                raise ProtocolError(400, "video must be an array of non-empty arrays of base64 frames")
            frames = {len(v) for v in video}
            if len(frames) > 1:
                raise ProtocolError(
                    400, f"videos differ in frame count: {sorted(frames)[:4]}; send one length"
                )
            flat = [f for v in video for f in v]
            out["images"] = _b64_list(flat, "video frames", max_images)
            out["frames"] = len(video[0])
            b = len(video)
        else:
            out["images"] = _b64_list(image, "image", max_images)
            b = len(out["images"])
        out["metadata"] = [{} for _ in range(b)]
        conditions = msg.get("condition_images")
        if conditions is not None:
            if not isinstance(conditions, list) or len(conditions) != b:
                raise ProtocolError(400, f"condition_images must be an array of {b} arrays (one per sample)")
            sources: list[bytes | None] = []
            for i, c in enumerate(conditions):
                if not isinstance(c, list) or len(c) > 1:
                    raise ProtocolError(
                        400,
                        f"condition_images[{i}] must be an array of at most one base64 image (the source image)",
                    )
                sources.append(decode_b64(c[0], f"condition_images[{i}][0]") if c else None)
            if any(s is not None for s in sources):
                out["sources"] = sources
        return out

    def answer(self, scores: list[float]) -> bytes:
        return json.dumps({"rewards": scores}).encode()


def _answer_json(data: bytes) -> Any:
    try:
        return read_json(data, "the answer")
    except ProtocolError as e:
        raise AnswerError(f"answered something that is not this protocol's JSON: {e.detail}") from e


def _object(msg: Any) -> dict[str, Any]:
    if not isinstance(msg, dict):
        raise ProtocolError(400, f"the body must be a JSON object, got {type(msg).__name__}")
    return msg


def _known(msg: dict[str, Any], fields: tuple[str, ...]) -> None:
    """400 for a field the protocol lacks (a typo would otherwise be ignored silently)."""
    for key in msg:
        if key not in fields:
            hint = did_you_mean(key[:100], list(fields))
            raise ProtocolError(
                400, f"unknown field {quoted(key, 40)}.{hint} This protocol's body has: {', '.join(fields)}"
            )


DIFFRL = DiffrlProtocol("diffrl", ("/score",), "application/msgpack", formats=("png", "raw"), hears=True)
PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        DIFFRL,
        VerlOmniProtocol("verl_omni", ("/", "/score"), "application/json", health=None, url_is_endpoint=True),
        FlowFactoryProtocol("flow_factory", ("/compute",), "application/json"),
    )
}
"""Each protocol by its name (module docstring)."""


def protocol_problem(name: Any) -> str | None:
    """Why ``name`` is no protocol diffrl speaks (None: it is one): an unknown name (with a
    did-you-mean), or a peer's pickle protocol (:data:`REFUSED`, saying why)."""
    if isinstance(name, str) and name in PROTOCOLS:
        return None
    if isinstance(name, str) and name in REFUSED:
        return f"protocol {name!r}: {REFUSED[name]}; {PICKLE_WHY}. Instead, {JSON_FIX}"
    hint = did_you_mean(name[:100], list(PROTOCOLS)) if isinstance(name, str) else ""
    return f"protocol must be one of {', '.join(PROTOCOLS)}, got {quoted(name, 100)}.{hint}"
