"""Peers' reward-server protocols, both directions, over real loopback HTTP (issue 37, part 2).

- A verl-omni scorer, a flow_grpo reward server (both pickled) and a Flow-Factory server (JSON),
  each a small ``http.server`` written here to its peer's wire format (:mod:`diffrl.transport.protocols`
  cites them: the pickled ones ``pickle.loads`` the body and ``pickle.dumps`` the answer, as the
  peers' servers do, which is safe here only because the test wrote the client), score one tiny
  Flow-GRPO run through the ``remote`` reward.
- ``diffrl serve-reward --protocol`` answers clients that do exactly what the peers' clients do.
- A pickle that would run code is refused both ways, and the file it would create never appears;
  a JSON protocol refuses pickle unread; malformed answers are clear errors.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import io
import json
import math
import os
import pickle
import threading
import traceback
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


def brightness_of(image: str | bytes) -> float:
    """What the test scorers score: an image's mean pixel in [0, 1], from its file (JPEG or PNG)
    or its base64 PNG."""
    data = base64.b64decode(image) if isinstance(image, str) else image
    with Image.open(io.BytesIO(data)) as img:
        return float(np.asarray(img.convert("RGB"), dtype=np.float64).mean() / 255)


class Peer(http.server.BaseHTTPRequestHandler):
    """A peer's reward server; each request is recorded in ``server.seen``, and ``server.answer``
    (status, body) overrides the contract's answer (for malformed-answer tests)."""

    ctype = "application/json"

    def log_message(self, *args):  # quiet
        pass

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers["Content-Length"]))

    def _send(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", self.ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reply(self, default: bytes) -> None:
        self.server.seen.append(self.path)
        override = self.server.answer
        self._send(*(override if override is not None else (200, default)))


class VerlOmniScorer(Peer):
    """verl-omni's HTTP scorer, as deepgen_rl's ``rewards_services/api_services/*/app.py`` serve it
    (the reference servers of verl-omni's ``docs/start/http_scorer.md``): ``payload =
    pickle.loads(data)``, its ``images`` opened with PIL, ``pickle.dumps({"scores": [...]})``; an
    error is ``pickle.dumps({"error": traceback})`` with 500. Routes ``/`` and (verl-omni's test
    server) ``/score``."""

    ctype = "text/html; charset=utf-8"  # Flask's, for the bytes its view returns

    def do_POST(self):
        try:
            payload = pickle.loads(self._body())
            images = [Image.open(io.BytesIO(d)) for d in payload["images"]]
            assert len(images) == len(payload.get("prompts", []))
            self.server.batches.append(payload)
            self._reply(pickle.dumps({"scores": [brightness_of(d) for d in payload["images"]]}))
        except Exception:
            self._send(500, pickle.dumps({"error": traceback.format_exc()}))


class FlowGrpoServer(Peer):
    """flow_grpo's reward server, as yifan123/reward-server's ``app_deqa.py`` and ``app_geneval.py``
    serve it: ``POST /``, ``data = pickle.loads(request.get_data())``, images opened with
    ``formats=["jpeg"]``; DeQA answers ``{"outputs"}``, GenEval (reading ``meta_datas`` and
    ``only_strict``) ``{"scores", "rewards", "strict_rewards", "group_rewards",
    "group_strict_rewards"}``; an error is the traceback as text, HTTP 500."""

    ctype = "text/html; charset=utf-8"

    def do_POST(self):
        if self.path != "/":
            return self._send(404, b"Not Found")
        try:
            data = pickle.loads(self._body())
            images = [Image.open(io.BytesIO(d), formats=["jpeg"]) for d in data["images"]]
            scores = [brightness_of(d) for d in data["images"]]
            self.server.batches.append(data)
            if self.server.geneval:
                tags = [m["tag"] for m in data["meta_datas"]]  # KeyError unless the client sends them
                assert data["only_strict"] in (True, False) and len(tags) == len(images)
                answer = {
                    "scores": scores,
                    "rewards": [0.0] * len(scores),
                    "strict_rewards": [0.0] * len(scores),
                    "group_rewards": {"counting": [-10.0] * len(scores)},
                    "group_strict_rewards": {"counting": [-10.0] * len(scores)},
                }
            else:
                answer = {"outputs": scores}
            self._reply(pickle.dumps(answer))
        except Exception:
            self._send(500, traceback.format_exc().encode())


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
        payload = json.loads(self._body())
        self.server.batches.append(payload)
        self._reply(json.dumps({"rewards": [brightness_of(b) for b in payload["image"]]}).encode())


@contextlib.contextmanager
def peer(handler: type[Peer]):
    """``handler`` served on a free loopback port: yields (its url, the server)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.seen, server.batches, server.answer, server.geneval = [], [], None, False
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


# -- a diffrl run scored by both -----------------------------------------------------------------


def test_the_peers_servers_score_a_diffrl_run(tmp_path):
    with peer(VerlOmniScorer) as (verl_url, verl), peer(FlowGrpoServer) as (fg_url, fg):
        with peer(FlowFactoryServer) as (ff_url, ff):
            rewards = (
                f"[{{name: remote, params: {{url: '{verl_url}/score', protocol: verl_omni, retries: 0}}}}, "
                f"{{name: remote, params: {{url: '{fg_url}', protocol: flow_grpo, retries: 0}}}}, "
                f"{{name: remote, params: {{url: '{ff_url}', protocol: flow_factory, retries: 0}}}}]"
            )
            # one prompt x 4 samples: one micro-group, one request to each (the run's cost is its rollout)
            result = train(
                grpo(tmp_path / "run", rewards=rewards, **{"rollout.batch_size": 1, "train.batch_size": 4})
            )
    (m,) = result.history
    assert m["rollout/reward_failed"] == 0 and m["train/grad_norm"] > 0
    assert verl.seen == ["/score"] and fg.seen == ["/"] and ff.seen == ["/compute"]  # their paths
    (vb,), (gb,), (fb,) = verl.batches, fg.batches, ff.batches
    assert len(vb["images"]) == 4 and len(vb["metadata"]["meta_datas"]) == 4
    assert gb["only_strict"] is True and [m["prompt"] for m in gb["meta_datas"]] == gb["prompts"]
    assert vb["prompts"] == gb["prompts"] == fb["prompt"] and fb["video"] is None
    assert all(d.startswith(b"\xff\xd8\xff") for d in vb["images"] + gb["images"])  # JPEG, as theirs
    # each got the rollout's pixels (JPEG for the pickled two, as their clients send), and the run
    # logged what each scored
    scores = {
        "remote#0": [brightness_of(d) for d in vb["images"]],
        "remote#1": [brightness_of(d) for d in gb["images"]],
        "remote#2": [brightness_of(b) for b in fb["image"]],
    }
    assert scores["remote#0"] == scores["remote#1"]  # the same JPEGs
    assert scores["remote#0"] == pytest.approx(scores["remote#2"], abs=0.02)  # JPEG vs lossless PNG
    for label, got in scores.items():
        assert m[f"rollout/reward/{label}/mean"] == pytest.approx(np.mean(got), rel=1e-6)
        assert m[f"rollout/reward/{label}/max"] == pytest.approx(max(got), rel=1e-6)
    assert m["rollout/reward/raw_mean"] == pytest.approx(sum(np.mean(v) for v in scores.values()), rel=1e-5)


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


def jpegs(pixels: torch.Tensor) -> list[bytes]:
    """uint8 ``(B, 3, H, W)`` -> JPEG bytes, as verl-omni's ``_serialize_image`` and flow_grpo's
    remote rewards make them (PIL's defaults)."""
    out = []
    for a in pixels.permute(0, 2, 3, 1).numpy():
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format="JPEG")
        out.append(buf.getvalue())
    return out


def scored(files: list[bytes]) -> list[float]:
    """What the served ``pixel_sum`` scores for ``files``: the pixels PIL decodes from them."""
    pixels = torch.stack(
        [torch.from_numpy(np.array(Image.open(io.BytesIO(f)))).permute(2, 0, 1) for f in files]
    )
    return pixel_sum(pixels.float() / 255, [""] * len(files), [{}] * len(files)).tolist()


def test_serve_reward_answers_verl_omnis_client():
    files = jpegs(PIXELS)
    with serving("verl_omni") as server:
        for path in ("/", "/score"):  # deepgen_rl's services route /, verl-omni's test server /score
            # compute_score: one image a request, pickled; the answer unpickled, its scores[0] read
            body = pickle.dumps({"images": files[:1], "prompts": ["a"], "metadata": {}})
            status, answer = request(server.url, "POST", path, body, "application/octet-stream")
            assert status == 200 and pickle.loads(answer) == {"scores": scored(files[:1])}
        # a batch (deepgen_rl's client), protocol 5 (Python 3.14's default pickle)
        body = pickle.dumps({"images": files, "prompts": list("abc"), "metadata": {}}, protocol=5)
        status, answer = request(server.url, "POST", "/", body, "application/octet-stream")
        assert status == 200 and pickle.loads(answer)["scores"] == pytest.approx(scored(files), rel=1e-6)
        # a typo'd field is named, not ignored; a JSON body points at verl_omni_json
        typo = pickle.dumps({"images": files, "prompt": list("abc")})
        status, answer = request(server.url, "POST", "/", typo, "application/octet-stream")
        assert (
            status == 400
            and "unknown field 'prompt'. Did you mean 'prompts'?" in json.loads(answer)["detail"]
        )
        status, answer = request(server.url, "POST", "/", b'{"images": []}')
        assert status == 400 and "protocol verl_omni_json" in json.loads(answer)["detail"]


def test_serve_reward_answers_flow_grpos_clients():
    files = jpegs(PIXELS)
    bodies = {
        "deqa_score_remote": {"images": files},
        "unifiedreward_score_remote": {
            "images": files,
            "prompts": np.array_split(np.array(list("abc")), 1)[0],
        },
        "geneval_score": {
            "images": files,
            "meta_datas": list(np.array_split(np.array([{"tag": "counting"}] * 3, dtype=object), 1)[0]),
            "only_strict": True,
        },
    }
    with serving("flow_grpo") as server:
        for name, payload in bodies.items():
            status, answer = request(
                server.url, "POST", "/", pickle.dumps(payload), "application/octet-stream"
            )
            assert status == 200, (name, answer)
            answer = pickle.loads(answer)  # what those clients do with it
            assert answer["outputs"] == answer["scores"] == pytest.approx(scored(files), rel=1e-6), name
        # its servers route / only
        assert request(server.url, "POST", "/score", pickle.dumps(bodies["deqa_score_remote"]))[0] == 404


def test_a_pickle_that_would_run_code_is_refused_by_the_served_reward(tmp_path):
    marker = tmp_path / "unpickled"
    attacks = {
        "verl_omni": {"images": jpegs(PIXELS[:1]), "prompts": ["a"], "metadata": Touch(str(marker))},
        "flow_grpo": {"images": jpegs(PIXELS[:1]), "meta_datas": [Shell(f"touch {marker}")]},
    }
    for protocol, payload in attacks.items():
        with serving(protocol) as server:
            status, body = request(server.url, "POST", "/", pickle.dumps(payload), "application/octet-stream")
        name = "pathlib.Path.touch" if protocol == "verl_omni" else f"{os.system.__module__}.system"
        assert (
            status == 400 and f"it names {name}, which diffrl does not unpickle" in json.loads(body)["detail"]
        )
    # and a JSON protocol reads no pickle at all
    with serving("flow_factory") as server:
        status, body = request(server.url, "POST", "/compute", pickle.dumps(attacks["verl_omni"]))
    assert status == 415 and "protocols verl_omni and flow_grpo" in json.loads(body)["detail"]
    assert not marker.exists()


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


class Shell:
    """Unpickling this runs a shell command."""

    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


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
    with peer(FlowGrpoServer) as (url, _):  # no health route either: a GET gets 501 from http.server
        assert RemoteReward.param_problems({"url": url, "protocol": "flow_grpo"}, True) == []
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
    pytest.param(200, [1.0, 2.0], "answered a list, not a map {'scores': [...]}", id="a-list"),
    pytest.param(200, {"error": "model not loaded"}, "answered an error: 'model not loaded'", id="error-200"),
    pytest.param(
        200, b"<html>oops</html>", "its answer is not a pickle of protocol 2 or later", id="not-a-pickle"
    ),
    pytest.param(200, b'{"scores": [1, 2]}', "set protocol: verl_omni_json", id="json"),
    pytest.param(200, {"scores": [1.0, 2.0], "x": {1}}, "its answer holds a set", id="a-set"),
    pytest.param(500, {"error": "CUDA out of memory"}, "HTTP 500: CUDA out of memory", id="error-500"),
    pytest.param(
        500, b"Traceback (most recent call last):", "HTTP 500: Traceback (most", id="error-500-text"
    ),
]


