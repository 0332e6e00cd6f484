"""The reward server (``diffrl serve-reward``) and the ``remote`` reward, over real loopback sockets:
servers run in a thread of this process (uvicorn on a free port).

Timing checks are upper bounds only, generous (seconds) against what should take milliseconds:
they show that a failure does not hang, not how fast anything is. Rewards that block wait on
:data:`RELEASE`, set after each test.
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import json
import math
import socket
import sys
import threading
import time

import msgpack
import numpy as np
import pytest
import torch

from diffrl.cli import main
from diffrl.cli.commands.serve_reward import reward_params
from diffrl.config import RewardConfig
from diffrl.core.errors import DiffrlError
from diffrl.core.rollout import Audio
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.remote import RemoteReward
from diffrl.serving.server import RewardServer, ServerError, build_served_reward
from diffrl.transport.client import server_problems
from diffrl.transport.protocols import encode_request
from tests.rewards import pixel_sum

HERE = "tests.unit.serving.test_server"
TOKEN = "s3cret-token"
STRONG_TOKEN = "9f86d081884c7d659a2feaa0c55ad015"  # what a server reachable from other machines needs
TOKEN_ENV = "DIFFRL_TEST_REWARD_TOKEN"
RELEASE = threading.Event()
ACTIVE = {"now": 0, "max": 0, "calls": 0}
LOCK = threading.Lock()


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    global RELEASE
    RELEASE = threading.Event()
    ACTIVE.update(now=0, max=0, calls=0)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    yield
    RELEASE.set()


# -- rewards the servers run --------------------------------------------------------------------


def counted(images, prompts, metadata):
    """pixel_sum, recording how many calls run at once."""
    with LOCK:
        ACTIVE["now"] += 1
        ACTIVE["calls"] += 1
        ACTIVE["max"] = max(ACTIVE["max"], ACTIVE["now"])
    time.sleep(0.02)  # long enough that overlapping calls would overlap here
    with LOCK:
        ACTIVE["now"] -= 1
    return pixel_sum(images, prompts, metadata)


def raises(images, prompts, metadata):
    ACTIVE["calls"] += 1
    raise ValueError("boom on purpose")


def wrong_shape(images, prompts, metadata):
    return [0.0] * (len(images) + 1)


def one_nan(images, prompts, metadata):
    return [math.nan] + [1.0] * (len(images) - 1)


def video_mean(videos, prompts, metadata):
    return videos.mean(dim=(1, 2, 3, 4))


video_mean.video = True


def blocks(images, prompts, metadata):
    RELEASE.wait()
    return [0.0] * len(images)


def exits(images, prompts, metadata):
    """A reward that wraps a command-line tool, which ends with sys.exit."""
    sys.exit(3)


# -- helpers --------------------------------------------------------------------------------------


@contextlib.contextmanager
def serving(fn: str = "pixel_sum", token: str | None = TOKEN, **kw):
    reward = build_served_reward(f"{HERE}:{fn}", {})
    server = RewardServer(reward, fn, "127.0.0.1", 0, token, **kw).start()
    try:
        yield server
    finally:
        RELEASE.set()  # a blocked reward would hold the server's worker thread at shutdown
        server.stop()


def remote(url: str, deadline_s: float = 30.0, **params) -> RewardSet:
    """A run's RewardSet with one ``remote`` reward of ``params``; ``deadline_s``: its call's
    deadline (the RewardConfig's ``timeout_s``)."""
    params = {"url": url, "token_env": TOKEN_ENV, "retries": 0, **params}
    return RewardSet([RewardConfig(name="remote", params=params, timeout_s=deadline_s)])


def images(b: int = 4, h: int = 16, w: int = 24, seed: int = 0) -> torch.Tensor:
    """Rollout images: uint8 ``(B, 3, H, W)``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (b, 3, h, w), generator=g, dtype=torch.uint8)


def post(url: str, body: bytes, headers: dict[str, str] | None = None, chunked: bool = False):
    """A raw request to ``/score``: (status, decoded body)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        if chunked:
            conn.request("POST", "/score", body=iter([body]), headers=headers or {}, encode_chunked=True)
        else:
            conn.request("POST", "/score", body=body, headers=headers or {})
        r = conn.getresponse()
        data = r.read()
        return r.status, msgpack.unpackb(data) if "msgpack" in r.getheader(
            "Content-Type", ""
        ) else json.loads(data)
    finally:
        conn.close()


def body(n: int = 2) -> bytes:
    x = images(n)
    return msgpack.packb(
        {"format": "raw", "images": x.numpy().tobytes(), "shape": list(x.shape), "prompts": ["p"] * n}
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- scores ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_remote_scores_equal_the_in_process_rewards_bit_for_bit(fmt):
    x, prompts, meta = images(), [f"p{i}" for i in range(4)], [{"i": i} for i in range(4)]
    local = RewardSet([RewardConfig(name=f"{HERE}:pixel_sum")])(x, prompts, meta)
    with serving() as server:
        far = remote(server.url, format=fmt)
        out = far(x, prompts, meta)
        far.close()
    # both get uint8 / 255: the same floats, the same float32 arithmetic, the same scores
    assert torch.equal(out.total, local.total), (out.total, local.total)


def source_difference(images, prompts, metadata):
    """An edit reward: the mean absolute difference to each sample's source (none: -1)."""
    out = []
    for image, meta in zip(images, metadata):
        source = meta.get("source_image")
        assert source is None or source.dtype == torch.uint8
        out.append(-1.0 if source is None else (image - source.float() / 255).abs().mean().item())
    return out


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_source_images_reach_a_remote_edit_reward_as_in_process(fmt):
    """An editing family's ``metadata["source_image"]`` (uint8 ``(3, H, W)``) travels as a PNG
    and reaches the served reward as the same tensor: the same scores; a sample without one gets
    none."""
    x, sources = images(3), images(3, seed=1)
    meta = [{"source_image": sources[0], "k": 0}, {"k": 1}, {"source_image": sources[2]}]
    local = RewardSet([RewardConfig(name=f"{HERE}:source_difference")])(x, ["p"] * 3, meta)
    with serving("source_difference") as server:
        far = remote(server.url, format=fmt)
        out = far(x, ["p"] * 3, meta)
        far.close()
    assert not out.errors and torch.equal(out.total, local.total), (out.total, local.total)
    assert out.total[1] == -1.0 and out.total[0] > 0
    bad = msgpack.unpackb(body(2))
    bad["sources"] = [b"not a png", None]
    with serving("source_difference") as server:
        status, detail = post(server.url, msgpack.packb(bad), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 400 and "sources[0] is not a PNG file" in detail["detail"], detail


def test_nan_scores_come_back_as_nan_and_fail_their_samples():
    with serving("one_nan") as server:
        out = remote(server.url).submit(images(3), ["p"] * 3, [{}] * 3).result()
    assert out.total[0].isnan() and out.total[1:].tolist() == [1.0, 1.0]
    assert "1 non-finite score" in out.errors[0]


def test_health_needs_no_token_and_names_the_reward():
    with serving() as server:
        host, port = server.url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("GET", "/health")
        r = conn.getresponse()
        assert r.status == 200
        assert json.loads(r.read()) == {
            "status": "ok",
            "reward": "pixel_sum",
            "token_required": True,
            "max_request_mb": 64.0,
            "max_timeout_s": 3600.0,
            "max_image_pixels": 4096 * 4096,
            "max_request_pixels": 64 * 2**20 // 3,
            "max_aspect_ratio": 64.0,
            "audio": False,
        }
        conn.close()


# -- auth -----------------------------------------------------------------------------------------


def test_no_token_is_refused_with_401_and_the_client_says_so(monkeypatch):
    with serving() as server:
        status, answer = post(server.url, body())
        assert status == 401 and "token missing" in answer["detail"]
        out = remote(server.url, token_env=None).submit(images(), ["p"] * 4, [{}] * 4).result()
    assert out.total.isnan().all()
    assert (
        "HTTP 401" in out.errors[0]
        and "the server needs a token: set the reward's token_env" in out.errors[0]
    )
    assert ACTIVE["calls"] == 0


def test_a_wrong_token_is_refused_with_401_naming_the_variable(monkeypatch):
    with serving() as server:
        status, answer = post(server.url, body(), {"Authorization": "Bearer nope"})
        assert status == 401 and "token wrong" in answer["detail"]
        monkeypatch.setenv(TOKEN_ENV, "not-the-token")
        t0 = time.monotonic()
        out = remote(server.url, retries=3, backoff_s=1.0).submit(images(), ["p"] * 4, [{}] * 4).result()
    assert f"check the token in ${TOKEN_ENV}" in out.errors[0]
    assert time.monotonic() - t0 < 0.9  # not retried (a retry would first sleep backoff_s = 1 s)


def test_a_non_loopback_address_without_a_token_is_refused(capsys):
    reward = build_served_reward(f"{HERE}:pixel_sum", {})
    with pytest.raises(ServerError, match="not a loopback address, and the server has no token"):
        RewardServer(reward, "r", "0.0.0.0", 0, token=None)
    assert main(["serve-reward", "--reward", f"{HERE}:pixel_sum", "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --host 0.0.0.0 is not a loopback address") and err.count("\n") == 1
    RewardServer(reward, "r", "0.0.0.0", 0, token=STRONG_TOKEN).sock.close()  # with a strong token it may


def test_a_video_reward_is_refused_at_start():
    with pytest.raises(ServerError, match="scores whole videos .* serves image rewards"):
        build_served_reward(f"{HERE}:video_mean", {})


# -- size limit -----------------------------------------------------------------------------------


def test_an_oversized_request_is_refused_with_413():
    limit_mb = 0.25
    big = images(2, 256, 256)  # 384 KiB raw, over the limit
    with serving(max_request_mb=limit_mb) as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        status, answer = post(server.url, body(2) + b"", auth)
        assert status == 200  # a small request passes
        raw = msgpack.packb(
            {
                "format": "raw",
                "images": big.numpy().tobytes(),
                "shape": list(big.shape),
                "prompts": ["p", "p"],
            }
        )
        assert post(server.url, raw, auth)[0] == 413  # refused from its Content-Length
        status, answer = post(server.url, raw, auth, chunked=True)  # no Content-Length: counted
        assert status == 413 and "over this server's --max-request-mb 0.25" in answer["detail"]
        out = remote(server.url, format="raw").submit(big, ["p", "p"], [{}, {}]).result()
    assert "too large (HTTP 413" in out.errors[0] and "--max-request-mb" in out.errors[0]
    assert ACTIVE["calls"] == 0


def test_a_malformed_request_is_a_400_naming_the_field():
    with serving() as server:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        bad = msgpack.packb({"format": "jpeg", "images": [], "prompts": []})
        status, answer = post(server.url, bad, auth)
    assert status == 400 and "format must be 'png' or 'raw'" in answer["detail"]


# -- failures -------------------------------------------------------------------------------------


def test_a_server_that_is_down_fails_the_samples_after_the_retries():
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    t0 = time.monotonic()
    out = remote(url, retries=2, backoff_s=0.05).submit(images(), ["p"] * 4, [{}] * 4).result()
    assert out.total.isnan().all()
    assert "failed after 3 attempt(s)" in out.errors[0] and "ConnectionRefusedError" in out.errors[0]
    assert time.monotonic() - t0 < 5.0  # 0.05 + 0.1 s of back-off, no hang


def test_retries_stop_at_the_rewards_deadline():
    url = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    rewards = remote(url, deadline_s=1.0, retries=1000, backoff_s=0.1)
    out = rewards.submit(images(), ["p"] * 4, [{}] * 4).result()
    elapsed = time.monotonic() - t0
    assert out.total.isnan().all() and out.errors
    assert elapsed < 5.0  # bounded by the 1 s deadline, not by 1000 retries


def test_a_server_slower_than_timeout_s_fails_the_samples():
    with serving("blocks") as server:
        t0 = time.monotonic()
        out = remote(server.url, timeout_s=0.3).submit(images(), ["p"] * 4, [{}] * 4)
        out = out.result()
    assert out.total.isnan().all()
    # whichever comes first: the client giving up at 0.3 s, or the server's 504 at the 0.3 s the
    # client's X-Timeout-S gave it (a race on a busy machine; either way the attempt failed at once)
    assert "failed after 1 attempt(s): " in out.errors[0]
    reason = out.errors[0].split("failed after 1 attempt(s): ")[1]
    assert reason.startswith(
        (
            "no answer within 0.3 s",
            "HTTP 504: reward 'blocks' did not finish within the client's X-Timeout-S=0.3",
        )
    ), reason
    assert time.monotonic() - t0 < 10.0


def test_a_reward_that_raises_is_a_500_whose_message_reaches_the_client():
    with serving("raises") as server:
        out = remote(server.url, retries=1, backoff_s=0.01).submit(images(), ["p"] * 4, [{}] * 4).result()
    assert out.total.isnan().all()
    error = out.errors[0]
    assert "failed after 2 attempt(s): HTTP 500" in error  # 5xx is retried
    assert "reward 'raises' raised ValueError: boom on purpose" in error
    assert ACTIVE["calls"] == 2


def test_a_reward_returning_the_wrong_shape_is_a_500():
    with serving("wrong_shape") as server:
        out = remote(server.url).submit(images(), ["p"] * 4, [{}] * 4).result()
    assert "reward 'wrong_shape' returned shape (5,) for 4 images, expected (4,)" in out.errors[0]


class _ThreeScores(http.server.BaseHTTPRequestHandler):
    """Not a diffrl server: answers three scores whatever it is sent."""

    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        data = msgpack.packb({"scores": [1.0, 2.0, 3.0]})
        self.send_response(200)
        self.send_header("Content-Type", "application/msgpack")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_a_wrong_number_of_scores_is_an_error_naming_the_server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _ThreeScores)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        out = remote(url).submit(images(), ["p"] * 4, [{}] * 4).result()
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert out.total.isnan().all()
    assert f"remote reward server {url} answered 3 score(s) of shape (3,) for 4 images" in out.errors[0]


# -- concurrency ----------------------------------------------------------------------------------


def test_concurrent_requests_from_several_trainers_are_queued_and_all_answered():
    n = 6
    batches = [images(2, seed=k) for k in range(n)]
    expected = [pixel_sum(b.float() / 255.0, None, None) for b in batches]
    results: dict[int, torch.Tensor] = {}
    with serving("counted") as server:
        trainers = [remote(server.url) for _ in range(n)]  # each its own client, as trainers are

        def trainer(k: int) -> None:
            results[k] = trainers[k](batches[k], ["p", "p"], [{}, {}]).total

        threads = [threading.Thread(target=trainer, args=(k,)) for k in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(results) == list(range(n))
    for k in range(n):
        assert torch.equal(results[k], expected[k])
    assert ACTIVE["calls"] == n and ACTIVE["max"] == 1  # one batch at a time


# -- params ---------------------------------------------------------------------------------------


def test_param_problems_reports_every_bad_param_at_once(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV)
    problems = RemoteReward.param_problems(
        {"url": "ftp://x", "token_env": TOKEN_ENV, "timeout_s": 0, "retries": -1, "format": "webp"}, True
    )
    text = "\n".join(problems)
    assert len(problems) == 5, text
    for part in (
        "url must be http(s)://HOST:PORT",
        f"{TOKEN_ENV} is not set",
        "timeout_s must be",
        "retries must be",
        "format must be",
    ):
        assert part in text
    assert RemoteReward.param_problems({"url": "http://h:1", "token_env": TOKEN_ENV}, False) == []
    assert "base address" in RemoteReward.param_problems({"url": "http://h:1/score"}, False)[0]
    assert "url is required" in RemoteReward.param_problems({}, False)[0]


def blocks_first(images, prompts, metadata):
    """Counts its calls; the first waits for RELEASE."""
    ACTIVE["calls"] += 1
    if ACTIVE["calls"] == 1:
        RELEASE.wait()
    return [0.0] * len(images)


def test_a_request_whose_client_gave_up_while_queued_is_not_scored():
    with serving("blocks_first") as server:
        first = remote(server.url).submit(images(), ["p"] * 4, [{}] * 4)  # holds the server's worker
        while ACTIVE["calls"] == 0:
            time.sleep(0.01)
        late = remote(server.url, timeout_s=0.3).submit(images(), ["p"] * 4, [{}] * 4).result()
        assert "no answer within 0.3 s" in late.errors[0]
        # the server counts the 0.3 s from when its handler started, which on a loaded machine can
        # be a while after the client sent it: release the worker once that has surely passed too
        time.sleep(1.0)
        RELEASE.set()
        assert first.result().errors == []
        # FIFO: by the time a third request is answered, the abandoned one has had its turn
        assert remote(server.url).submit(images(), ["p"] * 4, [{}] * 4).result().errors == []
    assert ACTIVE["calls"] == 2  # the first and the third: the abandoned one was skipped


# -- the command line ------------------------------------------------------------------------------


def test_serve_reward_params_are_key_value_items_or_one_mapping():
    assert reward_params(["batch_size=8", "device=cuda", "half=true"]) == {
        "batch_size": 8,
        "device": "cuda",
        "half": True,
    }
    assert reward_params(['{"batch_size": 8, device: cuda}']) == {"batch_size": 8, "device": "cuda"}
    with pytest.raises(DiffrlError, match="'batch_size' is not key=value"):
        reward_params(["batch_size"])


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--num-gpus", "1"], "place the server on Ray: add --ray"),
        (
            ["--token-env", "DIFFRL_TEST_UNSET_VAR"],
            "--token-env DIFFRL_TEST_UNSET_VAR: that environment variable is not set",
        ),
        (["--token-file", "/nonexistent/token"], "--token-file '/nonexistent/token' does not exist"),
        (["--params", "nope=1"], "unknown param 'nope'"),
        (["--ray"], "without --host it binds its Ray node's address, and the server has no token"),
    ],
)
def test_serve_reward_user_errors_are_one_line_and_exit_2(capsys, flags, message):
    assert main(["serve-reward", "--reward", f"{HERE}:pixel_sum", "--port", "0", *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1, err


def test_preflight_asks_the_servers_health():
    down = f"http://127.0.0.1:{free_port()}"
    [problem] = RemoteReward.param_problems({"url": down}, True)
    assert f"no reward server answers at {down} (ConnectionRefusedError" in problem
    with serving() as server:
        [problem] = RemoteReward.param_problems({"url": server.url}, True)
        assert "needs a token; set token_env" in problem
        assert RemoteReward.param_problems({"url": server.url, "token_env": TOKEN_ENV}, True) == []
        assert RemoteReward.param_problems({"url": down}, False) == []  # check_files=False: no probe


def test_numpy_and_torch_metadata_values_are_sent_as_plain_values():
    meta = [{"id": np.int64(7), "box": np.arange(3), "t": torch.tensor(0.5)}]
    msg = msgpack.unpackb(encode_request(images(1).float() / 255.0, ["p"], meta, "raw"))
    assert msg["metadata"] == [{"id": 7, "box": [0, 1, 2], "t": 0.5}]
    with pytest.raises(RewardError, match="cannot send the prompts' metadata"):
        encode_request(images(1).float() / 255.0, ["p"], [{"x": object()}], "raw")


# -- sound ----------------------------------------------------------------------------------------


def loudness(images, prompts, metadata, audio):
    """A reward that hears: each clip's mean absolute sample plus its frames' mean (both reach it)."""
    return (audio.waveform.abs().mean(dim=(1, 2)) + images.mean(dim=(1, 2, 3, 4))).tolist()


loudness.audio = True


def clips(b: int = 3, seed: int = 0) -> tuple[torch.Tensor, Audio]:
    """Rollout clips: uint8 ``(B, 3, F, H, W)`` and float16 stereo sound, as the collector keeps them."""
    g = torch.Generator().manual_seed(seed)
    video = torch.randint(0, 256, (b, 3, 2, 8, 10), generator=g, dtype=torch.uint8)
    return video, Audio(torch.rand(b, 2, 50, generator=g) * 2 - 1, 16_000).compact()


@pytest.mark.parametrize("fmt", ["png", "raw"])
def test_a_reward_that_hears_scores_remotely_as_in_process_bit_for_bit(fmt):
    """``remote`` with ``audio: true`` sends each clip whole and its float16 sound: the server's
    reward gets what the in-process one gets, float32 of the same float16 samples."""
    video, audio = clips()
    prompts, meta = ["a", "b", "c"], [{}] * 3
    local = RewardSet([RewardConfig(name=f"{HERE}:loudness")])(video, prompts, meta, audio)
    with serving("loudness") as server:
        assert not server_problems(server.url, TOKEN_ENV, audio=True)
        [problem] = server_problems(server.url, TOKEN_ENV)
        assert "hears: set audio: true" in problem
        far = remote(server.url, format=fmt, audio=True)
        out = far(video, prompts, meta, audio)
        far.close()
    assert torch.equal(out.total, local.total), (out.total, local.total)


def test_an_image_reward_served_scores_the_frames_of_clips_and_refuses_audio_true():
    video, audio = clips(2, seed=1)
    local = RewardSet([RewardConfig(name=f"{HERE}:pixel_sum")])(video, ["a", "b"], [{}, {}], audio)
    with serving() as server:
        [problem] = server_problems(server.url, TOKEN_ENV, audio=True)
        assert "does not hear: leave audio out" in problem
        far = remote(server.url)  # frames, one image each; the sound is not sent
        out = far(video, ["a", "b"], [{}, {}], audio)
        far.close()
    assert torch.equal(out.total, local.total)


def test_a_request_without_sound_to_a_reward_that_hears_is_a_400():
    with serving("loudness") as server:
        status, answer = post(server.url, body(), {"Authorization": f"Bearer {TOKEN}"})
    assert status == 400 and "scores sound and the request has none" in answer["detail"]


def test_malformed_sound_is_a_400_naming_the_field():
    video, audio = clips(2)
    msg = msgpack.unpackb(encode_request(video.float() / 255.0, ["a", "b"], [{}, {}], "raw", audio))
    assert msg["audio_shape"] == [2, 2, 50] and msg["sample_rate"] == 16_000
    bad = {**msg, "audio_shape": [3, 2, 50]}
    with serving("loudness") as server:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        status, answer = post(server.url, msgpack.packb(bad), headers)
        assert status == 400 and "audio_shape must be [2, C, S]" in answer["detail"]
        status, answer = post(server.url, msgpack.packb({**msg, "audio": msg["audio"][:-2]}), headers)
        assert status == 400 and "bytes of float16" in answer["detail"]
