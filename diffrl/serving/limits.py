"""What one client may cost a reward server (:mod:`diffrl.serving.server`): :class:`ServerLimits`.

A module of its own with no heavy imports: ``diffrl serve-reward``'s flags (one per limit,
:func:`flag_name`) are made from these fields when the command line starts, before torch or the
server's web stack loads, and their ranges are the fields' :class:`~diffrl.config.Range`.
"""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, NamedTuple

from diffrl.config import Range

DEFAULT_MAX_REQUEST_MB = 64.0
PIL_MAX_PIXELS = 89_478_485
"""PIL's own limit (``Image.MAX_IMAGE_PIXELS``): past it, PIL warns, then refuses to decode."""
MAX_TOKEN_FILE_BYTES = 4096
"""``--token-file`` is read up to this many bytes (a token is tens of characters); a larger file,
or one that is no regular file (a FIFO, ``/dev/zero``), is refused."""


def _limit(help: str, default: Any) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class ServerLimits:
    """What one client may cost the server; each is checked before the cost is paid.

    Memory: request bodies hold at most ``max_active x max_request_mb`` in all; at most
    ``max_active`` requests at once also hold their msgpack objects (``MAX_OBJECTS`` of
    :mod:`diffrl.serving.server`, ~64 MB at most) and decoded pixels (``max_request_pixels``, 3
    bytes each: another ``max_request_mb``), and one of them is being scored (float32, 4x its
    pixels, and whatever the reward makes of them); every other connection holds at most uvicorn's
    64 KB read buffer and a 16 KB head. With the defaults that is about 4 x 64 + 4 x (64 + 64) +
    5 x 64 MB + 256 x 80 KB, about 1.1 GB above the reward's own memory, whatever clients send.
    """

    max_request_mb: Annotated[float, Range(0, 65536, lo_open=True)] = _limit(
        "larger requests get HTTP 413; also bounds a request's pixels (what this many MB of raw RGB holds)",
        DEFAULT_MAX_REQUEST_MB,
    )
    max_image_pixels: Annotated[int, Range(1, PIL_MAX_PIXELS)] = _limit(
        "pixels of one image (or source image), read from its header before it is decoded", 4096 * 4096
    )
    max_aspect_ratio: Annotated[float, Range(1, 2**16)] = _limit(
        "an image's long side over its short side (a 1 x 16 M strip is within the pixels but breaks "
        "rewards that resize), read from its header",
        64.0,
    )
    max_images: Annotated[int, Range(1, 2**20)] = _limit(
        "images of one request (a clip's frames each count)", 16384
    )
    max_timeout_s: Annotated[float, Range(0, 7 * 86400, lo_open=True)] = _limit(
        "the largest X-Timeout-S a client may ask for, and the deadline of a request that sends none",
        3600.0,
    )
    head_timeout_s: Annotated[float, Range(0, 3600, lo_open=True)] = _limit(
        "a request's head (request line and headers) must arrive within this many seconds, counted "
        "from the connection or the previous answer on it",
        10.0,
    )
    body_timeout_s: Annotated[float, Range(0, 86400, lo_open=True)] = _limit(
        "a request's body must arrive within this many seconds of the server starting to read it", 60.0
    )
    max_connections: Annotated[int, Range(1, 2**16)] = _limit(
        "open connections; one more is answered 503 and closed at once", 256
    )
    max_active: Annotated[int, Range(1, 1024)] = _limit(
        "requests decoded, queued or scored at once (the bodies being read hold at most this many "
        "times --max-request-mb)",
        4,
    )

    @property
    def max_request_bytes(self) -> int:
        return int(self.max_request_mb * 2**20)

    @property
    def max_request_pixels(self) -> int:
        """Pixels of one request (its images and sources): as many as ``max_request_mb`` of raw
        RGB bytes carry, so a PNG request decodes to no more than a raw one could send."""
        return self.max_request_bytes // 3

    def problems(self) -> list[str]:
        """What is out of its range or of the wrong type (all at once), named by its flag."""
        problems = []
        for name, (kind, bounds, _, _) in limit_fields().items():
            value = getattr(self, name)
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and (kind is float or isinstance(value, int)) and value == value  # NaN: not in
            if not (ok and value in bounds):
                what = "an integer" if kind is int else "a number"
                problems.append(f"{flag_name(name)} must be {what} {bounds.text()}, got {value!r}")
        return problems


class Limit(NamedTuple):
    kind: type
    """int or float"""
    bounds: Range
    help: str
    default: float


def limit_fields() -> dict[str, Limit]:
    """Each limit of :class:`ServerLimits` by its field name."""
    hints = typing.get_type_hints(ServerLimits, include_extras=True)
    out = {}
    for f in dataclasses.fields(ServerLimits):
        kind, bounds = typing.get_args(hints[f.name])
        out[f.name] = Limit(kind, bounds, f.metadata["help"], f.default)
    return out


def flag_name(name: str) -> str:
    """``max_request_mb`` -> ``--max-request-mb``."""
    return "--" + name.replace("_", "-")
