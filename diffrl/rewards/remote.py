"""The ``remote`` reward: scores from a reward server (``diffrl serve-reward``, :mod:`diffrl.serving.server`).

::

    rewards:
      - name: remote
        timeout_s: 120            # the call's deadline (RewardConfig), counted from submit
        params: {url: "http://10.0.0.7:8100", token_env: REWARD_TOKEN, timeout_s: 60, retries: 3}

Each micro-group the collector submits is one ``POST /score`` (the wire format is in
:mod:`diffrl.serving.server`), sent from the reward's call thread in submit order, as an in-process
reward's calls run; the images go as the rollout's exact uint8 pixels (``format: png``, lossless
and usually smaller for generated images, or ``raw``, no encoding cost), so the server's reward sees what an
in-process one would.

Failures: a connection error, a timeout or an HTTP 5xx is retried ``retries`` times, after
``backoff_s * 2**k`` seconds (k = 0, 1, ...); each attempt takes at most ``min(timeout_s, what is
left of the deadline)`` in all (connecting, sending, and the whole answer: a server that drips its
answer a byte at a time is cut off at that total, not per byte), and no attempt or pause goes past
the deadline. 401 / 403 (token missing or refused), 413 (request too large) and other 4xx are not
retried: the same request would fail again. On final failure :class:`~diffrl.rewards.base.RewardError` says why;
the micro-group's samples are failed (NaN, counted in ``rollout/reward_failed``) and the run goes
on. A NaN score from the server fails its sample in the same way.

Videos: ``remote`` is an image reward; a video's frames are sent (and scored) one image each and
the video gets their mean (:func:`~diffrl.rewards.base.submit_scores`).

Peers' servers: ``protocol: flow_factory`` (Flow-Factory's JSON), ``verl_omni`` (verl-omni's
pickled HTTP scorer) or ``flow_grpo`` (flow_grpo's pickled reward servers) speaks their contracts
unchanged instead (:mod:`diffrl.transport.protocols`, which cites them), with the same deadlines,
retries, token and answer limit; their pickled answers are read by a restricted unpickler
(:mod:`diffrl.transport.pickled`) that refuses anything able to run code. The pickle protocols send
JPEGs as their clients do (``format: jpeg``, their default; ``verl_omni`` can send ``png``).

Sound: with ``audio: true`` it is a reward that hears (``Reward.audio``): each clip goes whole, its
frames and its sound (float16, as the rollout keeps it), for a server whose reward hears (``diffrl
serve-reward --reward clap``; its ``/health`` says ``"audio": true``, and preflight checks the two
agree).
"""

from __future__ import annotations

import http.client
import math
import os
import urllib.parse
from collections.abc import Sequence
from typing import Annotated, Any

import torch

from diffrl.config import Range
from diffrl.core.rollout import Audio
from diffrl.rewards.base import Reward, RewardError
from diffrl.transport.client import (
    ENV_NAME,
    GaveUp,
    Retry,
    answer_detail,
    exchange,
    peer_problems,
    server_problems,
    token_value_problem,
    url_problem,
    with_retries,
)
from diffrl.transport.protocols import DIFFRL, PROTOCOLS, AnswerError, protocol_problem

FORMATS = ("png", "raw", "jpeg")


