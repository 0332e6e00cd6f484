"""The client side of a reward server, and of any scorer diffrl asks over HTTP (the ``remote``
reward, :mod:`diffrl.rewards.remote`; the ``openai_judge`` reward): addresses and tokens checked
before they are used, one bounded request (:func:`exchange`: a deadline on the whole exchange,
not per byte, and a bound on the answer's size), a server's ``/health`` asked at preflight
(:func:`server_problems`, :func:`peer_problems`), and retries within a call's deadline
(:func:`with_retries`). The server itself is :mod:`diffrl.serving.server`; the bodies both sides
send, :mod:`diffrl.transport.protocols`.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any, TypeVar

from diffrl.transport.protocols import DIFFRL, Protocol
from diffrl.transport.workers import seconds_left

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _shown(value: Any, most: int = 200) -> str:
    """``repr(value)``, at most ``most`` characters of it (a config's value may be any length)."""
    text = repr(value)
    return text if len(text) <= most else text[:most] + "..."


def host_problem(host: str) -> str | None:
    """Why ``host`` (a URL's host name) cannot be looked up (None when it can): the resolver
    encodes it with IDNA, which refuses an empty label (``judge..host``) or one over 63 characters
    with a UnicodeError that no caller expects."""
    try:
        host.encode("idna")
    except UnicodeError:
        return (
            f"the host {_shown(host, 100)} is no valid host name (each dot-separated part must be 1 to 63 "
            "characters); fix the host"
        )
    return None


def token_value_problem(env: str, token: str) -> str | None:
    """Why the token in ``$env`` (surrounding whitespace dropped) cannot go in an HTTP header
    (None when it can). The message never shows the token: it is a secret."""
    if not token:
        return (
            f"token_env: the environment variable {env} is not set (or empty) here; export it with "
            "the server's token before starting the run"
        )
    if not all(33 <= ord(c) <= 126 for c in token):
        return (
            f"token_env: the token in {env} holds a character other than printable ASCII (a space, tab, "
            "line break, control or non-ASCII character inside it), which an HTTP header cannot carry "
            "(diffrl serve-reward accepts no such token either); export the token alone"
        )
    return None


def http_url(url: str) -> urllib.parse.SplitResult | None:
    """``url`` split, if it is ``http(s)://HOST[:PORT]...`` with a valid port; else None."""
    parts = urllib.parse.urlsplit(url)
    try:
        parts.port  # noqa: B018 - raises on a port out of range or not a number
    except ValueError:
        return None
    return parts if parts.scheme in ("http", "https") and parts.hostname else None


def url_problem(url: Any, protocol: Protocol = DIFFRL) -> str | None:
    if not isinstance(url, str):
        return f"url must be the server's address, e.g. 'http://10.0.0.7:8100', got {_shown(url)}"
    parts = http_url(url)
    if parts is None:
        return f"url must be http(s)://HOST:PORT of a reward server (diffrl serve-reward), got {_shown(url)}"
    if (p := host_problem(parts.hostname)) is not None:
        return f"url {_shown(url)}: {p}"
    if parts.query or parts.fragment:
        return f"url {_shown(url)}: give the server's address without a query or fragment"
    ends = (*protocol.paths, "/health")
    if not protocol.url_is_endpoint and parts.path.rstrip("/").endswith(ends):
        return (
            f"url {_shown(url)}: give the server's base address (the client adds {protocol.paths[0]}), e.g. "
            f"{_shown(url.rsplit('/', 1)[0])}"
        )
    return None


def _json(body: bytes) -> Any:
    """``body`` as JSON, or None if it is none (or nested too deep for Python's parser: a broken
    or hostile server's answer is never an error of ours)."""
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        return None


def answer_detail(body: bytes, most: int = 500) -> str:
    """A server's answer's ``detail`` (or its text), at most ``most`` characters."""
    answer = _json(body)
    text = None
    if isinstance(answer, dict):  # FastAPI's {"detail"}; verl-omni's and Flow-Factory's {"error"}
        key = "detail" if "detail" in answer else "error" if "error" in answer else None
        text = None if key is None else str(answer[key])
    if text is None:
        text = body[: 4 * most].decode("utf-8", "replace").strip() or "(empty body)"
    return text if len(text) <= most else text[:most] + "..."


PROBE_TIMEOUT_S = 3.0
"""How long preflight waits for a server's ``/health``, in all."""
MAX_ANSWER_BYTES = 64 * 2**20
"""The most of a server's answer read (a ``/score`` answer is 9 bytes a score): past it, the
answer is refused, so a broken or hostile server cannot fill the trainer's memory."""


class AnswerTooLarge(http.client.HTTPException):
    """An answer over the bound :func:`exchange` reads."""


def exchange(
    url: str,
    method: str,
    path: str,
    timeout_s: float,
    body: bytes | None = None,
    headers: dict | None = None,
    max_bytes: int | None = None,
) -> tuple[int, bytes, str]:
    """One HTTP request to ``url``'s host: ``(status, body, Content-Type)``, all of it within
    ``timeout_s`` seconds in total (connecting, sending, the answer's head and body), or
    ``TimeoutError``. ``OSError`` / ``http.client.HTTPException`` when the exchange fails, also
    (:class:`AnswerTooLarge`) for an answer over ``max_bytes`` (None: :data:`MAX_ANSWER_BYTES`), of
    which at most one byte more is read, and for what http.client and the resolver raise as
    ``ValueError``: a header value it cannot send (its message would quote the value, a token: the
    ``OSError`` does not) or a host name IDNA refuses (``UnicodeError``).

    Socket timeouts bound each operation, not the whole: a server that sends a byte every second
    would hold the caller for as long as it likes. A timer shuts the socket down at the deadline,
    which ends whichever wait is under way.
    """
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    expired = threading.Event()

    def expire() -> None:
        expired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:  # closed already
                pass

    timer = threading.Timer(timeout_s, expire)
    timer.daemon = True
    timer.start()
    stage = "connecting to"
    try:
        conn.connect()  # bounded by timeout_s itself; the timer may have found no socket yet
        if expired.is_set():
            raise TimeoutError
        stage = "sending the request to"
        try:
            conn.request(method, path, body=body, headers=headers or {})
        except (BrokenPipeError, ConnectionResetError):
            # the server may answer (413, 401) and close before the whole body is sent: read it
            if expired.is_set():
                raise
        stage = "reading the answer of"
        response = conn.getresponse()
        most = MAX_ANSWER_BYTES if max_bytes is None else max_bytes
        data = response.read(most + 1)
        if len(data) > most:
            raise AnswerTooLarge(f"the answer is over {most:,} bytes")
        if expired.is_set():  # a body without a length ends at the shutdown: cut short, not whole
            raise TimeoutError
        return response.status, data, response.getheader("Content-Type", "")
    except (OSError, http.client.HTTPException) as e:
        if expired.is_set() and not isinstance(e, TimeoutError):
            raise TimeoutError(f"no complete answer within {timeout_s:.3g} s") from e
        raise
    except ValueError as e:  # not chained: its message may quote a header's value, the token
        if expired.is_set():
            raise TimeoutError(f"no complete answer within {timeout_s:.3g} s") from None
        raise OSError(f"{type(e).__name__} while {stage} the server ({_value_error(e, stage)})") from None
    finally:
        timer.cancel()
        conn.close()


def probe(url: str, path: str, timeout_s: float, headers: dict | None = None) -> tuple[int, bytes] | str:
    """``GET path`` at ``url``'s host within ``timeout_s`` in all (preflight's look at a server):
    ``(status, body)``, or why nothing answered (``no answer in 3 s``, ``ConnectionRefusedError:
    ...``)."""
    try:
        status, data, _ = exchange(url, "GET", path, timeout_s, headers=headers)
    except (OSError, http.client.HTTPException) as e:
        return f"no answer in {timeout_s:g} s" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
    return status, data


def _value_error(e: ValueError, stage: str) -> str:
    """What a ValueError of http.client or the resolver means, without its message."""
    if isinstance(e, UnicodeError) and stage == "connecting to":
        return "its host name is no valid IDNA name: an empty label or one over 63 characters"
    if stage == "sending the request to":
        return "a header value holds a character an HTTP header cannot carry"
    if stage == "reading the answer of":
        return "a malformed HTTP answer"
    return "a value http.client refused"


def server_problems(
    url: str,
    token_env: str | None,
    timeout_s: float = PROBE_TIMEOUT_S,
    audio: bool = False,
    request_timeout_s: float | None = None,
) -> list[str]:
    """Why ``url`` is no usable reward server (asks its ``/health``, within ``timeout_s`` in all;
    no token needed). ``request_timeout_s``: the client's ``timeout_s``, which the server's
    ``max_timeout_s`` must allow."""
    answer = probe(url, urllib.parse.urlsplit(url).path.rstrip("/") + "/health", timeout_s)
    if isinstance(answer, str):
        return [
            f"url: no reward server answers at {url} ({answer}); start it first (diffrl serve-reward "
            "--reward NAME --host HOST --port PORT ...) or fix the url"
        ]
    status, data = answer
    health = _json(data)
    ok = status == 200 and isinstance(health, dict) and health.get("status") == "ok"
    if status == 503 and isinstance(health, dict) and health.get("status") == "broken":
        return [f"url: the reward server at {url} is broken ({answer_detail(data)}); restart it"]
    if not ok:
        return [
            f"url: {url}/health answered HTTP {status} {answer_detail(data, 200)!r}; "
            "is it a diffrl reward server?"
        ]
    if (speaks := health.get("protocol", "diffrl")) != "diffrl":
        return [_protocol_mismatch(url, speaks, DIFFRL)]
    if health.get("token_required") and token_env is None:
        return [_token_needed(url)]
    most = health.get("max_timeout_s")
    if request_timeout_s is not None and isinstance(most, int | float) and request_timeout_s > most:
        return [
            f"timeout_s: {request_timeout_s:g} s is over the reward server's max_timeout_s of {most:g} s "
            f"(it refuses longer waits); set timeout_s <= {most:g}"
        ]
    hears = bool(health.get("audio", False))
    if hears != audio:
        return [
            f"audio: the reward server at {url} serves {health.get('reward')!r}, which "
            + (
                "hears: set audio: true to send the clips with their sound"
                if hears
                else "does not hear: leave audio out (false)"
            )
        ]
    return []


def _token_needed(url: str) -> str:
    return (
        f"token_env: the reward server at {url} needs a token; set token_env to the name of an "
        "environment variable holding it"
    )


def _protocol_mismatch(url: str, speaks: Any, protocol: Protocol) -> str:
    return (
        f"protocol: the reward server at {url} is a diffrl reward server answering protocol "
        f"{str(speaks)[:40]!r}, not {protocol.name!r}; set protocol: {str(speaks)[:40]} (or restart it "
        f"with --protocol {protocol.name})"
    )


def peer_problems(
    url: str, protocol: Protocol, token_env: str | None, timeout_s: float = PROBE_TIMEOUT_S
) -> list[str]:
    """Why no server of ``protocol`` (a peer's, not ``diffrl``) answers at ``url``: asks its health
    path (a 2xx wanted), or, for a contract without one (``verl_omni``), the URL itself (any answer
    but 404: a POST-only route answers 405), within ``timeout_s`` in all. A diffrl server's
    ``/health`` also says which protocol it answers and whether it wants a token."""
    parts = urllib.parse.urlsplit(url)
    path = parts.path.rstrip("/") + protocol.health if protocol.health else (parts.path or "/")
    answer = probe(url, path, timeout_s)
    if isinstance(answer, str):
        return [
            f"url: no reward server answers at {url} ({answer}); start it first or fix the url "
            f"(protocol {protocol.name})"
        ]
    status, data = answer
    health = _json(data)
    if isinstance(health, dict) and "protocol" in health and health["protocol"] != protocol.name:
        return [_protocol_mismatch(url, health["protocol"], protocol)]
    if protocol.health is not None and not 200 <= status < 300:
        return [
            f"url: {url.rstrip('/')}{protocol.health} answered HTTP {status} "
            f"{answer_detail(data, 200)!r}; is it a {protocol.name} reward server?"
        ]
    if protocol.health is None and status == 404:
        return [
            f"url: {url} answered HTTP 404 (no route there); give the scorer's endpoint itself, e.g. "
            "http://HOST:PORT or http://HOST:PORT/score"
        ]
    if isinstance(health, dict) and health.get("token_required") and token_env is None:
        return [_token_needed(url)]
    return []


class Retry(Exception):
    """An attempt that failed in a way worth trying again (connection, timeout, 5xx; for a judge
    also 429): :func:`with_retries` tries again."""


class GaveUp(Exception):
    """:func:`with_retries` ran out of attempts or of time; its text is ``N attempt(s)[, at the
    reward's deadline]: <the last attempt's reason>``."""


T = TypeVar("T")


def with_retries(
    attempt: Callable[[float], T], timeout_s: float, retries: int, backoff_s: float, deadline: float | None
) -> T:
    """``attempt(wait)``, each try given ``wait = min(timeout_s, what is left of deadline)``
    seconds, tried again on :class:`Retry` after ``backoff_s * 2**k`` (k = 0, 1, ...) at most
    ``retries`` times; no try or pause goes past ``deadline`` (``time.monotonic()``; None: only
    ``retries`` bound it). :class:`GaveUp` when the tries or the time run out; anything else
    ``attempt`` raises goes through. The remote and openai_judge rewards' requests."""
    tries = 0
    while True:
        left = seconds_left(deadline)
        wait = timeout_s if left is None else min(timeout_s, left)
        try:
            if wait <= 0:
                raise Retry("no time left before the reward's deadline")
            return attempt(wait)
        except Retry as e:
            reason = str(e)
        tries += 1
        pause = backoff_s * 2 ** (tries - 1)
        left = seconds_left(deadline)
        if tries > retries or (left is not None and left <= pause):
            where = "" if tries > retries else ", at the reward's deadline"
            raise GaveUp(f"{tries} attempt(s){where}: {reason}")
        time.sleep(pause)
