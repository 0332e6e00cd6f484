"""Peers' reward-server protocols, both directions, over real loopback HTTP (issue 37, part 2).

- A verl-omni-style scorer and a Flow-Factory-style server, each a small ``http.server`` written
  here from its documented contract (:mod:`diffrl.transport.protocols` cites them), score one tiny
  Flow-GRPO run through the ``remote`` reward.
- ``diffrl serve-reward --protocol`` answers clients written here from the same contracts.
- Pickle is refused both ways without being unpickled; malformed answers are clear errors.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import io
import json
import math
import pickle
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from diffrl.config import RewardConfig
from diffrl.launch import train
from diffrl.rewards.base import RewardError, RewardSet
from diffrl.rewards.remote import RemoteReward
from diffrl.serving.server import RewardServer, build_served_reward
from tests.conftest import ROOT
from tests.integration.test_bad_inputs import BAD, GRPO, Case, _check, run_row
from tests.integration.test_flow_grpo import grpo
from tests.rewards import pixel_sum

# -- peers' servers, from their contracts --------------------------------------------------------


def brightness_of(b64: str) -> float:
    """What the test scorers score: an image's mean pixel in [0, 1], from its base64 PNG."""
    with Image.open(io.BytesIO(base64.b64decode(b64))) as img:
        return float(np.asarray(img.convert("RGB"), dtype=np.float64).mean() / 255)


class Peer(http.server.BaseHTTPRequestHandler):
    """A peer's reward server; each request is recorded in ``server.seen``, and ``server.answer``
    (status, body) overrides the contract's answer (for malformed-answer tests)."""

    def log_message(self, *args):  # quiet
        pass

    def _json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, default: dict) -> None:
        self.server.seen.append(self.path)
        override = self.server.answer
        self._send(*(override if override is not None else (200, json.dumps(default).encode())))


class VerlOmniScorer(Peer):
    """verl-omni's HTTP scorer contract (``http_scorer_client.py``): POST to the URL itself,
    ``{"images", "prompts", "metadata"}`` -> ``{"scores"}``, as JSON with base64 images."""

    def do_POST(self):
        payload = self._json()
        assert len(payload["images"]) == len(payload["prompts"])
        self.server.batches.append(payload)
        self._reply({"scores": [brightness_of(b) for b in payload["images"]]})


class FlowFactoryServer(Peer):
    """Flow-Factory's ``reward_server/example_server.py``: ``GET /health``, ``POST /compute``
    ``{"prompt", "image", "video", ...}`` -> ``{"rewards"}``."""

    def do_GET(self):
        if self.path == "/health":
            self._send(200, b'{"status": "ok"}')
        else:
            self._send(404, b'{"detail": "Not Found"}')

    def do_POST(self):
        if self.path != "/compute":
            return self._send(404, b'{"detail": "Not Found"}')
        payload = self._json()
        self.server.batches.append(payload)
        self._reply({"rewards": [brightness_of(b) for b in payload["image"]]})


