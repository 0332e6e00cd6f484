"""Reward-server wire protocols: diffrl's own and its peers', for both ends.

The ``remote`` reward (:mod:`diffrl.rewards.remote`) speaks one of them to a server (``params:
{protocol: ...}``), and ``diffrl serve-reward --protocol NAME`` (:mod:`diffrl.serving.server`)
answers one, so a reward server users already run for a peer framework can score a diffrl run,
and a diffrl-served reward can score theirs, each unchanged.
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
    verl-omni's HTTP scorer, as its client and docs have it: verl-project/verl-omni
    ``verl_omni/utils/reward_score/http_scorer_client.py`` (``compute_score``,
    ``_serialize_image``, ``_error_detail``) and ``docs/start/http_scorer.md`` ("Scorer service
    protocol"), whose reference servers are deepgenteam/deepgen_rl
    ``rewards_services/api_services/*/app.py`` (``inference``; ``common/utils.py``). ``POST`` to the
    URL as given (their servers route ``/``; verl-omni's test server ``/score``), body
    ``pickle.dumps({"images": [B JPEG bytes], "prompts": [B str], "metadata": {}})`` (PIL's JPEG
    at its default quality 75; ``metadata`` is "reserved", except that deepgen_rl's GenEval
    service reads ``metadata["meta_datas"]``, one map per image). Answer 200
    ``pickle.dumps({"scores": [B floats]})``; an error is ``pickle.dumps({"error": str})`` with
    HTTP 5xx or 200 (or a 5xx with text). No health route. The client sends ``format: jpeg`` by
    default (``png`` is lossless, for a scorer that opens any image, as deepgen_rl's do) and
    ``metadata: {"meta_datas": [B maps]}``, each sample's metadata with its ``"prompt"``.

``flow_grpo``
    flow_grpo's reward servers, as its clients and yifan123/reward-server have them:
    yifan123/flow_grpo ``flow_grpo/rewards.py`` (``deqa_score_remote``,
    ``unifiedreward_score_remote``, ``geneval_score``) and yifan123/reward-server ``app_deqa.py``,
    ``app_geneval.py`` (``inference``), ``reward_server/gen_eval.py`` (``compute_geneval``).
    ``POST`` to the URL as given (their servers route ``/``), body ``pickle.dumps`` of a dict with
    ``"images": [B JPEG bytes]`` (PIL's default JPEG; the servers open them with ``formats=["jpeg"]``)
    and, per scorer, ``"prompts"`` (UnifiedReward: a NumPy array of str, from ``np.array_split``),
    ``"meta_datas": [B maps]`` and ``"only_strict": bool`` (GenEval, which reads each map's
    ``"tag"``, ``"include"``, ``"prompt"``: the prompt file's line). Answer 200 ``pickle.dumps`` of
    ``{"outputs": [B floats]}`` (DeQA, UnifiedReward) or ``{"scores", "rewards",
    "strict_rewards", "group_rewards", "group_strict_rewards"}`` (GenEval; flow_grpo's reward is
    ``scores``); an error is HTTP 500 with the traceback as text. No health route. The client sends
    all four fields (each server reads its own; ``only_strict: true`` as flow_grpo trains) and reads
    ``scores``, else ``outputs``; a served reward answers both keys, so DeQA's and UnifiedReward's
    clients read it (GenEval's wants its accuracies too, which no diffrl reward makes). The server
    ``unifiedreward_score_remote`` calls is not in those repositories: diffrl sends it what that
    client sends (prompts as a list) and reads ``outputs``, untested against it.

``verl_omni_json``
    diffrl's JSON rendering of verl-omni's fields, which no peer ships: for a scorer changed to
    read ``json.loads`` (``protocol: verl_omni`` before diffrl spoke pickle). ``POST {url}`` as
    given, ``{"images": [B base64 PNG], "prompts": [B str], "metadata": [B maps]}`` ->
    ``{"scores": [B floats]}``; a ``data:image/...;base64,`` prefix is accepted, ``metadata`` may be
    ``{}``, and an editing family's source images go as ``"sources": [B base64 PNG | null]``.

Pickle is read only through :mod:`diffrl.transport.pickled`'s restricted unpickler, at both ends:
containers, numbers, strings, bytes and NumPy arrays and scalars, and nothing that names another
global (that is what would run code), bounded in opcodes, values and depth before and while it is
read; written only from plain values. Images of the pickle protocols are read under the server's
pixel bounds from their headers (JPEG's frame header) before any is decoded. An editing family's
source images are not sent on them (their contracts have no field for one).

Scores in an answer are numbers; ``null``/``None`` or ``NaN`` fails that sample (counted), as a NaN
does in-process. A served reward's NaN goes out as JSON's ``NaN`` (Python's ``json`` reads it) or
pickle's.
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
from diffrl.transport.pickled import MAX_PICKLE_DEPTH, PickleRefused, dumps, loads

MAX_JSON_ITEMS = 2**20
"""Values (array items, object members) one JSON body may hold, counted from its bytes before it is
parsed (commas and brackets: an upper bound), as :data:`diffrl.serving.server.MAX_OBJECTS` bounds a
msgpack body: 64 MB of ``0,`` would otherwise become 32 M list slots."""
DATA_URL = re.compile(r"data:image/[A-Za-z0-9.+-]*;base64,")
PICKLE_PROTOCOLS = (
    "pickled bodies (verl-omni's and flow_grpo's) are protocols verl_omni and flow_grpo, which diffrl "
    "reads through its restricted unpickler"
)
JSON_RENDERING = "diffrl's former JSON rendering of verl-omni's fields"


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


def encode_jpeg(pixels: np.ndarray) -> bytes:
    """``(H, W, 3)`` uint8 -> JPEG bytes as verl-omni's ``_serialize_image`` and flow_grpo's remote
    rewards make them (PIL's defaults: quality 75, 4:2:0), so their scorers see what they would."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG")
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


# -- pickle (both ends) --------------------------------------------------------------------------


def _encoded(images: torch.Tensor, fmt: str) -> list[bytes]:
    """``images (B, 3, H, W)`` in [0, 1] -> B JPEG (``fmt`` jpeg) or PNG files of the rollout's uint8 pixels."""
    if images.ndim != 4:
        raise RewardError(
            f"reward 'remote': this protocol sends still images (B, 3, H, W), got shape {tuple(images.shape)}"
        )
    encode = encode_jpeg if fmt == "jpeg" else encode_png
    return [encode(np.ascontiguousarray(a)) for a in quantize(images).permute(0, 2, 3, 1).numpy()]


def _sendable(value: Any, depth: int = 0) -> Any:
    """``value`` as the plain values a pickled body holds (numpy and torch numbers and arrays as
    lists), so that the body names no global and diffrl's own unpickler reads it back."""
    if depth > MAX_PICKLE_DEPTH - 3:  # the body's dict and list hold each sample's map
        raise TypeError(f"it nests deeper than {MAX_PICKLE_DEPTH - 3} levels")
    if isinstance(value, np.generic | np.ndarray | torch.Tensor):
        return value.tolist()
    if value is None or isinstance(value, bool | int | float | str | bytes):
        return value
    if isinstance(value, list | tuple):
        return [_sendable(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k if isinstance(k, str | int) else str(k): _sendable(v, depth + 1) for k, v in value.items()}
    raise TypeError(f"a {type(value).__name__} cannot be sent")


def _meta_datas(prompts: Sequence[str], metadata: Sequence[dict]) -> list[dict]:
    """Each sample's metadata with its ``"prompt"`` (the prompt file's whole line, as flow_grpo's
    GenEval scorer reads it), without an editing family's ``source_image`` (no field carries it)."""
    kept, _ = _split_sources(metadata)
    try:
        return [_sendable({"prompt": p, **m}) for p, m in zip(prompts, kept, strict=True)]
    except (TypeError, ValueError) as e:
        raise _metadata_error(e) from e


def read_pickle(body: bytes | bytearray, what: str, fix: str) -> Any:
    """``body``, a pickle of protocol 2 or later, read by :func:`diffrl.transport.pickled.loads`
    (bounded; nothing that names another global), or :class:`ProtocolError` (400, 413) saying
    what it holds; ``fix`` is the hint for a body that is JSON instead."""
    if not is_pickle(body):
        if body.lstrip()[:1] in (b"{", b"["):
            raise ProtocolError(400, f"{what} is JSON, not a pickle; {fix}")
        raise ProtocolError(
            400, f"{what} is not a pickle of protocol 2 or later (it opens {quoted(bytes(body[:16]), 60)})"
        )
    try:
        return loads(body, what)
    except PickleRefused as e:
        raise ProtocolError(e.status, e.detail) from e


def _answer_pickle(data: bytes) -> Any:
    try:
        return read_pickle(
            data,
            "its answer",
            f"this protocol reads pickled answers, as its peers' clients do; for a scorer changed to "
            f"answer {JSON_RENDERING}, set protocol: verl_omni_json",
        )
    except ProtocolError as e:
        raise AnswerError(f"answered something diffrl does not read: {e.detail}") from e


def _image_files(value: Any, max_images: int) -> list[bytes]:
    """A pickled body's ``images``: a non-empty list of at most ``max_images`` image files
    (JPEG or PNG; checked by the server from their headers, before any is decoded)."""
    if not isinstance(value, list) or not value:
        raise ProtocolError(400, "images must be a non-empty list of JPEG (or PNG) files' bytes")
    if len(value) > max_images:
        raise ProtocolError(413, f"{len(value)} images, over this server's {max_images} per request")
    for i, v in enumerate(value):
        if not isinstance(v, bytes):
            raise ProtocolError(
                400, f"images[{i}] must be the bytes of a JPEG or PNG file, got {type(v).__name__}"
            )
    return value


def _sample_maps(value: Any, b: int, where: str, prompts: Any) -> list[dict]:
    """``value``: None or a list of ``b`` maps (one per image), without the ``"prompt"`` the
    client added when it is the sample's prompt."""
    if value is None:
        return [{} for _ in range(b)]
    if not isinstance(value, list) or len(value) != b or not all(isinstance(m, dict) for m in value):
        raise ProtocolError(400, f"{where} must be a list of {b} maps (one per image)")
    if not isinstance(prompts, list) or len(prompts) != b:
        return value
    return [{k: v for k, v in m.items() if not (k == "prompt" and v == p)} for m, p in zip(value, prompts)]


# -- reading JSON (both ends) --------------------------------------------------------------------


def read_json(body: bytes | bytearray, what: str = "the body") -> Any:
    """``body`` parsed as JSON, with at most :data:`MAX_JSON_ITEMS` values (counted before parsing,
    413 past them); 415 for a Python pickle (never unpickled here: :data:`PICKLE_PROTOCOLS`); 400
    for anything else that is not JSON, or nested too deep for the parser. Raises
    :class:`ProtocolError`."""
    if is_pickle(body):
        raise ProtocolError(415, f"{what} is a Python pickle, not this protocol's JSON; {PICKLE_PROTOCOLS}")
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
    """The ``n`` scores under ``key`` of an answer (JSON, or a pickle read as plain values);
    ``null``/``None`` and ``NaN`` are failed samples (NaN). :class:`AnswerError` for a missing
    field, a wrong length or a value that is no number; a truthy ``"error"`` field is the server's
    own refusal, quoted."""
    if not isinstance(answer, dict):
        raise AnswerError(f"answered a {type(answer).__name__}, not a map {{{key!r}: [...]}}")
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
    the client may send (the first by default); ``images``: the image files the server reads;
    ``hears``: it can carry sound."""

    name: str
    paths: tuple[str, ...]
    content_type: str
    health: str | None = "/health"
    url_is_endpoint: bool = False
    formats: tuple[str, ...] = ("png",)
    images: tuple[str, ...] = ("png",)
    hears: bool = False
    pickled = False  # a class attribute: its bodies are pickles (read_pickle)

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
        """Server: a peer's body -> diffrl's ``/score`` fields (``format: png``: image files, of
        the kinds in ``images``), or :class:`ProtocolError`. (The ``diffrl`` protocol's msgpack is
        unpacked by the server.)"""
        raise NotImplementedError

    def answer(self, scores: list[float]) -> bytes:
        """Server: the scores -> the answer's body (of ``content_type``)."""
        raise NotImplementedError

    def error_detail(self, data: bytes) -> str | None:
        """Client: the message of an error answer in this protocol's own shape (None: read it as
        text or JSON)."""
        return None


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


class VerlOmniJsonProtocol(Protocol):
    """``verl_omni_json``: verl-omni's fields as JSON (module docstring), for a scorer changed to it."""

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


class PickleProtocol(Protocol):
    """A peer's pickled ``{"images": [JPEG bytes], ...}`` protocol (module docstring): ``fields``,
    the body's; ``keys``, where the answer's scores are (the first one present is read; a served
    reward answers all)."""

    pickled = True
    fields: tuple[str, ...] = ()
    keys: tuple[str, ...] = ("scores",)
    peer = ""

    def request(self, images: list[bytes], prompts: list[str], metas: list[dict]) -> dict[str, Any]:
        raise NotImplementedError

    def encode(self, images, prompts, metadata, fmt, audio=None) -> bytes:
        return dumps(self.request(_encoded(images, fmt), list(prompts), _meta_datas(prompts, metadata)))

    def scores(self, data: bytes, content_type: str, n: int) -> list[float]:
        answer = _answer_pickle(data)  # any content type: Flask answers its pickles as text/html
        if isinstance(answer, dict) and not answer.get("error"):
            key = next((k for k in self.keys if k in answer), None)
            if key is None:
                fields = quoted(sorted(map(str, answer))[:8], 200)
                raise AnswerError(f"answered no {' or '.join(map(repr, self.keys))} (its fields: {fields})")
            return checked_scores(answer, key, n)
        return checked_scores(answer, self.keys[0], n)

    def read(self, body: bytes | bytearray, max_images: int) -> tuple[dict[str, Any], list[bytes]]:
        """The body's map, its fields checked, and its images."""
        fix = (
            f"{self.peer}'s client pickles its body; for a client changed to send {JSON_RENDERING}, "
            "serve --protocol verl_omni_json"
        )
        msg = read_pickle(body, "the body", fix)
        if not isinstance(msg, dict):
            raise ProtocolError(400, f"the body must be a pickled dict, got {type(msg).__name__}")
        _known(msg, self.fields)
        return msg, _image_files(msg.get("images"), max_images)

    def answer(self, scores: list[float]) -> bytes:
        return dumps({key: scores for key in self.keys})

    def error_detail(self, data: bytes) -> str | None:
        try:
            answer = loads(data, "the error answer") if is_pickle(data) else None
        except PickleRefused:
            return None
        return str(answer["error"]) if isinstance(answer, dict) and "error" in answer else None


class VerlOmniProtocol(PickleProtocol):
    fields = ("images", "prompts", "metadata")
    keys = ("scores",)
    peer = "verl-omni"

    def request(self, images, prompts, metas):
        return {"images": images, "prompts": prompts, "metadata": {"meta_datas": metas}}

    def message(self, body: bytes | bytearray, max_images: int) -> dict[str, Any]:
        msg, images = self.read(body, max_images)
        metadata = msg.get("metadata")
        if metadata is not None and not isinstance(metadata, dict):
            raise ProtocolError(
                400,
                "metadata must be a map (verl-omni sends {}, reserved); per-image maps go in its "
                "'meta_datas' list",
            )
        prompts = msg.get("prompts")
        metas = (metadata or {}).get("meta_datas")
        return {
            "format": "png",
            "images": images,
            "prompts": prompts,
            "metadata": _sample_maps(metas, len(images), "metadata['meta_datas']", prompts),
        }


class FlowGrpoProtocol(PickleProtocol):
    fields = ("images", "prompts", "meta_datas", "only_strict")
    keys = ("scores", "outputs")
    peer = "flow_grpo"

    def request(self, images, prompts, metas):
        return {"images": images, "prompts": prompts, "meta_datas": metas, "only_strict": True}

    def message(self, body: bytes | bytearray, max_images: int) -> dict[str, Any]:
        msg, images = self.read(body, max_images)
        if not isinstance(msg.get("only_strict", False), bool):
            raise ProtocolError(400, "only_strict must be a bool")
        prompts = msg.get("prompts")
        if prompts is None:  # DeQA's client sends images alone
            prompts = ["" for _ in images]
        return {
            "format": "png",
            "images": images,
            "prompts": prompts,
            "metadata": _sample_maps(msg.get("meta_datas"), len(images), "meta_datas", prompts),
        }


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


PICKLE = "application/octet-stream"  # what verl-omni's aiohttp client sends bytes as
JPEG_PNG = ("jpeg", "png")
DIFFRL = DiffrlProtocol("diffrl", ("/score",), "application/msgpack", formats=("png", "raw"), hears=True)
PROTOCOLS: dict[str, Protocol] = {
    p.name: p
    for p in (
        DIFFRL,
        FlowFactoryProtocol("flow_factory", ("/compute",), "application/json"),
        VerlOmniProtocol("verl_omni", ("/", "/score"), PICKLE, None, True, formats=JPEG_PNG, images=JPEG_PNG),
        FlowGrpoProtocol("flow_grpo", ("/",), PICKLE, None, True, formats=("jpeg",), images=JPEG_PNG),
        VerlOmniJsonProtocol("verl_omni_json", ("/", "/score"), "application/json", None, True),
    )
}
"""Each protocol by its name (module docstring)."""
HINTS = {
    "pickle": "Pickled bodies are protocols verl_omni (verl-omni's HTTP scorer) and flow_grpo (flow_grpo's reward servers)",
    "verl_omni_pickle": "verl-omni's pickled scorer is protocol verl_omni",
    "reward_server": "yifan123/reward-server's (flow_grpo's) servers are protocol flow_grpo",
}
"""Names people may try -> the protocol they mean."""


def protocol_problem(name: Any) -> str | None:
    """Why ``name`` is no protocol diffrl speaks (None: it is one): an unknown name, with a
    did-you-mean or (:data:`HINTS`) the protocol it means."""
    if isinstance(name, str) and name in PROTOCOLS:
        return None
    if isinstance(name, str) and name in HINTS:
        hint = f" {HINTS[name]}."
    else:
        hint = did_you_mean(name[:100], list(PROTOCOLS)) if isinstance(name, str) else ""
    return f"protocol must be one of {', '.join(PROTOCOLS)}, got {quoted(name, 100)}.{hint}"