def param_value_problems(params: dict[str, Any], check_env: bool) -> list[str]:
    """What is wrong with the values of ``params`` (``check_env``: also that ``token_env`` is set)."""
    problems = []
    name = params.get("protocol", "diffrl")
    if (p := protocol_problem(name)) is not None:
        problems.append(p)
    protocol = PROTOCOLS.get(name, DIFFRL) if isinstance(name, str) else DIFFRL
    if "url" not in params:
        problems.append("url is required: the reward server's address, e.g. 'http://10.0.0.7:8100'")
    elif (p := url_problem(params["url"], protocol)) is not None:
        problems.append(p)
    env = params.get("token_env")
    if env is not None:
        if not isinstance(env, str) or not ENV_NAME.fullmatch(env):
            problems.append(
                f"token_env must be the name of an environment variable (e.g. REWARD_TOKEN), got {env!r}"
            )
        elif check_env and (p := token_value_problem(env, os.environ.get(env, "").strip())) is not None:
            problems.append(p)
    for key, positive in (("timeout_s", True), ("backoff_s", False)):
        value = params.get(key, 1.0)
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        if not ok or (value <= 0 if positive else value < 0):
            problems.append(
                f"{key} must be a number of seconds {'> 0' if positive else '>= 0'}, got {value!r}"
            )
    retries = params.get("retries", 0)
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        problems.append(f"retries must be an integer >= 0 (attempts after the first), got {retries!r}")
    if not isinstance(params.get("audio", False), bool):
        problems.append(
            f"audio must be true or false (does the server's reward hear?), got {params['audio']!r}"
        )
    elif params.get("audio") and not protocol.hears:
        problems.append(f"audio: protocol {protocol.name} carries no sound; only protocol diffrl does")
    fmt = params.get("format") or protocol.formats[0]
    if fmt not in FORMATS:
        problems.append(f"format must be png, raw or jpeg, got {params['format']!r}")
    elif fmt not in protocol.formats:
        problems.append(f"format {fmt}: protocol {protocol.name} sends {' or '.join(protocol.formats)} only")
    return problems