@contextlib.contextmanager
def peer(handler: type[Peer]):
    """``handler`` served on a free loopback port: yields (its url, the server)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen, server.batches, server.answer = [], [], None
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# -- a diffrl run scored by both -----------------------------------------------------------------


def test_a_verl_omni_scorer_and_a_flow_factory_server_score_a_diffrl_run(tmp_path):
    with peer(VerlOmniScorer) as (verl_url, verl), peer(FlowFactoryServer) as (ff_url, ff):
        rewards = (
            f"[{{name: remote, params: {{url: '{verl_url}/score', protocol: verl_omni, retries: 0}}}}, "
            f"{{name: remote, params: {{url: '{ff_url}', protocol: flow_factory, retries: 0}}}}]"
        )
        # one prompt x 4 samples: one micro-group, one request to each (the run's cost is its rollout)
        result = train(
            grpo(tmp_path / "run", rewards=rewards, **{"rollout.batch_size": 1, "train.batch_size": 4})
        )
    (m,) = result.history
    assert m["rollout/reward_failed"] == 0 and m["train/grad_norm"] > 0
    assert verl.seen == ["/score"] and ff.seen == ["/compute"]  # the contracts' paths
    assert all(len(b["images"]) == 4 and len(b["metadata"]) == 4 for b in verl.batches)
    assert all(b["video"] is None and b["condition_images"] is None for b in ff.batches)
    assert [b["prompts"] for b in verl.batches] == [b["prompt"] for b in ff.batches]
    # both got the rollout's exact pixels: the same score for each image, and the run logged them
    verl_scores = [brightness_of(i) for b in verl.batches for i in b["images"]]
    ff_scores = [brightness_of(i) for b in ff.batches for i in b["image"]]
    assert verl_scores == ff_scores
    for label in ("remote#0", "remote#1"):
        assert m[f"rollout/reward/{label}/mean"] == pytest.approx(np.mean(verl_scores), rel=1e-6)
        assert m[f"rollout/reward/{label}/max"] == pytest.approx(max(verl_scores), rel=1e-6)
    assert m["rollout/reward/raw_mean"] == pytest.approx(2 * np.mean(verl_scores), rel=1e-5)


# -- serve-reward --protocol, answering clients written from the contracts -----------------------


@contextlib.contextmanager
def serving(protocol: str, fn: str = "tests.rewards:pixel_sum"):
    server = RewardServer(build_served_reward(fn, {}), "px", protocol=protocol).start()
    try:
        yield server
    finally:
        server.stop()


def request(url: str, method: str, path: str, body: bytes | None = None, ctype: str = "application/json"):
    """(status, body) of one request, as a peer's client sends it."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": ctype} if body is not None else {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def pngs_b64(pixels: torch.Tensor) -> list[str]:
    """uint8 ``(B, 3, H, W)`` -> base64 PNGs, as Flow-Factory's ``_image_to_b64`` makes them."""
    out = []
    for a in pixels.permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="PNG")
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


PIXELS = torch.randint(0, 256, (3, 3, 8, 12), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
EXPECTED = pixel_sum(PIXELS.float() / 255, ["a"] * 3, [{}] * 3).tolist()


def test_serve_reward_answers_a_flow_factory_client():
    with serving("flow_factory") as server:
        status, body = request(server.url, "GET", "/health")  # RemoteRewardClient.health_check: r.ok
        assert status == 200 and json.loads(body)["protocol"] == "flow_factory"
        payload = {
            "prompt": ["a", "b", "c"],
            "image": pngs_b64(PIXELS),
            "video": None,
            "condition_images": None,
        }
        status, body = request(server.url, "POST", "/compute", json.dumps(payload).encode())
        assert status == 200 and json.loads(body) == {"rewards": EXPECTED}
        # a video: its frames scored one each, the clip gets their mean (as a reward does in training)
        clip = {"prompt": ["a"], "video": [pngs_b64(PIXELS)]}
        status, body = request(server.url, "POST", "/compute", json.dumps(clip).encode())
        assert status == 200 and json.loads(body)["rewards"] == pytest.approx([np.mean(EXPECTED)], rel=1e-6)
        # diffrl's msgpack path is not this server's
        assert request(server.url, "POST", "/score", b"\x80")[0] == 404


def test_serve_reward_answers_a_verl_omni_style_client_and_refuses_its_pickle(tmp_path):
    with serving("verl_omni") as server:
        payload = {"images": pngs_b64(PIXELS), "prompts": ["a", "b", "c"], "metadata": {}}
        for path in ("/", "/score"):  # flow_grpo's servers route /, verl-omni's test server /score
            status, body = request(server.url, "POST", path, json.dumps(payload).encode())
            assert status == 200 and json.loads(body) == {"scores": EXPECTED}
        # what verl-omni's own client sends: pickle. Refused unread: this one would write a file
        marker = tmp_path / "unpickled"
        evil = pickle.dumps({"images": [], "prompts": [], "metadata": Touch(str(marker))})
        status, body = request(server.url, "POST", "/", evil, "application/octet-stream")
        detail = json.loads(body)["detail"]
        assert status == 415 and "Python pickle" in detail and "runs whatever code" in detail
        assert "protocol verl_omni" in detail and not marker.exists()
        # a typo'd field is named, not ignored
        typo = {**payload, "prompt": payload.pop("prompts")}
        status, body = request(server.url, "POST", "/", json.dumps(typo).encode())
        assert (
            status == 400 and "unknown field 'prompt'. Did you mean 'prompts'?" in json.loads(body)["detail"]
        )


def test_a_json_body_over_the_limit_is_refused_before_it_is_read():
    server = RewardServer(
        build_served_reward("tests.rewards:pixel_sum", {}), "px", protocol="flow_factory", max_request_mb=0.01
    ).start()
    try:
        noise = torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8)  # ~12 KB a PNG
        payload = {"prompt": ["a"] * 4, "image": pngs_b64(noise)}
        status, body = request(server.url, "POST", "/compute", json.dumps(payload).encode())
    finally:
        server.stop()
    assert (
        status == 413
        and "request of 0.1 MB is over this server's --max-request-mb" in json.loads(body)["detail"]
    )