@pytest.mark.parametrize("status, answer, message", BAD_ANSWERS)
def test_a_malformed_answer_is_a_clear_error(status, answer, message):
    with peer(VerlOmniScorer) as (url, server):
        server.answer = (status, answer if isinstance(answer, bytes) else pickle.dumps(answer))
        reward = RemoteReward(url, protocol="verl_omni", retries=1, backoff_s=0)
        with pytest.raises(RewardError) as e:
            reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
    assert message in str(e.value) and f"remote reward server {url}" in str(e.value), str(e.value)
    assert len(server.seen) == (2 if status >= 500 else 1)  # a 5xx is retried, a bad 200 is not


@pytest.mark.parametrize("protocol", ["verl_omni", "flow_grpo"])
def test_a_pickled_answer_that_would_run_code_is_refused(protocol, tmp_path):
    marker = tmp_path / "unpickled"
    handler = VerlOmniScorer if protocol == "verl_omni" else FlowGrpoServer
    for attack, name in [(Touch(str(marker)), "pathlib.Path.touch"), (Shell(f"touch {marker}"), "system")]:
        with peer(handler) as (url, server):
            server.answer = (200, pickle.dumps({"scores": [attack, 1.0], "outputs": [attack, 1.0]}))
            reward = RemoteReward(url, protocol=protocol, retries=0)
            with pytest.raises(RewardError) as e:
                reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
        assert (
            f"(protocol {protocol}) answered something diffrl does not read: its answer is refused: it names"
            in str(e.value)
        )
        assert f"{name}, which diffrl does not unpickle" in str(e.value)
    assert not marker.exists()