class RemoteReward(Reward):
    """Scores from the reward server at ``url``.

    ``token_env``: the environment variable holding the server's token (None: the server has
    none). ``timeout_s``: the most one attempt waits (per socket operation), within the call's
    deadline. ``retries``: attempts after the first, on connection errors, timeouts and 5xx,
    ``backoff_s * 2**k`` seconds apart. ``format``: ``png`` or ``raw`` (module docstring), ``jpeg``
    for a pickle protocol (None: the protocol's first, ``png`` for diffrl's).
    ``audio``: the server's reward hears; send each clip whole with its sound. ``protocol``: the
    server's wire protocol, ``diffrl`` or a peer's (:mod:`diffrl.transport.protocols`).
    """

    name = "remote"

    def __init__(
        self,
        url: str,
        token_env: str | None = None,
        timeout_s: Annotated[
            float, Range(0, 604_800, lo_open=True, hint="seconds per attempt, at most a week")
        ] = 60.0,
        retries: Annotated[
            int, Range(0, 1000, hint="attempts after the first, within the call's deadline")
        ] = 3,
        backoff_s: Annotated[float, Range(0, 3600, hint="seconds, doubled after each retry")] = 0.5,
        format: str | None = None,
        audio: bool = False,
        protocol: str = "diffrl",
    ):
        params = dict(url=url, token_env=token_env, timeout_s=timeout_s, retries=retries, backoff_s=backoff_s)
        params.update(format=format, audio=audio, protocol=protocol)
        problems = param_value_problems(params, check_env=True)
        if problems:
            raise RewardError("reward 'remote': " + "; ".join(problems))
        parts = urllib.parse.urlsplit(url)
        self.url, self.token_env = url.rstrip("/"), token_env
        self.protocol = PROTOCOLS[protocol]
        self.timeout_s, self.retries, self.backoff_s, self.format = (
            float(timeout_s),
            int(retries),
            float(backoff_s),
            format or self.protocol.formats[0],
        )
        self._path = self.protocol.endpoint(parts.path)
        self._token = os.environ[token_env].strip() if token_env else None  # as serve-reward strips its own
        self.audio = audio  # this instance hears when its server's reward does

    @classmethod
    def hears(cls, params: dict[str, Any]) -> bool:
        return params.get("audio", False) is True

    @classmethod
    def param_problems(cls, params: dict[str, Any], check_files: bool) -> list[str]:
        """The params' values; with ``check_files``, also that ``token_env`` is set here and that
        a diffrl reward server answers at ``url`` (``/health``, in seconds), wanting a token only
        if one is given (a peer's protocol: :func:`peer_problems`)."""
        problems = param_value_problems(params, check_env=check_files)
        protocol = PROTOCOLS.get(params.get("protocol", "diffrl"), DIFFRL)
        if check_files and not problems and protocol is not DIFFRL:
            problems += peer_problems(params["url"], protocol, params.get("token_env"))
        elif check_files and not problems:
            problems += server_problems(
                params["url"],
                params.get("token_env"),
                audio=params.get("audio", False),
                request_timeout_s=params.get("timeout_s", 60.0),
            )
        return problems

    # -- calls ------------------------------------------------------------------------------------

    def __call__(self, images, prompts, metadata, audio: Audio | None = None) -> torch.Tensor:
        return self.call_by(images, prompts, metadata, None, audio)

    def call_by(
        self,
        images: torch.Tensor,
        prompts: Sequence[str],
        metadata: Sequence[dict],
        deadline: float | None,
        audio: Audio | None = None,
    ) -> torch.Tensor:
        """``images (B, 3, H, W)`` (with ``audio``: clips ``(B, 3, F, H, W)`` and their sound) ->
        ``(B,)`` scores from the server, retried until ``deadline`` (``time.monotonic()``; None:
        only ``retries`` bound it)."""
        body = self.protocol.encode(images, prompts, metadata, self.format, audio)
        try:
            return with_retries(
                lambda wait: self._attempt(body, len(prompts), wait),
                self.timeout_s,
                self.retries,
                self.backoff_s,
                deadline,
            )
        except GaveUp as e:
            raise RewardError(f"remote reward server {self.url} failed after {e}") from None

    def _attempt(self, body: bytes, n: int, wait: float) -> torch.Tensor:
        # X-Timeout-S: the server skips the request if it is still queued when this attempt gave up
        headers = {
            "Content-Type": self.protocol.content_type,
            "Accept": self.protocol.content_type,
            "X-Timeout-S": f"{max(wait, 0.001):.3f}",  # the server's strict format: decimal seconds > 0
        }
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        try:
            status, data, ctype = exchange(self.url, "POST", self._path, wait, body, headers)
        except TimeoutError as e:
            raise Retry(f"no answer within {wait:.3g} s") from e
        except (OSError, http.client.HTTPException) as e:
            raise Retry(f"{type(e).__name__}: {e}") from e
        if status == 200:
            return self._scores(data, ctype, n)
        detail = self.protocol.error_detail(data) or answer_detail(data)
        if len(detail) > 500:
            detail = detail[:500] + "..."
        if status in (401, 403):
            if self._token is None:
                fix = "the server needs a token: set the reward's token_env to a variable holding it"
            else:
                fix = f"check the token in ${self.token_env} against the server's"
            raise RewardError(
                f"remote reward server {self.url} refused the request (HTTP {status}: {detail}); {fix}"
            )
        if status == 413:
            raise RewardError(
                f"remote reward server {self.url}: a request of {len(body) / 2**20:.1f} MB is too large "
                f"(HTTP 413: {detail}); raise the server's --max-request-mb or lower "
                f"rollout.micro_group_size{', or send format: png' if self.format == 'raw' else ''}"
            )
        if status >= 500:
            raise Retry(f"HTTP {status}: {detail}")
        raise RewardError(f"remote reward server {self.url} rejected the request (HTTP {status}: {detail})")

    def _scores(self, data: bytes, ctype: str, n: int) -> torch.Tensor:
        try:
            scores = self.protocol.scores(data, ctype, n)
        except AnswerError as e:
            who = self.url if self.protocol is DIFFRL else f"{self.url} (protocol {self.protocol.name})"
            raise RewardError(f"remote reward server {who} {e}") from e
        return torch.tensor(scores, dtype=torch.float64).float()