class Touch:
    """Unpickling this creates a file: proof that a body was (not) unpickled."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def test_preflight_names_a_server_answering_another_protocol():
    with serving("flow_factory") as server:
        problems = RemoteReward.param_problems({"url": server.url}, True)  # protocol diffrl
        assert problems == [
            f"protocol: the reward server at {server.url} is a diffrl reward server answering protocol "
            "'flow_factory', not 'diffrl'; set protocol: flow_factory (or restart it with --protocol diffrl)"
        ]
        assert RemoteReward.param_problems({"url": server.url, "protocol": "flow_factory"}, True) == []
    with serving("verl_omni") as server:  # its / and /score are POST routes: a GET gets 405, not 404
        for url in (server.url, f"{server.url}/score"):
            assert RemoteReward.param_problems({"url": url, "protocol": "verl_omni"}, True) == []
    with peer(VerlOmniScorer) as (url, _):  # no health route in its contract: the URL must answer
        assert RemoteReward.param_problems({"url": url, "protocol": "verl_omni"}, True) == []
        (problem,) = RemoteReward.param_problems({"url": url, "protocol": "flow_factory"}, True)
        assert (
            problem.startswith(f"url: {url}/health answered HTTP 501 ")
            and "a flow_factory reward server?" in problem
        )
    with peer(FlowFactoryServer) as (url, _):
        (problem,) = RemoteReward.param_problems({"url": f"{url}/nothing", "protocol": "verl_omni"}, True)
        assert problem.startswith(f"url: {url}/nothing answered HTTP 404 (no route there)")


# -- malformed answers: a clear RewardError, never a traceback -----------------------------------

BAD_ANSWERS = [
    pytest.param(200, {"scores": [1.0]}, "answered 1 score(s) for 2 images", id="wrong-length"),
    pytest.param(200, {"score": [1.0, 2.0]}, "answered no 'scores'", id="missing-field"),
    pytest.param(200, {"scores": ["high", 1.0]}, "answered scores[0] = 'high', not a number", id="a-string"),
    pytest.param(200, {"scores": [True, 1.0]}, "answered scores[0] = True, not a number", id="a-bool"),
    pytest.param(200, {"scores": 3}, "answered 'scores' = 3, not a list of 2 numbers", id="not-a-list"),
    pytest.param(200, [1.0, 2.0], "answered list JSON, not an object", id="an-array"),
    pytest.param(200, {"error": "model not loaded"}, "answered an error: 'model not loaded'", id="error-200"),
    pytest.param(200, b"<html>oops</html>", "not this protocol's JSON", id="not-json"),
    pytest.param(200, b"[" * 100_000, "nested too deep for JSON", id="nested-deep"),
    pytest.param(500, {"error": "CUDA out of memory"}, "HTTP 500: CUDA out of memory", id="error-500"),
]


@pytest.mark.parametrize("status, answer, message", BAD_ANSWERS)
def test_a_malformed_answer_is_a_clear_error(status, answer, message):
    with peer(VerlOmniScorer) as (url, server):
        server.answer = (status, answer if isinstance(answer, bytes) else json.dumps(answer).encode())
        reward = RemoteReward(url, protocol="verl_omni", retries=1, backoff_s=0)
        with pytest.raises(RewardError) as e:
            reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
    assert message in str(e.value) and f"remote reward server {url}" in str(e.value)
    assert len(server.seen) == (2 if status >= 500 else 1)  # a 5xx is retried, a bad 200 is not


def test_a_pickled_answer_is_refused_unread(tmp_path):
    marker = tmp_path / "unpickled"
    with peer(FlowFactoryServer) as (url, server):
        server.answer = (200, pickle.dumps({"rewards": [Touch(str(marker)), 1.0]}))
        reward = RemoteReward(url, protocol="flow_factory", retries=0)
        with pytest.raises(RewardError, match="is a Python pickle.*runs whatever code"):
            reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
    assert not marker.exists()


def test_null_and_nan_scores_fail_their_samples_only():
    with peer(VerlOmniScorer) as (url, server):
        server.answer = (200, b'{"scores": [null, NaN, 0.25]}')
        rewards = RewardSet(
            [RewardConfig(name="remote", params={"url": url, "protocol": "verl_omni", "retries": 0})]
        )
        out = rewards.submit(torch.zeros(3, 3, 8, 8, dtype=torch.uint8), ["a", "b", "c"], [{}] * 3).result()
        rewards.close()
    assert math.isnan(out.total[0]) and math.isnan(out.total[1]) and out.total[2] == 0.25


# -- refusals at the command line ----------------------------------------------------------------

REMOTE = "rewards=[{{name: remote, params: {{url: 'http://127.0.0.1:9'{}}}}}]"
# fmt: off
CASES = [
    Case("protocol-unknown", ["train", GRPO, REMOTE.format(", protocol: verl_omi")], BAD, "protocol must be one of diffrl, verl_omni, flow_factory, got 'verl_omi'. Did you mean 'verl_omni'?"),
    Case("protocol-pickle", ["train", GRPO, REMOTE.format(", protocol: flow_grpo")], BAD, "flow_grpo's reward servers (and verl-omni's HTTP scorer) read and answer Python pickle; unpickling a body runs whatever code"),
    Case("protocol-format-raw", ["train", GRPO, REMOTE.format(", protocol: flow_factory, format: raw")], BAD, "format raw: protocol flow_factory sends png only"),
    Case("protocol-audio", ["train", GRPO, REMOTE.format(", protocol: verl_omni, audio: true")], BAD, "audio: protocol verl_omni carries no sound"),
    Case("protocol-url-path", ["train", GRPO, "rewards=[{name: remote, params: {url: 'http://127.0.0.1:9/compute', protocol: flow_factory}}]"], BAD, "give the server's base address (the client adds /compute)"),
    Case("serve-protocol-pickle", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "pickle"], BAD, "--protocol: 'pickle': a pickle protocol; unpickling a body runs whatever code"),
    Case("serve-protocol-unknown", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "flowfactory"], BAD, "Did you mean 'flow_factory'?"),
    Case("serve-protocol-ray", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "verl_omni", "--ray"], BAD, "the Ray actor serves protocol diffrl only"),
    Case("serve-protocol-hears", ["serve-reward", "--reward", "tests.unit.rewards.test_sound:loudness", "--port", "0", "--protocol", "flow_factory"], BAD, "hears (it scores sound), and protocol flow_factory carries none"),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused(case, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    _check(case, *run_row(case, case.argv, monkeypatch, capsys))