def test_a_geneval_server_reads_the_metadata_and_its_scores_are_read():
    with peer(FlowGrpoServer) as (url, server):
        server.geneval = True  # reward-server's app_geneval: meta_datas and only_strict, or a 500
        reward = RemoteReward(url, protocol="flow_grpo", retries=0)
        images = torch.rand(2, 3, 8, 8)
        scores = reward(
            images,
            ["two cats", "a dog"],
            [{"tag": "counting", "include": [{"class": "cat", "count": 2}]}, {"tag": "single_object"}],
        )
    (batch,) = server.batches
    assert batch["meta_datas"][0] == {
        "prompt": "two cats",
        "tag": "counting",
        "include": [{"class": "cat", "count": 2}],
    }
    assert batch["only_strict"] is True and isinstance(batch["prompts"], list)
    assert scores.tolist() == pytest.approx([brightness_of(d) for d in batch["images"]], rel=1e-6)


def test_a_pickled_answer_to_a_json_protocol_is_refused_unread(tmp_path):
    marker = tmp_path / "unpickled"
    with peer(FlowFactoryServer) as (url, server):
        server.answer = (200, pickle.dumps({"rewards": [Touch(str(marker)), 1.0]}))
        reward = RemoteReward(url, protocol="flow_factory", retries=0)
        with pytest.raises(RewardError, match="is a Python pickle.*protocols verl_omni and flow_grpo"):
            reward(torch.rand(2, 3, 8, 8), ["a", "b"], [{}, {}])
    assert not marker.exists()


def test_none_and_nan_scores_fail_their_samples_only():
    with peer(VerlOmniScorer) as (url, server):
        server.answer = (200, pickle.dumps({"scores": [None, math.nan, np.float32(0.25)]}))
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
    Case("protocol-unknown", ["train", GRPO, REMOTE.format(", protocol: verl_omi")], BAD, "protocol must be one of diffrl, flow_factory, verl_omni, flow_grpo, verl_omni_json, got 'verl_omi'. Did you mean 'verl_omni'?"),
    Case("protocol-pickle", ["train", GRPO, REMOTE.format(", protocol: pickle")], BAD, "got 'pickle'. Pickled bodies are protocols verl_omni (verl-omni's HTTP scorer) and flow_grpo (flow_grpo's reward servers)."),
    Case("protocol-format-raw", ["train", GRPO, REMOTE.format(", protocol: flow_factory, format: raw")], BAD, "format raw: protocol flow_factory sends png only"),
    Case("protocol-format-png", ["train", GRPO, REMOTE.format(", protocol: flow_grpo, format: png")], BAD, "format png: protocol flow_grpo sends jpeg only"),
    Case("protocol-format-jpeg", ["train", GRPO, REMOTE.format(", format: jpeg")], BAD, "format jpeg: protocol diffrl sends png or raw only"),
    Case("protocol-audio", ["train", GRPO, REMOTE.format(", protocol: verl_omni, audio: true")], BAD, "audio: protocol verl_omni carries no sound"),
    Case("protocol-url-path", ["train", GRPO, "rewards=[{name: remote, params: {url: 'http://127.0.0.1:9/compute', protocol: flow_factory}}]"], BAD, "give the server's base address (the client adds /compute)"),
    Case("serve-protocol-pickle", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "pickle"], BAD, "--protocol: must be one of diffrl, flow_factory, verl_omni, flow_grpo, verl_omni_json, got 'pickle'. Pickled bodies are protocols verl_omni"),
    Case("serve-protocol-unknown", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "flowfactory"], BAD, "Did you mean 'flow_factory'?"),
    Case("serve-protocol-ray", ["serve-reward", "--reward", "jpeg_compressibility", "--protocol", "verl_omni", "--ray"], BAD, "the Ray actor serves protocol diffrl only"),
    Case("serve-protocol-hears", ["serve-reward", "--reward", "tests.unit.rewards.test_sound:loudness", "--port", "0", "--protocol", "flow_factory"], BAD, "hears (it scores sound), and protocol flow_factory carries none"),
]
# fmt: on


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in CASES])
def test_refused(case, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # rows name the shipped recipes by their relative path
    _check(case, *run_row(case, case.argv, monkeypatch, capsys))
